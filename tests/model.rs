//! Model-based test: random sequences of enqueue (with unique policies,
//! staged or not) / activate / workflow create and cancel / fetch / ack /
//! nack / cancel / heartbeat / dead-letter retry and delete / pause / clock
//! advance / restart (clean and crash) run against the engine and the reference model
//! in `support/model.rs`. After every step each job's state, attempt count, entry
//! time and deadlines must agree, every fetch must claim exactly the jobs the
//! model picks, and the engine checks its own invariants after every batch.

use proptest::prelude::*;
#[path = "support/model.rs"]
mod model;

use model::{Op, run, run_losing_power};

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..2usize, -2..=2i32, 1..=3u32, proptest::option::weighted(0.4, (0..3u8, 0..3u8)), proptest::bool::weighted(0.15))
            .prop_map(|(queue, priority, max_attempts, unique, staged)| Op::Enqueue { queue, priority, max_attempts, unique, staged }),
        1 => any::<usize>().prop_map(|pick| Op::Activate { pick }),
        1 => (0..3u8, 1..4usize, 0..2usize, 0..8u8).prop_map(|(kind, size, queue, callbacks)| Op::CreateWorkflow { kind, size, queue, callbacks }),
        1 => any::<usize>().prop_map(|pick| Op::CancelWorkflow { pick }),
        3 => (proptest::collection::vec(0..2usize, 1..4), 1..=3usize).prop_map(|(queues, count)| Op::Fetch { queues, count }),
        2 => any::<usize>().prop_map(|pick| Op::Ack { pick }),
        2 => (any::<usize>(), any::<bool>()).prop_map(|(pick, requeue)| Op::Nack { pick, requeue }),
        1 => any::<usize>().prop_map(|pick| Op::Cancel { pick }),
        1 => any::<usize>().prop_map(|pick| Op::DeadLetterRetry { pick }),
        1 => any::<usize>().prop_map(|pick| Op::DeadLetterDelete { pick }),
        1 => proptest::collection::vec(any::<usize>(), 0..3).prop_map(|picks| Op::Heartbeat { picks }),
        2 => (0..4000i64).prop_map(|ms| Op::Advance { ms }),
        1 => any::<bool>().prop_map(|clean| Op::Restart { clean }),
        1 => (0..2usize, any::<bool>()).prop_map(|(queue, paused)| Op::Pause { queue, paused }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn engine_agrees_with_the_model(ops in proptest::collection::vec(op(), 1..60)) {
        if let Err(disagreement) = run(&ops) {
            return Err(TestCaseError::fail(disagreement));
        }
    }

    /// Every crash also loses power: unsynced writes are dropped or kept in
    /// part. Nothing acknowledged may be lost, and the data dir must open.
    #[test]
    fn acknowledged_changes_survive_power_loss(ops in proptest::collection::vec(op(), 1..60), seed in any::<u64>()) {
        if let Err(disagreement) = run_losing_power(&ops, seed) {
            return Err(TestCaseError::fail(disagreement));
        }
    }
}

#[test]
fn byte_decoded_sequences_agree_too() {
    // The fuzz target's decoder, on a fixed spread of inputs.
    let bytes: Vec<u8> = (0u32..600).map(|n| (n * 37 % 251) as u8).collect();
    let ops = model::ops_from_bytes(&bytes);
    assert!(ops.len() > 100);
    run(&ops).unwrap();
}
