//! What a run's Job and pod say of it: ended (and how), suspended, never started, stuck
//! (an image that cannot be pulled, a pod that cannot be scheduled), running, its exit code.
//! Pure readings of the objects the API answers with.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;

use super::CONTAINER;

/// How a Job ended, when it has.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum JobEnd {
    Complete,
    DeadlineExceeded,
    Failed,
}

pub(super) fn job_end(job: &Job) -> Option<JobEnd> {
    let conditions = job.status.as_ref()?.conditions.as_ref()?;
    conditions
        .iter()
        .filter(|c| c.status == "True")
        .find_map(|c| match (c.type_.as_str(), c.reason.as_deref()) {
            ("Complete", _) => Some(JobEnd::Complete),
            ("Failed", Some("DeadlineExceeded")) => Some(JobEnd::DeadlineExceeded),
            ("Failed", _) => Some(JobEnd::Failed),
            _ => None,
        })
}

pub(super) fn job_suspended(job: &Job) -> bool {
    job.spec.as_ref().and_then(|s| s.suspend).unwrap_or(false)
}

pub(super) fn job_never_started(job: &Job) -> bool {
    job_suspended(job)
        && job
            .status
            .as_ref()
            .and_then(|s| s.start_time.as_ref())
            .is_none()
}

/// The run container's status in its pod.
pub(super) fn agent_status(pod: &Pod) -> Option<&k8s_openapi::api::core::v1::ContainerStatus> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == CONTAINER)
}

pub(super) fn exit_code(pod: &Pod) -> Option<i64> {
    let terminated = agent_status(pod)?.state.as_ref()?.terminated.as_ref()?;
    Some(i64::from(terminated.exit_code))
}

/// Why a pod's container cannot start, when it never will without a person: an image that
/// cannot be pulled, or a configuration the kubelet refuses.
pub(super) fn stuck(pod: &Pod) -> Option<String> {
    let waiting = agent_status(pod)?.state.as_ref()?.waiting.as_ref()?;
    let reason = waiting.reason.as_deref()?;
    matches!(
        reason,
        "ErrImagePull"
            | "ImagePullBackOff"
            | "InvalidImageName"
            | "CreateContainerConfigError"
            | "CreateContainerError"
    )
    .then(|| match waiting.message.as_deref() {
        Some(m) if !m.is_empty() => format!("{reason}: {m}"),
        _ => reason.to_owned(),
    })
}

pub(super) fn running(pod: &Pod) -> bool {
    agent_status(pod)
        .and_then(|s| s.state.as_ref())
        .is_some_and(|s| s.running.is_some())
}
