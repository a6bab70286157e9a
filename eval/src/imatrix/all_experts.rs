//! Every expert on every token (`--all-experts`, llm-compressor's `calibrate_all_experts`): an importance matrix in
//! which no expert lacks data, however the calibration text is routed.
//!
//! llama.cpp computes only the experts the router picks, so the evaluation callback sees their inputs alone. The
//! gate and up projections of all experts read the same input (the layer's hidden state, `[n_embd, 1, n_tokens]`),
//! so every expert is credited with it exactly. The down projection reads each expert's own activation,
//! `glu(gate_e·x, up_e·x)`, which llama.cpp never forms for an unrouted expert: this module forms it from the graph
//! (the `GLU` node feeding the down projection, its gate and up operands back to their `MUL_MAT_ID`, with `ADD_ID`
//! biases and the views of a fused `gate_up` projection), the expert's weights (dequantized with ggml's own
//! `to_float`) and the input saved at the gate/up callback, as ggml's CPU kernels compute the activations
//! (`ggml/src/ggml-cpu/ops.cpp`, `vec.h`). The routed experts keep llama.cpp's own values; for the first token of
//! each call, their values are also recomputed here and must agree, so an expert FFN built otherwise is refused
//! rather than collected wrongly.
//!
//! Cost: the unrouted experts' gate and up projections on every token, on the CPU in the callback (one thread): a
//! dense forward over all experts, fit for small and middle-sized MoE models.

use std::collections::HashMap;
use std::ffi::c_void;

use llama_cpp_sys_2 as sys;

/// An input saved at a gate/up `MUL_MAT_ID` callback: `[n_embd, n_tokens]` rows, f32.
pub(super) struct Saved {
    pub data: Vec<f32>,
    pub n_embd: usize,
}

/// One operand of the activation: the `MUL_MAT_ID` it comes from, the bias added to it, the rows of its output it
/// takes (a fused gate_up projection's half).
struct Operand {
    mm: *const sys::ggml_tensor,
    bias: Option<*const sys::ggml_tensor>,
    start: usize,
    len: usize,
}

/// The gated activation between an expert's gate/up projections and its down projection.
struct Activation {
    op: sys::ggml_glu_op,
    alpha: f32,
    limit: f32,
    gate: Operand,
    up: Operand,
}

/// ggml's GLU operators on one value (`ggml_compute_forward_*glu*_f32`).
fn glu(op: sys::ggml_glu_op, alpha: f32, limit: f32, g: f32, u: f32) -> Result<f32, String> {
    // ggml's 0.79788456080286535587989211986876f, as an f32.
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    Ok(match op {
        sys::GGML_GLU_OP_REGLU => g.max(0.0) * u,
        sys::GGML_GLU_OP_GEGLU => 0.5 * g * (1.0 + (SQRT_2_OVER_PI * g * (1.0 + 0.044_715 * g * g)).tanh()) * u,
        sys::GGML_GLU_OP_SWIGLU => g / (1.0 + (-g).exp()) * u,
        sys::GGML_GLU_OP_GEGLU_QUICK => g * (1.0 / (1.0 + (-1.702 * g).exp())) * u,
        sys::GGML_GLU_OP_SWIGLU_OAI => {
            let (x, y) = (g.min(limit), u.clamp(-limit, limit));
            x / (1.0 + (alpha * -x).exp()) * (y + 1.0)
        }
        sys::GGML_GLU_OP_SWIGLU_CLAMP => {
            let (x, y) = (g.min(limit), u.clamp(-limit, limit));
            x / (1.0 + (-x).exp()) * y
        }
        other => return Err(format!("GLU operator {other} (GEGLU_ERF or newer) is not one --all-experts computes")),
    })
}

fn op_name(t: &sys::ggml_tensor) -> String {
    // SAFETY: ggml_op_desc returns a static NUL-terminated string for any tensor.
    unsafe { std::ffi::CStr::from_ptr(sys::ggml_op_desc(t)) }.to_string_lossy().into_owned()
}

/// Follows a GLU operand back to its `MUL_MAT_ID`: a view (a fused gate_up's half), then a bias, then the product.
unsafe fn operand(mut t: *const sys::ggml_tensor, wname: &str) -> Result<Operand, String> {
    // SAFETY: `t` is a source of a live graph node; so are its own sources.
    unsafe {
        let (mut start, len) = (0usize, (*t).ne[0] as usize);
        let mut bias = None;
        loop {
            let n = &*t;
            match n.op {
                sys::GGML_OP_VIEW => {
                    let parent = n.view_src as *const sys::ggml_tensor;
                    if parent.is_null() || n.nb[0] != 4 || n.view_offs >= (*parent).nb[1] {
                        return Err(format!("{wname}: a view into the expert projection that is not a row slice"));
                    }
                    start += n.view_offs / 4;
                    t = parent;
                }
                sys::GGML_OP_ADD_ID if bias.is_none() => {
                    bias = Some(n.src[1] as *const sys::ggml_tensor);
                    t = n.src[0];
                }
                sys::GGML_OP_MUL_MAT_ID => return Ok(Operand { mm: t, bias, start, len }),
                _ => {
                    return Err(format!(
                        "{wname}: the experts' activation is made by {} ({}), not a gated projection --all-experts \
                         computes",
                        op_name(n),
                        tensor_name(&n.name)
                    ))
                }
            }
        }
    }
}

/// Reads the activation feeding a down projection (`src1` of its `MUL_MAT_ID`).
unsafe fn activation(h: &sys::ggml_tensor, wname: &str) -> Result<Activation, String> {
    if h.op != sys::GGML_OP_GLU {
        return Err(format!(
            "{wname}: its input is made by {} ({}), not a gated activation --all-experts computes",
            op_name(h),
            tensor_name(&h.name)
        ));
    }
    let op = h.op_params[0] as sys::ggml_glu_op;
    let swapped = h.op_params[1] != 0;
    let (alpha, limit) = (f32::from_bits(h.op_params[2] as u32), f32::from_bits(h.op_params[3] as u32));
    // SAFETY: the GLU node's sources are live tensors of the graph.
    unsafe {
        let (gate, up) = if h.src[1].is_null() {
            // One operand, both halves: gate first unless swapped.
            let whole = operand(h.src[0], wname)?;
            let half = whole.len / 2;
            let (g0, u0) = if swapped { (half, 0) } else { (0, half) };
            (
                Operand { start: whole.start + g0, len: half, ..whole },
                Operand { mm: whole.mm, bias: whole.bias, start: whole.start + u0, len: half },
            )
        } else {
            (operand(h.src[0], wname)?, operand(h.src[1], wname)?)
        };
        Ok(Activation { op, alpha, limit, gate, up })
    }
}

/// A tensor's name, for messages.
fn tensor_name(raw: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = raw.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Bytes of a tensor, from host memory or copied from a device.
unsafe fn bytes_of(t: &sys::ggml_tensor, offset: usize, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    // SAFETY: offset + len lies within the tensor (callers slice by its own strides).
    unsafe {
        if sys::ggml_backend_buffer_is_host(t.buffer) {
            std::ptr::copy_nonoverlapping((t.data as *const u8).add(offset), out.as_mut_ptr(), len);
        } else {
            sys::ggml_backend_tensor_get(t, out.as_mut_ptr() as *mut c_void, offset, len);
        }
    }
    out
}

/// Expert `e`'s weight matrix of a `MUL_MAT_ID` (`src0`: `[n_in, n_out, n_expert]`) as f32 rows.
unsafe fn expert_weights(mm: &sys::ggml_tensor, e: usize) -> Result<Vec<f32>, String> {
    // SAFETY: src0 is the expert weight tensor; expert e's slice is nb[2] bytes at e·nb[2].
    unsafe {
        let w = &*mm.src[0];
        let (n_in, n_out) = (w.ne[0] as usize, w.ne[1] as usize);
        let raw = bytes_of(w, e * w.nb[2], w.nb[1] * n_out);
        let mut out = vec![0f32; n_in * n_out];
        if w.type_ == sys::GGML_TYPE_F32 {
            for (o, c) in out.iter_mut().zip(raw.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
            return Ok(out);
        }
        let traits = &*sys::ggml_get_type_traits(w.type_);
        let to_float = traits.to_float.ok_or_else(|| format!("weight type {} cannot be dequantized", w.type_))?;
        for r in 0..n_out {
            to_float(raw.as_ptr().add(r * w.nb[1]) as *const c_void, out.as_mut_ptr().add(r * n_in), n_in as i64);
        }
        Ok(out)
    }
}

/// Expert `e`'s bias row (`ADD_ID`'s `[n_out, n_expert]` F32 table).
unsafe fn expert_bias(b: &sys::ggml_tensor, e: usize) -> Result<Vec<f32>, String> {
    if b.type_ != sys::GGML_TYPE_F32 {
        return Err("an expert bias that is not F32".into());
    }
    // SAFETY: row e of the bias table.
    let raw = unsafe { bytes_of(b, e * b.nb[1], b.ne[0] as usize * 4) };
    Ok(raw.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
}

/// The input as ggml's CPU kernels round it for a weight of type `ty` (its `vec_dot_type`): to bf16 (round to
/// nearest even, `ggml_compute_fp32_to_bf16`) for BF16 weights, to f16 for F16 ones; as is otherwise (quantized
/// weights' 8-bit activations are not reproduced: their rows differ from llama.cpp's by that rounding).
fn as_kernel_reads(x: &[f32], ty: sys::ggml_type) -> Vec<f32> {
    match ty {
        sys::GGML_TYPE_BF16 => x
            .iter()
            .map(|v| {
                let u = v.to_bits();
                let r = if v.is_nan() { (u >> 16) | 64 } else { (u + (0x7fff + ((u >> 16) & 1))) >> 16 };
                f32::from_bits(r << 16)
            })
            .collect(),
        // SAFETY: plain conversions of values.
        sys::GGML_TYPE_F16 => x.iter().map(|&v| unsafe { sys::ggml_fp16_to_fp32(sys::ggml_fp32_to_fp16(v)) }).collect(),
        _ => x.to_vec(),
    }
}

/// `W·x (+ b)` for the given tokens' saved inputs (`ty`: the weight's type): one output row per token, f64 sums.
fn project(w: &[f32], ty: sys::ggml_type, bias: Option<&[f32]>, input: &Saved, tokens: &[usize]) -> Vec<Vec<f32>> {
    let n_in = input.n_embd;
    let n_out = w.len() / n_in.max(1);
    tokens
        .iter()
        .map(|&t| {
            let x = as_kernel_reads(&input.data[t * n_in..(t + 1) * n_in], ty);
            let x = x.as_slice();
            (0..n_out)
                .map(|r| {
                    let row = &w[r * n_in..(r + 1) * n_in];
                    let dot: f64 = row.iter().zip(x).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum();
                    dot as f32 + bias.map_or(0.0, |b| b[r])
                })
                .collect()
        })
        .collect()
}

/// The down projection's input for expert `e` on `tokens`: `[n_tokens][n_ff]`.
unsafe fn activations(
    act: &Activation,
    inputs: &HashMap<usize, Saved>,
    e: usize,
    tokens: &[usize],
    wname: &str,
) -> Result<Vec<Vec<f32>>, String> {
    let mut outs: HashMap<usize, Vec<Vec<f32>>> = HashMap::new();
    for op in [&act.gate, &act.up] {
        let key = op.mm as usize;
        if outs.contains_key(&key) {
            continue; // a fused gate_up projection: both halves of one product
        }
        let input = inputs
            .get(&key)
            .ok_or_else(|| format!("{wname}: the experts' input was not seen before their down projection"))?;
        // SAFETY: `op.mm` and its bias are live tensors of the graph (see `operand`).
        let (w, b) = unsafe { (expert_weights(&*op.mm, e)?, op.bias.map(|b| expert_bias(&*b, e)).transpose()?) };
        // SAFETY: as above.
        let ty = unsafe { (*(*op.mm).src[0]).type_ };
        outs.insert(key, project(&w, ty, b.as_deref(), input, tokens));
    }
    let (g, u) = (&outs[&(act.gate.mm as usize)], &outs[&(act.up.mm as usize)]);
    (0..tokens.len())
        .map(|i| {
            (0..act.gate.len)
                .map(|k| glu(act.op, act.alpha, act.limit, g[i][act.gate.start + k], u[i][act.up.start + k]))
                .collect()
        })
        .collect()
}

/// An expert and its activation rows, one per token it was not routed.
pub(super) type ExpertRows = (usize, Vec<Vec<f32>>);

/// What a down projection's all-experts collection adds: for each expert, its activation rows on the tokens not
/// routed to it. Checks the recomputation against llama.cpp's own activation for the first token's routed experts.
/// The gate/up inputs it read are forgotten (each is read by one down projection).
///
/// `routed[t]` lists token `t`'s experts; `actual(t, slot)` is llama.cpp's activation row of slot `slot`.
pub(super) unsafe fn unrouted_rows<'a>(
    down: &sys::ggml_tensor,
    inputs: &mut HashMap<usize, Saved>,
    routed: &[Vec<usize>],
    n_expert: usize,
    actual: impl Fn(usize, usize) -> &'a [f32],
    wname: &str,
) -> Result<Vec<ExpertRows>, String> {
    // SAFETY: `down` is a computed MUL_MAT_ID node; its sources are live.
    let act = unsafe { activation(&*down.src[1], wname)? };
    for op in [&act.gate, &act.up] {
        // SAFETY: as above.
        let x = unsafe { &*(*op.mm).src[1] };
        if x.ne[1] != 1 {
            return Err(format!("{wname}: each expert reads its own input here (weighted before the FFN)"));
        }
    }
    // The recomputation, checked where llama.cpp computed the same thing.
    if let Some(first) = routed.first() {
        for (slot, &e) in first.iter().enumerate() {
            // SAFETY: as above.
            let ours = unsafe { activations(&act, inputs, e, &[0], wname)? };
            let theirs = actual(0, slot);
            let (mut diff, mut norm) = (0f64, 0f64);
            for (a, b) in ours[0].iter().zip(theirs) {
                diff += f64::from(a - b).powi(2);
                norm += f64::from(*b).powi(2);
            }
            if ours[0].len() != theirs.len() || diff.sqrt() > 0.05 * norm.sqrt() + 1e-6 {
                return Err(format!(
                    "{wname}: the experts' activation recomputed for expert {e} differs from llama.cpp's (relative \
                     error {:.3e}): this expert FFN is not one --all-experts reproduces",
                    diff.sqrt() / norm.sqrt().max(1e-30)
                ));
            }
        }
    }
    let mut out = Vec::new();
    for e in 0..n_expert {
        let tokens: Vec<usize> = (0..routed.len()).filter(|&t| !routed[t].contains(&e)).collect();
        if tokens.is_empty() {
            continue;
        }
        // SAFETY: as above.
        out.push((e, unsafe { activations(&act, inputs, e, &tokens, wname)? }));
    }
    inputs.remove(&(act.gate.mm as usize));
    inputs.remove(&(act.up.mm as usize));
    Ok(out)
}
