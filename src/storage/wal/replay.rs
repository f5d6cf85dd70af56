//! Reading the log back: scanning segments and replaying their frames.
//!
//! Recovery policy "truncate torn tail": a frame that fails to decode in the
//! last segment is a torn write — and cut off — only if no valid frame
//! follows it; anywhere else a bad frame refuses recovery, naming file and offset.
//! Since each batch is written after the previous one was synced, a valid frame
//! after a bad one can only mean damage to acknowledged data.

use std::path::{Path, PathBuf};

use super::super::frame::{Decoded, decode_frame};
use super::super::layout::{
    SEGMENT_HEADER_BYTES, check_segment_header, list_segments, previous_segment_length, segment_path,
};
use super::super::{StorageError, io_error, read_file};

/// Called with (file, offset, payload) for each valid frame, in log order.
pub type FrameVisitor<'a> = dyn FnMut(&Path, u64, &[u8]) -> Result<(), StorageError> + 'a;

/// What recovery does with a torn tail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TailPolicy {
    /// Cut the file back to its last valid frame (normal start).
    Truncate,
    /// Leave files untouched (inspection).
    ReadOnly,
}

/// The result of reading one segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentScan {
    pub index: u64,
    pub path: PathBuf,
    pub file_bytes: u64,
    pub frames: u64,
    /// Bytes up to the end of the last valid frame.
    pub valid_bytes: u64,
    /// Where a torn tail starts and why, if there is one.
    pub torn_at: Option<(u64, String)>,
}

/// Reads segment `index`, calling `on_frame(offset, payload)` for each valid frame.
pub fn scan_segment(
    path: &Path,
    index: u64,
    is_last: bool,
    on_frame: &mut FrameVisitor<'_>,
) -> Result<SegmentScan, StorageError> {
    let bytes = read_file(path)?;
    let file_bytes = bytes.len() as u64;
    let mut scan =
        SegmentScan { index, path: path.to_path_buf(), file_bytes, frames: 0, valid_bytes: 0, torn_at: None };
    let corrupt = |offset: u64, reason: String| StorageError::Corrupt { path: path.to_path_buf(), offset, reason };
    if file_bytes < SEGMENT_HEADER_BYTES as u64 {
        if is_last {
            scan.torn_at = Some((0, "segment header incomplete".to_string()));
            return Ok(scan);
        }
        return Err(corrupt(0, "segment header incomplete".to_string()));
    }
    let bytes: &[u8] = &bytes;
    check_segment_header(&bytes[..SEGMENT_HEADER_BYTES], index).map_err(|reason| corrupt(0, reason))?;
    let mut offset = SEGMENT_HEADER_BYTES;
    loop {
        if offset == bytes.len() {
            break;
        }
        let reason = match decode_frame(&bytes[offset..]) {
            Decoded::Frame { payload, size } => {
                on_frame(path, offset as u64, payload)?;
                scan.frames += 1;
                offset += size;
                continue;
            }
            Decoded::Incomplete => "frame runs past the end of the file",
            Decoded::Invalid(reason) => reason,
        };
        if bytes[offset..].iter().all(|byte| *byte == 0) {
            // Zeroed space laid down ahead of the writer: the clean end.
            break;
        }
        if !is_last {
            return Err(corrupt(offset as u64, format!("{reason} in a sealed segment")));
        }
        if let Some(next) = next_valid_frame(bytes, offset + 1) {
            return Err(corrupt(offset as u64, format!("{reason}, and a valid frame follows at offset {next}")));
        }
        scan.torn_at = Some((offset as u64, reason.to_string()));
        break;
    }
    scan.valid_bytes = offset as u64;
    Ok(scan)
}

/// Checks that the segment before the one at `path` ends where that one's
/// header says it did: frames lost at the end of a sealed segment would
/// otherwise read as its clean end.
fn check_continuity(previous: &SegmentScan, path: &Path) -> Result<(), StorageError> {
    use std::io::Read;
    let mut header = [0u8; SEGMENT_HEADER_BYTES];
    let read = std::fs::File::open(path).and_then(|mut file| file.read_exact(&mut header));
    // A header that does not read back is reported by the segment's own scan.
    let Some(recorded) = read.ok().and_then(|()| previous_segment_length(&header)) else { return Ok(()) };
    if previous.valid_bytes != recorded {
        return Err(StorageError::Corrupt {
            path: previous.path.clone(),
            offset: previous.valid_bytes,
            reason: format!(
                "the segment's frames end at byte {}, but the next segment records that they ended at byte {recorded}: \
                 written frames were lost",
                previous.valid_bytes
            ),
        });
    }
    Ok(())
}

fn next_valid_frame(bytes: &[u8], from: usize) -> Option<usize> {
    (from..bytes.len()).find(|&start| matches!(decode_frame(&bytes[start..]), Decoded::Frame { .. }))
}

/// Where replay ended: the segment to continue writing, and what was cut off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayEnd {
    /// (index, valid bytes) of the last segment, if any segment exists.
    pub last_segment: Option<(u64, u64)>,
    pub scans: Vec<SegmentScan>,
}

/// Replays every frame of segments `from_segment..` in order.
pub fn replay_log(
    dir: &Path,
    from_segment: u64,
    policy: TailPolicy,
    on_frame: &mut FrameVisitor<'_>,
) -> Result<ReplayEnd, StorageError> {
    let segments: Vec<(u64, PathBuf)> =
        list_segments(dir)?.into_iter().filter(|(index, _)| *index >= from_segment).collect();
    let mut end = ReplayEnd { last_segment: None, scans: Vec::new() };
    for (position, (index, path)) in segments.iter().enumerate() {
        let expected = from_segment + position as u64;
        if *index != expected {
            return Err(StorageError::Corrupt {
                path: segment_path(dir, expected),
                offset: 0,
                reason: format!("log segment {expected} is missing (found {index} next)"),
            });
        }
        let is_last = position + 1 == segments.len();
        if let Some(previous) = end.scans.last() {
            check_continuity(previous, path)?;
        }
        let scan = scan_segment(path, *index, is_last, on_frame)?;
        if let Some((offset, reason)) = &scan.torn_at
            && policy == TailPolicy::Truncate
        {
            tracing::warn!(
                file = %path.display(),
                offset = *offset,
                reason = %reason,
                dropped_bytes = scan.file_bytes - offset,
                "cutting off the torn tail of the log"
            );
            // Zero the damaged tail (keeping the file's zeroed space) and make it durable.
            let file = std::fs::OpenOptions::new().write(true).open(path).map_err(io_error(path))?;
            let zeros = vec![0u8; (scan.file_bytes - offset) as usize];
            std::os::unix::fs::FileExt::write_all_at(&file, &zeros, *offset).map_err(io_error(path))?;
            file.sync_all().map_err(io_error(path))?;
        }
        end.last_segment = Some((*index, scan.valid_bytes));
        end.scans.push(scan);
    }
    Ok(end)
}
