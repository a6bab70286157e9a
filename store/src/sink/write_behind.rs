//! A local output file written and hashed on its own thread, so producing the next bytes (quantizing, converting)
//! overlaps with the sha256 and the `write` system calls of the last ones.
//!
//! Memory is bounded: bytes are gathered into pieces of [`PIECE`] and at most [`QUEUED`] pieces wait for the
//! thread. On Linux the thread also asks the kernel to start writing each finished stretch of the file to disk
//! (`sync_file_range(SYNC_FILE_RANGE_WRITE)`, which does not wait), so the `fsync` before the commit's rename finds
//! little left to do instead of the whole file.

use std::fs::File;
use std::io::Write;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::thread::JoinHandle;

use sha2::{Digest, Sha256};

/// Bytes gathered before a piece goes to the thread.
const PIECE: usize = 1 << 20;
/// Pieces waiting for the thread at most (the producer blocks beyond that).
const QUEUED: usize = 4;
/// Bytes between two write-back requests.
#[cfg(target_os = "linux")]
const WRITEBACK_EVERY: u64 = 8 << 20;

pub(super) struct WriteBehind {
    piece: Vec<u8>,
    /// `None` once the thread has stopped (after an error, or in [`WriteBehind::finish`]).
    tx: Option<SyncSender<Vec<u8>>>,
    /// Empty pieces coming back from the thread, so steady writing allocates nothing.
    spare: Receiver<Vec<u8>>,
    thread: Option<JoinHandle<std::io::Result<(File, Sha256)>>>,
}

impl WriteBehind {
    pub(super) fn new(file: File) -> std::io::Result<WriteBehind> {
        let (tx, rx) = sync_channel::<Vec<u8>>(QUEUED);
        let (spare_tx, spare) = sync_channel::<Vec<u8>>(QUEUED + 1);
        let thread = std::thread::Builder::new().name("quantfarm-write".into()).spawn(move || {
            let mut file = file;
            let mut hasher = Sha256::new();
            // Bytes written, and how many of them write-back was asked for.
            #[cfg(target_os = "linux")]
            let (mut written, mut requested) = (0u64, 0u64);
            for mut piece in rx {
                hasher.update(&piece);
                file.write_all(&piece)?;
                #[cfg(target_os = "linux")]
                {
                    written += piece.len() as u64;
                    if written - requested >= WRITEBACK_EVERY {
                        start_writeback(&file, requested, written - requested);
                        requested = written;
                    }
                }
                piece.clear();
                let _ = spare_tx.try_send(piece);
            }
            Ok((file, hasher))
        })?;
        Ok(WriteBehind { piece: Vec::with_capacity(PIECE), tx: Some(tx), spare, thread: Some(thread) })
    }

    pub(super) fn write(&mut self, mut data: &[u8]) -> std::io::Result<()> {
        while !data.is_empty() {
            let take = (PIECE - self.piece.len()).min(data.len());
            self.piece.extend_from_slice(&data[..take]);
            data = &data[take..];
            if self.piece.len() == PIECE {
                self.send()?;
            }
        }
        Ok(())
    }

    fn send(&mut self) -> std::io::Result<()> {
        let next = self.spare.try_recv().unwrap_or_else(|_| Vec::with_capacity(PIECE));
        let piece = std::mem::replace(&mut self.piece, next);
        let sent = self.tx.as_ref().map(|tx| tx.send(piece).is_ok()).unwrap_or(false);
        if sent {
            Ok(())
        } else {
            // The thread stopped early: it failed, and its error is the one to report.
            Err(self.join().err().unwrap_or_else(|| std::io::Error::other("the output writer thread stopped")))
        }
    }

    /// Writes what is left and returns the file (written, not yet synced) and the sha256 of everything written.
    pub(super) fn finish(mut self) -> std::io::Result<(File, Sha256)> {
        if !self.piece.is_empty() {
            self.send()?;
        }
        self.join()
    }

    fn join(&mut self) -> std::io::Result<(File, Sha256)> {
        self.tx = None;
        match self.thread.take() {
            Some(t) => t.join().unwrap_or_else(|_| Err(std::io::Error::other("the output writer thread panicked"))),
            None => Err(std::io::Error::other("the output writer thread already stopped")),
        }
    }
}

impl Drop for WriteBehind {
    /// Dropped without `finish` (an aborted output): the thread is stopped and waited for, so no write to the
    /// staged file outlives its removal.
    fn drop(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Asks the kernel to start writing `len` bytes from `offset` to disk, without waiting. Advice only: a failure
/// (an old kernel, a file system without it) changes nothing but the time the final `fsync` takes.
#[cfg(target_os = "linux")]
fn start_writeback(file: &File, offset: u64, len: u64) {
    use std::os::fd::AsRawFd;
    let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else { return };
    // SAFETY: the descriptor is open for the whole call (borrowed from `file`); the call reads no memory.
    unsafe {
        libc::sync_file_range(file.as_raw_fd(), offset, len, libc::SYNC_FILE_RANGE_WRITE);
    }
}
