//! `svc inspect`: a read-only summary of a data dir that verifies every checksum
//! and decodes every record, without changing any file.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use super::image::decode_image;
use super::record::decode_batch;
use crate::storage::{StorageError, list_segments, list_snapshots, read_snapshot, scan_segment};

#[derive(Debug, Default)]
pub struct Report {
    pub snapshots: Vec<SnapshotSummary>,
    pub segments: Vec<SegmentSummary>,
    pub records_by_kind: BTreeMap<&'static str, u64>,
    pub problems: Vec<String>,
}

#[derive(Debug)]
pub struct SnapshotSummary {
    pub file: String,
    pub replay_from: u64,
    pub bytes: u64,
    pub jobs: Option<usize>,
}

#[derive(Debug)]
pub struct SegmentSummary {
    pub file: String,
    pub bytes: u64,
    pub frames: u64,
    pub records: u64,
    pub torn_tail_at: Option<u64>,
}

impl Report {
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Reads everything in `dir`; problems are collected, not fatal.
pub fn inspect(dir: &Path) -> Result<Report, StorageError> {
    let mut report = Report::default();
    for (_, path) in list_snapshots(dir)? {
        let file = path.display().to_string();
        match read_snapshot(&path) {
            Ok(snapshot) => {
                let (replay_from, payload) = (snapshot.replay_from, &snapshot.payload);
                let jobs = decode_image(snapshot.payload_version, payload).ok().map(|image| image.jobs.len());
                if jobs.is_none() {
                    report.problems.push(format!("{file}: snapshot payload does not decode"));
                }
                report.snapshots.push(SnapshotSummary { file, replay_from, bytes: payload.len() as u64, jobs });
            }
            Err(error) => report.problems.push(error.to_string()),
        }
    }
    let segments = list_segments(dir)?;
    for (position, (index, path)) in segments.iter().enumerate() {
        let is_last = position + 1 == segments.len();
        let mut records = 0u64;
        let mut kinds: BTreeMap<&'static str, u64> = BTreeMap::new();
        let scan = scan_segment(path, *index, is_last, &mut |path, offset, payload| {
            let batch = decode_batch(payload).map_err(|reason| StorageError::Corrupt {
                path: path.to_path_buf(),
                offset,
                reason,
            })?;
            records += batch.len() as u64;
            for record in &batch {
                *kinds.entry(record.kind()).or_default() += 1;
            }
            Ok(())
        });
        match scan {
            Ok(scan) => {
                for (kind, count) in kinds {
                    *report.records_by_kind.entry(kind).or_default() += count;
                }
                report.segments.push(SegmentSummary {
                    file: path.display().to_string(),
                    bytes: scan.file_bytes,
                    frames: scan.frames,
                    records,
                    torn_tail_at: scan.torn_at.map(|(offset, _)| offset),
                });
            }
            Err(error) => report.problems.push(error.to_string()),
        }
    }
    Ok(report)
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "snapshots: {}", self.snapshots.len())?;
        for snapshot in &self.snapshots {
            let jobs = snapshot.jobs.map_or("?".to_string(), |jobs| jobs.to_string());
            writeln!(
                f,
                "  {}  replay from segment {}  {} bytes  {jobs} jobs",
                snapshot.file, snapshot.replay_from, snapshot.bytes
            )?;
        }
        writeln!(f, "segments: {}", self.segments.len())?;
        for segment in &self.segments {
            write!(
                f,
                "  {}  {} bytes  {} frames  {} records",
                segment.file, segment.bytes, segment.frames, segment.records
            )?;
            match segment.torn_tail_at {
                Some(offset) => writeln!(f, "  torn tail at byte {offset} (cut off at the next start)")?,
                None => writeln!(f)?,
            }
        }
        let total: u64 = self.records_by_kind.values().sum();
        writeln!(f, "records: {total}")?;
        for (kind, count) in &self.records_by_kind {
            writeln!(f, "  {kind}: {count}")?;
        }
        if self.problems.is_empty() {
            writeln!(f, "checksums: all valid")
        } else {
            writeln!(f, "problems: {}", self.problems.len())?;
            self.problems.iter().try_for_each(|problem| writeln!(f, "  {problem}"))
        }
    }
}
