//! File names and headers of the data dir.
//!
//! ```text
//! DATA_DIR/LOCK                          held (flock) while a process uses the dir
//! DATA_DIR/segment-00000000000000000007.wal   log segment number 7
//! DATA_DIR/snapshot-00000000000000000007.snap state as of the start of segment 7
//! ```

use std::fs::{File, OpenOptions, TryLockError};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::{StorageError, io_error};

/// `magic[8] | version u32 | previous segment's length u32 | segment index u64 | crc32 u32 | reserved u32`.
pub const SEGMENT_HEADER_BYTES: usize = 32;
pub(crate) const SEGMENT_MAGIC: &[u8; 8] = b"SVCWAL\r\n";
/// The version of the segments this build writes: 2, whose frames may hold
/// records of the second record format (`docs/wal-format.md`, "Payload").
/// Segments of version 1 hold only the first and are still read; an older
/// build refuses a version-2 segment by its header instead of failing on
/// its records.
pub(crate) const SEGMENT_VERSION: u32 = 2;
/// The version of snapshot files (their header; the payload has its own).
pub(crate) const SNAPSHOT_FILE_VERSION: u32 = 1;

pub fn segment_path(dir: &Path, index: u64) -> PathBuf {
    dir.join(format!("segment-{index:020}.wal"))
}

pub fn snapshot_path(dir: &Path, index: u64) -> PathBuf {
    dir.join(format!("snapshot-{index:020}.snap"))
}

fn list_numbered(dir: &Path, prefix: &str, suffix: &str) -> Result<Vec<(u64, PathBuf)>, StorageError> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io_error(dir))? {
        let entry = entry.map_err(io_error(dir))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(number) = name.strip_prefix(prefix).and_then(|rest| rest.strip_suffix(suffix))
            && let Ok(index) = number.parse::<u64>()
        {
            found.push((index, entry.path()));
        }
    }
    found.sort();
    Ok(found)
}

/// Log segments in the dir, in index order.
pub fn list_segments(dir: &Path) -> Result<Vec<(u64, PathBuf)>, StorageError> {
    list_numbered(dir, "segment-", ".wal")
}

/// Snapshot files in the dir, in index order.
pub fn list_snapshots(dir: &Path) -> Result<Vec<(u64, PathBuf)>, StorageError> {
    list_numbered(dir, "snapshot-", ".snap")
}

/// The header of segment `index`. `previous_length` is where the frames of
/// segment `index - 1` end, when the writer knows it (0 in the header
/// otherwise): recovery checks it, so a write lost at the end of a sealed
/// segment is found instead of read as its clean end.
pub(crate) fn encode_segment_header(index: u64, previous_length: Option<u64>) -> [u8; SEGMENT_HEADER_BYTES] {
    let mut header = [0u8; SEGMENT_HEADER_BYTES];
    header[0..8].copy_from_slice(SEGMENT_MAGIC);
    header[8..12].copy_from_slice(&SEGMENT_VERSION.to_le_bytes());
    let previous = previous_length.and_then(|length| u32::try_from(length).ok()).unwrap_or(0);
    header[12..16].copy_from_slice(&previous.to_le_bytes());
    header[16..24].copy_from_slice(&index.to_le_bytes());
    let crc = crc32fast::hash(&header[0..24]);
    header[24..28].copy_from_slice(&crc.to_le_bytes());
    header
}

/// Where the previous segment's frames end, as a (checked) header records it.
pub(crate) fn previous_segment_length(header: &[u8]) -> Option<u64> {
    let length = u32::from_le_bytes(header[12..16].try_into().expect("four bytes"));
    (length != 0).then_some(u64::from(length))
}

/// The format version a segment header names.
pub(crate) fn segment_version(header: &[u8]) -> u32 {
    u32::from_le_bytes(header[8..12].try_into().expect("four bytes"))
}

/// Checks a segment header; returns the reason it is unusable.
pub(crate) fn check_segment_header(bytes: &[u8], expected_index: u64) -> Result<(), String> {
    if bytes[0..8] != SEGMENT_MAGIC[..] {
        return Err("not an svc log segment (bad magic)".to_string());
    }
    let crc = u32::from_le_bytes(bytes[24..28].try_into().expect("four bytes"));
    if crc != crc32fast::hash(&bytes[0..24]) {
        return Err("segment header checksum mismatch".to_string());
    }
    let version = segment_version(bytes);
    if !(1..=SEGMENT_VERSION).contains(&version) {
        return Err(format!(
            "segment format version {version} is not supported (this build reads 1 to {SEGMENT_VERSION})"
        ));
    }
    let index = u64::from_le_bytes(bytes[16..24].try_into().expect("eight bytes"));
    if index != expected_index {
        return Err(format!("segment header says index {index}, file name says {expected_index}"));
    }
    Ok(())
}

/// Creates the data dir (and any missing parent) readable by the server's
/// user only, since the log holds payloads, results and webhook secrets.
pub fn create_data_dir(dir: &Path) -> Result<(), StorageError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(io_error(dir))
}

/// Warns when a data dir is open to other users.
fn warn_if_open_to_others(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(metadata) = std::fs::metadata(dir)
        && metadata.permissions().mode() & 0o077 != 0
    {
        tracing::warn!(
            data_dir = %dir.display(),
            mode = %format!("{:o}", metadata.permissions().mode() & 0o777),
            "the data dir is open to other users; it holds job payloads and webhook secrets (chmod 700 it)"
        );
    }
}

/// An exclusive lock on a data dir, released when dropped.
#[derive(Debug)]
pub struct DataDirLock {
    _file: File,
}

impl DataDirLock {
    pub fn acquire(dir: &Path) -> Result<Self, StorageError> {
        create_data_dir(dir)?;
        warn_if_open_to_others(dir);
        let path = dir.join("LOCK");
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&path)
            .map_err(io_error(&path))?;
        // A lock held by another process stays held; one held by a child
        // between fork and exec (any thread of this process spawning a
        // program) is gone in a moment.
        let deadline = Instant::now() + Duration::from_millis(crate::limits::DATA_DIR_LOCK_WAIT_MS);
        let mut pause = Duration::from_millis(1);
        loop {
            match file.try_lock() {
                Ok(()) => return Ok(Self { _file: file }),
                Err(TryLockError::WouldBlock) if Instant::now() < deadline => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(50));
                }
                Err(TryLockError::WouldBlock) => return Err(StorageError::Locked(dir.to_path_buf())),
                Err(TryLockError::Error(error)) => return Err(StorageError::Io { path, error }),
            }
        }
    }
}
