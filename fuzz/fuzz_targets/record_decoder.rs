//! Arbitrary bytes through the record decoder: never panics; a batch it
//! accepts re-encodes to bytes that decode and re-encode to the same bytes
//! (compared as bytes, since a decoded float may be NaN).
#![no_main]

use libfuzzer_sys::fuzz_target;
use svc::engine::record::{decode_batch, encode_batch};

fuzz_target!(|data: &[u8]| {
    if let Ok(records) = decode_batch(data) {
        let mut first = Vec::new();
        encode_batch(&records, &mut first);
        let again = decode_batch(&first).expect("re-encoded records decode");
        let mut second = Vec::new();
        encode_batch(&again, &mut second);
        assert_eq!(first, second);
    }
});
