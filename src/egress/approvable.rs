//! `runner.egress_approvable`: the `host:port` globs within which a writer may approve a
//! destination for one issue's runs in its thread (`/director allow host:port`), and the
//! check of what an approval names. `*` in a glob's host stands for any run of characters
//! (dots too); `*` as its port for any port. An approval is an allow-list entry
//! ([`super::Entry`]: a name, `*.domain`, an address), covered when a glob matches it as
//! written: a wildcard approval `*.a.example` is matched with its `*` as a character, which
//! only a glob's `*` can match, so a glob covers it only if it covers every name under it.

/// One glob of `runner.egress_approvable`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Glob {
    host: String,
    /// `None`: any port.
    port: Option<u16>,
    text: String,
}

impl Glob {
    pub fn parse(text: &str) -> Result<Self, String> {
        let t = text.trim();
        let (host, port) = t
            .rsplit_once(':')
            .filter(|(h, _)| !h.is_empty())
            .ok_or_else(|| format!("`{t}` is not host:port (`*.example.org:443`, `pypi.org:*`)"))?;
        let port = match port {
            "*" => None,
            p => Some(
                p.parse::<u16>()
                    .ok()
                    .filter(|p| *p > 0)
                    .ok_or_else(|| format!("`{t}`: `{p}` is not a port (1-65535, or `*`)"))?,
            ),
        };
        let host = super::normal_host(host);
        let fits = host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b'*' | b':'));
        if !fits || host.is_empty() {
            return Err(format!("`{t}` names no host pattern"));
        }
        Ok(Self {
            host,
            port,
            text: t.to_owned(),
        })
    }

    /// Whether it covers the approval `host` (as an entry writes it, lower-case) on `port`.
    fn covers(&self, host: &str, port: u16) -> bool {
        self.port.is_none_or(|p| p == port) && glob_match(self.host.as_bytes(), host.as_bytes())
    }

    fn covers_host(&self, host: &str) -> bool {
        glob_match(self.host.as_bytes(), host.as_bytes())
    }
}

impl std::fmt::Display for Glob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// `*` matches any run of bytes (none included); everything else itself.
fn glob_match(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, t));
            p += 1;
        } else if p < pattern.len() && pattern[p] == text[t] {
            p += 1;
            t += 1;
        } else if let Some((sp, st)) = star {
            p = sp + 1;
            t = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|b| *b == b'*')
}

/// The globs of `runner.egress_approvable` (checked when the settings were read: one that
/// does not parse is left out).
pub fn globs(texts: &[String]) -> Vec<Glob> {
    texts.iter().filter_map(|t| Glob::parse(t).ok()).collect()
}

/// The entry `text` approves, as the allow-list writes it, when `globs` cover it; else why
/// not, in words for the thread.
pub fn check(text: &str, globs: &[Glob]) -> Result<String, String> {
    let entry: super::Entry = text.parse()?;
    let written = entry.to_string();
    let (host, port) = written
        .rsplit_once(':')
        .map(|(h, p)| (h.trim_start_matches('[').trim_end_matches(']'), p))
        .and_then(|(h, p)| Some((h.to_owned(), p.parse::<u16>().ok()?)))
        .ok_or_else(|| format!("`{text}` is not host:port"))?;
    if globs.iter().any(|g| g.covers(&host, port)) {
        return Ok(written);
    }
    let listed = globs
        .iter()
        .map(|g| format!("`{g}`"))
        .collect::<Vec<_>>()
        .join(", ");
    let ports: Vec<String> = globs
        .iter()
        .filter(|g| g.covers_host(&host))
        .filter_map(|g| g.port.map(|p| p.to_string()))
        .collect();
    if !ports.is_empty() {
        return Err(format!(
            "`{written}`: port {port} is outside `runner.egress_approvable` for this host (approvable: {})",
            ports.join(", ")
        ));
    }
    if host.starts_with("*.") {
        return Err(format!(
            "`{written}`: a wildcard is approvable only where a glob of `runner.egress_approvable` covers every name under it ({listed})"
        ));
    }
    Err(format!(
        "`{written}` is not within `runner.egress_approvable` ({listed})"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(list: &[&str]) -> Vec<Glob> {
        list.iter().map(|t| Glob::parse(t).expect(t)).collect()
    }

    #[test]
    fn globs_cover_names_ports_and_wildcards_only_as_wide_as_themselves() {
        let globs = g(&["*.pythonhosted.org:443", "pypi.org:443", "pkgs.example:*"]);
        assert_eq!(check("pypi.org:443", &globs), Ok("pypi.org:443".into()));
        assert_eq!(check("PyPI.org.:443", &globs), Ok("pypi.org:443".into()));
        assert_eq!(
            check("files.pythonhosted.org:443", &globs),
            Ok("files.pythonhosted.org:443".into())
        );
        assert_eq!(
            check("*.pythonhosted.org:443", &globs),
            Ok("*.pythonhosted.org:443".into())
        );
        assert_eq!(
            check("pkgs.example:8080", &globs),
            Ok("pkgs.example:8080".into())
        );
        // Port outside, wildcard wider than the globs, host outside, malformed.
        let port = check("pypi.org:22", &globs).expect_err("port");
        assert!(
            port.contains("port 22 is outside") && port.contains("443"),
            "{port}"
        );
        let wide = check("*.org:443", &globs).expect_err("wide");
        assert!(wide.contains("wildcard"), "{wide}");
        let outside = check("evil.example:443", &globs).expect_err("outside");
        assert!(outside.contains("not within"), "{outside}");
        for bad in [
            "pypi.org",
            "pypi.org:0",
            "py*pi.org:443",
            "a b:443",
            ":443",
            "*:443",
        ] {
            assert!(check(bad, &globs).is_err(), "{bad}");
        }
        // An address, and nothing at all.
        assert!(check("10.0.0.5:8000", &g(&["10.0.0.*:8000"])).is_ok());
        assert!(check("pypi.org:443", &[]).is_err());
    }

    #[test]
    fn a_glob_must_be_host_and_port() {
        for bad in ["pypi.org", "pypi.org:x", ":443", "a/b:443", "pypi.org:0"] {
            assert!(Glob::parse(bad).is_err(), "{bad}");
        }
        assert!(Glob::parse("*:*").is_ok());
    }
}
