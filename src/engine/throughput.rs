//! Jobs completed and attempts failed, per queue: each second of the last
//! minute, and each minute of the last 24 hours. The minutes are kept across
//! restarts in the data dir's `throughput.json`, written at a clean stop and
//! every minute by the server (docs/api.md, "Admin API"); it is soft state:
//! a crash loses at most the minute since it was last written.

use serde::{Deserialize, Serialize};
use std::collections::{HashMap, VecDeque};
use std::path::Path;

use crate::clock::Millis;

/// How far back the minutes go.
pub const HISTORY_MS: Millis = 24 * 60 * 60 * 1000;
const MINUTE_MS: Millis = 60_000;
/// The file the minutes are kept in.
pub const FILE: &str = "throughput.json";
/// Most queues whose minutes the file holds, and most bytes it may take.
const FILE_QUEUES_MAX: usize = 10_000;
const FILE_BYTES_MAX: u64 = 256 * 1024 * 1024;

/// One minute's counts: from `minute` (a multiple of 60 000 ms) on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MinuteCount {
    pub minute: Millis,
    pub completed: u64,
    pub failed: u64,
}

#[derive(Debug, Clone)]
pub(crate) struct Throughput {
    /// (second, completed, failed), one slot per second modulo 60.
    slots: [(i64, u64, u64); 60],
    /// Minutes with counts, oldest first, none older than a day before the newest.
    minutes: VecDeque<MinuteCount>,
}

impl Default for Throughput {
    fn default() -> Self {
        Throughput { slots: [(i64::MIN, 0, 0); 60], minutes: VecDeque::new() }
    }
}

impl Throughput {
    pub(crate) fn count(&mut self, at: Millis, completed: u64, failed: u64) {
        let second = at.div_euclid(1000);
        let slot = &mut self.slots[second.rem_euclid(60) as usize];
        if slot.0 != second {
            *slot = (second, 0, 0);
        }
        slot.1 += completed;
        slot.2 += failed;
        self.count_minute(MinuteCount { minute: at - at.rem_euclid(MINUTE_MS), completed, failed });
    }

    fn count_minute(&mut self, counts: MinuteCount) {
        match self.minutes.iter().rposition(|held| held.minute <= counts.minute) {
            Some(place) if self.minutes[place].minute == counts.minute => {
                self.minutes[place].completed += counts.completed;
                self.minutes[place].failed += counts.failed;
            }
            Some(place) => self.minutes.insert(place + 1, counts),
            None => self.minutes.push_front(counts),
        }
        let newest = self.minutes.back().map_or(counts.minute, |held| held.minute);
        while self.minutes.front().is_some_and(|held| held.minute <= newest - HISTORY_MS) {
            self.minutes.pop_front();
        }
    }

    /// (completed, failed) in the 60 s up to `now`.
    pub(crate) fn last_minute(&self, now: Millis) -> (u64, u64) {
        let second = now.div_euclid(1000);
        let recent = self.slots.iter().filter(|slot| slot.0 > second - 60 && slot.0 <= second);
        recent.fold((0, 0), |(completed, failed), slot| (completed + slot.1, failed + slot.2))
    }

    /// The minutes of the 24 hours up to `now` that have counts, oldest first.
    pub(crate) fn minutes(&self, now: Millis) -> impl Iterator<Item = MinuteCount> + '_ {
        self.minutes.iter().copied().filter(move |held| held.minute > now - HISTORY_MS && held.minute <= now)
    }
}

/// Adds `from` into `into`, minute by minute (both oldest first).
pub(crate) fn merge(into: Vec<MinuteCount>, from: impl Iterator<Item = MinuteCount>) -> Vec<MinuteCount> {
    let mut all: Vec<MinuteCount> = into.into_iter().chain(from).collect();
    all.sort_by_key(|counts| counts.minute);
    let mut merged: Vec<MinuteCount> = Vec::with_capacity(all.len());
    for counts in all {
        match merged.last_mut() {
            Some(last) if last.minute == counts.minute => {
                last.completed += counts.completed;
                last.failed += counts.failed;
            }
            _ => merged.push(counts),
        }
    }
    merged
}

#[derive(Serialize, Deserialize)]
struct File {
    version: u32,
    queues: HashMap<String, Vec<MinuteCount>>,
}

/// Writes every queue's minutes to `dir/throughput.json` (through a
/// temporary file and a rename, so a reader never sees half of it).
pub(crate) fn save(dir: &Path, queues: &HashMap<String, Throughput>) -> std::io::Result<()> {
    let file = File {
        version: 1,
        queues: queues
            .iter()
            .filter(|(_, throughput)| !throughput.minutes.is_empty())
            .take(FILE_QUEUES_MAX)
            .map(|(name, throughput)| (name.clone(), throughput.minutes.iter().copied().collect()))
            .collect(),
    };
    let temporary = dir.join(format!("{FILE}.tmp"));
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut out = options.open(&temporary)?;
    std::io::Write::write_all(&mut out, &serde_json::to_vec(&file).map_err(std::io::Error::other)?)?;
    drop(out);
    std::fs::rename(&temporary, dir.join(FILE))
}

/// Reads what [`save`] wrote; nothing when there is no file or it cannot
/// be read (it only holds figures).
pub(crate) fn load(dir: &Path) -> HashMap<String, Throughput> {
    let path = dir.join(FILE);
    let readable = std::fs::metadata(&path).is_ok_and(|meta| meta.len() <= FILE_BYTES_MAX);
    let file: Option<File> = readable.then(|| std::fs::read(&path).ok()).flatten().and_then(|bytes| {
        serde_json::from_slice(&bytes)
            .inspect_err(|error| tracing::warn!(path = %path.display(), %error, "throughput history not read"))
            .ok()
    });
    let mut queues = HashMap::new();
    for (name, minutes) in file.into_iter().flat_map(|file| file.queues).take(FILE_QUEUES_MAX) {
        let throughput: &mut Throughput = queues.entry(name).or_default();
        for counts in minutes {
            if counts.minute.rem_euclid(MINUTE_MS) == 0 {
                throughput.count_minute(counts);
            }
        }
    }
    queues
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minutes_add_up_in_order_and_age_out_after_a_day() {
        let mut throughput = Throughput::default();
        throughput.count(120_500, 1, 0);
        throughput.count(179_999, 1, 1);
        throughput.count(61_000, 0, 1);
        let minutes: Vec<MinuteCount> = throughput.minutes(200_000).collect();
        assert_eq!(
            minutes,
            [
                MinuteCount { minute: 60_000, completed: 0, failed: 1 },
                MinuteCount { minute: 120_000, completed: 2, failed: 1 }
            ]
        );
        assert_eq!(throughput.last_minute(179_999), (2, 1), "seconds 120 to 179");
        throughput.count(HISTORY_MS + 60_000, 5, 0);
        let kept: Vec<Millis> = throughput.minutes(HISTORY_MS + 60_000).map(|counts| counts.minute).collect();
        assert_eq!(kept, [120_000, HISTORY_MS + 60_000], "the minute a day older is gone");
    }

    #[test]
    fn the_file_reads_back_and_a_damaged_one_is_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let mut queues = HashMap::new();
        queues.entry("mail".to_string()).or_insert_with(Throughput::default).count(60_000, 3, 1);
        save(dir.path(), &queues).unwrap();
        let loaded = load(dir.path());
        assert_eq!(
            loaded["mail"].minutes(61_000).collect::<Vec<_>>(),
            [MinuteCount { minute: 60_000, completed: 3, failed: 1 }]
        );
        std::fs::write(dir.path().join(FILE), b"{not json").unwrap();
        assert!(load(dir.path()).is_empty());
    }
}
