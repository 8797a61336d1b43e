//! The director's own image, built here as `tests/image/build-local.sh` builds it (no
//! registry to pull a base from): it starts, answers `/healthz` and `/readyz`, runs as the
//! non-root user 65532 on a read-only root filesystem, and has no shell.

use std::process::Command;
use std::time::Duration;

use crate::helpers::wait_until;

fn docker(args: &[&str]) -> (bool, String) {
    let out = Command::new("docker")
        .args(args)
        .output()
        .expect("docker runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
            + &String::from_utf8_lossy(&out.stderr),
    )
}

/// A container and the image it runs, both removed when the test ends.
struct Container(String, String);

impl Drop for Container {
    fn drop(&mut self) {
        let _ = docker(&["rm", "-f", "-v", &self.0]);
        let _ = docker(&["rmi", &self.1]);
    }
}

#[tokio::test]
async fn the_image_serves_health_as_a_non_root_user_on_a_read_only_root_without_a_shell() {
    let tag = format!("director-test-image:{}", std::process::id());
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/image/build-local.sh");
    let built = Command::new(script)
        .args([env!("CARGO_BIN_EXE_director"), &tag])
        .output()
        .expect("the build script runs");
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let (ok, user) = docker(&["image", "inspect", "-f", "{{.Config.User}}", &tag]);
    assert!(ok, "{user}");
    assert_eq!(user, "65532:65532");

    let (ok, id) = docker(&[
        "run",
        "-d",
        "--read-only",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges:true",
        "--tmpfs",
        "/data:uid=65532,gid=65532",
        "-e",
        "DIRECTOR_SERVER__LISTEN=0.0.0.0:8080",
        "-e",
        "DIRECTOR_STORE__URL=sqlite:///data/director.db",
        &tag,
        "serve",
    ]);
    assert!(ok, "{id}");
    let container = Container(id.lines().next().unwrap_or_default().to_owned(), tag);
    let (_, ip) = docker(&[
        "inspect",
        "-f",
        "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
        &container.0,
    ]);
    let client = crate::helpers::http_client();
    let health = format!("http://{ip}:8080/healthz");
    wait_until("the director in its image answers /healthz", || async {
        client
            .get(&health)
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
    })
    .await;
    let ready = client
        .get(format!("http://{ip}:8080/readyz"))
        .send()
        .await
        .expect("readyz");
    assert!(ready.status().is_success());

    // The process itself, seen from the host: uid and gid 65532.
    let (_, pid) = docker(&["inspect", "-f", "{{.State.Pid}}", &container.0]);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("its status");
    let ids = |field: &str| {
        status
            .lines()
            .find(|l| l.starts_with(field))
            .map(|l| {
                l.split_whitespace()
                    .skip(1)
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
    };
    assert!(
        ids("Uid:").iter().all(|u| u == "65532"),
        "{:?}",
        ids("Uid:")
    );
    assert!(
        ids("Gid:").iter().all(|g| g == "65532"),
        "{:?}",
        ids("Gid:")
    );
    // Nothing to get a shell with.
    let (shell, _) = docker(&["exec", &container.0, "/bin/sh", "-c", "true"]);
    assert!(!shell, "the image has a shell");
    // git, which the gateway checks pushes with, and its HTTP helper with every library it
    // links: a fetch gets as far as the network.
    let (ok, version) = docker(&["exec", &container.0, "git", "--version"]);
    assert!(ok, "git in the image: {version}");
    let (_, fetch) = docker(&[
        "exec",
        &container.0,
        "git",
        "ls-remote",
        "http://127.0.0.1:9/none.git",
    ]);
    assert!(
        fetch.contains("Failed to connect") || fetch.contains("Couldn't connect"),
        "git's HTTP helper runs in the image: {fetch}"
    );
}
