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
        let (text, caps) = match data.iter().position(|b| *b == 0) {
            Some(nul) => (&data[..nul], Some(&data[nul + 1..])),
            None => (data, None),
        };
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

/// The forge's receive-pack advertisement with the withheld capabilities taken out of its
/// first ref line.
pub fn restrict_advertisement(body: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(body.len());
    let mut at = 0;
    let mut first_ref = true;
    while at < body.len() {
        let (pkt, used) = read(&body[at..])?;
        match pkt {
            Pkt::Data(data) if first_ref && !data.starts_with(b"# service=") => {
                first_ref = false;
                match data.iter().position(|b| *b == 0) {
                    Some(nul) => {
                        let caps = String::from_utf8_lossy(&data[nul + 1..]);
                        let caps = caps.trim_end_matches('\n');
                        let kept: Vec<&str> = caps
                            .split(' ')
                            .filter(|c| {
                                let name = c.split('=').next().unwrap_or_default();
                                !c.is_empty() && !WITHHELD.contains(&name)
                            })
                            .collect();
                        let mut line_data = data[..=nul].to_vec();
                        line_data.extend_from_slice(kept.join(" ").as_bytes());
                        line_data.push(b'\n');
                        out.extend_from_slice(&line(&line_data));
                    }
                    None => out.extend_from_slice(&body[at..at + used]),
                }
            }
            _ => out.extend_from_slice(&body[at..at + used]),
        }
        at += used;
    }
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

    #[test]
    fn the_advertisement_loses_what_the_gateway_does_not_offer() {
        let mut adv = line(b"# service=git-receive-pack\n");
        adv.extend_from_slice(FLUSH);
        adv.extend(line(
            format!("{A} refs/heads/main\0report-status report-status-v2 delete-refs side-band-64k quiet atomic ofs-delta push-options push-cert=123-abc object-format=sha1 agent=git/2.47\n").as_bytes(),
        ));
        adv.extend(line(format!("{B} refs/heads/other\n").as_bytes()));
        adv.extend_from_slice(FLUSH);
        let out = restrict_advertisement(&adv).expect("restricted");
        let text = String::from_utf8_lossy(&out);
        assert!(
            !text.contains("atomic")
                && !text.contains("push-options")
                && !text.contains("push-cert"),
            "{text}"
        );
        assert!(
            text.contains("report-status side-band-64k")
                || text.contains("delete-refs side-band-64k quiet ofs-delta"),
            "{text}"
        );
        assert!(text.contains("refs/heads/other"));
        // Every pkt-line still reads.
        let mut at = 0;
        while at < out.len() {
            at += read(&out[at..]).expect("reads").1;
        }
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
