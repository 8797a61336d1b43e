//! Network egress of runs (`runner.egress = "allowlist"`): a run reaches the outside only
//! through the director's egress proxy ([`proxy`]), which lets through the destinations of
//! its allow-list and refuses, and counts, the rest.
//!
//! [`Policy`] is the allow-list and the addresses no entry can open: link-local (the cloud
//! metadata addresses among them), unspecified, multicast and broadcast addresses, the
//! director's own listeners and the Docker daemon's. A name is checked twice: as given
//! (against the entries) and as resolved (against the forbidden addresses), and the proxy
//! connects to the very address it checked, so a name cannot resolve to one thing for the
//! check and another for the connection. Loopback is reachable only through an entry that
//! names the host exactly (the forge on this machine, say), never through a wildcard, so a
//! name someone points at 127.0.0.1 opens nothing.

pub mod approvable;
pub mod firewall;
pub mod host;
pub mod proxy;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

/// One `runner.egress_allow` entry: `host:port`, `*.domain:port`, `[v6]:port` or `ip:port`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    host: Host,
    port: u16,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Host {
    /// A name, lower-cased, without a trailing dot.
    Name(String),
    /// `*.suffix`: any name under `suffix` (not `suffix` itself).
    Wildcard(String),
    Ip(IpAddr),
}

impl std::fmt::Display for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.host {
            Host::Name(n) => write!(f, "{n}:{}", self.port),
            Host::Wildcard(s) => write!(f, "*.{s}:{}", self.port),
            Host::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]:{}", self.port),
            Host::Ip(ip) => write!(f, "{ip}:{}", self.port),
        }
    }
}

/// A host as a request names it: lower-cased, brackets and a trailing dot removed.
pub fn normal_host(host: &str) -> String {
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .trim_end_matches('.')
        .to_ascii_lowercase()
}

/// `host:port` split at the last colon, IPv6 in brackets.
pub fn split_host_port(s: &str) -> Option<(String, u16)> {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (h, p) = rest.split_once("]:")?;
        (h, p)
    } else {
        let (h, p) = s.rsplit_once(':')?;
        if h.contains(':') {
            return None;
        }
        (h, p)
    };
    let port: u16 = port.parse().ok().filter(|p| *p > 0)?;
    (!host.is_empty()).then(|| (normal_host(host), port))
}

pub(crate) fn valid_name(name: &str) -> bool {
    name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

impl std::str::FromStr for Entry {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let (host, port) = split_host_port(s).ok_or_else(|| {
            format!("`{s}` is not host:port (a port is required; IPv6 as [addr]:port)")
        })?;
        let host = if let Ok(ip) = host.parse::<IpAddr>() {
            Host::Ip(ip)
        } else if let Some(suffix) = host.strip_prefix("*.") {
            if !valid_name(suffix) || !suffix.contains('.') {
                return Err(format!(
                    "`{s}`: a wildcard covers names under a domain with a dot, like *.example.org:443"
                ));
            }
            Host::Wildcard(suffix.to_owned())
        } else if host.contains('*') {
            return Err(format!(
                "`{s}`: `*` only as the whole first label (*.example.org)"
            ));
        } else if valid_name(&host) {
            Host::Name(host)
        } else {
            return Err(format!("`{s}` names no host"));
        };
        Ok(Self { host, port })
    }
}

impl Entry {
    pub fn exact(host: &str, port: u16) -> Self {
        let host = normal_host(host);
        Self {
            host: match host.parse() {
                Ok(ip) => Host::Ip(ip),
                Err(_) => Host::Name(host),
            },
            port,
        }
    }

    /// Whether the entry covers `host:port` as the run named it; `Some(exact)` when it does,
    /// `exact` telling an entry that names the host from a wildcard.
    fn covers(&self, host: &str, port: u16) -> Option<bool> {
        if self.port != port {
            return None;
        }
        match &self.host {
            Host::Name(n) => (n == host).then_some(true),
            Host::Wildcard(suffix) => host
                .strip_suffix(suffix.as_str())
                .is_some_and(|head| head.ends_with('.') && head.len() > 1)
                .then_some(false),
            Host::Ip(ip) => (host.parse::<IpAddr>().ok() == Some(*ip)).then_some(true),
        }
    }
}

/// Whether any of `entries` covers `host:port`.
pub fn covered(entries: &[Entry], host: &str, port: u16) -> bool {
    let host = normal_host(host);
    entries.iter().any(|e| e.covers(&host, port).is_some())
}

/// Why an address is never a run's destination, whatever the allow-list says.
pub fn forbidden_ip(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => forbidden_v4(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return forbidden_v4(v4);
            }
            let seg = v6.segments();
            if v6.is_unspecified() {
                Some("an unspecified address")
            } else if v6.is_multicast() {
                Some("a multicast address")
            } else if seg[0] & 0xffc0 == 0xfe80 {
                Some("a link-local address")
            } else if seg[0] == 0xfd00 && seg[1] == 0x0ec2 {
                Some("a cloud metadata address")
            } else {
                None
            }
        }
    }
}

fn forbidden_v4(ip: Ipv4Addr) -> Option<&'static str> {
    if ip == Ipv4Addr::new(169, 254, 169, 254) || ip == Ipv4Addr::new(100, 100, 100, 200) {
        Some("a cloud metadata address")
    } else if ip.is_link_local() {
        Some("a link-local address")
    } else if ip.is_unspecified() || ip.octets()[0] == 0 {
        Some("an unspecified address")
    } else if ip.is_multicast() {
        Some("a multicast address")
    } else if ip.is_broadcast() {
        Some("the broadcast address")
    } else {
        None
    }
}

fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => {
            v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

/// What a run may reach.
#[derive(Clone, Debug, Default)]
pub struct Policy {
    entries: Vec<Entry>,
    /// The director's own listeners and the Docker daemon's: refused even when allowed.
    guarded: Vec<SocketAddr>,
}

impl Policy {
    /// `allow` from `runner.egress_allow` (each entry checked), plus `always` (the forge,
    /// the model endpoint), minus `guarded`.
    pub fn new(
        allow: &[String],
        always: Vec<Entry>,
        guarded: Vec<SocketAddr>,
    ) -> Result<Self, String> {
        let mut entries = always;
        for a in allow {
            entries.push(a.parse()?);
        }
        Ok(Self { entries, guarded })
    }

    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// Whether a run may ask for `host:port` at all (before any name is resolved); `Ok(exact)`
    /// says whether an entry names the host exactly.
    pub fn allows_name(&self, host: &str, port: u16) -> Result<bool, String> {
        let host = normal_host(host);
        let mut found = None;
        for e in &self.entries {
            match (e.covers(&host, port), found) {
                (Some(true), _) => {
                    found = Some(true);
                    break;
                }
                (Some(false), None) => found = Some(false),
                _ => {}
            }
        }
        found.ok_or_else(|| "not on the run's allow-list".to_owned())
    }

    /// Whether the address a name resolved to may be connected to, the name having been
    /// allowed (`exact`: by an entry naming it).
    pub fn allows_address(&self, addr: SocketAddr, exact: bool) -> Result<(), String> {
        if let Some(why) = forbidden_ip(addr.ip()) {
            return Err(format!("{} is {why}", addr.ip()));
        }
        let guarded = self.guarded.iter().any(|g| {
            g.port() == addr.port()
                && (g.ip() == addr.ip()
                    || g.ip().is_unspecified()
                    || (is_loopback(g.ip()) && is_loopback(addr.ip())))
        });
        if guarded {
            return Err(format!("{addr} is one of the director's own listeners"));
        }
        if is_loopback(addr.ip()) && !exact {
            return Err(format!(
                "{addr} is a loopback address, reachable only through an entry naming the host exactly"
            ));
        }
        Ok(())
    }

    /// The whole check of `host:port` against the addresses it resolved to: the first
    /// allowed address, or why none is.
    pub fn check(
        &self,
        host: &str,
        port: u16,
        resolved: &[SocketAddr],
    ) -> Result<SocketAddr, String> {
        let exact = self.allows_name(host, port)?;
        self.pick(host, resolved, exact)
    }

    /// The first of the addresses `host` resolved to that may be connected to (`exact`: an
    /// entry names the host), or why none may.
    pub fn pick(
        &self,
        host: &str,
        resolved: &[SocketAddr],
        exact: bool,
    ) -> Result<SocketAddr, String> {
        let mut last = format!("{host} resolved to no address");
        for addr in resolved {
            match self.allows_address(*addr, exact) {
                Ok(()) => return Ok(*addr),
                Err(why) => last = why,
            }
        }
        Err(last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(allow: &[&str]) -> Policy {
        let allow: Vec<String> = allow.iter().map(|s| (*s).to_owned()).collect();
        Policy::new(
            &allow,
            vec![Entry::exact("127.0.0.1", 3000)],
            vec![
                "127.0.0.1:8080".parse().expect("addr"),
                "0.0.0.0:3128".parse().expect("addr"),
            ],
        )
        .expect("policy")
    }

    fn addr(s: &str) -> SocketAddr {
        s.parse().expect("addr")
    }

    #[test]
    fn entries_parse_or_are_refused_by_name() {
        for ok in [
            "example.org:443",
            "*.example.org:443",
            "10.0.0.5:22",
            "[2001:db8::1]:443",
            "Git.Example.org.:80",
        ] {
            assert!(ok.parse::<Entry>().is_ok(), "{ok}");
        }
        for bad in [
            "example.org",
            "example.org:0",
            "example.org:99999",
            "*.org:443",
            "a*.example.org:443",
            "*:443",
            "exa mple.org:1",
            ":443",
            "2001:db8::1:443",
            "[2001:db8::1]",
            "-x.org:1",
        ] {
            let e = bad.parse::<Entry>().expect_err(bad);
            assert!(e.contains(bad.trim()), "{bad}: {e}");
        }
        assert_eq!(
            "Git.Example.org.:80"
                .parse::<Entry>()
                .expect("entry")
                .to_string(),
            "git.example.org:80"
        );
    }

    #[test]
    fn names_ports_and_wildcards_match_as_written() {
        let p = policy(&[
            "api.example.org:443",
            "*.models.example.com:443",
            "[2001:db8::1]:8443",
        ]);
        assert_eq!(p.allows_name("api.example.org", 443), Ok(true));
        assert_eq!(p.allows_name("API.Example.org.", 443), Ok(true));
        assert!(
            p.allows_name("api.example.org", 80).is_err(),
            "another port"
        );
        assert!(p.allows_name("evil-api.example.org", 443).is_err());
        assert!(p.allows_name("example.org", 443).is_err());
        assert_eq!(p.allows_name("eu.models.example.com", 443), Ok(false));
        assert_eq!(p.allows_name("a.b.models.example.com", 443), Ok(false));
        assert!(
            p.allows_name("models.example.com", 443).is_err(),
            "the wildcard is below"
        );
        assert!(p.allows_name("xmodels.example.com", 443).is_err());
        assert!(p.allows_name("models.example.com.evil.org", 443).is_err());
        assert_eq!(p.allows_name("[2001:db8::1]", 8443), Ok(true));
        assert_eq!(
            p.allows_name("2001:db8:0:0::1", 8443),
            Ok(true),
            "one address, two spellings"
        );
        assert_eq!(p.allows_name("127.0.0.1", 3000), Ok(true), "the forge");
    }

    #[test]
    fn forbidden_addresses_stay_forbidden_whatever_resolves_to_them() {
        let p = policy(&[
            "*.example.org:443",
            "metadata.example.org:80",
            "169.254.169.254:80",
        ]);
        for (host, port, ip) in [
            ("x.example.org", 443, "169.254.169.254:443"),
            ("x.example.org", 443, "169.254.10.1:443"),
            ("x.example.org", 443, "[fe80::1]:443"),
            ("x.example.org", 443, "[fd00:ec2::254]:443"),
            ("x.example.org", 443, "[::ffff:169.254.169.254]:443"),
            ("x.example.org", 443, "0.0.0.0:443"),
            ("x.example.org", 443, "224.0.0.1:443"),
            ("metadata.example.org", 80, "169.254.169.254:80"),
            ("169.254.169.254", 80, "169.254.169.254:80"),
        ] {
            assert!(p.check(host, port, &[addr(ip)]).is_err(), "{host} -> {ip}");
        }
        // A wildcard never opens loopback; an exact entry may (the forge on this machine).
        assert!(
            p.check("x.example.org", 443, &[addr("127.0.0.1:443")])
                .is_err()
        );
        assert!(p.check("x.example.org", 443, &[addr("[::1]:443")]).is_err());
        assert_eq!(
            p.check("127.0.0.1", 3000, &[addr("127.0.0.1:3000")]),
            Ok(addr("127.0.0.1:3000"))
        );
        // The first allowed address of several is the one connected to.
        assert_eq!(
            p.check(
                "x.example.org",
                443,
                &[addr("169.254.1.1:443"), addr("93.184.216.34:443")]
            ),
            Ok(addr("93.184.216.34:443"))
        );
        assert!(p.check("x.example.org", 443, &[]).is_err());
    }

    #[test]
    fn the_directors_own_listeners_are_never_a_destination() {
        let p = policy(&["127.0.0.1:8080", "localhost:3128", "10.1.2.3:3128"]);
        assert!(
            p.check("127.0.0.1", 8080, &[addr("127.0.0.1:8080")])
                .is_err()
        );
        assert!(
            p.check("localhost", 3128, &[addr("127.0.0.1:3128")])
                .is_err(),
            "the proxy itself"
        );
        assert!(
            p.check("10.1.2.3", 3128, &[addr("10.1.2.3:3128")]).is_err(),
            "the proxy on any address"
        );
        let e = p
            .check("127.0.0.1", 8080, &[addr("127.0.0.1:8080")])
            .expect_err("guarded");
        assert!(e.contains("own listeners"), "{e}");
    }
}
