//! Recovery: the newest snapshot that reads back, then the log after it,
//! replayed through the same `State::apply` the live engine uses.

use std::path::Path;
use std::sync::Arc;

use super::cron::record::{CronFired, CronRecord};
use super::cron::table::{CronFire, CronOutcome};
use super::events::EventSink;
use super::image::{self, StateImage};
use super::job_table::LoadedJobs;
use super::jobs::record::JobRecord;
use super::record::{Change, Logged, decode_batch};
use super::state::{Retention, State};
use crate::job::{Job, SharedPolicies};
use crate::storage::{
    OpenSnapshot, SNAPSHOT_HEADER_BYTES, SnapshotPayload, StorageError, TailPolicy, list_segments, list_snapshots,
    open_snapshot, replay_log,
};

pub(super) type Recovered = (State, u64, Option<(u64, u64)>, u64);

/// Loads the newest snapshot and replays the log after it. A snapshot that
/// does not read back (damaged on disk) is passed over for the one before
/// it, whose log segments are kept for this (`remove_obsolete`), and if
/// none reads back, for the whole log when it is all still there.
pub fn recover(dir: &Path, retention: Retention) -> Result<Recovered, StorageError> {
    crate::storage::create_data_dir(dir)?;
    let mut first_error: Option<StorageError> = None;
    for (_, path) in list_snapshots(dir)?.iter().rev() {
        let loaded = load_snapshot(path, retention).and_then(|(state, replay_from)| replay(dir, state, replay_from));
        match loaded {
            Ok(recovered) => {
                if let Some(error) = &first_error {
                    tracing::warn!(snapshot = %path.display(), newer_one = %error, "recovered from an older snapshot");
                }
                return Ok(recovered);
            }
            Err(error) => {
                tracing::warn!(error = %error, "a snapshot does not read back");
                first_error.get_or_insert(error);
            }
        }
    }
    let whole_log = list_segments(dir)?.first().is_none_or(|(index, _)| *index == 0);
    match first_error {
        Some(error) if !whole_log => Err(error),
        first_error => replay(dir, State::new(retention), 0).map_err(|error| first_error.unwrap_or(error)),
    }
}

/// A snapshot's state and the first segment it does not cover.
fn load_snapshot(path: &Path, retention: Retention) -> Result<(State, u64), StorageError> {
    let OpenSnapshot { replay_from, payload_version, payload } = open_snapshot(path)?;
    let corrupt = |reason: String| StorageError::Corrupt {
        path: path.to_path_buf(),
        offset: SNAPSHOT_HEADER_BYTES as u64,
        reason,
    };
    let mut payload = payload;
    let (decoded, state) = if (image::CHUNKED_VERSION..=image::IMAGE_VERSION).contains(&payload_version) {
        load_chunked_payload(&mut payload, retention, payload_version)
    } else {
        let length = payload.remaining();
        (image::decode_image_from(payload_version, &mut payload, length), None)
    };
    // A failed read is reported as such, not as a payload that does not decode.
    if let Some(error) = payload.read_failure() {
        return Err(error);
    }
    let image = decoded.map_err(|error| corrupt(format!("snapshot does not decode: {error}")))?;
    // The checksum covers what was decoded: a damaged payload is refused here
    // even when it happened to decode.
    payload.finish()?;
    let state = match state {
        Some(mut state) => state.finish_loading(image).map(|()| state),
        None => State::from_image(image, retention),
    };
    Ok((state.map_err(corrupt)?, replay_from))
}

/// Loads a payload in chunks (version 6 on) on three threads: one reads the
/// chunks of jobs and decodes every other one, a second decodes the rest,
/// and this one indexes them as they come, in payload order (decoding is
/// about two thirds of the work). Returns what was read besides the jobs,
/// and the state holding the jobs; on one thread only when no other can be
/// started.
fn load_chunked_payload(
    payload: &mut SnapshotPayload,
    retention: Retention,
    version: u32,
) -> (Result<StateImage, String>, Option<State>) {
    use image::{ChunkedPayload, JobChunk};
    type Decoded = Result<Vec<Arc<Job>>, String>;
    let length = payload.remaining();
    let mut state = State::new(retention);
    let source = &mut *payload;
    let loaded = std::thread::scope(|scope| {
        let (to_helper, helper_in) = std::sync::mpsc::sync_channel::<JobChunk>(2);
        let (helper_out, from_helper) = std::sync::mpsc::sync_channel::<Decoded>(2);
        let (reader_out, from_reader) = std::sync::mpsc::sync_channel::<Decoded>(2);
        let (count_out, count_in) = std::sync::mpsc::sync_channel::<usize>(1);
        // Each thread's senders move into it: when it ends, its channels close.
        let helper = std::thread::Builder::new().name("svc-snapshot-decode".into()).spawn_scoped(scope, move || {
            let mut policies = SharedPolicies::default();
            for chunk in helper_in {
                if helper_out.send(chunk.decode(&mut policies)).is_err() {
                    break;
                }
            }
        });
        let Ok(helper) = helper else { return None };
        let reader = std::thread::Builder::new().name("svc-snapshot-read".into()).spawn_scoped(scope, move || {
            let (mut chunks, count) = ChunkedPayload::open(source, length, version)?;
            let _ = count_out.send(count);
            let mut policies = SharedPolicies::default();
            let gone = || "the loader stopped".to_string();
            for turn in 0u64.. {
                let Some(chunk) = chunks.next_chunk()? else { break };
                if turn % 2 == 0 {
                    to_helper.send(chunk).map_err(|_| gone())?;
                } else {
                    reader_out.send(chunk.decode(&mut policies)).map_err(|_| gone())?;
                }
            }
            chunks.rest()
        });
        let Ok(reader) = reader else { return None };
        let mut failed = None;
        let count = count_in.recv().unwrap_or(0);
        let mut loaded = LoadedJobs::new(image::jobs_to_reserve(count, length));
        let mut in_order = image::IdOrder::default();
        // Chunk n was decoded by the helper when n is even. A closed channel
        // means there are no more chunks (or the reader failed, said below).
        for turn in 0u64.. {
            let from = if turn % 2 == 0 { &from_helper } else { &from_reader };
            match from.recv() {
                Ok(jobs) => {
                    let indexed = jobs.and_then(|jobs| {
                        jobs.into_iter().try_for_each(|job| {
                            in_order.check(job.id)?;
                            state.load_job(job, &mut loaded);
                            Ok(())
                        })
                    });
                    if let Err(error) = indexed {
                        failed = Some(error);
                        break;
                    }
                }
                Err(_) => break,
            }
        }
        state.store_loaded(loaded);
        drop((from_helper, from_reader));
        helper.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        let read = reader.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        // The reader checked that the chunks hold as many jobs as the payload claims.
        Some(match (failed, read) {
            (Some(error), _) | (None, Err(error)) => Err(error),
            (None, Ok(rest)) => Ok(rest),
        })
    });
    match loaded {
        Some(loaded) => (loaded, Some(state)),
        None => (image::decode_image_from(version, payload, length), None),
    }
}

/// Replays the log from segment `replay_from` onto `state`, on two threads:
/// one reads and decodes frames, this one applies their records as they come.
/// On one thread only when no second one can be started.
fn replay(dir: &Path, mut state: State, replay_from: u64) -> Result<Recovered, StorageError> {
    /// Decoded frames the reader may be ahead by: a frame can hold up to
    /// `FRAME_PAYLOAD_BYTES_MAX`, so few.
    const FRAMES_AHEAD: usize = 2;
    let mut events = EventSink::disabled();
    let mut replayed_bytes = 0u64;
    let (sender, receiver) = std::sync::mpsc::sync_channel::<DecodedFrame>(FRAMES_AHEAD);
    let state_ref = &mut state;
    let replayed = std::thread::scope(|scope| {
        let reader = std::thread::Builder::new().name("svc-log-decode".into()).spawn_scoped(scope, move || {
            let mut policies = SharedPolicies::default();
            replay_log(dir, replay_from, TailPolicy::Truncate, &mut |path, offset, payload| {
                let records = decode_frame(path, offset, payload, &mut policies)?;
                let frame = DecodedFrame { path: path.to_path_buf(), offset, records, bytes: payload.len() as u64 };
                // A closed channel: the applying side met an error and reports it.
                sender.send(frame).map_err(|_| StorageError::Corrupt {
                    path: path.to_path_buf(),
                    offset,
                    reason: "replay stopped".to_string(),
                })
            })
        });
        let Ok(reader) = reader else { return None };
        let mut applied = Ok(());
        for frame in receiver {
            applied = apply_frame(state_ref, &mut events, &frame.path, frame.offset, &frame.records);
            if applied.is_err() {
                break;
            }
            replayed_bytes += frame.bytes;
        }
        let end = reader.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        Some(applied.and(end))
    });
    let end = match replayed {
        Some(end) => end?,
        None => {
            let mut policies = SharedPolicies::default();
            replay_log(dir, replay_from, TailPolicy::Truncate, &mut |path, offset, payload| {
                let records = decode_frame(path, offset, payload, &mut policies)?;
                apply_frame(&mut state, &mut events, path, offset, &records)?;
                replayed_bytes += payload.len() as u64;
                Ok(())
            })?
        }
    };
    Ok((state, replay_from, end.last_segment, replayed_bytes))
}

/// Applies one frame's records; a record that does not apply makes the
/// frame corrupt.
fn apply_frame(
    state: &mut State,
    events: &mut EventSink,
    path: &Path,
    offset: u64,
    records: &[Logged],
) -> Result<(), StorageError> {
    records.iter().try_for_each(|record| {
        state.apply(record, events).map_err(|error| StorageError::Corrupt {
            path: path.to_path_buf(),
            offset,
            reason: error.0,
        })
    })
}

/// A log frame's records, decoded ahead of being applied.
struct DecodedFrame {
    path: std::path::PathBuf,
    offset: u64,
    records: Vec<Logged>,
    bytes: u64,
}

/// Decodes one frame's records; jobs made live share equal retry policies
/// (read back, each decoded its own).
fn decode_frame(
    path: &Path,
    offset: u64,
    payload: &[u8],
    policies: &mut SharedPolicies,
) -> Result<Vec<Logged>, StorageError> {
    let mut records =
        decode_batch(payload).map_err(|reason| StorageError::Corrupt { path: path.to_path_buf(), offset, reason })?;
    for record in &mut records {
        let jobs = match &mut record.change {
            Change::Jobs(JobRecord::Enqueue { jobs, .. }) => jobs.as_mut_slice(),
            Change::Cron(CronRecord::Fire(CronFired {
                fire: CronFire { outcome: CronOutcome::Enqueued { job, .. }, .. },
                ..
            })) => std::slice::from_mut(job),
            _ => &mut [],
        };
        jobs.iter_mut().filter_map(Arc::get_mut).for_each(|job| policies.share(&mut job.retry));
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{RealFileSystem, snapshot_path, write_snapshot};

    fn load(dir: &Path, payload: &[u8]) -> Result<State, StorageError> {
        write_snapshot(&RealFileSystem, dir, 1, image::IMAGE_VERSION, payload)?;
        load_snapshot(&snapshot_path(dir, 1), Retention::default()).map(|(state, _)| state)
    }

    #[test]
    fn a_snapshot_loaded_on_three_threads_holds_what_was_written() {
        let dir = tempfile::tempdir().unwrap();
        let written = image::tests::image_of(10_000);
        let state = load(dir.path(), &written.clone().encode()).unwrap();
        state.check_invariants().unwrap();
        let mut loaded = state.image();
        loaded.sort_jobs();
        let mut expected = written;
        expected.sort_jobs();
        assert_eq!(loaded.jobs, expected.jobs);
        assert_eq!(loaded.paused_queues, expected.paused_queues);
        assert_eq!(loaded.dispatch_claims, expected.dispatch_claims);
    }

    #[test]
    fn a_damaged_snapshot_is_refused_by_the_three_thread_loader() {
        let dir = tempfile::tempdir().unwrap();
        // Enough chunks (25) that the threads' channels fill up and a thread
        // stopping early meets the others blocked.
        let payload = image::tests::image_of(100_000).encode();
        for (damage, bytes) in image::tests::damaged_payloads(&payload) {
            let error = load(dir.path(), &bytes).err().unwrap_or_else(|| panic!("{damage}: loaded"));
            assert!(error.to_string().contains("does not decode"), "{damage}: {error}");
        }
    }

    #[test]
    fn an_older_image_holding_a_job_twice_is_refused() {
        let mut image = image::tests::image_of(10);
        image.jobs.push(image.jobs[3].clone());
        let Err(error) = State::from_image(image, Retention::default()) else { panic!("a job held twice was loaded") };
        assert!(error.contains("held twice"), "{error}");
    }
}
