//! A repository's own run settings, `.director.toml` on its default branch, and the
//! operator's ceiling over them, `[repo_settings]`. The file is read as a run starts; what it
//! may set is what `allow` names, images and egress destinations must fit the operator's
//! globs, and budgets and timeouts are capped at the operator's. A file that oversteps, or
//! does not parse, starts no run: [`resolve`] says which key and why.

use serde::{Deserialize, Serialize};

use super::{BudgetSettings, RunnerSettings, SettingsError, invalid, lenient};
use crate::domain::RunSettings;

/// The file, at the root of the default branch.
pub const FILE: &str = ".director.toml";
/// The largest file read.
pub const MAX_BYTES: u64 = 64 * 1024;

/// The keys a repository may be allowed to set.
pub const KEYS: &[&str] = &[
    "runner.image",
    "runner.agent",
    "runner.egress_allow",
    "runner.timeout_secs",
    "runner.branch_template",
    "budget.run_usd",
    "task.instructions",
    "setup",
    "checks",
];

/// The longest a setup phase may take when `[setup]` names no `timeout_secs`.
pub const SETUP_TIMEOUT_SECS: u64 = 900;

/// `[repo_settings]`: what a repository's `.director.toml` may set. Empty `allow` (the
/// default): nothing, and the file is not read.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RepoSettingsCeiling {
    /// Which of [`KEYS`] a repository may set.
    #[serde(deserialize_with = "lenient::list")]
    pub allow: Vec<String>,
    /// Globs (`*` any run of characters, `?` one) of the images a repository may name.
    #[serde(deserialize_with = "lenient::list")]
    pub images: Vec<String>,
    /// Globs of the `host:port` entries a repository may add to its runs' egress allow-list.
    #[serde(deserialize_with = "lenient::list")]
    pub egress_allow_max: Vec<String>,
    /// The agents of `[agents]` a repository may choose (`runner.agent`), by name.
    #[serde(deserialize_with = "lenient::list")]
    pub agents: Vec<String>,
    /// Globs of the `host:port` entries a repository's `[setup]` may reach (beyond the run's
    /// own allow-list), for its setup phase alone.
    #[serde(deserialize_with = "lenient::list")]
    pub setup_egress_allow_max: Vec<String>,
}

impl RepoSettingsCeiling {
    /// Whether repositories may set anything (and so whether the file is read at all).
    pub fn enabled(&self) -> bool {
        !self.allow.is_empty()
    }

    fn allows(&self, key: &str) -> bool {
        self.allow.iter().any(|k| k == key)
    }

    pub(super) fn validate(&self) -> Result<(), SettingsError> {
        for key in &self.allow {
            if !KEYS.contains(&key.as_str()) {
                return Err(invalid(
                    "repo_settings.allow",
                    format!(
                        "`{key}` is not a repository setting (known: {})",
                        KEYS.join(", ")
                    ),
                ));
            }
        }
        for (key, globs) in [
            ("repo_settings.images", &self.images),
            ("repo_settings.egress_allow_max", &self.egress_allow_max),
            (
                "repo_settings.setup_egress_allow_max",
                &self.setup_egress_allow_max,
            ),
        ] {
            if globs.iter().any(|g| g.trim().is_empty()) {
                return Err(invalid(key, "an empty glob matches nothing; remove it"));
            }
        }
        Ok(())
    }

    /// What in this ceiling cannot work as the operator likely meant.
    pub fn warnings(&self, egress_confined: bool) -> Vec<String> {
        let mut out = Vec::new();
        if self.allows("runner.image") && self.images.is_empty() {
            out.push("repo_settings.allow names runner.image but repo_settings.images is empty: every image a repository names is refused".to_owned());
        }
        if self.allows("runner.agent") && self.agents.is_empty() {
            out.push("repo_settings.allow names runner.agent but repo_settings.agents is empty: every agent a repository names is refused".to_owned());
        }
        if self.allows("runner.egress_allow") && self.egress_allow_max.is_empty() {
            out.push("repo_settings.allow names runner.egress_allow but repo_settings.egress_allow_max is empty: every destination a repository adds is refused".to_owned());
        }
        if self.allows("runner.egress_allow") && !egress_confined {
            out.push("repo_settings.allow names runner.egress_allow but runs have open egress (runner.egress): a repository's entries change nothing".to_owned());
        }
        out
    }
}

/// The file as written: every key optional, an unknown one an error (a typo must not fall
/// back to the operator's value unnoticed).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RepoFile {
    #[serde(default)]
    runner: RunnerPart,
    #[serde(default)]
    budget: BudgetPart,
    #[serde(default)]
    task: TaskPart,
    #[serde(default)]
    preflight: PreflightPart,
    setup: Option<SetupPart>,
    checks: Option<super::checks::ChecksSettings>,
}

/// `[setup]` of the file: the phase that prepares the workspace before the agent.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SetupPart {
    command: Option<String>,
    #[serde(default)]
    egress_allow: Vec<String>,
    #[serde(default)]
    secrets: Vec<String>,
    #[serde(default)]
    cache_key: Vec<String>,
    timeout_secs: Option<u64>,
}

/// `[preflight]` of the file: only what makes the operator's stricter.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PreflightPart {
    approval: Option<crate::domain::approval::Approval>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RunnerPart {
    image: Option<String>,
    agent: Option<String>,
    egress_allow: Option<Vec<String>>,
    timeout_secs: Option<u64>,
    branch_template: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct BudgetPart {
    run_usd: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TaskPart {
    instructions: Option<String>,
}

/// What the operator's own settings say, that a repository may only lower.
#[derive(Clone, Debug)]
pub struct Operator {
    pub ceiling: RepoSettingsCeiling,
    /// `preflight.approval`: a repository may only make it stricter.
    pub approval: crate::domain::approval::Approval,
    pub image: String,
    pub timeout_secs: u64,
    /// 0: no run budget.
    pub run_usd: f64,
    /// `[setup_secrets]` by name: the globs of the repositories that may ask for each.
    pub setup_secrets: std::collections::BTreeMap<String, Vec<String>>,
    /// The operator's own `[checks]`, checked: what a repository without its own gets.
    pub checks: Option<crate::domain::checks::ChecksDecl>,
}

impl Operator {
    pub fn new(
        ceiling: &RepoSettingsCeiling,
        runner: &RunnerSettings,
        budget: &BudgetSettings,
        approval: crate::domain::approval::Approval,
    ) -> Self {
        Self {
            ceiling: ceiling.clone(),
            approval,
            image: runner.image.clone(),
            timeout_secs: runner.timeout_secs,
            run_usd: budget.run_usd,
            setup_secrets: std::collections::BTreeMap::new(),
            checks: None,
        }
    }

    /// With the operator's `[checks]` (already validated at start-up).
    pub fn with_checks(mut self, checks: Option<&super::checks::ChecksSettings>) -> Self {
        self.checks =
            checks.and_then(|c| super::checks::decl(c, self.timeout_secs, &mut Vec::new()).ok());
        self
    }

    /// With the operator's `[setup_secrets]`: each one's name and the globs of the
    /// repositories that may ask for it (never its value).
    pub fn with_setup_secrets(
        mut self,
        secrets: impl IntoIterator<Item = (String, Vec<String>)>,
    ) -> Self {
        self.setup_secrets = secrets.into_iter().collect();
        self
    }

    /// What in `settings`' setup `repo` may not have: each secret it names must be offered to
    /// it by its `[setup_secrets]` entry's `repos`.
    pub fn setup_problems(
        &self,
        repo: &crate::domain::RepoName,
        settings: &RunSettings,
    ) -> Vec<String> {
        let Some(setup) = &settings.setup else {
            return Vec::new();
        };
        let name = repo.to_string();
        setup
            .secrets
            .iter()
            .filter(|s| {
                !self
                    .setup_secrets
                    .get(*s)
                    .is_some_and(|globs| globs.iter().any(|g| glob(g, &name)))
            })
            .map(|s| {
                format!(
                    "`setup.secrets` `{s}` is not offered to {name} (the operator's setup_secrets.{s}.repos)"
                )
            })
            .collect()
    }
}

/// The settings a run gets from `text`, the file at `commit` (`None`: there is none), or
/// every reason it gets none, each naming its key. A run is started only on `Ok`.
pub fn resolve(
    operator: &Operator,
    commit: &str,
    text: Option<&[u8]>,
) -> Result<RunSettings, Vec<String>> {
    let mut out = RunSettings {
        commit: commit.to_owned(),
        file: text.is_some(),
        checks: operator.checks.clone(),
        ..RunSettings::default()
    };
    let Some(text) = text else {
        return Ok(out);
    };
    if text.len() as u64 > MAX_BYTES {
        return Err(vec![format!(
            "`{FILE}` is {} bytes; the director reads at most {MAX_BYTES}",
            text.len()
        )]);
    }
    let text =
        std::str::from_utf8(text).map_err(|_| vec![format!("`{FILE}` is not UTF-8 text")])?;
    let file: RepoFile = toml::from_str(text).map_err(|e| vec![parse_error(&e)])?;
    let mut problems = Vec::new();
    let file = permitted(&operator.ceiling, file, &mut problems);
    runner_part(operator, file.runner, &mut out, &mut problems);
    if let Some(usd) = file.budget.run_usd {
        if !usd.is_finite() || usd <= 0.0 {
            problems.push("`budget.run_usd` must be a positive number of dollars".to_owned());
        } else if operator.run_usd > 0.0 && usd > operator.run_usd {
            out.capped.push(format!(
                "budget.run_usd {usd} is capped at the operator's {}",
                operator.run_usd
            ));
        } else {
            out.run_usd = Some(usd);
        }
    }
    // Approval may only be made stricter, so a repository needs no permission to ask for it.
    if let Some(approval) = file.preflight.approval {
        if approval > operator.approval {
            out.approval = Some(approval);
        } else if approval < operator.approval {
            out.capped.push(format!(
                "preflight.approval \"{}\" is less strict than the operator's \"{}\", which holds",
                approval.as_str(),
                operator.approval.as_str()
            ));
        }
    }
    if let Some(setup) = file.setup {
        out.setup = setup_part(operator, setup, &mut out.capped, &mut problems);
    }
    if let Some(checks) = &file.checks {
        match super::checks::decl(checks, operator.timeout_secs, &mut out.capped) {
            Ok(d) => out.checks = Some(d),
            Err(p) => problems.extend(p),
        }
    }
    if let Some(text) = file.task.instructions {
        let text = text.trim();
        if !text.is_empty() {
            out.instructions = Some(text.to_owned());
        }
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(problems)
    }
}

/// The file without the keys the operator's `repo_settings.allow` does not name, each one
/// set named in `problems`.
fn permitted(
    ceiling: &RepoSettingsCeiling,
    mut file: RepoFile,
    problems: &mut Vec<String>,
) -> RepoFile {
    fn keep<T>(
        ceiling: &RepoSettingsCeiling,
        key: &str,
        value: &mut Option<T>,
        problems: &mut Vec<String>,
    ) {
        if value.is_some() && !ceiling.allows(key) {
            problems.push(format!(
                "`{key}` may not be set by a repository here (the operator's repo_settings.allow does not name it)"
            ));
            *value = None;
        }
    }
    let r = &mut file.runner;
    keep(ceiling, "runner.image", &mut r.image, problems);
    keep(ceiling, "runner.agent", &mut r.agent, problems);
    keep(
        ceiling,
        "runner.egress_allow",
        &mut r.egress_allow,
        problems,
    );
    keep(
        ceiling,
        "runner.timeout_secs",
        &mut r.timeout_secs,
        problems,
    );
    keep(
        ceiling,
        "runner.branch_template",
        &mut r.branch_template,
        problems,
    );
    keep(
        ceiling,
        "budget.run_usd",
        &mut file.budget.run_usd,
        problems,
    );
    let instructions = &mut file.task.instructions;
    keep(ceiling, "task.instructions", instructions, problems);
    keep(ceiling, "setup", &mut file.setup, problems);
    keep(ceiling, "checks", &mut file.checks, problems);
    file
}

/// `[setup]` of the file within the operator's ceiling: a command, hosts within
/// `repo_settings.setup_egress_allow_max`, secrets the operator holds, cache-key paths inside
/// the repository, a time limit capped at the run's.
fn setup_part(
    operator: &Operator,
    s: SetupPart,
    capped: &mut Vec<String>,
    problems: &mut Vec<String>,
) -> Option<crate::domain::setup::SetupDecl> {
    let before = problems.len();
    let command = s.command.unwrap_or_default().trim().to_owned();
    if command.is_empty() {
        problems.push("`setup.command` is missing or empty".to_owned());
    } else if command.len() > 4096 || command.contains('\0') {
        problems.push("`setup.command` is longer than 4096 bytes or holds a NUL".to_owned());
    }
    let mut egress_allow = Vec::new();
    for entry in s.egress_allow {
        match entry.parse::<crate::egress::Entry>() {
            Err(why) => problems.push(format!("`setup.egress_allow`: {why}")),
            Ok(e) => {
                let e = e.to_string();
                if operator
                    .ceiling
                    .setup_egress_allow_max
                    .iter()
                    .any(|g| glob(g, &e))
                {
                    egress_allow.push(e);
                } else {
                    problems.push(format!(
                        "`setup.egress_allow` `{e}` is outside what the operator allows (repo_settings.setup_egress_allow_max)"
                    ));
                }
            }
        }
    }
    for name in &s.secrets {
        if !operator.setup_secrets.contains_key(name) {
            problems.push(format!(
                "`setup.secrets` `{name}` is not a secret the operator holds (setup_secrets)"
            ));
        }
    }
    for path in &s.cache_key {
        let bad = path.is_empty()
            || path.starts_with('/')
            || path.split('/').any(|p| p == ".." || p == ".")
            || path.contains('\0');
        if bad {
            problems.push(format!(
                "`setup.cache_key` `{path}` is not a relative path inside the repository"
            ));
        }
    }
    if s.cache_key.len() > 16 {
        problems.push("`setup.cache_key` names more than 16 files".to_owned());
    }
    let mut timeout_secs = s.timeout_secs.unwrap_or(SETUP_TIMEOUT_SECS);
    if timeout_secs == 0 {
        problems.push("`setup.timeout_secs` must be at least 1".to_owned());
    } else if timeout_secs > operator.timeout_secs {
        capped.push(format!(
            "setup.timeout_secs {timeout_secs} is capped at the operator's runner.timeout_secs {}",
            operator.timeout_secs
        ));
        timeout_secs = operator.timeout_secs;
    }
    (problems.len() == before).then_some(crate::domain::setup::SetupDecl {
        command,
        egress_allow,
        secrets: s.secrets,
        cache_key: s.cache_key,
        timeout_secs,
    })
}

/// `[runner]` of the file, each value within what the operator allows: the image, the
/// agent, egress destinations, the time limit and the branch template.
fn runner_part(
    operator: &Operator,
    r: RunnerPart,
    out: &mut RunSettings,
    problems: &mut Vec<String>,
) {
    let ceiling = &operator.ceiling;
    if let Some(name) = r.image {
        let name = name.trim().to_owned();
        if name.is_empty() {
            problems.push("`runner.image` is empty".to_owned());
        } else if !ceiling.images.iter().any(|g| glob(g, &name)) {
            problems.push(format!(
                "`runner.image` `{name}` is not among the images the operator allows (repo_settings.images)"
            ));
        } else {
            out.image = Some(name);
        }
    }
    if let Some(name) = r.agent {
        let name = name.trim().to_owned();
        if ceiling.agents.iter().any(|a| a.trim() == name) {
            out.agent = Some(name);
        } else {
            let allowed: Vec<String> = ceiling
                .agents
                .iter()
                .map(|a| format!("`{}`", a.trim()))
                .collect();
            problems.push(format!(
                "`runner.agent` `{name}` is not among the agents the operator allows repositories (repo_settings.agents: {})",
                if allowed.is_empty() { "none".to_owned() } else { allowed.join(", ") }
            ));
        }
    }
    for entry in r.egress_allow.into_iter().flatten() {
        match entry.parse::<crate::egress::Entry>() {
            Err(why) => problems.push(format!("`runner.egress_allow`: {why}")),
            Ok(e) => {
                let e = e.to_string();
                if ceiling.egress_allow_max.iter().any(|g| glob(g, &e)) {
                    out.egress_allow.push(e);
                } else {
                    problems.push(format!(
                        "`runner.egress_allow` `{e}` is outside what the operator allows (repo_settings.egress_allow_max)"
                    ));
                }
            }
        }
    }
    if let Some(secs) = r.timeout_secs {
        if secs == 0 {
            problems.push("`runner.timeout_secs` must be at least 1".to_owned());
        } else if secs > operator.timeout_secs {
            out.capped.push(format!(
                "runner.timeout_secs {secs} is capped at the operator's {}",
                operator.timeout_secs
            ));
        } else {
            out.timeout_secs = Some(secs);
        }
    }
    if let Some(template) = r.branch_template {
        match crate::domain::run::check_branch_template(&template) {
            Ok(()) => out.branch_template = Some(template),
            Err(why) => problems.push(format!("`runner.branch_template` {why}")),
        }
    }
}

/// A TOML error in one line: which key or line, and why (an unknown key is named).
fn parse_error(e: &toml::de::Error) -> String {
    let message = e.message().trim().replace('\n', " ");
    format!("`{FILE}` does not parse: {message}")
}

/// Whether `text` matches `pattern`: `*` any run of characters (`/` and `:` included), `?`
/// one character, anything else itself.
pub fn glob(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.trim().chars().collect();
    let t: Vec<char> = text.chars().collect();
    // The classic two-pointer match with one backtrack point: linear in practice.
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn operator(allow: &[&str]) -> Operator {
        Operator {
            approval: crate::domain::approval::Approval::OverForecast,
            ceiling: RepoSettingsCeiling {
                allow: allow.iter().map(|s| (*s).to_owned()).collect(),
                images: vec!["registry.example.org/agents/*".into()],
                egress_allow_max: vec![
                    "*.mirror.example.org:443".into(),
                    "pypi.internal:443".into(),
                ],
                agents: vec!["aider".into(), "claude-code".into()],
                setup_egress_allow_max: vec!["pypi.internal:443".into()],
            },
            image: "registry.example.org/agents/default:1".into(),
            timeout_secs: 3_600,
            run_usd: 5.0,
            setup_secrets: std::collections::BTreeMap::from([(
                "PIP_TOKEN".to_owned(),
                vec!["acme/*".to_owned()],
            )]),
            checks: None,
        }
    }

    #[test]
    fn a_repositorys_checks_replace_the_operators_only_where_allowed() {
        let mut op = operator(&["checks"]);
        op.checks = Some(crate::domain::checks::ChecksDecl {
            commands: vec!["make check".into()],
            timeout_secs: 60,
            junit: Vec::new(),
        });
        let own =
            resolve(&op, "c1", Some(b"[checks]\ncommands = [\"sh test.sh\"]\n")).expect("allowed");
        assert_eq!(own.checks.expect("checks").commands, vec!["sh test.sh"]);
        let none = resolve(&op, "c1", Some(b"")).expect("no [checks]");
        assert_eq!(
            none.checks.expect("the operator's").commands,
            vec!["make check"]
        );
        let refused = resolve(
            &operator(&[]),
            "c1",
            Some(b"[checks]\ncommands = [\"x\"]\n"),
        )
        .expect_err("not allowed");
        assert!(
            refused[0].contains("`checks` may not be set"),
            "{refused:?}"
        );
        let empty = resolve(&op, "c1", Some(b"[checks]\ncommands = []\n")).expect_err("empty");
        assert!(empty[0].contains("`checks.commands`"), "{empty:?}");
        let outside = resolve(
            &op,
            "c1",
            Some(b"[checks]\ncommands = [\"x\"]\njunit = [\"../../etc/x.xml\"]\n"),
        )
        .expect_err("outside");
        assert!(outside[0].contains("`checks.junit`"), "{outside:?}");
    }

    fn all() -> Operator {
        operator(KEYS)
    }

    #[test]
    fn globs_match_whole_names_with_stars_and_question_marks() {
        assert!(glob(
            "registry.example.org/agents/*",
            "registry.example.org/agents/rust:1"
        ));
        assert!(!glob(
            "registry.example.org/agents/*",
            "evil.org/registry.example.org/agents/x"
        ));
        assert!(glob(
            "*.mirror.example.org:443",
            "pkg.mirror.example.org:443"
        ));
        assert!(!glob(
            "*.mirror.example.org:443",
            "pkg.mirror.example.org:4433"
        ));
        assert!(!glob("*.mirror.example.org:443", "mirror.example.org:443"));
        assert!(glob("node:2?", "node:22"));
        assert!(!glob("node:2?", "node:2"));
        assert!(glob("a*b*c", "aXbYbZc"));
        assert!(!glob("a*b*c", "aXbYbZ"));
    }

    #[test]
    fn no_file_gives_the_operators_settings_with_the_commit_recorded() {
        let s = resolve(&all(), "abc", None).expect("ok");
        assert_eq!(s.commit, "abc");
        assert!(!s.file);
        assert_eq!(s.image, None);
    }

    #[test]
    fn a_file_within_the_ceiling_sets_each_key() {
        let text = br#"
[runner]
image = "registry.example.org/agents/rust:1.95"
egress_allow = ["crates.mirror.example.org:443"]
timeout_secs = 600
branch_template = "agent-{issue}-{run}"

[budget]
run_usd = 1.5

[task]
instructions = "Run `cargo test` before pushing."
"#;
        let s = resolve(&all(), "abc", Some(text)).expect("ok");
        assert_eq!(
            s.image.as_deref(),
            Some("registry.example.org/agents/rust:1.95")
        );
        assert_eq!(s.egress_allow, ["crates.mirror.example.org:443"]);
        assert_eq!(s.timeout_secs, Some(600));
        assert_eq!(s.run_usd, Some(1.5));
        assert_eq!(
            s.instructions.as_deref(),
            Some("Run `cargo test` before pushing.")
        );
        assert!(s.capped.is_empty());
    }

    #[test]
    fn larger_budgets_and_timeouts_are_capped_at_the_operators() {
        let text = b"[runner]\ntimeout_secs = 7200\n[budget]\nrun_usd = 50\n";
        let s = resolve(&all(), "abc", Some(text)).expect("ok");
        assert_eq!(s.timeout_secs, None);
        assert_eq!(s.run_usd, None);
        assert_eq!(s.capped.len(), 2, "{:?}", s.capped);
        assert!(s.capped[0].contains("3600"));
    }

    #[test]
    fn a_repository_cannot_set_what_the_operator_did_not_allow() {
        let text = b"[runner]\nimage = \"registry.example.org/agents/rust:1\"\n";
        let problems =
            resolve(&operator(&["task.instructions"]), "abc", Some(text)).expect_err("refused");
        assert_eq!(problems.len(), 1);
        assert!(
            problems[0].contains("`runner.image` may not be set"),
            "{problems:?}"
        );
    }

    #[test]
    fn an_image_or_destination_outside_the_ceiling_is_refused_by_name() {
        let text = br#"
[runner]
image = "docker.io/someone/agent:latest"
egress_allow = ["evil.example.com:443", "pypi.internal:443", "127.0.0.1:5432", "nope"]
"#;
        let problems = resolve(&all(), "abc", Some(text)).expect_err("refused");
        let all = problems.join("\n");
        assert!(
            all.contains("`runner.image` `docker.io/someone/agent:latest`"),
            "{all}"
        );
        assert!(all.contains("`evil.example.com:443` is outside"), "{all}");
        assert!(all.contains("`127.0.0.1:5432` is outside"), "{all}");
        assert!(all.contains("`nope` is not host:port"), "{all}");
        assert!(!all.contains("pypi.internal"), "{all}");
    }

    #[test]
    fn unknown_keys_bad_toml_and_oversized_files_are_refused_with_the_reason() {
        let typo = resolve(&all(), "abc", Some(b"[runner]\nimgae = \"x\"\n")).expect_err("typo");
        assert!(typo[0].contains("unknown field `imgae`"), "{typo:?}");
        let section = resolve(&all(), "abc", Some(b"[secrets]\nx = 1\n")).expect_err("section");
        assert!(
            section[0].contains("unknown field `secrets`"),
            "{section:?}"
        );
        let broken = resolve(&all(), "abc", Some(b"[runner\n")).expect_err("broken");
        assert!(broken[0].contains("does not parse"), "{broken:?}");
        let big = vec![b'#'; 64 * 1024 + 1];
        let too_big = resolve(&all(), "abc", Some(&big)).expect_err("big");
        assert!(too_big[0].contains("at most 65536"), "{too_big:?}");
        let binary = resolve(&all(), "abc", Some(&[0xff, 0xfe])).expect_err("binary");
        assert!(binary[0].contains("not UTF-8"), "{binary:?}");
    }

    #[test]
    fn a_bad_branch_template_or_a_nonsense_budget_is_refused() {
        let text = b"[runner]\nbranch_template = \"main\"\n[budget]\nrun_usd = -1\n";
        let problems = resolve(&all(), "abc", Some(text)).expect_err("refused");
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("`runner.branch_template` must contain {run}"));
        assert!(problems[1].contains("positive"));
    }

    #[test]
    fn the_ceiling_knows_only_the_repository_keys() {
        let mut c = RepoSettingsCeiling {
            allow: vec!["runner.command".into()],
            ..Default::default()
        };
        assert!(c.validate().is_err());
        c.allow = vec!["runner.image".into()];
        assert!(c.validate().is_ok());
        assert_eq!(c.warnings(true).len(), 1);
    }

    #[test]
    fn a_repository_chooses_among_the_agents_the_operator_allows() {
        let text = b"[runner]\nagent = \"aider\"\n";
        let s = resolve(&operator(&["runner.agent"]), "c0ffee", Some(text)).expect("usable");
        assert_eq!(s.agent.as_deref(), Some("aider"));
        let text = b"[runner]\nagent = \"gpt-engineer\"\n";
        let problems =
            resolve(&operator(&["runner.agent"]), "c0ffee", Some(text)).expect_err("refused");
        assert!(
            problems[0].contains("`runner.agent` `gpt-engineer` is not among the agents")
                && problems[0].contains("`aider`, `claude-code`"),
            "{problems:?}"
        );
        let text = b"[runner]\nagent = \"aider\"\n";
        let problems = resolve(&operator(&[]), "c0ffee", Some(text)).expect_err("refused");
        assert!(
            problems[0].contains("`runner.agent` may not be set"),
            "{problems:?}"
        );
    }

    #[test]
    fn a_repository_may_make_approval_stricter_without_permission_never_laxer() {
        use crate::domain::approval::Approval;
        let text = b"[preflight]\napproval = \"always\"\n";
        let s = resolve(&operator(&["task.instructions"]), "c0ffee", Some(text)).expect("usable");
        assert_eq!(s.approval, Some(Approval::Always));
        let text = b"[preflight]\napproval = \"never\"\n";
        let s = resolve(&operator(&["task.instructions"]), "c0ffee", Some(text)).expect("usable");
        assert_eq!(s.approval, None);
        assert!(s.capped[0].contains("less strict"), "{:?}", s.capped);
        let text = b"[preflight]\napproval = \"sometimes\"\n";
        let problems =
            resolve(&operator(&["task.instructions"]), "c0ffee", Some(text)).expect_err("refused");
        assert!(problems[0].contains("does not parse"), "{problems:?}");
    }

    #[test]
    fn a_setup_within_the_ceiling_is_kept_whole() {
        let text = br#"
[setup]
command = "pip install -r requirements.txt"
egress_allow = ["pypi.internal:443"]
secrets = ["PIP_TOKEN"]
cache_key = ["requirements.txt"]
timeout_secs = 7200
"#;
        let s = resolve(&all(), "abc", Some(text)).expect("usable");
        let setup = s.setup.clone().expect("setup");
        assert_eq!(setup.command, "pip install -r requirements.txt");
        assert_eq!(setup.egress_allow, ["pypi.internal:443"]);
        assert_eq!(setup.secrets, ["PIP_TOKEN"]);
        assert_eq!(setup.cache_key, ["requirements.txt"]);
        assert_eq!(setup.timeout_secs, 3_600, "capped at the run's");
        assert!(s.capped[0].contains("setup.timeout_secs"), "{:?}", s.capped);
        let repo: crate::domain::RepoName = "acme/web".parse().expect("repo");
        assert!(all().setup_problems(&repo, &s).is_empty());
        let other: crate::domain::RepoName = "evil/web".parse().expect("repo");
        let problems = all().setup_problems(&other, &s);
        assert!(
            problems[0].contains("`setup.secrets` `PIP_TOKEN` is not offered to evil/web"),
            "{problems:?}"
        );
    }

    #[test]
    fn a_setup_outside_the_ceiling_is_refused_with_each_key_named() {
        let text = br#"
[setup]
command = " "
egress_allow = ["evil.example.com:443"]
secrets = ["AWS_SECRET"]
cache_key = ["../etc/passwd", "/abs"]
"#;
        let problems = resolve(&all(), "abc", Some(text)).expect_err("refused");
        let said = problems.join("\n");
        assert!(said.contains("`setup.command` is missing"), "{said}");
        assert!(
            said.contains("`setup.egress_allow` `evil.example.com:443` is outside"),
            "{said}"
        );
        assert!(
            said.contains("`setup.secrets` `AWS_SECRET` is not a secret"),
            "{said}"
        );
        assert!(said.contains("`setup.cache_key` `../etc/passwd`"), "{said}");
        assert!(said.contains("`setup.cache_key` `/abs`"), "{said}");
        let text = b"[setup]\ncommand = \"make deps\"\n";
        let problems =
            resolve(&operator(&["task.instructions"]), "abc", Some(text)).expect_err("refused");
        assert!(
            problems[0].contains("`setup` may not be set"),
            "{problems:?}"
        );
        let typo = resolve(&all(), "abc", Some(b"[setup]\ncomand = \"x\"\n")).expect_err("typo");
        assert!(typo[0].contains("unknown field `comand`"), "{typo:?}");
    }
}
