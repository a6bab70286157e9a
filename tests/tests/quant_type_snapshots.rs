//! Oracle: upstream llama.cpp's own type-selection snapshots (`tests/snapshots/*.schema` in the source tree the peer
//! tools are built from, written by `tests/test-quant-type-selection.cpp` from the real models' tensor lists). Each
//! section `[FTYPE] default` lists the quantizable tensors whose type is not the default, without an imatrix. For
//! the dense models among them (Qwen3-0.6B: gqa 2; Qwen3-14B: gqa 5; Llama-3.1-70B: gqa 8 and the 70B rule) the
//! tensor list follows from the header (`n_embd`, `n_ff`, `n_vocab`, `n_layer`, heads; head size 128; the untied
//! `output.weight` is there when a section names it), and quantfarm's choice for every tensor, under every file type
//! of the file, must give exactly the listed deviations.

use std::collections::BTreeMap;

use quantfarm_e2e::llama_src;
use quantfarm_quant::mixture::{allows_quantization, choose_types, ModelFacts};
use quantfarm_quant::{FileType, GgmlType};

struct Snapshot {
    header: BTreeMap<String, u64>,
    /// (file type name, default type name, the listed (tensor, type) pairs).
    sections: Vec<(String, String, Vec<(String, String)>)>,
}

fn parse(text: &str) -> Snapshot {
    let mut header = BTreeMap::new();
    let mut sections: Vec<(String, String, Vec<(String, String)>)> = Vec::new();
    for line in text.lines() {
        if let Some(h) = line.strip_prefix("# n_embd=") {
            for kv in format!("n_embd={h}").split(", ") {
                let (k, v) = kv.split_once('=').expect("key=value");
                header.insert(k.to_string(), v.trim().parse().expect("a number"));
            }
        } else if line.is_empty() || line.starts_with('#') {
        } else if let Some(rest) = line.strip_prefix('[') {
            let (ftype, default) = rest.split_once("] ").expect("[FTYPE] default");
            sections.push((ftype.to_string(), default.to_string(), Vec::new()));
        } else {
            let (name, ty) = line.split_once(' ').expect("tensor type");
            sections.last_mut().expect("a section").2.push((name.to_string(), ty.to_string()));
        }
    }
    Snapshot { header, sections }
}

/// The quantizable tensors of a dense Llama/Qwen3 with this header.
fn dense_tensors(s: &Snapshot) -> Vec<(String, Vec<u64>, GgmlType)> {
    let h = |k: &str| s.header[k];
    let (embd, ff, vocab, layers) = (h("n_embd"), h("n_ff"), h("n_vocab"), h("n_layer"));
    let (q, kv) = (h("n_head") * 128, h("n_head_kv") * 128);
    let has_output = s.sections.iter().any(|(_, _, t)| t.iter().any(|(n, _)| n == "output.weight"));
    let mut t = vec![("token_embd.weight".to_string(), vec![embd, vocab])];
    if has_output {
        t.push(("output.weight".into(), vec![embd, vocab]));
    }
    for i in 0..layers {
        for (n, ne) in [
            ("attn_q", vec![embd, q]),
            ("attn_k", vec![embd, kv]),
            ("attn_v", vec![embd, kv]),
            ("attn_output", vec![q, embd]),
            ("ffn_gate", vec![embd, ff]),
            ("ffn_up", vec![embd, ff]),
            ("ffn_down", vec![ff, embd]),
            ("attn_norm", vec![embd]),
            ("ffn_norm", vec![embd]),
        ] {
            t.push((format!("blk.{i}.{n}.weight"), ne));
        }
    }
    t.push(("output_norm.weight".into(), vec![embd]));
    t.into_iter().map(|(n, ne)| (n, ne, GgmlType::F32)).collect()
}

#[test]
fn dense_models_choose_upstreams_snapshot_types_for_every_file_type() {
    let dir = llama_src().join("tests/snapshots");
    let mut checked = Vec::new();
    for model in ["qwen3-0.6b", "qwen3-14b", "meta-llama-3.1-70b-instruct"] {
        let path = dir.join(format!("{model}.schema"));
        let s = parse(&std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())));
        let tensors = dense_tensors(&s);
        let facts = ModelFacts {
            n_layer: s.header["n_layer"] as i64,
            gqa: (s.header["n_head"] / s.header["n_head_kv"]) as i64,
            tied_embeddings: !tensors.iter().any(|(n, _, _)| n == "output.weight"),
            n_attention_wv: s.header["n_layer"] as i64,
            n_expert: 0,
        };
        assert!(s.sections.len() >= 30, "{model}: {} sections", s.sections.len());
        for (ftype_name, default, listed) in &s.sections {
            let ftype = FileType::from_name(ftype_name)
                .filter(|f| f.name() == ftype_name)
                .unwrap_or_else(|| panic!("{model}: unknown file type [{ftype_name}]"));
            assert_eq!(ftype.default_type().name().to_ascii_lowercase(), default.to_ascii_lowercase(), "{model}");
            let ours: Vec<(String, String)> = choose_types(ftype, &facts, &tensors, false)
                .unwrap_or_else(|e| panic!("{model} {ftype}: {e}"))
                .into_iter()
                .filter_map(|c| {
                    let ne = &tensors.iter().find(|(n, _, _)| *n == c.name).expect("a listed tensor").1;
                    (allows_quantization(&c.name, ne) && c.ty != ftype.default_type())
                        .then(|| (c.name, c.ty.name().to_ascii_lowercase()))
                })
                .collect();
            let listed: Vec<(String, String)> =
                listed.iter().map(|(n, t)| (n.clone(), t.to_ascii_lowercase())).collect();
            assert_eq!(ours, *listed, "{model} [{ftype_name}]: the deviations from {default}");
            checked.push(format!("{model}/{ftype_name}"));
        }
    }
    eprintln!("{} sections equal upstream's snapshots", checked.len());
}
