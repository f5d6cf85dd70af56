//! The record sequences of a frame's payload: written in the current
//! record format, read in it or in the first (`docs/wal-format.md`,
//! "Payload").

use super::super::legacy::RecordV1;
use super::{Change, JobRecord, Logged};
use crate::job::StoredJobEncoder;
use crate::job::postcard_form::{put_serde, put_signed, put_unsigned};
use crate::limits::FRAME_PAYLOAD_BYTES_MAX;

/// How a sequence of [`Logged`] records begins: a zero, which no sequence
/// of the first format began with (the writer never logged an empty one),
/// then the record format.
const SEQUENCE_MARK: [u8; 2] = [0, RECORD_FORMAT];

/// The record format this build writes; the first (no mark) is still read.
pub const RECORD_FORMAT: u8 = 2;

/// Encodes one commit batch as one sequence: the mark, then the same bytes
/// as postcard gives the slice of records, with the jobs of enqueue records
/// written by [`StoredJobEncoder`] rather than through serde field by field.
pub fn encode_batch(records: &[Logged], out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&SEQUENCE_MARK);
    let mut jobs = StoredJobEncoder::default();
    put_unsigned(out, records.len() as u64);
    for record in records {
        match &record.change {
            Change::Jobs(JobRecord::Enqueue { jobs: new_jobs, replaced }) => {
                put_signed(out, record.at);
                out.extend_from_slice(enqueue_tag());
                put_unsigned(out, new_jobs.len() as u64);
                for job in new_jobs {
                    jobs.encode(job, out);
                }
                put_serde(out, replaced);
            }
            _ => put_serde(out, record),
        }
    }
}

/// How postcard begins the change of an `Enqueue` record: the variant
/// indexes of `Change::Jobs` and `JobRecord::Enqueue`, as the encoding of
/// an empty one shows them (so they follow the enums' order).
fn enqueue_tag() -> &'static [u8] {
    static TAG: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    TAG.get_or_init(|| {
        let empty = Change::Jobs(JobRecord::Enqueue { jobs: Vec::new(), replaced: Vec::new() });
        let mut encoded = postcard::to_allocvec(&empty).expect("records encode into a Vec without failing");
        // The two empty lists.
        assert!(encoded.ends_with(&[0, 0]), "an empty Enqueue ends in its two empty lists");
        encoded.truncate(encoded.len() - 2);
        encoded
    })
}

/// Encodes records as one or more sequences, each at most half a frame, so
/// that any one of them fits a frame with room to spare.
pub fn encode_sequences(records: &[Logged]) -> Vec<Vec<u8>> {
    encode_sequences_into(records, Vec::new())
}

/// [`encode_sequences`], the first sequence written into `buffer`: the
/// engine hands back the room the last turn's records took, where a new
/// vector grew by doubling through every turn's megabyte.
pub fn encode_sequences_into(records: &[Logged], buffer: Vec<u8>) -> Vec<Vec<u8>> {
    if records.is_empty() {
        return Vec::new();
    }
    let mut encoded = buffer;
    encode_batch(records, &mut encoded);
    if encoded.len() <= FRAME_PAYLOAD_BYTES_MAX / 2 || records.len() == 1 {
        return vec![encoded];
    }
    let (first, second) = records.split_at(records.len() / 2);
    let mut sequences = encode_sequences_into(first, encoded);
    sequences.extend(encode_sequences(second));
    sequences
}

/// Decodes a frame's payload: one or more record sequences back to back,
/// each of this format or the first. Never panics; allocation is bounded
/// by the input.
pub fn decode_batch(mut bytes: &[u8]) -> Result<Vec<Logged>, String> {
    let mut records = Vec::new();
    loop {
        let rest = match bytes {
            [0, RECORD_FORMAT, sequence @ ..] => {
                let (sequence, rest) = postcard::take_from_bytes::<Vec<Logged>>(sequence)
                    .map_err(|error| format!("undecodable records: {error}"))?;
                records.extend(sequence);
                rest
            }
            [0, format, ..] => return Err(format!("record format {format} is not supported by this build")),
            // The first format never began a sequence with 0 (an empty one).
            [0] => return Err("a record sequence cut short".to_string()),
            _ => {
                let (sequence, rest) = postcard::take_from_bytes::<Vec<RecordV1>>(bytes)
                    .map_err(|error| format!("undecodable records: {error}"))?;
                records.extend(sequence.into_iter().map(Logged::from));
                rest
            }
        };
        if rest.is_empty() {
            return Ok(records);
        }
        bytes = rest;
    }
}
