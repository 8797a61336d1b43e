//! The Helm chart, rendered offline (Helm's SDK through helm-python-sdk) and every manifest
//! validated against Kubernetes' own strict schemas (kubernetes-validate), by
//! `tests/chart/render.py`. The Python comes from `DIRECTOR_CHART_PYTHON`, else the virtual
//! environment `tests/chart/setup.sh` makes (`.ci/run` makes it).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

pub fn python() -> PathBuf {
    if let Ok(p) = std::env::var("DIRECTOR_CHART_PYTHON") {
        return PathBuf::from(p);
    }
    let venv = root().join("target/chart-venv/bin/python");
    assert!(
        venv.exists(),
        "the chart tests need helm-python-sdk and kubernetes-validate: run tests/chart/setup.sh (or set DIRECTOR_CHART_PYTHON)"
    );
    venv
}

/// What Kubernetes' strict schemas find wrong with `manifests`.
pub fn invalid(manifests: &[Value]) -> Vec<String> {
    use std::io::Write as _;
    let mut child = Command::new(python())
        .arg(root().join("tests/chart/validate.py"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("the validator runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(Value::from(manifests.to_vec()).to_string().as_bytes())
        .expect("write");
    let out = child.wait_with_output().expect("validated");
    assert!(out.status.success());
    serde_json::from_slice(&out.stdout).expect("JSON from validate.py")
}

/// The chart rendered with `values` as release `director` in namespace `forge`.
fn render(values: Value) -> Value {
    let out = Command::new(python())
        .arg(root().join("tests/chart/render.py"))
        .arg(root().join("charts/director"))
        .arg(values.to_string())
        .output()
        .expect("the renderer runs");
    assert!(
        out.status.success(),
        "render.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON from render.py")
}

/// Renders, and checks what every accepted rendering must be: valid, lint-clean.
fn rendered(values: Value) -> Vec<Value> {
    let out = render(values);
    assert_eq!(out["ok"], true, "refused: {}", out["error"]);
    assert_eq!(out["invalid"], json!([]), "invalid manifests");
    assert_eq!(out["lint"]["errors"], json!([]), "lint errors");
    let severe: Vec<&Value> = out["lint"]["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["severity"].as_i64().unwrap_or(0) >= 2)
        .collect();
    assert!(severe.is_empty(), "lint warnings: {severe:?}");
    out["manifests"].as_array().cloned().unwrap_or_default()
}

fn refused(values: Value) -> String {
    let out = render(values);
    assert_eq!(out["ok"], false, "rendered what it should refuse");
    out["error"].as_str().unwrap_or_default().to_owned()
}

fn find<'a>(manifests: &'a [Value], kind: &str) -> Vec<&'a Value> {
    manifests.iter().filter(|m| m["kind"] == kind).collect()
}

fn one<'a>(manifests: &'a [Value], kind: &str) -> &'a Value {
    let all = find(manifests, kind);
    assert_eq!(all.len(), 1, "one {kind}: {all:?}");
    all[0]
}

fn director_toml(manifests: &[Value]) -> String {
    one(manifests, "ConfigMap")["data"]["director.toml"]
        .as_str()
        .expect("director.toml")
        .to_owned()
}

/// `director check-config` on the rendered director.toml, with the pod's files made here:
/// the mounted `secrets` (key, value) and the database directory.
fn check_rendered(manifests: &[Value], secrets: &[(&str, &str)]) -> (std::process::Output, String) {
    let dir = tempfile::tempdir().expect("dir");
    let files = dir.path().join("secrets");
    std::fs::create_dir(&files).expect("mkdir");
    for (k, v) in secrets {
        std::fs::write(files.join(k), v).expect("write");
    }
    let toml = director_toml(manifests)
        .replace("/run/secrets/director", &files.display().to_string())
        .replace(
            "/data/director.db",
            &dir.path().join("d.db").display().to_string(),
        );
    let config = dir.path().join("director.toml");
    std::fs::write(&config, &toml).expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_director"))
        .args(["check-config", "--config"])
        .arg(&config)
        .output()
        .expect("check-config runs");
    (out, toml)
}

#[test]
fn the_default_shape_is_one_hardened_replica_on_sqlite_with_least_privilege_rbac() {
    let m = rendered(json!({}));
    let deployment = one(&m, "Deployment");
    let spec = &deployment["spec"];
    assert_eq!(spec["replicas"], 1);
    assert_eq!(
        spec["strategy"]["type"], "Recreate",
        "one SQLite file, one process"
    );
    let pod = &spec["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert!(pod["securityContext"]["runAsUser"].as_i64().unwrap_or(0) > 0);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let c = &pod["containers"][0];
    let sc = &c["securityContext"];
    assert_eq!(sc["runAsNonRoot"], true);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert!(c["resources"]["limits"]["memory"].is_string());
    assert!(c["env"].is_null(), "no secret as an environment variable");
    let pvc = one(&m, "PersistentVolumeClaim");
    let claims: Vec<&Value> = pod["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .filter(|v| v["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"])
        .collect();
    assert_eq!(claims.len(), 1, "the database's volume is mounted");
    assert!(
        find(&m, "Secret").is_empty(),
        "no secret given, none stored"
    );
    let toml = director_toml(&m);
    assert!(
        toml.contains("url = \"sqlite:///data/director.db\""),
        "{toml}"
    );
    assert!(toml.contains("kind = \"kubernetes\""), "{toml}");
    assert!(toml.contains("listen = \"0.0.0.0:8080\""), "{toml}");
    assert_eq!(one(&m, "Service")["spec"]["ports"][0]["port"], 8080);
    // Allow-listed runs (the default) reach the proxy through the Service, by the name the
    // configuration gives them, and only the director's pods (their NetworkPolicy).
    assert_eq!(one(&m, "Service")["spec"]["ports"][1]["port"], 3128);
    assert_eq!(one(&m, "Service")["spec"]["ports"][2]["port"], 3129);
    assert!(
        toml.contains("proxy_host = \"director.forge.svc\""),
        "{toml}"
    );
    assert!(
        toml.contains("\"app.kubernetes.io/name=director\""),
        "{toml}"
    );
    assert!(toml.contains("egress_proxy_port = 3128"), "{toml}");
    assert!(toml.contains("git_gateway_port = 3129"), "{toml}");
    assert!(toml.contains("model_gateway_port = 3130"), "{toml}");

    // RBAC: one namespaced Role with exactly what the runtime uses; no wildcard, nothing
    // cluster-wide.
    assert!(find(&m, "ClusterRole").is_empty() && find(&m, "ClusterRoleBinding").is_empty());
    let role = one(&m, "Role");
    assert_eq!(role["metadata"]["namespace"], "forge");
    let mut granted = Vec::new();
    for rule in role["rules"].as_array().expect("rules") {
        for field in ["apiGroups", "resources", "verbs"] {
            assert!(
                !rule[field]
                    .as_array()
                    .expect(field)
                    .iter()
                    .any(|v| v == "*"),
                "a wildcard in {rule}"
            );
        }
        for group in rule["apiGroups"].as_array().expect("groups") {
            for resource in rule["resources"].as_array().expect("resources") {
                for verb in rule["verbs"].as_array().expect("verbs") {
                    granted.push(format!(
                        "{}/{}:{}",
                        group.as_str().unwrap_or(""),
                        resource.as_str().unwrap_or(""),
                        verb.as_str().unwrap_or("")
                    ));
                }
            }
        }
    }
    granted.sort();
    let expected = [
        "/pods/log:get",
        "/pods:delete",
        "/pods:get",
        "/pods:list",
        "/pods:watch",
        "/secrets:create",
        "/secrets:delete",
        "/secrets:get",
        "batch/jobs:create",
        "batch/jobs:delete",
        "batch/jobs:get",
        "batch/jobs:list",
        "batch/jobs:patch",
        "batch/jobs:watch",
        "networking.k8s.io/networkpolicies:create",
        "networking.k8s.io/networkpolicies:delete",
    ];
    assert_eq!(granted, expected);
    let binding = one(&m, "RoleBinding");
    assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
    assert_eq!(binding["subjects"][0]["name"], pod["serviceAccountName"]);
    // The runs' own account can do nothing and never gets a token mounted.
    let run_account = find(&m, "ServiceAccount")
        .into_iter()
        .find(|sa| sa["automountServiceAccountToken"] == false)
        .expect("the runs' service account");
    assert!(
        toml.contains(&format!(
            "service_account = \"{}\"",
            run_account["metadata"]["name"].as_str().unwrap_or("?")
        )),
        "{toml}"
    );
}

#[test]
fn several_replicas_use_postgresql_from_a_secret_file_never_from_the_configmap() {
    let url = "postgres://director:pg-pass-93c1@db.forge.svc:5432/director";
    let m = rendered(json!({
        "replicaCount": 3,
        "secrets": {
            "storeUrl": { "value": url, "key": "store-url" },
            "forgeToken": { "existingSecret": "forge-bot", "key": "token" },
            "webhookSecrets": { "value": "hook-secret-1\nhook-secret-2", "key": "webhook-secrets" },
        },
        "config": { "forge": { "url": "https://forgejo.example.org" }, "scan": { "repos": ["acme/widgets"] } },
    }));
    let deployment = one(&m, "Deployment");
    assert_eq!(deployment["spec"]["replicas"], 3);
    assert_ne!(deployment["spec"]["strategy"]["type"], "Recreate");
    assert!(
        find(&m, "PersistentVolumeClaim").is_empty(),
        "no SQLite volume"
    );
    let toml = director_toml(&m);
    assert!(
        !toml.contains("pg-pass"),
        "the password is not in the ConfigMap"
    );
    assert!(!toml.contains("sqlite"), "{toml}");
    assert!(
        toml.contains("url_file = \"/run/secrets/director/store-url\""),
        "{toml}"
    );
    assert!(
        toml.contains("token_file = \"/run/secrets/director/token\""),
        "{toml}"
    );
    assert!(
        toml.contains("secrets_file = \"/run/secrets/director/webhook-secrets\""),
        "{toml}"
    );
    assert!(
        !toml.contains("runner_password_file"),
        "absent secrets are not named"
    );
    let secret = one(&m, "Secret");
    use base64::Engine as _;
    let stored = base64::engine::general_purpose::STANDARD
        .decode(secret["data"]["store-url"].as_str().expect("store-url"))
        .expect("base64");
    assert_eq!(stored, url.as_bytes());
    assert!(
        secret["data"]["token"].is_null(),
        "an existing Secret's key is not copied"
    );
    let pod = &deployment["spec"]["template"]["spec"];
    let projected = pod["volumes"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["name"] == "secrets"))
        .expect("the secrets volume");
    let sources: Vec<&str> = projected["projected"]["sources"]
        .as_array()
        .expect("sources")
        .iter()
        .filter_map(|s| s["secret"]["name"].as_str())
        .collect();
    assert!(sources.contains(&"forge-bot"), "{sources:?}");
    assert!(sources.contains(&secret["metadata"]["name"].as_str().unwrap_or("?")));
    let mount = pod["containers"][0]["volumeMounts"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["name"] == "secrets"))
        .expect("mounted");
    assert_eq!(mount["readOnly"], true);
}

#[test]
fn the_chart_refuses_several_replicas_on_sqlite_secrets_in_the_configmap_and_bad_values() {
    let e = refused(json!({ "replicaCount": 2 }));
    assert!(e.contains("PostgreSQL"), "{e}");
    let e = refused(
        json!({ "replicaCount": 2, "secrets": { "storeUrl": { "value": "sqlite:///x", "key": "store-url" } } }),
    );
    assert!(e.contains("postgres://"), "{e}");
    let e = refused(json!({ "config": { "forge": { "token": "literal-token" } } }));
    assert!(e.contains("config.forge.token"), "{e}");
    assert!(
        !e.contains("literal-token"),
        "the refusal does not echo the secret"
    );
    let e = refused(json!({ "config": { "store": { "url": "postgres://u:p@h/d" } } }));
    assert!(e.contains("config.store.url"), "{e}");
    let e = refused(json!({ "replicaCount": "three" }));
    assert!(e.contains("replicaCount"), "{e}");
    let e = refused(json!({ "replicas": 3 }));
    assert!(e.contains("replicas"), "an unknown value is refused: {e}");
    let e = refused(json!({ "runs": { "namespace": "Not_A_Name" } }));
    assert!(e.contains("namespace"), "{e}");
}

#[test]
fn runs_in_their_own_namespace_get_the_role_there_and_options_render_valid() {
    let m = rendered(json!({
        "runs": { "namespace": "director-runs" },
        "serviceMonitor": { "enabled": true, "labels": { "release": "prom" } },
        "networkPolicy": { "enabled": true, "ingressFrom": [ { "namespaceSelector": { "matchLabels": { "name": "forgejo" } } } ] },
        "config": { "runner": { "max_followups": 3, "cpus": 1.5, "image": "agent:1" } },
    }));
    let role = one(&m, "Role");
    assert_eq!(role["metadata"]["namespace"], "director-runs");
    let binding = one(&m, "RoleBinding");
    assert_eq!(binding["metadata"]["namespace"], "director-runs");
    assert_eq!(binding["subjects"][0]["namespace"], "forge");
    let toml = director_toml(&m);
    assert!(toml.contains("namespace = \"director-runs\""), "{toml}");
    assert!(
        toml.contains("max_followups = 3\n"),
        "whole numbers stay whole: {toml}"
    );
    assert!(toml.contains("cpus = 1.5"), "{toml}");
    let monitor = one(&m, "ServiceMonitor");
    assert_eq!(monitor["spec"]["endpoints"][0]["path"], "/metrics");
    assert_eq!(monitor["metadata"]["labels"]["release"], "prom");
    let policy = one(&m, "NetworkPolicy");
    assert_eq!(policy["spec"]["ingress"][0]["ports"][0]["port"], "http");
}

#[test]
fn the_rendered_configuration_is_accepted_by_the_director_itself() {
    let m = rendered(json!({
        "secrets": {
            "forgeToken": { "value": "bot-token-1", "key": "forge-token" },
            "runnerPassword": { "value": "runner-pass-1", "key": "runner-password" },
            "webhookSecrets": { "value": "hook-1", "key": "webhook-secrets" },
        },
        "config": {
            "forge": { "url": "https://forgejo.example.org" },
            "scan": { "repos": ["acme/widgets"] },
            "runner": { "image": "agent:1", "max_followups": 2, "timeout_secs": 1800 },
        },
    }));
    let (out, toml) = check_rendered(
        &m,
        &[
            ("forge-token", "bot-token-1"),
            ("runner-password", "runner-pass-1"),
            ("webhook-secrets", "hook-1"),
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{toml}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("kubernetes"), "{stdout}");
    assert!(!stdout.contains("bot-token-1") && !stdout.contains("runner-pass-1"));
}

#[test]
fn a_github_app_release_mounts_its_key_as_a_file_and_the_director_accepts_it() {
    let key = std::fs::read_to_string(root().join("tests/fixtures/github/test-app-key.pem"))
        .expect("test key");
    let m = rendered(json!({
        "secrets": {
            "githubPrivateKey": { "value": key, "key": "github-private-key" },
            "webhookSecrets": { "value": "hook-1", "key": "webhook-secrets" },
        },
        "config": {
            "forge": { "kind": "github", "url": "https://api.github.com" },
            "github": { "app_id": 4242 },
            "scan": { "repos": ["acme/widgets"] },
            "runner": { "image": "agent:1", "timeout_secs": 1800 },
        },
    }));
    let toml = director_toml(&m);
    assert!(
        toml.contains("private_key_file = \"/run/secrets/director/github-private-key\""),
        "{toml}"
    );
    assert!(!toml.contains("PRIVATE KEY"), "never in the ConfigMap");
    let (out, toml) = check_rendered(
        &m,
        &[
            ("github-private-key", key.as_str()),
            ("webhook-secrets", "hook-1"),
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{toml}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!stdout.contains("PRIVATE KEY"), "{stdout}");
    // The key under `config` is refused, and not echoed.
    let why = refused(
        json!({ "config": { "github": { "private_key": "-----BEGIN RSA PRIVATE KEY-----x" } } }),
    );
    assert!(why.contains("config.github.private_key"), "{why}");
    assert!(!why.contains("BEGIN RSA"), "{why}");
}

#[test]
fn the_charts_readme_lists_every_value() {
    let out = render(json!({}));
    let readme = std::fs::read_to_string(root().join("charts/director/README.md")).expect("README");
    let mut missing = Vec::new();
    fn walk(prefix: &str, v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(map) if !map.is_empty() && prefix != "config" => {
                for (k, v) in map {
                    let key = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    walk(&key, v, out);
                }
            }
            _ => out.push(prefix.to_owned()),
        }
    }
    let mut keys = Vec::new();
    walk("", &out["defaults"], &mut keys);
    assert!(keys.len() > 30, "{keys:?}");
    for key in keys {
        if !readme.contains(&format!("`{key}`")) {
            missing.push(key);
        }
    }
    assert!(
        missing.is_empty(),
        "values the README does not list: {missing:?}"
    );
}

/// A Kubernetes quantity in MiB (the forms the chart uses).
fn mebibytes(q: &str) -> u64 {
    let digits = q.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let n: u64 = digits.parse().expect("a whole quantity");
    match &q[digits.len()..] {
        "Mi" => n,
        "Gi" => n * 1024,
        "M" => (n * 1_000_000) >> 20,
        "G" => (n * 1_000_000_000) >> 20,
        "" => n >> 20,
        unit => panic!("a unit the test does not read: {unit}"),
    }
}

/// A whole-number key of director.toml's `[runner]`.
fn runner_key(toml: &str, key: &str) -> Option<u64> {
    let table: toml::Table = toml.parse().expect("director.toml parses");
    table.get("runner")?.get(key)?.as_integer()?.try_into().ok()
}

/// Whether what the chart renders lets one run take the director down: the gateways'
/// bodies (`runner.gateway_memory_mb`, unset: a quarter of the memory limit, at most 512)
/// must hold one push and leave three quarters of the limit to git and the director; the
/// gateway's disk cap must stay below its volume and hold two pushes, on the volume
/// `runner.gateway_dir` names.
fn sizing_faults(m: &[Value]) -> Vec<String> {
    let toml = director_toml(m);
    let pod = &one(m, "Deployment")["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    let mut faults = Vec::new();
    let limit = c["resources"]["limits"]["memory"].as_str().map(mebibytes);
    let memory = runner_key(&toml, "gateway_memory_mb")
        .unwrap_or_else(|| limit.map_or(512, |l| (l / 4).min(512)));
    let max_push = runner_key(&toml, "max_push_mb").unwrap_or(100);
    match limit {
        None => faults.push("no memory limit".to_owned()),
        Some(l) if l < memory * 4 => faults.push(format!(
            "limit {l} MiB < four times the gateways' {memory} MB"
        )),
        Some(_) => {}
    }
    if max_push > memory {
        faults.push(format!("max_push_mb {max_push} > gateway memory {memory}"));
    }
    let table: toml::Table = toml.parse().expect("director.toml parses");
    let dir = table["runner"]
        .get("gateway_dir")
        .and_then(|d| d.as_str())
        .unwrap_or("");
    let mount = c["volumeMounts"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["mountPath"] == dir));
    let Some(mount) = mount else {
        faults.push(format!(
            "runner.gateway_dir ({dir:?}) is on no volume of its own"
        ));
        return faults;
    };
    let volume = pod["volumes"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["name"] == mount["name"]))
        .expect("the mounted volume");
    let disk = runner_key(&toml, "gateway_disk_mb");
    match (disk, volume["emptyDir"]["sizeLimit"].as_str()) {
        (None, _) => faults.push("no runner.gateway_disk_mb".to_owned()),
        (Some(d), Some(size)) if d >= mebibytes(size) => {
            faults.push(format!("gateway_disk_mb {d} >= the volume's {size}"));
        }
        (Some(d), None) if volume["persistentVolumeClaim"].is_null() => {
            faults.push(format!("gateway_disk_mb {d} on a volume of no size"));
        }
        _ => {}
    }
    if disk.is_some_and(|d| d < 2 * max_push) {
        faults.push(format!(
            "gateway_disk_mb {disk:?} < two pushes of {max_push}"
        ));
    }
    faults
}

#[test]
fn the_director_is_sized_for_what_its_gateways_may_hold_and_inconsistent_sizes_are_refused() {
    let m = rendered(json!({}));
    // (The director takes it: the_rendered_configuration_is_accepted_by_the_director_itself.)
    assert_eq!(sizing_faults(&m), Vec::<String>::new());

    // A larger release, consistent, renders so; on a claim of its own too.
    let m = rendered(json!({
        "resources": { "limits": { "memory": "4Gi" } },
        "gatewayStorage": { "size": "20Gi", "existingClaim": "gateway-cache" },
        "config": { "runner": { "max_push_mb": 200, "gateway_memory_mb": 1024 } },
    }));
    assert_eq!(sizing_faults(&m), Vec::<String>::new());
    let toml = director_toml(&m);
    assert_eq!(runner_key(&toml, "gateway_disk_mb"), Some(15360), "{toml}");

    // What would let a run take it down is refused at install, naming the values.
    for (values, named) in [
        (
            json!({ "resources": { "limits": { "memory": "256Mi" } } }),
            "resources.limits.memory",
        ),
        (
            json!({ "config": { "runner": { "gateway_memory_mb": 512 } } }),
            "a quarter of resources.limits.memory",
        ),
        (
            json!({ "config": { "runner": { "max_push_mb": 300 } } }),
            "config.runner.max_push_mb",
        ),
        (
            json!({ "config": { "runner": { "gateway_disk_mb": 4096 } } }),
            "below gatewayStorage.size",
        ),
        (
            json!({ "gatewayStorage": { "size": "128Mi" } }),
            "two pushes",
        ),
        (
            json!({ "config": { "runner": { "gateway_dir": "/tmp" } } }),
            "config.runner.gateway_dir",
        ),
        (
            json!({ "resources": { "limits": { "memory": "1.5Gi" } } }),
            "whole quantity",
        ),
    ] {
        let why = refused(values.clone());
        assert!(why.contains(named), "{values}: {why}");
    }
}
