//! Arbitrary bytes through the record decoder: never panics; a batch it
//! accepts re-encodes and decodes to the same records.
#![no_main]

use libfuzzer_sys::fuzz_target;
use svc::engine::record::{decode_batch, encode_batch};

fuzz_target!(|data: &[u8]| {
    if let Ok(records) = decode_batch(data) {
        let mut encoded = Vec::new();
        encode_batch(&records, &mut encoded);
        assert_eq!(decode_batch(&encoded).expect("re-encoded records decode"), records);
    }
});
