//! The write-ahead log: segment files of CRC frames, one frame per commit batch.
//!
//! Writing: the engine appends a batch's frame and syncs once (group commit).
//! Any write or sync error poisons the writer for good, except a full disk:
//! then the writer goes on writing into the space laid down ahead of it
//! ([`WalWriter::space_budget`] tells how much) and takes more once space is
//! freed.
//!
//! Reading the log back: [`replay_log`] (`wal/replay.rs`). Zeroed space ahead
//! of the writer: the zeroer (`wal/zeroer.rs`).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::direct::DirectWriter;
use super::frame::encode_frame;
use super::layout::{SEGMENT_HEADER_BYTES, SEGMENT_VERSION, encode_segment_header, segment_path, segment_version};
use super::{FileSystem, LogFile, StorageError, io_error, is_out_of_descriptors};
use crate::limits::FRAME_PAYLOAD_BYTES_MAX;
use zeroer::{ZERO_CHUNK_BYTES, ZEROER_FULL_RETRY, Zeroer};

mod replay;
mod zeroer;

pub use replay::{FrameVisitor, ReplayEnd, SegmentScan, TailPolicy, replay_log, scan_segment};

/// Log bytes a frame needs beyond its records: its header, a sequence's
/// count, and a direct write's padding to the next block.
const FRAME_OVERHEAD_BYTES: u64 = 8 * 1024;

/// Whether an I/O error means the disk (or the user's quota) is full.
pub(crate) fn is_no_space(error: &std::io::Error) -> bool {
    matches!(error.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

/// Appends frames to the current segment and rotates segments.
///
/// Segment space is zero-filled and synced ahead of the write offset by a
/// background thread, so a commit overwrites allocated blocks and its
/// `fdatasync` has no file-size change to journal: about half the cost of
/// an appending sync. Recovery reads an all-zero tail as a clean end.
///
/// Where the file system allows, frames go out as direct writes that are
/// durable on return (see `direct.rs`); elsewhere through the page cache,
/// made durable by the caller's sync.
pub struct WalWriter {
    dir: PathBuf,
    fs: Arc<dyn FileSystem>,
    file: Arc<dyn LogFile>,
    segment_index: u64,
    /// Where the next frame goes.
    offset: u64,
    segment_bytes_max: u64,
    poisoned: bool,
    frame_buffer: Vec<u8>,
    zeroer: Zeroer,
    /// Frames go out through this when the file system offers direct writes.
    direct: Option<DirectWriter>,
    /// The file system turned a direct write down; no more are tried.
    direct_refused: bool,
    /// The segment is full but the next could not be made (no space); the
    /// writer goes on past the segment's size into its zeroed reserve.
    rotation_pending: bool,
    /// When a pending segment change was last tried.
    last_rotation_try: std::time::Instant,
}

impl WalWriter {
    /// Starts a new, empty segment `index`.
    pub fn create(
        fs: Arc<dyn FileSystem>,
        dir: &Path,
        index: u64,
        segment_bytes_max: u64,
    ) -> Result<Self, StorageError> {
        Self::create_after(fs, dir, index, None, segment_bytes_max)
    }

    /// Starts a new, empty segment `index`, recording where the frames of
    /// the one before it end when known.
    fn create_after(
        fs: Arc<dyn FileSystem>,
        dir: &Path,
        index: u64,
        previous_length: Option<u64>,
        segment_bytes_max: u64,
    ) -> Result<Self, StorageError> {
        let header = encode_segment_header(index, previous_length);
        let file = create_segment(fs.as_ref(), dir, index, segment_bytes_max, &header)?;
        let path = segment_path(dir, index);
        let zeroed = file.size().map_err(io_error(&path))?;
        let direct = open_direct(fs.as_ref(), &path, SEGMENT_HEADER_BYTES as u64, Some(&header))?;
        let zeroer = Zeroer::start(fs.as_ref(), &path, SEGMENT_HEADER_BYTES as u64, zeroed, segment_bytes_max)?;
        Ok(Self {
            dir: dir.to_path_buf(),
            fs,
            file,
            segment_index: index,
            offset: SEGMENT_HEADER_BYTES as u64,
            segment_bytes_max,
            poisoned: false,
            frame_buffer: Vec::new(),
            zeroer,
            direct,
            direct_refused: false,
            rotation_pending: false,
            last_rotation_try: std::time::Instant::now(),
        })
    }

    /// Continues segment `index`, whose first `valid_bytes` hold frames and
    /// whose rest is zeros. A segment of an older version is left as it is
    /// and the next one started: its version says which records it may hold.
    pub fn resume(
        fs: Arc<dyn FileSystem>,
        dir: &Path,
        index: u64,
        valid_bytes: u64,
        segment_bytes_max: u64,
    ) -> Result<Self, StorageError> {
        let path = segment_path(dir, index);
        if valid_bytes < SEGMENT_HEADER_BYTES as u64 {
            std::fs::remove_file(&path).map_err(io_error(&path))?;
            return Self::create(fs, dir, index, segment_bytes_max);
        }
        let mut header = [0u8; SEGMENT_HEADER_BYTES];
        std::fs::File::open(&path).and_then(|mut file| file.read_exact(&mut header)).map_err(io_error(&path))?;
        if segment_version(&header) < SEGMENT_VERSION {
            return Self::create_after(fs, dir, index + 1, Some(valid_bytes), segment_bytes_max);
        }
        let file = fs.open_existing(&path).map_err(io_error(&path))?;
        let zeroed = file.size().map_err(io_error(&path))?;
        let direct = open_direct(fs.as_ref(), &path, valid_bytes, None)?;
        let zeroer = Zeroer::start(fs.as_ref(), &path, valid_bytes, zeroed, segment_bytes_max)?;
        Ok(Self {
            dir: dir.to_path_buf(),
            fs,
            file,
            segment_index: index,
            offset: valid_bytes,
            segment_bytes_max,
            poisoned: false,
            frame_buffer: Vec::new(),
            zeroer,
            direct,
            direct_refused: false,
            rotation_pending: false,
            last_rotation_try: std::time::Instant::now(),
        })
    }

    pub fn segment_index(&self) -> u64 {
        self.segment_index
    }

    /// With the disk full, how many more bytes of records fit in the space
    /// already laid down ahead of the writer; `None` while the log can grow.
    /// A full segment is closed here (every frame before a turn is durable),
    /// or at the next append; one that waits for space is tried again at
    /// most twice a second.
    pub fn space_budget(&mut self) -> Option<u64> {
        if self.offset >= self.segment_bytes_max && !self.rotation_waits() {
            let _ = self.rotate();
        }
        if !self.zeroer.is_full() && !self.rotation_pending {
            return None;
        }
        let ahead = self.zeroer.zeroed_end().saturating_sub(self.offset);
        Some(ahead.saturating_sub(FRAME_OVERHEAD_BYTES))
    }

    pub fn is_poisoned(&self) -> bool {
        self.poisoned
    }

    /// Marks the log failed, e.g. after a sync on another thread failed.
    pub fn poison(&mut self) {
        self.poisoned = true;
    }

    /// Writes `payload` as one frame without syncing; rotates when the segment
    /// is full. The caller must sync the returned range before acknowledging
    /// anything in it, and must not append again until that sync succeeded:
    /// recovery relies on every frame being written after the previous one was
    /// durable.
    pub fn append(&mut self, payload: &[u8]) -> Result<Written, StorageError> {
        if self.poisoned {
            return Err(StorageError::Poisoned);
        }
        if let Some(error) = self.zeroer.take_failure() {
            // The zeroer's own handle saw a write or sync fail: what the
            // writer's syncs report can no longer be trusted.
            self.poisoned = true;
            return Err(StorageError::Io { path: segment_path(&self.dir, self.segment_index), error });
        }
        // A full segment is closed only now, when every frame in it is
        // durable: closing it right after writing its last frame would let a
        // crash before that frame's sync leave it torn in a sealed segment.
        if self.offset >= self.segment_bytes_max && !self.rotation_waits() {
            match self.rotate() {
                // No room or no descriptor for the next segment: go on in
                // this one (into its reserve), and try again shortly.
                Ok(_) => {}
                Err(error) if error.is_transient() => {}
                Err(error) => return Err(error),
            }
        }
        if payload.is_empty() || payload.len() > FRAME_PAYLOAD_BYTES_MAX {
            return Err(StorageError::Corrupt {
                path: segment_path(&self.dir, self.segment_index),
                offset: self.offset,
                reason: format!("refusing to write a frame of {} bytes", payload.len()),
            });
        }
        self.frame_buffer.clear();
        encode_frame(payload, &mut self.frame_buffer);
        let length = self.frame_buffer.len() as u64;
        let reach = match self.direct {
            Some(_) => DirectWriter::padded_end(self.offset, length),
            None => self.offset + length,
        };
        if reach > self.zeroer.zeroed_end() {
            // The zeroer fell behind: stop it so the two never write the same range.
            self.zeroer.stop();
        }
        let path = segment_path(&self.dir, self.segment_index);
        let durable = match self.write_frame() {
            Ok(durable) => durable,
            Err(error) => {
                self.poisoned = true;
                return Err(StorageError::Io { path, error });
            }
        };
        let written = Written { file: self.file.clone(), path, start: self.offset, end: self.offset + length, durable };
        self.offset += length;
        if self.zeroer.is_stopped() {
            // Past the frame that outran it, zeroing starts again. Without a
            // descriptor for it, frames go on past the zeroed space (each
            // sync then also records the file's new size) and the next
            // append tries again.
            let zeroed = self.file.size().unwrap_or(self.offset).max(self.offset);
            match Zeroer::start(self.fs.as_ref(), &written.path, self.offset, zeroed, self.segment_bytes_max) {
                Ok(zeroer) => self.zeroer = zeroer,
                Err(error) if error.is_transient() => {}
                Err(error) => {
                    self.poisoned = true;
                    return Err(error);
                }
            }
        }
        self.zeroer.note_offset(self.offset);
        Ok(written)
    }

    /// Writes the encoded frame at the offset; whether it is durable already.
    fn write_frame(&mut self) -> std::io::Result<bool> {
        if let Some(direct) = self.direct.as_mut() {
            match direct.write(self.offset, &self.frame_buffer) {
                Ok(()) => return Ok(true),
                // Opened for direct I/O, but a direct write is refused (as
                // some file systems do): nothing was written; use the page cache.
                Err(error) if error.raw_os_error() == Some(libc::EINVAL) => {
                    tracing::warn!(
                        file = %segment_path(&self.dir, self.segment_index).display(),
                        "the file system refuses direct writes; the log goes through the page cache"
                    );
                    self.direct = None;
                    self.direct_refused = true;
                }
                Err(error) => return Err(error),
            }
        }
        self.file.write_at(self.offset, &self.frame_buffer)?;
        Ok(false)
    }

    /// Writes `payload` as one frame and syncs it. Returns the bytes written.
    pub fn commit(&mut self, payload: &[u8]) -> Result<u64, StorageError> {
        let written = self.append(payload)?;
        if let Err(error) = written.sync() {
            self.poisoned = true;
            return Err(error);
        }
        Ok(written.end - written.start)
    }

    /// Whether a segment change that found no space was tried less than
    /// half a second ago (it is not tried again sooner).
    fn rotation_waits(&self) -> bool {
        self.rotation_pending && self.last_rotation_try.elapsed() < ZEROER_FULL_RETRY
    }

    /// Closes the current segment and starts the next; returns the new index.
    /// With no space for the next segment, the current one stays open (the
    /// log is not poisoned) and the next append or rotation tries again.
    pub fn rotate(&mut self) -> Result<u64, StorageError> {
        if self.poisoned {
            return Err(StorageError::Poisoned);
        }
        let next = self.segment_index + 1;
        let header = encode_segment_header(next, Some(self.offset));
        let result = self.open_segment(next, &header);
        let (file, direct, zeroer) = match result {
            Ok(opened) => opened,
            Err(error) => {
                if error.is_transient() {
                    self.rotation_pending = true;
                    self.last_rotation_try = std::time::Instant::now();
                } else {
                    self.poisoned = true;
                }
                return Err(error);
            }
        };
        self.zeroer.stop();
        self.direct = direct;
        self.zeroer = zeroer;
        self.file = file;
        self.segment_index = next;
        self.offset = SEGMENT_HEADER_BYTES as u64;
        self.rotation_pending = false;
        Ok(next)
    }

    /// Creates segment `index` with every handle the writer needs on it.
    /// Nothing of the current segment changes here, so a failure for want
    /// of descriptors or space leaves the writer as it was; the half-made
    /// segment is removed first, durably, since its header records where
    /// the current one ended and frames still go there.
    fn open_segment(&self, index: u64, header: &[u8; SEGMENT_HEADER_BYTES]) -> Result<SegmentHandles, StorageError> {
        let file = create_segment(self.fs.as_ref(), &self.dir, index, self.segment_bytes_max, header)?;
        let path = segment_path(&self.dir, index);
        let handles = (|| -> Result<_, StorageError> {
            let direct = if self.direct_refused {
                None
            } else {
                open_direct(self.fs.as_ref(), &path, SEGMENT_HEADER_BYTES as u64, Some(header))?
            };
            let zeroed = file.size().unwrap_or(SEGMENT_HEADER_BYTES as u64);
            let zeroer =
                Zeroer::start(self.fs.as_ref(), &path, SEGMENT_HEADER_BYTES as u64, zeroed, self.segment_bytes_max)?;
            Ok((direct, zeroer))
        })();
        match handles {
            Ok((direct, zeroer)) => Ok((file, direct, zeroer)),
            Err(error) => {
                // The new file's own handle goes first: its descriptor is the
                // one the directory sync below needs.
                drop(file);
                if error.is_transient() {
                    std::fs::remove_file(&path)
                        .map_err(io_error(&path))
                        .and_then(|()| self.fs.sync_dir(&self.dir).map_err(io_error(&self.dir)))
                        .map_err(|_| error_not_transient(&error, &path))?;
                }
                Err(error)
            }
        }
    }
}

/// A new segment's handles: the file, its direct handle if any, its zeroer.
type SegmentHandles = (Arc<dyn LogFile>, Option<DirectWriter>, Zeroer);

/// A transient failure whose clean-up failed too: the half-made segment may
/// be left behind, so the log cannot go on.
fn error_not_transient(error: &StorageError, path: &Path) -> StorageError {
    StorageError::Io {
        path: path.to_path_buf(),
        error: std::io::Error::other(format!("{error}; removing the half-made segment failed as well")),
    }
}

impl Drop for WalWriter {
    fn drop(&mut self) {
        self.zeroer.stop();
    }
}

/// A frame written but not yet synced. It holds its own handle on the file,
/// so it can be synced on another thread, even after the writer rotated.
pub struct Written {
    file: Arc<dyn LogFile>,
    path: PathBuf,
    start: u64,
    end: u64,
    /// Written directly, and durable already.
    durable: bool,
}

impl Written {
    /// Syncs the file (and with it every earlier write to it). On failure the
    /// frame is zeroed, best effort, so a restart does not bring back a write
    /// whose client was told it failed; after a failed sync the kernel's view
    /// of the file is uncertain, which is why the log is poisoned either way.
    pub fn sync(&self) -> Result<(), StorageError> {
        if self.durable {
            return Ok(());
        }
        self.file.sync_data().map_err(|error| {
            let _ = self.file.write_at(self.start, &vec![0u8; (self.end - self.start) as usize]);
            StorageError::Io { path: self.path.clone(), error }
        })
    }
}

/// Creates segment `index` with its header and a first zeroed chunk, synced,
/// and makes its directory entry durable.
fn create_segment(
    fs: &dyn FileSystem,
    dir: &Path,
    index: u64,
    segment_bytes_max: u64,
    header: &[u8; SEGMENT_HEADER_BYTES],
) -> Result<Arc<dyn LogFile>, StorageError> {
    let path = segment_path(dir, index);
    let no_space = |error: std::io::Error| {
        if is_no_space(&error) {
            // Nothing half made stays behind to be read as a torn segment.
            let _ = std::fs::remove_file(&path);
            StorageError::NoSpace { path: path.clone() }
        } else if is_out_of_descriptors(&error) {
            let _ = std::fs::remove_file(&path);
            StorageError::NoDescriptors { path: path.clone(), error }
        } else {
            StorageError::Io { path: path.clone(), error }
        }
    };
    let file = fs.create_new(&path).map_err(no_space)?;
    let header_end = SEGMENT_HEADER_BYTES as u64;
    let first_chunk = ZERO_CHUNK_BYTES.min(segment_bytes_max.saturating_sub(header_end));
    file.write_at(0, header).map_err(no_space)?;
    file.write_at(header_end, &vec![0u8; first_chunk as usize]).map_err(no_space)?;
    file.sync_data().map_err(no_space)?;
    fs.sync_dir(dir).map_err(no_space)?;
    Ok(file)
}

/// Maps a failure to open a file: out of descriptors is transient.
fn open_error(path: &Path) -> impl Fn(std::io::Error) -> StorageError + '_ {
    move |error| {
        if is_out_of_descriptors(&error) {
            StorageError::NoDescriptors { path: path.to_path_buf(), error }
        } else {
            StorageError::Io { path: path.to_path_buf(), error }
        }
    }
}

/// Opens the direct handle for the segment at `path`, whose bytes before
/// `offset` are written, if the file system offers one.
fn open_direct(
    fs: &dyn FileSystem,
    path: &Path,
    offset: u64,
    head: Option<&[u8]>,
) -> Result<Option<DirectWriter>, StorageError> {
    match fs.open_direct(path).map_err(open_error(path))? {
        Some(file) => Ok(Some(DirectWriter::new(file, path, offset, head).map_err(io_error(path))?)),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::zeroer::ZERO_LOOKAHEAD_BYTES;
    use super::*;
    use crate::storage::{FaultyFileSystem, RealFileSystem, list_segments};
    use std::time::Duration;

    fn collect(dir: &Path, policy: TailPolicy) -> Result<(Vec<Vec<u8>>, ReplayEnd), StorageError> {
        let mut frames = Vec::new();
        let end = replay_log(dir, 0, policy, &mut |_, _, payload| {
            frames.push(payload.to_vec());
            Ok(())
        })?;
        Ok((frames, end))
    }

    fn write_frames(dir: &Path, payloads: &[&[u8]], segment_max: u64) {
        let mut writer = WalWriter::create(Arc::new(RealFileSystem), dir, 0, segment_max).unwrap();
        for payload in payloads {
            writer.commit(payload).unwrap();
        }
    }

    #[test]
    fn frames_come_back_across_rotations() {
        let dir = tempfile::tempdir().unwrap();
        write_frames(dir.path(), &[b"one", b"two", b"three", b"four"], 50);
        let (frames, end) = collect(dir.path(), TailPolicy::Truncate).unwrap();
        assert_eq!(frames, [b"one".to_vec(), b"two".to_vec(), b"three".to_vec(), b"four".to_vec()]);
        assert!(end.scans.len() > 1, "segments rotated");
    }

    #[test]
    fn torn_tail_is_cut_off() {
        let dir = tempfile::tempdir().unwrap();
        write_frames(dir.path(), &[b"one", b"two"], 1 << 20);
        let path = segment_path(dir.path(), 0);
        // The last two bytes of the second frame never reached the disk.
        let second_end = SEGMENT_HEADER_BYTES + 11 + 11;
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[second_end - 2..second_end].fill(0);
        std::fs::write(&path, &bytes).unwrap();
        let (frames, end) = collect(dir.path(), TailPolicy::Truncate).unwrap();
        assert_eq!(frames, [b"one".to_vec()]);
        let torn_at = SEGMENT_HEADER_BYTES as u64 + 11;
        assert_eq!(end.scans[0].torn_at.as_ref().map(|(offset, _)| *offset), Some(torn_at));
        assert_eq!(end.last_segment, Some((0, torn_at)));
        let after = std::fs::read(&path).unwrap();
        assert!(after[torn_at as usize..].iter().all(|byte| *byte == 0), "the torn frame is zeroed");
        let (frames, end) = collect(dir.path(), TailPolicy::Truncate).unwrap();
        assert_eq!((frames.len(), end.scans[0].torn_at.clone()), (1, None), "a second start sees a clean end");
    }

    #[test]
    fn zeroed_space_after_the_frames_is_a_clean_end() {
        let dir = tempfile::tempdir().unwrap();
        write_frames(dir.path(), &[b"one"], 64 << 20);
        let path = segment_path(dir.path(), 0);
        assert!(std::fs::metadata(&path).unwrap().len() >= 1 << 20, "space is zero-filled ahead");
        let (frames, end) = collect(dir.path(), TailPolicy::ReadOnly).unwrap();
        assert_eq!((frames.len(), end.scans[0].torn_at.clone()), (1, None));
        assert_eq!(end.last_segment, Some((0, SEGMENT_HEADER_BYTES as u64 + 11)));
    }

    #[test]
    fn resumed_writer_continues_after_the_last_frame() {
        let dir = tempfile::tempdir().unwrap();
        write_frames(dir.path(), &[b"one"], 64 << 20);
        let (_, end) = collect(dir.path(), TailPolicy::Truncate).unwrap();
        let (index, valid) = end.last_segment.unwrap();
        let mut writer = WalWriter::resume(Arc::new(RealFileSystem), dir.path(), index, valid, 64 << 20).unwrap();
        writer.commit(b"two").unwrap();
        drop(writer);
        let (frames, _) = collect(dir.path(), TailPolicy::ReadOnly).unwrap();
        assert_eq!(frames, [b"one".to_vec(), b"two".to_vec()]);
    }

    /// Both ways of writing frames: direct where the file system offers it,
    /// and through the page cache.
    fn file_systems() -> [(FaultyFileSystem, &'static str); 2] {
        let disk = FaultyFileSystem::failing_after(i64::MAX);
        [(disk.clone(), "direct"), (disk.without_direct_writes(), "page cache")]
    }

    #[test]
    fn frames_of_any_size_come_back_after_resuming_mid_block() {
        // Sizes that end frames inside blocks, on a block boundary, across
        // several blocks, and past the staging buffer kept between writes.
        let sizes = [1, 100, 4096 - 32 - 8 - 101 - 8, 5000, 3 * 4096, 2 * 1024 * 1024, 7];
        let payloads: Vec<Vec<u8>> =
            sizes.iter().enumerate().map(|(n, size)| (0..*size).map(|i| (i * 31 + n) as u8).collect()).collect();
        for (disk, mode) in file_systems() {
            let dir = tempfile::tempdir().unwrap();
            let (first, second) = payloads.split_at(4);
            let mut writer = WalWriter::create(Arc::new(disk.clone()), dir.path(), 0, 64 << 20).unwrap();
            for payload in first {
                writer.commit(payload).unwrap();
            }
            drop(writer);
            let (frames, end) = collect(dir.path(), TailPolicy::Truncate).unwrap();
            assert_eq!(frames, first, "{mode}");
            let (index, valid) = end.last_segment.unwrap();
            assert_ne!(valid % 4096, 0, "{mode}: the writer resumes inside a block");
            let mut writer = WalWriter::resume(Arc::new(disk), dir.path(), index, valid, 64 << 20).unwrap();
            for payload in second {
                writer.commit(payload).unwrap();
            }
            drop(writer);
            let (frames, end) = collect(dir.path(), TailPolicy::ReadOnly).unwrap();
            assert_eq!(frames, payloads, "{mode}");
            assert!(end.scans.iter().all(|scan| scan.torn_at.is_none()), "{mode}: {:?}", end.scans);
        }
    }

    #[test]
    fn a_file_system_refusing_direct_writes_gets_the_page_cache() {
        let disk = FaultyFileSystem::failing_after(i64::MAX).refusing_direct_writes();
        let dir = tempfile::tempdir().unwrap();
        let payloads: Vec<Vec<u8>> = (0..6u8).map(|n| vec![n; 30]).collect();
        let mut writer = WalWriter::create(Arc::new(disk.clone()), dir.path(), 0, 100).unwrap();
        let syncs = || disk.data_syncs_by(std::thread::current().name().unwrap_or(""));
        let before = syncs();
        for payload in &payloads {
            writer.commit(payload).unwrap();
        }
        assert!(syncs() - before >= payloads.len() as u64, "every commit was synced through the page cache");
        drop(writer);
        let (frames, end) = collect(dir.path(), TailPolicy::ReadOnly).unwrap();
        assert_eq!(frames, payloads);
        assert!(end.scans.len() > 1, "segments rotated, and stayed on the page cache");
    }

    #[test]
    fn a_failed_write_leaves_no_frame_behind_and_poisons_the_writer() {
        for (disk, mode) in file_systems() {
            let dir = tempfile::tempdir().unwrap();
            let mut writer = WalWriter::create(Arc::new(disk.clone()), dir.path(), 0, 64 << 20).unwrap();
            writer.commit(b"kept").unwrap();
            disk.set_syncs_left(0);
            assert!(writer.commit(b"lost").is_err(), "{mode}");
            disk.set_syncs_left(i64::MAX);
            assert!(matches!(writer.commit(b"later"), Err(StorageError::Poisoned)), "{mode}");
            drop(writer);
            let (frames, end) = collect(dir.path(), TailPolicy::ReadOnly).unwrap();
            assert_eq!(frames, [b"kept".to_vec()], "{mode}");
            assert_eq!(end.scans[0].torn_at, None, "{mode}: the failed frame was zeroed, not left torn");
        }
    }

    #[test]
    fn out_of_descriptors_at_a_segment_change_leaves_the_log_writing() {
        // The change may fail at each of its opens: the file, its direct
        // handle, the zeroer's handle (the page cache mode has no direct one).
        for (disk, mode) in file_systems() {
            for opens in 0..3 {
                let dir = tempfile::tempdir().unwrap();
                let mut writer = WalWriter::create(Arc::new(disk.clone()), dir.path(), 0, 64 << 20).unwrap();
                writer.commit(b"before").unwrap();
                disk.set_opens_left(Some(opens));
                match writer.rotate() {
                    Err(error) => {
                        assert!(matches!(error, StorageError::NoDescriptors { .. }), "{mode}, {opens} opens: {error}")
                    }
                    // The page cache mode needs one open fewer.
                    Ok(_) => {
                        assert_eq!((mode, opens), ("page cache", 2));
                        disk.set_opens_left(None);
                        continue;
                    }
                }
                assert!(!writer.is_poisoned(), "{mode}, {opens} opens");
                assert!(!segment_path(dir.path(), 1).exists(), "{mode}, {opens} opens: the half-made segment is gone");
                writer.commit(b"during").unwrap();
                disk.set_opens_left(None);
                assert_eq!(writer.rotate().unwrap(), 1, "{mode}, {opens} opens");
                writer.commit(b"after").unwrap();
                drop(writer);
                let (frames, end) = collect(dir.path(), TailPolicy::ReadOnly).unwrap();
                assert_eq!(frames, [b"before".to_vec(), b"during".to_vec(), b"after".to_vec()], "{mode}");
                assert!(end.scans.iter().all(|scan| scan.torn_at.is_none()), "{mode}: {:?}", end.scans);
            }
        }
    }

    #[test]
    fn a_full_segment_with_no_descriptor_for_the_next_goes_on() {
        for (disk, mode) in file_systems() {
            let dir = tempfile::tempdir().unwrap();
            let segment_bytes = 64 * 1024;
            let mut writer = WalWriter::create(Arc::new(disk.clone()), dir.path(), 0, segment_bytes).unwrap();
            disk.set_opens_left(Some(0));
            let payload = vec![3u8; 16 * 1024];
            for _ in 0..12 {
                writer.commit(&payload).unwrap();
            }
            assert_eq!(writer.segment_index, 0, "{mode}: no segment could be made");
            disk.set_opens_left(None);
            writer.rotation_pending = false;
            writer.commit(&payload).unwrap();
            assert_eq!(writer.segment_index, 1, "{mode}: the next segment is made once descriptors are back");
            drop(writer);
            let (frames, _) = collect(dir.path(), TailPolicy::ReadOnly).unwrap();
            assert_eq!(frames.len(), 13, "{mode}");
        }
    }

    /// Waits up to five seconds for `done`.
    fn eventually(mut done: impl FnMut() -> bool) -> bool {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !done() {
            if std::time::Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        true
    }

    #[test]
    fn a_failed_sync_of_the_zeroer_poisons_the_log() {
        for (disk, mode) in file_systems() {
            let dir = tempfile::tempdir().unwrap();
            disk.fail_syncs_on("svc-wal-zeroer");
            let mut writer = WalWriter::create(Arc::new(disk.clone()), dir.path(), 0, 64 << 20).unwrap();
            let failed = eventually(|| writer.zeroer.failure.lock().is_some());
            assert!(failed, "{mode}: the zeroer reached its first sync");
            let error = writer.commit(b"after").unwrap_err();
            assert!(error.to_string().contains("injected fsync failure"), "{mode}: {error}");
            assert!(matches!(writer.commit(b"later"), Err(StorageError::Poisoned)), "{mode}");
        }
    }

    #[test]
    fn with_the_disk_full_the_writer_spends_the_space_laid_down_and_recovers() {
        for (disk, mode) in file_systems() {
            let dir = tempfile::tempdir().unwrap();
            let mut writer = WalWriter::create(Arc::new(disk.clone()), dir.path(), 0, 64 << 20).unwrap();
            assert!(eventually(|| writer.zeroer.zeroed_end() >= ZERO_LOOKAHEAD_BYTES), "{mode}");
            assert_eq!(writer.space_budget(), None, "{mode}: room to grow");
            disk.set_no_space(true);
            let payload = vec![7u8; 256 * 1024];
            // Writing on brings the zeroer to the full disk.
            let mut written = 0;
            while writer.space_budget().is_none() {
                writer.commit(&payload).unwrap();
                written += 1;
                assert!(written < 100, "{mode}: the zeroer never met the full disk");
                std::thread::sleep(Duration::from_millis(5));
            }
            let budget = writer.space_budget().unwrap();
            assert!(budget >= 2 << 20, "{mode}: megabytes laid down are left: {budget}");
            while writer.space_budget().unwrap() >= payload.len() as u64 {
                writer.commit(&payload).unwrap();
                written += 1;
            }
            disk.set_no_space(false);
            assert!(eventually(|| writer.space_budget().is_none()), "{mode}: space is back");
            writer.commit(b"after").unwrap();
            drop(writer);
            let (frames, _) = collect(dir.path(), TailPolicy::ReadOnly).unwrap();
            assert_eq!(frames.len(), written + 1, "{mode}");
        }
    }

    #[test]
    fn with_no_space_for_the_next_segment_the_current_one_goes_on_into_its_reserve() {
        for (disk, mode) in file_systems() {
            let dir = tempfile::tempdir().unwrap();
            let segment = 1 << 20;
            let mut writer = WalWriter::create(Arc::new(disk.clone()), dir.path(), 0, segment).unwrap();
            assert!(eventually(|| writer.zeroer.zeroed_end() >= segment + segment / 4), "{mode}");
            disk.set_no_space(true);
            let payload = vec![3u8; 64 * 1024];
            let mut written = 0;
            while writer.offset < segment {
                writer.commit(&payload).unwrap();
                written += 1;
            }
            assert_eq!(writer.segment_index(), 0, "{mode}: no room for segment 1");
            assert!(list_segments(dir.path()).unwrap().len() == 1, "{mode}: nothing half made is left");
            let budget = writer.space_budget().expect("a full disk shows");
            assert!(budget > 0 && budget < segment / 4, "{mode}: {budget}");
            writer.commit(&payload).unwrap();
            written += 1;
            disk.set_no_space(false);
            let moved_on = eventually(|| writer.space_budget().is_none() && writer.segment_index() == 1);
            assert!(moved_on, "{mode}: the next segment once there is room");
            writer.commit(b"next").unwrap();
            drop(writer);
            let (frames, _) = collect(dir.path(), TailPolicy::ReadOnly).unwrap();
            assert_eq!(frames.len(), written + 1, "{mode}");
        }
    }

    #[test]
    fn power_lost_before_the_sync_of_a_segments_last_frame_leaves_a_dir_that_opens() {
        for seed in 0..16 {
            let dir = tempfile::tempdir().unwrap();
            let disk = crate::storage::PowerLossFileSystem::new();
            let segment = 64 * 1024;
            let mut writer = WalWriter::create(Arc::new(disk.clone()), dir.path(), 0, segment).unwrap();
            let payload = vec![5u8; 10_000];
            let mut synced = 0;
            while writer.offset + 10_100 < segment {
                writer.commit(&payload).unwrap();
                synced += 1;
            }
            // This frame fills the segment; power goes before its sync.
            let _unsynced = writer.append(&payload).unwrap();
            drop(writer);
            disk.crash(seed).unwrap();
            let (frames, _) = collect(dir.path(), TailPolicy::Truncate).expect("the data dir opens");
            assert!(frames.len() == synced || frames.len() == synced + 1, "seed {seed}: {} frames", frames.len());
        }
    }

    /// A device that loses power during a direct write leaves each sector of
    /// it either old or new. The write repeats the bytes of earlier frames in
    /// its first block unchanged, so every mix keeps those frames whole.
    #[test]
    fn a_direct_write_torn_at_any_sectors_keeps_the_earlier_frames_of_its_block() {
        const SECTOR: usize = 512;
        let dir = tempfile::tempdir().unwrap();
        let disk = FaultyFileSystem::failing_after(i64::MAX);
        let mut writer = WalWriter::create(Arc::new(disk), dir.path(), 0, 1 << 20).unwrap();
        if writer.direct.is_none() {
            eprintln!("skipped: no direct writes on this file system");
            return;
        }
        let path = segment_path(dir.path(), 0);
        writer.commit(&[1u8; 700]).unwrap();
        writer.commit(&[2u8; 1500]).unwrap();
        let before = std::fs::read(&path).unwrap();
        // Starts inside the block the earlier frames end in, and spans several blocks.
        writer.commit(&[3u8; 9000]).unwrap();
        let after = std::fs::read(&path).unwrap();
        drop(writer);
        // (The zeroer may grow the file meanwhile; only the frames' range matters.)
        let changed: Vec<usize> = (0..before.len().min(after.len()) / SECTOR)
            .filter(|sector| {
                before[sector * SECTOR..(sector + 1) * SECTOR] != after[sector * SECTOR..(sector + 1) * SECTOR]
            })
            .collect();
        assert!(!changed.is_empty());
        for seed in 0u64..64 {
            let mut torn = after.clone();
            torn[..before.len().min(after.len())].copy_from_slice(&before[..before.len().min(after.len())]);
            for (position, sector) in changed.iter().enumerate() {
                if (seed >> (position % 64)) & 1 == 1 || seed.wrapping_mul(31).wrapping_add(position as u64) % 3 == 0 {
                    torn[sector * SECTOR..(sector + 1) * SECTOR]
                        .copy_from_slice(&after[sector * SECTOR..(sector + 1) * SECTOR]);
                }
            }
            std::fs::write(&path, &torn).unwrap();
            let (frames, _) = collect(dir.path(), TailPolicy::ReadOnly).unwrap();
            assert!(frames.len() >= 2, "seed {seed}: the acknowledged frames are whole");
            assert_eq!((frames[0].as_slice(), frames[1].as_slice()), (&[1u8; 700][..], &[2u8; 1500][..]));
        }
    }

    #[test]
    fn frames_lost_at_the_end_of_a_sealed_segment_are_found() {
        let dir = tempfile::tempdir().unwrap();
        let payloads: Vec<Vec<u8>> = (0..12u8).map(|n| vec![n + 1; 3000]).collect();
        let refs: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
        write_frames(dir.path(), &refs, 8 * 1024);
        let (frames, end) = collect(dir.path(), TailPolicy::ReadOnly).unwrap();
        assert_eq!(frames.len(), 12);
        assert!(end.scans.len() > 2, "several segments");
        // The device loses the last frame of segment 0: it reads as zeros.
        let first = &end.scans[0];
        let mut start = 0;
        scan_segment(&first.path, 0, false, &mut |_, offset, _| {
            start = offset;
            Ok(())
        })
        .unwrap();
        let file = std::fs::OpenOptions::new().write(true).open(&first.path).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&file, &vec![0u8; (first.valid_bytes - start) as usize], start)
            .unwrap();
        let error = collect(dir.path(), TailPolicy::ReadOnly).unwrap_err().to_string();
        assert!(error.contains("segment-00000000000000000000.wal") && error.contains("were lost"), "{error}");
        assert!(error.contains(&format!("offset {start}")), "{error}");
    }

    #[test]
    fn damage_before_a_valid_frame_is_refused_with_file_and_offset() {
        let dir = tempfile::tempdir().unwrap();
        write_frames(dir.path(), &[b"one", b"two", b"three"], 1 << 20);
        let path = segment_path(dir.path(), 0);
        let mut bytes = std::fs::read(&path).unwrap();
        let second_frame = SEGMENT_HEADER_BYTES + 11;
        bytes[second_frame + 9] ^= 0xff;
        std::fs::write(&path, bytes).unwrap();
        let error = collect(dir.path(), TailPolicy::Truncate).unwrap_err().to_string();
        assert!(error.contains("segment-00000000000000000000.wal"), "{error}");
        assert!(error.contains(&format!("offset {second_frame}")), "{error}");
    }

    #[test]
    fn damage_in_a_sealed_segment_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        write_frames(dir.path(), &[b"one", b"two", b"three"], 40);
        let path = segment_path(dir.path(), 0);
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&path, bytes).unwrap();
        assert!(matches!(collect(dir.path(), TailPolicy::Truncate), Err(StorageError::Corrupt { .. })));
    }
}
