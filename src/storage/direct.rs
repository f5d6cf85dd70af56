//! Direct (`O_DIRECT | O_DSYNC`) writes of log frames.
//!
//! A direct write must cover whole aligned blocks, but frames end anywhere.
//! So the writer keeps a copy of the log's last, partly filled block, and
//! each write sends that block's earlier bytes again, then the new frame,
//! then zeros to the next block boundary. Rewriting the earlier bytes with
//! the same values is safe even if the write is torn: a sector holds either
//! its old bytes or its new ones, and both carry the same acknowledged
//! frames. The zeros match the zero-filled space ahead of the writer, which
//! recovery reads as the clean end.

use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use super::LogFile;
use super::fs::DIRECT_BLOCK_BYTES;

const BLOCK: u64 = DIRECT_BLOCK_BYTES as u64;
/// A staging buffer grown past this by a large frame is given back afterwards.
const STAGING_KEEP_BYTES: usize = 1024 * 1024;

/// One block of a buffer whose start is block-aligned, as direct I/O needs.
#[derive(Clone, Copy)]
#[repr(C, align(4096))]
struct Block([u8; DIRECT_BLOCK_BYTES]);

const _: () = assert!(std::mem::align_of::<Block>() == DIRECT_BLOCK_BYTES);
const _: () = assert!(std::mem::size_of::<Block>() == DIRECT_BLOCK_BYTES);

/// Block-aligned bytes, a whole number of blocks long.
pub(super) struct AlignedBuffer {
    blocks: Vec<Block>,
}

impl AlignedBuffer {
    pub(super) fn with_bytes(bytes: usize) -> Self {
        Self { blocks: vec![Block([0; DIRECT_BLOCK_BYTES]); bytes.div_ceil(DIRECT_BLOCK_BYTES).max(1)] }
    }

    /// Grows (keeping the contents) to hold at least `bytes`.
    fn reserve(&mut self, bytes: usize) {
        let blocks = bytes.div_ceil(DIRECT_BLOCK_BYTES);
        if blocks > self.blocks.len() {
            self.blocks.resize(blocks, Block([0; DIRECT_BLOCK_BYTES]));
        }
    }

    pub(super) fn len(&self) -> usize {
        self.blocks.len() * DIRECT_BLOCK_BYTES
    }

    #[allow(unsafe_code)]
    pub(super) fn bytes(&self) -> &[u8] {
        // SAFETY: as in `bytes_mut`, borrowed shared.
        unsafe { std::slice::from_raw_parts(self.blocks.as_ptr().cast::<u8>(), self.len()) }
    }

    #[allow(unsafe_code)]
    pub(super) fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: `Block` is `repr(C)` around a byte array, with no padding
        // (size == alignment, asserted above), so the vector's blocks are one
        // contiguous run of initialized bytes, borrowed mutably here.
        unsafe { std::slice::from_raw_parts_mut(self.blocks.as_mut_ptr().cast::<u8>(), self.len()) }
    }
}

/// Writes frames to one segment through a direct handle.
pub(crate) struct DirectWriter {
    file: Arc<dyn LogFile>,
    /// Starts with the bytes of the block holding the write offset that come
    /// before the offset.
    staging: AlignedBuffer,
}

impl DirectWriter {
    /// A writer for a segment whose bytes before `offset` are written; `head`
    /// holds the segment's first bytes when the caller has them (a new
    /// segment), else they are read from `path`.
    pub fn new(file: Arc<dyn LogFile>, path: &Path, offset: u64, head: Option<&[u8]>) -> io::Result<Self> {
        let block_start = offset / BLOCK * BLOCK;
        let prefix = (offset - block_start) as usize;
        let mut staging = AlignedBuffer::with_bytes(DIRECT_BLOCK_BYTES);
        match head {
            Some(head) if block_start == 0 && head.len() >= prefix => {
                staging.bytes_mut()[..prefix].copy_from_slice(&head[..prefix]);
            }
            _ => std::fs::File::open(path)?.read_exact_at(&mut staging.bytes_mut()[..prefix], block_start)?,
        }
        Ok(Self { file, staging })
    }

    /// The end of the blocks a frame of `length` bytes at `offset` occupies.
    pub fn padded_end(offset: u64, length: u64) -> u64 {
        (offset + length).div_ceil(BLOCK) * BLOCK
    }

    /// Writes `frame` at `offset` (the end of what is written) durably. On
    /// failure the frame's bytes are overwritten with zeros, best effort, so
    /// that a restart does not bring back a write its client was told failed.
    pub fn write(&mut self, offset: u64, frame: &[u8]) -> io::Result<()> {
        let block_start = offset / BLOCK * BLOCK;
        let prefix = (offset - block_start) as usize;
        let used = prefix + frame.len();
        let padded = used.div_ceil(DIRECT_BLOCK_BYTES) * DIRECT_BLOCK_BYTES;
        self.staging.reserve(padded);
        let bytes = self.staging.bytes_mut();
        bytes[prefix..used].copy_from_slice(frame);
        bytes[used..padded].fill(0);
        if let Err(error) = self.file.write_at(block_start, &bytes[..padded]) {
            bytes[prefix..used].fill(0);
            let _ = self.file.write_at(block_start, &bytes[..padded]);
            return Err(error);
        }
        // The new last block's leading bytes move to the front.
        let last_block = used / DIRECT_BLOCK_BYTES * DIRECT_BLOCK_BYTES;
        bytes.copy_within(last_block..used, 0);
        if self.staging.len() > STAGING_KEEP_BYTES {
            let tail = used - last_block;
            let mut smaller = AlignedBuffer::with_bytes(DIRECT_BLOCK_BYTES);
            smaller.bytes_mut()[..tail].copy_from_slice(&self.staging.bytes_mut()[..tail]);
            self.staging = smaller;
        }
        Ok(())
    }
}
