//! A stateful fake Kubernetes API server on loopback, for the Kubernetes runtime: Jobs, Pods
//! and Secrets in namespaces, list and watch streams (resource versions, label and field
//! selectors), merge patches, deletion with propagation (and the garbage collection of owned
//! objects), dry runs, 409 on a name clash, 404 for a missing namespace, 403 for what RBAC
//! forbids, pod logs (tailed or followed). It plays the Job controller and the kubelet too:
//! an unsuspended Job gets one pod, which the test then runs and ends. Every request is kept.
//!
//! The real `kube` client talks to it over HTTP through a kubeconfig (`kubeconfig_yaml`).

use std::collections::{BTreeMap, HashSet};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use actix_web::web::Bytes;
use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use serde_json::{Value, json};

#[derive(Clone, Debug)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub query: String,
    pub body: Value,
}

/// One change, as a watch tells it.
#[derive(Clone, Debug)]
struct Change {
    rv: u64,
    resource: &'static str,
    namespace: String,
    kind: &'static str,
    object: Value,
}

struct State {
    rv: u64,
    /// (resource, namespace, name) → object.
    objects: BTreeMap<(&'static str, String, String), Value>,
    namespaces: HashSet<String>,
    /// (verb, resource) pairs RBAC refuses.
    forbidden: HashSet<(String, String)>,
    changes: Vec<Change>,
    /// Pod name → its output so far.
    logs: BTreeMap<String, Vec<String>>,
    /// Pod name → when each line of its output was written (RFC 3339 with nanoseconds, as
    /// the kubelet's `timestamps=true` shows them).
    log_times: BTreeMap<String, Vec<String>>,
    requests: Vec<Recorded>,
    next_pod: u64,
}

pub struct FakeKube {
    state: Arc<Mutex<State>>,
    tick: Arc<tokio::sync::watch::Sender<u64>>,
    handle: actix_web::dev::ServerHandle,
    _dir: tempfile::TempDir,
    pub kubeconfig: std::path::PathBuf,
}

type Shared = (Arc<Mutex<State>>, Arc<tokio::sync::watch::Sender<u64>>);

fn status(code: u16, reason: &str, message: &str) -> HttpResponse {
    HttpResponse::build(actix_web::http::StatusCode::from_u16(code).expect("status code"))
        .content_type("application/json")
        .body(
            json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {},
                "status": "Failure", "message": message, "reason": reason, "code": code,
            })
            .to_string(),
        )
}

fn resource_kind(resource: &str) -> (&'static str, &'static str, &'static str) {
    match resource {
        "jobs" => ("jobs", "Job", "batch/v1"),
        "pods" => ("pods", "Pod", "v1"),
        "networkpolicies" => ("networkpolicies", "NetworkPolicy", "networking.k8s.io/v1"),
        _ => ("secrets", "Secret", "v1"),
    }
}

fn query_map(q: &str) -> BTreeMap<String, String> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                out.push(u8::from_str_radix(hex, 16).unwrap_or(b'?'));
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `a=b,c` label selectors (equality and existence), and `metadata.name=x` field selectors.
fn matches(object: &Value, query: &BTreeMap<String, String>) -> bool {
    if let Some(sel) = query.get("labelSelector") {
        for term in sel.split(',').filter(|t| !t.is_empty()) {
            let labels = &object["metadata"]["labels"];
            let ok = match term.split_once('=') {
                Some((k, v)) => labels[k].as_str() == Some(v),
                None => !labels[term].is_null(),
            };
            if !ok {
                return false;
            }
        }
    }
    if let Some(sel) = query.get("fieldSelector") {
        for term in sel.split(',').filter(|t| !t.is_empty()) {
            if let Some(("metadata.name", v)) = term.split_once('=')
                && object["metadata"]["name"].as_str() != Some(v)
            {
                return false;
            }
        }
    }
    true
}

/// RFC 7386 JSON merge patch.
fn merge(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            for (k, v) in p {
                if v.is_null() {
                    if let Some(t) = target.as_object_mut() {
                        t.remove(k);
                    }
                } else {
                    merge(&mut target[k], v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

fn now() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

impl State {
    fn bump(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    /// Stores `object` (stamping its resource version) and records the change.
    fn put(&mut self, resource: &'static str, ns: &str, mut object: Value, kind: &'static str) {
        let rv = self.bump();
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        let name = object["metadata"]["name"].as_str().unwrap_or("").to_owned();
        self.changes.push(Change {
            rv,
            resource,
            namespace: ns.to_owned(),
            kind,
            object: object.clone(),
        });
        self.objects.insert((resource, ns.to_owned(), name), object);
    }

    fn remove(&mut self, resource: &'static str, ns: &str, name: &str) -> Option<Value> {
        let object = self
            .objects
            .remove(&(resource, ns.to_owned(), name.to_owned()))?;
        let rv = self.bump();
        let mut gone = object.clone();
        gone["metadata"]["resourceVersion"] = json!(rv.to_string());
        self.changes.push(Change {
            rv,
            resource,
            namespace: ns.to_owned(),
            kind: "DELETED",
            object: gone,
        });
        Some(object)
    }

    fn get(&self, resource: &'static str, ns: &str, name: &str) -> Option<&Value> {
        self.objects
            .get(&(resource, ns.to_owned(), name.to_owned()))
    }

    fn owned_by(&self, ns: &str, uid: &str) -> Vec<(&'static str, String)> {
        self.objects
            .iter()
            .filter(|((_, n, _), o)| {
                n == ns
                    && o["metadata"]["ownerReferences"]
                        .as_array()
                        .is_some_and(|refs| refs.iter().any(|r| r["uid"] == uid))
            })
            .map(|((r, _, name), _)| (*r, name.clone()))
            .collect()
    }

    /// A graceful deletion: the pod is marked and keeps running for its grace period; one
    /// without a grace period goes at once.
    fn terminate_pod(&mut self, ns: &str, name: &str) {
        let Some(mut pod) = self.get("pods", ns, name).cloned() else {
            return;
        };
        let grace = pod["spec"]["terminationGracePeriodSeconds"]
            .as_i64()
            .unwrap_or(30);
        let ended = matches!(
            pod["status"]["phase"].as_str(),
            Some("Succeeded" | "Failed")
        );
        if grace == 0 || ended {
            self.remove("pods", ns, name);
            return;
        }
        pod["metadata"]["deletionTimestamp"] = json!(now());
        pod["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
        self.put("pods", ns, pod, "MODIFIED");
    }

    fn pods_of_job(&self, ns: &str, job: &str) -> Vec<String> {
        self.objects
            .iter()
            .filter(|((r, n, _), o)| {
                *r == "pods" && n == ns && o["metadata"]["labels"]["job-name"] == job
            })
            .map(|((_, _, name), _)| name.clone())
            .collect()
    }

    /// The Job controller: an unsuspended, unfinished Job without a pod gets one; a
    /// suspended one loses its pods.
    fn reconcile(&mut self, ns: &str, job_name: &str) {
        let Some(job) = self.get("jobs", ns, job_name).cloned() else {
            return;
        };
        let suspended = job["spec"]["suspend"].as_bool().unwrap_or(false);
        let finished = job["status"]["conditions"]
            .as_array()
            .is_some_and(|c| !c.is_empty());
        let pods = self.pods_of_job(ns, job_name);
        if suspended {
            for pod in pods {
                self.remove("pods", ns, &pod);
            }
            return;
        }
        if finished || !pods.is_empty() || job["status"]["failed"].as_i64().unwrap_or(0) > 0 {
            return;
        }
        self.next_pod += 1;
        let pod_name = format!("{job_name}-p{}", self.next_pod);
        let mut labels = job["spec"]["template"]["metadata"]["labels"].clone();
        if !labels.is_object() {
            labels = json!({});
        }
        labels["job-name"] = json!(job_name);
        labels["batch.kubernetes.io/job-name"] = json!(job_name);
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": pod_name, "namespace": ns, "labels": labels,
                "uid": format!("pod-uid-{}", self.next_pod),
                "creationTimestamp": now(),
                "ownerReferences": [{
                    "apiVersion": "batch/v1", "kind": "Job", "name": job_name,
                    "uid": job["metadata"]["uid"], "controller": true, "blockOwnerDeletion": true,
                }],
            },
            "spec": job["spec"]["template"]["spec"],
            "status": { "phase": "Pending" },
        });
        self.put("pods", ns, pod, "ADDED");
        let mut job = job;
        if job["status"]["startTime"].is_null() {
            job["status"]["startTime"] = json!(now());
        }
        job["status"]["active"] = json!(1);
        self.put("jobs", ns, job, "MODIFIED");
    }

    /// A Job's pod ended: the Job's condition follows (`backoffLimit: 0`).
    fn job_ends(&mut self, ns: &str, job_name: &str, ok: bool, reason: &str) {
        let Some(mut job) = self.get("jobs", ns, job_name).cloned() else {
            return;
        };
        job["status"]["active"] = json!(0);
        let (key, kind) = if ok {
            ("succeeded", "Complete")
        } else {
            ("failed", "Failed")
        };
        job["status"][key] = json!(1);
        job["status"]["conditions"] = json!([{
            "type": kind, "status": "True", "reason": reason,
            "lastTransitionTime": now(),
        }]);
        self.put("jobs", ns, job, "MODIFIED");
    }
}

impl FakeKube {
    pub fn start() -> Self {
        let state = Arc::new(Mutex::new(State {
            rv: 1,
            objects: BTreeMap::new(),
            namespaces: ["default", "runs"].into_iter().map(String::from).collect(),
            forbidden: HashSet::new(),
            changes: Vec::new(),
            logs: BTreeMap::new(),
            log_times: BTreeMap::new(),
            requests: Vec::new(),
            next_pod: 0,
        }));
        let (tick, _) = tokio::sync::watch::channel(0u64);
        let tick = Arc::new(tick);
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let data = web::Data::new((state.clone(), tick.clone()));
        let server = HttpServer::new(move || {
            App::new()
                .app_data(data.clone())
                .app_data(web::PayloadConfig::new(16 * 1024 * 1024))
                .default_service(web::to(handle))
        })
        .listen(listener)
        .expect("listen")
        .workers(1)
        .disable_signals()
        .run();
        let handle = server.handle();
        tokio::spawn(server);
        let url = format!("http://127.0.0.1:{port}");
        let dir = tempfile::tempdir().expect("tempdir");
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig, kubeconfig_yaml(&url)).expect("kubeconfig");
        Self {
            state,
            tick,
            handle,
            _dir: dir,
            kubeconfig,
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let out = {
            let mut s = self.state.lock().expect("lock");
            f(&mut s)
        };
        let rv = self.state.lock().expect("lock").rv;
        self.tick.send_replace(rv);
        out
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.with(|s| s.requests.clone())
    }

    /// RBAC refuses `verb` (`create`, `list`, ...) on `resource` from now on.
    pub fn forbid(&self, verb: &str, resource: &str) {
        self.with(|s| s.forbidden.insert((verb.to_owned(), resource.to_owned())));
    }

    pub fn job(&self, ns: &str, name: &str) -> Option<Value> {
        self.with(|s| s.get("jobs", ns, name).cloned())
    }

    pub fn jobs(&self, ns: &str) -> Vec<Value> {
        self.with(|s| {
            s.objects
                .iter()
                .filter(|((r, n, _), _)| *r == "jobs" && n == ns)
                .map(|(_, o)| o.clone())
                .collect()
        })
    }

    pub fn secret(&self, ns: &str, name: &str) -> Option<Value> {
        self.with(|s| s.get("secrets", ns, name).cloned())
    }

    pub fn network_policy(&self, ns: &str, name: &str) -> Option<Value> {
        self.with(|s| s.get("networkpolicies", ns, name).cloned())
    }

    /// Deletes the run's NetworkPolicy, as a crash before it was made would leave things.
    pub fn remove_network_policy(&self, ns: &str, name: &str) {
        self.with(|s| s.remove("networkpolicies", ns, name));
    }

    pub fn pods_of(&self, ns: &str, job: &str) -> Vec<Value> {
        self.with(|s| {
            s.pods_of_job(ns, job)
                .iter()
                .filter_map(|p| s.get("pods", ns, p).cloned())
                .collect()
        })
    }

    /// The environment the kubelet would give the Job's pod: literal values, and values
    /// from a Secret's key.
    pub fn pod_env(&self, ns: &str, job: &str) -> Option<BTreeMap<String, String>> {
        use base64::Engine as _;
        let job = self.job(ns, job)?;
        let env = job["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_array()?
            .clone();
        let mut out = BTreeMap::new();
        for var in env {
            let name = var["name"].as_str()?.to_owned();
            let value = match var["value"].as_str() {
                Some(v) => v.to_owned(),
                None => {
                    let r = &var["valueFrom"]["secretKeyRef"];
                    let secret = self.secret(ns, r["name"].as_str()?)?;
                    let encoded = secret["data"][r["key"].as_str()?].as_str()?.to_owned();
                    let bytes = base64::engine::general_purpose::STANDARD
                        .decode(encoded)
                        .ok()?;
                    String::from_utf8_lossy(&bytes).into_owned()
                }
            };
            out.insert(name, value);
        }
        Some(out)
    }

    /// The kubelet starts the Job's pod: `Err` when its Secret is missing (the pod then waits
    /// with `CreateContainerConfigError`, as a real one does).
    pub fn run_pod(&self, ns: &str, job: &str) -> Result<String, String> {
        self.with(|s| {
            let pod_name = s
                .pods_of_job(ns, job)
                .into_iter()
                .next()
                .ok_or_else(|| format!("no pod for {job}"))?;
            let mut pod = s.get("pods", ns, &pod_name).cloned().ok_or("no pod")?;
            let secret = pod["spec"]["volumes"]
                .as_array()
                .and_then(|v| v.iter().find_map(|v| v["secret"]["secretName"].as_str()))
                .unwrap_or("")
                .to_owned();
            if s.get("secrets", ns, &secret).is_none() {
                pod["status"] = json!({ "phase": "Pending", "containerStatuses": [{
                    "name": "agent", "ready": false, "restartCount": 0, "image": "", "imageID": "",
                    "state": { "waiting": { "reason": "CreateContainerConfigError",
                        "message": format!("secret \"{secret}\" not found") } } }] });
                s.put("pods", ns, pod, "MODIFIED");
                return Err(format!("secret {secret} not found"));
            }
            pod["status"] = json!({ "phase": "Running", "containerStatuses": [{
                "name": "agent", "ready": true, "restartCount": 0, "image": "", "imageID": "",
                "state": { "running": { "startedAt": now() } } }] });
            s.put("pods", ns, pod, "MODIFIED");
            Ok(pod_name)
        })
    }

    /// The pod cannot pull its image.
    pub fn pod_image_fails(&self, ns: &str, job: &str) {
        self.with(|s| {
            if let Some(pod_name) = s.pods_of_job(ns, job).into_iter().next()
                && let Some(mut pod) = s.get("pods", ns, &pod_name).cloned()
            {
                pod["status"] = json!({ "phase": "Pending", "containerStatuses": [{
                    "name": "agent", "ready": false, "restartCount": 0, "image": "", "imageID": "",
                    "state": { "waiting": { "reason": "ImagePullBackOff",
                        "message": "Back-off pulling image \"nowhere/agent\"" } } }] });
                s.put("pods", ns, pod, "MODIFIED");
            }
        });
    }

    /// The run prints a line.
    pub fn log(&self, ns: &str, job: &str, line: &str) {
        self.with(|s| {
            if let Some(pod) = s.pods_of_job(ns, job).into_iter().next() {
                s.logs.entry(pod.clone()).or_default().push(line.to_owned());
                s.log_times
                    .entry(pod)
                    .or_default()
                    .push(chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Nanos, true));
                s.bump();
            }
        });
    }

    /// The run's container exits with `code`, leaving `message` as its termination message.
    pub fn finish(&self, ns: &str, job: &str, code: i32, message: &str) {
        self.with(|s| {
            let Some(pod_name) = s.pods_of_job(ns, job).into_iter().next() else {
                return;
            };
            let Some(mut pod) = s.get("pods", ns, &pod_name).cloned() else {
                return;
            };
            let phase = if code == 0 { "Succeeded" } else { "Failed" };
            pod["status"] = json!({ "phase": phase, "containerStatuses": [{
                "name": "agent", "ready": false, "restartCount": 0, "image": "", "imageID": "",
                "state": { "terminated": { "exitCode": code, "reason": if code == 0 { "Completed" } else { "Error" },
                    "message": message, "finishedAt": now() } } }] });
            s.put("pods", ns, pod, "MODIFIED");
            s.job_ends(ns, job, code == 0, if code == 0 { "Completed" } else { "BackoffLimitExceeded" });
        });
    }

    /// The cluster's deadline passes (`activeDeadlineSeconds`): pods go, the Job fails.
    pub fn deadline(&self, ns: &str, job: &str) {
        self.with(|s| {
            for pod in s.pods_of_job(ns, job) {
                s.remove("pods", ns, &pod);
            }
            s.job_ends(ns, job, false, "DeadlineExceeded");
        });
    }

    /// A Job created behind the director's back (another director, a person).
    pub fn insert_job(&self, ns: &str, job: Value) {
        self.with(|s| {
            let name = job["metadata"]["name"].as_str().unwrap_or("").to_owned();
            let mut job = job;
            job["metadata"]["uid"] = json!(format!("uid-{name}"));
            s.put("jobs", ns, job, "ADDED");
            s.reconcile(ns, &name);
        });
    }
}

impl Drop for FakeKube {
    fn drop(&mut self) {
        let handle = self.handle.clone();
        tokio::spawn(async move { handle.stop(false).await });
    }
}

pub fn kubeconfig_yaml(url: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {url}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\ncurrent-context: fake\nusers:\n- name: fake\n  user: {{}}\n"
    )
}

/// `/api/v1/namespaces/{ns}/{resource}[/{name}[/log]]` and the same under `/apis/batch/v1`.
fn route(path: &str) -> Option<(String, &'static str, Option<String>, Option<String>)> {
    let rest = path
        .strip_prefix("/apis/batch/v1/namespaces/")
        .or_else(|| path.strip_prefix("/apis/networking.k8s.io/v1/namespaces/"))
        .or_else(|| path.strip_prefix("/api/v1/namespaces/"))?;
    let mut parts = rest.split('/');
    let ns = parts.next()?.to_owned();
    let resource = match parts.next()? {
        "jobs" if path.starts_with("/apis/batch/v1/") => "jobs",
        "networkpolicies" if path.starts_with("/apis/networking.k8s.io/v1/") => "networkpolicies",
        "pods" if path.starts_with("/api/v1/") => "pods",
        "secrets" if path.starts_with("/api/v1/") => "secrets",
        _ => return None,
    };
    let name = parts.next().map(str::to_owned);
    let sub = parts.next().map(str::to_owned);
    Some((ns, resource, name, sub))
}

fn verb(method: &str, name: bool, query: &BTreeMap<String, String>) -> &'static str {
    match (method, name) {
        ("POST", _) => "create",
        ("GET", false) if query.get("watch").is_some_and(|w| w == "true" || w == "1") => "watch",
        ("GET", false) => "list",
        ("GET", true) => "get",
        ("PATCH", _) => "patch",
        ("PUT", _) => "update",
        ("DELETE", _) => "delete",
        _ => "other",
    }
}

async fn handle(req: HttpRequest, body: Bytes, data: web::Data<Shared>) -> HttpResponse {
    let (state, tick) = (data.0.clone(), data.1.clone());
    let path = req.path().to_owned();
    let query_s = req.query_string().to_owned();
    let query = query_map(&query_s);
    let method = req.method().as_str().to_owned();
    let body_v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let response = {
        let mut s = state.lock().expect("lock");
        s.requests.push(Recorded {
            method: method.clone(),
            path: path.clone(),
            query: query_s.clone(),
            body: body_v.clone(),
        });
        let Some((ns, resource, name, sub)) = route(&path) else {
            return status(
                404,
                "NotFound",
                &format!("the server could not find {path}"),
            );
        };
        let (resource, kind, api_version) = resource_kind(resource);
        let v = if sub.as_deref() == Some("log") {
            "get"
        } else {
            verb(&method, name.is_some(), &query)
        };
        let rbac_resource = if sub.as_deref() == Some("log") {
            "pods/log".to_owned()
        } else {
            resource.to_owned()
        };
        if s.forbidden.contains(&(v.to_owned(), rbac_resource.clone())) {
            return status(
                403,
                "Forbidden",
                &format!(
                    "{rbac_resource} is forbidden: User \"system:serviceaccount:director:director\" cannot {v} resource \"{rbac_resource}\" in the namespace \"{ns}\""
                ),
            );
        }
        if !s.namespaces.contains(&ns) {
            if v == "list" {
                return list_response(&s, resource, &ns, kind, api_version, &query);
            }
            return status(404, "NotFound", &format!("namespaces \"{ns}\" not found"));
        }
        match (v, sub.as_deref()) {
            ("get", Some("log")) => {
                let name = name.unwrap_or_default();
                if s.get("pods", &ns, &name).is_none() {
                    return status(404, "NotFound", &format!("pods \"{name}\" not found"));
                }
                let pod = s.get("pods", &ns, &name).cloned().unwrap_or(Value::Null);
                let started = !pod["status"]["containerStatuses"][0]["state"]["waiting"]
                    .is_object()
                    && pod["status"]["containerStatuses"].is_array();
                if !started {
                    return status(
                        400,
                        "BadRequest",
                        &format!("container \"agent\" in pod \"{name}\" is waiting to start"),
                    );
                }
                let shown = Shown {
                    timestamps: query.get("timestamps").is_some_and(|t| t == "true"),
                    since: query
                        .get("sinceTime")
                        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok()),
                };
                if query.get("follow").is_some_and(|f| f == "true") {
                    // From the start, as the kubelet follows, unless a tail is asked.
                    let total = s.logs.get(&name).map_or(0, Vec::len);
                    let start = query
                        .get("tailLines")
                        .and_then(|t| t.parse::<usize>().ok())
                        .map_or(0, |tail| total.saturating_sub(tail));
                    drop(s);
                    return follow_logs(state, tick, ns, name, start, shown);
                }
                let lines: Vec<String> = s
                    .logs
                    .get(&name)
                    .cloned()
                    .unwrap_or_default()
                    .into_iter()
                    .enumerate()
                    .filter_map(|(i, l)| shown.line(&s, &name, i, l))
                    .collect();
                let tail = query
                    .get("tailLines")
                    .and_then(|t| t.parse::<usize>().ok())
                    .unwrap_or(lines.len());
                let start = lines.len().saturating_sub(tail);
                let mut text = lines[start..].join("\n");
                if !text.is_empty() {
                    text.push('\n');
                }
                HttpResponse::Ok().content_type("text/plain").body(text)
            }
            ("create", _) => create(&mut s, resource, &ns, kind, api_version, body_v, &query),
            ("list", _) => list_response(&s, resource, &ns, kind, api_version, &query),
            ("watch", _) => {
                let from = query
                    .get("resourceVersion")
                    .and_then(|r| r.parse::<u64>().ok())
                    .unwrap_or(0);
                drop(s);
                return watch(state, tick, resource, ns, query, from);
            }
            ("get", _) => {
                let name = name.unwrap_or_default();
                match s.get(resource, &ns, &name) {
                    Some(o) => HttpResponse::Ok().json(o),
                    None => status(404, "NotFound", &format!("{resource} \"{name}\" not found")),
                }
            }
            ("patch", _) => {
                let name = name.unwrap_or_default();
                let Some(mut object) = s.get(resource, &ns, &name).cloned() else {
                    return status(404, "NotFound", &format!("{resource} \"{name}\" not found"));
                };
                let content_type = req
                    .headers()
                    .get("content-type")
                    .and_then(|c| c.to_str().ok())
                    .unwrap_or("");
                if content_type != "application/merge-patch+json" {
                    return status(415, "UnsupportedMediaType", "only merge patches here");
                }
                merge(&mut object, &body_v);
                s.put(resource, &ns, object.clone(), "MODIFIED");
                if resource == "jobs" {
                    s.reconcile(&ns, &name);
                }
                let fresh = s.get(resource, &ns, &name).cloned().unwrap_or(object);
                HttpResponse::Ok().json(fresh)
            }
            ("delete", _) => {
                let name = name.unwrap_or_default();
                let Some(object) = s.remove(resource, &ns, &name) else {
                    return status(404, "NotFound", &format!("{resource} \"{name}\" not found"));
                };
                let policy = body_v["propagationPolicy"]
                    .as_str()
                    .or_else(|| query.get("propagationPolicy").map(String::as_str))
                    .unwrap_or("")
                    .to_owned();
                let uid = object["metadata"]["uid"].as_str().unwrap_or("").to_owned();
                // The garbage collector: Secrets owned by the object always go; pods of a Job
                // only with a propagation policy (the API's default for Jobs orphans them).
                // Pods it collects get their own grace period, as the garbage collector gives
                // them: they stay, terminating and running, until it has passed (a test ends
                // it with `pass_grace`).
                for (r, owned) in s.owned_by(&ns, &uid) {
                    if r != "pods" {
                        s.remove(r, &ns, &owned);
                    } else if policy == "Foreground" || policy == "Background" {
                        s.terminate_pod(&ns, &owned);
                    }
                }
                if resource == "pods"
                    && let Some(job) = object["metadata"]["labels"]["job-name"].as_str()
                {
                    let job = job.to_owned();
                    let active = s.get("jobs", &ns, &job).is_some_and(|j| {
                        !j["spec"]["suspend"].as_bool().unwrap_or(false)
                            && j["status"]["conditions"].is_null()
                    });
                    if active {
                        s.job_ends(&ns, &job, false, "BackoffLimitExceeded");
                    }
                }
                HttpResponse::Ok().json(json!({
                    "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                    "details": { "name": name, "kind": resource },
                }))
            }
            _ => status(405, "MethodNotAllowed", "not here"),
        }
    };
    let rv = state.lock().expect("lock").rv;
    tick.send_replace(rv);
    response
}

fn list_response(
    s: &State,
    resource: &'static str,
    ns: &str,
    kind: &str,
    api_version: &str,
    query: &BTreeMap<String, String>,
) -> HttpResponse {
    let items: Vec<Value> = s
        .objects
        .iter()
        .filter(|((r, n, _), o)| *r == resource && n == ns && matches(o, query))
        .map(|(_, o)| o.clone())
        .collect();
    HttpResponse::Ok().json(json!({
        "kind": format!("{kind}List"), "apiVersion": api_version,
        "metadata": { "resourceVersion": s.rv.to_string() },
        "items": items,
    }))
}

fn create(
    s: &mut State,
    resource: &'static str,
    ns: &str,
    kind: &'static str,
    api_version: &str,
    mut object: Value,
    query: &BTreeMap<String, String>,
) -> HttpResponse {
    if object["kind"] != kind || object["apiVersion"] != api_version {
        return status(
            400,
            "BadRequest",
            "kind or apiVersion does not match the route",
        );
    }
    let Some(name) = object["metadata"]["name"].as_str().map(str::to_owned) else {
        return status(422, "Invalid", "metadata.name: Required value");
    };
    let valid = match resource {
        "jobs" => serde_json::from_value::<k8s_openapi::api::batch::v1::Job>(object.clone())
            .map(|_| ())
            .map_err(|e| e.to_string())
            .and_then(|()| {
                object["spec"]["template"]["spec"]["containers"]
                    .as_array()
                    .filter(|c| !c.is_empty())
                    .map(|_| ())
                    .ok_or_else(|| "spec.template.spec.containers: Required value".to_owned())
            }),
        "secrets" => serde_json::from_value::<k8s_openapi::api::core::v1::Secret>(object.clone())
            .map(|_| ())
            .map_err(|e| e.to_string()),
        "networkpolicies" => serde_json::from_value::<
            k8s_openapi::api::networking::v1::NetworkPolicy,
        >(object.clone())
        .map(|_| ())
        .map_err(|e| e.to_string()),
        _ => Ok(()),
    };
    if let Err(e) = valid {
        return status(422, "Invalid", &e);
    }
    if s.get(resource, ns, &name).is_some() {
        return status(
            409,
            "AlreadyExists",
            &format!("{resource}.batch \"{name}\" already exists"),
        );
    }
    object["metadata"]["namespace"] = json!(ns);
    object["metadata"]["uid"] = json!(format!("uid-{resource}-{name}-{}", s.rv));
    object["metadata"]["creationTimestamp"] = json!(now());
    if query.get("dryRun").is_some_and(|d| d == "All") {
        return HttpResponse::Created().json(object);
    }
    s.put(resource, ns, object, "ADDED");
    if resource == "jobs" {
        s.reconcile(ns, &name);
    }
    HttpResponse::Created().json(s.get(resource, ns, &name).cloned().unwrap_or(Value::Null))
}

/// A watch stream: every change after `from` that matches, then each new one as it comes.
fn watch(
    state: Arc<Mutex<State>>,
    tick: Arc<tokio::sync::watch::Sender<u64>>,
    resource: &'static str,
    ns: String,
    query: BTreeMap<String, String>,
    from: u64,
) -> HttpResponse {
    let rx = tick.subscribe();
    let stream =
        futures_util::stream::unfold((state, rx, from), move |(state, mut rx, mut cursor)| {
            let ns = ns.clone();
            let query = query.clone();
            async move {
                loop {
                    let next = {
                        let s = state.lock().expect("lock");
                        s.changes
                            .iter()
                            .find(|c| {
                                c.rv > cursor
                                    && c.resource == resource
                                    && c.namespace == ns
                                    && matches(&c.object, &query)
                            })
                            .cloned()
                    };
                    if let Some(c) = next {
                        cursor = c.rv;
                        let line = format!("{}\n", json!({ "type": c.kind, "object": c.object }));
                        return Some((
                            Ok::<_, actix_web::Error>(Bytes::from(line)),
                            (state, rx, cursor),
                        ));
                    }
                    if rx.changed().await.is_err() {
                        return None;
                    }
                }
            }
        });
    HttpResponse::Ok()
        .content_type("application/json")
        .streaming(stream)
}

/// How a log request asked to see its lines: with their timestamps, from a time.
#[derive(Clone, Copy)]
struct Shown {
    timestamps: bool,
    since: Option<chrono::DateTime<chrono::FixedOffset>>,
}

impl Shown {
    /// Line `i` of `pod`'s log as asked, or `None` when it is before `sinceTime` (which, as
    /// the kubelet's, counts in whole seconds).
    fn line(&self, s: &State, pod: &str, i: usize, line: String) -> Option<String> {
        let at = s
            .log_times
            .get(pod)
            .and_then(|t| t.get(i))
            .cloned()
            .unwrap_or_default();
        if let Some(since) = self.since {
            let written = chrono::DateTime::parse_from_rfc3339(&at).ok()?;
            if written.timestamp() < since.timestamp() {
                return None;
            }
        }
        Some(if self.timestamps {
            format!("{at} {line}")
        } else {
            line
        })
    }
}

/// A followed pod log: from line `start`, then each new line, until the container ends.
fn follow_logs(
    state: Arc<Mutex<State>>,
    tick: Arc<tokio::sync::watch::Sender<u64>>,
    ns: String,
    pod: String,
    start: usize,
    shown: Shown,
) -> HttpResponse {
    let rx = tick.subscribe();
    let stream =
        futures_util::stream::unfold((state, rx, start), move |(state, mut rx, mut sent)| {
            let (ns, pod) = (ns.clone(), pod.clone());
            async move {
                loop {
                    let (line, ended) = {
                        let s = state.lock().expect("lock");
                        let line = s.logs.get(&pod).and_then(|l| l.get(sent)).cloned();
                        let line = line.map(|l| shown.line(&s, &pod, sent, l));
                        let ended = s.get("pods", &ns, &pod).is_none_or(|p| {
                            p["status"]["containerStatuses"][0]["state"]["terminated"].is_object()
                        });
                        (line, ended)
                    };
                    if let Some(line) = line {
                        sent += 1;
                        // Before `sinceTime`: not shown.
                        let Some(line) = line else { continue };
                        return Some((
                            Ok::<_, actix_web::Error>(Bytes::from(format!("{line}\n"))),
                            (state, rx, sent),
                        ));
                    }
                    if ended || rx.changed().await.is_err() {
                        return None;
                    }
                }
            }
        });
    HttpResponse::Ok()
        .content_type("text/plain")
        .streaming(stream)
}
