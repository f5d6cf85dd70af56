//! Operation sequences decoded from fuzz input run against the engine and the
//! reference model (`svc::model`); any disagreement is a crash.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let ops = svc::model::ops_from_bytes(data);
    if let Err(disagreement) = svc::model::run(&ops) {
        panic!("engine and model disagree: {disagreement}\nops: {ops:?}");
    }
});
