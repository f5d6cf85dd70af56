//! Durability: frames, log segments, snapshot files and the data-dir lock.
//! Storage knows bytes, frames and files; it knows nothing about jobs.

mod direct;
pub mod frame;
mod fs;
mod layout;
mod power_loss;
mod snapshot;
mod wal;

pub use fs::{FaultyFileSystem, FileSystem, LogFile, PageCacheFileSystem, RealFileSystem};
pub use layout::{DataDirLock, SEGMENT_HEADER_BYTES, list_segments, list_snapshots, segment_path, snapshot_path};
pub use power_loss::PowerLossFileSystem;
pub use snapshot::{SNAPSHOT_HEADER_BYTES, SnapshotFile, read_snapshot, remove_obsolete, write_snapshot};
pub use wal::{FrameVisitor, ReplayEnd, SegmentScan, TailPolicy, WalWriter, Written, replay_log, scan_segment};

use std::fmt;
use std::path::PathBuf;

/// A storage failure. Corruption names the file and byte offset.
#[derive(Debug)]
pub enum StorageError {
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    Corrupt {
        path: PathBuf,
        offset: u64,
        reason: String,
    },
    /// The log refused a write earlier; nothing more is written until restart.
    Poisoned,
    /// Another process holds the data dir.
    Locked(PathBuf),
}

impl fmt::Display for StorageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StorageError::Io { path, error } => write!(f, "{}: {error}", path.display()),
            StorageError::Corrupt { path, offset, reason } => {
                write!(f, "corrupt data in {} at byte offset {offset}: {reason}", path.display())
            }
            StorageError::Poisoned => {
                f.write_str("the write-ahead log failed to sync earlier and accepts no more writes")
            }
            StorageError::Locked(path) => {
                write!(f, "{} is in use by another svc process", path.display())
            }
        }
    }
}

impl std::error::Error for StorageError {}

pub(crate) fn io_error(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> StorageError {
    let path = path.into();
    move |error| StorageError::Io { path, error }
}
