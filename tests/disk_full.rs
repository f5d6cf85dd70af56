//! A full disk, for real: a small file system mounted for the test (an ext4
//! image on a loop device, where log writes are direct, and a size-limited
//! tmpfs), filled by the server's own log. Mounting needs root; without it
//! the test says so and passes, unless `SVC_REQUIRE_SMALL_FS=1` (as `.ci/run`
//! sets) makes that a failure.

mod common;

use common::{TestServer, config_for};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// A mounted file system, unmounted when dropped.
struct Mounted {
    point: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.point).status();
    }
}

fn run(program: &str, args: &[&str]) -> bool {
    Command::new(program).args(args).output().is_ok_and(|output| output.status.success())
}

/// Mounts a file system of `megabytes` of the given kind, if this process may.
fn mount(kind: &str, megabytes: u64) -> Option<Mounted> {
    let dir = tempfile::tempdir().unwrap();
    let point = dir.path().join("mnt");
    std::fs::create_dir(&point).unwrap();
    let point_text = point.to_str().unwrap();
    let mounted = match kind {
        "ext4" => {
            let image = dir.path().join("disk.img");
            std::fs::File::create(&image).unwrap().set_len(megabytes << 20).unwrap();
            let image_text = image.to_str().unwrap();
            run("mkfs.ext4", &["-q", "-F", "-m", "0", image_text])
                && run("mount", &["-o", "loop", image_text, point_text])
        }
        _ => run("mount", &["-t", "tmpfs", "-o", &format!("size={megabytes}m"), "tmpfs", point_text]),
    };
    mounted.then_some(Mounted { point, _dir: dir })
}

fn small_file_system(kind: &str, megabytes: u64) -> Option<Mounted> {
    let mounted = mount(kind, megabytes);
    if mounted.is_none() {
        let required = std::env::var("SVC_REQUIRE_SMALL_FS").is_ok_and(|value| value == "1");
        assert!(!required, "could not mount a {kind} file system (SVC_REQUIRE_SMALL_FS=1)");
        eprintln!("skipped: mounting a small {kind} file system needs root");
    }
    mounted
}

/// Enqueues jobs of 64 KiB until one is refused; returns the refusal and the ids taken.
fn fill(server: &TestServer) -> (common::Answer, Vec<String>) {
    let big = "x".repeat(64 * 1024);
    let mut taken = Vec::new();
    for _ in 0..5_000 {
        let answer = server.post("/svc/v1/jobs", json!({"type": "t", "args": [big], "options": {"queue": "big"}}));
        if answer.status != 201 {
            return (answer, taken);
        }
        taken.push(answer.body["job"]["id"].as_str().unwrap().to_string());
    }
    panic!("the disk never filled up");
}

fn wait_for_writes(server: &TestServer) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let answer = server.post("/svc/v1/jobs", json!({"type": "t", "args": ["back"]}));
        if answer.status == 201 {
            return;
        }
        assert!(Instant::now() < deadline, "writes came back once space was freed: {}", answer.body);
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn full_disk_round(mount_point: &Path) {
    // Room the test frees later.
    let ballast = mount_point.join("ballast");
    std::fs::write(&ballast, vec![1u8; 12 << 20]).unwrap();
    let config = config_for(&mount_point.join("data"));
    let mut server = TestServer::start(&config.data_dir);
    let active = server.enqueue(json!({"type": "t", "args": [1]}));
    assert_eq!(server.fetch(&["default"], 1)[0]["id"], active.as_str());

    let (refused, taken) = fill(&server);
    assert_eq!((refused.status, refused.error_code()), (503, "backend_error"), "{}", refused.body);
    assert_eq!(refused.body["error"]["details"]["reason"], "disk_full", "{}", refused.body);
    let health = server.get("/svc/v1/health");
    assert_eq!((health.status, health.body["backend"]["error"].as_str()), (503, Some("disk_full")));
    assert_eq!(server.job(&taken[0])["state"], "available", "reads still work");
    let acked = server.post("/svc/v1/workers/ack", json!({"job_id": active}));
    assert_eq!(acked.status, 200, "accepted work can still end: {}", acked.body);
    let claimed = server.fetch(&["big"], 2);
    assert_eq!(claimed.len(), 2, "claims go on while there is room for their acks");
    for job in &claimed {
        assert_eq!(server.post("/svc/v1/workers/ack", json!({"job_id": job["id"]})).status, 200);
    }

    // A restart on the full disk serves again, with nothing lost.
    server.server.take().unwrap().stop().expect("stops cleanly without room for a snapshot");
    let server = TestServer::start(&config.data_dir);
    assert_eq!(server.job(&active)["state"], "completed");
    for id in &taken[2..] {
        assert_eq!(server.job(id)["state"], "available", "every acknowledged job is there");
    }
    assert_eq!(server.post("/svc/v1/jobs", json!({"type": "t", "args": []})).status, 503);

    std::fs::remove_file(&ballast).unwrap();
    wait_for_writes(&server);
    assert_eq!(server.get("/svc/v1/health").status, 200);
}

#[test]
fn a_real_full_ext4_disk_refuses_new_work_and_recovers_when_space_is_freed() {
    if let Some(mounted) = small_file_system("ext4", 64) {
        full_disk_round(&mounted.point);
    }
}

#[test]
fn a_real_full_tmpfs_refuses_new_work_and_recovers_when_space_is_freed() {
    if let Some(mounted) = small_file_system("tmpfs", 48) {
        full_disk_round(&mounted.point);
    }
}
