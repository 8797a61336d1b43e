//! The git gateway: runs clone from and push to the forge through the director, holding no
//! forge credential. It speaks git's smart HTTP (protocol v0 and v2 for fetches; pushes are
//! always v0) on the runs' network, beside the egress proxy.
//!
//! - **Who asks.** `run-<run id>` with a password that is an HMAC of the run id under the
//!   key the egress proxy's credentials come from (kept in the database), so any replica
//!   checks it and nothing is registered per run. Only an active run's credential is
//!   taken, and only for its own repository.
//!   A run's setup phase has a credential of its own, `setup-<run id>`, taken only for
//!   fetches and only while the setup is under way: the setup cannot push.
//!   So have the director's checks of its pushed head (`checks-<run id>`): fetches only,
//!   only while the run has exited and its checks have no outcome.
//! - **Fetches** are forwarded to the forge with the run's token, which the director holds.
//! - **Pushes** are checked first, and nothing of a refused push reaches the forge: every
//!   ref update must be the run's own branch (created or updated by a first run,
//!   fast-forwarded by a follow-up), never a tag, another ref or a delete; no commit may
//!   change a protected path ([`rules`]); the pack is capped. The commits are inspected
//!   with git in a quarantine beside a mirror of the forge's branches ([`inspect`]). A
//!   refusal is answered in git's own protocol (`! [remote rejected] <ref> (<why>)`),
//!   recorded for the run's report and counted in `director_git_pushes_refused_total`.

pub mod disk;
pub mod inspect;
pub mod pkt;
pub mod request;
pub mod rules;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use actix_web::http::StatusCode;
use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use base64::Engine as _;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use tokio_util::sync::CancellationToken;

use crate::domain::protected::Protected;
use crate::domain::{RepoName, RunId};
use crate::settings::Secret;
use inspect::{Expect, Mirrors, Quarantine, Upstream};
use pkt::Push;

/// How a refused push is kept among the run's egress refusals (its report lists them apart):
/// `git push <ref>: <why>`.
pub const REFUSAL_PREFIX: &str = "git push ";

/// The largest fetch request body (wants and haves) the gateway takes.
const MAX_FETCH_REQUEST: usize = 32 * 1024 * 1024;
/// The largest ref advertisement it reads from the forge to restrict.
const MAX_ADVERTISEMENT: usize = 64 * 1024 * 1024;

/// What the gateway needs of an active run.
pub struct RunAccess {
    pub repo: RepoName,
    /// Where the run's branch lives and its git is forwarded to: `repo`, or its fork.
    pub home: RepoName,
    pub branch: String,
    pub base_branch: String,
    /// A follow-up run: its branch exists and only fast-forwards.
    pub follow_up: bool,
    /// The base's head when a first run started: its branch must descend from it.
    pub base_commit: Option<crate::domain::CommitSha>,
    /// Its setup phase is under way: the setup's own (fetch-only) credential is taken.
    pub setup_open: bool,
    /// Its head's checks are under way: the checks' own (fetch-only) credential is taken.
    pub checks_open: bool,
    /// The repository's git URL on the forge.
    pub upstream: String,
    /// `scheme://host:port` of `upstream`.
    pub origin: String,
    /// The user git sends with the token.
    pub user: String,
    pub token: Secret,
}

/// Where the gateway learns about runs and leaves what it refused (the store and the runs'
/// tokens, in the director).
#[async_trait::async_trait]
pub trait Runs: Send + Sync {
    /// The run, if it exists and has not ended; `Err` when it cannot be said now.
    async fn access(&self, run_id: &RunId) -> Result<Option<RunAccess>, String>;
    /// Records refusals: (run id, what) → how many.
    async fn add_refusals(&self, refusals: &BTreeMap<(RunId, String), u32>);
}

pub struct Gateway {
    key: Vec<u8>,
    runs: Arc<dyn Runs>,
    protected: Protected,
    max_push: usize,
    mirrors: Mirrors,
    client: reqwest::Client,
    refused: Option<prometheus::IntCounterVec>,
    requests: request::Budget,
}

/// The gateway's settings.
pub struct Config {
    pub protected_paths: Vec<String>,
    pub max_push_mb: u64,
    /// The longest one git command may take.
    pub git_timeout: std::time::Duration,
    /// Request bodies' memory, time and per-run count, shared with the model gateway.
    pub requests: request::Budget,
    /// Where the mirrors of the forge's repositories and the pushes' quarantines are kept
    /// (emptied at start: a cache of one process).
    pub cache_dir: std::path::PathBuf,
    /// The most they may take on disk, in MB.
    pub disk_mb: u64,
}

impl Gateway {
    pub fn new(
        key: Vec<u8>,
        runs: Arc<dyn Runs>,
        config: Config,
        refused: Option<prometheus::IntCounterVec>,
    ) -> Result<Arc<Self>, String> {
        let protected = Protected::new(&config.protected_paths)
            .map_err(|e| format!("runner.protected_paths: {e}"))?;
        let client = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(10))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("the gateway's HTTP client: {e}"))?;
        // A restarted container's process has the same pid, and finds its predecessor's.
        let _ = std::fs::remove_dir_all(&config.cache_dir);
        std::fs::create_dir_all(&config.cache_dir)
            .map_err(|e| format!("{}: {e}", config.cache_dir.display()))?;
        Ok(Arc::new(Self {
            key,
            runs,
            protected,
            max_push: usize::try_from(config.max_push_mb.saturating_mul(1024 * 1024))
                .unwrap_or(usize::MAX),
            mirrors: Mirrors::new(config.cache_dir, config.git_timeout, config.disk_mb),
            client,
            refused,
            requests: config.requests,
        }))
    }

    /// The password of `run-<run_id>`.
    pub fn password(&self, run_id: &RunId) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(self.mac(Phase::Run, run_id).finalize().into_bytes())
    }

    /// The password of `setup-<run_id>`: fetches only, while the run's setup is under way.
    pub fn setup_password(&self, run_id: &RunId) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(self.mac(Phase::Setup, run_id).finalize().into_bytes())
    }

    /// The password of `checks-<run_id>`: fetches only, while the run's checks are under way
    /// (the director's own fetch step before the sealed check containers).
    pub fn checks_password(&self, run_id: &RunId) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(self.mac(Phase::Checks, run_id).finalize().into_bytes())
    }

    fn verify(&self, phase: Phase, run_id: &RunId, password: &str) -> bool {
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(password)
            .is_ok_and(|given| self.mac(phase, run_id).verify_slice(&given).is_ok())
    }

    fn mac(&self, phase: Phase, run_id: &RunId) -> Hmac<Sha256> {
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.key)
            .expect("HMAC takes a key of any length");
        mac.update(match phase {
            Phase::Run => b"git-gateway\0".as_slice(),
            Phase::Setup => b"git-gateway-setup\0".as_slice(),
            Phase::Checks => b"git-gateway-checks\0".as_slice(),
        });
        mac.update(run_id.as_str().as_bytes());
        mac
    }

    /// Serves on `listener` until `shutdown`.
    pub fn serve(
        self: &Arc<Self>,
        listener: std::net::TcpListener,
        shutdown: CancellationToken,
    ) -> std::io::Result<SocketAddr> {
        let addr = listener.local_addr()?;
        let data = web::Data::from(self.clone());
        let server = HttpServer::new(move || {
            App::new()
                .app_data(data.clone())
                .app_data(web::PayloadConfig::new(usize::MAX))
                .default_service(web::to(handle))
        })
        .workers(2)
        .disable_signals()
        .shutdown_timeout(5)
        .listen(listener)?
        .run();
        let handle = server.handle();
        tokio::spawn(server);
        let gateway = self.clone();
        tokio::spawn(async move {
            shutdown.cancelled().await;
            handle.stop(true).await;
            // The mirrors are this process's cache only.
            gateway.mirrors.remove();
        });
        Ok(addr)
    }

    fn count(&self, reason: &str) {
        if let Some(c) = &self.refused {
            c.with_label_values(&[reason]).inc();
        }
    }
}

/// The three endpoints of git's smart HTTP.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    InfoRefs,
    UploadPack,
    ReceivePack,
}

fn endpoint(path: &str) -> Option<(RepoName, Endpoint)> {
    let path = path.strip_prefix('/')?;
    let (repo, end) = if let Some(r) = path.strip_suffix("/info/refs") {
        (r, Endpoint::InfoRefs)
    } else if let Some(r) = path.strip_suffix("/git-upload-pack") {
        (r, Endpoint::UploadPack)
    } else if let Some(r) = path.strip_suffix("/git-receive-pack") {
        (r, Endpoint::ReceivePack)
    } else {
        return None;
    };
    let repo = repo.strip_suffix(".git").unwrap_or(repo);
    Some((repo.parse().ok()?, end))
}

fn text(status: StatusCode, message: &str) -> HttpResponse {
    HttpResponse::build(status)
        .content_type("text/plain; charset=utf-8")
        .insert_header(("Cache-Control", "no-cache"))
        .body(format!("{message}\n"))
}

/// Whose credential a request carries: the run's, or its setup phase's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Run,
    Setup,
    Checks,
}

/// The run a request's Basic credentials name, checked, and whose they are.
fn credentials(gw: &Gateway, req: &HttpRequest) -> Option<(RunId, Phase)> {
    let value = req.headers().get("Authorization")?.to_str().ok()?;
    let encoded = value.strip_prefix("Basic ")?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let decoded = String::from_utf8(decoded).ok()?;
    let (user, password) = decoded.split_once(':')?;
    let (id, phase) = if let Some(id) = user.strip_prefix("run-") {
        (id, Phase::Run)
    } else if let Some(id) = user.strip_prefix("setup-") {
        (id, Phase::Setup)
    } else if let Some(id) = user.strip_prefix("checks-") {
        (id, Phase::Checks)
    } else {
        return None;
    };
    let run_id = RunId::parse(id).ok()?;
    gw.verify(phase, &run_id, password)
        .then_some((run_id, phase))
}

/// Why a phase's credential is not taken now: the setup's once the setup ended, the checks'
/// outside the run's checks.
fn phase_closed(phase: Phase, setup_open: bool, checks_open: bool) -> Option<&'static str> {
    match phase {
        Phase::Setup if !setup_open => Some("the run's setup has ended"),
        Phase::Checks if !checks_open => Some("the run's checks are not under way"),
        _ => None,
    }
}

/// The refusal counted when a fetch-only phase (setup, checks) asks to push.
fn phase_push(phase: Phase, end: Endpoint, query: &str) -> Option<&'static str> {
    let pushing = end == Endpoint::ReceivePack
        || end == Endpoint::InfoRefs && query != "service=git-upload-pack";
    match phase {
        Phase::Setup if pushing => Some("setup_push"),
        Phase::Checks if pushing => Some("checks_push"),
        _ => None,
    }
}

async fn handle(req: HttpRequest, payload: web::Payload, gw: web::Data<Gateway>) -> HttpResponse {
    let Some((repo, end)) = endpoint(req.path()) else {
        return text(StatusCode::NOT_FOUND, "not a git repository path");
    };
    let method_ok = match end {
        Endpoint::InfoRefs => req.method() == actix_web::http::Method::GET,
        _ => req.method() == actix_web::http::Method::POST,
    };
    if !method_ok {
        return text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed");
    }
    let Some((run_id, phase)) = credentials(&gw, &req) else {
        return HttpResponse::Unauthorized()
            .insert_header(("WWW-Authenticate", "Basic realm=\"director git gateway\""))
            .body("a run's credentials are required\n");
    };
    // Held until the answer is made: one run's parallel requests are capped, and before
    // anything is looked up for it (the store, the forge), so a run that floods the gateway
    // waits on its own slots alone.
    let _slot = match gw.requests.slot(&run_id) {
        Ok(slot) => slot,
        Err(refused) => {
            gw.count("busy");
            return refusal(&gw, &refused);
        }
    };
    let run = match gw.runs.access(&run_id).await {
        Ok(Some(run)) => run,
        Ok(None) => return text(StatusCode::FORBIDDEN, "the run has ended"),
        Err(e) => {
            tracing::warn!(run_id = %run_id, error = %e, "the gateway cannot look up a run");
            return text(
                StatusCode::SERVICE_UNAVAILABLE,
                "the director cannot say now",
            );
        }
    };
    if let Some(why) = phase_closed(phase, run.setup_open, run.checks_open) {
        return text(StatusCode::FORBIDDEN, why);
    }
    if !run.repo.to_string().eq_ignore_ascii_case(&repo.to_string()) {
        return text(StatusCode::NOT_FOUND, "repository not found");
    }
    if let Some(reason) = phase_push(phase, end, req.query_string()) {
        gw.count(reason);
        return text(
            StatusCode::FORBIDDEN,
            "the setup and checks phases cannot push",
        );
    }
    match end {
        Endpoint::InfoRefs => {
            if req.query_string() == "service=git-upload-pack" {
                warm(gw.clone().into_inner(), &run);
            }
            info_refs(&gw, &req, &run).await
        }
        Endpoint::UploadPack => upload_pack(&gw, &req, payload, &run_id, &run).await,
        Endpoint::ReceivePack => receive_pack(&gw, &req, payload, &run_id, &run).await,
    }
}

/// Syncs the repository's mirror in the background: the run fetching now will likely push.
fn warm(gw: Arc<Gateway>, run: &RunAccess) {
    let (repo, url, origin, user, token) = (
        run.home.clone(),
        run.upstream.clone(),
        run.origin.clone(),
        run.user.clone(),
        run.token.clone(),
    );
    let (base, branch) = (run.base_branch.clone(), run.branch.clone());
    tokio::spawn(async move {
        let upstream = Upstream {
            url: &url,
            base: &base,
            branch: &branch,
            origin: &origin,
            user: &user,
            token: token.expose(),
        };
        gw.mirrors.warm(&repo, &upstream).await;
    });
}

/// A request the gateway did not read, answered in plain words.
fn refusal(gw: &Gateway, refused: &request::Refused) -> HttpResponse {
    let (status, why) = refused.answer(gw.requests.max_per_run());
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    let mut answer = text(status, &why);
    if matches!(
        refused,
        request::Refused::NoRoom | request::Refused::Busy | request::Refused::OverShare
    ) {
        answer
            .headers_mut()
            .insert(actix_web::http::header::RETRY_AFTER, 5.into());
    }
    answer
}

fn forward_headers(req: &HttpRequest, mut to: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
    for name in [
        "Git-Protocol",
        "Content-Type",
        "Content-Encoding",
        "Accept",
        "User-Agent",
    ] {
        if let Some(v) = req.headers().get(name).and_then(|v| v.to_str().ok()) {
            to = to.header(name, v);
        }
    }
    to
}

/// The forge's answer, streamed back as it comes.
fn relay(resp: reqwest::Response) -> HttpResponse {
    let status = StatusCode::from_u16(resp.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let mut out = HttpResponse::build(status);
    for name in ["Content-Type", "Cache-Control", "Expires", "Pragma"] {
        if let Some(v) = resp.headers().get(name).and_then(|v| v.to_str().ok()) {
            out.insert_header((name, v.to_owned()));
        }
    }
    out.streaming(resp.bytes_stream())
}

fn unreachable_forge(e: &reqwest::Error) -> HttpResponse {
    // reqwest's message names the URL, which carries no credential.
    tracing::warn!(error = %e, "the gateway could not reach the forge");
    text(StatusCode::BAD_GATEWAY, "the forge could not be reached")
}

async fn info_refs(gw: &Gateway, req: &HttpRequest, run: &RunAccess) -> HttpResponse {
    let service = req.query_string();
    let push = match service {
        "service=git-upload-pack" => false,
        "service=git-receive-pack" => true,
        _ => return text(StatusCode::FORBIDDEN, "only smart HTTP is served"),
    };
    let url = format!("{}/info/refs?{service}", run.upstream);
    let resp = forward_headers(req, gw.client.get(url))
        .basic_auth(&run.user, Some(run.token.expose()))
        .send()
        .await;
    let resp = match resp {
        Ok(r) => r,
        Err(e) => return unreachable_forge(&e),
    };
    if !push || !resp.status().is_success() {
        return relay(resp);
    }
    let content_type = resp
        .headers()
        .get("Content-Type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/x-git-receive-pack-advertisement")
        .to_owned();
    if resp
        .content_length()
        .is_some_and(|n| n > MAX_ADVERTISEMENT as u64)
    {
        return text(StatusCode::BAD_GATEWAY, "the forge's ref list is too large");
    }
    let bytes = match resp.bytes().await {
        Ok(b) => b,
        Err(e) => return unreachable_forge(&e),
    };
    let keep = [
        format!("refs/heads/{}", run.base_branch),
        format!("refs/heads/{}", run.branch),
    ];
    match pkt::restrict_advertisement(&bytes, &keep) {
        Ok(body) => HttpResponse::Ok()
            .content_type(content_type)
            .insert_header(("Cache-Control", "no-cache"))
            .body(body),
        Err(e) => {
            tracing::warn!(error = %e, "the forge's receive-pack advertisement does not read");
            text(StatusCode::BAD_GATEWAY, "the forge's answer does not read")
        }
    }
}

async fn upload_pack(
    gw: &Gateway,
    req: &HttpRequest,
    payload: web::Payload,
    run_id: &RunId,
    run: &RunAccess,
) -> HttpResponse {
    let (data, _room) = match gw
        .requests
        .read(run_id, payload, request::declared(req), MAX_FETCH_REQUEST)
        .await
    {
        Ok((d, false, room)) => (d, room),
        Ok((_, true, _)) => {
            return text(
                StatusCode::PAYLOAD_TOO_LARGE,
                "the fetch request is too large",
            );
        }
        Err(refused) => return refusal(gw, &refused),
    };
    let url = format!("{}/git-upload-pack", run.upstream);
    match forward_headers(req, gw.client.post(url))
        .basic_auth(&run.user, Some(run.token.expose()))
        .body(data)
        .send()
        .await
    {
        Ok(resp) => relay(resp),
        Err(e) => unreachable_forge(&e),
    }
}

/// A push answered in git's protocol with one `ERR` line: git prints `remote error: <why>`.
fn protocol_error(why: &str) -> HttpResponse {
    let mut body = pkt::line(format!("ERR {why}\n").as_bytes());
    body.extend_from_slice(pkt::FLUSH);
    HttpResponse::Ok()
        .content_type("application/x-git-receive-pack-result")
        .insert_header(("Cache-Control", "no-cache"))
        .body(body)
}

async fn receive_pack(
    gw: &Gateway,
    req: &HttpRequest,
    payload: web::Payload,
    run_id: &RunId,
    run: &RunAccess,
) -> HttpResponse {
    if req.headers().contains_key("Content-Encoding") {
        return text(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "push bodies are not compressed",
        );
    }
    // The room stays held while the push is checked and forwarded.
    let (data, over, _room) = match gw
        .requests
        .read(run_id, payload, request::declared(req), gw.max_push)
        .await
    {
        Ok(read) => read,
        Err(refused) => {
            gw.count("unread");
            return refusal(gw, &refused);
        }
    };
    // The command list comes first: even a push over the cap is answered ref by ref.
    let push = match pkt::parse_push(&data) {
        Ok(p) => p,
        Err(why) => {
            gw.count("malformed");
            return protocol_error(&why);
        }
    };
    let reasons = if over {
        gw.count("too_large");
        let why = format!(
            "the push is larger than runner.max_push_mb ({} MB)",
            gw.max_push / (1024 * 1024)
        );
        vec![Some(why); push.commands.len()]
    } else {
        match refusals(gw, &push, &data, run).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(run_id = %run_id, error = %e, "a push could not be checked");
                vec![Some(format!("the push could not be checked: {e}")); push.commands.len()]
            }
        }
    };
    if reasons.iter().any(Option::is_some) {
        let mut all = Vec::new();
        for (c, why) in push.commands.iter().zip(&reasons) {
            let why = why
                .clone()
                .unwrap_or_else(|| "refused with the rest of the push".to_owned());
            record(gw, run_id, &c.refname, &why).await;
            all.push(why);
        }
        if !over {
            gw.count("refused");
        }
        tracing::info!(run_id = %run_id, refs = push.commands.len(), "a run's push was refused");
        return HttpResponse::Ok()
            .content_type("application/x-git-receive-pack-result")
            .insert_header(("Cache-Control", "no-cache"))
            .body(pkt::refusal_report(&push, &all));
    }
    let url = format!("{}/git-receive-pack", run.upstream);
    match forward_headers(req, gw.client.post(url))
        .basic_auth(&run.user, Some(run.token.expose()))
        .body(data)
        .send()
        .await
    {
        Ok(resp) => relay(resp),
        Err(e) => unreachable_forge(&e),
    }
}

/// Why each ref update is refused (`None`: it may go). The check is made first against
/// the mirror as it is: a push that passes there passes (the forge applies it only if the
/// branch still holds the old value the check took). Anything else is checked again after
/// syncing the mirror with the forge, so a stale mirror never refuses a good push.
async fn refusals(
    gw: &Gateway,
    push: &Push,
    data: &[u8],
    run: &RunAccess,
) -> Result<Vec<Option<String>>, String> {
    let by_name = rules::check_refs(&push.commands, &run.branch, run.follow_up);
    if by_name.iter().any(Option::is_some) {
        return Ok(by_name);
    }
    let (held, mirror) = gw.mirrors.held(&run.home).await?;
    if let Ok(reasons) = inspect_pack(gw, push, data, run, &mirror).await
        && reasons.iter().all(Option::is_none)
    {
        return Ok(reasons);
    }
    drop(held);
    let upstream = Upstream {
        url: &run.upstream,
        base: &run.base_branch,
        branch: &run.branch,
        origin: &run.origin,
        user: &run.user,
        token: run.token.expose(),
    };
    let (_held, mirror) = gw.mirrors.synced(&run.home, &upstream).await?;
    inspect_pack(gw, push, data, run, &mirror).await
}

/// The push's pack in a quarantine beside `mirror`, and each ref update checked there; the
/// objects of a push that passes are kept in the mirror.
async fn inspect_pack(
    gw: &Gateway,
    push: &Push,
    data: &[u8],
    run: &RunAccess,
    mirror: &std::path::Path,
) -> Result<Vec<Option<String>>, String> {
    let pack = &data[push.pack_at..];
    // The pack as sent, then as much again for its index and the bases a thin pack lacks.
    let room = gw
        .mirrors
        .reserve(&run.home, (pack.len() as u64).saturating_mul(2))
        .await?;
    let quarantine = Quarantine::receive(mirror, pack, gw.mirrors.timeout(), room).await?;
    let expect = Expect {
        base: &run.base_branch,
        follow_up: run.follow_up,
        base_commit: run.base_commit.as_ref(),
    };
    let mut reasons = Vec::with_capacity(push.commands.len());
    for c in &push.commands {
        reasons.push(quarantine.check(c, &expect, &gw.protected).await?);
    }
    if reasons.iter().all(Option::is_none) {
        quarantine.keep()?;
    }
    Ok(reasons)
}

/// Keeps a refusal for the run's report.
async fn record(gw: &Gateway, run_id: &RunId, refname: &str, why: &str) {
    let what = format!("{REFUSAL_PREFIX}{refname}: {why}");
    gw.runs
        .add_refusals(&BTreeMap::from([((run_id.to_owned(), what), 1)]))
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checks_credential_fetches_only_and_only_while_the_checks_are_under_way() {
        assert_eq!(phase_closed(Phase::Checks, true, true), None);
        assert!(phase_closed(Phase::Checks, true, false).is_some(), "after");
        assert!(phase_closed(Phase::Setup, false, true).is_some());
        assert_eq!(phase_closed(Phase::Run, false, false), None);
        let fetch = "service=git-upload-pack";
        assert_eq!(phase_push(Phase::Checks, Endpoint::UploadPack, ""), None);
        assert_eq!(phase_push(Phase::Checks, Endpoint::InfoRefs, fetch), None);
        assert_eq!(
            phase_push(Phase::Checks, Endpoint::ReceivePack, ""),
            Some("checks_push")
        );
        assert_eq!(
            phase_push(
                Phase::Checks,
                Endpoint::InfoRefs,
                "service=git-receive-pack"
            ),
            Some("checks_push")
        );
        assert_eq!(
            phase_push(Phase::Setup, Endpoint::ReceivePack, ""),
            Some("setup_push")
        );
        assert_eq!(phase_push(Phase::Run, Endpoint::ReceivePack, ""), None);
    }

    #[test]
    fn paths_name_a_repository_and_an_endpoint() {
        let (repo, end) = endpoint("/acme/widgets.git/info/refs").expect("parses");
        assert_eq!(repo.to_string(), "acme/widgets");
        assert!(end == Endpoint::InfoRefs);
        assert!(endpoint("/acme/widgets/git-receive-pack").is_some());
        for bad in [
            "/acme/widgets.git/HEAD",
            "/widgets.git/info/refs",
            "/a/b/c.git/info/refs",
            "/../x.git/info/refs",
            "acme/widgets.git/git-upload-pack",
        ] {
            assert!(endpoint(bad).is_none(), "{bad}");
        }
    }
}
