//! Snapshot files: the full engine state as of the start of a log segment.
//!
//! `magic[8] | version u32 | payload_version u32 | replay_from u64 |
//! payload_len u64 | payload_crc u32 | header_crc u32 | payload`. The payload
//! version tells its reader (the engine) how the payload is encoded. Written
//! to a temp file (the payload streamed in pieces, past the page cache where
//! asked and allowed, the header last), synced, renamed into place, then the
//! directory is synced.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use super::direct::AlignedBuffer;
use super::fs::DIRECT_BLOCK_BYTES;
use super::layout::{SNAPSHOT_FILE_VERSION, list_segments, list_snapshots, snapshot_path};
use super::{FileSystem, LogFile, StorageError, io_error};
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
    write_snapshot_with(fs, dir, replay_from, payload_version, PageCache::Fill, &mut |out| out.write_all(payload))
        .map(|_| ())
}

/// Whether a snapshot's bytes stay in the page cache once written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageCache {
    /// Written past it where the file system allows direct writes: a
    /// snapshot taken while the server runs. Copying gigabytes into the cache
    /// and writing them back took CPU time and disk bandwidth from the
    /// requests of the moment (docs/wal-format.md, "Snapshot").
    Bypass,
    /// Written through it, so that it holds the file for the restart that
    /// follows: the final snapshot of a clean stop (and one asked for).
    Fill,
}

/// Writes a snapshot durably, its payload streamed out by `write_payload`
/// (in pieces of a megabyte, never whole in memory); returns the payload's
/// length. `replay_from` is the first log segment the snapshot does not cover.
pub fn write_snapshot_with(
    fs: &dyn FileSystem,
    dir: &Path,
    replay_from: u64,
    payload_version: u32,
    cache: PageCache,
    write_payload: &mut dyn FnMut(&mut dyn Write) -> std::io::Result<()>,
) -> Result<u64, StorageError> {
    let final_path = snapshot_path(dir, replay_from);
    let temp_path = final_path.with_extension("snap.tmp");
    let _ = std::fs::remove_file(&temp_path);
    let file = fs.create_new(&temp_path).map_err(io_error(&temp_path))?;
    let direct = match cache {
        PageCache::Bypass => fs.open_direct_unsynced(&temp_path).map_err(io_error(&temp_path))?,
        PageCache::Fill => None,
    };
    let mut out = PayloadWriter::new(file.as_ref(), direct);
    write_payload(&mut out).and_then(|()| out.put_piece()).map_err(io_error(&temp_path))?;
    let length = out.piece_at - SNAPSHOT_HEADER_BYTES as u64;
    let header = encode_header(payload_version, replay_from, length, out.crc.finalize());
    file.write_at(0, &header).map_err(io_error(&temp_path))?;
    // Also makes the direct writes durable: they are the same file's.
    file.sync_data().map_err(io_error(&temp_path))?;
    drop(file);
    fs.rename(&temp_path, &final_path).map_err(io_error(&final_path))?;
    fs.sync_dir(dir).map_err(io_error(dir))?;
    Ok(length)
}

/// How much of a payload is gathered before it is written.
const WRITE_PIECE_BYTES: usize = 1024 * 1024;
/// The unit the page cache writes back in, and direct writes align to.
const PAGE_BYTES: u64 = DIRECT_BLOCK_BYTES as u64;

/// Streams a payload into a snapshot file after its header, checksumming it
/// on the way. Pieces start at block boundaries (the first at the file's
/// start, with zeros where the header goes later), so whole blocks of them
/// can go out as direct writes; what is left, or everything when there is
/// no direct handle, goes through the page cache.
struct PayloadWriter<'a> {
    file: &'a dyn LogFile,
    /// A direct handle to the file, while its writes work.
    direct: Option<Arc<dyn LogFile>>,
    /// The piece being gathered: its first `filled` bytes go at `piece_at`.
    piece: AlignedBuffer,
    filled: usize,
    piece_at: u64,
    /// Where the bytes written through the page cache but not yet started
    /// on their way to the device begin.
    written_back: u64,
    crc: crc32fast::Hasher,
}

impl<'a> PayloadWriter<'a> {
    fn new(file: &'a dyn LogFile, direct: Option<Arc<dyn LogFile>>) -> Self {
        // The header's place, filled in once the payload's length and checksum are known.
        let filled = SNAPSHOT_HEADER_BYTES;
        let mut piece = AlignedBuffer::with_bytes(WRITE_PIECE_BYTES);
        piece.bytes_mut()[..filled].fill(0);
        Self { file, direct, piece, filled, piece_at: 0, written_back: 0, crc: crc32fast::Hasher::new() }
    }

    /// Writes the piece gathered so far and starts the next one after it.
    fn put_piece(&mut self) -> std::io::Result<()> {
        let filled = self.filled;
        let mut written = 0;
        if let Some(direct) = &self.direct {
            let whole_blocks = filled / DIRECT_BLOCK_BYTES * DIRECT_BLOCK_BYTES;
            match direct.write_at(self.piece_at, &self.piece.bytes()[..whole_blocks]) {
                Ok(()) => written = whole_blocks,
                // The file system opened the handle but refuses its writes:
                // the page cache takes this piece and the rest.
                Err(error) if error.raw_os_error() == Some(libc::EINVAL) => self.direct = None,
                Err(error) => return Err(error),
            }
        }
        if written < filled {
            self.file.write_at(self.piece_at + written as u64, &self.piece.bytes()[written..filled])?;
        }
        self.piece_at += filled as u64;
        self.filled = 0;
        if self.direct.is_none() {
            self.start_writeback();
        }
        Ok(())
    }

    /// Starts the whole pages written through the page cache on their way
    /// to the device. Left to the final sync, a snapshot of gigabytes went to
    /// the device in one burst that the log's synced writes queued behind
    /// (the slowest enqueue at 5 M jobs waited 0.3-0.9 s); started piece by
    /// piece, the device takes it while it is being written. Whole pages
    /// only: a page started while half written would be written again, and
    /// the next write to it could wait for the first.
    fn start_writeback(&mut self) {
        let whole_pages_end = self.piece_at / PAGE_BYTES * PAGE_BYTES;
        if whole_pages_end > self.written_back {
            self.file.start_writeback(self.written_back, whole_pages_end - self.written_back);
            self.written_back = whole_pages_end;
        }
    }
}

impl Write for PayloadWriter<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.crc.update(bytes);
        let mut rest = bytes;
        while !rest.is_empty() {
            let taken = rest.len().min(WRITE_PIECE_BYTES - self.filled);
            self.piece.bytes_mut()[self.filled..self.filled + taken].copy_from_slice(&rest[..taken]);
            self.filled += taken;
            rest = &rest[taken..];
            if self.filled == WRITE_PIECE_BYTES {
                self.put_piece()?;
            }
        }
        Ok(bytes.len())
    }

    /// Pieces are written as they fill; the last one by the snapshot's writer.
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn encode_header(payload_version: u32, replay_from: u64, length: u64, crc: u32) -> [u8; SNAPSHOT_HEADER_BYTES] {
    let mut header = [0u8; SNAPSHOT_HEADER_BYTES];
    header[0..8].copy_from_slice(SNAPSHOT_MAGIC);
    header[8..12].copy_from_slice(&SNAPSHOT_FILE_VERSION.to_le_bytes());
    header[12..16].copy_from_slice(&payload_version.to_le_bytes());
    header[16..24].copy_from_slice(&replay_from.to_le_bytes());
    header[24..32].copy_from_slice(&length.to_le_bytes());
    header[32..36].copy_from_slice(&crc.to_le_bytes());
    let header_crc = crc32fast::hash(&header[0..36]);
    header[36..40].copy_from_slice(&header_crc.to_le_bytes());
    header
}

/// A snapshot as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotFile {
    /// The first log segment the snapshot does not cover.
    pub replay_from: u64,
    pub payload_version: u32,
    pub payload: Vec<u8>,
}

/// Reads and verifies a whole snapshot file (for inspection and tests;
/// recovery decodes the payload as it reads it, with [`open_snapshot`]).
pub fn read_snapshot(path: &Path) -> Result<SnapshotFile, StorageError> {
    let mut open = open_snapshot(path)?;
    let mut payload = Vec::with_capacity(usize::try_from(open.payload.remaining()).unwrap_or(0));
    if let Err(error) = std::io::Read::read_to_end(&mut open.payload, &mut payload) {
        return Err(open.payload.read_failure().unwrap_or_else(|| io_error(path)(error)));
    }
    open.payload.finish()?;
    Ok(SnapshotFile { replay_from: open.replay_from, payload_version: open.payload_version, payload })
}

/// A snapshot opened for reading: its header checked, its payload to be
/// read as it is decoded ([`SnapshotPayload`]), so that the payload is never
/// whole in memory beside the state it becomes.
pub struct OpenSnapshot {
    /// The first log segment the snapshot does not cover.
    pub replay_from: u64,
    pub payload_version: u32,
    pub payload: SnapshotPayload,
}

/// Reads the newest snapshot in `dir` through the page cache, so that the
/// next start finds it there: one written past the cache would otherwise be
/// read from the device (10 M jobs loaded in 7 s instead of 3.5 s). Returns
/// the bytes read.
pub fn read_newest_into_page_cache(dir: &Path) -> Result<u64, StorageError> {
    use std::io::Read;
    let Some((_, path)) = list_snapshots(dir)?.pop() else { return Ok(0) };
    let mut file = std::fs::File::open(&path).map_err(io_error(&path))?;
    let mut buffer = vec![0u8; WRITE_PIECE_BYTES];
    let mut total = 0u64;
    loop {
        match file.read(&mut buffer).map_err(io_error(&path))? {
            0 => return Ok(total),
            read => total += read as u64,
        }
    }
}

/// Opens a snapshot file and checks its header; the payload's checksum is
/// checked by [`SnapshotPayload::finish`], once it has been read.
pub fn open_snapshot(path: &Path) -> Result<OpenSnapshot, StorageError> {
    let corrupt = |offset: u64, reason: &str| StorageError::Corrupt {
        path: path.to_path_buf(),
        offset,
        reason: reason.to_string(),
    };
    let file = std::fs::File::open(path).map_err(io_error(path))?;
    let file_length = file.metadata().map_err(io_error(path))?.len();
    if file_length < SNAPSHOT_HEADER_BYTES as u64 {
        return Err(corrupt(0, "not an svc snapshot (bad magic or short header)"));
    }
    let header = super::read_range(&file, path, 0, SNAPSHOT_HEADER_BYTES)?;
    let (replay_from, payload_version, length, crc) = check_header(&header).map_err(|(at, why)| corrupt(at, &why))?;
    if length != file_length - SNAPSHOT_HEADER_BYTES as u64 {
        return Err(corrupt(24, "snapshot length does not match the file"));
    }
    let payload = SnapshotPayload {
        file,
        path: path.to_path_buf(),
        at: SNAPSHOT_HEADER_BYTES as u64,
        end: file_length,
        expected_crc: crc,
        crc: crc32fast::Hasher::new(),
        failed_read: None,
    };
    Ok(OpenSnapshot { replay_from, payload_version, payload })
}

/// The payload of an open snapshot, read in order; checksummed as it is read.
pub struct SnapshotPayload {
    file: std::fs::File,
    path: std::path::PathBuf,
    /// The file offset of the next byte to read.
    at: u64,
    end: u64,
    expected_crc: u32,
    crc: crc32fast::Hasher,
    /// Where a read failed, and why (a device error, not the end of the payload).
    failed_read: Option<(u64, std::io::Error)>,
}

impl SnapshotPayload {
    /// Bytes of the payload not yet read.
    pub fn remaining(&self) -> u64 {
        self.end - self.at
    }

    /// A read that failed, as the error that names the file and offset.
    pub fn read_failure(&mut self) -> Option<StorageError> {
        self.failed_read.take().map(|(offset, error)| StorageError::Read { path: self.path.clone(), offset, error })
    }

    /// After decoding: every byte was read and the checksum matches.
    pub fn finish(mut self) -> Result<(), StorageError> {
        if let Some(error) = self.read_failure() {
            return Err(error);
        }
        let corrupt = |reason: &str| StorageError::Corrupt {
            path: self.path.clone(),
            offset: SNAPSHOT_HEADER_BYTES as u64,
            reason: reason.to_string(),
        };
        if self.at != self.end {
            return Err(corrupt("snapshot payload has bytes after the state"));
        }
        if self.crc.clone().finalize() != self.expected_crc {
            return Err(corrupt("snapshot payload checksum mismatch"));
        }
        Ok(())
    }
}

impl std::io::Read for SnapshotPayload {
    fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
        use std::os::unix::fs::FileExt;
        let wanted = buffer.len().min(self.remaining().try_into().unwrap_or(usize::MAX));
        if wanted == 0 {
            return Ok(0);
        }
        match self.file.read_at(&mut buffer[..wanted], self.at) {
            Ok(read) => {
                self.crc.update(&buffer[..read]);
                self.at += read as u64;
                Ok(read)
            }
            Err(error) => {
                let kind = error.kind();
                self.failed_read = Some((self.at, error));
                Err(std::io::Error::new(kind, "snapshot read failed"))
            }
        }
    }
}

/// Checks a header: (replay_from, payload_version, payload length, payload
/// checksum), or where and why it is not a header this build reads.
fn check_header(header: &[u8]) -> Result<(u64, u32, u64, u32), (u64, String)> {
    if header.len() < SNAPSHOT_HEADER_BYTES || header[0..8] != SNAPSHOT_MAGIC[..] {
        return Err((0, "not an svc snapshot (bad magic or short header)".into()));
    }
    let header_crc = u32::from_le_bytes(header[36..40].try_into().expect("four bytes"));
    if header_crc != crc32fast::hash(&header[0..36]) {
        return Err((0, "snapshot header checksum mismatch".into()));
    }
    let version = u32::from_le_bytes(header[8..12].try_into().expect("four bytes"));
    if version != SNAPSHOT_FILE_VERSION {
        return Err((8, format!("snapshot format version {version} is not supported")));
    }
    let replay_from = u64::from_le_bytes(header[16..24].try_into().expect("eight bytes"));
    let length = u64::from_le_bytes(header[24..32].try_into().expect("eight bytes"));
    if length > SNAPSHOT_BYTES_MAX {
        return Err((24, "snapshot length does not match the file".into()));
    }
    let crc = u32::from_le_bytes(header[32..36].try_into().expect("four bytes"));
    let payload_version = u32::from_le_bytes(header[12..16].try_into().expect("four bytes"));
    Ok((replay_from, payload_version, length, crc))
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
    use crate::storage::{FaultyFileSystem, RealFileSystem};

    #[test]
    fn a_streamed_payload_reads_back_whole_across_pieces() {
        // Small writes that cross piece boundaries, one write larger than a
        // piece, and a tail; and a payload that ends on a block boundary.
        let small: Vec<u8> = (0..WRITE_PIECE_BYTES + 10).map(|n| (n % 251) as u8).collect();
        let large = vec![7u8; WRITE_PIECE_BYTES * 2 + 3];
        let mut uneven = small.clone();
        uneven.extend_from_slice(&large);
        uneven.extend_from_slice(b"end");
        let block_end = vec![9u8; 3 * DIRECT_BLOCK_BYTES - SNAPSHOT_HEADER_BYTES];
        let piece_end = vec![5u8; WRITE_PIECE_BYTES - SNAPSHOT_HEADER_BYTES];
        let counted = FaultyFileSystem::failing_after(i64::MAX);
        let file_systems: [(&str, &dyn FileSystem); 4] = [
            ("real", &RealFileSystem),
            ("counted", &counted),
            ("refusing direct writes", &FaultyFileSystem::failing_after(i64::MAX).refusing_direct_writes()),
            ("without direct writes", &FaultyFileSystem::failing_after(i64::MAX).without_direct_writes()),
        ];
        for (name, fs) in file_systems {
            for cache in [PageCache::Bypass, PageCache::Fill] {
                for expected in [&uneven, &block_end, &piece_end] {
                    let dir = tempfile::tempdir().unwrap();
                    let length = write_snapshot_with(fs, dir.path(), 3, 5, cache, &mut |out| {
                        for chunk in expected.chunks(1000).take(WRITE_PIECE_BYTES / 1000 + 1) {
                            out.write_all(chunk)?;
                        }
                        let rest = ((WRITE_PIECE_BYTES / 1000 + 1) * 1000).min(expected.len());
                        out.write_all(&expected[rest..])
                    })
                    .unwrap();
                    assert_eq!(length, expected.len() as u64, "{name}, {cache:?}");
                    let read = read_snapshot(&snapshot_path(dir.path(), 3)).unwrap();
                    assert_eq!((read.replay_from, read.payload_version), (3, 5));
                    assert!(read.payload == *expected, "{name}, {cache:?}: the payload reads back as written");
                }
            }
        }
        // Where the temp dir's file system offers direct writes, `Bypass` used them.
        let probe = tempfile::tempdir().unwrap();
        let probe_path = probe.path().join("probe");
        let offered = RealFileSystem.create_new(&probe_path).is_ok()
            && RealFileSystem.open_direct_unsynced(&probe_path).is_ok_and(|direct| direct.is_some());
        assert_eq!(counted.direct_writes_made() > 0, offered, "direct writes made only where offered");
    }

    #[test]
    fn the_newest_snapshot_is_read_whole_into_the_page_cache() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read_newest_into_page_cache(dir.path()).unwrap(), 0, "no snapshot yet");
        write_snapshot(&RealFileSystem, dir.path(), 2, 1, &[1u8; 5000]).unwrap();
        write_snapshot(&RealFileSystem, dir.path(), 4, 1, &[1u8; 9000]).unwrap();
        let newest = std::fs::metadata(snapshot_path(dir.path(), 4)).unwrap().len();
        assert_eq!(read_newest_into_page_cache(dir.path()).unwrap(), newest);
    }

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
