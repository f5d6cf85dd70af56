//! Writing snapshots: on a thread of their own beside the engine (paced,
//! past the page cache, at a lower priority), or in place at a clean stop.
//! The engine decides when (`writer.rs`) and hands over an image that
//! shares its jobs; this file writes it and removes what it covers.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::image::{IMAGE_VERSION, StateImage};
use super::pace::{PaceSignals, PacedWriter};
use crate::storage::{FileSystem, PageCache, StorageError, remove_obsolete, write_snapshot_with};

/// Writes `image` (taken as of segment `replay_from`) on this thread and
/// removes the log it covers. It stays in the page cache: a clean stop's
/// is read by the restart that follows.
pub(super) fn write_in_place(
    file_system: &dyn FileSystem,
    dir: &std::path::Path,
    replay_from: u64,
    mut image: StateImage,
) -> Result<(), StorageError> {
    write_snapshot_with(file_system, dir, replay_from, IMAGE_VERSION, PageCache::Fill, &mut |out| {
        image.encode_to(out)
    })?;
    remove_obsolete(dir, replay_from)
}

/// A snapshot to write on its own thread, with what it reports to.
pub(super) struct BackgroundSnapshot {
    pub replay_from: u64,
    pub image: StateImage,
    pub pace: Arc<PaceSignals>,
    /// Set while it is written; cleared however the thread ends.
    pub busy: Arc<AtomicBool>,
    /// Set once it is durable.
    pub written: Arc<AtomicBool>,
    pub file_system: Arc<dyn FileSystem>,
    pub dir: PathBuf,
    pub metrics: Arc<crate::metrics::Metrics>,
    /// How long the engine thread spent starting the segment and taking the image.
    pub image_seconds: f64,
}

impl BackgroundSnapshot {
    /// Starts the `svc-snapshot` thread.
    pub(super) fn spawn(self) -> std::io::Result<std::thread::JoinHandle<()>> {
        std::thread::Builder::new().name("svc-snapshot".into()).spawn(move || self.write())
    }

    fn write(self) {
        let BackgroundSnapshot {
            replay_from,
            mut image,
            pace,
            busy,
            written,
            file_system,
            dir,
            metrics,
            image_seconds,
        } = self;
        // Cleared however the thread ends, a panic included: a stop waits for it.
        let _busy = ClearOnDrop(busy);
        yield_to_the_engine();
        let started = std::time::Instant::now();
        // Past the page cache, and paced (`pace`; docs/perf-log.md, "Snapshots and request latency").
        let cache = PageCache::Bypass;
        let result = write_snapshot_with(file_system.as_ref(), &dir, replay_from, IMAGE_VERSION, cache, &mut |out| {
            image.encode_to(&mut PacedWriter::new(out, &pace))
        })
        .inspect(|_| written.store(true, Ordering::SeqCst))
        .and_then(|bytes| remove_obsolete(&dir, replay_from).map(|()| bytes));
        metrics.snapshot_seconds.observe(started.elapsed().as_secs_f64());
        match result {
            Ok(bytes) => tracing::info!(
                replay_from_segment = replay_from,
                bytes,
                seconds = started.elapsed().as_secs_f64(),
                image_seconds,
                "snapshot written"
            ),
            // The log segments are still there, so nothing is lost; the next
            // snapshot tries again.
            Err(error) => tracing::error!(error = %error, "snapshot failed"),
        }
    }
}

/// Sets its flag to false when dropped.
struct ClearOnDrop(Arc<AtomicBool>);

impl Drop for ClearOnDrop {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

/// Lowers the calling thread's scheduling priority (nice 10), so that when
/// the cores are busy a background snapshot takes what the engine and the
/// request threads leave: single enqueues' p99 while snapshots are written
/// is lower, at more throughput (docs/perf-log.md, "Snapshots and request
/// latency").
#[allow(unsafe_code)]
fn yield_to_the_engine() {
    #[cfg(target_os = "linux")]
    // SAFETY: plain integer arguments; on Linux the nice value belongs to
    // the thread named by its id. Failure leaves the priority as it was.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, SNAPSHOT_NICE);
    }
}

/// The nice value of a snapshot thread (0 is the default; 19 the lowest).
const SNAPSHOT_NICE: libc::c_int = 10;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_thread_that_panics_still_clears_its_busy_flag() {
        let busy = Arc::new(AtomicBool::new(true));
        let flag = busy.clone();
        let ended = std::thread::spawn(move || {
            let _busy = ClearOnDrop(flag);
            panic!("a snapshot thread failing halfway");
        })
        .join();
        assert!(ended.is_err(), "the thread panicked");
        assert!(!busy.load(Ordering::SeqCst), "a stop waiting for the snapshot would otherwise wait for ever");
    }
}
