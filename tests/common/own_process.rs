//! Tests that change the process environment (`EMBERLM_CACHE_DIR`, `EMBERLM_KERNELS`) share a
//! test binary with tests that read it, so they run in a child process of their own: the test
//! binary started again with only that test selected and the variables set there.

use std::process::Command;

/// Set in the child to the test's name.
const CHILD: &str = "EMBERLM_TEST_OWN_PROCESS";

/// Called first in a test whose full path is `path` (`concat!(module_path!(), "::NAME")`):
/// returns `true` in the parent after the test ran and passed in a child process (with `env`
/// set there), so the parent returns at once; returns `false` in that child, which runs the
/// test's body. A child that fails, or that ran anything but exactly this one test, fails the
/// parent with the child's output.
pub fn rerun_alone(path: &str, env: &[(&str, &std::ffi::OsStr)]) -> bool {
    // libtest names tests without the crate's name
    let name = path.split_once("::").map_or(path, |(_, rest)| rest);
    if std::env::var(CHILD).is_ok_and(|v| v == name) {
        return false;
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut cmd = Command::new(exe);
    cmd.args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, name);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("starting the test binary again");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    eprintln!("{stderr}");
    assert!(
        out.status.success() && stdout.contains("test result: ok. 1 passed"),
        "`{name}` in its own process: {} (its output is above)",
        out.status
    );
    true
}
