//! FakeForge's server holds every test to Forgejo's API description without being asked:
//! a request the description does not have fails the test when the server is dropped.

use std::io::{Read as _, Write as _};
use std::panic::{AssertUnwindSafe, catch_unwind};

use director_testkit::forge::{FakeForge, FakeServer};

/// Sends `GET path` to the server and returns the answer's status line.
async fn get(server: &FakeServer, path: &str) -> String {
    let addr = server.url().trim_start_matches("http://").to_owned();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    tokio::task::spawn_blocking(move || {
        let mut stream = std::net::TcpStream::connect(&addr).expect("connects");
        stream.write_all(request.as_bytes()).expect("sends");
        let mut answer = String::new();
        stream.read_to_string(&mut answer).expect("reads");
        answer.lines().next().unwrap_or_default().to_owned()
    })
    .await
    .expect("joins")
}

#[tokio::test]
async fn a_request_outside_the_description_fails_the_test_when_the_server_is_dropped() {
    let forge = FakeForge::new();
    let server = forge.serve().expect("serves");
    let status = get(&server, "/api/v1/repos/acme/widgets/frobnicate").await;
    assert!(status.starts_with("HTTP/1.1 "), "{status}");
    let dropped = catch_unwind(AssertUnwindSafe(|| drop(server)));
    let message = dropped.expect_err("the drop fails the test");
    let text = message
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_default();
    assert!(text.contains("outside Forgejo's API description"), "{text}");
    assert!(text.contains("frobnicate"), "{text}");
}

#[tokio::test]
async fn requests_the_description_has_leave_the_drop_quiet() {
    let forge = FakeForge::new();
    let server = forge.serve().expect("serves");
    get(&server, "/api/v1/version").await;
    get(&server, "/api/v1/repos/acme/widgets/issues/1").await;
    assert_eq!(forge.contract_violations(), Vec::<String>::new());
    drop(server);
}

#[tokio::test]
async fn a_test_that_takes_the_violations_on_purpose_is_not_failed_by_them() {
    let forge = FakeForge::new();
    let server = forge.serve().expect("serves");
    get(&server, "/api/v1/nowhere").await;
    let taken = forge.take_contract_violations();
    assert_eq!(taken.len(), 1, "{taken:?}");
    drop(server);
}
