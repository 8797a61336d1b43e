//! The run's container: the egress proxy and gateways as the run sees them, the variables of
//! the run contract, the chosen agent's profile, the image and command.

use std::collections::HashMap;
use std::sync::Arc;

use super::{GATEWAY_PASSWORD_VAR, MODEL_KEY_VARS, RunAct, TASK_PATH, agent};
use crate::domain::RunId;
use crate::domain::RunRecord;
use crate::forge::RunEndpoints;
use crate::runtime::{RUN_LABEL, RunSpec};
use crate::settings::Secret;

/// The egress proxy as runs see it.
#[derive(Clone)]
pub struct RunEgress {
    pub proxy: Arc<crate::egress::proxy::Proxy>,
    /// The name or address runs reach the proxy (and the git gateway) by.
    pub host: String,
    /// The git gateway runs clone and push through, and its port.
    pub gateway: Arc<crate::git_gateway::Gateway>,
    pub gateway_port: u16,
    /// The model gateway runs call `[models]` through, and its port, when any provider is
    /// configured.
    pub models: Option<(Arc<crate::models::ModelGateway>, u16)>,
}

impl RunEgress {
    /// The proxy variables of a run, upper and lower case (tools read either).
    pub fn environment(&self, run_id: &RunId) -> Vec<(String, String)> {
        let url = self.proxy.url_for(run_id, &self.host);
        let mut env = Vec::new();
        for name in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"] {
            env.push((name.to_owned(), url.clone()));
            env.push((name.to_ascii_lowercase(), url.clone()));
        }
        // Only the git gateway is reached directly (it is not a destination the proxy
        // forwards to): the forge itself may be on this machine's loopback.
        let direct = self
            .host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        env.push(("NO_PROXY".to_owned(), direct.clone()));
        env.push(("no_proxy".to_owned(), direct));
        env
    }

    /// `http://host:port` of the git gateway, as runs reach it.
    pub fn gateway_origin(&self) -> String {
        self.origin(self.gateway_port)
    }

    fn origin(&self, port: u16) -> String {
        if self.host.contains(':') && !self.host.starts_with('[') {
            format!("http://[{}]:{}", self.host, port)
        } else {
            format!("http://{}:{}", self.host, port)
        }
    }

    /// The model variables of a run: for each provider (of `only`, when it names any), the
    /// gateway as its base URL and the run's own key (never the provider's).
    pub fn model_environment(&self, run_id: &RunId, only: &[String]) -> Vec<(String, String)> {
        let Some((models, port)) = &self.models else {
            return Vec::new();
        };
        let origin = self.origin(*port);
        let key = models.key_of(run_id);
        let mut env = Vec::new();
        for provider in models.providers() {
            if !only.is_empty() && !only.iter().any(|p| p == provider.as_str()) {
                continue;
            }
            let (base, key_var) = match provider {
                crate::models::Provider::Anthropic => ("ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY"),
                crate::models::Provider::Openai => ("OPENAI_BASE_URL", "OPENAI_API_KEY"),
            };
            env.push((base.to_owned(), format!("{origin}/{}", provider.as_str())));
            env.push((key_var.to_owned(), key.clone()));
        }
        env
    }
}

impl RunAct {
    /// The author of a run's commits: `runner.git_author_*`, else the forge's default (the
    /// runner account and its no-reply address on Forgejo, the App's bot on GitHub).
    fn git_identity(&self, endpoints: &RunEndpoints) -> (String, String) {
        let name = match self.settings.git_author_name.trim() {
            "" => endpoints.author.0.clone(),
            n => n.to_owned(),
        };
        let email = match self.settings.git_author_email.trim() {
            "" => endpoints.author.1.clone(),
            e => e.to_owned(),
        };
        (name, email)
    }

    pub(super) fn spec(
        &self,
        run: &RunRecord,
        token: &Secret,
        task: String,
        endpoints: &RunEndpoints,
    ) -> RunSpec {
        let repo = run.repo.to_string();
        let mut env = vec![
            ("DIRECTOR_RUN_ID".to_owned(), run.id.to_string()),
            ("DIRECTOR_REPO".to_owned(), repo.clone()),
            ("DIRECTOR_ISSUE".to_owned(), run.number.to_string()),
            ("DIRECTOR_BASE_BRANCH".to_owned(), run.base_branch.clone()),
            ("DIRECTOR_BRANCH".to_owned(), run.branch.clone()),
            ("DIRECTOR_TASK_FILE".to_owned(), TASK_PATH.to_owned()),
            (
                "DIRECTOR_RESULT_FILE".to_owned(),
                self.runtime.result_path().to_owned(),
            ),
            ("HOME".to_owned(), self.settings.workspace.clone()),
            ("TMPDIR".to_owned(), crate::runtime::TMP_DIR.to_owned()),
        ];
        env.extend(self.git_environment(run, token, endpoints));
        if let Some(f) = &run.followup {
            env.push(("DIRECTOR_PR".to_owned(), f.pr.to_string()));
            env.push((
                "DIRECTOR_START_HEAD".to_owned(),
                f.start_head.clone().unwrap_or_default(),
            ));
        }
        env.extend(self.secrets.passthrough.iter().cloned());
        let profile = self.profile(run.agent.as_ref());
        if let (Some(chosen), Some(profile)) = (&run.agent, profile) {
            let own = agent::profile_environment(chosen, profile);
            env.retain(|(k, _)| !own.iter().any(|(o, _)| o == k));
            env.extend(own);
        }
        let providers: &[String] = profile.map_or(&[], |p| &p.providers);
        let confined = self.confined_environment(run, providers, &mut env);
        let labels = HashMap::from([
            (RUN_LABEL.to_owned(), run.id.to_string()),
            ("director.repo".to_owned(), repo),
            ("director.issue".to_owned(), run.number.to_string()),
        ]);
        RunSpec {
            run_id: run.id.clone(),
            image: run
                .settings
                .as_ref()
                .and_then(|s| s.image.clone())
                .or_else(|| profile.map(|p| p.image.clone()))
                .unwrap_or_else(|| self.settings.image.clone()),
            command: profile.map_or_else(|| self.settings.command.clone(), |p| p.command.clone()),
            env,
            labels,
            task_path: TASK_PATH.to_owned(),
            task: task.into_bytes(),
            mounts: self.mounts.clone(),
            result_path: Some(self.runtime.result_path().to_owned()),
            confined,
            workspace_volume: None,
            setup_phase: false,
        }
    }
    /// How git in the run reaches the repository: through the git gateway with the run's
    /// own credential (confined), or the forge itself with the run's token (open egress).
    fn git_environment(
        &self,
        run: &RunRecord,
        token: &Secret,
        endpoints: &RunEndpoints,
    ) -> Vec<(String, String)> {
        let repo = run.repo.to_string();
        let (name, email) = self.git_identity(endpoints);
        let mut env = Vec::new();
        match &self.egress {
            // Confined: git goes through the director's gateway with the run's own
            // credential, which nothing but the gateway takes; the forge token stays here.
            Some(Ok(egress)) => {
                let origin = egress.gateway_origin();
                let password = egress.gateway.password(&run.id);
                self.secrets.remember(&run.id, &password);
                env.push((
                    "DIRECTOR_CLONE_URL".to_owned(),
                    format!("{origin}/{repo}.git"),
                ));
                env.push((GATEWAY_PASSWORD_VAR.to_owned(), password));
                env.extend(crate::domain::run::git_environment(
                    &origin,
                    &format!("run-{}", run.id),
                    GATEWAY_PASSWORD_VAR,
                    &name,
                    &email,
                ));
            }
            // Open egress: the run talks to the forge itself, with its token.
            _ => {
                env.push(("DIRECTOR_CLONE_URL".to_owned(), endpoints.clone_url.clone()));
                env.push(("DIRECTOR_API_URL".to_owned(), endpoints.api_url.clone()));
                env.push(("DIRECTOR_TOKEN".to_owned(), token.expose().to_owned()));
                env.extend(crate::domain::run::git_environment(
                    &endpoints.git_origin,
                    &endpoints.git_user,
                    "DIRECTOR_TOKEN",
                    &name,
                    &email,
                ));
            }
        }
        env
    }

    /// A confined run's proxy and model gateway in its environment (the providers' variables
    /// replace whatever else held those names); `false` for open egress.
    fn confined_environment(
        &self,
        run: &RunRecord,
        providers: &[String],
        env: &mut Vec<(String, String)>,
    ) -> bool {
        match &self.egress {
            Some(Ok(egress)) => {
                self.secrets
                    .remember(&run.id, &egress.proxy.password(&run.id));
                env.extend(egress.environment(&run.id));
                // The providers' variables name the model gateway and the run's own key;
                // whatever else held those names (a pass-through) gives way.
                let models = egress.model_environment(&run.id, providers);
                for (k, v) in &models {
                    if MODEL_KEY_VARS.contains(&k.as_str()) {
                        self.secrets.remember(&run.id, v);
                    }
                }
                env.retain(|(k, _)| !models.iter().any(|(m, _)| m == k));
                env.extend(models);
                true
            }
            _ => false,
        }
    }
}
