//! The snapshot payload: the state as an image, and every earlier layout of
//! it that this build still reads (`docs/wal-format.md`).

use serde::{Deserialize, Serialize};
use std::io::Read;
use std::sync::Arc;

use super::cron_table::CronEntry;
use super::legacy::JobV1;
use super::workers::WorkerSignal;
use crate::clock::Millis;
use crate::job::{IdGenerator, Job, JobId};

fn upgraded(jobs: Vec<JobV1>) -> Vec<Arc<Job>> {
    jobs.into_iter().map(|job| Arc::new(job.into())).collect()
}

/// The serialisable form of the state, written in snapshots; also what tests
/// compare to show that replay rebuilds the live state.
///
/// Jobs are shared with the live state, so taking an image copies pointers,
/// not jobs; a job the engine changes afterwards is copied on write.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StateImage {
    /// In id order once [`StateImage::sort_jobs`] ran; snapshots are written sorted.
    pub jobs: Vec<Arc<Job>>,
    pub paused_queues: Vec<String>,
    pub ids: IdGenerator,
    /// Unused; kept so that format version 1 still decodes.
    pub reserved: u64,
    /// Operator signals by worker id, with when they were given.
    pub worker_signals: Vec<(String, WorkerSignal, Millis)>,
    /// Cron entries by name.
    pub crons: Vec<CronEntry>,
    /// Cron runs waiting for the previous run to end: (previous, waiting).
    pub cron_waiters: Vec<(JobId, JobId)>,
    /// Recent claims under each dispatch-limit key, oldest first, as far
    /// back as a rate limit can look.
    pub dispatch_claims: Vec<(String, Vec<Millis>)>,
    /// Workflows, running and ended.
    pub workflows: Vec<Arc<super::workflow_table::Workflow>>,
    /// Registered schemas by URI.
    pub schemas: Vec<Arc<crate::schema::SchemaEntry>>,
    /// Webhook subscriptions by id.
    pub webhooks: Vec<Arc<crate::webhook::Subscription>>,
    /// Queued webhook deliveries by id.
    pub deliveries: Vec<Arc<super::outbox::Delivery>>,
}

impl StateImage {
    /// Puts the jobs in id order, so that equal states compare and encode equal.
    pub fn sort_jobs(&mut self) {
        self.jobs.sort_by_cached_key(|job| job.id);
        self.sort_all_but_jobs();
    }

    fn sort_all_but_jobs(&mut self) {
        self.workflows.sort_unstable_by_key(|workflow| workflow.id);
        self.webhooks.sort_unstable_by_key(|subscription| subscription.id);
        self.deliveries.sort_unstable_by_key(|delivery| delivery.id);
    }

    /// The snapshot payload: the image with its jobs in id order.
    pub fn encode(mut self) -> Vec<u8> {
        self.sort_jobs();
        postcard::to_allocvec(&self).expect("state images encode into a Vec without failing")
    }

    /// Writes the snapshot payload (the same bytes as [`StateImage::encode`])
    /// to `out` as it is encoded, so that it is never whole in memory.
    /// Leaves the jobs sorted only within runs (see below).
    pub fn encode_to(&mut self, out: &mut dyn std::io::Write) -> std::io::Result<()> {
        self.encode_in_runs_to(out, SORTED_RUN_JOBS)
    }

    /// Jobs are sorted in runs of `run_jobs`, each by ids read once into an
    /// array (sorting the handles themselves would read two jobs from
    /// memory at every comparison), then merged as they are written: the
    /// ids of one run at a time are in memory, where sorting them all at
    /// once took 24 bytes a job (240 MB at 10 M jobs).
    ///
    /// They are encoded one after another into a buffer that goes to `out`
    /// every 64 KiB: postcard writing straight to `out` makes a call through
    /// `dyn Write` for every field. The bytes are the same, as postcard
    /// writes a struct as its fields back to back and a sequence as its
    /// length, then its elements.
    fn encode_in_runs_to(&mut self, out: &mut dyn std::io::Write, run_jobs: usize) -> std::io::Result<()> {
        const BUFFER_BYTES: usize = 64 * 1024;
        self.jobs.chunks_mut(run_jobs).for_each(|run| run.sort_by_cached_key(|job| job.id));
        self.sort_all_but_jobs();
        let encoding_failed = |error: postcard::Error| std::io::Error::other(error);
        let mut buffer = postcard::to_extend(&(self.jobs.len() as u64), Vec::with_capacity(2 * BUFFER_BYTES))
            .map_err(encoding_failed)?;
        let runs: Vec<&[Arc<Job>]> = self.jobs.chunks(run_jobs).collect();
        let mut next = vec![0usize; runs.len()];
        let mut heads: std::collections::BinaryHeap<std::cmp::Reverse<(JobId, usize)>> =
            runs.iter().enumerate().map(|(run, jobs)| std::cmp::Reverse((jobs[0].id, run))).collect();
        while let Some(std::cmp::Reverse((_, run))) = heads.pop() {
            let job = &runs[run][next[run]];
            next[run] += 1;
            if let Some(following) = runs[run].get(next[run]) {
                heads.push(std::cmp::Reverse((following.id, run)));
            }
            buffer = postcard::to_extend(job, buffer).map_err(encoding_failed)?;
            if buffer.len() >= BUFFER_BYTES {
                out.write_all(&buffer)?;
                buffer.clear();
            }
        }
        let rest = (
            &self.paused_queues,
            &self.ids,
            self.reserved,
            &self.worker_signals,
            &self.crons,
            &self.cron_waiters,
            &self.dispatch_claims,
            &self.workflows,
            &self.schemas,
            &self.webhooks,
            &self.deliveries,
        );
        buffer = postcard::to_extend(&rest, buffer).map_err(encoding_failed)?;
        out.write_all(&buffer)
    }
}

/// Jobs sorted at a time when a snapshot is written.
const SORTED_RUN_JOBS: usize = 1 << 16;

/// The snapshot payload version this build writes.
pub const IMAGE_VERSION: u32 = 5;

/// The image of payload version 4 (before the schema registry).
#[derive(Deserialize)]
struct StateImageV4 {
    jobs: Vec<Arc<Job>>,
    paused_queues: Vec<String>,
    ids: IdGenerator,
    reserved: u64,
    worker_signals: Vec<(String, WorkerSignal, Millis)>,
    crons: Vec<CronEntry>,
    cron_waiters: Vec<(JobId, JobId)>,
    dispatch_claims: Vec<(String, Vec<Millis>)>,
    workflows: Vec<Arc<super::workflow_table::Workflow>>,
}

/// The image of payload version 3 (before job extras and dispatch limits).
#[derive(Deserialize)]
struct StateImageV3 {
    jobs: Vec<JobV1>,
    paused_queues: Vec<String>,
    ids: IdGenerator,
    reserved: u64,
    worker_signals: Vec<(String, WorkerSignal, Millis)>,
    crons: Vec<CronEntry>,
    cron_waiters: Vec<(JobId, JobId)>,
}

/// The image of payload version 2 (before cron).
#[derive(Deserialize)]
struct StateImageV2 {
    jobs: Vec<JobV1>,
    paused_queues: Vec<String>,
    ids: IdGenerator,
    reserved: u64,
    worker_signals: Vec<(String, WorkerSignal, Millis)>,
}

/// The image of payload version 0/1 (before worker signals).
#[derive(Deserialize)]
struct StateImageV1 {
    jobs: Vec<JobV1>,
    paused_queues: Vec<String>,
    ids: IdGenerator,
    reserved: u64,
}

/// Decodes a snapshot payload of any version this build knows.
pub fn decode_image(payload_version: u32, bytes: &[u8]) -> Result<StateImage, String> {
    decode_image_from(payload_version, &mut &bytes[..], bytes.len() as u64)
}

/// Decodes a snapshot payload of `length` bytes as it is read from `source`,
/// so that only the state it becomes is ever whole in memory. Every byte of
/// the payload must belong to the state.
pub fn decode_image_from(payload_version: u32, source: &mut impl Read, length: u64) -> Result<StateImage, String> {
    let mut flavor = ReadFlavor {
        source: std::io::BufReader::with_capacity(READ_PIECE_BYTES, source),
        left: length,
        scratch: Vec::new(),
    };
    let image = decode_versioned(payload_version, &mut flavor)?;
    if flavor.left != 0 {
        return Err(format!("{} bytes after the state", flavor.left));
    }
    Ok(image)
}

fn decode_versioned(payload_version: u32, flavor: &mut ReadFlavor<impl Read>) -> Result<StateImage, String> {
    match payload_version {
        0 | 1 => {
            let old: StateImageV1 = flavor.decode().map_err(|error| error.to_string())?;
            let StateImageV1 { jobs, paused_queues, ids, reserved } = old;
            Ok(StateImage {
                jobs: upgraded(jobs),
                paused_queues,
                ids,
                reserved,
                worker_signals: Vec::new(),
                crons: Vec::new(),
                cron_waiters: Vec::new(),
                dispatch_claims: Vec::new(),
                workflows: Vec::new(),
                schemas: Vec::new(),
                webhooks: Vec::new(),
                deliveries: Vec::new(),
            })
        }
        2 => {
            let old: StateImageV2 = flavor.decode().map_err(|error| error.to_string())?;
            let StateImageV2 { jobs, paused_queues, ids, reserved, worker_signals } = old;
            Ok(StateImage {
                jobs: upgraded(jobs),
                paused_queues,
                ids,
                reserved,
                worker_signals,
                crons: Vec::new(),
                cron_waiters: Vec::new(),
                dispatch_claims: Vec::new(),
                workflows: Vec::new(),
                schemas: Vec::new(),
                webhooks: Vec::new(),
                deliveries: Vec::new(),
            })
        }
        3 => {
            let old: StateImageV3 = flavor.decode().map_err(|error| error.to_string())?;
            let StateImageV3 { jobs, paused_queues, ids, reserved, worker_signals, crons, cron_waiters } = old;
            Ok(StateImage {
                jobs: upgraded(jobs),
                paused_queues,
                ids,
                reserved,
                worker_signals,
                crons,
                cron_waiters,
                dispatch_claims: Vec::new(),
                workflows: Vec::new(),
                schemas: Vec::new(),
                webhooks: Vec::new(),
                deliveries: Vec::new(),
            })
        }
        4 => {
            let old: StateImageV4 = flavor.decode().map_err(|error| error.to_string())?;
            let StateImageV4 {
                jobs,
                paused_queues,
                ids,
                reserved,
                worker_signals,
                crons,
                cron_waiters,
                dispatch_claims,
                workflows,
            } = old;
            Ok(StateImage {
                jobs,
                paused_queues,
                ids,
                reserved,
                worker_signals,
                crons,
                cron_waiters,
                dispatch_claims,
                workflows,
                schemas: Vec::new(),
                webhooks: Vec::new(),
                deliveries: Vec::new(),
            })
        }
        IMAGE_VERSION => flavor.decode().map_err(|error| error.to_string()),
        other => {
            Err(format!("snapshot payload version {other} is not supported (this build reads up to {IMAGE_VERSION})"))
        }
    }
}

/// What decoding a current payload hands over as it goes.
pub(crate) enum Loaded {
    /// How many jobs follow (first).
    Count(usize),
    /// The next jobs, in payload order.
    Jobs(Vec<Arc<Job>>),
}

/// Jobs handed over at a time.
const LOADED_BATCH: usize = 4096;

/// Everything of a current image after its jobs, in the order of [`StateImage`].
#[derive(Deserialize)]
struct ImageRest {
    paused_queues: Vec<String>,
    ids: IdGenerator,
    reserved: u64,
    worker_signals: Vec<(String, WorkerSignal, Millis)>,
    crons: Vec<CronEntry>,
    cron_waiters: Vec<(JobId, JobId)>,
    dispatch_claims: Vec<(String, Vec<Millis>)>,
    workflows: Vec<Arc<super::workflow_table::Workflow>>,
    schemas: Vec<Arc<crate::schema::SchemaEntry>>,
    webhooks: Vec<Arc<crate::webhook::Subscription>>,
    deliveries: Vec<Arc<super::outbox::Delivery>>,
}

/// Decodes a payload of the current version ([`IMAGE_VERSION`]) of `length`
/// bytes as it is read from `source`, handing its jobs to `deliver` in
/// batches while the rest is still being read (so that another thread can
/// index them meanwhile); returns the image without its jobs. Stops early,
/// with an error, when `deliver` returns false.
pub(crate) fn decode_current_image(
    source: &mut impl Read,
    length: u64,
    mut deliver: impl FnMut(Loaded) -> bool,
) -> Result<StateImage, String> {
    let mut flavor = ReadFlavor {
        source: std::io::BufReader::with_capacity(READ_PIECE_BYTES, source),
        left: length,
        scratch: Vec::new(),
    };
    // A sequence is its length, then its elements: decoded one at a time.
    let count: u64 = flavor.decode()?;
    if count > length {
        return Err(format!("the payload claims {count} jobs in {length} bytes"));
    }
    let gone = || "the loader stopped".to_string();
    if !deliver(Loaded::Count(count as usize)) {
        return Err(gone());
    }
    let mut policies = crate::job::SharedPolicies::default();
    let mut batch = Vec::with_capacity(LOADED_BATCH);
    for _ in 0..count {
        let mut job: Arc<Job> = flavor.decode()?;
        if let Some(decoded) = Arc::get_mut(&mut job) {
            // Jobs made live share equal policies; read back, each decoded its own.
            policies.share(&mut decoded.retry);
        }
        batch.push(job);
        if batch.len() == LOADED_BATCH
            && !deliver(Loaded::Jobs(std::mem::replace(&mut batch, Vec::with_capacity(LOADED_BATCH))))
        {
            return Err(gone());
        }
    }
    if !batch.is_empty() && !deliver(Loaded::Jobs(batch)) {
        return Err(gone());
    }
    let rest: ImageRest = flavor.decode()?;
    if flavor.left != 0 {
        return Err(format!("{} bytes after the state", flavor.left));
    }
    let ImageRest {
        paused_queues,
        ids,
        reserved,
        worker_signals,
        crons,
        cron_waiters,
        dispatch_claims,
        workflows,
        schemas,
        webhooks,
        deliveries,
    } = rest;
    Ok(StateImage {
        jobs: Vec::new(),
        paused_queues,
        ids,
        reserved,
        worker_signals,
        crons,
        cron_waiters,
        dispatch_claims,
        workflows,
        schemas,
        webhooks,
        deliveries,
    })
}

/// How much of a payload is read from the file at a time.
const READ_PIECE_BYTES: usize = 1024 * 1024;

/// A postcard flavor over a reader: each value is decoded as its bytes
/// arrive, and only one string's bytes are held at a time. Values are
/// decoded owned; nothing borrows from the payload.
struct ReadFlavor<R> {
    source: R,
    /// Payload bytes not yet taken; no value may claim more.
    left: u64,
    /// Holds the bytes of the string being decoded.
    scratch: Vec<u8>,
}

impl<R: Read> ReadFlavor<R> {
    fn decode<T: serde::de::DeserializeOwned>(&mut self) -> Result<T, String> {
        let mut deserializer = postcard::Deserializer::from_flavor(&mut *self);
        T::deserialize(&mut deserializer).map_err(|error| error.to_string())
    }
}

impl<'de, R: Read + 'de> postcard::de_flavors::Flavor<'de> for &'de mut ReadFlavor<R> {
    type Remainder = ();
    type Source = ();

    fn pop(&mut self) -> postcard::Result<u8> {
        let mut byte = [0u8];
        if self.left == 0 {
            return Err(postcard::Error::DeserializeUnexpectedEnd);
        }
        self.source.read_exact(&mut byte).map_err(|_| postcard::Error::DeserializeUnexpectedEnd)?;
        self.left -= 1;
        Ok(byte[0])
    }

    fn try_take_n(&mut self, _count: usize) -> postcard::Result<&'de [u8]> {
        // Nothing stored borrows from the payload; a value that tried would
        // outlive the bytes it was read into.
        Err(postcard::Error::DeserializeBadEncoding)
    }

    fn try_take_n_temp<'a>(&'a mut self, count: usize) -> postcard::Result<&'a [u8]>
    where
        'de: 'a,
    {
        // A length read from a damaged payload may claim more than there is:
        // refused before anything is allocated for it.
        if count as u64 > self.left {
            return Err(postcard::Error::DeserializeUnexpectedEnd);
        }
        self.scratch.resize(count, 0);
        self.source.read_exact(&mut self.scratch).map_err(|_| postcard::Error::DeserializeUnexpectedEnd)?;
        self.left -= count as u64;
        Ok(&self.scratch)
    }

    fn finalize(self) -> postcard::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The layout payload version 2 was written with.
    #[derive(Serialize)]
    struct WrittenV2 {
        jobs: Vec<JobV1>,
        paused_queues: Vec<String>,
        ids: IdGenerator,
        reserved: u64,
        worker_signals: Vec<(String, WorkerSignal, Millis)>,
    }

    #[test]
    fn a_streamed_image_has_the_bytes_of_one_encoded_whole() {
        use crate::job::{JobDefaults, JobState, parse_enqueue_body};
        // Ids in a scrambled order, so that every run holds some of each part.
        let jobs = (1..=3000u128)
            .map(|n| {
                let body = format!(r#"{{"type":"t","args":[{n},"{}"]}}"#, "x".repeat(n as usize % 97));
                let new_job = parse_enqueue_body(body.as_bytes(), &JobDefaults::default()).unwrap();
                Arc::new(Job::accept(
                    new_job,
                    JobId((n * 7919 % 3001) << 64 | n),
                    JobState::Available,
                    1_000,
                    None,
                    None,
                ))
            })
            .collect();
        let mut image = StateImage {
            jobs,
            paused_queues: vec!["paused".to_string()],
            ids: IdGenerator::default(),
            reserved: 0,
            worker_signals: vec![("w-1".to_string(), WorkerSignal::Quiet, 42)],
            crons: Vec::new(),
            cron_waiters: vec![(JobId(1), JobId(2))],
            dispatch_claims: vec![("key".to_string(), vec![5, 6])],
            workflows: Vec::new(),
            schemas: Vec::new(),
            webhooks: Vec::new(),
            deliveries: Vec::new(),
        };
        let whole = image.clone().encode();
        for run_jobs in [SORTED_RUN_JOBS, 1000, 7, 1] {
            let mut streamed = Vec::new();
            image.clone().encode_in_runs_to(&mut streamed, run_jobs).unwrap();
            assert!(streamed.len() > 128 * 1024, "the jobs filled the buffer more than once");
            assert!(streamed == whole, "runs of {run_jobs} jobs");
        }
        image.sort_jobs();
        assert_eq!(decode_image(IMAGE_VERSION, &whole).unwrap(), image);
    }

    #[test]
    fn a_version_2_snapshot_payload_still_decodes() {
        let written = WrittenV2 {
            jobs: Vec::new(),
            paused_queues: vec!["paused".to_string()],
            ids: IdGenerator::default(),
            reserved: 0,
            worker_signals: vec![("w-1".to_string(), WorkerSignal::Quiet, 42)],
        };
        let bytes = postcard::to_allocvec(&written).unwrap();
        let image = decode_image(2, &bytes).expect("version 2 decodes");
        assert_eq!(image.paused_queues, ["paused"]);
        assert_eq!(image.worker_signals, [("w-1".to_string(), WorkerSignal::Quiet, 42)]);
        assert!(image.crons.is_empty() && image.cron_waiters.is_empty());
        assert!(decode_image(IMAGE_VERSION + 1, &bytes).is_err());
    }
}
