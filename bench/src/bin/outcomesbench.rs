//! Outcomes benchmark: a SQLite store holding 100,000 issues (or what `--issues` says) over
//! the last year (`--spread-days`), as the director writes them: each picked up and judged, two in three
//! with a pull request (most merged), each with a run and its metered cost, a pre-flight call
//! each. Times what `/status/outcomes?days=90` (`--days`) does for a request (the store's three queries,
//! the figures, the page with its charts), several times, and prints each and the median.
//!
//! `cargo run --release -p director-bench --bin director-outcomesbench`

use std::time::Instant;

use clap::Parser;
use director::domain::{
    IssueRecord, IssueRef, Judgement, Lifecycle, PullRecord, PullState, RunId, RunRecord, RunState,
};
use director::models::{Metered, Provider};
use director::settings::StoreSettings;
use director::store::{Commit, Store};

#[derive(Parser)]
struct Args {
    #[arg(long, default_value_t = 100_000)]
    issues: u64,
    #[arg(long, default_value_t = 5)]
    passes: usize,
    /// The window asked for (7, 30 or 90 on the page).
    #[arg(long, default_value_t = 90)]
    days: u32,
    /// The issues are spread over this many days before now (a year of them by default; as
    /// many as the window for the worst case, every issue in it).
    #[arg(long, default_value_t = 365)]
    spread_days: u32,
    /// Keep the seeded database here (for reading it with other tools).
    #[arg(long)]
    keep: Option<std::path::PathBuf>,
}

const DAY: i64 = 86_400_000;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let dir = tempfile::tempdir()?;
    let db = args
        .keep
        .clone()
        .unwrap_or_else(|| dir.path().join("bench.db"));
    let store = Store::connect(&StoreSettings {
        url: format!("sqlite://{}", db.display()),
        ..StoreSettings::default()
    })
    .await?;
    let now = director::clock::now_ms();
    let seeding = Instant::now();
    let mut n = 0u64;
    while n < args.issues {
        let mut commit = Commit::default();
        for _ in 0..1_000.min(args.issues - n) {
            n += 1;
            let repo = format!("bench/repo-{:02}", n % 20);
            let issue: IssueRef = format!("{repo}#{n}").parse()?;
            // Spread over the window, newest last.
            let picked = now
                - (args.issues - n) as i64 * i64::from(args.spread_days) * DAY / args.issues as i64;
            let mut record = IssueRecord::new(&issue, picked);
            record.title = format!("Issue {n}");
            record.preflight.picked_at_ms = Some(picked);
            record.preflight.verdict = Some(match n % 10 {
                0 => Judgement::NoGo,
                1 => Judgement::NeedsInfo,
                2 => Judgement::WrongRepo,
                _ => Judgement::Go,
            });
            record.lifecycle = Lifecycle::Queued;
            let mut run =
                RunRecord::admitted(&issue, RunId::parse(&format!("{n:012x}"))?, "b", picked);
            run.started_at_ms = Some(picked + 60_000);
            run.finished_at_ms = Some(picked + 1_800_000);
            run.state = if n.is_multiple_of(7) {
                RunState::Failed
            } else {
                RunState::Succeeded
            };
            if !n.is_multiple_of(3) {
                let mut pr = PullRecord::opened(n, "b");
                pr.opened_at_ms = Some(picked + 1_900_000);
                pr.ended_at_ms = Some(picked + 20_000_000);
                pr.state = if n.is_multiple_of(5) {
                    PullState::Closed
                } else {
                    PullState::Merged
                };
                record.lifecycle = Lifecycle::Merged;
                record.pr = Some(pr);
                run.pr_number = Some(n);
            }
            for (run_id, issue) in [(Some(run.id.clone()), None), (None, Some(n))] {
                store
                    .record_model_usage(&Metered {
                        run_id,
                        repo: record.repo.clone(),
                        issue,
                        provider: Provider::Anthropic,
                        model: "claude-sonnet-4-5".into(),
                        usage: Default::default(),
                        cost_usd: Some(0.5),
                        at_ms: picked + 120_000,
                    })
                    .await?;
            }
            commit.records.push(record);
            commit.runs.push(run);
        }
        store.commit(&commit, now).await?;
    }
    eprintln!(
        "seeded {} issues in {:.1} s",
        args.issues,
        seeding.elapsed().as_secs_f64()
    );
    let mut times = Vec::new();
    for pass in 1..=args.passes {
        let started = Instant::now();
        let facts = store
            .outcome_facts(now - i64::from(args.days) * DAY, now)
            .await?;
        let read = started.elapsed().as_secs_f64() * 1000.0;
        let outcomes = director::domain::outcomes::compute(&facts, args.days, now);
        let counted = started.elapsed().as_secs_f64() * 1000.0;
        let page = director::status::outcomes::page(&outcomes, &|_| true, false);
        let ms = started.elapsed().as_secs_f64() * 1000.0;
        println!(
            "pass {pass}: {ms:.0} ms (read {read:.0}, counted {:.0}; {} pull requests, {} groups of runs, merged {}, page {} KB)",
            counted - read,
            facts.prs.len(),
            facts.runs.len(),
            outcomes.total.merged,
            page.len() / 1024
        );
        times.push(ms);
    }
    times.sort_by(f64::total_cmp);
    println!("median: {:.0} ms", times[times.len() / 2]);
    Ok(())
}
