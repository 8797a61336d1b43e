//! The runs' sandbox runtime (`runner.oci_runtime`, `runner.runtime_class_name`) and the hosts
//! a writer may approve in the thread (`runner.egress_approvable`): their keys checked.

use super::*;

impl Settings {
    pub(super) fn validate_sandbox(&self) -> Result<(), SettingsError> {
        let r = &self.runner;
        let name_ok = |n: &str| {
            n.len() <= 253
                && n.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        };
        if !r.oci_runtime.is_empty() {
            if r.kind != RunnerKind::Docker {
                return Err(invalid(
                    "runner.oci_runtime",
                    "names a Docker engine's runtime; on Kubernetes set runner.runtime_class_name",
                ));
            }
            if !name_ok(&r.oci_runtime) {
                return Err(invalid(
                    "runner.oci_runtime",
                    format!(
                        "`{}` is not a runtime name (letters, digits, `-`, `_`, `.`)",
                        r.oci_runtime
                    ),
                ));
            }
        }
        if !r.runtime_class_name.is_empty() {
            if r.kind != RunnerKind::Kubernetes {
                return Err(invalid(
                    "runner.runtime_class_name",
                    "names a Kubernetes RuntimeClass; on Docker set runner.oci_runtime",
                ));
            }
            if !is_dns_subdomain(&r.runtime_class_name) {
                return Err(invalid(
                    "runner.runtime_class_name",
                    format!("`{}` is not a RuntimeClass name", r.runtime_class_name),
                ));
            }
        }
        for glob in &r.egress_approvable {
            crate::egress::approvable::Glob::parse(glob)
                .map_err(|e| invalid("runner.egress_approvable", e))?;
        }
        if !r.egress_approvable.is_empty() && !self.egress_confined() {
            return Err(invalid(
                "runner.egress_approvable",
                "applies to allow-listed runs (runner.egress = \"allowlist\"): open runs reach whatever their network gives them",
            ));
        }
        if !(self.budget.max_continue_usd.is_finite() && self.budget.max_continue_usd >= 0.0) {
            return Err(invalid(
                "budget.max_continue_usd",
                "must be a number of dollars, 0 or more",
            ));
        }
        Ok(())
    }

    /// The sandbox runtime runs get, for the status and the reports: `runsc`, `gvisor`;
    /// `None`: the engine's or the cluster's default.
    pub fn sandbox_runtime(&self) -> Option<String> {
        let r = &self.runner;
        let name = match r.kind {
            RunnerKind::Docker => &r.oci_runtime,
            RunnerKind::Kubernetes => &r.runtime_class_name,
        };
        (!name.is_empty()).then(|| name.clone())
    }
}
