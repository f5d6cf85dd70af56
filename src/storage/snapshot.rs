//! Snapshot files: the full engine state as of the start of a log segment.
//!
//! `magic[8] | version u32 | payload_version u32 | replay_from u64 |
//! payload_len u64 | payload_crc u32 | header_crc u32 | payload`. The payload
//! version tells its reader (the engine) how the payload is encoded. Written to a temp file, synced,
//! renamed into place, then the directory is synced.

use std::path::Path;

use super::layout::{FORMAT_VERSION, list_segments, list_snapshots, snapshot_path};
use super::{FileSystem, StorageError, io_error};
use crate::limits::SNAPSHOT_BYTES_MAX;

pub const SNAPSHOT_HEADER_BYTES: usize = 40;
const SNAPSHOT_MAGIC: &[u8; 8] = b"SVCSNP\r\n";

/// Writes a snapshot durably. `replay_from` is the first log segment the
/// snapshot does not cover.
pub fn write_snapshot(
    fs: &dyn FileSystem,
    dir: &Path,
    replay_from: u64,
    payload_version: u32,
    payload: &[u8],
) -> Result<(), StorageError> {
    let mut header = [0u8; SNAPSHOT_HEADER_BYTES];
    header[0..8].copy_from_slice(SNAPSHOT_MAGIC);
    header[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    header[12..16].copy_from_slice(&payload_version.to_le_bytes());
    header[16..24].copy_from_slice(&replay_from.to_le_bytes());
    header[24..32].copy_from_slice(&(payload.len() as u64).to_le_bytes());
    header[32..36].copy_from_slice(&crc32fast::hash(payload).to_le_bytes());
    let header_crc = crc32fast::hash(&header[0..36]);
    header[36..40].copy_from_slice(&header_crc.to_le_bytes());

    let final_path = snapshot_path(dir, replay_from);
    let temp_path = final_path.with_extension("snap.tmp");
    let _ = std::fs::remove_file(&temp_path);
    let file = fs.create_new(&temp_path).map_err(io_error(&temp_path))?;
    file.write_at(0, &header).map_err(io_error(&temp_path))?;
    file.write_at(SNAPSHOT_HEADER_BYTES as u64, payload).map_err(io_error(&temp_path))?;
    file.sync_data().map_err(io_error(&temp_path))?;
    drop(file);
    fs.rename(&temp_path, &final_path).map_err(io_error(&final_path))?;
    fs.sync_dir(dir).map_err(io_error(dir))
}

/// A snapshot as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotFile {
    /// The first log segment the snapshot does not cover.
    pub replay_from: u64,
    pub payload_version: u32,
    pub payload: Vec<u8>,
}

/// Reads and verifies a snapshot file.
pub fn read_snapshot(path: &Path) -> Result<SnapshotFile, StorageError> {
    let corrupt = |offset: u64, reason: &str| StorageError::Corrupt {
        path: path.to_path_buf(),
        offset,
        reason: reason.to_string(),
    };
    let bytes = super::read_file(path)?;
    if bytes.len() < SNAPSHOT_HEADER_BYTES || bytes[0..8] != SNAPSHOT_MAGIC[..] {
        return Err(corrupt(0, "not an svc snapshot (bad magic or short header)"));
    }
    let header_crc = u32::from_le_bytes(bytes[36..40].try_into().expect("four bytes"));
    if header_crc != crc32fast::hash(&bytes[0..36]) {
        return Err(corrupt(0, "snapshot header checksum mismatch"));
    }
    let version = u32::from_le_bytes(bytes[8..12].try_into().expect("four bytes"));
    if version != FORMAT_VERSION {
        return Err(corrupt(8, &format!("snapshot format version {version} is not supported")));
    }
    let replay_from = u64::from_le_bytes(bytes[16..24].try_into().expect("eight bytes"));
    let length = u64::from_le_bytes(bytes[24..32].try_into().expect("eight bytes"));
    if length > SNAPSHOT_BYTES_MAX || length != (bytes.len() - SNAPSHOT_HEADER_BYTES) as u64 {
        return Err(corrupt(24, "snapshot length does not match the file"));
    }
    let payload = &bytes[SNAPSHOT_HEADER_BYTES..];
    let crc = u32::from_le_bytes(bytes[32..36].try_into().expect("four bytes"));
    if crc != crc32fast::hash(payload) {
        return Err(corrupt(SNAPSHOT_HEADER_BYTES as u64, "snapshot payload checksum mismatch"));
    }
    let payload_version = u32::from_le_bytes(bytes[12..16].try_into().expect("four bytes"));
    Ok(SnapshotFile { replay_from, payload_version, payload: payload.to_vec() })
}

/// Once the snapshot at `replay_from` is durable: deletes the snapshots
/// before the one preceding it, the log segments only those need, and
/// leftover temp files. The preceding snapshot and its segments stay, so
/// that recovery can fall back on them if the newest snapshot is damaged;
/// with no preceding snapshot the whole log stays.
pub fn remove_obsolete(dir: &Path, replay_from: u64) -> Result<(), StorageError> {
    let snapshots = list_snapshots(dir)?;
    let keep_from = snapshots.iter().map(|(index, _)| *index).filter(|index| *index < replay_from).max().unwrap_or(0);
    for (index, path) in list_segments(dir)? {
        if index < keep_from {
            std::fs::remove_file(&path).map_err(io_error(&path))?;
        }
    }
    for (index, path) in snapshots {
        if index < keep_from {
            std::fs::remove_file(&path).map_err(io_error(&path))?;
        }
    }
    for entry in std::fs::read_dir(dir).map_err(io_error(dir))?.flatten() {
        if entry.file_name().to_str().is_some_and(|name| name.ends_with(".snap.tmp")) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::RealFileSystem;

    #[test]
    fn written_snapshot_reads_back_and_damage_is_named() {
        let dir = tempfile::tempdir().unwrap();
        write_snapshot(&RealFileSystem, dir.path(), 7, 2, b"state bytes").unwrap();
        let path = snapshot_path(dir.path(), 7);
        let expected = SnapshotFile { replay_from: 7, payload_version: 2, payload: b"state bytes".to_vec() };
        assert_eq!(read_snapshot(&path).unwrap(), expected);
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&path, bytes).unwrap();
        let error = read_snapshot(&path).unwrap_err().to_string();
        assert!(error.contains("snapshot-00000000000000000007.snap") && error.contains("offset 40"), "{error}");
    }
}
