//! The narrow file interface the log and snapshots write through, so tests can
//! fail a sync on purpose. Reads go straight to `std::fs`.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

/// An open file written at explicit offsets. Shared between the log writer
/// and the thread that zero-fills segment space ahead of it.
pub trait LogFile: Send + Sync {
    fn write_at(&self, offset: u64, bytes: &[u8]) -> io::Result<()>;
    /// Makes written data durable (fdatasync).
    fn sync_data(&self) -> io::Result<()>;
    /// The file's current size in bytes.
    fn size(&self) -> io::Result<u64>;
}

/// Creates and opens files, and makes directory entries durable.
pub trait FileSystem: Send + Sync + 'static {
    /// Creates a new file, failing if it exists.
    fn create_new(&self, path: &Path) -> io::Result<Arc<dyn LogFile>>;
    /// Opens an existing file for writing.
    fn open_existing(&self, path: &Path) -> io::Result<Arc<dyn LogFile>>;
    /// Makes renames and new files in `dir` durable (fsync of the directory).
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
}

/// The operating system's file system.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealFileSystem;

struct RealFile(File);

impl LogFile for RealFile {
    fn write_at(&self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        self.0.write_all_at(bytes, offset)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }

    fn size(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }
}

fn open_real(path: &Path, create: bool) -> io::Result<RealFile> {
    let mut options = OpenOptions::new();
    options.write(true);
    if create {
        options.create_new(true);
    }
    options.open(path).map(RealFile)
}

impl FileSystem for RealFileSystem {
    fn create_new(&self, path: &Path) -> io::Result<Arc<dyn LogFile>> {
        Ok(Arc::new(open_real(path, true)?))
    }

    fn open_existing(&self, path: &Path) -> io::Result<Arc<dyn LogFile>> {
        Ok(Arc::new(open_real(path, false)?))
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
    fn write_at(&self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        self.inner.write_at(offset, bytes)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.owner.take_sync()?;
        self.inner.sync_data()
    }

    fn size(&self) -> io::Result<u64> {
        self.inner.size()
    }
}

impl FileSystem for FaultyFileSystem {
    fn create_new(&self, path: &Path) -> io::Result<Arc<dyn LogFile>> {
        Ok(Arc::new(FaultyFile { inner: open_real(path, true)?, owner: self.clone() }))
    }

    fn open_existing(&self, path: &Path) -> io::Result<Arc<dyn LogFile>> {
        Ok(Arc::new(FaultyFile { inner: open_real(path, false)?, owner: self.clone() }))
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.take_sync()?;
        RealFileSystem.sync_dir(dir)
    }
}
