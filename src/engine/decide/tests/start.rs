//! Whether a run may start: `start_refusal`, one fact at a time.

use crate::engine::decide::runs::{
    BranchSeen, RunnerRole, StartFacts, StartRefusal, start_refusal,
};
use crate::forge::Permission;

fn branch(can: Option<(bool, bool)>) -> BranchSeen {
    BranchSeen {
        base: "main".into(),
        can,
        allowed_unprotected: false,
        runner_account: true,
        runner_login: "director-runner".into(),
    }
}

fn role(role: Permission) -> RunnerRole {
    RunnerRole {
        login: "director-runner".into(),
        repo: "acme/widgets".parse().expect("repo"),
        role,
        actions: Permission::None,
        fork: false,
        allow_writer: false,
    }
}

fn fork_role(role: Permission, allow_writer: bool) -> RunnerRole {
    RunnerRole {
        fork: true,
        allow_writer,
        ..self::role(role)
    }
}

fn refused(facts: &StartFacts) -> String {
    match start_refusal(facts) {
        Some(StartRefusal::Refused(why)) => why,
        other => panic!("not refused: {other:?}"),
    }
}

#[test]
fn nothing_known_yet_refuses_nothing_and_all_good_starts() {
    assert_eq!(start_refusal(&StartFacts::default()), None);
    let all = StartFacts {
        followup: false,
        stale: Some(false),
        egress: Some(Ok(())),
        repo_file: Some(Ok(())),
        agent: Some(Ok(())),
        token: Some(Ok(())),
        runner_role: Some(role(Permission::Write)),
        home: Some(Ok(())),
        default_branch: Some(branch(Some((false, false)))),
    };
    assert_eq!(start_refusal(&all), None);
}

#[test]
fn stale_text_stops_a_first_run_but_not_a_follow_up() {
    let stale = StartFacts {
        stale: Some(true),
        ..StartFacts::default()
    };
    assert_eq!(start_refusal(&stale), Some(StartRefusal::Stale));
    let followup = StartFacts {
        followup: true,
        ..stale
    };
    assert_eq!(start_refusal(&followup), None);
}

#[test]
fn egress_that_cannot_be_had_refuses_never_opening_it() {
    let why = refused(&StartFacts {
        egress: Some(Err("the egress proxy cannot listen".into())),
        ..StartFacts::default()
    });
    assert!(
        why.starts_with("runs are allow-listed (runner.egress) and the egress proxy"),
        "{why}"
    );
}

#[test]
fn a_runner_that_is_not_exactly_a_writer_is_refused() {
    for r in [
        Permission::Admin,
        Permission::Owner,
        Permission::Read,
        Permission::None,
    ] {
        let why = refused(&StartFacts {
            runner_role: Some(role(r)),
            ..StartFacts::default()
        });
        assert!(
            why.contains(&format!("has `{}` permission on acme/widgets", r.as_str())),
            "{why}"
        );
    }
}

#[test]
fn pushing_to_a_fork_the_runner_must_read_and_not_write_unless_the_operator_accepts_it() {
    let facts = |r| StartFacts {
        runner_role: Some(r),
        ..StartFacts::default()
    };
    assert_eq!(
        start_refusal(&facts(fork_role(Permission::Read, false))),
        None
    );
    for r in [Permission::Write, Permission::Admin, Permission::Owner] {
        let why = refused(&facts(fork_role(r, false)));
        assert!(
            why.contains(&format!("has `{}` permission on acme/widgets", r.as_str()))
                && why.contains("without a maintainer's approval")
                && why.contains("runner.allow_writer_runner"),
            "{why}"
        );
        assert_eq!(start_refusal(&facts(fork_role(r, true))), None, "{r:?}");
    }
    let why = refused(&facts(fork_role(Permission::None, true)));
    assert!(why.contains("cannot read acme/widgets"), "{why}");
}

#[test]
fn a_reader_whose_team_writes_to_actions_is_refused_as_a_writer() {
    let role = RunnerRole {
        actions: Permission::Write,
        ..fork_role(Permission::Read, false)
    };
    let why = refused(&StartFacts {
        runner_role: Some(role.clone()),
        ..StartFacts::default()
    });
    assert!(
        why.contains("`write` access to the Actions unit of acme/widgets through a team")
            && why.contains("repository permission is `read`")
            && why.contains("runner.allow_writer_runner"),
        "{why}"
    );
    let accepted = RunnerRole {
        allow_writer: true,
        ..role
    };
    assert_eq!(
        start_refusal(&StartFacts {
            runner_role: Some(accepted),
            ..StartFacts::default()
        }),
        None
    );
}

#[test]
fn a_fork_that_cannot_be_had_refuses_the_run_with_its_reason() {
    let why = refused(&StartFacts {
        runner_role: Some(fork_role(Permission::Read, false)),
        home: Some(Err("the fork of acme/widgets could not be made".into())),
        token: Some(Ok(())),
        ..StartFacts::default()
    });
    assert!(why.contains("could not be made"), "{why}");
}

#[test]
fn a_token_that_can_reach_the_default_branch_is_refused_and_an_unseen_one_fails_closed() {
    for (can, words) in [
        (Some((true, true)), "can push to and merge into `main`"),
        (Some((true, false)), "can push to `main`"),
        (Some((false, true)), "can merge into `main`"),
        (None, "cannot be seen with the run token"),
    ] {
        let why = refused(&StartFacts {
            default_branch: Some(branch(can)),
            ..StartFacts::default()
        });
        assert!(why.contains(words), "{why}");
    }
    let allowed = BranchSeen {
        allowed_unprotected: true,
        ..branch(Some((true, true)))
    };
    assert_eq!(
        start_refusal(&StartFacts {
            default_branch: Some(allowed),
            ..StartFacts::default()
        }),
        None
    );
    let app = BranchSeen {
        runner_account: false,
        ..branch(Some((true, false)))
    };
    let why = refused(&StartFacts {
        default_branch: Some(app),
        ..StartFacts::default()
    });
    assert!(
        why.starts_with("the App's run token can push to `main`"),
        "{why}"
    );
}

#[test]
fn the_first_reason_is_the_one_given() {
    let why = refused(&StartFacts {
        egress: Some(Err("no proxy".into())),
        runner_role: Some(role(Permission::Admin)),
        ..StartFacts::default()
    });
    assert!(why.contains("no proxy"), "{why}");
}

#[test]
fn what_the_repository_file_the_agent_and_the_token_say_is_the_reason_given() {
    for facts in [
        StartFacts {
            repo_file: Some(Err("the file cannot be used".into())),
            ..StartFacts::default()
        },
        StartFacts {
            agent: Some(Err("the file cannot be used".into())),
            ..StartFacts::default()
        },
        StartFacts {
            token: Some(Err("the file cannot be used".into())),
            runner_role: Some(role(Permission::Write)),
            ..StartFacts::default()
        },
    ] {
        assert_eq!(refused(&facts), "the file cannot be used");
    }
}
