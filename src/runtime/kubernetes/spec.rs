//! What a run is on Kubernetes, as the API is given it: its Job (suspended, one pod, no
//! retry, hardened), the Secret that holds its task and variables, and the NetworkPolicy of a
//! confined run. Built from the run's spec alone; `super` creates, starts and watches them.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use serde_json::json;

use super::{CONTAINER, KubeRuntime, TASK_KEY, TERMINATION_LOG, job_name, label_value};
use crate::runtime::{RUN_LABEL, RunSpec, RuntimeError};
use crate::settings::numeric_user;

impl KubeRuntime {
    /// The NetworkPolicy of a confined run's pod: no ingress; egress only to the director's
    /// pods on the proxy's and the git gateway's ports. No DNS: a recursive resolver would carry any name out
    /// (`<secret>.attacker.example`), and a run that reaches the outside only through the
    /// proxy needs none (it is given the proxy's address, and the proxy resolves). Owned by
    /// the Job.
    pub fn network_policy(
        &self,
        spec: &RunSpec,
        job_uid: &str,
    ) -> Result<NetworkPolicy, RuntimeError> {
        let name = job_name(&spec.run_id);
        let director_ns = if self.settings.proxy_namespace.is_empty() {
            self.namespace.clone()
        } else {
            self.settings.proxy_namespace.clone()
        };
        let director_pods: BTreeMap<String, String> = self
            .settings
            .proxy_pod_labels
            .iter()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
            .collect();
        // A sealed pod (a check of a run's head) gets no egress rule at all: nothing, not
        // even the director's pods.
        let egress = if spec.labels.contains_key(crate::runtime::SEALED_LABEL) {
            json!([])
        } else {
            json!([
                {
                    "to": [{
                        "namespaceSelector": { "matchLabels": { "kubernetes.io/metadata.name": director_ns } },
                        "podSelector": { "matchLabels": director_pods },
                    }],
                    "ports": [
                        { "protocol": "TCP", "port": self.runner.egress_proxy_port },
                        { "protocol": "TCP", "port": self.runner.git_gateway_port },
                        { "protocol": "TCP", "port": self.runner.model_gateway_port },
                    ],
                },
            ])
        };
        let policy = json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "labels": Self::labels(spec),
                "ownerReferences": [{
                    "apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": job_uid,
                    "blockOwnerDeletion": true,
                }],
            },
            "spec": {
                "podSelector": { "matchLabels": { RUN_LABEL: label_value(spec.run_id.as_str()) } },
                "policyTypes": ["Ingress", "Egress"],
                "ingress": [],
                "egress": egress,
            },
        });
        serde_json::from_value(policy)
            .map_err(|e| RuntimeError::Engine(format!("building the run's NetworkPolicy: {e}")))
    }

    /// The labels a run's Job and pod carry: the spec's, made label-safe.
    pub(super) fn labels(spec: &RunSpec) -> BTreeMap<String, String> {
        spec.labels
            .iter()
            .map(|(k, v)| (k.clone(), label_value(v)))
            .chain([(RUN_LABEL.to_owned(), label_value(spec.run_id.as_str()))])
            .collect()
    }

    /// The Job of a run: suspended, one pod, no retry, the deadline and the hardening.
    pub fn job(&self, spec: &RunSpec) -> Result<Job, RuntimeError> {
        let r = &self.runner;
        let (uid, gid) = numeric_user(&r.user).ok_or_else(|| {
            RuntimeError::Engine(format!("runner.user `{}` is not a numeric uid:gid", r.user))
        })?;
        let name = job_name(&spec.run_id);
        let labels = Self::labels(spec);
        let task_dir = std::path::Path::new(&spec.task_path)
            .parent()
            .map_or_else(|| "/task".to_owned(), |p| p.display().to_string());
        let task_file = std::path::Path::new(&spec.task_path)
            .file_name()
            .and_then(|f| f.to_str())
            .unwrap_or(TASK_KEY);
        let limits = json!({
            "memory": format!("{}Mi", r.memory_mb),
            "cpu": format!("{}m", (r.cpus * 1000.0).round().max(1.0) as u64),
        });
        let mut container = json!({
            "name": CONTAINER,
            "image": spec.image,
            "workingDir": r.workspace,
            // Each variable by name, its value from the Secret (never `envFrom`: the task
            // file's key would become a variable where names are relaxed).
            "env": spec.env.iter().map(|(k, _)| json!({
                "name": k,
                "valueFrom": { "secretKeyRef": { "name": name, "key": k } },
            })).collect::<Vec<_>>(),
            "resources": { "limits": limits, "requests": limits },
            "securityContext": {
                "runAsNonRoot": true,
                "runAsUser": uid,
                "runAsGroup": gid,
                "allowPrivilegeEscalation": false,
                "privileged": false,
                "readOnlyRootFilesystem": r.read_only_rootfs,
                "capabilities": { "drop": ["ALL"] },
                "seccompProfile": { "type": "RuntimeDefault" },
            },
            "volumeMounts": [
                { "name": "workspace", "mountPath": r.workspace },
                { "name": "tmp", "mountPath": crate::runtime::TMP_DIR },
                { "name": "task", "mountPath": task_dir, "readOnly": true },
            ],
            "terminationMessagePath": TERMINATION_LOG,
            "terminationMessagePolicy": "File",
        });
        if !spec.command.is_empty() {
            // Docker's `cmd`: the image's entry point stays, its default arguments do not.
            container["args"] = json!(spec.command);
        }
        let mut pod = json!({
            "restartPolicy": "Never",
            "automountServiceAccountToken": false,
            "enableServiceLinks": false,
            "terminationGracePeriodSeconds": r.stop_grace_secs,
            "securityContext": {
                "runAsNonRoot": true,
                "runAsUser": uid,
                "runAsGroup": gid,
                "fsGroup": gid,
                "seccompProfile": { "type": "RuntimeDefault" },
            },
            "containers": [container],
            "volumes": [
                { "name": "workspace", "emptyDir": { "sizeLimit": format!("{}Mi", r.workspace_mb) } },
                // In memory, counted in the container's limit, as Docker's tmpfs is.
                { "name": "tmp", "emptyDir": { "medium": "Memory", "sizeLimit": format!("{}Mi", r.tmp_mb()) } },
                { "name": "task", "secret": {
                    "secretName": name,
                    "items": [{ "key": TASK_KEY, "path": task_file, "mode": 0o444 }],
                    "defaultMode": 0o444,
                } },
            ],
        });
        if !self.settings.service_account.is_empty() {
            pod["serviceAccountName"] = json!(self.settings.service_account);
        }
        // A sandbox runtime (gVisor, Kata) through the cluster's RuntimeClass.
        if !r.runtime_class_name.is_empty() {
            pod["runtimeClassName"] = json!(r.runtime_class_name);
        }
        let job = json!({
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": { "name": name, "namespace": self.namespace, "labels": labels },
            "spec": {
                "suspend": true,
                "backoffLimit": 0,
                // A backstop: the director stops the run itself at `timeout_secs` (keeping its
                // log tail); the cluster ends it should the director be away then.
                "activeDeadlineSeconds": r.timeout_secs.max(1) + r.stop_grace_secs + 60,
                "ttlSecondsAfterFinished": self.settings.ttl_secs_after_finished,
                "template": { "metadata": { "labels": labels }, "spec": pod },
            },
        });
        serde_json::from_value(job)
            .map_err(|e| RuntimeError::Engine(format!("building the run's Job: {e}")))
    }

    /// The run's Secret: its environment, one key per variable, and the task file; owned by
    /// the Job (`uid`), so it goes when the Job goes.
    pub fn secret(&self, spec: &RunSpec, job_uid: &str) -> Result<Secret, RuntimeError> {
        let name = job_name(&spec.run_id);
        let mut data: BTreeMap<String, ByteString> = spec
            .env
            .iter()
            .map(|(k, v)| (k.clone(), ByteString(v.clone().into_bytes())))
            .collect();
        data.insert(TASK_KEY.to_owned(), ByteString(spec.task.clone()));
        let secret = json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "labels": Self::labels(spec),
                "ownerReferences": [{
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": name,
                    "uid": job_uid,
                    "blockOwnerDeletion": true,
                }],
            },
        });
        let mut secret: Secret = serde_json::from_value(secret)
            .map_err(|e| RuntimeError::Engine(format!("building the run's Secret: {e}")))?;
        secret.data = Some(data);
        Ok(secret)
    }
}
