//! Arbitrary bytes through the frame decoder: never panics; a frame it accepts
//! re-encodes to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use svc::storage::frame::{decode_frame, encode_frame, Decoded};

fuzz_target!(|data: &[u8]| {
    if let Decoded::Frame { payload, size } = decode_frame(data) {
        let mut again = Vec::new();
        encode_frame(payload, &mut again);
        assert_eq!(&again[..], &data[..size]);
    }
});
