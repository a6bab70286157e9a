//! The read stage: the pieces a conversion will read, read in order on a task of their own into at most
//! [`DEPTH`] buffers that go round between the reader and the consumer.

use quantfarm_store::Blob;
use tokio::sync::mpsc;

use super::Span;
use crate::error::{Error, Result};

/// Pieces in flight at most: one with the transform, one read and waiting, one being read.
pub const DEPTH: usize = 3;

/// The pieces a conversion reads, in the order it asks for them, with the transform's work per piece. Held flat
/// (about 24 bytes a span), so a plan of many small pieces stays small.
#[derive(Debug, Default)]
pub struct Reads {
    /// The files the spans are in.
    blobs: Vec<Blob>,
    /// Every span of every piece, in order: (index in `blobs`, offset, length).
    spans: Vec<(usize, u64, u64)>,
    /// Where each piece's spans end in `spans`.
    ends: Vec<usize>,
    largest_piece: u64,
    largest_work: u64,
}

impl Reads {
    /// Adds a piece: `spans` read one after another into one buffer, which the transform turns into output with
    /// `work` bytes of buffers of its own.
    pub fn push(&mut self, spans: &[Span<'_>], work: u64) {
        for s in spans {
            let b = match self.blobs.iter().rposition(|b| b.name() == s.blob.name()) {
                Some(b) => b,
                None => {
                    self.blobs.push(s.blob.clone());
                    self.blobs.len() - 1
                }
            };
            self.spans.push((b, s.offset, s.len));
        }
        self.ends.push(self.spans.len());
        self.largest_piece = self.largest_piece.max(spans.iter().map(Span::len).sum());
        self.largest_work = self.largest_work.max(work);
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The buffers `budget` holds beside the work of one piece, at most [`DEPTH`] and at least 1:
    /// `depth · largest piece + largest work ≤ budget`.
    pub fn depth(&self, budget: u64) -> usize {
        (1..=DEPTH).rev().find(|&d| d as u64 * self.largest_piece + self.largest_work <= budget).unwrap_or(1)
    }

    /// Starts reading with [`Reads::depth`] buffers.
    pub fn start(self, budget: u64) -> ReadAhead {
        let depth = self.depth(budget);
        ReadAhead::start(self, depth)
    }
}

/// The read stage at work: [`ReadAhead::next`] gives the pieces in order. Dropping it stops the reader.
///
/// Needs a Tokio runtime (the reader is a task). On a current-thread runtime the reader runs only while the
/// consumer waits for a piece: the same bytes, without the overlap.
pub struct ReadAhead {
    ready: mpsc::Receiver<Result<Vec<u8>>>,
    /// Buffers going back to the reader.
    spare: mpsc::Sender<Vec<u8>>,
    /// The piece the consumer has (returned to the reader at the next call).
    held: Option<Vec<u8>>,
    reader: tokio::task::JoinHandle<()>,
}

impl ReadAhead {
    /// Reads the pieces of `reads` in order through `depth` buffers (1 to [`DEPTH`]; with 1 a piece is read only
    /// once the consumer is done with the last one).
    pub fn start(reads: Reads, depth: usize) -> ReadAhead {
        let depth = depth.clamp(1, DEPTH);
        let (ready_tx, ready) = mpsc::channel(depth);
        let (spare, mut spare_rx) = mpsc::channel::<Vec<u8>>(depth);
        // Allocated here rather than by the reader: on the reader's thread, glibc would serve them from an arena of
        // their own instead of the memory the caller has freed (17 MB more peak RSS converting a 1 GB checkpoint).
        let capacity = usize::try_from(reads.largest_piece).unwrap_or(0);
        for _ in 0..depth {
            // The channel has room for every buffer; a failure would only mean fewer buffers.
            let _ = spare.try_send(Vec::with_capacity(capacity));
        }
        let reader = tokio::spawn(async move {
            let mut start = 0;
            for &end in &reads.ends {
                // No buffer back: the consumer is gone.
                let Some(mut buf) = spare_rx.recv().await else { return };
                let spans = reads.spans[start..end].iter().map(|&(b, offset, len)| (&reads.blobs[b], offset, len));
                start = end;
                let read = read_into(spans, &mut buf).await.map(|()| buf);
                let failed = read.is_err();
                if ready_tx.send(read).await.is_err() || failed {
                    return;
                }
            }
        });
        ReadAhead { ready, spare, held: None, reader }
    }

    /// The next piece's bytes. The previous piece's buffer goes back to the reader, so a piece is valid only until
    /// the next call.
    pub async fn next(&mut self) -> Result<&[u8]> {
        if let Some(buf) = self.held.take() {
            // Room is always there: at most `depth` buffers exist.
            let _ = self.spare.try_send(buf);
        }
        match self.ready.recv().await {
            Some(Ok(buf)) => Ok(self.held.insert(buf)),
            Some(Err(e)) => Err(e),
            None => Err(Error::format(
                "<read-ahead>",
                "pieces",
                "asked for a piece after the last one planned (or the reader stopped)",
            )),
        }
    }
}

impl Drop for ReadAhead {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// Fills `buf` with the spans (file, offset, length), one after another. Its length becomes theirs; its capacity
/// is kept for the next piece, and its bytes are not zeroed first unless it grows.
pub(super) async fn read_into<'a>(
    spans: impl Iterator<Item = (&'a Blob, u64, u64)> + Clone,
    buf: &mut Vec<u8>,
) -> Result<()> {
    let total: u64 = spans.clone().map(|(_, _, len)| len).sum();
    let total = usize::try_from(total).map_err(|_| {
        let file = spans.clone().next().map_or("<read-ahead>", |(b, _, _)| b.name());
        Error::format(file, "read", format!("{total} bytes do not fit in memory"))
    })?;
    buf.resize(total, 0);
    let mut at = 0usize;
    for (blob, offset, len) in spans {
        let n = len as usize;
        blob.read_at(offset, &mut buf[at..at + n]).await?;
        at += n;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use quantfarm_store::Location;

    async fn blob(dir: &std::path::Path, bytes: &[u8]) -> Blob {
        let p = dir.join("data.bin");
        std::fs::write(&p, bytes).unwrap();
        Blob::open(&Location::local(&p)).await.unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn pieces_come_in_order_and_whole() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..=255u8).cycle().take(10_000).collect();
        let b = blob(dir.path(), &data).await;
        let span = |offset: u64, len: u64| Span { blob: &b, offset, len };
        let mut reads = Reads::default();
        let want: Vec<Vec<u8>> = (0..20u64)
            .map(|i| {
                // Two spans per piece, the second before the first in the file.
                let (a, c) = (i * 400 + 200, i * 400);
                reads.push(&[span(a, 150), span(c, 100 + i)], 0);
                [&data[a as usize..a as usize + 150], &data[c as usize..(c + 100 + i) as usize]].concat()
            })
            .collect();
        assert_eq!(reads.len(), 20);
        let mut ahead = reads.start(1 << 20);
        for w in &want {
            assert_eq!(ahead.next().await.unwrap(), &w[..]);
        }
        let e = ahead.next().await.unwrap_err().to_string();
        assert!(e.contains("after the last one"), "{e}");
    }

    #[tokio::test]
    async fn a_failed_read_names_the_file_and_stops() {
        let dir = tempfile::tempdir().unwrap();
        let b = blob(dir.path(), &[7u8; 100]).await;
        let mut reads = Reads::default();
        reads.push(&[Span { blob: &b, offset: 0, len: 50 }], 0);
        reads.push(&[Span { blob: &b, offset: 90, len: 50 }], 0);
        reads.push(&[Span { blob: &b, offset: 0, len: 10 }], 0);
        let mut ahead = reads.start(1 << 20);
        assert_eq!(ahead.next().await.unwrap(), &[7u8; 50][..]);
        let e = ahead.next().await.unwrap_err().to_string();
        assert!(e.contains("data.bin"), "{e}");
        assert!(ahead.next().await.is_err());
    }

    #[tokio::test]
    async fn depth_is_what_the_budget_holds() {
        let dir = tempfile::tempdir().unwrap();
        let b = blob(dir.path(), &[1u8; 1000]).await;
        let mut reads = Reads::default();
        assert!(reads.is_empty());
        reads.push(&[Span { blob: &b, offset: 0, len: 600 }, Span { blob: &b, offset: 0, len: 400 }], 500);
        reads.push(&[Span { blob: &b, offset: 0, len: 10 }], 20);
        assert_eq!(reads.depth(3500), 3);
        assert_eq!(reads.depth(3499), 2);
        assert_eq!(reads.depth(2500), 2);
        assert_eq!(reads.depth(10), 1);
    }
}
