//! The workspace a setup left, read once as a tar stream: every secret the setup was given is
//! looked for (as given and in the encodings a tool may write it in) in each file's contents,
//! its name and a link's target, while the entries are copied, relative to the workspace, into
//! a snapshot. Streaming: memory stays a few buffers whatever the workspace's size.

use std::io::{Read, Write};

use aho_corasick::AhoCorasick;

/// One form of one secret to look for.
#[derive(Clone, Debug)]
pub struct Pattern {
    /// The secret's name (`[setup_secrets.<NAME>]`), said when found; never its value.
    pub name: String,
    pub bytes: Vec<u8>,
}

/// What the scan found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scanned {
    /// No secret anywhere. `bytes`: the workspace's size in the snapshot's tar; `kept`:
    /// whether the copy was written whole (within its limit).
    Clean { bytes: u64, files: u64, kept: bool },
    /// The first place a secret was found.
    Hit { path: String, name: String },
}

/// Reads `input` (a tar of the workspace directory, each entry under one leading directory
/// when `strip_root`), looks for `patterns`, and writes the entries, relative to the
/// workspace, to `out` while they total at most `max_bytes` (past that the copy is dropped,
/// the scan goes on). Stops at the first secret found.
pub fn scan_and_copy<R: Read, W: Write>(
    input: R,
    strip_root: bool,
    patterns: &[Pattern],
    out: Option<W>,
    max_bytes: u64,
) -> std::io::Result<Scanned> {
    let finder = Finder::new(patterns)?;
    let mut archive = tar::Archive::new(input);
    let mut copy = out.map(tar::Builder::new);
    let mut counted = CountedLimit {
        total: 0,
        max: max_bytes,
    };
    let mut files = 0u64;
    let mut entries = 0u64;
    for entry in archive.entries()? {
        let mut entry = entry?;
        entries += 1;
        // Over the limit (or past the most entries a workspace may hold), nothing more is
        // read: the workspace is refused whole, so what else it holds does not matter.
        if !counted.within() || entries > MAX_ENTRIES {
            return Ok(Scanned::Clean {
                bytes: counted.total,
                files,
                kept: false,
            });
        }
        let raw = entry.path()?.to_string_lossy().into_owned();
        let Some(path) = relative(&raw, strip_root) else {
            continue;
        };
        if let Some(name) = finder.find(path.as_bytes()) {
            // The name itself holds it: said with the value replaced.
            return Ok(Scanned::Hit {
                path: finder.redact(&path),
                name,
            });
        }
        let kind = entry.header().entry_type();
        let mut header = entry.header().clone();
        if kind.is_symlink() || kind.is_hard_link() {
            let target = entry
                .link_name()?
                .map(|t| t.to_string_lossy().into_owned())
                .unwrap_or_default();
            if let Some(name) = finder.find(target.as_bytes()) {
                return Ok(Scanned::Hit { path, name });
            }
            let target = if kind.is_hard_link() {
                relative(&target, strip_root).unwrap_or(target)
            } else {
                target
            };
            counted.add(512);
            if let Some(b) = copy.as_mut().filter(|_| counted.within()) {
                b.append_link(&mut header, &path, &target)?;
            }
        } else if kind.is_dir() {
            counted.add(512);
            if let Some(b) = copy.as_mut().filter(|_| counted.within()) {
                b.append_data(&mut header, &path, std::io::empty())?;
            }
        } else if kind.is_file() || kind == tar::EntryType::Continuous {
            files += 1;
            let size = entry.header().size()?;
            counted.add(512 + size.div_ceil(512) * 512);
            if !counted.within() {
                // Refused whole at its declared size: a sparse file of exabytes is never read.
                return Ok(Scanned::Clean {
                    bytes: counted.total,
                    files,
                    kept: false,
                });
            }
            let mut scanning = ScanningReader {
                inner: &mut entry,
                finder: &finder,
                tail: Vec::new(),
                found: None,
            };
            match copy.as_mut().filter(|_| counted.within()) {
                Some(b) => b.append_data(&mut header, &path, &mut scanning)?,
                None => {
                    std::io::copy(&mut scanning, &mut std::io::sink())?;
                }
            }
            if let Some(name) = scanning.found {
                return Ok(Scanned::Hit { path, name });
            }
        }
        // Devices, FIFOs and the like are not part of a workspace worth keeping.
    }
    let kept = counted.within();
    if let Some(b) = copy
        && kept
    {
        b.into_inner()?.flush()?;
    }
    Ok(Scanned::Clean {
        bytes: counted.total,
        files,
        kept,
    })
}

/// The most entries a workspace may hold; past it, it is treated as over its size.
pub const MAX_ENTRIES: u64 = 500_000;
/// The most one git object is inflated to while it is searched.
const MAX_OBJECT: u64 = 64 * 1024 * 1024;

/// Searches the git objects of a workspace copy (`tar`, entries relative to the workspace,
/// as [`scan_and_copy`] writes) for `patterns` once inflated: loose objects, and each entry of
/// each pack (a delta's inserted bytes included). A secret the setup committed and removed
/// is only there, compressed. Returns the object's file and the secret's name.
pub fn scan_git_objects<R: Read>(
    tar: R,
    patterns: &[Pattern],
) -> std::io::Result<Option<(String, String)>> {
    let finder = Finder::new(patterns)?;
    if finder.automaton.is_none() {
        return Ok(None);
    }
    let mut archive = tar::Archive::new(tar);
    for entry in archive.entries()? {
        let mut entry = entry?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let path = entry.path()?.to_string_lossy().into_owned();
        let Some(rest) = path
            .strip_prefix(".git/objects/")
            .or_else(|| path.split_once("/.git/objects/").map(|(_, r)| r))
        else {
            continue;
        };
        let found = if is_loose(rest) {
            inflated(&mut entry, &finder)?
        } else if rest.starts_with("pack/") && rest.ends_with(".pack") {
            in_pack(&mut entry, &finder)?
        } else {
            None
        };
        if let Some(name) = found {
            return Ok(Some((path, name)));
        }
    }
    Ok(None)
}

/// `ab/cdef…` (two and 38 hex digits, or 62 for SHA-256).
fn is_loose(rest: &str) -> bool {
    let hex = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit());
    rest.split_once('/').is_some_and(|(dir, name)| {
        dir.len() == 2 && hex(dir) && (name.len() == 38 || name.len() == 62) && hex(name)
    })
}

/// One zlib stream from `input`, searched as it inflates (at most [`MAX_OBJECT`] of it).
fn inflated<R: Read>(input: R, finder: &Finder) -> std::io::Result<Option<String>> {
    let decoder = flate2::read::ZlibDecoder::new(input);
    let mut scanning = ScanningReader {
        inner: decoder.take(MAX_OBJECT),
        finder,
        tail: Vec::new(),
        found: None,
    };
    // A stream that does not inflate is not a git object: nothing to find in it.
    let _ = std::io::copy(&mut scanning, &mut std::io::sink());
    Ok(scanning.found)
}

/// Each entry of a pack, inflated and searched. Stops at the first that does not parse.
fn in_pack<R: Read>(input: R, finder: &Finder) -> std::io::Result<Option<String>> {
    use std::io::BufRead as _;
    let mut r = std::io::BufReader::new(input);
    let mut header = [0u8; 12];
    if r.read_exact(&mut header).is_err() || &header[..4] != b"PACK" {
        return Ok(None);
    }
    let count = u32::from_be_bytes([header[8], header[9], header[10], header[11]]);
    for _ in 0..count {
        let mut byte = [0u8; 1];
        r.read_exact(&mut byte)?;
        let kind = (byte[0] >> 4) & 7;
        while byte[0] & 0x80 != 0 {
            r.read_exact(&mut byte)?;
        }
        match kind {
            6 => {
                // An offset delta: its base's distance, a varint of its own.
                r.read_exact(&mut byte)?;
                while byte[0] & 0x80 != 0 {
                    r.read_exact(&mut byte)?;
                }
            }
            7 => {
                let mut base = [0u8; 32];
                // A SHA-1 name; SHA-256 repositories are not read further.
                r.read_exact(&mut base[..20])?;
            }
            1..=4 => {}
            _ => return Ok(None),
        }
        // The bufread decoder takes exactly its stream from `r`, so the next entry follows.
        let mut decoder = flate2::bufread::ZlibDecoder::new(&mut r);
        let mut scanning = ScanningReader {
            inner: (&mut decoder).take(MAX_OBJECT),
            finder,
            tail: Vec::new(),
            found: None,
        };
        if std::io::copy(&mut scanning, &mut std::io::sink()).is_err() {
            return Ok(None);
        }
        if scanning.found.is_some() {
            return Ok(scanning.found);
        }
        // An object larger than what is searched: the rest of the pack cannot be followed.
        if decoder.total_out() >= MAX_OBJECT {
            return Ok(None);
        }
        if r.fill_buf()?.is_empty() {
            break;
        }
    }
    Ok(None)
}

/// `raw` relative to the workspace: without its leading directory when `strip_root`, never
/// absolute or climbing out. `None` for the workspace itself.
fn relative(raw: &str, strip_root: bool) -> Option<String> {
    let trimmed = raw.trim_start_matches("./").trim_start_matches('/');
    let rest = if strip_root {
        trimmed.split_once('/').map_or("", |(_, r)| r)
    } else {
        trimmed
    };
    let rest = rest.trim_end_matches('/');
    if rest.is_empty() || rest.split('/').any(|p| p == "..") {
        return None;
    }
    Some(rest.to_owned())
}

struct CountedLimit {
    total: u64,
    max: u64,
}

impl CountedLimit {
    fn add(&mut self, n: u64) {
        self.total = self.total.saturating_add(n);
    }
    fn within(&self) -> bool {
        self.total <= self.max
    }
}

struct Finder {
    automaton: Option<AhoCorasick>,
    names: Vec<String>,
    longest: usize,
}

impl Finder {
    fn new(patterns: &[Pattern]) -> std::io::Result<Self> {
        let usable: Vec<&Pattern> = patterns.iter().filter(|p| p.bytes.len() >= 8).collect();
        let automaton = if usable.is_empty() {
            None
        } else {
            Some(
                AhoCorasick::new(usable.iter().map(|p| &p.bytes))
                    .map_err(|e| std::io::Error::other(e.to_string()))?,
            )
        };
        Ok(Self {
            automaton,
            names: usable.iter().map(|p| p.name.clone()).collect(),
            longest: usable.iter().map(|p| p.bytes.len()).max().unwrap_or(0),
        })
    }

    fn redact(&self, text: &str) -> String {
        match &self.automaton {
            Some(a) => a.replace_all(text, &vec!["[redacted]"; self.names.len()]),
            None => text.to_owned(),
        }
    }

    fn find(&self, haystack: &[u8]) -> Option<String> {
        let m = self.automaton.as_ref()?.find(haystack)?;
        self.names.get(m.pattern().as_usize()).cloned()
    }
}

/// A file's contents as they are read, searched across reads (the last bytes of one read are
/// searched again with the next, so a value split between two is found).
struct ScanningReader<'a, R> {
    inner: R,
    finder: &'a Finder,
    tail: Vec<u8>,
    found: Option<String>,
}

impl<R: Read> Read for ScanningReader<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n > 0 && self.found.is_none() && self.finder.longest > 0 {
            let mut window = std::mem::take(&mut self.tail);
            window.extend_from_slice(&buf[..n]);
            if let Some(name) = self.finder.find(&window) {
                self.found = Some(name);
            }
            let keep = self.finder.longest.saturating_sub(1).min(window.len());
            self.tail = window.split_off(window.len() - keep);
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "tok-9f8e7d6c5b4a";

    fn patterns() -> Vec<Pattern> {
        vec![Pattern {
            name: "PIP_TOKEN".into(),
            bytes: SECRET.as_bytes().to_vec(),
        }]
    }

    /// `input` searched for [`SECRET`], nothing copied.
    fn scan(input: &[u8]) -> Scanned {
        scan_and_copy(input, true, &patterns(), None::<Vec<u8>>, 1 << 30).expect("scan")
    }

    fn workspace(files: &[(&str, Vec<u8>)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        let mut dir = tar::Header::new_gnu();
        dir.set_entry_type(tar::EntryType::Directory);
        dir.set_mode(0o755);
        dir.set_size(0);
        dir.set_cksum();
        b.append_data(&mut dir.clone(), "workspace/", std::io::empty())
            .expect("dir");
        for (path, data) in files {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_uid(1000);
            h.set_cksum();
            b.append_data(&mut h, format!("workspace/{path}"), data.as_slice())
                .expect("file");
        }
        b.into_inner().expect("tar")
    }

    #[test]
    fn a_clean_workspace_is_copied_relative_to_itself_with_its_owners() {
        let input = workspace(&[
            ("checkout/README", b"hello".to_vec()),
            (".cache/pip/wheel", vec![7u8; 200_000]),
        ]);
        let mut out = Vec::new();
        let scanned = scan_and_copy(input.as_slice(), true, &patterns(), Some(&mut out), 1 << 30)
            .expect("scan");
        assert!(
            matches!(
                scanned,
                Scanned::Clean {
                    files: 2,
                    kept: true,
                    ..
                }
            ),
            "{scanned:?}"
        );
        let mut archive = tar::Archive::new(out.as_slice());
        let names: Vec<(String, u64)> = archive
            .entries()
            .expect("entries")
            .map(|e| {
                let e = e.expect("entry");
                (
                    e.path().expect("path").display().to_string(),
                    e.header().uid().expect("uid"),
                )
            })
            .collect();
        assert_eq!(
            names,
            [
                ("checkout/README".to_owned(), 1000),
                (".cache/pip/wheel".to_owned(), 1000)
            ]
        );
    }

    #[test]
    fn a_secret_anywhere_in_a_file_even_across_reads_is_found_with_the_file_named() {
        let mut big = vec![b'x'; 100_000];
        // Across the boundary of the reader's 8 KiB reads and tar's blocks.
        let at = 8192 * 3 - 5;
        big[at..at + SECRET.len()].copy_from_slice(SECRET.as_bytes());
        let input = workspace(&[("ok.txt", b"fine".to_vec()), ("checkout/.npmrc", big)]);
        let scanned = scan(input.as_slice());
        assert_eq!(
            scanned,
            Scanned::Hit {
                path: "checkout/.npmrc".into(),
                name: "PIP_TOKEN".into()
            }
        );
    }

    #[test]
    fn a_secret_in_a_name_or_a_links_target_is_found_too() {
        let input = workspace(&[(&format!("cache/{SECRET}"), b"x".to_vec())]);
        let scanned = scan(input.as_slice());
        assert_eq!(
            scanned,
            Scanned::Hit {
                path: "cache/[redacted]".into(),
                name: "PIP_TOKEN".into()
            },
            "the name is said without the value"
        );
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        h.set_cksum();
        b.append_link(&mut h, "workspace/link", format!("/tmp/{SECRET}"))
            .expect("link");
        let input = b.into_inner().expect("tar");
        let scanned = scan(input.as_slice());
        assert_eq!(
            scanned,
            Scanned::Hit {
                path: "link".into(),
                name: "PIP_TOKEN".into()
            }
        );
    }

    #[test]
    fn a_workspace_over_the_limit_is_not_kept_and_not_read_further() {
        // Whatever follows the limit is not read: such a workspace is refused whole.
        let input = workspace(&[("a", vec![1u8; 10_000]), ("b", SECRET.as_bytes().to_vec())]);
        let scanned = scan_and_copy(input.as_slice(), true, &patterns(), Some(Vec::new()), 4096)
            .expect("scan");
        assert!(
            matches!(scanned, Scanned::Clean { kept: false, .. }),
            "{scanned:?}"
        );
        // A sparse file declaring exabytes is over at its header, never read.
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_path("workspace/sparse").expect("path");
        h.set_size(1 << 60);
        h.set_cksum();
        b.append(&h, std::io::empty()).expect("header");
        let huge = b.into_inner().expect("tar");
        let scanned = scan_and_copy(huge.as_slice(), true, &patterns(), Some(Vec::new()), 4096);
        assert!(
            matches!(scanned, Ok(Scanned::Clean { kept: false, .. })),
            "{scanned:?}"
        );
    }

    fn git(dir: &std::path::Path, args: &[&str]) {
        let ok = std::process::Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@t", "-C"])
            .arg(dir)
            .args(args)
            .output()
            .expect("git runs")
            .status
            .success();
        assert!(ok, "git {args:?}");
    }

    fn tar_of(dir: &std::path::Path) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        b.append_dir_all("checkout", dir).expect("tar");
        b.into_inner().expect("tar")
    }

    #[test]
    fn a_secret_committed_and_removed_is_found_in_gits_objects_loose_or_packed() {
        let dir = tempfile::tempdir().expect("dir");
        let repo = dir.path();
        git(repo, &["init", "-q"]);
        std::fs::write(repo.join("README"), "hello").expect("write");
        git(repo, &["add", "README"]);
        git(repo, &["commit", "-q", "-m", "first"]);
        assert_eq!(
            scan_git_objects(tar_of(repo).as_slice(), &patterns()).expect("scan"),
            None
        );
        std::fs::write(repo.join(".npmrc"), format!("token={SECRET}\n")).expect("write");
        git(repo, &["add", ".npmrc"]);
        git(repo, &["commit", "-q", "-m", "oops"]);
        std::fs::remove_file(repo.join(".npmrc")).expect("rm");
        // Not in any file as written: only in a compressed object.
        let tar = tar_of(repo);
        let plain = scan_and_copy(tar.as_slice(), false, &patterns(), None::<Vec<u8>>, 1 << 30)
            .expect("scan");
        assert!(matches!(plain, Scanned::Clean { .. }), "{plain:?}");
        let loose = scan_git_objects(tar.as_slice(), &patterns()).expect("scan");
        assert!(
            loose
                .as_ref()
                .is_some_and(|(p, n)| p.starts_with("checkout/.git/objects/") && n == "PIP_TOKEN"),
            "{loose:?}"
        );
        git(repo, &["gc", "-q", "--aggressive"]);
        let packed = scan_git_objects(tar_of(repo).as_slice(), &patterns()).expect("scan");
        assert!(
            packed.as_ref().is_some_and(|(p, _)| p.ends_with(".pack")),
            "{packed:?}"
        );
    }

    #[test]
    fn paths_that_climb_out_are_dropped() {
        assert_eq!(relative("workspace/a/b", true).as_deref(), Some("a/b"));
        assert_eq!(relative("workspace/", true), None);
        assert_eq!(relative("workspace/../etc/passwd", true), None);
        assert_eq!(relative("./x", false).as_deref(), Some("x"));
    }
}
