//! The real binary, killed with SIGKILL right after a 202, restarted: the delivery is processed.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use director::store::Store;

use crate::helpers::{Issue, SECRET, http_client, issue_payload, wait_until};

fn start(db: &str, port: u16) -> Child {
    Command::new(env!("CARGO_BIN_EXE_director"))
        .args(["serve"])
        .env("DIRECTOR_SERVER__LISTEN", format!("127.0.0.1:{port}"))
        .env("DIRECTOR_STORE__URL", format!("sqlite://{db}"))
        .env("DIRECTOR_WEBHOOK__SECRETS", SECRET)
        .env("DIRECTOR_SCAN__ENABLED", "false")
        .env("DIRECTOR_SCAN__REPOS", "acme/widgets")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("director starts")
}

async fn wait_healthy(client: &reqwest::Client, port: u16) {
    wait_until("director answers /healthz", || async {
        client
            .get(format!("http://127.0.0.1:{port}/healthz"))
            .timeout(Duration::from_millis(500))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
    })
    .await;
}

#[tokio::test]
async fn a_delivery_accepted_before_sigkill_is_processed_after_restart() {
    let dir = tempfile::tempdir().expect("dir");
    let db = dir.path().join("director.db").display().to_string();
    let client = http_client();
    let port = crate::helpers::free_port();
    let mut child = start(&db, port);
    wait_healthy(&client, port).await;

    // Many deliveries, then SIGKILL the moment the last 202 arrives: whatever was accepted
    // must survive, whether or not the consumer got to it.
    let mut accepted = 0;
    for n in 1..=20u64 {
        let body = issue_payload(
            "label_updated",
            "alice",
            &Issue {
                number: n,
                labels: &["headless"],
                ..Issue::default()
            },
        );
        let sig = director::forge::signature::sign(SECRET, body.as_bytes());
        let res = client
            .post(format!("http://127.0.0.1:{port}/webhooks/forgejo"))
            .header("X-Forgejo-Event-Type", "issue_label")
            .header("X-Forgejo-Delivery", format!("kill-{n}"))
            .header("X-Forgejo-Signature", sig)
            .body(body)
            .send()
            .await
            .expect("sent");
        assert_eq!(res.status(), 202);
        accepted += 1;
    }
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");

    let port = crate::helpers::free_port();
    let mut child = start(&db, port);
    wait_healthy(&client, port).await;
    let store = Store::connect(&director::settings::StoreSettings {
        url: format!("sqlite://{db}"),
        ..Default::default()
    })
    .await
    .expect("open db");
    wait_until("every accepted delivery processed", || async {
        store.delivery_counts().await.expect("count") == (accepted, 0)
    })
    .await;
    assert_eq!(store.list_issues().await.expect("issues").len(), 20);
    child.kill().expect("stop");
    child.wait().expect("reaped");
}
