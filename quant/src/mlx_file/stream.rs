//! The MLX writer's tensors as a pipeline (`quantfarm_tensors::pipeline`): every output tensor is cut into pieces
//! of whole rows whose reads are all planned before the first one, so the read stage reads piece k+1 while piece k
//! is converted and quantized here (the codes on rayon's threads) and piece k−1 is written behind by the sink.
//!
//! Memory: pieces are cut so that `DEPTH` pieces as read, one piece's conversion buffers and its codes fit the
//! budget (fewer pieces are read ahead where one row is too large for that); each quantized tensor's scales and
//! biases are kept until its codes are written, since they follow them in the file (1/32 of its bf16 bytes at
//! groups of 64).

use quantfarm_tensors::convert::{HfBufs, HfCut};
use quantfarm_tensors::pipeline::Reads;
use quantfarm_tensors::write::SafetensorsWriter;

use super::{Input, Item, MlxFileError};
use crate::mlx::{quantize_affine_into, AffineBytes, AffineInput};
use crate::mlx_fp::quantize_fp;
use quantfarm_tensors::dequant::float_values_into;
use quantfarm_tensors::mlx::ModuleQuant;

/// Bytes of codes a row of item `item` quantizes into (none for a tensor kept as it is).
/// For a floating-point mode this counts the piece's values widened to f32 too, which `quantize_fp` takes, and
/// its codes twice (the words it returns and their bytes as written).
fn codes_row(item: &Item) -> u64 {
    match item {
        Item::Plain { .. } => 0,
        Item::Quant { cols, quant: ModuleQuant::Affine(p), .. } => cols * u64::from(p.bits) / 8,
        Item::Quant { cols, quant: ModuleQuant::Fp(m), .. } => 2 * cols * u64::from(m.bits()) / 8 + 4 * cols,
    }
}

/// How item `item` is read: as the GGUF → HF conversion makes it, or as stored in the HF checkpoint, in its output
/// dtype (each of its sources in turn, when experts are stacked); a quantized one with room for its codes beside
/// each piece.
fn cuts(input: Input<'_>, item: &Item, budget: u64) -> Result<Vec<HfCut>, MlxFileError> {
    let src = input.source();
    let (Item::Plain { name, sources, dtype, .. } | Item::Quant { name, sources, dtype, .. }) = item;
    Ok(match input.planned(name, *dtype) {
        Some(t) => vec![HfCut::new(src, &t, budget, codes_row(item))?],
        None => {
            sources.iter().map(|s| HfCut::stored(src, s, *dtype, budget, codes_row(item))).collect::<Result<_, _>>()?
        }
    })
}

/// Writes every item's tensors, in order, to the writer of its shard (`shard_of_desc`, by output tensor).
pub(super) async fn write_tensors(
    input: Input<'_>,
    items: &[Item],
    writers: &mut [SafetensorsWriter],
    shard_of_desc: &[usize],
    budget: u64,
) -> Result<(), MlxFileError> {
    let src = input.source();
    let cuts = items.iter().map(|item| cuts(input, item, budget)).collect::<Result<Vec<_>, _>>()?;
    let mut reads = Reads::default();
    for (item, item_cuts) in items.iter().zip(&cuts) {
        for cut in item_cuts {
            for p in cut.pieces() {
                reads.push(&cut.spans(src, p)?, cut.work(p) + p.rows as u64 * codes_row(item));
            }
        }
    }
    let mut reads = reads.start(budget);
    let (mut bufs, mut quantized) = (HfBufs::default(), AffineBytes::default());
    let mut widened = Vec::new();
    let mut next_desc = 0usize;
    for (item, item_cuts) in items.iter().zip(&cuts) {
        match item {
            Item::Plain { .. } => {
                let w = &mut writers[shard_of_desc[next_desc]];
                next_desc += 1;
                for (cut, p) in item_cuts.iter().flat_map(|c| c.pieces().map(move |p| (c, p))) {
                    let raw = reads.next().await?;
                    w.write(cut.convert(src, p, raw, &mut bufs)?).await?;
                }
            }
            Item::Quant { name, cols, dtype, quant: ModuleQuant::Fp(mode), .. } => {
                // The two tensors are adjacent, so they are in one shard unless the shard planner split them.
                let shard = [0, 1].map(|k| shard_of_desc[next_desc + k]);
                next_desc += 2;
                quantized.scales.clear();
                let mut before = 0;
                for cut in item_cuts {
                    for p in cut.pieces() {
                        let raw = reads.next().await?;
                        let values = cut.convert(src, p, raw, &mut bufs)?;
                        widened.resize(values.len() / dtype.size(), 0.0);
                        float_values_into(values, *dtype, &mut widened);
                        let row = before + p.first;
                        let q = quantize_fp(&widened, *cols as usize, *mode, *dtype)
                            .map_err(|e| MlxFileError::FpQuant { tensor: name.clone(), source: e.from_row(row) })?;
                        quantized.scales.extend_from_slice(&q.scales);
                        let codes: Vec<u8> = q.packed.iter().flat_map(|w| w.to_le_bytes()).collect();
                        writers[shard[0]].write(&codes).await?;
                    }
                    before += cut.pieces().map(|p| p.rows).sum::<usize>();
                }
                writers[shard[1]].write(&quantized.scales).await?;
            }
            Item::Quant { name, cols, dtype, quant: ModuleQuant::Affine(params), .. } => {
                let (bits, group_size) = (u32::from(params.bits), params.group_size as usize);
                // The three tensors are adjacent, so they are in one shard unless the shard planner split them.
                let shard = [0, 1, 2].map(|k| shard_of_desc[next_desc + k]);
                next_desc += 3;
                quantized.scales.clear();
                quantized.biases.clear();
                // Rows before this source's, for messages (a stacked tensor's rows run on across its experts).
                let mut before = 0;
                for cut in item_cuts {
                    for p in cut.pieces() {
                        let raw = reads.next().await?;
                        // The piece in the output dtype (the bytes read, when stored so), quantized without
                        // rounding.
                        let values = cut.convert(src, p, raw, &mut bufs)?;
                        quantized.codes.clear();
                        let input = AffineInput::Bytes(values, *dtype);
                        let row = before + p.first;
                        quantize_affine_into(input, *cols as usize, bits, group_size, *dtype, &mut quantized)
                            .map_err(|e| MlxFileError::Quant { tensor: name.clone(), source: e.from_row(row) })?;
                        writers[shard[0]].write(&quantized.codes).await?;
                    }
                    before += cut.pieces().map(|p| p.rows).sum::<usize>();
                }
                writers[shard[1]].write(&quantized.scales).await?;
                writers[shard[2]].write(&quantized.biases).await?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use quantfarm_store::Location;
    use quantfarm_tensors::convert::{convert_hf_to_gguf, plan_gguf_to_mlx, OutType};
    use quantfarm_tensors::{Dtype, TensorSource};

    use super::super::{gguf_to_mlx, quantize_mlx_checkpoint, MlxOptions};

    fn weights(dir: &std::path::Path) -> Vec<u8> {
        std::fs::read(dir.join("model.safetensors")).unwrap()
    }

    /// The pieces, how many are read ahead and whether the reader overlaps change no byte: budgets from a whole
    /// tensor down to one row per piece and no read-ahead, on both runtimes, HF → MLX and GGUF → MLX (whose q/k
    /// rows come back from the GGUF's permutation, whole heads at a time).
    #[test]
    fn every_budget_writes_the_same_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let hf = dir.path().join("hf");
        let multi = tokio::runtime::Builder::new_multi_thread().worker_threads(2).build().unwrap();
        let single = tokio::runtime::Builder::new_current_thread().build().unwrap();
        multi.block_on(quantfarm_tensors::synthetic::write_wide_llama(&Location::local(&hf))).unwrap();
        let gguf = dir.path().join("gguf");
        let (hf_loc, gguf_loc) = (Location::local(&hf), Location::local(&gguf));
        multi.block_on(convert_hf_to_gguf(&hf_loc, &gguf_loc, "m", OutType::Bf16, None, 1 << 20, false)).unwrap();
        let mut outputs = Vec::new();
        for (i, budget) in [64u64 << 20, 100_000, 4000, 1].into_iter().enumerate() {
            for (j, rt) in [&multi, &single].into_iter().enumerate() {
                let opts = MlxOptions { budget, ..MlxOptions::new(4, 64) };
                let out = dir.path().join(format!("hf-{i}-{j}"));
                rt.block_on(async {
                    let src = TensorSource::open(&Location::local(&hf)).await.unwrap();
                    quantize_mlx_checkpoint(&src, &Location::local(&out), &opts).await.unwrap();
                });
                outputs.push((format!("HF, budget {budget}, runtime {j}"), weights(&out)));
                let out = dir.path().join(format!("gguf-{i}-{j}"));
                rt.block_on(async {
                    let src = TensorSource::open(&Location::local(gguf.join("m.gguf"))).await.unwrap();
                    let plan = plan_gguf_to_mlx(&src, Dtype::BF16).await.unwrap();
                    gguf_to_mlx(&src, &plan, &Location::local(&out), &opts).await.unwrap();
                });
                outputs.push((format!("GGUF, budget {budget}, runtime {j}"), weights(&out)));
            }
        }
        for (what, bytes) in &outputs[1..] {
            assert!(bytes == &outputs[0].1, "{what} differs from {}", outputs[0].0);
        }
        // A floating-point mode (codes and uint8 scales, no biases) alike, down to one row per piece.
        let mut fp = Vec::new();
        for budget in [64u64 << 20, 4000, 1] {
            let opts = MlxOptions { budget, ..MlxOptions::fp(crate::mlx_fp::FpMode::Nvfp4) };
            let out = dir.path().join(format!("fp-{budget}"));
            multi.block_on(async {
                let src = TensorSource::open(&Location::local(&hf)).await.unwrap();
                quantize_mlx_checkpoint(&src, &Location::local(&out), &opts).await.unwrap();
            });
            fp.push((budget, weights(&out)));
        }
        assert!(fp.iter().all(|(_, b)| b == &fp[0].1), "nvfp4: the budgets wrote different checkpoints");
        assert!(fp[0].1 != outputs[0].1);
    }

    /// A value the quantizer refuses is named by its tensor and its row in the tensor, not in the piece.
    #[test]
    fn a_bad_value_names_its_tensor_and_row() {
        let dir = tempfile::tempdir().unwrap();
        let hf = dir.path().join("hf");
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).build().unwrap();
        rt.block_on(quantfarm_tensors::synthetic::write_tiny_llama(&Location::local(&hf))).unwrap();
        let name = "model.layers.1.mlp.down_proj.weight";
        let (offset, cols) = rt.block_on(async {
            let src = TensorSource::open(&Location::local(&hf)).await.unwrap();
            let st = src.safetensors().unwrap();
            let (file, t) = st.find(name).unwrap();
            (st.files[file].1.data_offset + t.begin, *t.shape.last().unwrap())
        });
        let mut bytes = weights(&hf);
        let at = (offset + (5 * cols + 3) * 2) as usize;
        bytes[at..at + 2].copy_from_slice(&0x7fc0u16.to_le_bytes());
        std::fs::write(hf.join("model.safetensors"), bytes).unwrap();
        let opts = MlxOptions { budget: 3000, ..MlxOptions::new(4, 64) };
        let e = rt
            .block_on(async {
                let src = TensorSource::open(&Location::local(&hf)).await.unwrap();
                quantize_mlx_checkpoint(&src, &Location::local(dir.path().join("out")), &opts).await
            })
            .err()
            .unwrap()
            .to_string();
        assert_eq!(e, format!("tensor {name:?}: input value NaN at row 5, column 3 is not finite"));
        assert!(!dir.path().join("out/model.safetensors").exists());
    }
}
