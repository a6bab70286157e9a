//! Importance matrices collected in llama.cpp the way `llama-imatrix` collects them (`tools/imatrix/imatrix.cpp`,
//! `IMatrixCollector::collect_imatrix`): the graph's evaluation callback sees every matrix multiplication, and for
//! each one whose weight is `blk.*` (plus `output.weight` when asked), with at least 16 rows of F32 input, adds
//! each input column's square and counts the rows; `MUL_MAT_ID` (MoE experts) counts per expert, through the
//! routing ids. The text is chunked and fed exactly as llama-imatrix feeds it (llama-perplexity's procedure:
//! `batch / ctx` chunks per decode, each chunk's first token overwritten by BOS, every position an output), so the
//! activations are the ones llama-imatrix sees.
//!
//! `llama-cpp-2` does not expose the context's `cb_eval`, so this module owns a second, small binding of the same
//! library (`llama-cpp-sys-2`): a model, a context with the callback, and a batch. It is the only module besides
//! [`crate::runtime`] that touches the C API.
//!
//! Each decode group (the chunks decoded together) gets its own f64 sums, so the farm's tasks (one group each) and
//! the one-process command produce the same parts, and merging them in order gives the same bytes.
//!
//! With [`CollectOptions::all_experts`], every expert is credited on every token ([`all_experts`]).

mod all_experts;

use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_void, CString};
use std::path::Path;
use std::sync::Mutex;

use llama_cpp_sys_2 as sys;
use quantfarm_quant::imatrix::sums::{ImatrixSums, Stats};

use crate::error::{Error, Result};
use crate::kld::base_file::BaseHeader;
use crate::runtime::Token;

/// How to collect.
#[derive(Clone, Debug)]
pub struct CollectOptions {
    /// Threads for decoding; 0 means all cores.
    pub threads: usize,
    pub gpu_layers: u32,
    /// Tokens per decode (llama-imatrix's `-b`, 2048 by default): `batch / ctx` chunks are decoded together.
    pub batch: u32,
    /// Also collect `output.weight` (llama-imatrix's `--process-output`).
    pub process_output: bool,
    /// llama-imatrix's own arithmetic: one f32 running sum per column over all the chunks, in one process. Gives
    /// llama-imatrix's bytes on the same machine, but cannot be split into parts; the default (f64 sums per decode
    /// group, added in order) is exact to f64 and splits.
    pub f32_running_sums: bool,
    /// Every expert of a mixture-of-experts layer on every token, as llm-compressor's `calibrate_all_experts`
    /// (llama-imatrix has no such option): no expert is left without data ([`all_experts`]).
    pub all_experts: bool,
}

impl Default for CollectOptions {
    fn default() -> Self {
        CollectOptions {
            threads: 0,
            gpu_layers: 0,
            batch: crate::kld::DEFAULT_BATCH,
            process_output: false,
            f32_running_sums: false,
            all_experts: false,
        }
    }
}

/// Collects chunks `first .. first + n` of `header`'s tokens (from [`crate::kld::tokenize_text`] with the same
/// model), one part per decode group, in chunk order (one part in all with [`CollectOptions::f32_running_sums`]). `bos` is the token each chunk's first one is overwritten
/// with (when the vocabulary adds BOS). `datasets` names the text in every part.
pub fn collect(
    model_path: &Path,
    opts: &CollectOptions,
    header: &BaseHeader,
    bos: Option<Token>,
    first: usize,
    n: usize,
    datasets: &[String],
) -> Result<Vec<ImatrixSums>> {
    let name = model_path.display().to_string();
    let n_ctx = header.n_ctx;
    if first + n > header.n_chunk() || n == 0 {
        return Err(Error::mismatch(
            "imatrix chunks",
            format!("chunks {first}..{} asked for, the text has {}", first + n, header.n_chunk()),
        ));
    }
    crate::kld::check_batch(n_ctx, opts.batch)?;
    let n_seq = crate::kld::chunks_per_decode(n_ctx, opts.batch);
    let n_batch = opts.batch.min(n_seq * n_ctx);
    // Keeps llama.cpp's backend initialised (once per process) while the raw handles live.
    crate::runtime::ensure_backend()?;
    let model = RawModel::load(model_path, opts.gpu_layers)?;
    let collector = Mutex::new(Collector::new(opts.process_output, opts.f32_running_sums, opts.all_experts));
    let threads =
        if opts.threads == 0 { std::thread::available_parallelism().map_or(1, |n| n.get()) } else { opts.threads };
    let ctx = RawContext::new(&model, &name, n_ctx * n_seq, n_batch, n_seq, threads as i32, &collector)?;
    let mut batch = RawBatch::new(n_batch as i32, n_seq as i32);

    let mut parts = Vec::new();
    let chunks: Vec<usize> = (first..first + n).collect();
    for group in chunks.chunks(n_seq as usize) {
        ctx.clear_memory();
        let len = n_ctx as usize;
        // A chunk longer than a batch is fed in several batches of one sequence, like llama-imatrix.
        let per_batch = (n_batch as usize).min(len);
        let mut start = 0;
        while start < len {
            let end = (start + per_batch).min(len);
            batch.clear();
            for (seq, &c) in group.iter().enumerate() {
                let tokens = header.chunk_tokens(c);
                for (pos, &token) in tokens.iter().enumerate().take(end).skip(start) {
                    let tok = match (pos, bos) {
                        (0, Some(b)) => b,
                        _ => token,
                    };
                    batch.add(tok, pos as i32, seq as i32, true);
                }
            }
            ctx.decode(&batch).map_err(|code| Error::runtime(&name, format!("decode failed ({code})")))?;
            let mut col = collector.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(e) = col.error.take() {
                return Err(Error::runtime(&name, e));
            }
            drop(col);
            start = end;
        }
        if !opts.f32_running_sums {
            let mut col = collector.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            parts.push(ImatrixSums {
                entries: std::mem::take(&mut col.entries),
                first_chunk: group[0] as u32,
                chunk_count: group.len() as u32,
                chunk_size: n_ctx,
                datasets: datasets.to_vec(),
            });
        }
    }
    drop(ctx);
    if opts.f32_running_sums {
        let col = collector.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner);
        parts.push(ImatrixSums {
            entries: col.entries,
            first_chunk: first as u32,
            chunk_count: n as u32,
            chunk_size: n_ctx,
            datasets: datasets.to_vec(),
        });
    }
    Ok(parts)
}

/// The callback's state: the current group's sums, and the first error (the callback cannot return one).
struct Collector {
    process_output: bool,
    f32_sums: bool,
    all_experts: bool,
    /// With `all_experts`: the inputs of the gate/up expert projections seen, by node, until their down projection
    /// reads them.
    inputs: HashMap<usize, all_experts::Saved>,
    entries: BTreeMap<String, Stats>,
    /// Input rows copied from a non-host (GPU) buffer.
    scratch: Vec<u8>,
    error: Option<String>,
}

impl Collector {
    fn new(process_output: bool, f32_sums: bool, all_experts: bool) -> Collector {
        Collector {
            process_output,
            f32_sums,
            all_experts,
            inputs: HashMap::new(),
            entries: BTreeMap::new(),
            scratch: Vec::new(),
            error: None,
        }
    }

    /// `filter_tensor_name`: `CUDA0#blk.0.attn_k.weight#0` → `blk.0.attn_k.weight`.
    fn weight_name(raw: &[std::ffi::c_char]) -> String {
        let bytes: Vec<u8> = raw.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
        let s = String::from_utf8_lossy(&bytes).into_owned();
        match s.split_once('#') {
            Some((_, rest)) => rest.split('#').next().unwrap_or_default().to_string(),
            None => s,
        }
    }

    /// `ask`: whether llama-imatrix would collect this node.
    unsafe fn wants(&self, t: &sys::ggml_tensor) -> bool {
        // SAFETY: `t` is a node of the graph being computed; its sources are valid tensors while the callback runs.
        unsafe {
            if t.op == sys::GGML_OP_MUL_MAT_ID {
                return true;
            }
            if t.op != sys::GGML_OP_MUL_MAT {
                return false;
            }
            let (src0, src1) = (&*t.src[0], &*t.src[1]);
            if src1.ne[1] < 16 || src1.type_ != sys::GGML_TYPE_F32 {
                return false;
            }
            let name = Self::weight_name(&src0.name);
            name.starts_with("blk.") || (self.process_output && name == "output.weight")
        }
    }

    /// The collection half of `collect_imatrix`, with the sums in f64 (each square exact).
    unsafe fn collect(&mut self, t: &sys::ggml_tensor) -> std::result::Result<(), String> {
        // SAFETY: `t` is a computed MUL_MAT(_ID) node; its sources (and ids) are valid tensors whose data, on the host or copied into `scratch`, holds `ne`/`nb` as ggml lays them out while the callback runs.
        unsafe {
            let (src0, src1) = (&*t.src[0], &*t.src[1]);
            let wname = Self::weight_name(&src0.name);
            if src1.nb[0] != 4 {
                return Err(format!("{wname}: non-contiguous input rows"));
            }
            let data: *const u8 = if sys::ggml_backend_buffer_is_host(src1.buffer) {
                src1.data as *const u8
            } else {
                let n = sys::ggml_nbytes(src1);
                self.scratch.resize(n, 0);
                sys::ggml_backend_tensor_get(src1, self.scratch.as_mut_ptr() as *mut c_void, 0, n);
                self.scratch.as_ptr()
            };
            let row = |off: usize| std::slice::from_raw_parts(data.add(off) as *const f32, src1.ne[0] as usize);
            let ne0 = src1.ne[0] as usize;
            if t.op == sys::GGML_OP_MUL_MAT_ID {
                // ids: [n_expert_used, n_tokens] (not contiguous); src1: [cols, n_expert_used or 1, n_tokens].
                let ids = &*t.src[2];
                let n_as = src0.ne[2] as usize;
                let n_ids = ids.ne[0] as usize;
                if ids.ne[1] != src1.ne[2] || sys::ggml_nrows(src1) != src1.ne[1] * src1.ne[2] {
                    return Err(format!("{wname}: expert routing of an unexpected shape"));
                }
                let mut id_bytes = vec![0u8; sys::ggml_nbytes(ids)];
                sys::ggml_backend_tensor_get(ids, id_bytes.as_mut_ptr() as *mut c_void, 0, id_bytes.len());
                let e = self
                    .entries
                    .entry(wname.clone())
                    .or_insert_with(|| Stats { values: vec![0.0; ne0 * n_as], counts: vec![0; n_as] });
                if e.values.len() != ne0 * n_as {
                    return Err(format!("{wname}: inconsistent size ({} vs {})", e.values.len(), ne0 * n_as));
                }
                let n_tokens = src1.ne[2] as usize;
                let mut routed = vec![Vec::with_capacity(n_ids); n_tokens];
                for idx in 0..n_ids {
                    for (tok, experts) in routed.iter_mut().enumerate() {
                        let off = tok * ids.nb[1] + idx * ids.nb[0];
                        let ex = i32::from_le_bytes(id_bytes[off..off + 4].try_into().unwrap_or_default());
                        if ex < 0 || ex as usize >= n_as {
                            return Err(format!("{wname}: expert id {ex} out of 0..{n_as}"));
                        }
                        experts.push(ex as usize);
                    }
                }
                let slot_row =
                    |slot: usize, tok: usize| row((slot % src1.ne[1] as usize) * src1.nb[1] + tok * src1.nb[2]);
                let shared_input = self.all_experts && src1.ne[1] == 1 && src1.op != sys::GGML_OP_GLU;
                if shared_input {
                    // A gate/up projection: every expert reads this input; credit all of them on every token, and
                    // keep the input for the down projection's unrouted experts.
                    let mut saved = Vec::with_capacity(ne0 * n_tokens);
                    for tok in 0..n_tokens {
                        let x = slot_row(0, tok);
                        saved.extend_from_slice(x);
                        for ex in 0..n_as {
                            e.counts[ex] += 1;
                            add_squares(&mut e.values[ex * ne0..(ex + 1) * ne0], x, self.f32_sums);
                        }
                    }
                    self.inputs
                        .insert(t as *const sys::ggml_tensor as usize, all_experts::Saved { data: saved, n_embd: ne0 });
                } else {
                    for idx in 0..n_ids {
                        for (tok, experts) in routed.iter().enumerate() {
                            let ex = experts[idx];
                            e.counts[ex] += 1;
                            add_squares(&mut e.values[ex * ne0..(ex + 1) * ne0], slot_row(idx, tok), self.f32_sums);
                        }
                    }
                    if self.all_experts {
                        let rows = all_experts::unrouted_rows(
                            t,
                            &mut self.inputs,
                            &routed,
                            n_as,
                            |tok, slot| slot_row(slot, tok),
                            &wname,
                        )?;
                        for (ex, acts) in rows {
                            for h in &acts {
                                e.counts[ex] += 1;
                                add_squares(&mut e.values[ex * ne0..(ex + 1) * ne0], h, self.f32_sums);
                            }
                        }
                    }
                }
                if e.values.iter().any(|v| !v.is_finite()) {
                    return Err(format!("non-finite values detected in {wname}"));
                }
            } else {
                let n_mat = (src0.ne[2] * src0.ne[3]) as usize;
                let e = self
                    .entries
                    .entry(wname.clone())
                    .or_insert_with(|| Stats { values: vec![0.0; ne0 * n_mat], counts: vec![0; 1] });
                if e.values.len() != ne0 * n_mat {
                    return Err(format!("{wname}: inconsistent size ({} vs {})", e.values.len(), ne0 * n_mat));
                }
                for i3 in 0..src1.ne[3] as usize {
                    for i2 in 0..src1.ne[2] as usize {
                        // 3-D+ activations on a 2-D weight are flattened onto it.
                        let mat = (i3 % src0.ne[3] as usize) * src0.ne[2] as usize + (i2 % src0.ne[2] as usize);
                        let acc = &mut e.values[mat * ne0..(mat + 1) * ne0];
                        for r in 0..src1.ne[1] as usize {
                            let x = row(r * src1.nb[1] + i2 * src1.nb[2] + i3 * src1.nb[3]);
                            add_squares(acc, x, self.f32_sums);
                        }
                    }
                }
                if e.values.iter().any(|v| !v.is_finite()) {
                    return Err(format!("non-finite values detected in {wname}"));
                }
                let rows = (sys::ggml_nrows(src1) as u64) / n_mat as u64;
                e.counts.iter_mut().for_each(|c| *c += rows);
            }
            Ok(())
        }
    }
}

/// `acc[j] += x[j]²`: exactly in f64 (a square of an f32 fits), or as llama-imatrix adds, in f32 (the product
/// rounded, then the sum; the f64 slot holds the f32 running sum exactly).
fn add_squares(acc: &mut [f64], x: &[f32], f32_sums: bool) {
    if f32_sums {
        for (a, &v) in acc.iter_mut().zip(x) {
            *a = f64::from(*a as f32 + v * v);
        }
    } else {
        for (a, &v) in acc.iter_mut().zip(x) {
            *a += f64::from(v) * f64::from(v);
        }
    }
}

/// `ggml_backend_sched_eval_callback`: asked first whether a node is wanted, then called with it computed.
unsafe extern "C" fn eval_callback(t: *mut sys::ggml_tensor, ask: bool, user: *mut c_void) -> bool {
    // SAFETY: ggml passes a node of the graph being computed (or null), and `user` is the `Mutex<Collector>` the
    // context was created with, which outlives every decode.
    let (Some(t), Some(state)) = (unsafe { t.as_ref() }, unsafe { (user as *const Mutex<Collector>).as_ref() }) else {
        return false;
    };
    let mut c = state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if ask {
        // SAFETY: `t` is a live node (above).
        return unsafe { c.wants(t) };
    }
    if c.error.is_none() {
        // SAFETY: `t` is a live, computed node (above).
        if let Err(e) = unsafe { c.collect(t) } {
            c.error = Some(e);
        }
    }
    // Returning false would stop the graph; an error is reported after the decode.
    true
}

struct RawModel(*mut sys::llama_model);

impl RawModel {
    fn load(path: &Path, gpu_layers: u32) -> Result<RawModel> {
        let name = path.display().to_string();
        if !path.is_file() {
            return Err(Error::runtime(&name, "no such GGUF file"));
        }
        let c = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| Error::runtime(&name, "a path with a NUL byte"))?;
        // SAFETY: plain C calls with a valid NUL-terminated path; a null return is checked.
        let m = unsafe {
            let mut params = sys::llama_model_default_params();
            params.n_gpu_layers = gpu_layers as i32;
            sys::llama_model_load_from_file(c.as_ptr(), params)
        };
        if m.is_null() {
            return Err(Error::runtime(&name, "llama.cpp cannot load it"));
        }
        Ok(RawModel(m))
    }
}

impl Drop for RawModel {
    fn drop(&mut self) {
        // SAFETY: the pointer came from llama_model_load_from_file and every context on it is dropped first
        // (RawContext borrows the model).
        unsafe { sys::llama_model_free(self.0) }
    }
}

struct RawContext<'a> {
    ctx: *mut sys::llama_context,
    _model: &'a RawModel,
    _collector: &'a Mutex<Collector>,
}

impl<'a> RawContext<'a> {
    /// The context llama-imatrix creates: `n_ctx·n_seq` cells, `n_parallel = n_seq`, micro-batches of 512, the
    /// collector as the evaluation callback.
    fn new(
        model: &'a RawModel,
        name: &str,
        n_cells: u32,
        n_batch: u32,
        n_seq: u32,
        threads: i32,
        collector: &'a Mutex<Collector>,
    ) -> Result<RawContext<'a>> {
        // SAFETY: the callback's user data outlives the context (both borrowed for 'a).
        let ctx = unsafe {
            let mut p = sys::llama_context_default_params();
            p.n_ctx = n_cells;
            p.n_batch = n_batch;
            p.n_ubatch = n_batch.min(512);
            p.n_seq_max = n_seq;
            p.n_threads = threads;
            p.n_threads_batch = threads;
            p.cb_eval = Some(eval_callback);
            p.cb_eval_user_data = collector as *const Mutex<Collector> as *mut c_void;
            sys::llama_init_from_model(model.0, p)
        };
        if ctx.is_null() {
            return Err(Error::runtime(name, format!("cannot create a context of {n_cells} tokens")));
        }
        Ok(RawContext { ctx, _model: model, _collector: collector })
    }

    fn clear_memory(&self) {
        // SAFETY: a live context.
        unsafe { sys::llama_memory_clear(sys::llama_get_memory(self.ctx), true) }
    }

    fn decode(&self, batch: &RawBatch) -> std::result::Result<(), i32> {
        // SAFETY: a live context and a batch filled within its capacity.
        match unsafe { sys::llama_decode(self.ctx, batch.batch) } {
            0 => Ok(()),
            code => Err(code),
        }
    }
}

impl Drop for RawContext<'_> {
    fn drop(&mut self) {
        // SAFETY: created by llama_init_from_model, freed once.
        unsafe { sys::llama_free(self.ctx) }
    }
}

struct RawBatch {
    batch: sys::llama_batch,
    capacity: usize,
}

impl RawBatch {
    fn new(n_tokens: i32, n_seq: i32) -> RawBatch {
        // SAFETY: allocates arrays of n_tokens entries (each seq_id array of n_seq).
        let batch = unsafe { sys::llama_batch_init(n_tokens, 0, n_seq) };
        RawBatch { batch, capacity: n_tokens as usize }
    }

    fn clear(&mut self) {
        self.batch.n_tokens = 0;
    }

    fn add(&mut self, token: Token, pos: i32, seq: i32, logits: bool) {
        let i = self.batch.n_tokens as usize;
        assert!(i < self.capacity, "imatrix batch overflow: {i} tokens in a batch of {}", self.capacity);
        // SAFETY: i is below the capacity llama_batch_init allocated.
        unsafe {
            *self.batch.token.add(i) = token;
            *self.batch.pos.add(i) = pos;
            *self.batch.n_seq_id.add(i) = 1;
            *(*self.batch.seq_id.add(i)) = seq;
            *self.batch.logits.add(i) = i8::from(logits);
        }
        self.batch.n_tokens += 1;
    }
}

impl Drop for RawBatch {
    fn drop(&mut self) {
        // SAFETY: allocated by llama_batch_init, freed once.
        unsafe { sys::llama_batch_free(self.batch) }
    }
}
