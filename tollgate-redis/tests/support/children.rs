//! Copies of the running test binary as separate processes, for the tests
//! whose limit is shared between processes through Redis.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

/// Runs `count` copies of this test binary side by side, each running only
/// its `child` test with `env` set and `out_var` naming a file of its own to
/// write, in a fresh folder named after `name`. Waits for them all, asserting
/// that each succeeded, and returns the lines each one wrote, in order.
pub fn run_children(
    name: &str,
    count: usize,
    out_var: &str,
    env: &[(&str, String)],
) -> Vec<Vec<String>> {
    let exe = std::env::current_exe().unwrap();
    let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let children: Vec<_> = (0..count)
        .map(|p| {
            let out = dir.join(format!("child-{p}.txt"));
            let child = Command::new(&exe)
                .args(["--exact", "child", "--nocapture", "--test-threads=1"])
                .envs(env.iter().map(|(var, value)| (var, value)))
                .env(out_var, &out)
                // The child's own test harness report is noise here; its
                // panics still reach stderr.
                .stdout(Stdio::null())
                .spawn()
                .expect("spawn a child process");
            (child, out)
        })
        .collect();
    let outputs = children
        .into_iter()
        .map(|(mut child, out)| {
            assert!(child.wait().unwrap().success(), "a child process failed");
            BufReader::new(std::fs::File::open(&out).unwrap())
                .lines()
                .map(Result::unwrap)
                .collect()
        })
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    outputs
}
