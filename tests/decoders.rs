//! Property tests of the two decoders that read untrusted bytes from disk:
//! arbitrary input never panics and never allocates much more than its own
//! size; encode → decode gives back what went in.

use proptest::prelude::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;
use svc::engine::record::{
    Claim, FailOutcome, JobRecord, Logged, RECORD_FORMAT, decode_batch, encode_batch, encode_sequences,
};
use svc::job::{FailureReport, Job, JobBuilder, JobDefaults, JobId, JobState, RetryPolicy};
use svc::storage::frame::{Decoded, decode_frame, encode_frame};

/// Records the largest single allocation made by the current thread while armed.
struct LargestAllocation;

thread_local! {
    static ARMED: Cell<bool> = const { Cell::new(false) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: every block comes from the system allocator and goes back to it
// with the same layout; the bookkeeping allocates nothing.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for LargestAllocation {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ARMED.try_with(|armed| {
            if armed.get() {
                LARGEST.with(|largest| largest.set(largest.get().max(layout.size())));
            }
        });
        // SAFETY: forwards the caller's layout unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: LargestAllocation = LargestAllocation;

/// Runs `work` and returns the largest allocation it made.
fn largest_allocation(work: impl FnOnce()) -> usize {
    LARGEST.with(|largest| largest.set(0));
    ARMED.with(|armed| armed.set(true));
    work();
    ARMED.with(|armed| armed.set(false));
    LARGEST.with(Cell::get)
}

/// serde caps a sequence's pre-allocation at 1 MiB whatever length it claims.
const PREALLOCATION_CAP: usize = 1024 * 1024;

fn record_strategy() -> impl Strategy<Value = Logged> {
    let id = any::<u128>().prop_map(JobId);
    prop_oneof![
        (any::<i64>(), id.clone(), proptest::option::of(".{0,40}"))
            .prop_map(|(at, id, result)| Logged::new(at, JobRecord::Ack { id, result })),
        (any::<i64>(), id.clone()).prop_map(|(at, id)| Logged::new(at, JobRecord::Cancel { id })),
        (any::<i64>(), proptest::collection::vec(any::<u128>().prop_map(JobId), 0..8))
            .prop_map(|(at, ids)| Logged::new(at, JobRecord::Promote { ids })),
        (
            any::<i64>(),
            proptest::option::of("[a-z]{1,8}"),
            proptest::collection::vec((any::<u128>(), any::<i64>(), any::<i64>()), 0..5)
        )
            .prop_map(|(at, worker_id, claims)| {
                let claims = claims
                    .into_iter()
                    .map(|(id, v, e)| Claim { id: JobId(id), visibility_deadline: v, execution_deadline: e })
                    .collect();
                Logged::new(at, JobRecord::Claim { worker_id, claims })
            }),
        (
            -1_000_000_000_000i64..4_000_000_000_000,
            proptest::collection::vec(job_strategy(), 0..6),
            proptest::collection::vec(any::<u128>().prop_map(JobId), 0..3)
        )
            .prop_map(|(at, jobs, replaced)| Logged::new(at, JobRecord::Enqueue { jobs, replaced })),
        (any::<i64>(), id, "[A-Za-z]{1,10}", ".{0,30}", any::<u64>()).prop_map(|(at, id, kind, message, delay)| {
            let report = FailureReport { message, ..FailureReport::server(&kind, "") };
            Logged::new(
                at,
                JobRecord::Fail { id, report, outcome: FailOutcome::Retry { retry_at: at, delay_ms: delay } },
            )
        }),
    ]
}

/// New jobs as an enqueue record holds them: varied types, args, queues,
/// priorities, states, times, tags and retry policies.
fn job_strategy() -> impl Strategy<Value = Arc<Job>> {
    (
        any::<u128>(),
        "[a-z]{1,6}(\\.[a-z]{1,5}){0,2}",
        proptest::collection::vec(any::<i64>(), 0..3),
        "[a-z][a-z0-9]{0,7}",
        -100i32..=100,
        0..3u8,
        proptest::option::of(0i64..4_000_000_000_000),
        proptest::collection::vec("[a-z]{1,6}", 0..2),
        1u32..30,
    )
        .prop_map(|(id, job_type, args, queue, priority, state, scheduled, tags, attempts)| {
            let policy = RetryPolicy { max_attempts: attempts, ..RetryPolicy::default() };
            let new_job = JobBuilder::new(job_type)
                .args(args)
                .queue(queue)
                .priority(priority)
                .tags(tags)
                .retry(&policy)
                .build(&JobDefaults::default())
                .expect("a valid job");
            let state = [JobState::Available, JobState::Scheduled, JobState::Pending][usize::from(state)];
            Arc::new(Job::accept(new_job, JobId(id), state, 1_700_000_000_000, scheduled, scheduled.map(|at| at + 1)))
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// The hand-written encoding of a batch is the sequence mark, then byte
    /// for byte postcard's.
    #[test]
    fn a_batch_encodes_as_postcard_encodes_it(records in proptest::collection::vec(record_strategy(), 1..12)) {
        let mut encoded = Vec::new();
        encode_batch(&records, &mut encoded);
        let mut expected = vec![0, RECORD_FORMAT];
        expected.extend(postcard::to_allocvec(&records).unwrap());
        prop_assert_eq!(encoded, expected);
    }

    #[test]
    fn frames_round_trip(payload in proptest::collection::vec(any::<u8>(), 1..2048)) {
        let mut buffer = Vec::new();
        encode_frame(&payload, &mut buffer);
        prop_assert_eq!(decode_frame(&buffer), Decoded::Frame { payload: &payload, size: buffer.len() });
    }

    #[test]
    fn arbitrary_bytes_never_decode_as_a_frame_by_accident_or_panic(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
        let largest = largest_allocation(|| {
            let _ = decode_frame(&bytes);
        });
        prop_assert_eq!(largest, 0, "the frame decoder never allocates");
    }

    #[test]
    fn arbitrary_bytes_never_panic_the_record_decoder(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
        let length = bytes.len();
        let largest = largest_allocation(|| {
            let _ = decode_batch(&bytes);
        });
        prop_assert!(largest <= PREALLOCATION_CAP + 64 * length, "allocated {} bytes for {} input bytes", largest, length);
    }

    #[test]
    fn records_round_trip(records in proptest::collection::vec(record_strategy(), 1..16)) {
        let mut encoded = Vec::new();
        encode_batch(&records, &mut encoded);
        prop_assert_eq!(decode_batch(&encoded).unwrap(), records);
    }

    #[test]
    fn a_payload_of_several_sequences_decodes_them_in_order(
        first in proptest::collection::vec(record_strategy(), 1..8),
        second in proptest::collection::vec(record_strategy(), 1..8),
    ) {
        let mut payload = Vec::new();
        for sequence in encode_sequences(&first).into_iter().chain(encode_sequences(&second)) {
            payload.extend(sequence);
        }
        let expected: Vec<Logged> = first.iter().chain(&second).cloned().collect();
        prop_assert_eq!(decode_batch(&payload).unwrap(), expected);
    }

    #[test]
    fn truncated_batches_are_refused(records in proptest::collection::vec(record_strategy(), 1..8), cut in any::<prop::sample::Index>()) {
        let mut encoded = Vec::new();
        encode_batch(&records, &mut encoded);
        let cut = cut.index(encoded.len());
        prop_assert!(decode_batch(&encoded[..cut]).is_err(), "a truncated batch never decodes");
    }
}

#[test]
fn a_huge_claimed_length_is_refused_before_allocating() {
    let mut bytes = vec![0xff, 0xff, 0xff, 0x7f];
    bytes.extend_from_slice(&[0; 4]);
    let largest = largest_allocation(|| assert!(matches!(decode_frame(&bytes), Decoded::Invalid(_))));
    assert_eq!(largest, 0);
    // A batch that claims four billion records, in either record format.
    let claim = [0xff, 0xff, 0xff, 0xff, 0x0f, 0x03];
    let largest = largest_allocation(|| assert!(decode_batch(&claim).is_err()));
    assert!(largest <= PREALLOCATION_CAP, "allocated {largest}");
    let claim = [0, RECORD_FORMAT, 0xff, 0xff, 0xff, 0xff, 0x0f, 0x03];
    let largest = largest_allocation(|| assert!(decode_batch(&claim).is_err()));
    assert!(largest <= PREALLOCATION_CAP, "allocated {largest}");
}
