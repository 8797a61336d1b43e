//! `director check-config`: the effective configuration, secrets masked; bad keys named.

use std::process::Command;

fn director() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_director"));
    cmd.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default());
    cmd
}

fn example() -> String {
    format!(
        "{}/config/director.example.toml",
        env!("CARGO_MANIFEST_DIR")
    )
}

#[test]
fn the_example_configuration_is_valid() {
    let out = director()
        .args(["check-config", "--config", &example()])
        .output()
        .expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("trigger = \"headless\""), "{text}");
    assert!(
        !text.contains("change-me-to-a-long-random-string"),
        "the webhook secret leaked: {text}"
    );
}

#[test]
fn environment_overrides_the_file_and_secrets_stay_masked() {
    let dir = tempfile::tempdir().expect("dir");
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "tok-from-file-0123\n").expect("write");
    let out = director()
        .args(["check-config", "--config", &example()])
        .env("DIRECTOR_SCAN__REPOS", "a/b, c/d")
        .env("DIRECTOR_WEBHOOK__SECRETS", "one-secret,two-secret")
        .env(
            "DIRECTOR_FORGE__TOKEN_FILE",
            token_file.to_str().expect("utf-8"),
        )
        .env("DIRECTOR_FORGE__RUNNER_PASSWORD", "123456")
        .env("DIRECTOR_LABELS__TRIGGER", "agent")
        .output()
        .expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("\"a/b\""), "{text}");
    assert!(text.contains("\"c/d\""), "{text}");
    assert!(text.contains("trigger = \"agent\""), "{text}");
    assert!(
        text.contains("secrets = [\n    \"***\",\n    \"***\",\n]")
            || text.matches("\"***\"").count() >= 4,
        "{text}"
    );
    for secret in ["one-secret", "two-secret", "tok-from-file", "123456"] {
        assert!(!text.contains(secret), "{secret} leaked: {text}");
    }
}

#[test]
fn a_bad_configuration_exits_non_zero_and_names_the_key() {
    let cases = [
        ("DIRECTOR_SERVER__LISTEN", "not-an-address", "server.listen"),
        (
            "DIRECTOR_SCAN__SCHEDULE",
            "every five minutes",
            "scan.schedule",
        ),
        ("DIRECTOR_SCAN__REPOS", "not a repo", "scan.repos"),
        (
            "DIRECTOR_SERVER__MAX_BODY_BYTES",
            "lots",
            "server.max_body_bytes",
        ),
        ("DIRECTOR_FORGE__URL", "ftp://x", "forge.url"),
        ("DIRECTOR_SCAN__REPOZ", "a/b", "scan.repoz"),
        (
            "DIRECTOR_FORGE__URL",
            "https://forgejo.example.org",
            "forge.token",
        ),
    ];
    for (var, value, key) in cases {
        let out = director()
            .args(["check-config", "--config", &example()])
            .env(var, value)
            .output()
            .expect("runs");
        assert!(!out.status.success(), "{var}={value} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(key),
            "{var}={value}: message does not name {key}: {err}"
        );
    }
}

#[test]
fn a_missing_config_file_is_an_error() {
    let out = director()
        .args(["check-config", "--config", "/nonexistent/director.toml"])
        .output()
        .expect("runs");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/director.toml"));
}
