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
///
/// `dest` is made by one `mkdir` (so a dir or link put there meanwhile
/// makes the backup fail instead of writing through it), readable by its
/// owner only, and each file in it is created new; a file of the source that
/// is a symbolic link is refused.
pub fn backup(source: &Path, dest: &Path) -> Result<BackupReport, StorageError> {
    use std::os::unix::fs::DirBuilderExt;
    if let Some(parent) = dest.parent().filter(|parent| !parent.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(io_error(parent))?;
    }
    std::fs::DirBuilder::new().mode(0o700).create(dest).map_err(|error| StorageError::Io {
        path: dest.to_path_buf(),
        error: if error.kind() == std::io::ErrorKind::AlreadyExists {
            std::io::Error::new(std::io::ErrorKind::AlreadyExists, "the backup dir must not exist yet")
        } else {
            error
        },
    })?;
    let mut restarts = 0;
    loop {
        match copy_once(source, dest) {
            Ok(mut report) => {
                report.restarts = restarts;
                sync_dir(dest)?;
                return Ok(report);
            }
            Err(StorageError::Io { error, .. })
                if error.kind() == std::io::ErrorKind::NotFound && restarts < ATTEMPTS_MAX =>
            {
                // Start over in the same dir, emptied: it stays ours meanwhile.
                for entry in std::fs::read_dir(dest).map_err(io_error(dest))? {
                    let path = entry.map_err(io_error(dest))?.path();
                    std::fs::remove_file(&path).map_err(io_error(&path))?;
                }
                restarts += 1;
            }
            Err(error) => return Err(error),
        }
    }
}

fn copy_once(source: &Path, dest: &Path) -> Result<BackupReport, StorageError> {
    use std::os::unix::fs::OpenOptionsExt;
    let snapshot = list_snapshots(source)?.pop();
    let from = snapshot.as_ref().map_or(0, |(index, _)| *index);
    let segments: Vec<(u64, PathBuf)> =
        list_segments(source)?.into_iter().filter(|(index, _)| *index >= from).collect();
    let mut bytes = 0;
    for (_, path) in snapshot.iter().chain(&segments) {
        if std::fs::symlink_metadata(path).map_err(io_error(path))?.file_type().is_symlink() {
            return Err(StorageError::Io {
                path: path.to_path_buf(),
                error: std::io::Error::new(std::io::ErrorKind::InvalidInput, "a data dir file is a symbolic link"),
            });
        }
        let target = dest.join(path.file_name().expect("listed files have names"));
        let mut from = std::fs::File::open(path).map_err(io_error(path))?;
        let mut to = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&target)
            .map_err(io_error(&target))?;
        bytes += std::io::copy(&mut from, &mut to).map_err(io_error(path))?;
        to.sync_all().map_err(io_error(&target))?;
    }
    Ok(BackupReport { snapshot: snapshot.map(|(_, path)| path), segments: segments.len(), bytes, restarts: 0 })
}

fn sync_dir(dir: &Path) -> Result<(), StorageError> {
    std::fs::File::open(dir).and_then(|file| file.sync_all()).map_err(io_error(dir))
}
