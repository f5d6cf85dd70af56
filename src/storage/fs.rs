//! The narrow file interface the log and snapshots write through, so tests can
//! fail a sync on purpose. Reads go straight to `std::fs`.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

/// An open file that is only appended to.
pub trait LogFile: Send {
    fn write_all(&mut self, bytes: &[u8]) -> io::Result<()>;
    /// Makes written data durable (fdatasync).
    fn sync_data(&mut self) -> io::Result<()>;
    /// Cuts the file back to `length` bytes.
    fn truncate(&mut self, length: u64) -> io::Result<()>;
}

/// Creates and opens files, and makes directory entries durable.
pub trait FileSystem: Send + Sync + 'static {
    /// Creates a new file (failing if it exists) for appending.
    fn create_new(&self, path: &Path) -> io::Result<Box<dyn LogFile>>;
    /// Opens an existing file for appending at its end.
    fn open_append(&self, path: &Path) -> io::Result<Box<dyn LogFile>>;
    /// Makes renames and new files in `dir` durable (fsync of the directory).
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
}

/// The operating system's file system.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealFileSystem;

struct RealFile(File);

impl LogFile for RealFile {
    fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.0.write_all(bytes)
    }

    fn sync_data(&mut self) -> io::Result<()> {
        self.0.sync_data()
    }

    fn truncate(&mut self, length: u64) -> io::Result<()> {
        self.0.set_len(length)
    }
}

impl FileSystem for RealFileSystem {
    fn create_new(&self, path: &Path) -> io::Result<Box<dyn LogFile>> {
        let file = OpenOptions::new().write(true).create_new(true).open(path)?;
        Ok(Box::new(RealFile(file)))
    }

    fn open_append(&self, path: &Path) -> io::Result<Box<dyn LogFile>> {
        let file = OpenOptions::new().append(true).open(path)?;
        Ok(Box::new(RealFile(file)))
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }
}

/// A real file system whose syncs start failing after a set number of
/// successes: the way tests prove that a failed fsync poisons the log.
#[derive(Debug, Clone)]
pub struct FaultyFileSystem {
    syncs_left: Arc<AtomicI64>,
}

impl FaultyFileSystem {
    /// Lets `successful_syncs` syncs (data or directory) succeed, then fails every one.
    pub fn failing_after(successful_syncs: i64) -> Self {
        Self { syncs_left: Arc::new(AtomicI64::new(successful_syncs)) }
    }

    /// Changes how many syncs still succeed.
    pub fn set_syncs_left(&self, successful_syncs: i64) {
        self.syncs_left.store(successful_syncs, Ordering::SeqCst);
    }

    fn take_sync(&self) -> io::Result<()> {
        if self.syncs_left.fetch_sub(1, Ordering::SeqCst) > 0 {
            Ok(())
        } else {
            Err(io::Error::other("injected fsync failure"))
        }
    }
}

struct FaultyFile {
    inner: RealFile,
    owner: FaultyFileSystem,
}

impl LogFile for FaultyFile {
    fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.inner.write_all(bytes)
    }

    fn sync_data(&mut self) -> io::Result<()> {
        self.owner.take_sync()?;
        self.inner.sync_data()
    }

    fn truncate(&mut self, length: u64) -> io::Result<()> {
        self.inner.truncate(length)
    }
}

impl FileSystem for FaultyFileSystem {
    fn create_new(&self, path: &Path) -> io::Result<Box<dyn LogFile>> {
        let file = OpenOptions::new().write(true).create_new(true).open(path)?;
        Ok(Box::new(FaultyFile { inner: RealFile(file), owner: self.clone() }))
    }

    fn open_append(&self, path: &Path) -> io::Result<Box<dyn LogFile>> {
        let file = OpenOptions::new().append(true).open(path)?;
        Ok(Box::new(FaultyFile { inner: RealFile(file), owner: self.clone() }))
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.take_sync()?;
        RealFileSystem.sync_dir(dir)
    }
}
