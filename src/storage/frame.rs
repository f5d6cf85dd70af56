//! The frame codec: `len: u32 LE | crc: u32 LE | payload[len]`, where `crc` is
//! CRC-32 (IEEE) over the four length bytes followed by the payload, so a
//! garbled length is caught as surely as a garbled payload.

use crate::limits::FRAME_PAYLOAD_BYTES_MAX;

pub const FRAME_HEADER_BYTES: usize = 8;

/// What a decoder found at the start of a buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded<'a> {
    /// A whole, valid frame and the bytes it took.
    Frame { payload: &'a [u8], size: usize },
    /// The buffer ends before the frame does.
    Incomplete,
    /// Not a frame: zero or oversized length, or a checksum mismatch.
    Invalid(&'static str),
}

/// Appends one frame holding `payload` to `out`.
pub fn encode_frame(payload: &[u8], out: &mut Vec<u8>) {
    assert!(
        !payload.is_empty() && payload.len() <= FRAME_PAYLOAD_BYTES_MAX,
        "frame payload size is checked by the caller"
    );
    let length = (payload.len() as u32).to_le_bytes();
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&length);
    hasher.update(payload);
    out.extend_from_slice(&length);
    out.extend_from_slice(&hasher.finalize().to_le_bytes());
    out.extend_from_slice(payload);
}

/// Decodes the frame at the start of `buffer`. Never allocates; refuses a
/// length above the maximum before looking further.
pub fn decode_frame(buffer: &[u8]) -> Decoded<'_> {
    if buffer.len() < FRAME_HEADER_BYTES {
        return Decoded::Incomplete;
    }
    let length_bytes: [u8; 4] = buffer[0..4].try_into().expect("slice of four bytes");
    let length = u32::from_le_bytes(length_bytes) as usize;
    if length == 0 {
        return Decoded::Invalid("zero length");
    }
    if length > FRAME_PAYLOAD_BYTES_MAX {
        return Decoded::Invalid("length over the maximum");
    }
    let stored_crc = u32::from_le_bytes(buffer[4..8].try_into().expect("slice of four bytes"));
    let Some(payload) = buffer.get(FRAME_HEADER_BYTES..FRAME_HEADER_BYTES + length) else {
        return Decoded::Incomplete;
    };
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&length_bytes);
    hasher.update(payload);
    if hasher.finalize() != stored_crc {
        return Decoded::Invalid("checksum mismatch");
    }
    Decoded::Frame { payload, size: FRAME_HEADER_BYTES + length }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let mut buffer = Vec::new();
        encode_frame(b"hello", &mut buffer);
        encode_frame(b"world!", &mut buffer);
        let Decoded::Frame { payload, size } = decode_frame(&buffer) else { panic!("first frame") };
        assert_eq!((payload, size), (&b"hello"[..], 13));
        assert_eq!(decode_frame(&buffer[size..]), Decoded::Frame { payload: b"world!", size: 14 });
    }

    #[test]
    fn every_flipped_bit_is_caught() {
        let mut clean = Vec::new();
        encode_frame(b"payload bytes", &mut clean);
        for bit in 0..clean.len() * 8 {
            let mut damaged = clean.clone();
            damaged[bit / 8] ^= 1 << (bit % 8);
            assert!(!matches!(decode_frame(&damaged), Decoded::Frame { .. }), "bit {bit}");
        }
    }

    #[test]
    fn truncation_is_incomplete() {
        let mut buffer = Vec::new();
        encode_frame(b"payload", &mut buffer);
        for cut in 0..buffer.len() {
            assert_eq!(decode_frame(&buffer[..cut]), Decoded::Incomplete, "cut at {cut}");
        }
    }
}
