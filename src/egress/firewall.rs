//! `runner.host_firewall`: a packet filter rule that drops what confined runs on Docker send
//! to the host itself (the bridge's own address is an address of the host, so that traffic
//! passes the INPUT chain, not FORWARD, where the engine's internal network would stop it),
//! except to the egress proxy and the gateways.
//!
//! The rules live in a chain of their own, named after the bridge (`DIRECTOR-br-…`), linked
//! from INPUT for traffic arriving on the bridge. Installing is idempotent: a chain left by
//! a crashed start is flushed and refilled, and its links are removed before one is made, so
//! a restart replaces it and never stacks a second. The commands are built by [`install`] and
//! [`remove`] (pure, tested) and run as argument vectors, no shell, by [`HostFirewall`].
//! The program is `iptables` (`runner.host_firewall_command`): the same front end the Docker
//! engine uses, so the rules land in the same back end (nf_tables or legacy) as its own.

use std::net::Ipv4Addr;

/// What to do when a command fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnFailure {
    /// The step is done whatever it says (creating a chain that exists already).
    Ignore,
    /// The rule cannot be had: the install fails.
    Fail,
    /// Run again until it fails (deleting every link, however many a crash left).
    RepeatUntilFail,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    pub args: Vec<String>,
    pub on_failure: OnFailure,
}

/// The rule for one runs' network.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The host's interface of the runs' network (`br-<id>`).
    pub bridge: String,
    /// The bridge's own address, where the proxy and the gateways listen.
    pub gateway: Ipv4Addr,
    /// The ports runs may still reach there: the proxy's and the gateways'.
    pub ports: Vec<u16>,
}

/// Deleting a link more often than this means the command does not say it failed.
const MAX_REPEATS: usize = 64;

impl Plan {
    /// The plan, when the bridge's name can be a chain name's tail (an interface name: at
    /// most 15 characters of letters, digits, `-`, `_` and `.`).
    pub fn new(bridge: &str, gateway: Ipv4Addr, ports: Vec<u16>) -> Result<Self, String> {
        let fits = !bridge.is_empty()
            && bridge.len() <= 15
            && bridge
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if !fits {
            return Err(format!("`{bridge}` is not a network interface's name"));
        }
        Ok(Self {
            bridge: bridge.to_owned(),
            gateway,
            ports,
        })
    }

    /// The chain's name: recognisable, one per bridge (two directors on one host with two
    /// networks keep theirs apart), within iptables' 28 characters.
    pub fn chain(&self) -> String {
        format!("DIRECTOR-{}", self.bridge)
    }

    fn link(&self, op: &str) -> Vec<String> {
        let mut args = vec!["-w".to_owned(), op.to_owned(), "INPUT".to_owned()];
        if op == "-I" {
            args.push("1".to_owned());
        }
        args.extend(["-i", &self.bridge, "-j", &self.chain()].map(str::to_owned));
        args
    }
}

fn step(args: &[&str], on_failure: OnFailure) -> Step {
    Step {
        args: args.iter().map(|a| (*a).to_owned()).collect(),
        on_failure,
    }
}

/// The commands that put the rule in place, in order. The chain is refilled with the drop
/// first and the allowed ports inserted before it, so an old chain being replaced is never
/// left allowing more than it did.
pub fn install(plan: &Plan) -> Vec<Step> {
    let chain = plan.chain();
    let gateway = plan.gateway.to_string();
    let mut steps = vec![
        step(&["-w", "-N", &chain], OnFailure::Ignore),
        step(&["-w", "-F", &chain], OnFailure::Fail),
        step(&["-w", "-A", &chain, "-j", "DROP"], OnFailure::Fail),
    ];
    for port in &plan.ports {
        let port = port.to_string();
        steps.push(step(
            &[
                "-w", "-I", &chain, "1", "-p", "tcp", "-d", &gateway, "--dport", &port, "-j",
                "RETURN",
            ],
            OnFailure::Fail,
        ));
    }
    steps.push(Step {
        args: plan.link("-D"),
        on_failure: OnFailure::RepeatUntilFail,
    });
    steps.push(Step {
        args: plan.link("-I"),
        on_failure: OnFailure::Fail,
    });
    steps
}

/// The commands that take the rule away: every link, then the chain.
pub fn remove(plan: &Plan) -> Vec<Step> {
    let chain = plan.chain();
    vec![
        Step {
            args: plan.link("-D"),
            on_failure: OnFailure::RepeatUntilFail,
        },
        step(&["-w", "-F", &chain], OnFailure::Fail),
        step(&["-w", "-X", &chain], OnFailure::Fail),
    ]
}

/// Runs `steps` with `program`; the first step that fails where it must, said.
pub fn run(program: &str, steps: &[Step]) -> Result<(), String> {
    for s in steps {
        let mut repeats = 0;
        loop {
            let out = std::process::Command::new(program)
                .args(&s.args)
                .stdin(std::process::Stdio::null())
                .output();
            let failed = match &out {
                Ok(o) if o.status.success() => None,
                Ok(o) => Some(format!(
                    "{} ({})",
                    String::from_utf8_lossy(&o.stderr).trim(),
                    o.status
                )),
                Err(e) => Some(e.to_string()),
            };
            match (failed, s.on_failure) {
                (None, OnFailure::RepeatUntilFail) if repeats < MAX_REPEATS => repeats += 1,
                (None, _) | (Some(_), OnFailure::Ignore | OnFailure::RepeatUntilFail) => break,
                (Some(why), OnFailure::Fail) => {
                    return Err(format!("`{program} {}`: {why}", s.args.join(" ")));
                }
            }
        }
    }
    Ok(())
}

/// The rule while the director runs: installed by [`HostFirewall::install`], taken away by
/// [`HostFirewall::remove`] at the stop, or when dropped (a start that failed later on).
#[derive(Debug)]
pub struct HostFirewall {
    program: String,
    plan: Plan,
    installed: bool,
}

impl HostFirewall {
    pub fn install(program: &str, plan: Plan) -> Result<Self, String> {
        // Made before running, so a half-made rule is taken away when the install fails.
        let mut this = Self {
            program: program.to_owned(),
            plan,
            installed: true,
        };
        match run(&this.program, &install(&this.plan)) {
            Ok(()) => Ok(this),
            Err(e) => {
                // What was made of it goes; what cannot be taken away is said.
                if let Err(error) = this.remove() {
                    tracing::debug!(%error, "removing what a failed install made");
                }
                Err(e)
            }
        }
    }

    pub fn chain(&self) -> String {
        self.plan.chain()
    }

    /// Takes the rule away; a second call does nothing.
    pub fn remove(&mut self) -> Result<(), String> {
        if !self.installed {
            return Ok(());
        }
        self.installed = false;
        run(&self.program, &remove(&self.plan))
    }
}

impl Drop for HostFirewall {
    fn drop(&mut self) {
        if let Err(error) = self.remove() {
            tracing::error!(%error, chain = %self.plan.chain(), "the host firewall rule could not be removed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> Plan {
        Plan::new(
            "br-84f8488b7172",
            Ipv4Addr::new(172, 18, 0, 1),
            vec![3128, 3129],
        )
        .expect("plan")
    }

    fn lines(steps: &[Step]) -> Vec<String> {
        steps
            .iter()
            .map(|s| format!("{:?} {}", s.on_failure, s.args.join(" ")))
            .collect()
    }

    #[test]
    fn the_install_refills_its_own_chain_and_links_it_once() {
        let p = plan();
        assert_eq!(p.chain(), "DIRECTOR-br-84f8488b7172");
        assert!(p.chain().len() <= 28, "iptables' limit");
        assert_eq!(
            lines(&install(&p)),
            [
                "Ignore -w -N DIRECTOR-br-84f8488b7172",
                "Fail -w -F DIRECTOR-br-84f8488b7172",
                "Fail -w -A DIRECTOR-br-84f8488b7172 -j DROP",
                "Fail -w -I DIRECTOR-br-84f8488b7172 1 -p tcp -d 172.18.0.1 --dport 3128 -j RETURN",
                "Fail -w -I DIRECTOR-br-84f8488b7172 1 -p tcp -d 172.18.0.1 --dport 3129 -j RETURN",
                "RepeatUntilFail -w -D INPUT -i br-84f8488b7172 -j DIRECTOR-br-84f8488b7172",
                "Fail -w -I INPUT 1 -i br-84f8488b7172 -j DIRECTOR-br-84f8488b7172",
            ]
        );
    }

    #[test]
    fn the_removal_unlinks_every_copy_then_deletes_the_chain() {
        assert_eq!(
            lines(&remove(&plan())),
            [
                "RepeatUntilFail -w -D INPUT -i br-84f8488b7172 -j DIRECTOR-br-84f8488b7172",
                "Fail -w -F DIRECTOR-br-84f8488b7172",
                "Fail -w -X DIRECTOR-br-84f8488b7172",
            ]
        );
    }

    #[test]
    fn only_an_interface_name_becomes_part_of_a_chain_name() {
        let gw = Ipv4Addr::new(10, 0, 0, 1);
        for bad in ["", "br-0123456789abcdef", "br 1", "br;x", "-j ACCEPT"] {
            assert!(Plan::new(bad, gw, vec![]).is_err(), "{bad:?}");
        }
        assert!(Plan::new("docker_gwbridge", gw, vec![]).is_ok());
    }

    #[test]
    fn a_program_that_cannot_run_fails_the_install_naming_the_command() {
        let e = HostFirewall::install("/nonexistent/iptables", plan()).expect_err("fails");
        assert!(e.contains("/nonexistent/iptables -w -F"), "{e}");
        let e = HostFirewall::install("false", plan()).expect_err("fails");
        assert!(e.contains("exit status: 1"), "{e}");
    }

    #[test]
    fn repeated_deletions_stop_when_the_command_never_fails() {
        // `true` never says a link is gone: the repeat is bounded.
        assert_eq!(run("true", &remove(&plan())), Ok(()));
    }
}
