//! An idle server keeps no core busy: its background threads sleep until
//! there is work (ARCHITECTURE.md, "Pre-zeroed segments"). Measured on the
//! real process, as an operator would see it.

/// How often a thread of `pid` named `name` gave up the processor so far.
#[cfg(target_os = "linux")]
fn voluntary_switches(pid: u32, name: &str) -> u64 {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
    let task = tasks
        .map(|entry| entry.unwrap().path())
        .find(|task| std::fs::read_to_string(task.join("comm")).is_ok_and(|comm| comm.trim() == name))
        .unwrap_or_else(|| panic!("no thread named {name}"));
    let status = std::fs::read_to_string(task.join("status")).unwrap();
    let line = status.lines().find(|line| line.starts_with("voluntary_ctxt_switches:")).unwrap();
    line.split_whitespace().last().unwrap().parse().unwrap()
}

#[cfg(target_os = "linux")]
#[test]
fn an_idle_servers_log_zeroer_sleeps() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_svc"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    lines.by_ref().map_while(Result::ok).find(|line| line.contains("svc listening")).expect("server starts");
    // The zeroer first lays down its space ahead of the log, then has nothing to do.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let before = voluntary_switches(child.id(), "svc-wal-zeroer");
    std::thread::sleep(std::time::Duration::from_secs(1));
    let woke = voluntary_switches(child.id(), "svc-wal-zeroer") - before;
    child.kill().unwrap();
    child.wait().unwrap();
    // It looks at the disk's free space twice a second; waking to poll for
    // work, it had woken 200 times.
    assert!(woke <= 10, "the idle zeroer woke {woke} times in a second");
}
