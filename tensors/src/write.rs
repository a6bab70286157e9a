//! Model writers on top of the staged sink: a GGUF writer that pads and checks as it streams, a safetensors writer,
//! and whole-model copies (read → write) that keep every byte, used to prove the readers and writers exact.

use crate::error::{Error, Result};
use crate::gguf::split::{parse_split_file_name, split_file_name};
use crate::gguf::{encode_header, GgufLayout, TensorDesc, Value};
use crate::safetensors::{encode_header as st_header, StTensorDesc};
use crate::source::TensorSource;
use quantfarm_store::Location;
use quantfarm_store::{Committed, StagedSink};

/// Streams one GGUF file: the header at creation, then every tensor's bytes in order, in pieces of any size.
pub struct GgufWriter {
    sink: StagedSink,
    layout: GgufLayout,
    names: Vec<String>,
    /// The tensor being written and how many of its bytes have arrived.
    current: usize,
    done_in_current: u64,
}

impl GgufWriter {
    pub async fn create(
        target: &Location,
        version: u32,
        metadata: &[(String, Value)],
        tensors: &[TensorDesc],
        overwrite: bool,
    ) -> Result<GgufWriter> {
        let layout = encode_header(version, metadata, tensors)?;
        let mut sink = StagedSink::create(target, overwrite).await?;
        sink.write(&layout.header).await?;
        let mut w = GgufWriter {
            sink,
            layout,
            names: tensors.iter().map(|t| t.name.clone()).collect(),
            current: 0,
            done_in_current: 0,
        };
        w.skip_empty().await?;
        Ok(w)
    }

    /// Pads after (and passes over) tensors with no bytes, so `current` always names one still expecting data.
    async fn skip_empty(&mut self) -> Result<()> {
        while self.current < self.layout.tensors.len() && self.layout.tensors[self.current].1 == self.done_in_current {
            self.sink.write_zeros(self.layout.padding_after(self.current)).await?;
            self.current += 1;
            self.done_in_current = 0;
        }
        Ok(())
    }

    /// Appends bytes of the current tensor (and, if `data` runs past its end, of the following ones).
    pub async fn write(&mut self, mut data: &[u8]) -> Result<()> {
        while !data.is_empty() {
            let Some(&(_, size)) = self.layout.tensors.get(self.current) else {
                return Err(Error::format(
                    self.sink_name(),
                    "tensor data",
                    format!("{} bytes more than the tensors hold", data.len()),
                ));
            };
            let take = ((size - self.done_in_current) as usize).min(data.len());
            self.sink.write(&data[..take]).await?;
            self.done_in_current += take as u64;
            data = &data[take..];
            self.skip_empty().await?;
        }
        Ok(())
    }

    fn sink_name(&self) -> String {
        format!("<gguf writer, tensor {:?}>", self.names.get(self.current).map(String::as_str).unwrap_or("(end)"))
    }

    /// Commits the file; an error (nothing visible) if any tensor is short.
    pub async fn finish(self) -> Result<Committed> {
        if self.current < self.layout.tensors.len() {
            let msg = format!(
                "tensor {:?} got {} of {} bytes",
                self.names[self.current], self.done_in_current, self.layout.tensors[self.current].1
            );
            self.sink.abort().await?;
            return Err(Error::format("<gguf writer>", "tensor data", msg));
        }
        debug_assert_eq!(self.sink.bytes_written(), self.layout.file_len);
        self.sink.commit().await.map_err(Into::into)
    }
}

/// Streams one safetensors file: header first, then the tensors' bytes in order.
pub struct SafetensorsWriter {
    sink: StagedSink,
    expected: u64,
}

impl SafetensorsWriter {
    pub async fn create(
        target: &Location,
        tensors: &[StTensorDesc],
        metadata: &[(String, String)],
        overwrite: bool,
    ) -> Result<SafetensorsWriter> {
        let header = st_header(tensors, metadata);
        let mut sink = StagedSink::create(target, overwrite).await?;
        sink.write(&header).await?;
        let expected = header.len() as u64 + tensors.iter().map(StTensorDesc::nbytes).sum::<u64>();
        Ok(SafetensorsWriter { sink, expected })
    }

    pub async fn write(&mut self, data: &[u8]) -> Result<()> {
        if self.sink.bytes_written() + data.len() as u64 > self.expected {
            return Err(Error::format("<safetensors writer>", "tensor data", "more bytes than the header declares"));
        }
        self.sink.write(data).await.map_err(Into::into)
    }

    pub async fn finish(self) -> Result<Committed> {
        if self.sink.bytes_written() != self.expected {
            let msg = format!("{} of {} bytes written", self.sink.bytes_written(), self.expected);
            self.sink.abort().await?;
            return Err(Error::format("<safetensors writer>", "tensor data", msg));
        }
        self.sink.commit().await.map_err(Into::into)
    }
}

/// A writer that takes a file's bytes in order, in pieces of any size.
pub trait PieceWriter {
    fn write_piece(&mut self, data: &[u8]) -> impl std::future::Future<Output = Result<()>>;
}

impl PieceWriter for GgufWriter {
    async fn write_piece(&mut self, data: &[u8]) -> Result<()> {
        self.write(data).await
    }
}

impl PieceWriter for SafetensorsWriter {
    async fn write_piece(&mut self, data: &[u8]) -> Result<()> {
        self.write(data).await
    }
}

/// Copies the stored bytes of tensor `name` from `src` to `w` in reads of at most `budget` bytes through `buf`.
pub async fn copy_tensor(
    src: &TensorSource,
    name: &str,
    budget: u64,
    buf: &mut Vec<u8>,
    w: &mut impl PieceWriter,
) -> Result<()> {
    let e = src.entry(name)?;
    for r in src.chunks(e, budget)? {
        let n = (r.end - r.start) as usize;
        if buf.len() < n {
            buf.resize(n, 0);
        }
        src.read_range(name, r.start, &mut buf[..n]).await?;
        w.write_piece(&buf[..n]).await?;
    }
    Ok(())
}

/// Writes the GGUF model read by `src` again at `dst` (split models as the same number of split files named after
/// `dst`), copying tensor bytes within `budget`. All files are staged first and committed together at the end.
pub async fn copy_gguf(src: &TensorSource, dst: &Location, budget: u64, overwrite: bool) -> Result<Vec<Committed>> {
    let model = src.gguf().ok_or_else(|| Error::format(src.location().to_string(), "format", "is not GGUF"))?;
    let n = model.shards.len();
    let name = dst.file_name();
    let prefix = parse_split_file_name(name)
        .map(|(p, _, _)| p)
        .unwrap_or_else(|| name.strip_suffix(".gguf").unwrap_or(name))
        .to_string();
    let mut writers = Vec::with_capacity(n);
    let mut buf = Vec::new();
    for (i, (_, h)) in model.shards.iter().enumerate() {
        let target = if n == 1 { dst.clone() } else { dst.sibling(&split_file_name(&prefix, i as u16, n as u16))? };
        let descs: Vec<TensorDesc> =
            h.tensors.iter().map(|t| TensorDesc { name: t.name.clone(), dims: t.dims.clone(), ty: t.ty }).collect();
        let mut w = GgufWriter::create(&target, h.version, &h.metadata, &descs, overwrite).await?;
        for t in &h.tensors {
            copy_tensor(src, &t.name, budget, &mut buf, &mut w).await?;
        }
        writers.push(w);
    }
    let mut out = Vec::with_capacity(n);
    for w in writers {
        out.push(w.finish().await?);
    }
    Ok(out)
}

/// Writes the plain-dtype tensors of `src` as a safetensors checkpoint in folder `dst_dir`: one `model.safetensors`,
/// or shards of at most `max_shard_bytes` named `model-0000I-of-0000N.safetensors` with
/// `model.safetensors.index.json`. Tensor bytes are copied within `budget`; every file is staged, and all are
/// committed at the end (the index last), so a failure leaves no checkpoint that looks complete.
pub async fn copy_safetensors(
    src: &TensorSource,
    dst_dir: &Location,
    max_shard_bytes: u64,
    budget: u64,
    overwrite: bool,
) -> Result<Vec<Committed>> {
    let mut descs = Vec::with_capacity(src.tensors().len());
    for e in src.tensors() {
        match e.ty {
            crate::TensorType::Dtype(dtype) => {
                descs.push(StTensorDesc { name: e.name.clone(), dtype, shape: e.shape.clone() })
            }
            other => {
                return Err(Error::format(
                    src.location().to_string(),
                    format!("tensor {:?}", e.name),
                    format!("is {other}; only plain dtypes can be copied into safetensors (dequantize first)"),
                ))
            }
        }
    }
    let shards = crate::safetensors::plan_shards(&descs, max_shard_bytes);
    let metadata = [("format".to_string(), "pt".to_string())];
    let mut writers = Vec::with_capacity(shards.len());
    let mut buf = Vec::new();
    for (i, range) in shards.iter().enumerate() {
        let target = dst_dir.child(&crate::safetensors::shard_file_name(i, shards.len()))?;
        let mut w = SafetensorsWriter::create(&target, &descs[range.clone()], &metadata, overwrite).await?;
        for d in &descs[range.clone()] {
            copy_tensor(src, &d.name, budget, &mut buf, &mut w).await?;
        }
        writers.push(w);
    }
    let mut out = Vec::with_capacity(writers.len() + 1);
    for w in writers {
        out.push(w.finish().await?);
    }
    if shards.len() > 1 {
        out.push(crate::safetensors::write_index(dst_dir, &descs, &shards, overwrite).await?);
    }
    Ok(out)
}
