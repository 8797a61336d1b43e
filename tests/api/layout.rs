//! The product boundary: the service crate holds no fake and no benchmark, and its release
//! build links neither (they are the `director-testkit` and `director-bench` packages).

use serde_json::Value;

fn metadata() -> Value {
    let out = std::process::Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("cargo metadata is JSON")
}

fn package<'a>(meta: &'a Value, name: &str) -> &'a Value {
    meta["packages"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == name))
        .unwrap_or_else(|| panic!("package {name} is in the workspace"))
}

#[test]
fn the_service_package_builds_one_binary_and_depends_on_no_fake_or_benchmark() {
    let meta = metadata();
    let service = package(&meta, "director");
    let mut built: Vec<String> = service["targets"]
        .as_array()
        .expect("targets")
        .iter()
        .filter(|t| {
            t["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|k| k == "bin" || k == "lib" || k == "bench"))
        })
        .map(|t| format!("{}:{}", t["kind"][0].as_str().unwrap_or("?"), t["name"]))
        .collect();
    built.sort();
    assert_eq!(built, ["bin:\"director\"", "lib:\"director\""]);
    let normal: Vec<&str> = service["dependencies"]
        .as_array()
        .expect("dependencies")
        .iter()
        .filter(|d| d["kind"].is_null())
        .filter_map(|d| d["name"].as_str())
        .collect();
    for apart in ["director-testkit", "director-bench", "director-demo"] {
        assert!(!normal.contains(&apart), "the service depends on {apart}");
        package(&meta, apart);
    }
    let features: Vec<&String> = service["features"]
        .as_object()
        .expect("features")
        .keys()
        .collect();
    assert!(
        !features
            .iter()
            .any(|f| f.contains("fake") || f.contains("demo")),
        "a feature compiles a fake or the demo into the service: {features:?}"
    );
}

#[test]
fn the_service_sources_hold_no_fake_and_no_benchmark() {
    fn walk(dir: &std::path::Path, found: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).expect("reads src") {
            let path = entry.expect("an entry").path();
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            if name.contains("fake") || name.contains("bench") || name == "bin" {
                found.push(path.display().to_string());
            }
            if path.is_dir() {
                walk(&path, found);
            }
        }
    }
    let mut found = Vec::new();
    walk(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut found,
    );
    assert!(
        found.is_empty(),
        "test doubles or benchmarks in the service: {found:?}"
    );
}
