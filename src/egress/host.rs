//! The host services a confined run on Docker can reach. The engine's internal network has
//! no route out, but the bridge's own address (the network's gateway) is an address of the
//! machine the director reads its sockets on: whatever listens there, or on every address
//! (`0.0.0.0`, `::`), answers a run directly, around the egress proxy and its allow-list.
//! [`reachable`] picks them from `/proc/net/tcp` and `/proc/net/tcp6` (a pure function over
//! their text); [`describe`] says them, naming what was read: in a container those files are
//! the container's own network namespace, not the host's.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The kernel's state number of a listening TCP socket in `/proc/net/tcp*`.
const LISTEN: &str = "0A";

/// An address of `/proc/net/tcp*`: the kernel prints each 32-bit word of the address as it
/// lies in memory, so its bytes come back with the machine's own byte order.
fn parse_ip(hex: &str) -> Option<IpAddr> {
    let word = |i: usize| -> Option<[u8; 4]> {
        let w = hex.get(i * 8..i * 8 + 8)?;
        Some(u32::from_str_radix(w, 16).ok()?.to_ne_bytes())
    };
    match hex.len() {
        8 => Some(IpAddr::V4(Ipv4Addr::from(word(0)?))),
        32 => {
            let mut bytes = [0u8; 16];
            for i in 0..4 {
                bytes[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            Some(IpAddr::V6(Ipv6Addr::from(bytes)))
        }
        _ => None,
    }
}

/// The listening sockets of one `/proc/net/tcp` or `/proc/net/tcp6` text; lines that do not
/// parse are skipped (the header among them).
pub fn listening(proc_text: &str) -> Vec<SocketAddr> {
    proc_text
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let _slot = fields.next()?;
            let local = fields.next()?;
            let _remote = fields.next()?;
            if fields.next()? != LISTEN {
                return None;
            }
            let (ip, port) = local.split_once(':')?;
            let port = u16::from_str_radix(port, 16).ok()?;
            Some(SocketAddr::new(parse_ip(ip)?, port))
        })
        .collect()
}

/// The address as IPv4 when it is an IPv4-mapped IPv6 address (a dual-stack socket's).
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        ip => ip,
    }
}

/// Which of the listening sockets of `tcp` and `tcp6` a run on the network whose gateway is
/// `gateway` reaches: bound to every address or to the gateway itself, less `own` (the
/// director's own proxy and gateways, which listen there on purpose). Sorted, each once.
pub fn reachable(tcp: &str, tcp6: &str, gateway: Option<IpAddr>, own: &[u16]) -> Vec<SocketAddr> {
    let mut found: Vec<SocketAddr> = listening(tcp)
        .into_iter()
        .chain(listening(tcp6))
        .filter(|a| {
            let ip = canonical(a.ip());
            ip.is_unspecified() || Some(ip) == gateway.map(canonical)
        })
        .filter(|a| !own.contains(&a.port()))
        .collect();
    found.sort();
    found.dedup();
    found
}

/// Where the sockets were read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadIn {
    /// The director runs on the engine's host: its sockets are the host's.
    Host,
    /// The director runs in a container: its own network namespace, not the host's.
    Container,
}

/// What start-up and `director hooks check` say about the services listed.
pub fn describe(found: &[SocketAddr], read_in: ReadIn, firewall: bool) -> String {
    let list = if found.is_empty() {
        "none".to_owned()
    } else {
        found
            .iter()
            .map(SocketAddr::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let reach = if firewall {
        "would reach, were runner.host_firewall off,"
    } else {
        "can reach"
    };
    let mut out = match read_in {
        ReadIn::Host => format!("a confined run {reach} these host services: {list}"),
        ReadIn::Container => format!(
            "a confined run {reach} these services of the director's own container: {list} (read in the container's network namespace: the services of the engine's host on the runs' network gateway are not seen from here; list them on the host)"
        ),
    };
    if firewall {
        out.push_str(
            "; runner.host_firewall drops the runs' traffic to this machine but for the proxy and the gateways",
        );
    } else if !found.is_empty() {
        out.push_str("; set runner.host_firewall = true or bind them to 127.0.0.1");
    }
    out
}

/// The listening sockets of the director's own network namespace, as [`reachable`] picks
/// them. A file that cannot be read counts as empty (a kernel without IPv6 has no `tcp6`).
pub fn read_reachable(gateway: Option<IpAddr>, own: &[u16]) -> Vec<SocketAddr> {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    reachable(
        &read("/proc/net/tcp"),
        &read("/proc/net/tcp6"),
        gateway,
        own,
    )
}

#[cfg(all(test, target_endian = "little"))]
mod tests {
    use super::*;

    // Taken from a host (little-endian): sshd and PostgreSQL on every address, a service on
    // loopback, one on the bridge's address 172.18.0.1, the proxy there (3128), and a
    // connection that is not listening.
    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1001 1 0000000000000000 100 0 0 10 0
   1: 00000000:1538 00000000:0000 0A 00000000:00000000 00:00000000 00000000   105        0 1002 1 0000000000000000 100 0 0 10 0
   2: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1003 1 0000000000000000 100 0 0 10 0
   3: 010012AC:2382 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1004 1 0000000000000000 100 0 0 10 0
   4: 010012AC:0C38 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1005 1 0000000000000000 100 0 0 10 0
   5: 020012AC:0050 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 1006 1 0000000000000000 100 0 0 10 0
   6: 0101A8C0:0BB8 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1007 1 0000000000000000 100 0 0 10 0
";

    // `::` on 9100 (a metrics agent), `::1` on 5000, `::ffff:172.18.0.1` on 6379.
    const TCP6: &str = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:238C 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2001 1 0000000000000000 100 0 0 10 0
   1: 00000000000000000000000001000000:1388 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2002 1 0000000000000000 100 0 0 10 0
   2: 0000000000000000FFFF0000010012AC:18EB 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2003 1 0000000000000000 100 0 0 10 0
garbage line
";

    fn addrs(list: &[&str]) -> Vec<SocketAddr> {
        list.iter().map(|a| a.parse().expect("addr")).collect()
    }

    #[test]
    fn listening_sockets_are_read_in_the_machines_byte_order() {
        assert_eq!(
            listening(TCP),
            addrs(&[
                "0.0.0.0:22",
                "0.0.0.0:5432",
                "127.0.0.1:8080",
                "172.18.0.1:9090",
                "172.18.0.1:3128",
                "192.168.1.1:3000",
            ]),
            "the established connection is not listed"
        );
        assert_eq!(
            listening(TCP6),
            addrs(&["[::]:9100", "[::1]:5000", "[::ffff:172.18.0.1]:6379"])
        );
        assert!(listening("").is_empty());
    }

    #[test]
    fn a_run_reaches_what_listens_everywhere_or_on_its_gateway_but_the_directors_own() {
        let gw: IpAddr = "172.18.0.1".parse().expect("ip");
        assert_eq!(
            reachable(TCP, TCP6, Some(gw), &[3128, 3129]),
            addrs(&[
                "0.0.0.0:22",
                "0.0.0.0:5432",
                "172.18.0.1:9090",
                "[::]:9100",
                "[::ffff:172.18.0.1]:6379",
            ]),
            "loopback and other addresses are not reached; the proxy is the director's own"
        );
        assert_eq!(
            reachable(TCP, TCP6, None, &[22, 5432, 9100]),
            Vec::<SocketAddr>::new(),
            "without a known gateway, only what listens on every address"
        );
        assert!(reachable("", "", Some(gw), &[]).is_empty());
    }

    #[test]
    fn the_listing_names_each_service_what_was_read_and_the_way_out() {
        let found = addrs(&["0.0.0.0:5432", "[::]:9100"]);
        let said = describe(&found, ReadIn::Host, false);
        assert_eq!(
            said,
            "a confined run can reach these host services: 0.0.0.0:5432, [::]:9100; set runner.host_firewall = true or bind them to 127.0.0.1"
        );
        assert_eq!(
            describe(&[], ReadIn::Host, false),
            "a confined run can reach these host services: none"
        );
        let inside = describe(&found, ReadIn::Container, false);
        assert!(inside.contains("director's own container"), "{inside}");
        assert!(inside.contains("not seen from here"), "{inside}");
        assert_eq!(
            describe(&found, ReadIn::Host, true),
            "a confined run would reach, were runner.host_firewall off, these host services: 0.0.0.0:5432, [::]:9100; runner.host_firewall drops the runs' traffic to this machine but for the proxy and the gateways"
        );
    }
}
