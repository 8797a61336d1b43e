//! Unauthenticated webhook bodies against the real binary: how much memory and time anyone
//! who can reach the listener can take, and that a signed delivery still gets through.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::helpers::{Issue, SECRET, http_client, issue_payload, wait_until};
use director::forge::signature::sign;

const MIB: usize = 1024 * 1024;

fn start(db: &str, port: u16) -> Child {
    Command::new(env!("CARGO_BIN_EXE_director"))
        .args(["serve"])
        .env("DIRECTOR_SERVER__LISTEN", format!("127.0.0.1:{port}"))
        .env("DIRECTOR_SERVER__BODY_TIMEOUT_SECS", "2")
        .env("DIRECTOR_SERVER__BODY_MEMORY_MB", "8")
        .env("DIRECTOR_STORE__URL", format!("sqlite://{db}"))
        .env("DIRECTOR_WEBHOOK__SECRETS", SECRET)
        .env("DIRECTOR_SCAN__ENABLED", "false")
        .env("DIRECTOR_SCAN__REPOS", "acme/widgets")
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("director starts")
}

/// A field of /proc/PID/status, in KiB.
fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .expect("status")
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("the field")
}

/// Opens a webhook request declaring `declared` bytes and sends `sent` of them, then stalls.
async fn slow_body(port: u16, declared: usize, sent: usize) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let head = format!(
        "POST /webhooks/forgejo HTTP/1.1\r\nHost: d\r\nContent-Type: application/json\r\nX-Forgejo-Event-Type: issues\r\nX-Forgejo-Signature: 00\r\nContent-Length: {declared}\r\n\r\n"
    );
    s.write_all(head.as_bytes()).await.expect("head");
    let chunk = vec![b' '; 64 * 1024];
    let mut left = sent;
    while left > 0 {
        let n = left.min(chunk.len());
        if s.write_all(&chunk[..n]).await.is_err() {
            break;
        }
        left -= n;
    }
    s
}

/// The status code the director answered on `s`, if any.
async fn status_of(mut s: TcpStream) -> Option<u16> {
    let mut buf = vec![0; 512];
    let n = tokio::time::timeout(Duration::from_secs(15), s.read(&mut buf))
        .await
        .ok()?
        .ok()?;
    String::from_utf8_lossy(&buf[..n])
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

#[tokio::test]
async fn fifty_slow_bodies_take_bounded_memory_and_a_signed_delivery_still_lands() {
    let dir = tempfile::tempdir().expect("dir");
    let db = dir.path().join("director.db").display().to_string();
    let port = crate::helpers::free_port();
    let mut child = start(&db, port);
    let client = http_client();
    wait_until("director answers /healthz", || async {
        client
            .get(format!("http://127.0.0.1:{port}/healthz"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
    })
    .await;
    let pid = child.id();
    let before = status_kib(pid, "VmRSS:");

    // Fifty bodies of 5 MiB: refused on their declared length, never read.
    let mut big = Vec::new();
    for _ in 0..50 {
        big.push(slow_body(port, 5 * MIB, 64 * 1024).await);
    }
    for s in big {
        assert_eq!(status_of(s).await, Some(413));
    }
    // Fifty bodies just under the limit, all but their last byte sent, then stalled.
    let mut slow = Vec::new();
    for _ in 0..50 {
        slow.push(slow_body(port, MIB, MIB - 1).await);
    }
    // The forge's own delivery meanwhile (it shows the hook's token): read at once, never
    // refused for load it did not cause. The same without the token waits among the rest.
    let body = issue_payload("opened", "alice", &Issue::default());
    let signed = client
        .post(format!("http://127.0.0.1:{port}/webhooks/forgejo"))
        // As `director hooks install` sets it with no `webhook.authorization`: derived from
        // the webhook secret.
        .header(
            "Authorization",
            format!("Bearer {}", director::forge::signature::hook_token(SECRET)),
        )
        .header("Content-Type", "application/json")
        .header("X-Forgejo-Event-Type", "issues")
        .header("X-Forgejo-Delivery", "d-signed")
        .header("X-Forgejo-Signature", sign(SECRET, body.as_bytes()))
        .body(body)
        .timeout(Duration::from_secs(15))
        .send()
        .await
        .expect("answered");
    assert_eq!(signed.status(), 202);
    let mut answers = Vec::new();
    for s in slow {
        answers.push(status_of(s).await);
    }
    let peak = status_kib(pid, "VmHWM:");
    let _ = child.kill();
    let _ = child.wait();
    // Each is answered: cut at its deadline (408), or never given room (503).
    assert!(
        answers.iter().all(|a| matches!(a, Some(408 | 503))),
        "{answers:?}"
    );
    assert!(
        answers.iter().filter(|a| **a == Some(408)).count() >= 16,
        "those given room were read until their deadline: {answers:?}"
    );
    // The budget is 8 MiB of bodies (measured: the director grows by about 26 MiB, the rest
    // being the allocator's and the HTTP server's buffers); without it, fifty bodies took
    // 50 MiB and more.
    let grew_mib = peak.saturating_sub(before) / 1024;
    assert!(
        grew_mib < 40,
        "the director grew by {grew_mib} MiB under fifty slow bodies"
    );
}
