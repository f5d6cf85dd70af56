//! A file system that can lose power, for tests: it keeps apart what was
//! written but not yet synced, and at a simulated crash drops it, or keeps
//! a random prefix of it (the last kept write possibly torn). A SIGKILL
//! leaves the page cache intact and so cannot show a missing sync; this can.
//!
//! What counts as durable, as on Linux with a journaling file system:
//! - data written to a file, once that file's `sync_data` returned;
//! - a file's creation and a rename, once its directory's `sync_dir` returned.
//!
//! Files live on the real disk; each write keeps the bytes it replaced, so
//! a crash can undo it. The real syncs are skipped: nothing here needs the
//! disk to be durable, only to tell what would have been.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::fs::{FileSystem, LogFile};

/// A write not yet synced, with what it replaced.
struct Unsynced {
    offset: u64,
    written: Vec<u8>,
    /// The bytes it overwrote (shorter than `written` where it grew the file).
    replaced: Vec<u8>,
    /// The file's size before the write.
    size_before: u64,
}

#[derive(Default)]
struct Pending {
    /// Unsynced writes by file, oldest first.
    writes: HashMap<PathBuf, Vec<Unsynced>>,
    /// Files created since their directory was last synced.
    created: Vec<PathBuf>,
    /// Renames (from, to) since the directory was last synced, oldest first.
    renamed: Vec<(PathBuf, PathBuf)>,
}

/// The file system; clones share what is pending.
#[derive(Clone, Default)]
pub struct PowerLossFileSystem {
    pending: Arc<Mutex<Pending>>,
}

/// A small deterministic generator for the crash's choices.
struct Choices(u64);

impl Choices {
    fn below(&mut self, bound: u64) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % bound.max(1)
    }
}

impl PowerLossFileSystem {
    pub fn new() -> Self {
        Self::default()
    }

    /// Loses power: every file keeps its synced data and, chosen by `seed`,
    /// some prefix of the writes made since (the next one perhaps torn); an
    /// unsynced creation or rename may be undone. Nothing is pending after.
    /// Only call it while nothing writes (after the engine stopped).
    pub fn crash(&self, seed: u64) -> io::Result<()> {
        let mut choices = Choices(seed | 1);
        let mut pending = self.pending.lock();
        for (path, writes) in std::mem::take(&mut pending.writes) {
            let Ok(file) = OpenOptions::new().write(true).open(&path) else { continue };
            let kept = choices.below(writes.len() as u64 + 1) as usize;
            for write in writes[kept..].iter().rev() {
                file.write_all_at(&write.replaced, write.offset)?;
                file.set_len(write.size_before)?;
            }
            if let Some(torn) = writes.get(kept).filter(|_| choices.below(2) == 0) {
                let length = choices.below(torn.written.len() as u64) as usize;
                file.write_all_at(&torn.written[..length], torn.offset)?;
            }
        }
        for (from, to) in std::mem::take(&mut pending.renamed).into_iter().rev() {
            if choices.below(2) == 0 && to.exists() {
                std::fs::rename(&to, &from)?;
            }
        }
        for path in std::mem::take(&mut pending.created) {
            if choices.below(2) == 0 && path.exists() {
                std::fs::remove_file(&path)?;
            }
        }
        Ok(())
    }

    /// Whether anything written is not yet durable.
    pub fn has_pending(&self) -> bool {
        let pending = self.pending.lock();
        pending.writes.values().any(|writes| !writes.is_empty())
            || !pending.created.is_empty()
            || !pending.renamed.is_empty()
    }

    fn open(&self, path: &Path, create: bool) -> io::Result<Arc<dyn LogFile>> {
        let mut options = OpenOptions::new();
        options.read(true).write(true);
        if create {
            options.create_new(true);
        }
        let file = options.open(path)?;
        if create {
            self.pending.lock().created.push(path.to_path_buf());
        }
        Ok(Arc::new(PowerLossFile { file, path: path.to_path_buf(), pending: self.pending.clone() }))
    }
}

impl FileSystem for PowerLossFileSystem {
    fn create_new(&self, path: &Path) -> io::Result<Arc<dyn LogFile>> {
        self.open(path, true)
    }

    fn open_existing(&self, path: &Path) -> io::Result<Arc<dyn LogFile>> {
        self.open(path, false)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut pending = self.pending.lock();
        pending.created.retain(|path| path.parent() != Some(dir));
        pending.renamed.retain(|(_, to)| to.parent() != Some(dir));
        Ok(())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)?;
        let mut pending = self.pending.lock();
        if let Some(writes) = pending.writes.remove(from) {
            pending.writes.insert(to.to_path_buf(), writes);
        }
        for created in pending.created.iter_mut().filter(|created| created.as_path() == from) {
            *created = to.to_path_buf();
        }
        pending.renamed.push((from.to_path_buf(), to.to_path_buf()));
        Ok(())
    }
}

struct PowerLossFile {
    file: File,
    path: PathBuf,
    pending: Arc<Mutex<Pending>>,
}

impl LogFile for PowerLossFile {
    fn write_at(&self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        let size_before = self.file.metadata()?.len();
        let overlap = size_before.saturating_sub(offset).min(bytes.len() as u64) as usize;
        let mut replaced = vec![0u8; overlap];
        self.file.read_exact_at(&mut replaced, offset)?;
        self.file.write_all_at(bytes, offset)?;
        let write = Unsynced { offset, written: bytes.to_vec(), replaced, size_before };
        self.pending.lock().writes.entry(self.path.clone()).or_default().push(write);
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        self.pending.lock().writes.remove(&self.path);
        Ok(())
    }

    fn size(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(path: &Path) -> Vec<u8> {
        std::fs::read(path).unwrap()
    }

    #[test]
    fn synced_data_survives_and_unsynced_data_goes() {
        let mut outcomes = std::collections::BTreeSet::new();
        for seed in 0..64 {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("a");
            let fs = PowerLossFileSystem::new();
            let file = fs.create_new(&path).unwrap();
            fs.sync_dir(dir.path()).unwrap();
            file.write_at(0, b"durable").unwrap();
            file.sync_data().unwrap();
            file.write_at(7, b" and more").unwrap();
            file.write_at(0, b"DURABLE").unwrap();
            assert!(fs.has_pending());
            fs.crash(seed).unwrap();
            let bytes = read(&path);
            // Every outcome is the synced bytes plus a prefix of the later writes.
            let head_is_torn_between = (0..=7).any(|k| bytes[..k] == b"DURABLE"[..k] && bytes[k..7] == b"durable"[k..]);
            assert!(head_is_torn_between, "{bytes:?}");
            assert!(b"durable and more"[7..].starts_with(&bytes[7..]), "{bytes:?}");
            outcomes.insert(bytes);
        }
        assert!(outcomes.contains(b"durable".as_slice()), "everything unsynced can be lost");
        assert!(outcomes.contains(b"DURABLE and more".as_slice()), "or everything kept");
        assert!(outcomes.len() > 3, "torn writes happen too: {outcomes:?}");
    }

    #[test]
    fn unsynced_creations_and_renames_may_be_undone() {
        let mut lost_creations = 0;
        let mut undone_renames = 0;
        for seed in 0..32 {
            let dir = tempfile::tempdir().unwrap();
            let fs = PowerLossFileSystem::new();
            let kept = fs.create_new(&dir.path().join("kept")).unwrap();
            kept.sync_data().unwrap();
            fs.sync_dir(dir.path()).unwrap();
            let new = fs.create_new(&dir.path().join("new")).unwrap();
            new.sync_data().unwrap();
            let temp = fs.create_new(&dir.path().join("temp")).unwrap();
            temp.sync_data().unwrap();
            fs.sync_dir(dir.path()).unwrap();
            fs.rename(&dir.path().join("temp"), &dir.path().join("final")).unwrap();
            let later = fs.create_new(&dir.path().join("later")).unwrap();
            later.sync_data().unwrap();
            fs.crash(seed).unwrap();
            assert!(dir.path().join("kept").exists() && dir.path().join("new").exists());
            assert!(dir.path().join("temp").exists() != dir.path().join("final").exists());
            undone_renames += usize::from(dir.path().join("temp").exists());
            lost_creations += usize::from(!dir.path().join("later").exists());
            assert!(!fs.has_pending());
        }
        assert!(lost_creations > 0 && lost_creations < 32);
        assert!(undone_renames > 0 && undone_renames < 32);
    }
}
