//! git's pkt-line framing, as far as the gateway reads and writes it: a push's command list,
//! the receive-pack advertisement it restricts, and the report it answers a refusal with.

/// The largest pkt-line git sends: 65520 bytes, the four length digits included.
pub const MAX_PKT: usize = 65520;

/// One pkt-line read from a buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Pkt<'a> {
    /// `0000`.
    Flush,
    /// `0001` (protocol v2).
    Delim,
    /// `0002` (protocol v2).
    ResponseEnd,
    Data(&'a [u8]),
}

/// Reads the pkt-line at the start of `buf`: the line and how many bytes it took.
pub fn read(buf: &[u8]) -> Result<(Pkt<'_>, usize), String> {
    let head = buf
        .get(..4)
        .ok_or_else(|| "the request ends inside a pkt-line's length".to_owned())?;
    let text = std::str::from_utf8(head).map_err(|_| "a pkt-line length is not hex".to_owned())?;
    if !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!("a pkt-line length is not hex: {text:?}"));
    }
    let len = usize::from_str_radix(text, 16).map_err(|_| "a pkt-line length is not hex")?;
    match len {
        0 => Ok((Pkt::Flush, 4)),
        1 => Ok((Pkt::Delim, 4)),
        2 => Ok((Pkt::ResponseEnd, 4)),
        3 | 4 => Err(format!("a pkt-line of length {len} carries nothing")),
        n if n > MAX_PKT => Err(format!("a pkt-line of {n} bytes is over git's {MAX_PKT}")),
        n => {
            let data = buf
                .get(4..n)
                .ok_or_else(|| "the request ends inside a pkt-line".to_owned())?;
            Ok((Pkt::Data(data), n))
        }
    }
}

/// `data` as one pkt-line (`data` must fit in one).
pub fn line(data: &[u8]) -> Vec<u8> {
    let mut out = format!("{:04x}", data.len() + 4).into_bytes();
    out.extend_from_slice(data);
    out
}

pub const FLUSH: &[u8] = b"0000";

/// One ref update a push asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Command {
    pub old: String,
    pub new: String,
    pub refname: String,
}

impl Command {
    pub fn creates(&self) -> bool {
        is_zero(&self.old)
    }

    pub fn deletes(&self) -> bool {
        is_zero(&self.new)
    }
}

fn is_zero(oid: &str) -> bool {
    oid.bytes().all(|b| b == b'0')
}

fn is_oid(s: &str) -> bool {
    (s.len() == 40 || s.len() == 64) && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// A ref line and the capabilities after its NUL, if it carries them.
fn split_capabilities(data: &[u8]) -> (&[u8], Option<&[u8]>) {
    match data.iter().position(|b| *b == 0) {
        Some(nul) => (&data[..nul], Some(&data[nul + 1..])),
        None => (data, None),
    }
}

/// A push request: its ref updates, the capabilities the client asked for, and where the
/// pack starts in the body.
#[derive(Debug, PartialEq, Eq)]
pub struct Push {
    pub commands: Vec<Command>,
    pub capabilities: Vec<String>,
    pub pack_at: usize,
}

impl Push {
    pub fn wants(&self, capability: &str) -> bool {
        self.capabilities.iter().any(|c| c == capability)
    }
}

/// Reads a `git-receive-pack` request body up to its pack. Shallow pushes and signed pushes
/// are refused here: the gateway offers neither.
pub fn parse_push(body: &[u8]) -> Result<Push, String> {
    let mut at = 0;
    let mut commands: Vec<Command> = Vec::new();
    let mut capabilities = Vec::new();
    loop {
        let (pkt, used) = read(&body[at..])?;
        at += used;
        let data = match pkt {
            Pkt::Flush => break,
            Pkt::Data(d) => d,
            Pkt::Delim | Pkt::ResponseEnd => {
                return Err("a push's command list holds a protocol v2 marker".into());
            }
        };
        let data = data.strip_suffix(b"\n").unwrap_or(data);
        let (text, caps) = split_capabilities(data);
        let text = std::str::from_utf8(text).map_err(|_| "a push command is not UTF-8")?;
        if text.starts_with("shallow ") {
            return Err("shallow pushes are not accepted: push from a full clone".into());
        }
        if text.starts_with("push-cert") {
            return Err("signed pushes are not accepted".into());
        }
        if let Some(caps) = caps {
            if !commands.is_empty() {
                return Err("capabilities come only with the first command".into());
            }
            let caps = std::str::from_utf8(caps).map_err(|_| "capabilities are not UTF-8")?;
            capabilities = caps
                .split(' ')
                .filter(|c| !c.is_empty())
                .map(str::to_owned)
                .collect();
        }
        let mut parts = text.splitn(3, ' ');
        let (Some(old), Some(new), Some(refname)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(format!(
                "a push command is not `<old> <new> <ref>`: {text:?}"
            ));
        };
        if !is_oid(old) || !is_oid(new) || old.len() != new.len() {
            return Err(format!(
                "a push command's object ids are malformed: {text:?}"
            ));
        }
        if refname.is_empty() || refname.bytes().any(|b| b.is_ascii_control() || b == b' ') {
            return Err("a push command names no proper ref".into());
        }
        commands.push(Command {
            old: old.to_owned(),
            new: new.to_owned(),
            refname: refname.to_owned(),
        });
        if commands.len() > 1000 {
            return Err("a push of more than 1000 ref updates".into());
        }
    }
    if commands.is_empty() {
        return Err("a push with no ref update".into());
    }
    Ok(Push {
        commands,
        capabilities,
        pack_at: at,
    })
}

/// Capabilities the gateway does not offer a run: each would let a push do more than
/// update its one branch, or carry what the gateway does not check.
const WITHHELD: &[&str] = &["atomic", "push-options", "push-cert"];

/// The forge's receive-pack advertisement as a run sees it: only the refs in `keep` (the
/// base branch and the run's own), so the run's git builds its pack against those alone,
/// and without the withheld capabilities. The capabilities ride on the first ref kept, or on
/// git's `capabilities^{}` line when none is.
pub fn restrict_advertisement(body: &[u8], keep: &[String]) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(body.len());
    let mut at = 0;
    // Over HTTP, v0 starts with `# service=…` and a flush.
    if let Ok((Pkt::Data(data), used)) = read(body)
        && data.starts_with(b"# service=")
    {
        if read(&body[used..])?.0 != Pkt::Flush {
            return Err("no flush after the service line".into());
        }
        out.extend_from_slice(&body[..used + 4]);
        at = used + 4;
    }
    let mut refs: Vec<(String, String)> = Vec::new();
    let mut caps: Option<String> = None;
    while at < body.len() {
        let (pkt, used) = read(&body[at..])?;
        at += used;
        let data = match pkt {
            Pkt::Data(data) => data,
            Pkt::Flush => break,
            Pkt::Delim | Pkt::ResponseEnd => {
                return Err("a protocol v2 marker in a receive-pack advertisement".into());
            }
        };
        let (text, these) = split_capabilities(data.strip_suffix(b"\n").unwrap_or(data));
        if let Some(these) = these {
            caps = Some(String::from_utf8_lossy(these).into_owned());
        }
        let text = String::from_utf8_lossy(text);
        if let Some((oid, name)) = text.split_once(' ')
            && keep.iter().any(|k| k == name)
        {
            refs.push((oid.to_owned(), name.to_owned()));
        }
    }
    let caps = caps.unwrap_or_default();
    let kept: Vec<&str> = caps
        .split(' ')
        .filter(|c| {
            let name = c.split('=').next().unwrap_or_default();
            !c.is_empty() && !WITHHELD.contains(&name)
        })
        .collect();
    let kept = kept.join(" ");
    if refs.is_empty() {
        let zero = if kept.contains("object-format=sha256") {
            64
        } else {
            40
        };
        let text = format!("{} capabilities^{{}}\0{kept}\n", "0".repeat(zero));
        out.extend_from_slice(&line(text.as_bytes()));
    }
    for (i, (oid, name)) in refs.iter().enumerate() {
        let text = if i == 0 {
            format!("{oid} {name}\0{kept}\n")
        } else {
            format!("{oid} {name}\n")
        };
        out.extend_from_slice(&line(text.as_bytes()));
    }
    out.extend_from_slice(FLUSH);
    Ok(out)
}

/// The answer to a push refused before it reached the forge: `unpack ok`, then `ng` with
/// its reason for every ref, in side-band 1 when the client asked for it. git prints each
/// as `! [remote rejected] <ref> (<reason>)` and exits non-zero.
pub fn refusal_report(push: &Push, reasons: &[String]) -> Vec<u8> {
    let mut report = line(b"unpack ok\n");
    for (c, why) in push.commands.iter().zip(reasons) {
        let why: String = why
            .chars()
            .filter(|ch| !ch.is_control())
            .take(300)
            .collect();
        report.extend_from_slice(&line(format!("ng {} {why}\n", c.refname).as_bytes()));
    }
    report.extend_from_slice(FLUSH);
    if !push.wants("side-band-64k") && !push.wants("side-band") {
        return report;
    }
    let max = if push.wants("side-band-64k") {
        MAX_PKT
    } else {
        1000
    } - 5;
    let mut out = Vec::new();
    for chunk in report.chunks(max) {
        let mut data = vec![1u8];
        data.extend_from_slice(chunk);
        out.extend_from_slice(&line(&data));
    }
    out.extend_from_slice(FLUSH);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "1111111111111111111111111111111111111111";
    const B: &str = "2222222222222222222222222222222222222222";
    const Z: &str = "0000000000000000000000000000000000000000";

    fn request(lines: &[&str], pack: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        for (i, l) in lines.iter().enumerate() {
            let data = if i == 0 {
                format!("{l}\0report-status side-band-64k agent=git/2.47\n")
            } else {
                format!("{l}\n")
            };
            out.extend(line(data.as_bytes()));
        }
        out.extend_from_slice(FLUSH);
        out.extend_from_slice(pack);
        out
    }

    #[test]
    fn a_push_is_read_up_to_its_pack() {
        let body = request(
            &[
                &format!("{Z} {A} refs/heads/run"),
                &format!("{A} {Z} refs/tags/v1"),
            ],
            b"PACK....",
        );
        let push = parse_push(&body).expect("parses");
        assert_eq!(push.commands.len(), 2);
        assert!(push.commands[0].creates());
        assert!(push.commands[1].deletes());
        assert_eq!(push.commands[1].refname, "refs/tags/v1");
        assert!(push.wants("side-band-64k"));
        assert_eq!(&body[push.pack_at..], b"PACK....");
    }

    #[test]
    fn malformed_requests_are_refused_with_a_reason() {
        for (body, why) in [
            (b"00zz".to_vec(), "not hex"),
            (b"0003".to_vec(), "carries nothing"),
            (b"00ffabc".to_vec(), "ends inside"),
            (b"0000".to_vec(), "no ref update"),
            (request(&["garbage"], b""), "not `<old> <new> <ref>`"),
            (
                request(&[&format!("{A} {B}x refs/heads/x")], b""),
                "malformed",
            ),
            (request(&[&format!("shallow {A}")], b""), "shallow"),
            (request(&["push-cert\0"], b""), "signed"),
            (b"fff1".to_vec(), "over git's"),
        ] {
            let err = parse_push(&body).expect_err("refused");
            assert!(err.contains(why), "{err} should say {why}");
        }
    }

    fn advertisement(refs: &[(&str, &str)]) -> Vec<u8> {
        let mut adv = line(b"# service=git-receive-pack\n");
        adv.extend_from_slice(FLUSH);
        for (i, (oid, name)) in refs.iter().enumerate() {
            let text = if i == 0 {
                format!(
                    "{oid} {name}\0report-status report-status-v2 delete-refs side-band-64k quiet atomic ofs-delta push-options push-cert=123-abc object-format=sha1 agent=git/2.47\n"
                )
            } else {
                format!("{oid} {name}\n")
            };
            adv.extend(line(text.as_bytes()));
        }
        adv.extend_from_slice(FLUSH);
        adv
    }

    fn lines(out: &[u8]) -> Vec<String> {
        let mut at = 0;
        let mut all = Vec::new();
        while at < out.len() {
            let (pkt, used) = read(&out[at..]).expect("reads");
            all.push(match pkt {
                Pkt::Data(d) => String::from_utf8_lossy(d).replace('\0', "|"),
                _ => "0000".to_owned(),
            });
            at += used;
        }
        all
    }

    #[test]
    fn the_advertisement_shows_the_base_and_the_runs_branch_only_without_withheld_capabilities() {
        let adv = advertisement(&[
            (A, "refs/heads/main"),
            (B, "refs/heads/other"),
            (A, "refs/heads/run"),
        ]);
        let keep = ["refs/heads/main".to_owned(), "refs/heads/run".to_owned()];
        let out = lines(&restrict_advertisement(&adv, &keep).expect("restricted"));
        assert_eq!(out[0], "# service=git-receive-pack\n");
        assert_eq!(out[1], "0000");
        assert_eq!(
            out[2],
            format!(
                "{A} refs/heads/main|report-status report-status-v2 delete-refs side-band-64k quiet ofs-delta object-format=sha1 agent=git/2.47\n"
            )
        );
        assert_eq!(out[3], format!("{A} refs/heads/run\n"));
        assert_eq!(out[4], "0000");
        assert_eq!(out.len(), 5, "{out:?}");
        // The first ref, carrying the capabilities, is not kept: they move.
        let out = lines(&restrict_advertisement(&adv, &["refs/heads/run".to_owned()]).expect("ok"));
        assert!(
            out[2].starts_with(&format!("{A} refs/heads/run|report-status")),
            "{out:?}"
        );
        // Nothing kept: git's line for an empty repository.
        let out = lines(&restrict_advertisement(&adv, &[]).expect("ok"));
        assert!(
            out[2].starts_with(&format!("{Z} capabilities^{{}}|report-status")),
            "{out:?}"
        );
    }

    #[test]
    fn a_refusal_reports_every_ref_in_side_band_one() {
        let body = request(&[&format!("{Z} {A} refs/tags/v1")], b"");
        let push = parse_push(&body).expect("parses");
        let out = refusal_report(&push, &["tags are not pushed\nby runs".into()]);
        let (pkt, used) = read(&out).expect("reads");
        let Pkt::Data(data) = pkt else { panic!("data") };
        assert_eq!(data[0], 1, "band 1");
        let inner = &data[1..];
        let text = String::from_utf8_lossy(inner);
        assert!(text.contains("unpack ok"));
        assert!(
            text.contains("ng refs/tags/v1 tags are not pushedby runs"),
            "{text}"
        );
        assert_eq!(&out[used..], FLUSH);
    }
}
