//! Operation sequences decoded from fuzz input run against the engine and the
//! reference model (`tests/support/model.rs`); any disagreement is a crash.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[allow(dead_code)]
#[path = "../../tests/support/model.rs"]
mod model;

fuzz_target!(|data: &[u8]| {
    let ops = model::ops_from_bytes(data);
    if let Err(disagreement) = model::run(&ops) {
        panic!("engine and model disagree: {disagreement}\nops: {ops:?}");
    }
});
