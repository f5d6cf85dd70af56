//! The snapshot payload: the state as an image, and every earlier layout of
//! it that this build still reads (`docs/wal-format.md`).

use serde::{Deserialize, Serialize};
use std::io::Read;
use std::sync::Arc;

use super::cron::table::CronEntry;
use super::legacy::JobV1;
use super::queues::record::Backpressure;
use super::workers::entry::WorkerSignal;
use crate::clock::Millis;
use crate::job::{IdGenerator, Job, JobId, SharedPolicies, StoredJobDecoder, StoredJobEncoder};

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
    pub workflows: Vec<Arc<super::workflows::table::Workflow>>,
    /// Registered schemas by URI.
    pub schemas: Vec<Arc<crate::schema::SchemaEntry>>,
    /// Webhook subscriptions by id.
    pub webhooks: Vec<Arc<crate::webhook::Subscription>>,
    /// Queued webhook deliveries by id.
    pub deliveries: Vec<Arc<super::webhooks::outbox::Delivery>>,
    /// Queues with backpressure, by name.
    pub queue_configs: Vec<(String, Backpressure)>,
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
        self.queue_configs.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    }

    /// The snapshot payload: the image with its jobs in id order.
    pub fn encode(mut self) -> Vec<u8> {
        let mut bytes = Vec::new();
        self.encode_to(&mut bytes).expect("state images encode into a Vec without failing");
        bytes
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
    /// They are encoded one after another into a chunk that goes to `out`,
    /// behind its job count and length, once it holds [`CHUNK_JOBS`] jobs
    /// or [`CHUNK_BYTES`] bytes (`docs/wal-format.md`, "Snapshot").
    fn encode_in_runs_to(&mut self, out: &mut dyn std::io::Write, run_jobs: usize) -> std::io::Result<()> {
        self.jobs.chunks_mut(run_jobs).for_each(|run| run.sort_by_cached_key(|job| job.id));
        self.sort_all_but_jobs();
        let encoding_failed = |error: postcard::Error| std::io::Error::other(error);
        out.write_all(&(self.jobs.len() as u64).to_le_bytes())?;
        let mut chunk = ChunkWriter { jobs: 0, bytes: Vec::with_capacity(CHUNK_BYTES + CHUNK_BYTES / 4) };
        let mut encoder = StoredJobEncoder::default();
        chunk.bytes.resize(CHUNK_HEADER_BYTES, 0);
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
            encoder.encode(job, &mut chunk.bytes);
            chunk.jobs += 1;
            if chunk.jobs == CHUNK_JOBS || chunk.bytes.len() >= CHUNK_HEADER_BYTES + CHUNK_BYTES {
                chunk.write_to(out)?;
            }
        }
        if chunk.jobs > 0 {
            chunk.write_to(out)?;
        }
        // The end of the jobs: a chunk of none.
        chunk.write_to(out)?;
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
            &self.queue_configs,
        );
        out.write_all(&postcard::to_allocvec(&rest).map_err(encoding_failed)?)
    }
}

/// The chunk of jobs being encoded: its header's place, then its jobs (one
/// write for both).
struct ChunkWriter {
    jobs: usize,
    bytes: Vec<u8>,
}

impl ChunkWriter {
    /// Writes the chunk (its job count, its length, its jobs) and empties it.
    /// An empty chunk is written only when asked for, as the end of the jobs.
    fn write_to(&mut self, out: &mut dyn std::io::Write) -> std::io::Result<()> {
        if self.jobs == 0 && self.bytes.len() > CHUNK_HEADER_BYTES {
            return Err(std::io::Error::other("a chunk holds bytes but no job"));
        }
        let too_large = |_| std::io::Error::other("a chunk of jobs exceeds 4 GiB");
        let length = self.bytes.len() - CHUNK_HEADER_BYTES;
        self.bytes[0..4].copy_from_slice(&u32::try_from(self.jobs).map_err(too_large)?.to_le_bytes());
        self.bytes[4..8].copy_from_slice(&u32::try_from(length).map_err(too_large)?.to_le_bytes());
        out.write_all(&self.bytes)?;
        self.jobs = 0;
        self.bytes.truncate(CHUNK_HEADER_BYTES);
        Ok(())
    }
}

/// Jobs in one chunk of a payload, at most.
const CHUNK_JOBS: usize = 4096;
/// A chunk is closed once its jobs take this many bytes (so the job that
/// crosses the mark is its last).
const CHUNK_BYTES: usize = 1 << 20;
/// A chunk's job count and length, each a little-endian `u32`.
const CHUNK_HEADER_BYTES: usize = 8;

/// Jobs sorted at a time when a snapshot is written.
const SORTED_RUN_JOBS: usize = 1 << 16;

/// The snapshot payload version this build writes.
pub const IMAGE_VERSION: u32 = 7;

/// The first payload version whose jobs come in chunks.
pub(crate) const CHUNKED_VERSION: u32 = 6;

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
    workflows: Vec<Arc<super::workflows::table::Workflow>>,
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
    if (CHUNKED_VERSION..=IMAGE_VERSION).contains(&payload_version) {
        return decode_chunked(source, length, payload_version);
    }
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
                queue_configs: Vec::new(),
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
                queue_configs: Vec::new(),
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
                queue_configs: Vec::new(),
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
                queue_configs: Vec::new(),
            })
        }
        5 => {
            let StateImageV5 { jobs, rest } = flavor.decode()?;
            Ok(rest.with_jobs(jobs))
        }
        other => {
            Err(format!("snapshot payload version {other} is not supported (this build reads up to {IMAGE_VERSION})"))
        }
    }
}

/// Everything of an image after its jobs, in the order of [`StateImage`].
#[derive(Deserialize)]
struct ImageRest {
    paused_queues: Vec<String>,
    ids: IdGenerator,
    reserved: u64,
    worker_signals: Vec<(String, WorkerSignal, Millis)>,
    crons: Vec<CronEntry>,
    cron_waiters: Vec<(JobId, JobId)>,
    dispatch_claims: Vec<(String, Vec<Millis>)>,
    workflows: Vec<Arc<super::workflows::table::Workflow>>,
    schemas: Vec<Arc<crate::schema::SchemaEntry>>,
    webhooks: Vec<Arc<crate::webhook::Subscription>>,
    deliveries: Vec<Arc<super::webhooks::outbox::Delivery>>,
}

impl ImageRest {
    fn with_jobs(self, jobs: Vec<Arc<Job>>) -> StateImage {
        StateImage {
            jobs,
            paused_queues: self.paused_queues,
            ids: self.ids,
            reserved: self.reserved,
            worker_signals: self.worker_signals,
            crons: self.crons,
            cron_waiters: self.cron_waiters,
            dispatch_claims: self.dispatch_claims,
            workflows: self.workflows,
            schemas: self.schemas,
            webhooks: self.webhooks,
            deliveries: self.deliveries,
            queue_configs: Vec::new(),
        }
    }
}

/// The image of payload version 5: its jobs as one sequence, then the rest.
#[derive(Deserialize)]
struct StateImageV5 {
    jobs: Vec<Arc<Job>>,
    rest: ImageRest,
}

/// A chunk of a payload's jobs (version 6 on), read but not yet decoded.
pub(crate) struct JobChunk {
    jobs: usize,
    bytes: Vec<u8>,
}

impl JobChunk {
    /// Decodes the chunk's jobs, in payload order. Jobs decoded with the
    /// same `policies` share equal retry policies, as jobs made live do.
    pub(crate) fn decode(&self, policies: &mut SharedPolicies) -> Result<Vec<Arc<Job>>, String> {
        let mut jobs = Vec::with_capacity(self.jobs);
        let mut left = &self.bytes[..];
        let mut decoder = StoredJobDecoder::new(policies);
        for _ in 0..self.jobs {
            let job = decoder.decode(&mut left).map_err(|error| format!("a job in a chunk: {error}"))?;
            jobs.push(Arc::new(job));
        }
        if !left.is_empty() {
            return Err(format!("{} bytes after the jobs of a chunk", left.len()));
        }
        Ok(jobs)
    }
}

/// Reads a payload of version 6 or later in order: its job count
/// ([`ChunkedPayload::open`]), its chunks of jobs, then the rest of the
/// image. Chunks are handed out undecoded, so that several threads can
/// decode them.
pub(crate) struct ChunkedPayload<'a, R> {
    source: &'a mut R,
    /// Payload bytes not yet read; no chunk may claim more.
    left: u64,
    /// Jobs the payload claims that no chunk read so far holds.
    jobs_left: usize,
    version: u32,
}

impl<'a, R: Read> ChunkedPayload<'a, R> {
    /// Starts reading a payload of `length` bytes; returns it with the
    /// number of jobs it holds.
    pub(crate) fn open(source: &'a mut R, length: u64, version: u32) -> Result<(Self, usize), String> {
        let mut payload = ChunkedPayload { source, left: length, jobs_left: 0, version };
        let count = u64::from_le_bytes(payload.read_array()?);
        if count > length {
            return Err(format!("the payload claims {count} jobs in {length} bytes"));
        }
        payload.jobs_left = count as usize;
        Ok((payload, count as usize))
    }

    /// The next chunk of jobs, or `None` after the last.
    pub(crate) fn next_chunk(&mut self) -> Result<Option<JobChunk>, String> {
        let header: [u8; CHUNK_HEADER_BYTES] = self.read_array()?;
        let jobs = u32::from_le_bytes(header[0..4].try_into().expect("four bytes")) as usize;
        let length = u32::from_le_bytes(header[4..8].try_into().expect("four bytes")) as u64;
        if jobs == 0 {
            return match (length, self.jobs_left) {
                (0, 0) => Ok(None),
                (0, missing) => Err(format!("the payload's chunks hold {missing} jobs fewer than it claims")),
                _ => Err("a chunk of no jobs holds bytes".to_string()),
            };
        }
        // Checked before anything is allocated for it: every job takes a byte at least.
        if jobs > CHUNK_JOBS || jobs > self.jobs_left || length > self.left || (jobs as u64) > length {
            return Err(format!(
                "a chunk claims {jobs} jobs in {length} bytes, with {} jobs and {} bytes left",
                self.jobs_left, self.left
            ));
        }
        self.jobs_left -= jobs;
        let mut bytes = vec![0u8; length as usize];
        self.read_into(&mut bytes)?;
        Ok(Some(JobChunk { jobs, bytes }))
    }

    /// After the last chunk: everything of the image but its jobs, which
    /// must take the rest of the payload.
    pub(crate) fn rest(self) -> Result<StateImage, String> {
        let mut bytes = vec![0u8; self.left as usize];
        let mut payload = self;
        payload.read_into(&mut bytes)?;
        let (rest, mut after) = postcard::take_from_bytes::<ImageRest>(&bytes).map_err(|error| error.to_string())?;
        let mut image = rest.with_jobs(Vec::new());
        if payload.version >= 7 {
            let (configs, left) = postcard::take_from_bytes(after).map_err(|error| error.to_string())?;
            (image.queue_configs, after) = (configs, left);
        }
        if !after.is_empty() {
            return Err(format!("{} bytes after the state", after.len()));
        }
        Ok(image)
    }

    fn read_array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let mut bytes = [0u8; N];
        self.read_into(&mut bytes)?;
        Ok(bytes)
    }

    fn read_into(&mut self, bytes: &mut [u8]) -> Result<(), String> {
        if bytes.len() as u64 > self.left {
            return Err("the payload ends early".to_string());
        }
        self.source.read_exact(bytes).map_err(|_| "the payload ends early".to_string())?;
        self.left -= bytes.len() as u64;
        Ok(())
    }
}

/// Room to make for a payload's jobs before they are read: the count it
/// claims, unless that is more than its length could hold (a damaged count
/// would otherwise reserve memory the checksum has not yet vouched for).
pub(crate) fn jobs_to_reserve(count: usize, length: u64) -> usize {
    count.min(usize::try_from(length / 64).unwrap_or(usize::MAX))
}

/// Checks that a payload's jobs come in strictly rising id order, which
/// also rules out a job held twice.
#[derive(Default)]
pub(crate) struct IdOrder(Option<JobId>);

impl IdOrder {
    pub(crate) fn check(&mut self, id: JobId) -> Result<(), String> {
        if self.0.is_some_and(|last| last >= id) {
            return Err(format!("job {id} is out of order"));
        }
        self.0 = Some(id);
        Ok(())
    }
}

/// Decodes a payload of version 6 or later on this thread.
fn decode_chunked(source: &mut impl Read, length: u64, version: u32) -> Result<StateImage, String> {
    let (mut payload, count) = ChunkedPayload::open(source, length, version)?;
    let mut policies = SharedPolicies::default();
    let mut jobs: Vec<Arc<Job>> = Vec::with_capacity(jobs_to_reserve(count, length));
    let mut in_order = IdOrder::default();
    while let Some(chunk) = payload.next_chunk()? {
        for job in chunk.decode(&mut policies)? {
            in_order.check(job.id)?;
            jobs.push(job);
        }
    }
    let mut image = payload.rest()?;
    image.jobs = jobs;
    Ok(image)
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
pub(crate) mod tests {
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

    /// An image of `count` jobs of assorted sizes, their ids in a scrambled
    /// order, so that every run of a snapshot's sort holds some of each part.
    pub(crate) fn image_of(count: u128) -> StateImage {
        use crate::job::{JobDefaults, JobState, parse_enqueue_body};
        let jobs = (1..=count)
            .map(|n| {
                let body = format!(r#"{{"type":"t","args":[{n},"{}"]}}"#, "x".repeat(n as usize % 97));
                let new_job = parse_enqueue_body(body.as_bytes(), &JobDefaults::default()).unwrap();
                Arc::new(Job::accept(
                    new_job,
                    JobId((n * 7919 % 10_007) << 64 | n),
                    JobState::Available,
                    1_000,
                    None,
                    None,
                ))
            })
            .collect();
        StateImage {
            jobs,
            paused_queues: vec!["paused".to_string()],
            ids: IdGenerator::default(),
            reserved: 0,
            worker_signals: vec![("w-1".to_string(), WorkerSignal::Quiet, 42)],
            crons: Vec::new(),
            cron_waiters: Vec::new(),
            dispatch_claims: vec![("key".to_string(), vec![5, 6])],
            workflows: Vec::new(),
            schemas: Vec::new(),
            webhooks: Vec::new(),
            deliveries: Vec::new(),
            queue_configs: vec![("bounded".to_string(), Backpressure::reject_above(10).warning_at(0.5))],
        }
    }

    /// Where each chunk of a current payload lies, header included.
    fn chunk_spans(payload: &[u8]) -> Vec<std::ops::Range<usize>> {
        let mut spans = Vec::new();
        let mut at = 8;
        loop {
            let jobs = u32::from_le_bytes(payload[at..at + 4].try_into().unwrap());
            let length = u32::from_le_bytes(payload[at + 4..at + 8].try_into().unwrap()) as usize;
            if jobs == 0 {
                return spans;
            }
            spans.push(at..at + CHUNK_HEADER_BYTES + length);
            at += CHUNK_HEADER_BYTES + length;
        }
    }

    /// Damaged copies of a current payload of several chunks (their
    /// checksums made anew, as a writer's bug would), each named by what
    /// was done to it.
    pub(crate) fn damaged_payloads(payload: &[u8]) -> Vec<(&'static str, Vec<u8>)> {
        let spans = chunk_spans(payload);
        assert!(spans.len() >= 3, "several chunks");
        let mut damaged = Vec::new();
        let mut count_too_high = payload.to_vec();
        let count = u64::from_le_bytes(payload[0..8].try_into().unwrap());
        count_too_high[0..8].copy_from_slice(&(count + 1).to_le_bytes());
        damaged.push(("a job count higher than the jobs held", count_too_high));
        let mut swapped = payload[..spans[0].start].to_vec();
        swapped.extend_from_slice(&payload[spans[1].clone()]);
        swapped.extend_from_slice(&payload[spans[0].clone()]);
        swapped.extend_from_slice(&payload[spans[1].end..]);
        damaged.push(("two chunks swapped, so that jobs are out of order", swapped));
        let mut too_long = payload.to_vec();
        too_long[spans[1].start + 4..spans[1].start + 8].copy_from_slice(&u32::MAX.to_le_bytes());
        damaged.push(("a chunk longer than the payload", too_long));
        let mut fewer_jobs = payload.to_vec();
        let jobs = u32::from_le_bytes(payload[spans[2].start..spans[2].start + 4].try_into().unwrap());
        fewer_jobs[spans[2].start..spans[2].start + 4].copy_from_slice(&(jobs - 1).to_le_bytes());
        damaged.push(("a chunk holding more jobs than it says", fewer_jobs));
        let mut empty_with_bytes = payload[..spans[1].start].to_vec();
        empty_with_bytes.extend_from_slice(&[0, 0, 0, 0, 1, 0, 0, 0, 7]);
        empty_with_bytes.extend_from_slice(&payload[spans[1].start..]);
        damaged.push(("a chunk of no jobs holding a byte", empty_with_bytes));
        damaged.push(("the payload cut inside a chunk", payload[..spans[1].start + 100].to_vec()));
        let mut ended_early = payload[..spans[1].start].to_vec();
        ended_early.extend_from_slice(&[0; CHUNK_HEADER_BYTES]);
        ended_early.extend_from_slice(&payload[spans[spans.len() - 1].end + CHUNK_HEADER_BYTES..]);
        damaged.push(("the end of the jobs after the first chunk", ended_early));
        let mut too_many = payload.to_vec();
        too_many[spans[0].start..spans[0].start + 4].copy_from_slice(&(CHUNK_JOBS as u32 + 1).to_le_bytes());
        damaged.push(("a chunk claiming more jobs than a chunk holds", too_many));
        damaged
    }

    #[test]
    fn a_snapshot_payload_is_the_same_whatever_the_sorting_runs_and_decodes_back() {
        let mut image = image_of(10_000);
        let whole = image.clone().encode();
        assert!(chunk_spans(&whole).len() >= 3, "more jobs than two chunks hold");
        for run_jobs in [1000, 7, 1] {
            let mut streamed = Vec::new();
            image.clone().encode_in_runs_to(&mut streamed, run_jobs).unwrap();
            assert!(streamed == whole, "runs of {run_jobs} jobs");
        }
        image.sort_jobs();
        assert_eq!(decode_image(IMAGE_VERSION, &whole).unwrap(), image);
    }

    #[test]
    fn a_damaged_chunked_payload_is_refused() {
        let whole = image_of(10_000).encode();
        for (damage, bytes) in damaged_payloads(&whole) {
            assert!(decode_image(IMAGE_VERSION, &bytes).is_err(), "{damage}");
        }
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
