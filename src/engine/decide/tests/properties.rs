//! Properties: any interleaving of duplicate, replayed and out-of-order events never yields
//! two active runs for an issue, two start actions or two reports for one run id.

use super::*;

/// Every kind of event, for a handful of revisions and run ids.
fn pool() -> Vec<Event> {
    let mut out = vec![
        label("alice", &["headless"], T1),
        label("alice", &[], T2),
        label("alice", &["headless"], T3),
        observed(&["headless"], "open", T1),
        observed(&["headless"], "closed", T2),
        closed("closed", T2),
        closed("open", T3),
        edited("alice", T3),
        comment("alice", 30, "/director cancel", T3),
        judged(true),
        judged(false),
        command(Command::Cancel, true),
        command(Command::Retry, true),
    ];
    for rev in 1..=4 {
        for outcome in [
            go(),
            failed(),
            read_of(Verdict::NoGo {
                reason: "no".into(),
            }),
        ] {
            out.push(Event::PreflightRead { rev, outcome });
        }
    }
    for id in ["000000000001", "000000000002", "000000000003"] {
        out.push(admitted(id));
        for r in [
            started(),
            exited(0),
            RunReport::Judged { ahead: 1 },
            RunReport::Judged { ahead: 0 },
            RunReport::PrOpened { number: 4 },
            RunReport::Stale,
            RunReport::Refused { why: "no".into() },
        ] {
            out.push(report(id, r));
        }
        out.push(Event::ActionGaveUp {
            key: format!("start:{id}"),
            kind: ActionKind::StartRun,
            error: "boom".into(),
            run: Some(test_id(id)),
        });
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Any order, any repeats: never two active runs, never two starts for one run id, one
    /// report per run, and decisions never go back in version.
    #[test]
    fn any_interleaving_keeps_one_active_run_and_one_start_per_run_id(
        picks in proptest::collection::vec(0usize..1000, 1..80)
    ) {
        let pool = pool();
        let mut s = Sim::new();
        let mut version = 0;
        let mut admitted = std::collections::HashSet::new();
        for pick in picks {
            let event = &pool[pick % pool.len()];
            // Admission draws a new run id every time: an id is never admitted twice.
            if let Event::Admitted { run_id, .. } = event
                && admitted.contains(run_id)
            {
                continue;
            }
            let before = s.run.clone();
            s.apply(event);
            if let (Event::Admitted { run_id, .. }, Some(run)) = (event, &s.run)
                && run.id == *run_id
            {
                admitted.insert(run_id.clone());
            }
            if let (Some(b), Some(a)) = (&before, &s.run)
                && b.id != a.id
            {
                prop_assert!(!b.state.is_active(), "{} replaced while {}", b.id, b.state);
            }
            if let Some(r) = &s.record {
                prop_assert!(r.version >= version);
                version = r.version;
                let run_active = s.run.as_ref().is_some_and(|r| r.state.is_active());
                if matches!(r.lifecycle, Lifecycle::Launching | Lifecycle::Running) {
                    prop_assert!(run_active, "{} without an active run", r.lifecycle);
                }
            }
        }
        let mut starts = std::collections::HashMap::<String, usize>::new();
        let mut reports = std::collections::HashMap::<String, usize>::new();
        for p in &s.all {
            match &p.action {
                Action::StartRun { run_id } => *starts.entry(run_id.to_string()).or_default() += 1,
                Action::ReportRun { run_id, .. } => *reports.entry(run_id.to_string()).or_default() += 1,
                _ => {}
            }
        }
        prop_assert!(starts.values().all(|n| *n == 1), "{starts:?}");
        prop_assert!(reports.values().all(|n| *n == 1), "{reports:?}");
    }

    /// Applying the same event twice in a row changes nothing the second time.
    #[test]
    fn an_event_delivered_twice_in_a_row_is_decided_once(
        picks in proptest::collection::vec(0usize..1000, 1..40),
        dup in 0usize..1000,
    ) {
        let pool = pool();
        let mut s = Sim::new();
        for pick in picks {
            s.apply(&pool[pick % pool.len()]);
        }
        let event = &pool[dup % pool.len()];
        s.apply(event);
        let (record, run) = (s.record.clone(), s.run.clone());
        let again = s.apply(event);
        if again {
            // Only facts that carry no news may be re-recorded; state and run stay put.
            prop_assert_eq!(s.record.as_ref().map(|r| r.lifecycle), record.as_ref().map(|r| r.lifecycle));
            prop_assert_eq!(&s.run, &run);
            let effects = s.last.iter().filter(|p| {
                matches!(
                    p.action,
                    Action::StartRun { .. }
                        | Action::OpenPr { .. }
                        | Action::FileRouted { .. }
                        | Action::ReportRun { .. }
                )
            });
            prop_assert_eq!(effects.count(), 0);
        }
    }
}
