//! Runs every example to completion and checks it exits 0.
//!
//! Each example checks its own story (the retries happened, the breaker
//! opened, the entries were stored and replayed) and exits non-zero when it
//! did not, so a zero exit is the assertion. `cargo test` builds the examples
//! before it runs the tests (to check they compile), next to this test's
//! binary: `target/<profile>/examples/NAME`.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// Each example and its arguments: those that serve until Ctrl-C by
/// default are given the argument that makes them check their story and
/// exit.
const EXAMPLES: [(&str, &[&str]); 10] = [
    ("axum_server", &[]),
    ("axum_hedged_downstream", &[]),
    ("axum_router_layer", &[]),
    ("reqwest_client", &[]),
    ("prometheus", &[]),
    ("idempotent_orders", &[]),
    ("tonic_client", &[]),
    ("http_client", &[]),
    ("queue_consumer", &[]),
    ("admin_page", &["--exit-after", "3"]),
];

fn example_path(name: &str) -> PathBuf {
    // This binary is `target/<profile>/deps/run_examples-<hash>`.
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps");
    let path = profile_dir
        .join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        path.exists(),
        "{} is missing: `cargo test -p examples` builds the examples first; \
         with a `--test` filter, run `cargo build -p examples --examples` before",
        path.display()
    );
    path
}

#[test]
fn every_example_runs_to_completion() {
    // In parallel: each binds its own ports on 127.0.0.1:0.
    let runs: Vec<_> = EXAMPLES
        .iter()
        .map(|(name, args)| {
            let path = example_path(name);
            std::thread::spawn(move || {
                let started = Instant::now();
                let output = Command::new(&path)
                    .args(*args)
                    .output()
                    .expect("the example starts");
                (output, started.elapsed())
            })
        })
        .collect();
    for ((name, _), run) in EXAMPLES.iter().zip(runs) {
        let (output, took) = run.join().expect("the runner thread");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success(),
            "example {name} failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
            output.status
        );
        assert!(
            took < Duration::from_secs(30),
            "example {name} took {took:?}"
        );
        assert!(!stdout.is_empty(), "example {name} printed nothing");
    }
}
