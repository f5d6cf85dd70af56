//! `svc backup`: copies a data dir while its server keeps writing, into a
//! new dir that opens as a consistent prefix of the source's history (every
//! change acknowledged before the backup began, and perhaps some after).
//!
//! What makes a plain copy unsafe is deletion: after a snapshot, the server
//! removes the segments it covers, so a copy may catch an old snapshot and
//! miss the segments after it. A backup takes the newest snapshot and the
//! segments from it onwards, in order; if any of them vanished meanwhile (a
//! newer snapshot came), it starts again. The active segment may be caught
//! mid-write: recovery treats its torn tail as it would after a crash.

use std::path::{Path, PathBuf};

use super::layout::{list_segments, list_snapshots};
use super::{StorageError, io_error};

/// What a backup copied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupReport {
    pub snapshot: Option<PathBuf>,
    pub segments: usize,
    pub bytes: u64,
    /// Times the copy started over because the server removed a file.
    pub restarts: u32,
}

/// Attempts before giving up (each restart means a snapshot was taken while copying).
const ATTEMPTS_MAX: u32 = 10;

/// Copies the data dir `source` into `dest`, which must not exist yet.
pub fn backup(source: &Path, dest: &Path) -> Result<BackupReport, StorageError> {
    if dest.exists() {
        return Err(StorageError::Io {
            path: dest.to_path_buf(),
            error: std::io::Error::new(std::io::ErrorKind::AlreadyExists, "the backup dir must not exist yet"),
        });
    }
    let mut restarts = 0;
    loop {
        std::fs::create_dir_all(dest).map_err(io_error(dest))?;
        match copy_once(source, dest) {
            Ok(mut report) => {
                report.restarts = restarts;
                sync_dir(dest)?;
                return Ok(report);
            }
            Err(StorageError::Io { error, .. })
                if error.kind() == std::io::ErrorKind::NotFound && restarts < ATTEMPTS_MAX =>
            {
                std::fs::remove_dir_all(dest).map_err(io_error(dest))?;
                restarts += 1;
            }
            Err(error) => return Err(error),
        }
    }
}

fn copy_once(source: &Path, dest: &Path) -> Result<BackupReport, StorageError> {
    let snapshot = list_snapshots(source)?.pop();
    let from = snapshot.as_ref().map_or(0, |(index, _)| *index);
    let segments: Vec<(u64, PathBuf)> =
        list_segments(source)?.into_iter().filter(|(index, _)| *index >= from).collect();
    let mut bytes = 0;
    let mut copied = Vec::new();
    for (_, path) in snapshot.iter().chain(&segments) {
        let target = dest.join(path.file_name().expect("listed files have names"));
        bytes += std::fs::copy(path, &target).map_err(io_error(path))?;
        copied.push(target);
    }
    for path in &copied {
        std::fs::File::open(path).and_then(|file| file.sync_all()).map_err(io_error(path))?;
    }
    Ok(BackupReport { snapshot: snapshot.map(|(_, path)| path), segments: segments.len(), bytes, restarts: 0 })
}

fn sync_dir(dir: &Path) -> Result<(), StorageError> {
    std::fs::File::open(dir).and_then(|file| file.sync_all()).map_err(io_error(dir))
}
