//! Runs the `emberlm` binary from the crate root: (exit code, stdout, stderr).

use std::process::Command;

pub fn emberlm(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_emberlm"))
        // the adapter, even a software one: these tests check the GPU path (`auto` would
        // time lavapipe against the CPU backend and may pick either)
        .env("EMBERLM_DEVICE", "gpu")
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("the binary runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
