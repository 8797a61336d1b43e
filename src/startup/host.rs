//! What confined runs on Docker reach of the host they run on: said at start (the services
//! listening where a run reaches them), and, with `runner.host_firewall`, closed by a rule
//! that lets through only the egress proxy and the gateways (`crate::egress::firewall`).

use crate::egress::firewall::{HostFirewall, Plan};
use crate::egress::host::{ReadIn, describe, read_reachable};
use crate::runtime::EgressPoint;
use crate::settings::{RunnerKind, Settings};

/// Says which host services confined runs reach, and installs `runner.host_firewall`'s rule
/// when it is on: `Err` (start-up refused, naming the key) when it cannot be installed.
/// `ports`: the director's own listeners on the runs' network (the proxy, the gateways).
pub(super) fn guard_host(
    settings: &Settings,
    point: &EgressPoint,
    ports: &[u16],
) -> anyhow::Result<Option<HostFirewall>> {
    let r = &settings.runner;
    // A runtime whose proxy listens on loopback or everywhere (a test's fake, a cluster's
    // pod) has no bridge of the host in front of its runs.
    let on_network = !point.listen.is_loopback() && !point.listen.is_unspecified();
    if r.kind != RunnerKind::Docker || !on_network {
        if r.host_firewall {
            anyhow::bail!(refusal(
                "this runtime gives runs no Docker bridge on this host"
            ));
        }
        return Ok(None);
    }
    let mut own = ports.to_vec();
    // The director's own routes refuse connections arriving on the runs' network.
    own.push(settings.server.listen.port());
    let found = read_reachable(Some(point.listen), &own);
    let read_in = if point.bridge.is_some() {
        ReadIn::Host
    } else {
        ReadIn::Container
    };
    let said = describe(&found, read_in, r.host_firewall);
    if found.is_empty() || r.host_firewall {
        tracing::info!("{said}");
    } else {
        tracing::warn!("{said}");
    }
    if !r.host_firewall {
        return Ok(None);
    }
    let Some(bridge) = &point.bridge else {
        anyhow::bail!(refusal(
            "the director runs in a container: its rule would guard the container's own network namespace, not the engine's host (install the rule on the host: docs/operations.md)"
        ));
    };
    if point.ipv6 {
        anyhow::bail!(refusal(&format!(
            "the runs' network `{}` has IPv6 and the rule covers IPv4 only",
            r.egress_network
        )));
    }
    let std::net::IpAddr::V4(gateway) = point.listen else {
        anyhow::bail!(refusal(
            "the runs' network's gateway is not an IPv4 address"
        ));
    };
    let plan =
        Plan::new(bridge, gateway, ports.to_vec()).map_err(|e| anyhow::anyhow!(refusal(&e)))?;
    let firewall = HostFirewall::install(&r.host_firewall_command, plan)
        .map_err(|e| anyhow::anyhow!(refusal(&format!("the rule cannot be installed: {e}"))))?;
    tracing::info!(chain = %firewall.chain(), bridge = %bridge, "confined runs reach this host only at the egress proxy and the gateways (runner.host_firewall)");
    Ok(Some(firewall))
}

fn refusal(why: &str) -> String {
    format!("configuration key `runner.host_firewall`: {why}; set it to false to start without it")
}
