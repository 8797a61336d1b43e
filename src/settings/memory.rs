//! The gateways' body memory when `runner.gateway_memory_mb` is not set: sized from the
//! container's own memory limit (its cgroup), so a small container is not promised more
//! than it holds and killed by the kernel when runs push at once.
//!
//! A quarter of the limit: a push's body is one of three things that grow with it. While
//! it is checked, git (`index-pack`, `log`, `diff`, children in the same cgroup) holds its
//! objects and up to `core.deltaBaseCacheLimit` (96 MiB) of delta bases, about as much
//! again; the director's own heap (the store, the HTTP servers, the scanner) needs the
//! rest. A quarter for bodies leaves the git children as much and half for everything else.

/// Today's default, and the most a derived value may be.
pub const DEFAULT_GATEWAY_MEMORY_MB: u64 = 512;

/// cgroup v2's limit of this process.
pub const CGROUP_V2: &str = "/sys/fs/cgroup/memory.max";
/// cgroup v1's.
pub const CGROUP_V1: &str = "/sys/fs/cgroup/memory/memory.limit_in_bytes";

/// Limits at or past this are no limit: cgroup v1 writes "none" as the largest page-aligned
/// `i64` (about 8 EiB), and no container has a petabyte.
const NO_LIMIT_FROM: u64 = 1 << 50;

/// The memory limit a cgroup file's text states, in bytes; `None`: no limit (`max`, an
/// absurd value) or text that does not read as one.
pub fn cgroup_limit(text: &str) -> Option<u64> {
    let bytes: u64 = text.trim().parse().ok()?;
    (bytes > 0 && bytes < NO_LIMIT_FROM).then_some(bytes)
}

/// The container's memory limit (cgroup v2, else v1), in bytes, when it has one.
pub fn container_limit() -> Option<u64> {
    [CGROUP_V2, CGROUP_V1]
        .into_iter()
        .find_map(|path| std::fs::read_to_string(path).ok())
        .and_then(|text| cgroup_limit(&text))
}

/// What the gateways' bodies may hold, and where that came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GatewayMemory {
    pub mb: u64,
    pub from: MemorySource,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemorySource {
    /// `runner.gateway_memory_mb`.
    Configured,
    /// A quarter of the container's limit (bytes).
    Cgroup(u64),
    /// No limit found: the default.
    NoLimit,
}

impl std::fmt::Display for GatewayMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.from {
            MemorySource::Configured => write!(f, "{} MB (runner.gateway_memory_mb)", self.mb),
            MemorySource::Cgroup(limit) => write!(
                f,
                "{} MB (a quarter of the container's memory limit, {} MiB, at most {DEFAULT_GATEWAY_MEMORY_MB})",
                self.mb,
                limit >> 20
            ),
            MemorySource::NoLimit => write!(
                f,
                "{} MB (the default: the container has no memory limit)",
                self.mb
            ),
        }
    }
}

/// The gateways' body memory: `configured` when set, else a quarter of `limit` (bytes) in
/// MB (the director's MB are MiB), at most the default. `Err` when it cannot hold one push of `max_push_mb`, naming
/// both keys and the limit: a smaller budget would refuse every large push at run time.
pub fn gateway_memory(
    configured: Option<u64>,
    limit: Option<u64>,
    max_push_mb: u64,
) -> Result<GatewayMemory, String> {
    let chosen = match (configured, limit) {
        (Some(mb), _) => GatewayMemory {
            mb,
            from: MemorySource::Configured,
        },
        (None, Some(bytes)) => GatewayMemory {
            mb: ((bytes / 4) >> 20).min(DEFAULT_GATEWAY_MEMORY_MB),
            from: MemorySource::Cgroup(bytes),
        },
        (None, None) => GatewayMemory {
            mb: DEFAULT_GATEWAY_MEMORY_MB,
            from: MemorySource::NoLimit,
        },
    };
    if chosen.mb < max_push_mb {
        return Err(match chosen.from {
            MemorySource::Cgroup(bytes) => format!(
                "runner.gateway_memory_mb is unset, and a quarter of the container's memory limit ({} MiB) is {} MB, less than one push of runner.max_push_mb ({max_push_mb} MB): raise the limit, lower runner.max_push_mb, or set runner.gateway_memory_mb",
                bytes >> 20,
                chosen.mb
            ),
            _ => format!(
                "runner.gateway_memory_mb ({} MB) cannot hold one push of runner.max_push_mb ({max_push_mb} MB)",
                chosen.mb
            ),
        });
    }
    Ok(chosen)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_files_read_as_a_limit_or_none() {
        // v2
        assert_eq!(cgroup_limit("1073741824\n"), Some(1 << 30));
        assert_eq!(cgroup_limit("max\n"), None);
        // v1: "no limit" is the largest page-aligned i64.
        assert_eq!(cgroup_limit("268435456\n"), Some(256 << 20));
        assert_eq!(cgroup_limit("9223372036854771712\n"), None);
        // Garbage, empty, zero, negative.
        for text in ["", "\n", "lots", "-1", "0", "1.5e9", "12 34"] {
            assert_eq!(cgroup_limit(text), None, "{text:?}");
        }
    }

    #[test]
    fn a_quarter_of_the_limit_at_most_the_default_and_never_below_one_push() {
        let gib = 1 << 30;
        let m = gateway_memory(None, Some(gib), 100).expect("1 GiB holds a push");
        assert_eq!(m.mb, 256);
        assert_eq!(m.from, MemorySource::Cgroup(gib));
        assert!(m.to_string().contains("1024 MiB"), "{m}");
        // Large containers keep today's default.
        assert_eq!(
            gateway_memory(None, Some(64 * gib), 100).expect("ok").mb,
            512
        );
        assert_eq!(
            gateway_memory(None, None, 100).expect("ok"),
            GatewayMemory {
                mb: 512,
                from: MemorySource::NoLimit
            }
        );
        // The chart's old 256 MiB: a quarter cannot hold one push, said with both keys.
        let why = gateway_memory(None, Some(256 << 20), 100).expect_err("refused");
        for named in ["runner.gateway_memory_mb", "runner.max_push_mb", "256 MiB"] {
            assert!(why.contains(named), "{why}");
        }
        // What the operator set is taken as it is, and still checked.
        assert_eq!(
            gateway_memory(Some(700), Some(gib), 100).expect("ok").mb,
            700
        );
        let why = gateway_memory(Some(50), None, 100).expect_err("refused");
        assert!(why.contains("runner.max_push_mb (100 MB)"), "{why}");
    }
}
