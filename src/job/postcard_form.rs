//! Values written the way postcard encodes them, for the hand-written
//! encoders of what is logged and snapshotted most (jobs, enqueue records):
//! the bytes must stay exactly serde's, which their tests check.

use serde::Serialize;

/// Appends an unsigned number as postcard does: a LEB128 varint.
pub fn put_unsigned(out: &mut Vec<u8>, value: impl Into<u128>) {
    let mut value: u128 = value.into();
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// Appends a signed number as postcard does: zigzag, then a varint (for an
/// `i32` the same bytes as for the `i64` of equal value).
pub fn put_signed(out: &mut Vec<u8>, value: i64) {
    put_unsigned(out, ((value << 1) ^ (value >> 63)) as u64);
}

/// Appends any value through serde, as postcard encodes it.
pub fn put_serde<T: Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) {
    *out = postcard::to_extend(value, std::mem::take(out)).expect("values encode into a Vec without failing");
}
