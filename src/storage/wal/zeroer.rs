//! The zeroer: the thread that lays zeroed, synced space down ahead of the
//! log writer, so a commit's sync only flushes data.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use super::super::{FileSystem, StorageError};
use super::{is_no_space, open_error};

/// Zeroed space is laid down in chunks of this size...
pub(super) const ZERO_CHUNK_BYTES: u64 = 1024 * 1024;
/// ...up to this far ahead of the write offset, once the zeroed space ahead
/// has shrunk below half of it. Topping up in whole chunks keeps the
/// zeroer's syncs, which compete with the log's, to one per chunk.
pub(super) const ZERO_LOOKAHEAD_BYTES: u64 = 8 * 1024 * 1024;
/// With the disk full, how often the zeroer tries again; also how often an
/// idle zeroer wakes to see whether the disk has room (otherwise it sleeps
/// until the writer needs space).
pub(super) const ZEROER_FULL_RETRY: Duration = Duration::from_millis(500);
/// The disk counts as full once less than this is free on it: new work
/// stops while the space laid down ahead is still there for the work
/// already accepted.
pub(super) const FREE_SPACE_MIN_BYTES: u64 = ZERO_LOOKAHEAD_BYTES;

/// The background thread that keeps zeroed, synced space ahead of the writer.
/// It only ever writes at or beyond `zeroed_end`, and the writer only writes
/// below it while the zeroer runs, so their ranges never meet.
///
/// It writes and syncs through a handle of its own: Linux reports a failed
/// writeback once per open file, so an error it swallowed on a shared handle
/// could let the writer's next sync succeed over lost data. Any error of its
/// own is handed to the writer, which poisons the log, except a full disk:
/// then it tries again every half second, and meanwhile the writer spends
/// the space already laid down.
///
/// It lays space down up to a little past the segment's size (a quarter of
/// it, at most half the lookahead), so that when the disk fills up the
/// writer has room to finish what it accepted even at a segment's end.
pub(super) struct Zeroer {
    zeroed_end: Arc<AtomicU64>,
    write_offset: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    /// The last write or sync failed for lack of space.
    full: Arc<AtomicBool>,
    /// A failure other than a full disk; the writer takes it and poisons the log.
    pub(super) failure: Arc<parking_lot::Mutex<Option<std::io::Error>>>,
    /// Where the zeroer stops laying space down in this segment.
    limit: u64,
    thread: Option<JoinHandle<()>>,
}

impl Zeroer {
    pub(super) fn start(
        fs: &dyn FileSystem,
        path: &Path,
        write_offset: u64,
        zeroed_end: u64,
        segment_bytes_max: u64,
    ) -> Result<Zeroer, StorageError> {
        let file = fs.open_existing(path).map_err(open_error(path))?;
        let zeroed = Arc::new(AtomicU64::new(zeroed_end));
        let offset = Arc::new(AtomicU64::new(write_offset));
        let stop = Arc::new(AtomicBool::new(false));
        // Known before the first write: a server started on a full disk says so at once.
        let full = Arc::new(AtomicBool::new(file.free_space().is_ok_and(|free| free < FREE_SPACE_MIN_BYTES)));
        let failure = Arc::new(parking_lot::Mutex::new(None));
        let limit = segment_bytes_max + (segment_bytes_max / 4).min(ZERO_LOOKAHEAD_BYTES / 2);
        let (zeroed_end, write_offset, stopped) = (zeroed.clone(), offset.clone(), stop.clone());
        let (no_space, failed) = (full.clone(), failure.clone());
        let thread = std::thread::Builder::new()
            .name("svc-wal-zeroer".into())
            .spawn(move || {
                let chunk = vec![0u8; ZERO_CHUNK_BYTES as usize];
                let mut space_checked: Option<std::time::Instant> = None;
                while !stopped.load(Ordering::Acquire) {
                    let mut end = zeroed_end.load(Ordering::Acquire);
                    let offset = write_offset.load(Ordering::Acquire);
                    if end >= limit || end >= offset + ZERO_LOOKAHEAD_BYTES / 2 {
                        // Idle: whether the next top-up would find room (so a
                        // server started on a full disk knows at once).
                        if space_checked.is_none_or(|at| at.elapsed() >= ZEROER_FULL_RETRY) {
                            space_checked = Some(std::time::Instant::now());
                            if let Ok(free) = file.free_space() {
                                no_space.store(free < FREE_SPACE_MIN_BYTES, Ordering::Release);
                            }
                        }
                        // Woken by the writer once it needs space (`note_offset`), or by `stop`.
                        std::thread::park_timeout(ZEROER_FULL_RETRY);
                        continue;
                    }
                    let wanted = (offset + ZERO_LOOKAHEAD_BYTES).min(limit);
                    while end < wanted && !stopped.load(Ordering::Acquire) {
                        let length = (wanted - end).min(ZERO_CHUNK_BYTES) as usize;
                        match file.write_at(end, &chunk[..length]).and_then(|()| file.sync_data()) {
                            Ok(()) => {
                                let free = file.free_space().unwrap_or(u64::MAX);
                                no_space.store(free < FREE_SPACE_MIN_BYTES, Ordering::Release);
                                end += length as u64;
                                zeroed_end.store(end, Ordering::Release);
                            }
                            Err(error) if is_no_space(&error) => {
                                no_space.store(true, Ordering::Release);
                                std::thread::sleep(ZEROER_FULL_RETRY);
                            }
                            Err(error) => {
                                *failed.lock() = Some(error);
                                return;
                            }
                        }
                    }
                }
            })
            .ok();
        Ok(Zeroer { zeroed_end: zeroed, write_offset: offset, stop, full, failure, limit, thread })
    }

    pub(super) fn zeroed_end(&self) -> u64 {
        self.zeroed_end.load(Ordering::Acquire)
    }

    pub(super) fn is_stopped(&self) -> bool {
        self.thread.is_none()
    }

    pub(super) fn is_full(&self) -> bool {
        self.full.load(Ordering::Acquire)
    }

    pub(super) fn take_failure(&self) -> Option<std::io::Error> {
        self.failure.lock().take()
    }

    /// Tells the zeroer where the writer is, and wakes it if that leaves
    /// it work (as its own loop decides: less than half the lookahead
    /// zeroed ahead, and the segment's limit not reached). A wake-up that
    /// comes before the zeroer sleeps makes it not sleep.
    pub(super) fn note_offset(&self, offset: u64) {
        self.write_offset.store(offset, Ordering::Release);
        let zeroed_end = self.zeroed_end.load(Ordering::Acquire);
        if zeroed_end < self.limit
            && zeroed_end < offset + ZERO_LOOKAHEAD_BYTES / 2
            && let Some(thread) = &self.thread
        {
            thread.thread().unpark();
        }
    }

    /// Stops the thread and waits until its last write is done.
    pub(super) fn stop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
        // Nothing beyond this point is being zeroed any more.
        self.zeroed_end.store(0, Ordering::Release);
    }
}
