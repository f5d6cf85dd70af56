//! Durability: frames, log segments, snapshot files and the data-dir lock.
//! Storage knows bytes, frames and files; it knows nothing about jobs.

mod backup;
mod direct;
#[doc(hidden)]
pub mod frame;
mod fs;
mod layout;
mod power_loss;
mod snapshot;
mod wal;

#[doc(hidden)]
pub use backup::{BackupReport, backup};
pub use fs::FaultyFileSystem;
pub use fs::{FileSystem, LogFile, PageCacheFileSystem, RealFileSystem};
#[doc(hidden)]
pub use layout::{
    DataDirLock, SEGMENT_HEADER_BYTES, create_data_dir, list_segments, list_snapshots, segment_path, snapshot_path,
};
#[doc(hidden)]
pub use power_loss::PowerLossFileSystem;
#[doc(hidden)]
pub use snapshot::{
    OpenSnapshot, PageCache, SNAPSHOT_HEADER_BYTES, SnapshotFile, SnapshotPayload, open_snapshot,
    read_newest_into_page_cache, read_snapshot, remove_obsolete, write_snapshot, write_snapshot_with,
};
#[doc(hidden)]
pub use wal::{FrameVisitor, ReplayEnd, SegmentScan, TailPolicy, WalWriter, Written, replay_log, scan_segment};

use std::fmt;
use std::path::{Path, PathBuf};

/// A storage failure. Corruption names the file and byte offset.
#[derive(Debug)]
#[non_exhaustive]
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
    /// Reading a file failed (an I/O error of the device, not bad data).
    Read {
        path: PathBuf,
        offset: u64,
        error: std::io::Error,
    },
    /// The disk (or the user's quota) is full; nothing was written.
    NoSpace {
        path: PathBuf,
    },
    /// The process (or the system) has no file descriptor to spare; nothing
    /// was written, and the same step may succeed once descriptors are freed.
    NoDescriptors {
        path: PathBuf,
        error: std::io::Error,
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
            StorageError::Read { path, offset, error } => {
                write!(f, "reading {} failed at byte offset {offset}: {error}", path.display())
            }
            StorageError::NoSpace { path } => write!(f, "{}: no space left on the device", path.display()),
            StorageError::NoDescriptors { path, error } => {
                write!(f, "{}: out of file descriptors ({error})", path.display())
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

impl StorageError {
    /// Whether the step failed for want of a resource that comes back (disk
    /// space, file descriptors) and left the files as they were: it may be
    /// tried again, and the log is not poisoned by it.
    pub fn is_transient(&self) -> bool {
        matches!(self, StorageError::NoSpace { .. } | StorageError::NoDescriptors { .. })
    }
}

/// Whether an I/O error means the process or the system ran out of file
/// descriptors (`EMFILE`, `ENFILE`).
pub(crate) fn is_out_of_descriptors(error: &std::io::Error) -> bool {
    matches!(error.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE))
}

/// Reads a whole file with `read`, naming the offset of a failed read. (A
/// memory map would turn a device error into SIGBUS and kill the process.)
pub(crate) fn read_file(path: &Path) -> Result<Vec<u8>, StorageError> {
    let file = std::fs::File::open(path).map_err(io_error(path))?;
    let length = file.metadata().map_err(io_error(path))?.len() as usize;
    read_range(&file, path, 0, length)
}

/// Reads `length` bytes of `file` from `start`, in pieces, so that a failure
/// is placed within a megabyte.
pub(crate) fn read_range(
    file: &std::fs::File,
    path: &Path,
    start: u64,
    length: usize,
) -> Result<Vec<u8>, StorageError> {
    use std::os::unix::fs::FileExt;
    const PIECE_BYTES: usize = 1024 * 1024;
    let mut bytes = vec![0u8; length];
    for (index, piece) in bytes.chunks_mut(PIECE_BYTES).enumerate() {
        let offset = start + (index * PIECE_BYTES) as u64;
        file.read_exact_at(piece, offset).map_err(|error| StorageError::Read {
            path: path.to_path_buf(),
            offset,
            error,
        })?;
    }
    Ok(bytes)
}

pub(crate) fn io_error(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> StorageError {
    let path = path.into();
    move |error| StorageError::Io { path, error }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_read_names_the_file_and_offset() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("segment");
        std::fs::write(&path, vec![7u8; 3 * 1024 * 1024 + 5]).unwrap();
        assert_eq!(read_file(&path).unwrap(), vec![7u8; 3 * 1024 * 1024 + 5]);
        // A directory opens but does not read: a read error, not a crash.
        let error = read_file(dir.path()).unwrap_err();
        assert!(matches!(error, StorageError::Read { offset: 0, .. }), "{error:?}");
        assert!(error.to_string().contains("at byte offset 0"), "{error}");
    }
}
