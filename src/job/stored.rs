//! How a job is encoded in logs and snapshots (docs/wal-format.md): one flat
//! list of fields, in the order the first format gave them, then its
//! extras. [`Job`] keeps some of these fields out of line; the encoding does
//! not show it, so the layout in memory can change without a new format.

use serde::{Deserialize, Serialize};
use std::sync::Arc;

use super::postcard_form::{put_serde, put_signed, put_unsigned};
use super::{
    Job, JobExtra, JobExtras, JobId, JobPayload, JobRun, JobState, QueueName, RetryPolicy, RunSlot, SharedPolicies,
};
use crate::clock::Millis;

/// Declares the stored field list once, as the two forms serde reads and
/// writes: [`StoredJob`] owns each field (decoding), `StoredJobRef` borrows
/// it from a [`Job`] (encoding). The order is the format's
/// (docs/wal-format.md); a job's run is one field here, and postcard writes
/// a struct as its fields one after another, so the run's fields, declared
/// once in [`JobRun`], sit in the list exactly where they always did.
macro_rules! stored_job_forms {
    ($lt:lifetime; $($(#[$doc:meta])* $name:ident: $owned:ty => $borrowed:ty,)*) => {
        /// A job as decoded from a log or a snapshot.
        #[derive(Debug, Clone, PartialEq, Deserialize)]
        pub struct StoredJob {
            $($(#[$doc])* pub $name: $owned,)*
        }

        /// The same fields, borrowed from a [`Job`], for encoding.
        #[derive(Serialize)]
        struct StoredJobRef<$lt> {
            $($name: $borrowed,)*
        }
    };
}

stored_job_forms! { 'a;
    id: JobId => JobId,
    payload: JobPayload => &'a JobPayload,
    queue: QueueName => &'a str,
    state: JobState => JobState,
    priority: i32 => i32,
    timeout_ms: u64 => u64,
    visibility_timeout_ms: u64 => u64,
    retry: Arc<RetryPolicy> => &'a Arc<RetryPolicy>,
    attempt: u32 => u32,
    created_at: Millis => Millis,
    scheduled_at: Option<Millis> => Option<Millis>,
    expires_at: Option<Millis> => Option<Millis>,
    enqueued_at: Option<Millis> => Option<Millis>,
    /// Thirteen fields in the format: those of [`JobRun`], in its order.
    run: JobRun => &'a JobRun,
    extras: Box<[JobExtra]> => &'a [JobExtra],
}

impl From<StoredJob> for Job {
    fn from(stored: StoredJob) -> Job {
        let StoredJob {
            id,
            payload,
            queue,
            state,
            priority,
            timeout_ms,
            visibility_timeout_ms,
            retry,
            attempt,
            created_at,
            scheduled_at,
            expires_at,
            enqueued_at,
            run,
            extras,
        } = stored;
        Job {
            id,
            payload,
            queue,
            state,
            priority: super::priority_field(priority),
            timeout_ms: super::timeout_field(timeout_ms),
            visibility_timeout_ms: super::timeout_field(visibility_timeout_ms),
            retry,
            attempt,
            created_at,
            scheduled_at: scheduled_at.into(),
            enqueued_at: enqueued_at.into(),
            // A job that never ran takes no out-of-line space.
            run: RunSlot((run != JobRun::default()).then(|| Box::new(run))),
            extras: JobExtras::new(extras.into_vec(), expires_at),
        }
    }
}

impl Serialize for Job {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        StoredJobRef {
            id: self.id,
            payload: &self.payload,
            queue: &self.queue,
            state: self.state,
            priority: i32::from(self.priority),
            timeout_ms: u64::from(self.timeout_ms),
            visibility_timeout_ms: u64::from(self.visibility_timeout_ms),
            retry: &self.retry,
            attempt: self.attempt,
            created_at: self.created_at,
            scheduled_at: self.scheduled_at(),
            expires_at: self.expires_at(),
            enqueued_at: self.enqueued_at(),
            run: self.run(),
            extras: &self.extras,
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Job {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Job, D::Error> {
        StoredJob::deserialize(deserializer).map(Job::from)
    }
}

/// Decodes jobs one after another from a slice of their stored encoding,
/// as a snapshot's chunks hold them: the same jobs as through serde, with
/// less work per job (ARCHITECTURE.md, "The engine loop", on recovery).
/// Jobs of a backlog mostly share their retry policy and queue, and most
/// never ran: a policy or queue encoded exactly as the previous job's is
/// that job's (a stored value is read front to back, so bytes that begin
/// with a value's whole encoding decode to that value and no further), and
/// a run of all-empty fields is skipped in one comparison.
pub struct StoredJobDecoder<'a, 'p> {
    policies: &'p mut SharedPolicies,
    last_policy: Option<(&'a [u8], Arc<RetryPolicy>)>,
    last_queue: Option<(&'a [u8], QueueName)>,
}

/// How the run of a job that never ran is stored: its thirteen fields
/// empty, one zero byte each (a test checks it against [`JobRun`]).
const NO_RUN_STORED: [u8; 13] = [0; 13];

/// Reads one stored value off the front of `bytes`.
fn take<'a, T: Deserialize<'a>>(bytes: &mut &'a [u8]) -> postcard::Result<T> {
    let (value, rest) = postcard::take_from_bytes(bytes)?;
    *bytes = rest;
    Ok(value)
}

/// Reads one stored value off the front of `bytes`, unless they begin with
/// the encoding of `last`, which is then cloned; the value read becomes
/// the new `last`.
fn take_repeated<'a, T: Clone>(
    bytes: &mut &'a [u8],
    last: &mut Option<(&'a [u8], T)>,
    decode: impl FnOnce(&mut &'a [u8]) -> postcard::Result<T>,
) -> postcard::Result<T> {
    if let Some((encoded, value)) = last
        && bytes.starts_with(encoded)
    {
        *bytes = &bytes[encoded.len()..];
        return Ok(value.clone());
    }
    let start = *bytes;
    let value = decode(bytes)?;
    *last = Some((&start[..start.len() - bytes.len()], value.clone()));
    Ok(value)
}

impl<'a, 'p> StoredJobDecoder<'a, 'p> {
    /// Jobs decoded share equal retry policies through `policies`.
    pub fn new(policies: &'p mut SharedPolicies) -> Self {
        StoredJobDecoder { policies, last_policy: None, last_queue: None }
    }

    /// Decodes the job at the front of `bytes` and moves past it.
    pub fn decode(&mut self, bytes: &mut &'a [u8]) -> postcard::Result<Job> {
        let id: JobId = take(bytes)?;
        let payload = decode_payload(bytes)?;
        let queue = take_repeated(bytes, &mut self.last_queue, take::<QueueName>)?;
        let state: JobState = take(bytes)?;
        let priority: i32 = take(bytes)?;
        let timeout_ms: u64 = take(bytes)?;
        let visibility_timeout_ms: u64 = take(bytes)?;
        let policies = &mut *self.policies;
        let retry = take_repeated(bytes, &mut self.last_policy, |bytes| {
            let mut policy = Arc::new(take::<RetryPolicy>(bytes)?);
            policies.share(&mut policy);
            Ok(policy)
        })?;
        let attempt: u32 = take(bytes)?;
        let created_at: Millis = take(bytes)?;
        let scheduled_at: Option<Millis> = take(bytes)?;
        let expires_at: Option<Millis> = take(bytes)?;
        let enqueued_at: Option<Millis> = take(bytes)?;
        let run = if bytes.starts_with(&NO_RUN_STORED) {
            *bytes = &bytes[NO_RUN_STORED.len()..];
            None
        } else {
            let run: JobRun = take(bytes)?;
            (run != JobRun::default()).then(|| Box::new(run))
        };
        let extras: Box<[JobExtra]> = take(bytes)?;
        Ok(Job {
            id,
            payload,
            queue,
            state,
            priority: super::priority_field(priority),
            timeout_ms: super::timeout_field(timeout_ms),
            visibility_timeout_ms: super::timeout_field(visibility_timeout_ms),
            retry,
            attempt,
            created_at,
            scheduled_at: scheduled_at.into(),
            enqueued_at: enqueued_at.into(),
            run: RunSlot(run),
            extras: JobExtras::new(extras.into_vec(), expires_at),
        })
    }
}

/// Encodes jobs one after another into their stored form: the same bytes
/// as through serde (tests check it), with less work per job, as
/// `StoredJobDecoder` reads them back. The plain fields are written as
/// postcard writes them (LEB128 varints, zigzag for signed numbers, a 0 or
/// 1 before an option's value, a length before a text or list); a policy
/// shared with the previous job is copied as the bytes it encoded to, and a
/// job that never ran gets its thirteen empty run fields in one copy. What
/// is rare (a run, tags, unknown fields, extras) still goes through serde.
#[derive(Default)]
pub struct StoredJobEncoder {
    last_policy: Option<(Arc<RetryPolicy>, Vec<u8>)>,
}

impl StoredJobEncoder {
    /// Appends `job`'s stored form to `out`.
    pub fn encode(&mut self, job: &Job, out: &mut Vec<u8>) {
        let id = job.id.0;
        put_unsigned(out, id);
        let payload = &job.payload;
        put_str(out, payload.job_type());
        put_str(out, payload.args());
        put_str(out, payload.meta());
        put_list(out, payload.tags());
        put_list(out, payload.extra());
        put_str(out, &job.queue);
        put_serde(out, &job.state);
        put_signed(out, i64::from(job.priority));
        put_unsigned(out, job.timeout_ms);
        put_unsigned(out, job.visibility_timeout_ms);
        self.put_policy(out, &job.retry);
        put_unsigned(out, job.attempt);
        put_signed(out, job.created_at);
        put_time(out, job.scheduled_at());
        put_time(out, job.expires_at());
        put_time(out, job.enqueued_at());
        match job.run.0.as_deref().filter(|run| **run != *super::NO_RUN) {
            None => out.extend_from_slice(&NO_RUN_STORED),
            Some(run) => put_serde(out, run),
        }
        put_list(out, job.extras());
    }

    fn put_policy(&mut self, out: &mut Vec<u8>, policy: &Arc<RetryPolicy>) {
        // Jobs with equal policies may hold them in allocations of their own
        // (each request thread shares its own copies): equal counts as the same.
        let same = |last: &Arc<RetryPolicy>| {
            Arc::ptr_eq(last, policy)
                || (**last == **policy && last.backoff_coefficient.to_bits() == policy.backoff_coefficient.to_bits())
        };
        match &self.last_policy {
            Some((last, encoded)) if same(last) => out.extend_from_slice(encoded),
            _ => {
                let mut encoded = Vec::new();
                put_serde(&mut encoded, &**policy);
                out.extend_from_slice(&encoded);
                self.last_policy = Some((policy.clone(), encoded));
            }
        }
    }
}

fn put_str(out: &mut Vec<u8>, text: &str) {
    put_unsigned(out, text.len() as u64);
    out.extend_from_slice(text.as_bytes());
}

fn put_time(out: &mut Vec<u8>, time: Option<Millis>) {
    match time {
        None => out.push(0),
        Some(time) => {
            out.push(1);
            put_signed(out, time);
        }
    }
}

/// A list: one zero byte when empty (as it almost always is), else serde.
fn put_list<T: Serialize>(out: &mut Vec<u8>, items: &[T]) {
    if items.is_empty() {
        out.push(0);
    } else {
        put_serde(out, items);
    }
}

/// A payload's five stored fields, its three texts read in place.
fn decode_payload(bytes: &mut &[u8]) -> postcard::Result<JobPayload> {
    let job_type: &str = take(bytes)?;
    let args: &str = take(bytes)?;
    let meta: &str = take(bytes)?;
    // No tags and no unknown fields: two empty lists.
    let (tags, extra) = if bytes.starts_with(&[0, 0]) {
        *bytes = &bytes[2..];
        (Vec::new(), Vec::new())
    } else {
        (take(bytes)?, take(bytes)?)
    };
    Ok(JobPayload::new(job_type, args, meta, tags, extra))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{ErrorEntry, FailureReport};

    fn sample_job() -> Job {
        let payload = JobPayload::new("email.send", r#"["a@example.com"]"#, "{}", vec!["t".into()], Vec::new());
        let report = FailureReport {
            error_type: "Timeout".into(),
            code: "timeout".into(),
            message: "took too long".into(),
            backtrace: Vec::new(),
            retryable: None,
            details: None,
        };
        let mut job = Job {
            id: JobId(0x0195_39a4_aaaa_7000_8000_0000_0000_0001),
            payload,
            queue: "default".into(),
            state: JobState::Retryable,
            priority: 3,
            timeout_ms: 1000,
            visibility_timeout_ms: 2000,
            retry: Arc::new(RetryPolicy::default()),
            attempt: 1,
            created_at: 10,
            scheduled_at: None.into(),
            enqueued_at: Some(10).into(),
            run: RunSlot::default(),
            extras: JobExtras::new(vec![JobExtra::ActivatedAt(5)], Some(99)),
        };
        let run = job.run_mut();
        run.started_at = Some(11);
        run.retry_at = Some(20);
        run.retry_delay_ms = Some(9);
        run.worker_id = Some("w1".into());
        run.error = Some(report.clone());
        run.errors = vec![ErrorEntry { report, attempt: 1, occurred_at: 12 }];
        job
    }

    /// The order of the fields is the format's, which the fixtures of
    /// `tests/format_fixtures.rs` hold; here, what a job writes reads back
    /// field by field, the run's and the out-of-line ones included.
    #[test]
    fn a_job_reads_back_as_its_stored_fields() {
        let job = sample_job();
        let encoded = postcard::to_allocvec(&job).unwrap();
        let stored: StoredJob = postcard::from_bytes(&encoded).unwrap();
        assert_eq!((stored.id, stored.priority, stored.timeout_ms, stored.attempt), (job.id, 3, 1000, 1));
        assert_eq!((stored.expires_at, stored.enqueued_at, &*stored.queue), (Some(99), Some(10), "default"));
        assert_eq!(&stored.run, job.run());
        assert_eq!(&*stored.extras, &[JobExtra::ActivatedAt(5)]);
        assert_eq!(Job::from(stored), job);
    }

    #[test]
    fn a_run_that_never_started_is_stored_as_the_zero_bytes_the_codecs_skip() {
        assert_eq!(postcard::to_allocvec(&JobRun::default()).unwrap(), NO_RUN_STORED);
    }

    #[test]
    fn a_job_that_never_ran_decodes_without_a_run() {
        let mut job = sample_job();
        *job.run_mut() = JobRun::default();
        let decoded: Job = postcard::from_bytes(&postcard::to_allocvec(&job).unwrap()).unwrap();
        assert!(decoded.run.0.is_none());
        assert_eq!(decoded, job, "an empty run equals no run");
    }

    /// Jobs that differ in every way the decoder takes a shortcut for:
    /// runs, retry policies, queues, tags and unknown fields, extras.
    fn varied_jobs() -> Vec<Job> {
        let mut jobs = Vec::new();
        let other_policy = Arc::new(RetryPolicy { max_attempts: 9, ..RetryPolicy::default() });
        let exhausted = Arc::new(RetryPolicy { non_retryable_errors: vec!["Fatal".into()], ..RetryPolicy::default() });
        for n in 0..24u128 {
            let mut job = sample_job();
            job.id = JobId(job.id.0 + n);
            if n % 3 == 0 {
                *job.run_mut() = JobRun::default();
            }
            if n % 4 == 1 {
                job.run_mut().claim_visibility_ms = 30_000;
            }
            job.retry = match n % 5 {
                0 | 1 => Arc::new(RetryPolicy::default()),
                2 => other_policy.clone(),
                _ => exhausted.clone(),
            };
            if n % 7 == 3 {
                job.queue = "critical".into();
            }
            if n % 6 == 5 {
                job.payload = JobPayload::new("report.build", "[1]", r#"{"k":"v"}"#, vec!["a".into()], Vec::new());
            }
            if n % 8 == 6 {
                job.payload = JobPayload::new("x", "[]", "{}", Vec::new(), vec![("note".into(), "\"hi\"".into())]);
            }
            if n % 2 == 0 {
                job.extras = JobExtras::new(Vec::new(), job.expires_at());
            }
            if n % 5 == 4 {
                job.set_expires_at(None);
            }
            jobs.push(job);
        }
        jobs
    }

    #[test]
    fn the_slice_decoder_reads_the_same_jobs_as_serde() {
        let jobs = varied_jobs();
        let mut encoded = Vec::new();
        for job in &jobs {
            encoded = postcard::to_extend(job, encoded).unwrap();
        }
        let mut policies = SharedPolicies::default();
        let mut decoder = StoredJobDecoder::new(&mut policies);
        let mut left = &encoded[..];
        let mut decoded = Vec::new();
        for job in &jobs {
            let one = decoder.decode(&mut left).unwrap();
            let through_serde: Job = postcard::from_bytes(&postcard::to_allocvec(job).unwrap()).unwrap();
            assert_eq!(&one, job);
            assert_eq!(one, through_serde);
            assert_eq!(one.run.0.is_none(), through_serde.run.0.is_none(), "an empty run takes no allocation");
            decoded.push(one);
        }
        assert!(left.is_empty());
        // Equal policies decode to one shared allocation.
        let defaults: Vec<_> = decoded.iter().filter(|job| *job.retry == RetryPolicy::default()).collect();
        assert!(defaults.len() > 2);
        assert!(defaults.iter().all(|job| Arc::ptr_eq(&job.retry, &defaults[0].retry)));
    }

    #[test]
    fn the_encoder_writes_the_bytes_serde_does() {
        let mut jobs = varied_jobs();
        // Numbers at the edges of their varints, signs and widths.
        let mut edges = sample_job();
        edges.id = JobId(u128::MAX);
        edges.priority = i8::MIN;
        edges.timeout_ms = u32::MAX;
        edges.attempt = u32::MAX;
        edges.created_at = i64::MIN + 1;
        edges.scheduled_at = Some(i64::MAX).into();
        edges.enqueued_at = Some(-1).into();
        edges.run_mut().claim_visibility_ms = u64::MAX;
        jobs.push(edges);
        // Policies equal as values but not as bytes: 0.0 and -0.0.
        for zero in [0.0, -0.0] {
            let mut job = sample_job();
            job.retry = Arc::new(RetryPolicy { backoff_coefficient: zero, ..RetryPolicy::default() });
            jobs.push(job);
        }
        let mut encoder = StoredJobEncoder::default();
        let mut encoded = Vec::new();
        let mut through_serde = Vec::new();
        for job in &jobs {
            encoder.encode(job, &mut encoded);
            through_serde = postcard::to_extend(job, through_serde).unwrap();
            assert_eq!(encoded, through_serde, "job {:?}", job.id);
        }
    }

    #[test]
    fn the_slice_decoder_refuses_a_cut_job_without_panicking() {
        let jobs = varied_jobs();
        for job in &jobs[..3] {
            let encoded = postcard::to_allocvec(job).unwrap();
            for cut in 0..encoded.len() {
                let mut policies = SharedPolicies::default();
                let mut left = &encoded[..cut];
                assert!(StoredJobDecoder::new(&mut policies).decode(&mut left).is_err(), "cut at {cut}");
            }
        }
    }
}
