//! llama.cpp's base-logits file (`llama-perplexity --kl-divergence-base`), byte for byte: a header with the context,
//! vocabulary and chunk count, the evaluation tokens, then per chunk one record per scored position holding the
//! reference's log-probabilities quantized to 16 bits (`process_logits` and `log_softmax` in
//! `tools/perplexity/perplexity.cpp`).
//!
//! The records of one chunk are a contiguous run, so the farm stores them per chunk and a whole file is the header
//! followed by the chunks' runs in order ([`BaseHeader::encode`] + [`ChunkRecords::as_bytes`]).

use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::ops::Range;
use std::path::Path;

use crate::error::{Error, Result};

const MAGIC: &[u8; 8] = b"_logits_";

/// The file's header: what every chunk record is laid out by.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BaseHeader {
    pub n_ctx: u32,
    pub n_vocab: u32,
    /// The evaluation tokens as tokenized (with the text's initial BOS, never the per-chunk BOS overwrite):
    /// `n_chunk · n_ctx` of them.
    pub tokens: Vec<i32>,
}

impl BaseHeader {
    pub fn n_chunk(&self) -> usize {
        self.tokens.len() / self.n_ctx as usize
    }

    /// Scored positions per chunk: the second half of the context, less the last position (it predicts nothing).
    pub fn scored_per_chunk(&self) -> usize {
        scored_per_chunk(self.n_ctx)
    }

    /// u16 values per record: scale and min log-prob as two f32, then the codes padded to an even count.
    pub fn record_len(&self) -> usize {
        record_len(self.n_vocab)
    }

    /// Bytes of one chunk's run of records.
    pub fn chunk_bytes(&self) -> usize {
        self.scored_per_chunk() * self.record_len() * 2
    }

    pub fn chunk_tokens(&self, chunk: usize) -> &[i32] {
        let n = self.n_ctx as usize;
        &self.tokens[chunk * n..(chunk + 1) * n]
    }

    /// The header of a file holding only `chunks` (renumbered from 0): a whole base-logits file of its own, which
    /// llama-perplexity reads too. The farm stores the reference's logits as such parts, one per chunk group.
    pub fn part(&self, chunks: Range<usize>) -> BaseHeader {
        let n = self.n_ctx as usize;
        BaseHeader {
            n_ctx: self.n_ctx,
            n_vocab: self.n_vocab,
            tokens: self.tokens[chunks.start * n..chunks.end * n].to_vec(),
        }
    }

    /// Bytes of the whole file: header, tokens and every chunk's records.
    pub fn file_bytes(&self) -> u64 {
        20 + 4 * self.tokens.len() as u64 + self.n_chunk() as u64 * self.chunk_bytes() as u64
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(20 + 4 * self.tokens.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&self.n_ctx.to_le_bytes());
        out.extend_from_slice(&(self.n_vocab as i32).to_le_bytes());
        out.extend_from_slice(&(self.n_chunk() as i32).to_le_bytes());
        for t in &self.tokens {
            out.extend_from_slice(&t.to_le_bytes());
        }
        out
    }

    /// Reads the header and tokens; `file` names the source in errors. The reader is left at the first record.
    pub fn read(file: &str, r: &mut impl Read) -> Result<BaseHeader> {
        let mut head = [0u8; 20];
        read_exact(file, "header", r, &mut head)?;
        if &head[..8] != MAGIC {
            return Err(Error::format(file, "magic", "not a llama.cpp base-logits file (expected \"_logits_\")"));
        }
        let word = |i: usize| i32::from_le_bytes([head[i], head[i + 1], head[i + 2], head[i + 3]]);
        let (n_ctx, n_vocab, n_chunk) = (word(8), word(12), word(16));
        if n_ctx < 4 {
            return Err(Error::format(file, "n_ctx", format!("{n_ctx}: expected at least 4")));
        }
        if n_vocab < 1 {
            return Err(Error::format(file, "n_vocab", format!("{n_vocab}: expected a positive count")));
        }
        if n_chunk < 1 {
            return Err(Error::format(file, "n_chunk", format!("{n_chunk}: expected a positive count")));
        }
        let count = (n_ctx as usize).checked_mul(n_chunk as usize).filter(|&c| c <= 1 << 32);
        let Some(count) = count else {
            return Err(Error::format(file, "n_chunk", format!("{n_chunk} chunks of {n_ctx} tokens is too many")));
        };
        let mut raw = vec![0u8; count * 4];
        read_exact(file, "tokens", r, &mut raw)?;
        let tokens: Vec<i32> = raw.chunks_exact(4).map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        if let Some((i, t)) = tokens.iter().enumerate().find(|(_, &t)| t < 0 || t >= n_vocab) {
            return Err(Error::format(
                file,
                format!("tokens[{i}]"),
                format!("{t} is outside the vocabulary of {n_vocab}"),
            ));
        }
        Ok(BaseHeader { n_ctx: n_ctx as u32, n_vocab: n_vocab as u32, tokens })
    }
}

pub fn scored_per_chunk(n_ctx: u32) -> usize {
    (n_ctx - 1 - n_ctx / 2) as usize
}

pub fn record_len(n_vocab: u32) -> usize {
    2 * (n_vocab as usize).div_ceil(2) + 4
}

/// A base-logits file opened for reading its chunks' records, its size checked against its header first.
pub struct BaseFile {
    pub name: String,
    pub header: BaseHeader,
    file: BufReader<File>,
}

impl BaseFile {
    pub fn open(path: &Path) -> Result<BaseFile> {
        let name = path.display().to_string();
        let io = |source| Error::Io { file: name.clone(), source };
        let mut file = BufReader::new(File::open(path).map_err(io)?);
        let header = BaseHeader::read(&name, &mut file)?;
        let have = file.get_ref().metadata().map_err(io)?.len();
        if have != header.file_bytes() {
            return Err(Error::format(
                &name,
                "size",
                format!(
                    "{have} bytes, but its header ({} chunks of {} tokens, a vocabulary of {}) needs {}: truncated or not a base-logits file",
                    header.n_chunk(),
                    header.n_ctx,
                    header.n_vocab,
                    header.file_bytes()
                ),
            ));
        }
        Ok(BaseFile { name, header, file })
    }

    /// The records of chunk `chunk`.
    pub fn records(&mut self, chunk: usize) -> Result<ChunkRecords> {
        let h = &self.header;
        let at = 20 + 4 * h.tokens.len() as u64 + chunk as u64 * h.chunk_bytes() as u64;
        self.file.seek(SeekFrom::Start(at)).map_err(|e| Error::Io { file: self.name.clone(), source: e })?;
        ChunkRecords::read(&self.name, chunk, h.n_vocab, h.scored_per_chunk(), &mut self.file)
    }
}

/// One chunk's records, as stored (little-endian u16 values).
#[derive(Clone, Debug, PartialEq)]
pub struct ChunkRecords {
    n_vocab: u32,
    values: Vec<u16>,
}

impl ChunkRecords {
    pub fn new(n_vocab: u32, positions: usize) -> ChunkRecords {
        ChunkRecords { n_vocab, values: vec![0; positions * record_len(n_vocab)] }
    }

    pub fn from_bytes(file: &str, n_vocab: u32, bytes: &[u8]) -> Result<ChunkRecords> {
        let len = record_len(n_vocab) * 2;
        if bytes.is_empty() || !bytes.len().is_multiple_of(len) {
            return Err(Error::format(
                file,
                "records",
                format!("{} bytes is not a whole number of {len}-byte records", bytes.len()),
            ));
        }
        let values = bytes.chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]])).collect();
        Ok(ChunkRecords { n_vocab, values })
    }

    /// Reads `positions` records.
    pub fn read(file: &str, chunk: usize, n_vocab: u32, positions: usize, r: &mut impl Read) -> Result<ChunkRecords> {
        let mut raw = vec![0u8; positions * record_len(n_vocab) * 2];
        read_exact(file, &format!("records of chunk {chunk}"), r, &mut raw)?;
        ChunkRecords::from_bytes(file, n_vocab, &raw)
    }

    pub fn positions(&self) -> usize {
        self.values.len() / record_len(self.n_vocab)
    }

    pub fn record(&self, pos: usize) -> Record<'_> {
        let len = record_len(self.n_vocab);
        Record::new(&self.values[pos * len..(pos + 1) * len], self.n_vocab)
    }

    pub fn record_mut(&mut self, pos: usize) -> &mut [u16] {
        let len = record_len(self.n_vocab);
        &mut self.values[pos * len..(pos + 1) * len]
    }

    /// Splits the records into one mutable slice per position (for filling them in parallel).
    pub fn records_mut(&mut self) -> std::slice::ChunksExactMut<'_, u16> {
        let len = record_len(self.n_vocab);
        self.values.chunks_exact_mut(len)
    }

    pub fn as_bytes(&self) -> Vec<u8> {
        self.values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }
}

/// One position's decoded reference: `log p_i ≈ scale·q_i + min_log_prob`.
#[derive(Clone, Copy)]
pub struct Record<'a> {
    pub scale: f32,
    pub min_log_prob: f32,
    pub codes: &'a [u16],
}

impl<'a> Record<'a> {
    fn new(values: &'a [u16], n_vocab: u32) -> Record<'a> {
        let f = |i: usize| f32::from_bits(u32::from(values[i]) | (u32::from(values[i + 1]) << 16));
        Record { scale: f(0), min_log_prob: f(2), codes: &values[4..4 + n_vocab as usize] }
    }

    pub fn log_prob(&self, token: usize) -> f32 {
        self.scale * f32::from(self.codes[token]) + self.min_log_prob
    }
}

/// Encodes one position's logits into `out` (a record) and returns the position's negative log-likelihood of
/// `token`: the same steps, in the same float/double precision, as llama-perplexity's
/// `log_softmax(int, const float*, uint16_t*, int)`.
pub fn encode_record(logits: &[f32], token: usize, out: &mut [u16]) -> f64 {
    let mut max = logits[0];
    let mut min = logits[0];
    for &l in &logits[1..] {
        max = max.max(l);
        min = min.min(l);
    }
    let min = min.max(max - 16.0);
    let sum: f64 = logits.iter().map(|&l| f64::from((l - max).exp())).sum();
    let lse = sum.ln() as f32;
    let min_log_prob = min - max - lse;
    let scale = (max - min) / 65535.0;
    let (head, codes) = out.split_at_mut(4);
    let s = scale.to_bits();
    let m = min_log_prob.to_bits();
    head.copy_from_slice(&[s as u16, (s >> 16) as u16, m as u16, (m >> 16) as u16]);
    if scale != 0.0 {
        let inv = 1.0 / scale;
        for (c, &l) in codes.iter_mut().zip(logits) {
            *c = if l > min { nearest_int(inv * (l - min)) as u16 } else { 0 };
        }
    } else {
        codes.iter_mut().for_each(|c| *c = 0);
    }
    f64::from(max + lse - logits[token])
}

/// ggml's round-half-to-even via the 1.5·2^23 trick (`nearest_int` in `tools/perplexity/perplexity.cpp`).
fn nearest_int(v: f32) -> i32 {
    let bits = (v + 12_582_912.0).to_bits() as i32;
    (bits & 0x007f_ffff) - 0x0040_0000
}

fn read_exact(file: &str, what: &str, r: &mut impl Read, buf: &mut [u8]) -> Result<()> {
    r.read_exact(buf).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            Error::format(file, what, "the file ends early (truncated?)")
        } else {
            Error::Io { file: file.into(), source: e }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_rejects_bad_tokens() {
        let h = BaseHeader { n_ctx: 8, n_vocab: 5, tokens: (0..16).map(|i| i % 5).collect() };
        let bytes = h.encode();
        assert_eq!(bytes.len(), 20 + 64);
        let back = BaseHeader::read("f", &mut bytes.as_slice()).unwrap();
        assert_eq!(back, h);
        assert_eq!(back.n_chunk(), 2);
        assert_eq!(back.scored_per_chunk(), 3);
        assert_eq!(back.record_len(), 10);

        let mut bad = bytes.clone();
        bad[20..24].copy_from_slice(&7i32.to_le_bytes());
        let err = BaseHeader::read("f", &mut bad.as_slice()).unwrap_err().to_string();
        assert!(err.contains("tokens[0]") && err.contains("outside the vocabulary"), "{err}");
        let err = BaseHeader::read("f", &mut &bytes[..30]).unwrap_err().to_string();
        assert!(err.contains("truncated"), "{err}");
        let err = BaseHeader::read("f", &mut &b"_logitz_xxxxxxxxxxxx"[..]).unwrap_err().to_string();
        assert!(err.contains("magic"), "{err}");
    }

    #[test]
    fn encoded_record_decodes_to_log_probs() {
        let logits = [2.0f32, -1.0, 0.5, -30.0, 1.0];
        let mut rec = ChunkRecords::new(5, 1);
        let nll = encode_record(&logits, 2, rec.record_mut(0));
        let lse = logits.iter().map(|&l| f64::from(l).exp()).sum::<f64>().ln();
        assert!((nll - (lse - 0.5)).abs() < 1e-5);
        let r = rec.record(0);
        for (i, &l) in logits.iter().enumerate() {
            let want = (f64::from(l) - lse).max(f64::from(r.min_log_prob));
            assert!((f64::from(r.log_prob(i)) - want).abs() < 2e-4, "{i}: {} vs {want}", r.log_prob(i));
        }
        // More than 16 nats below the top: the floor code.
        assert_eq!(r.codes[3], 0);
        assert_eq!(r.codes[0], 65535);
        // Odd vocabulary: one pad value, left zero.
        assert_eq!(rec.as_bytes().len(), 2 * (4 + 6));
    }

    #[test]
    fn nearest_int_rounds_half_to_even() {
        assert_eq!(nearest_int(2.5), 2);
        assert_eq!(nearest_int(3.5), 4);
        assert_eq!(nearest_int(65534.6), 65535);
    }
}
