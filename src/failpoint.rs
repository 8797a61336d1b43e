//! Named pause points for the crash tests, compiled in only with the `failpoints` feature
//! (test builds). When `DIRECTOR_FAILPOINT` names the point being passed, the process says so
//! on stderr (`failpoint reached: NAME`) and stops there for good, so that the test can SIGKILL
//! it at exactly that moment. Without the feature every call is a no-op.

/// Pauses here for good when `DIRECTOR_FAILPOINT` names `name`.
pub async fn hit(name: &str) {
    if armed(name) {
        announce(name);
        std::future::pending::<()>().await;
    }
}

#[cfg(feature = "failpoints")]
fn armed(name: &str) -> bool {
    std::env::var("DIRECTOR_FAILPOINT").is_ok_and(|v| v == name)
}

#[cfg(not(feature = "failpoints"))]
fn armed(_name: &str) -> bool {
    false
}

fn announce(name: &str) {
    eprintln!("failpoint reached: {name}");
}
