//! The narrow file interface the log and snapshots write through, so tests can
//! fail, hold or count syncs on purpose. Reads go straight to `std::fs`.
//!
//! A log segment is written through two handles: a buffered one for the
//! header and the zero-filled space, and, where the file system allows it, a
//! direct one (`O_DIRECT | O_DSYNC`) for frames. A direct write skips the page
//! cache and its writeback, so a durable commit costs about a third less CPU
//! time than `pwrite` + `fdatasync`.

use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
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
    /// Bytes this process may still add to the file system the file is on
    /// (root may use the blocks a file system reserves for it).
    fn free_space(&self) -> io::Result<u64> {
        Ok(u64::MAX)
    }
    /// Starts writing `length` bytes from `offset` to the device without
    /// waiting for them (a hint; durability still needs `sync_data`).
    fn start_writeback(&self, _offset: u64, _length: u64) {}
}

/// Creates and opens files, and makes directory entries durable.
pub trait FileSystem: Send + Sync + 'static {
    /// Creates a new file, failing if it exists.
    fn create_new(&self, path: &Path) -> io::Result<Arc<dyn LogFile>>;
    /// Opens an existing file for writing.
    fn open_existing(&self, path: &Path) -> io::Result<Arc<dyn LogFile>>;
    /// Makes renames and new files in `dir` durable (fsync of the directory).
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// Renames a file; durable once its directory is synced.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }
    /// Opens an existing file for direct writes: each write must start and
    /// end on a `DIRECT_BLOCK_BYTES` (4 KiB) boundary from a buffer aligned the
    /// same way, and is durable when it returns (`sync_data` is then never
    /// needed). `None` where the file system does not offer them.
    fn open_direct(&self, _path: &Path) -> io::Result<Option<Arc<dyn LogFile>>> {
        Ok(None)
    }
    /// Opens an existing file for direct writes that bypass the page cache
    /// but are not synced one by one (`O_DIRECT` alone): aligned as for
    /// [`FileSystem::open_direct`], and durable once `sync_data` of any
    /// handle to the file returns. `None` where the file system does not
    /// offer them.
    fn open_direct_unsynced(&self, _path: &Path) -> io::Result<Option<Arc<dyn LogFile>>> {
        Ok(None)
    }
}

/// The alignment of direct writes: a common page and physical sector size,
/// and a multiple of every usual logical block size.
pub const DIRECT_BLOCK_BYTES: usize = 4096;

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

    #[allow(unsafe_code)]
    fn free_space(&self) -> io::Result<u64> {
        use std::os::fd::AsRawFd;
        // SAFETY: `statvfs` is a C struct of integers, for which all-zero
        // bytes are a valid value.
        let mut stats: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: the descriptor is open for as long as `self`, and `stats`
        // is a valid place for the kernel to write to.
        if unsafe { libc::fstatvfs(self.0.as_raw_fd(), &mut stats) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: geteuid has no preconditions.
        let blocks = if unsafe { libc::geteuid() } == 0 { stats.f_bfree } else { stats.f_bavail };
        Ok((blocks as u64).saturating_mul(stats.f_frsize as u64))
    }

    #[cfg(target_os = "linux")]
    #[allow(unsafe_code)]
    fn start_writeback(&self, offset: u64, length: u64) {
        use std::os::fd::AsRawFd;
        // SAFETY: plain integer arguments on a descriptor open for as long
        // as `self`; a failure only leaves the pages to the final sync.
        unsafe { libc::sync_file_range(self.0.as_raw_fd(), offset as i64, length as i64, libc::SYNC_FILE_RANGE_WRITE) };
    }
}

fn open_real(path: &Path, create: bool) -> io::Result<RealFile> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut options = OpenOptions::new();
    options.write(true);
    if create {
        // Readable by the server's user only: the log holds payloads, results
        // and webhook secrets.
        options.create_new(true).mode(0o600);
    }
    options.open(path).map(RealFile)
}

/// A direct handle, each write synced (`O_DSYNC`) when `synced`.
#[cfg(target_os = "linux")]
fn open_real_direct(path: &Path, synced: bool) -> io::Result<Option<RealFile>> {
    use std::os::unix::fs::OpenOptionsExt;
    let flags = if synced { libc::O_DIRECT | libc::O_DSYNC } else { libc::O_DIRECT };
    match OpenOptions::new().write(true).custom_flags(flags).open(path) {
        Ok(file) => Ok(Some(RealFile(file))),
        // The file system does not do direct I/O (tmpfs on older kernels, for one).
        Err(error) if error.raw_os_error() == Some(libc::EINVAL) => Ok(None),
        Err(error) => Err(error),
    }
}

#[cfg(not(target_os = "linux"))]
fn open_real_direct(_path: &Path, _synced: bool) -> io::Result<Option<RealFile>> {
    Ok(None)
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

    fn open_direct(&self, path: &Path) -> io::Result<Option<Arc<dyn LogFile>>> {
        Ok(open_real_direct(path, true)?.map(|file| Arc::new(file) as Arc<dyn LogFile>))
    }

    fn open_direct_unsynced(&self, path: &Path) -> io::Result<Option<Arc<dyn LogFile>>> {
        Ok(open_real_direct(path, false)?.map(|file| Arc::new(file) as Arc<dyn LogFile>))
    }
}

/// The operating system's file system without direct writes: log frames go
/// through the page cache and `fdatasync` (`storage.direct_writes = false`).
#[derive(Debug, Default, Clone, Copy)]
pub struct PageCacheFileSystem;

impl FileSystem for PageCacheFileSystem {
    fn create_new(&self, path: &Path) -> io::Result<Arc<dyn LogFile>> {
        RealFileSystem.create_new(path)
    }

    fn open_existing(&self, path: &Path) -> io::Result<Arc<dyn LogFile>> {
        RealFileSystem.open_existing(path)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        RealFileSystem.sync_dir(dir)
    }
}

/// A real file system whose syncs start failing after a set number of
/// successes (the way tests prove that a failed fsync poisons the log), and
/// whose data syncs can be held and counted by thread (the way tests show
/// group commit). A direct write counts as a data sync: it is one.
#[derive(Debug, Clone)]
pub struct FaultyFileSystem {
    syncs_left: Arc<AtomicI64>,
    data_syncs: Arc<(Mutex<DataSyncs>, Condvar)>,
    direct_writes: bool,
    /// Direct handles open, but every direct write fails with `EINVAL`.
    refuse_direct_writes: bool,
    /// Direct writes made so far, synced or not.
    direct_writes_made: Arc<std::sync::atomic::AtomicU64>,
    /// The disk is full: a buffered write that grows a file fails with `ENOSPC`.
    no_space: Arc<std::sync::atomic::AtomicBool>,
    /// Syncs on threads of this name fail with an I/O error.
    failing_thread: Arc<Mutex<Option<String>>>,
    /// Opens that still succeed before every open fails with `EMFILE`, as
    /// in a process out of file descriptors; negative: no limit.
    opens_left: Arc<AtomicI64>,
}

#[derive(Debug, Default)]
struct DataSyncs {
    /// Data syncs on threads of this name wait until released.
    held_thread: Option<String>,
    /// Syncs waiting now.
    waiting: usize,
    /// Data syncs begun, by thread name.
    begun: HashMap<String, u64>,
}

impl FaultyFileSystem {
    /// Lets `successful_syncs` syncs (data or directory) succeed, then fails every one.
    pub fn failing_after(successful_syncs: i64) -> Self {
        Self {
            syncs_left: Arc::new(AtomicI64::new(successful_syncs)),
            data_syncs: Arc::default(),
            direct_writes: true,
            refuse_direct_writes: false,
            direct_writes_made: Arc::default(),
            no_space: Arc::default(),
            failing_thread: Arc::default(),
            opens_left: Arc::new(AtomicI64::new(-1)),
        }
    }

    /// Lets `opens` more files be opened, then fails every open with
    /// `EMFILE` (the process is out of descriptors); `None` lifts the limit.
    pub fn set_opens_left(&self, opens: Option<u64>) {
        self.opens_left.store(opens.map_or(-1, |opens| opens as i64), Ordering::SeqCst);
    }

    /// Takes one open from the allowance, or fails as a process out of descriptors does.
    fn take_open(&self) -> io::Result<()> {
        let taken = self
            .opens_left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| if left > 0 { Some(left - 1) } else { None });
        match taken {
            Err(0) => Err(io::Error::from_raw_os_error(libc::EMFILE)),
            _ => Ok(()),
        }
    }

    /// Fills the disk (`true`) or frees space again: while full, a buffered
    /// write that would grow a file fails with `ENOSPC`, as on a real full
    /// disk; writes over a file's existing bytes still succeed.
    pub fn set_no_space(&self, full: bool) {
        self.no_space.store(full, Ordering::SeqCst);
    }

    /// Makes every later sync on threads named `thread` fail.
    pub fn fail_syncs_on(&self, thread: &str) {
        *self.failing_thread.lock() = Some(thread.to_string());
    }

    /// The same, but refusing every direct write with `EINVAL` once opened,
    /// as some file systems do.
    pub fn refusing_direct_writes(mut self) -> Self {
        self.refuse_direct_writes = true;
        self
    }

    /// The same, but offering no direct writes, as on a file system without
    /// them: log frames then go through the page cache and `fdatasync`.
    pub fn without_direct_writes(mut self) -> Self {
        self.direct_writes = false;
        self
    }

    /// Direct writes made so far through this file system's handles.
    pub fn direct_writes_made(&self) -> u64 {
        self.direct_writes_made.load(Ordering::SeqCst)
    }

    /// Changes how many syncs still succeed.
    pub fn set_syncs_left(&self, successful_syncs: i64) {
        self.syncs_left.store(successful_syncs, Ordering::SeqCst);
    }

    /// Makes every later data sync on a thread named `thread` wait until
    /// [`FaultyFileSystem::release_syncs`].
    pub fn hold_syncs(&self, thread: &str) {
        self.data_syncs.0.lock().held_thread = Some(thread.to_string());
    }

    /// Lets held and later syncs go on.
    pub fn release_syncs(&self) {
        self.data_syncs.0.lock().held_thread = None;
        self.data_syncs.1.notify_all();
    }

    /// Blocks until `count` syncs are being held.
    pub fn wait_for_held_syncs(&self, count: usize) {
        let mut syncs = self.data_syncs.0.lock();
        while syncs.waiting < count {
            self.data_syncs.1.wait(&mut syncs);
        }
    }

    /// Data syncs begun so far on threads named `thread`.
    pub fn data_syncs_by(&self, thread: &str) -> u64 {
        self.data_syncs.0.lock().begun.get(thread).copied().unwrap_or(0)
    }

    /// Counts a data sync and waits while its thread's syncs are held.
    fn begin_data_sync(&self) {
        let thread = std::thread::current().name().unwrap_or("").to_string();
        let (syncs, changed) = &*self.data_syncs;
        let mut syncs = syncs.lock();
        *syncs.begun.entry(thread.clone()).or_default() += 1;
        if syncs.held_thread.as_deref() == Some(thread.as_str()) {
            syncs.waiting += 1;
            changed.notify_all();
            while syncs.held_thread.as_deref() == Some(thread.as_str()) {
                changed.wait(&mut syncs);
            }
            syncs.waiting -= 1;
        }
    }

    fn take_sync(&self) -> io::Result<()> {
        let failing = self.failing_thread.lock().clone();
        if failing.is_some() && std::thread::current().name() == failing.as_deref() {
            return Err(io::Error::other("injected fsync failure on this thread"));
        }
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
    kind: FaultyFileKind,
}

#[derive(Clone, Copy, PartialEq)]
enum FaultyFileKind {
    /// Through the page cache.
    Buffered,
    /// Direct, and each write is a data sync.
    Direct,
    /// Direct, synced by the file's `sync_data`.
    DirectUnsynced,
}

impl LogFile for FaultyFile {
    fn write_at(&self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        if self.kind != FaultyFileKind::Buffered && self.owner.refuse_direct_writes {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        if self.kind != FaultyFileKind::Buffered {
            self.owner.direct_writes_made.fetch_add(1, Ordering::SeqCst);
        }
        if self.kind != FaultyFileKind::Direct {
            let grows = offset + bytes.len() as u64 > self.inner.size()?;
            if grows && self.owner.no_space.load(Ordering::SeqCst) {
                return Err(io::Error::from_raw_os_error(libc::ENOSPC));
            }
            return self.inner.write_at(offset, bytes);
        }
        // An injected failure comes after the bytes were written: the caller
        // cannot know whether they reached the disk, as with a real failure.
        self.owner.begin_data_sync();
        self.inner.write_at(offset, bytes)?;
        self.owner.take_sync()
    }

    fn sync_data(&self) -> io::Result<()> {
        self.owner.begin_data_sync();
        self.owner.take_sync()?;
        self.inner.sync_data()
    }

    fn size(&self) -> io::Result<u64> {
        self.inner.size()
    }

    fn free_space(&self) -> io::Result<u64> {
        if self.owner.no_space.load(Ordering::SeqCst) { Ok(0) } else { self.inner.free_space() }
    }
}

impl FileSystem for FaultyFileSystem {
    fn create_new(&self, path: &Path) -> io::Result<Arc<dyn LogFile>> {
        self.take_open()?;
        Ok(Arc::new(FaultyFile { inner: open_real(path, true)?, owner: self.clone(), kind: FaultyFileKind::Buffered }))
    }

    fn open_existing(&self, path: &Path) -> io::Result<Arc<dyn LogFile>> {
        self.take_open()?;
        Ok(Arc::new(FaultyFile { inner: open_real(path, false)?, owner: self.clone(), kind: FaultyFileKind::Buffered }))
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.take_sync()?;
        RealFileSystem.sync_dir(dir)
    }

    fn open_direct(&self, path: &Path) -> io::Result<Option<Arc<dyn LogFile>>> {
        if !self.direct_writes {
            return Ok(None);
        }
        self.take_open()?;
        Ok(open_real_direct(path, true)?.map(|inner| {
            Arc::new(FaultyFile { inner, owner: self.clone(), kind: FaultyFileKind::Direct }) as Arc<dyn LogFile>
        }))
    }

    /// Its writes are not syncs (the file's `sync_data` is one), but are
    /// refused and run out of space as other writes do.
    fn open_direct_unsynced(&self, path: &Path) -> io::Result<Option<Arc<dyn LogFile>>> {
        if !self.direct_writes {
            return Ok(None);
        }
        Ok(open_real_direct(path, false)?.map(|inner| {
            Arc::new(FaultyFile { inner, owner: self.clone(), kind: FaultyFileKind::DirectUnsynced })
                as Arc<dyn LogFile>
        }))
    }
}
