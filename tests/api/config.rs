//! `director check-config`: the effective configuration, secrets masked; bad keys named.

use std::process::Command;

fn director() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_director"));
    cmd.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default());
    cmd
}

/// `check-config` on the example configuration with `vars` set: refused (status 2) with a
/// message naming `key`, which is returned.
fn refused_naming(vars: &[(&str, &str)], key: &str) -> String {
    let mut cmd = director();
    cmd.args(["check-config", "--config", &example()]);
    for (k, v) in vars {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("runs");
    assert_eq!(out.status.code(), Some(2), "{vars:?} was accepted");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(err.contains(key), "{vars:?}: does not name {key}: {err}");
    err
}

fn example() -> String {
    format!(
        "{}/config/director.example.toml",
        env!("CARGO_MANIFEST_DIR")
    )
}

/// `check-config` of the example configuration, which must pass: what it prints.
fn checked_example() -> String {
    let out = director()
        .args(["check-config", "--config", &example()])
        .output()
        .expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_example_configuration_is_valid() {
    let text = checked_example();
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
            "DIRECTOR_RUNNER__MAX_OPEN_PRS_PER_REPO",
            "0",
            "runner.max_open_prs_per_repo",
        ),
        (
            "DIRECTOR_RUNNER__MAX_FOLLOWUPS",
            "three",
            "runner.max_followups",
        ),
        (
            "DIRECTOR_FORGE__URL",
            "https://forgejo.example.org",
            "forge.token",
        ),
        (
            "DIRECTOR_TELEMETRY__OTLP_ENDPOINT",
            "grpc://collector:4317",
            "telemetry.otlp_endpoint",
        ),
        (
            "DIRECTOR_TELEMETRY__MAX_QUEUED_SPANS",
            "0",
            "telemetry.max_queued_spans",
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
fn a_collector_url_with_credentials_is_refused_without_showing_them() {
    let err = refused_naming(
        &[(
            "DIRECTOR_TELEMETRY__OTLP_ENDPOINT",
            "https://tracer:hunter2-otlp@collector.example.org",
        )],
        "telemetry.otlp_endpoint",
    );
    assert!(!err.contains("hunter2-otlp"), "{err}");
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

#[test]
fn configurations_that_would_open_the_box_are_refused_naming_the_key() {
    let cases: &[(&[(&str, &str)], &str)] = &[
        (&[("DIRECTOR_RUNNER__USER", "0")], "runner.user"),
        (&[("DIRECTOR_RUNNER__USER", "0:0")], "runner.user"),
        (&[("DIRECTOR_RUNNER__USER", "root")], "runner.user"),
        (&[("DIRECTOR_RUNNER__USER", "root:0")], "runner.user"),
        (&[("DIRECTOR_RUNNER__USER", "000:1000")], "runner.user"),
        (&[("DIRECTOR_RUNNER__USER", "ROOT")], "runner.user"),
        (
            &[(
                "DIRECTOR_RUNNER__MOUNTS",
                "/var/run/docker.sock:/var/run/docker.sock",
            )],
            "runner.mounts",
        ),
        (
            &[("DIRECTOR_RUNNER__MOUNTS", "/var/run:/host-run:ro")],
            "runner.mounts",
        ),
        (
            &[("DIRECTOR_RUNNER__MOUNTS", "/:/host:ro")],
            "runner.mounts",
        ),
        (
            &[("DIRECTOR_RUNNER__MOUNTS", "/srv/cache:/run/docker.sock")],
            "runner.mounts",
        ),
        (
            &[("DIRECTOR_RUNNER__ENV_PASSTHROUGH", "DIRECTOR_FORGE__TOKEN")],
            "runner.env_passthrough",
        ),
        (
            // Another name for the bot's token is still the bot's token.
            &[
                ("DIRECTOR_FORGE__TOKEN", "bot-token-abc123"),
                ("FORGEJO_TOKEN", "bot-token-abc123"),
                (
                    "DIRECTOR_RUNNER__ENV_PASSTHROUGH",
                    "AGENT_KEY,FORGEJO_TOKEN",
                ),
            ],
            "runner.env_passthrough",
        ),
        (
            // git's credential configuration is the director's: a passthrough could point git
            // at a helper that stores or sends the run token elsewhere.
            &[(
                "DIRECTOR_RUNNER__ENV_PASSTHROUGH",
                "AGENT_KEY,GIT_CONFIG_COUNT",
            )],
            "runner.env_passthrough",
        ),
        (
            &[("DIRECTOR_RUNNER__ENV_PASSTHROUGH", "git_askpass")],
            "runner.env_passthrough",
        ),
        (
            &[("DIRECTOR_RUNNER__GIT_AUTHOR_NAME", "Bot <evil@example.org>")],
            "runner.git_author_name",
        ),
    ];
    for (vars, key) in cases {
        refused_naming(vars, key);
    }
    // Not root, not the socket: fine.
    let out = director()
        .args(["check-config", "--config", &example()])
        .env("DIRECTOR_RUNNER__USER", "1000:1000")
        .env("DIRECTOR_RUNNER__MOUNTS", "/srv/cache:/cache:ro")
        .env("DIRECTOR_RUNNER__ENV_PASSTHROUGH", "AGENT_KEY")
        .env("AGENT_KEY", "sk-agent")
        .output()
        .expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn numeric_looking_secrets_from_the_environment_are_kept_exactly() {
    let settings = director::settings::Settings::load_from(
        None,
        [
            ("DIRECTOR_FORGE__TOKEN".to_owned(), "00123".to_owned()),
            (
                "DIRECTOR_FORGE__RUNNER_PASSWORD".to_owned(),
                "1e5".to_owned(),
            ),
            ("DIRECTOR_PREFLIGHT__API_KEY".to_owned(), "0x10".to_owned()),
            (
                "DIRECTOR_WEBHOOK__SECRETS".to_owned(),
                "007,0.50".to_owned(),
            ),
        ],
    )
    .expect("loads");
    assert_eq!(settings.forge.token.expose(), "00123");
    assert_eq!(settings.forge.runner_password.expose(), "1e5");
    assert_eq!(settings.preflight.api_key.expose(), "0x10");
    let secrets: Vec<&str> = settings
        .webhook
        .secrets
        .iter()
        .map(|s| s.expose())
        .collect();
    assert_eq!(secrets, vec!["007", "0.50"]);
}

#[test]
fn a_postgres_store_url_is_accepted_and_its_password_never_shown() {
    let out = director()
        .args(["check-config", "--config", &example()])
        .env(
            "DIRECTOR_STORE__URL",
            "postgres://director:pg-pass-5e1@db.example:5432/director",
        )
        .output()
        .expect("runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("postgres://director:***@db.example:5432/director"),
        "{text}"
    );
    assert!(!text.contains("pg-pass-5e1"), "{text}");
    for bad in [
        "mysql://director:pg-pass-5e1@db/x",
        "postgres://director:pg-pass-5e1@/x",
    ] {
        let out = director()
            .args(["check-config", "--config", &example()])
            .env("DIRECTOR_STORE__URL", bad)
            .output()
            .expect("runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{bad} accepted");
        assert!(err.contains("store.url"), "{bad}: {err}");
        assert!(!err.contains("pg-pass-5e1"), "{bad}: {err}");
    }
}

#[test]
fn egress_is_allow_listed_by_default_and_a_bad_entry_or_a_contradiction_is_refused_by_name() {
    let printed = checked_example();
    assert!(printed.contains("egress = \"allowlist\""), "{printed}");
    for (vars, names) in [
        (
            vec![(
                "DIRECTOR_RUNNER__EGRESS_ALLOW",
                "api.example.org:443,example.org",
            )],
            "example.org",
        ),
        (
            vec![("DIRECTOR_RUNNER__EGRESS_ALLOW", "*.org:443")],
            "*.org:443",
        ),
        (
            vec![("DIRECTOR_RUNNER__EGRESS_ALLOW", "2001:db8::1:443")],
            "2001:db8::1:443",
        ),
        (vec![("DIRECTOR_RUNNER__EGRESS", "closed")], "runner.egress"),
        (vec![("DIRECTOR_RUNNER__NETWORK", "host")], "runner.network"),
        (
            vec![("DIRECTOR_RUNNER__EGRESS_PROXY_PORT", "0")],
            "runner.egress_proxy_port",
        ),
        (
            vec![("DIRECTOR_RUNNER__KIND", "kubernetes")],
            "kubernetes.proxy_host",
        ),
    ] {
        let err = refused_naming(&vars, names);
        if names.contains(':') || names == "example.org" {
            assert!(err.contains("runner.egress_allow"), "{err}");
        }
    }
    // Open egress keeps the network of one's choosing.
    let out = director()
        .args(["check-config", "--config", &example()])
        .env("DIRECTOR_RUNNER__EGRESS", "open")
        .env("DIRECTOR_RUNNER__NETWORK", "host")
        .env(
            "DIRECTOR_RUNNER__EGRESS_ALLOW",
            "*.example.org:443,10.0.0.5:22",
        )
        .output()
        .expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every key the settings accept, as `section.key`: the default settings' own fields.
fn settings_keys() -> std::collections::BTreeSet<String> {
    let value = serde_json::to_value(director::settings::Settings::default()).expect("serialises");
    let mut keys = std::collections::BTreeSet::new();
    for (section, fields) in value.as_object().expect("sections") {
        for key in fields.as_object().expect("a section's keys").keys() {
            keys.insert(format!("{section}.{key}"));
        }
    }
    keys
}

/// The keys `docs/configuration.md`'s tables name in their first column. A row may name
/// several: `preflight.base_url`, `model`, `api_key` / `_file` is four keys of `preflight`.
fn documented_keys(markdown: &str) -> std::collections::BTreeSet<String> {
    let mut keys = std::collections::BTreeSet::new();
    for line in markdown.lines().filter(|l| l.starts_with("| `")) {
        let cell = line.split('|').nth(1).unwrap_or_default();
        let (mut section, mut last) = (String::new(), String::new());
        for name in cell.split('`').skip(1).step_by(2) {
            let key = if let Some(suffix) = name.strip_prefix('_') {
                format!("{last}_{suffix}")
            } else if let Some((s, _)) = name.split_once('.') {
                section = s.to_owned();
                name.to_owned()
            } else {
                format!("{section}.{name}")
            };
            keys.insert(key.clone());
            last = key;
        }
    }
    keys
}

/// The keys `config/director.example.toml` sets or shows commented out, as `section.key`.
fn example_keys(toml: &str) -> std::collections::BTreeSet<String> {
    let mut keys = std::collections::BTreeSet::new();
    let mut section = "";
    for line in toml.lines() {
        let line = line.trim();
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name;
            continue;
        }
        let setting = line.trim_start_matches('#').trim_start();
        let Some((key, _)) = setting.split_once(" = ") else {
            continue;
        };
        if !key.is_empty() && key.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
            keys.insert(format!("{section}.{key}"));
        }
    }
    keys
}

#[test]
fn the_configuration_reference_and_the_example_name_every_key_and_no_other() {
    let root = env!("CARGO_MANIFEST_DIR");
    let accepted = settings_keys();
    let markdown =
        std::fs::read_to_string(format!("{root}/docs/configuration.md")).expect("the reference");
    let documented = documented_keys(&markdown);
    let example = example_keys(&std::fs::read_to_string(example()).expect("the example"));
    let undocumented: Vec<_> = accepted.difference(&documented).collect();
    let unknown: Vec<_> = documented.difference(&accepted).collect();
    assert!(
        undocumented.is_empty() && unknown.is_empty(),
        "docs/configuration.md leaves out {undocumented:?} and names keys that do not exist: {unknown:?}"
    );
    let not_shown: Vec<_> = accepted.difference(&example).collect();
    let not_accepted: Vec<_> = example.difference(&accepted).collect();
    assert!(
        not_shown.is_empty() && not_accepted.is_empty(),
        "config/director.example.toml leaves out {not_shown:?} and shows keys that do not exist: {not_accepted:?}"
    );
}

#[test]
fn the_reference_reader_expands_a_row_of_several_keys() {
    let row = "| `preflight.base_url`, `model`, `api_key` / `_file` | - | the endpoint |\n\
               | `store.url` / `store.url_file` | x | y |\n";
    let keys: Vec<_> = documented_keys(row).into_iter().collect();
    assert_eq!(
        keys,
        [
            "preflight.api_key",
            "preflight.api_key_file",
            "preflight.base_url",
            "preflight.model",
            "store.url",
            "store.url_file"
        ]
    );
}

#[test]
fn a_kind_mode_or_provider_the_director_does_not_have_is_refused_by_name_with_the_choices() {
    for (var, value, key, choices) in [
        (
            "DIRECTOR_RUNNER__KIND",
            "podman",
            "runner.kind",
            ["docker", "kubernetes"].as_slice(),
        ),
        (
            "DIRECTOR_RUNNER__EGRESS",
            "closed",
            "runner.egress",
            &["allowlist", "open"],
        ),
        (
            "DIRECTOR_PREFLIGHT__PROVIDER",
            "gemini",
            "preflight.provider",
            &["anthropic", "openai", "command"],
        ),
        (
            "DIRECTOR_FORGE__KIND",
            "gitlab",
            "forge.kind",
            &["forgejo", "github"],
        ),
    ] {
        let err = refused_naming(&[(var, value)], key);
        assert!(err.contains(value), "{err}");
        for choice in choices {
            assert!(err.contains(choice), "`{choice}` missing from: {err}");
        }
    }
}

#[test]
fn models_and_budgets_are_checked_and_what_is_likely_a_mistake_is_said() {
    let provider = [
        (
            "DIRECTOR_MODELS__ANTHROPIC__BASE_URL",
            "https://api.anthropic.com",
        ),
        ("DIRECTOR_MODELS__ANTHROPIC__API_KEY", "sk-ant-real-7f3a"),
    ];
    // The provider's variables may not pass into runs while the gateway serves them.
    let mut vars = provider.to_vec();
    vars.push(("DIRECTOR_RUNNER__ENV_PASSTHROUGH", "ANTHROPIC_API_KEY"));
    vars.push(("ANTHROPIC_API_KEY", "sk-ant-real-7f3a"));
    let err = refused_naming(&vars, "runner.env_passthrough");
    assert!(!err.contains("sk-ant-real-7f3a"), "{err}");
    for (k, v, key) in [
        (
            "DIRECTOR_MODELS__ANTHROPIC__BASE_URL",
            "ftp://x",
            "models.anthropic.base_url",
        ),
        ("DIRECTOR_BUDGET__RUN_USD", "-1", "budget.run_usd"),
        (
            "DIRECTOR_MODELS__MAX_REQUEST_MB",
            "0",
            "models.max_request_mb",
        ),
        (
            "DIRECTOR_MODELS__PRICES__M__INPUT_PER_MTOK",
            "-3",
            "models.prices",
        ),
    ] {
        let mut vars = provider.to_vec();
        vars.push((k, v));
        if k.contains("PRICES") {
            vars.push(("DIRECTOR_MODELS__PRICES__M__OUTPUT_PER_MTOK", "1"));
        }
        refused_naming(&vars, key);
    }
    // A provider without a key.
    refused_naming(
        &[(
            "DIRECTOR_MODELS__OPENAI__BASE_URL",
            "https://api.openai.com/v1",
        )],
        "models.openai.api_key",
    );
    // Accepted: a budget without [models.prices] counts the current models at the
    // director's own table (config/prices.toml), so it no longer refuses every call.
    let out = director()
        .args(["check-config", "--config", &example()])
        .envs(provider)
        .env("DIRECTOR_BUDGET__RUN_USD", "2.5")
        .output()
        .expect("runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("[models.prices] is empty"), "{err}");
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        !shown.contains("sk-ant-real-7f3a"),
        "the key is masked: {shown}"
    );
    assert!(shown.contains("run_usd = 2.5"), "{shown}");
}

#[test]
fn a_branch_template_that_would_not_name_each_run_apart_is_refused_by_name() {
    for template in [
        "director-issue-{issue}",
        "agents/{run}",
        "x {run}",
        "{run}-{title}",
    ] {
        // Refused (exit 2), naming the key.
        refused_naming(
            &[("DIRECTOR_RUNNER__BRANCH_TEMPLATE", template)],
            "runner.branch_template",
        );
    }
}

#[test]
fn a_repository_settings_ceiling_knows_its_keys_and_warns_when_it_opens_nothing() {
    let err = refused_naming(
        &[(
            "DIRECTOR_REPO_SETTINGS__ALLOW",
            "runner.image,runner.command",
        )],
        "repo_settings.allow",
    );
    assert!(
        err.contains("`runner.command` is not a repository setting"),
        "{err}"
    );
    let out = director()
        .args(["check-config", "--config", &example()])
        .env("DIRECTOR_REPO_SETTINGS__ALLOW", "runner.image")
        .output()
        .expect("runs");
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "warning: repo_settings.allow names runner.image but repo_settings.images is empty"
        ),
        "{err}"
    );
}

#[test]
fn a_branch_template_whose_prefix_a_title_or_number_picks_is_refused() {
    for template in ["{slug}-{run}", "{issue}-{run}", "release{slug}-{run}"] {
        let err = refused_naming(
            &[("DIRECTOR_RUNNER__BRANCH_TEMPLATE", template)],
            "runner.branch_template",
        );
        assert!(err.contains("fixed prefix"), "{template}: {err}");
    }
}

#[test]
fn protected_paths_without_the_ci_definitions_are_refused_unless_said_so() {
    // An operator who meant to add a path replaces the defaults.
    let err = refused_naming(
        &[("DIRECTOR_RUNNER__PROTECTED_PATHS", "Makefile")],
        "runner.protected_paths",
    );
    assert!(
        err.contains(".forgejo/**") && err.contains(".director.toml"),
        "{err}"
    );
    assert!(err.contains("runner.protected_paths_extra"), "{err}");
    let out = director()
        .args(["check-config", "--config", &example()])
        .env("DIRECTOR_RUNNER__PROTECTED_PATHS", "Makefile")
        .env("DIRECTOR_RUNNER__UNPROTECT_CI", "true")
        .output()
        .expect("runs");
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "warning: runner.unprotect_ci = true and runner.protected_paths leaves out .forgejo/**"
        ),
        "{err}"
    );
    // Adding keeps the defaults.
    let out = director()
        .args(["check-config", "--config", &example()])
        .env("DIRECTOR_RUNNER__PROTECTED_PATHS_EXTRA", "Makefile")
        .output()
        .expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn unmetered_routes_beside_a_budget_are_warned_of() {
    let out = director()
        .args(["check-config", "--config", &example()])
        .env("DIRECTOR_MODELS__ALLOW_UNMETERED", "true")
        .env("DIRECTOR_BUDGET__DAILY_USD", "5")
        .output()
        .expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("escape the budget"), "{err}");
}

/// `check-config` of the example configuration with `profile` (an `[agents]` table) added
/// and `vars` set.
fn check_with_profile(profile: &str, vars: &[(&str, &str)]) -> std::process::Output {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("director.toml");
    let text = std::fs::read_to_string(example()).expect("the example") + "\n" + profile;
    std::fs::write(&path, text).expect("write");
    let mut cmd = director();
    cmd.args(["check-config", "--config"]).arg(&path);
    for (k, v) in vars {
        cmd.env(k, v);
    }
    cmd.output().expect("runs")
}

const BOTH_PROVIDERS: &[(&str, &str)] = &[
    (
        "DIRECTOR_MODELS__ANTHROPIC__BASE_URL",
        "https://api.anthropic.com",
    ),
    ("DIRECTOR_MODELS__ANTHROPIC__API_KEY", "sk-ant-7f3a"),
    (
        "DIRECTOR_MODELS__OPENAI__BASE_URL",
        "https://api.openai.com/v1",
    ),
    ("DIRECTOR_MODELS__OPENAI__API_KEY", "sk-oai-7f3a"),
];

#[test]
fn each_example_agents_profile_is_accepted_as_it_is() {
    let examples = concat!(env!("CARGO_MANIFEST_DIR"), "/examples");
    for agent in ["claude-code", "aider", "mini-swe-agent", "codex"] {
        let profile =
            std::fs::read_to_string(format!("{examples}/{agent}/agent.toml")).expect(agent);
        assert!(profile.contains(&format!("[agents.{agent}]")), "{agent}");
        let mut vars = BOTH_PROVIDERS.to_vec();
        vars.push(("DIRECTOR_RUNNER__AGENT", agent));
        let out = check_with_profile(&profile, &vars);
        assert!(
            out.status.success(),
            "{agent}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let shown = String::from_utf8_lossy(&out.stdout);
        assert!(shown.contains(&format!("agent = \"{agent}\"")), "{shown}");
    }
}

#[test]
fn agent_profiles_that_would_misdirect_a_run_are_refused_naming_the_key() {
    type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str, &'a str);
    let cases: &[Case] = &[
        // A default that names no profile.
        (
            "[agents.aider]\nimage = \"x/aider:1\"\n",
            &[("DIRECTOR_RUNNER__AGENT", "claude-code")],
            "runner.agent",
            "configured: aider",
        ),
        // A profile may not point a run's provider elsewhere, nor take git's configuration.
        (
            "[agents.aider]\nimage = \"x/aider:1\"\nenv = { OPENAI_BASE_URL = \"https://evil.example\" }\n",
            &[],
            "agents",
            "OPENAI_BASE_URL",
        ),
        (
            "[agents.aider]\nimage = \"x/aider:1\"\nenv = { GIT_CONFIG_COUNT = \"1\" }\n",
            &[],
            "agents",
            "GIT_CONFIG_COUNT",
        ),
        (
            "[agents.aider]\nimage = \"x/aider:1\"\nproviders = [\"openai\"]\n",
            &[],
            "agents",
            "not configured in `[models]`",
        ),
        (
            "[agents.aider]\nimage = \"\"\n",
            &[],
            "agents",
            "image` is empty",
        ),
        (
            "[agents.Aider]\nimage = \"x/aider:1\"\n",
            &[],
            "agents",
            "not an agent name",
        ),
        (
            "[agents.aider]\nimage = \"x/aider:1\"\nmax_turns = 0\n",
            &[],
            "agents",
            "at least 1",
        ),
        (
            "[agents.aider]\nimage = \"x/aider:1\"\n",
            &[("DIRECTOR_REPO_SETTINGS__AGENTS", "aider,codex")],
            "repo_settings.agents",
            "`codex`",
        ),
        // Profiles but nothing for an issue that names none.
        (
            "[agents.aider]\nimage = \"x/aider:1\"\n",
            &[("DIRECTOR_RUNNER__IMAGE", "")],
            "runner.agent",
            "neither `runner.agent` nor `runner.image`",
        ),
    ];
    for (profile, vars, key, words) in cases {
        let out = check_with_profile(profile, vars);
        assert_eq!(out.status.code(), Some(2), "{profile} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(key) && err.contains(words), "{profile}: {err}");
    }
}

#[test]
fn with_runs_configured_check_config_says_agent_code_meets_the_repositorys_ci() {
    // Runs pushing to the repository: said, with the page that says what to do.
    let out = director()
        .args(["check-config", "--config", &example()])
        .env("DIRECTOR_RUNNER__BRANCH_HOME", "repository")
        .output()
        .expect("runs");
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("runner.branch_home = \"repository\": runs push their branches to the watched repositories themselves")
            && err.contains("docs/security.md#agent-code-in-ci"),
        "{err}"
    );
    // No runs, or runs pushing to forks (the default): no warning.
    for (key, value) in [
        ("DIRECTOR_RUNNER__ENABLED", "false"),
        ("DIRECTOR_RUNNER__BRANCH_HOME", "fork"),
    ] {
        let out = director()
            .args(["check-config", "--config", &example()])
            .env(key, value)
            .output()
            .expect("runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("runs push their branches"), "{key}: {err}");
    }
}

#[test]
fn runs_push_to_forks_in_the_example_and_an_unknown_home_is_refused() {
    let out = director()
        .args(["check-config", "--config", &example()])
        .output()
        .expect("runs");
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(shown.contains("branch_home = \"fork\""), "{shown}");
    let out = director()
        .args(["check-config", "--config", &example()])
        .env("DIRECTOR_RUNNER__BRANCH_HOME", "upstream")
        .output()
        .expect("runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("branch_home"),
        "{err}"
    );
}

#[test]
fn a_profile_variable_holding_one_of_the_directors_secrets_is_refused_without_showing_it() {
    let profile = |value: &str| {
        format!("[agents.aider]\nimage = \"x/aider:1\"\nenv = {{ AGENT_SECRET = \"{value}\" }}\n")
    };
    let cases: &[(&str, &[(&str, &str)])] = &[
        (
            "tok-forge-0a1b2c3d",
            &[("DIRECTOR_FORGE__TOKEN", "tok-forge-0a1b2c3d")],
        ),
        ("change-me-to-a-long-random-string", &[]),
        ("sk-ant-7f3a", BOTH_PROVIDERS),
        (
            "status-tok-99887766",
            &[("DIRECTOR_STATUS__TOKEN", "status-tok-99887766")],
        ),
    ];
    for (value, vars) in cases {
        let out = check_with_profile(&profile(value), vars);
        assert_eq!(out.status.code(), Some(2), "{value} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        let shown = String::from_utf8_lossy(&out.stdout);
        assert!(
            err.contains("agents.aider.env") && err.contains("AGENT_SECRET"),
            "{value}: {err}"
        );
        assert!(
            !err.contains(value) && !shown.contains(value),
            "{value} shown: {err}"
        );
    }
    // A value that is no secret of the director's is accepted, and masked when shown.
    let out = check_with_profile(&profile("dsk-live-7f3a9c0e5b21"), &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(shown.contains("AGENT_SECRET = \"***\""), "{shown}");
    assert!(!shown.contains("dsk-live-7f3a9c0e5b21"), "{shown}");
}
