//! llama-quantize on a model whose rows are all whole K-quant super-blocks (the synthetic "wide" Llama: hidden 256,
//! 8 layers, 4 heads / 2 kv heads, intermediate 512, with outliers, constant and all-zero rows). SmolLM2's widths
//! send most K-quant choices through the fallback; here every mixture rule (`use_more_bits`, `i < n/8`, the output
//! rule) picks a K-quant for real. For every quantized file type, without and with an imatrix made by the real
//! llama-imatrix, and for `--pure` and the type-override flags, the file quantfarm writes must equal the file the
//! real `llama-quantize` writes, byte for byte; a difference names the metadata keys and tensors that differ.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use quantfarm_e2e::{fixtures_dir, llama_bin};
use quantfarm_quant::file::{quantize_gguf, Options};
use quantfarm_quant::imatrix::Imatrix;
use quantfarm_quant::mixture::Choice;
use quantfarm_quant::{FileType, GgmlType};
use quantfarm_store::Location;
use quantfarm_tensors::convert::{convert_hf_to_gguf, OutType};
use quantfarm_tensors::synthetic::{write_wide_llama, write_wide_tied_llama};
use quantfarm_tensors::TensorSource;

/// Every file type whose tensors are quantized and that needs no importance matrix.
const QUANTIZED: [FileType; 23] = [
    FileType::Q8_0,
    FileType::Q6_K,
    FileType::Q5_K_M,
    FileType::Q5_K_S,
    FileType::Q4_K_M,
    FileType::Q4_K_S,
    FileType::Q3_K_L,
    FileType::Q3_K_M,
    FileType::Q3_K_S,
    FileType::Q2_K,
    FileType::Q4_0,
    FileType::Q4_1,
    FileType::Q5_0,
    FileType::Q5_1,
    FileType::IQ4_NL,
    FileType::IQ4_XS,
    FileType::IQ3_S,
    FileType::IQ3_M,
    FileType::TQ1_0,
    FileType::TQ2_0,
    FileType::Q1_0,
    FileType::Q2_0,
    FileType::MXFP4_MOE,
];

/// The file types llama-quantize makes only with an importance matrix (`tensor_requires_imatrix`; IQ3_XS because
/// its attn_q/attn_k and middle ffn_gate/ffn_up are IQ3_XXS).
const NEED_IMATRIX: [FileType; 9] = [
    FileType::Q2_K_S,
    FileType::IQ3_XS,
    FileType::IQ3_XXS,
    FileType::IQ2_M,
    FileType::IQ2_S,
    FileType::IQ2_XS,
    FileType::IQ2_XXS,
    FileType::IQ1_M,
    FileType::IQ1_S,
];

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

fn sha256_file(p: &Path) -> String {
    quantfarm_store::hex(&<sha2::Sha256 as sha2::Digest>::digest(std::fs::read(p).unwrap()))
}

/// The wide Llama, written as an HF checkpoint and converted to a BF16 GGUF in `dir`.
fn wide_bf16(dir: &Path) -> PathBuf {
    convert_wide(dir, false)
}

fn convert_wide(dir: &Path, tied: bool) -> PathBuf {
    rt().block_on(async {
        let hf = dir.join("wide-hf");
        if tied {
            write_wide_tied_llama(&Location::local(&hf)).await.unwrap();
        } else {
            write_wide_llama(&Location::local(&hf)).await.unwrap();
        }
        let out = convert_hf_to_gguf(
            &Location::local(&hf),
            &Location::local(dir),
            "wide-bf16",
            OutType::Bf16,
            None,
            64 << 20,
            false,
        )
        .await
        .unwrap();
        assert_eq!(out.len(), 1);
        PathBuf::from(&out[0].location)
    })
}

/// `llama-imatrix -m BF16 -f gpl3.txt -c 64 --chunks 4`: a real imatrix for the wide model.
fn make_imatrix(bf16: &Path, dir: &Path) -> PathBuf {
    let out = dir.join("imat.gguf");
    let bin = llama_bin();
    let text = fixtures_dir().join("texts/gpl3.txt");
    let r = Command::new(bin.join("llama-imatrix"))
        .env("LD_LIBRARY_PATH", &bin)
        .arg("-m")
        .arg(bf16)
        .arg("-f")
        .arg(&text)
        .args(["-c", "64", "--chunks", "4", "-t", "2", "-ngl", "0"])
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap();
    assert!(r.status.success() && out.exists(), "llama-imatrix failed:\n{}", String::from_utf8_lossy(&r.stderr));
    out
}

/// One llama-quantize invocation: its flags (before the paths) and file type.
struct Case {
    label: String,
    flags: Vec<String>,
    ftype: FileType,
    imatrix: Option<PathBuf>,
    opts: Box<dyn Fn(Options) -> Options>,
}

impl Case {
    fn plain(ftype: FileType, imatrix: Option<&Path>) -> Case {
        let label = format!("{ftype}{}", if imatrix.is_some() { " +imatrix" } else { "" });
        Case { label, flags: Vec::new(), ftype, imatrix: imatrix.map(Path::to_path_buf), opts: Box::new(|o| o) }
    }
}

/// Runs the real llama-quantize and quantfarm for `case`: `None` when the files are equal, else what differs; and
/// the types quantfarm chose.
fn run_case(src: &Path, dir: &Path, case: &Case) -> (Option<String>, Vec<Choice>) {
    let tag: String = case.label.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
    let theirs = dir.join(format!("theirs-{tag}.gguf"));
    let ours = dir.join(format!("ours-{tag}.gguf"));
    let bin = llama_bin();
    let mut cmd = Command::new(bin.join("llama-quantize"));
    cmd.env("LD_LIBRARY_PATH", &bin).args(&case.flags);
    if let Some(im) = &case.imatrix {
        cmd.arg("--imatrix").arg(im);
    }
    let r = cmd.arg(src).arg(&theirs).args([case.ftype.name(), "2"]).output().unwrap();
    assert!(r.status.success(), "{}: llama-quantize failed:\n{}", case.label, String::from_utf8_lossy(&r.stderr));
    rt().block_on(async {
        let source = TensorSource::open(&Location::local(src)).await.unwrap();
        let imatrix = match &case.imatrix {
            None => None,
            Some(p) => {
                let mut im = Imatrix::load(&Location::local(p)).await.unwrap();
                // llama-quantize records the argument as given.
                im.file = p.to_string_lossy().into_owned();
                Some(Arc::new(im))
            }
        };
        let opts = (case.opts)(Options { imatrix, threads: Some(2), budget: 1 << 20, ..Options::new(case.ftype) });
        let q = quantize_gguf(&source, &Location::local(&ours), &opts)
            .await
            .unwrap_or_else(|e| panic!("{}: quantfarm failed: {e}", case.label));
        if q.committed.sha256 == sha256_file(&theirs) {
            return (None, q.choices);
        }
        (Some(format!("{}: {}", case.label, differences(&ours, &theirs).await)), q.choices)
    })
}

/// Which metadata keys and tensors (with both types) differ between two GGUFs.
async fn differences(ours: &Path, theirs: &Path) -> String {
    let a = TensorSource::open(&Location::local(ours)).await.unwrap();
    let b = TensorSource::open(&Location::local(theirs)).await.unwrap();
    let (ha, hb) = (a.gguf().unwrap().header(), b.gguf().unwrap().header());
    let mut out = Vec::new();
    let meta = |h: &quantfarm_tensors::gguf::GgufHeader| {
        h.metadata.iter().map(|(k, v)| format!("{k}={}", v.to_json())).collect::<Vec<_>>()
    };
    if meta(ha) != meta(hb) {
        out.push(format!("metadata differs: ours {:?} theirs {:?}", meta(ha), meta(hb)));
    }
    let list = |h: &quantfarm_tensors::gguf::GgufHeader| {
        h.tensors.iter().map(|t| (t.name.clone(), t.ty, t.dims.clone())).collect::<Vec<_>>()
    };
    if list(ha) != list(hb) {
        let (la, lb) = (list(ha), list(hb));
        let diff: Vec<String> = la
            .iter()
            .zip(&lb)
            .filter(|(x, y)| x != y)
            .map(|(x, y)| format!("{} {} (llama-quantize: {} {})", x.0, x.1, y.0, y.1))
            .collect();
        out.push(format!("tensor list differs: {}", diff.join(", ")));
        return out.join("; ");
    }
    let mut bytes = Vec::new();
    for (name, ty, _) in list(ha) {
        let buf = |s: &TensorSource| {
            let e = s.entry(&name).unwrap().bytes as usize;
            vec![0u8; e]
        };
        let (mut x, mut y) = (buf(&a), buf(&b));
        a.read_range(&name, 0, &mut x).await.unwrap();
        b.read_range(&name, 0, &mut y).await.unwrap();
        if x != y {
            let blocks = x.len() / ty.type_size().max(1);
            let first = x.chunks(ty.type_size().max(1)).zip(y.chunks(ty.type_size().max(1))).position(|(p, q)| p != q);
            bytes.push(format!("{name} ({ty}, first differing block {first:?} of {blocks})"));
        }
    }
    if !bytes.is_empty() {
        out.push(format!("tensor bytes differ: {}", bytes.join(", ")));
    }
    if out.is_empty() {
        out.push("same metadata and tensors, different layout".into());
    }
    out.join("; ")
}

/// Runs every case and fails listing all the differences (each printed as it is found). Returns each case's
/// choices, for checks that the model exercised the rules it is meant to.
fn check_all(src: &Path, dir: &Path, cases: &[Case]) -> Vec<Vec<Choice>> {
    let mut bad = Vec::new();
    let mut good = Vec::new();
    let mut choices = Vec::new();
    for case in cases {
        let (diff, c) = run_case(src, dir, case);
        choices.push(c);
        match diff {
            None => good.push(case.label.clone()),
            Some(d) => {
                eprintln!("MISMATCH {d}");
                bad.push(d);
            }
        }
    }
    eprintln!("byte-identical to llama-quantize: {}", good.join(", "));
    assert!(bad.is_empty(), "{} of {} differ from llama-quantize:\n{}", bad.len(), cases.len(), bad.join("\n"));
    choices
}

/// The type chosen for `name`.
fn type_of(choices: &[Choice], name: &str) -> GgmlType {
    choices.iter().find(|c| c.name == name).map(|c| c.ty).unwrap_or_else(|| panic!("no tensor {name}"))
}

/// The model is wide enough that no type falls back, and the layer rules pick some layers and not others.
fn assert_rules_were_exercised(cases: &[Case], choices: &[Vec<Choice>]) {
    for (case, c) in cases.iter().zip(choices) {
        assert!(c.iter().all(|c| !c.fell_back), "{}: a tensor fell back", case.label);
        let at = |name: &str| type_of(c, name);
        match case.ftype {
            FileType::Q4_K_M | FileType::Q5_K_M => {
                let (more, base) = if case.ftype == FileType::Q4_K_M {
                    (GgmlType::Q6_K, GgmlType::Q4_K)
                } else {
                    (GgmlType::Q6_K, GgmlType::Q5_K)
                };
                // use_more_bits(i, 8): layers 0, 3, 6, 7.
                for i in 0..8 {
                    let want = if [0, 3, 6, 7].contains(&i) { more } else { base };
                    assert_eq!(at(&format!("blk.{i}.attn_v.weight")), want, "{} layer {i}", case.label);
                    assert_eq!(at(&format!("blk.{i}.ffn_down.weight")), want, "{} layer {i}", case.label);
                }
                assert_eq!(at("output.weight"), GgmlType::Q6_K, "{}", case.label);
                assert_eq!(at("token_embd.weight"), base, "{}", case.label);
            }
            FileType::Q4_K_S => {
                assert_eq!(at("blk.0.ffn_down.weight"), GgmlType::Q5_K);
                assert_eq!(at("blk.1.ffn_down.weight"), GgmlType::Q4_K);
                assert_eq!(at("blk.3.attn_v.weight"), GgmlType::Q5_K);
                assert_eq!(at("blk.4.attn_v.weight"), GgmlType::Q4_K);
            }
            FileType::Q3_K_M => {
                assert_eq!(at("blk.1.attn_v.weight"), GgmlType::Q5_K);
                assert_eq!(at("blk.2.attn_v.weight"), GgmlType::Q4_K);
                assert_eq!(at("blk.0.attn_output.weight"), GgmlType::Q4_K);
            }
            FileType::Q2_K => {
                assert_eq!(at("blk.0.attn_v.weight"), GgmlType::Q3_K, "gqa 2");
                assert_eq!(at("blk.0.ffn_down.weight"), GgmlType::Q3_K);
                assert_eq!(at("blk.0.attn_q.weight"), GgmlType::Q2_K);
            }
            FileType::IQ4_NL | FileType::IQ4_XS => {
                // ffn_down of the first eighth gets Q5_K, only without an imatrix; gqa 2 leaves attn_v alone.
                let first = if case.imatrix.is_some() { case.ftype.default_type() } else { GgmlType::Q5_K };
                assert_eq!(at("blk.0.ffn_down.weight"), first, "{}", case.label);
                assert_eq!(at("blk.1.ffn_down.weight"), case.ftype.default_type(), "{}", case.label);
                assert_eq!(at("blk.0.attn_v.weight"), case.ftype.default_type(), "{}", case.label);
                assert_eq!(at("output.weight"), GgmlType::Q6_K, "{}", case.label);
            }
            FileType::TQ1_0 | FileType::TQ2_0 | FileType::Q2_0 => {
                assert_eq!(at("token_embd.weight"), GgmlType::Q4_K, "{}: untied token_embd", case.label);
                assert_eq!(at("blk.0.ffn_down.weight"), case.ftype.default_type(), "{}", case.label);
            }
            FileType::MXFP4_MOE => {
                // A dense model has no 3-D expert tensor: everything quantized is Q8_0.
                assert!(c.iter().all(|c| matches!(c.ty, GgmlType::Q8_0 | GgmlType::F32)), "{}", case.label);
            }
            FileType::Q2_K_S => {
                assert_eq!(at("blk.0.ffn_down.weight"), GgmlType::Q4_K, "{}", case.label);
                assert_eq!(at("blk.1.ffn_down.weight"), GgmlType::Q2_K, "{}", case.label);
                assert_eq!(at("blk.0.attn_v.weight"), GgmlType::Q2_K, "{}: gqa 2", case.label);
            }
            FileType::IQ3_S | FileType::IQ3_M => {
                // gqa 2: IQ3_S keeps attn_v at its default, IQ3_M gives it Q4_K; IQ3_M also raises attn_output and
                // the first eighth of ffn_down to Q4_K.
                let m = case.ftype == FileType::IQ3_M;
                let (v, o) = if m { (GgmlType::Q4_K, GgmlType::Q4_K) } else { (GgmlType::IQ3_S, GgmlType::IQ3_S) };
                assert_eq!(at("blk.0.attn_v.weight"), v, "{}", case.label);
                assert_eq!(at("blk.0.attn_output.weight"), o, "{}", case.label);
                assert_eq!(at("blk.0.ffn_down.weight"), if m { GgmlType::Q4_K } else { GgmlType::IQ3_S });
                assert_eq!(at("blk.1.ffn_down.weight"), GgmlType::IQ3_S, "{}", case.label);
                assert_eq!(at("output.weight"), GgmlType::Q6_K, "{}", case.label);
            }
            FileType::IQ3_XS => {
                // attn_q/attn_k IQ3_XXS; ffn_gate/ffn_up IQ3_XXS for n/8 ≤ i < 7n/8 (layers 1..6 of 8).
                assert_eq!(at("blk.0.attn_q.weight"), GgmlType::IQ3_XXS, "{}", case.label);
                assert_eq!(at("blk.0.attn_k.weight"), GgmlType::IQ3_XXS, "{}", case.label);
                for i in 0..8 {
                    let want = if (1..7).contains(&i) { GgmlType::IQ3_XXS } else { GgmlType::IQ3_S };
                    assert_eq!(at(&format!("blk.{i}.ffn_gate.weight")), want, "{} layer {i}", case.label);
                    assert_eq!(at(&format!("blk.{i}.ffn_up.weight")), want, "{} layer {i}", case.label);
                }
                assert_eq!(at("token_embd.weight"), GgmlType::IQ3_S, "{}", case.label);
            }
            FileType::Q4_0 | FileType::Q5_0 if case.imatrix.is_some() => {
                let more = if case.ftype == FileType::Q4_0 { GgmlType::Q4_1 } else { GgmlType::Q5_1 };
                assert_eq!(at("blk.0.ffn_down.weight"), more, "{}", case.label);
                assert_eq!(at("blk.1.ffn_down.weight"), case.ftype.default_type(), "{}", case.label);
            }
            _ => {}
        }
    }
}

#[test]
fn every_file_type_equals_llama_quantize_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let src = wide_bf16(dir.path());
    let cases: Vec<Case> = QUANTIZED.iter().map(|&f| Case::plain(f, None)).collect();
    let choices = check_all(&src, dir.path(), &cases);
    assert_rules_were_exercised(&cases, &choices);
}

#[test]
fn every_file_type_with_a_real_imatrix_equals_llama_quantize_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let src = wide_bf16(dir.path());
    let im = make_imatrix(&src, dir.path());
    let cases: Vec<Case> = QUANTIZED.iter().chain(&NEED_IMATRIX).map(|&f| Case::plain(f, Some(&im))).collect();
    let choices = check_all(&src, dir.path(), &cases);
    assert_rules_were_exercised(&cases, &choices);
}

/// Q2_K_S without an importance matrix: llama-quantize refuses ("this quantization requires an imatrix!") and
/// writes nothing; so does quantfarm, naming the first tensor and its type.
#[test]
fn a_file_type_that_needs_an_imatrix_is_refused_without_one() {
    let dir = tempfile::tempdir().unwrap();
    let src = wide_bf16(dir.path());
    let bin = llama_bin();
    let theirs = dir.path().join("theirs.gguf");
    let r = Command::new(bin.join("llama-quantize"))
        .env("LD_LIBRARY_PATH", &bin)
        .arg(&src)
        .arg(&theirs)
        .args(["Q2_K_S", "2"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&r.stderr).into_owned() + &String::from_utf8_lossy(&r.stdout);
    assert!(!r.status.success() && said.contains("requires an imatrix"), "llama-quantize:\n{said}");
    assert!(!theirs.exists(), "llama-quantize left {}", theirs.display());
    let ours = dir.path().join("ours.gguf");
    let e = rt().block_on(async {
        let source = TensorSource::open(&Location::local(&src)).await.unwrap();
        quantize_gguf(&source, &Location::local(&ours), &Options::new(FileType::Q2_K_S)).await.map(|_| ()).unwrap_err()
    });
    let msg = e.to_string();
    assert!(
        msg.contains("blk.0.") && msg.contains("Q2_K_S gives it type Q2_K") && msg.contains("importance matrix"),
        "{msg}"
    );
    assert!(!ours.exists(), "quantfarm left {}", ours.display());
}

#[test]
fn type_flags_equal_llama_quantize_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let src = wide_bf16(dir.path());
    let im = make_imatrix(&src, dir.path());
    let case =
        |label: &str, flags: &[&str], ftype, imatrix: Option<&Path>, opts: Box<dyn Fn(Options) -> Options>| Case {
            label: label.into(),
            flags: flags.iter().map(|s| s.to_string()).collect(),
            ftype,
            imatrix: imatrix.map(Path::to_path_buf),
            opts,
        };
    let cases = vec![
        case("--pure Q4_K_M", &["--pure"], FileType::Q4_K_M, None, Box::new(|o| Options { pure: true, ..o })),
        case("--pure Q3_K_M", &["--pure"], FileType::Q3_K_M, None, Box::new(|o| Options { pure: true, ..o })),
        case(
            "--pure Q5_K_M +imatrix",
            &["--pure"],
            FileType::Q5_K_M,
            Some(&im),
            Box::new(|o| Options { pure: true, ..o }),
        ),
        case(
            "--output-tensor-type q8_0 --token-embedding-type q4_K Q4_K_M",
            &["--output-tensor-type", "q8_0", "--token-embedding-type", "q4_K"],
            FileType::Q4_K_M,
            None,
            Box::new(|o| Options {
                output_tensor_type: Some(GgmlType::Q8_0),
                token_embedding_type: Some(GgmlType::Q4_K),
                ..o
            }),
        ),
        case(
            "--output-tensor-type q5_K Q2_K +imatrix",
            &["--output-tensor-type", "q5_K"],
            FileType::Q2_K,
            Some(&im),
            Box::new(|o| Options { output_tensor_type: Some(GgmlType::Q5_K), ..o }),
        ),
        case(
            "--token-embedding-type q6_K --pure Q4_0",
            &["--token-embedding-type", "q6_K", "--pure"],
            FileType::Q4_0,
            None,
            Box::new(|o| Options { token_embedding_type: Some(GgmlType::Q6_K), pure: true, ..o }),
        ),
        case(
            "--leave-output-tensor Q6_K",
            &["--leave-output-tensor"],
            FileType::Q6_K,
            None,
            Box::new(|o| Options { leave_output_tensor: true, ..o }),
        ),
        case(
            "--leave-output-tensor Q4_K_S +imatrix",
            &["--leave-output-tensor"],
            FileType::Q4_K_S,
            Some(&im),
            Box::new(|o| Options { leave_output_tensor: true, ..o }),
        ),
    ];
    let choices = check_all(&src, dir.path(), &cases);
    // --pure really changed the types (the rules would give attn_v of layer 0 Q6_K), and the override flags landed.
    assert_eq!(type_of(&choices[0], "blk.0.attn_v.weight"), GgmlType::Q4_K);
    assert_eq!(type_of(&choices[0], "output.weight"), GgmlType::Q4_K);
    assert_eq!(type_of(&choices[3], "output.weight"), GgmlType::Q8_0);
    assert_eq!(type_of(&choices[3], "token_embd.weight"), GgmlType::Q4_K);
    assert_eq!(type_of(&choices[6], "output.weight"), GgmlType::BF16);

    // The comparison itself: llama-quantize with --pure against quantfarm without is caught, naming tensors.
    let control = case("control: --pure vs rules", &["--pure"], FileType::Q4_K_M, None, Box::new(|o| o));
    let diff = run_case(&src, dir.path(), &control).0.expect("different files are reported");
    assert!(diff.contains("blk.0.attn_v.weight") && diff.contains("Q6_K"), "{diff}");
}

/// The override flags skip the fallback, so a type whose blocks do not divide the rows (Q4_K on tiny-llama's
/// 64-column output) is refused up front naming the tensor and widths, and no file is left.
#[test]
fn an_override_type_that_does_not_divide_the_rows_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let hf = dir.path().join("tiny-hf");
        quantfarm_tensors::synthetic::write_tiny_llama(&Location::local(&hf)).await.unwrap();
        let out = convert_hf_to_gguf(
            &Location::local(&hf),
            &Location::local(dir.path()),
            "tiny",
            OutType::Bf16,
            None,
            1 << 20,
            false,
        )
        .await
        .unwrap();
        let src = TensorSource::open(&Location::local(&out[0].location)).await.unwrap();
        let dst = dir.path().join("out.gguf");
        for opts in [
            Options { output_tensor_type: Some(GgmlType::Q4_K), ..Options::new(FileType::Q8_0) },
            Options { token_embedding_type: Some(GgmlType::Q6_K), ..Options::new(FileType::Q4_0) },
        ] {
            let err = quantize_gguf(&src, &Location::local(&dst), &opts).await.err().expect("refused").to_string();
            assert!(err.contains("weight") && err.contains("256") && err.contains("64"), "{err}");
            assert!(!dst.exists(), "a refused quantization left a file");
        }
    });
}

/// Tied embeddings (no output.weight): token_embd takes the output rule (Q6_K, or Q8_0 under Q8_0), and
/// `--output-tensor-type` reaches it through the rules (not under `--pure`), below `--token-embedding-type`.
#[test]
fn tied_embeddings_and_their_flags_equal_llama_quantize_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let src = convert_wide(dir.path(), true);
    let flagged = |label: &str, flags: &[&str], ftype, opts: Box<dyn Fn(Options) -> Options>| Case {
        label: label.into(),
        flags: flags.iter().map(|s| s.to_string()).collect(),
        ftype,
        imatrix: None,
        opts,
    };
    let mut cases: Vec<Case> = [FileType::Q8_0, FileType::Q4_K_M, FileType::Q2_K, FileType::Q5_0]
        .iter()
        .map(|&f| Case::plain(f, None))
        .collect();
    cases.push(flagged(
        "tied --output-tensor-type q5_K Q4_K_M",
        &["--output-tensor-type", "q5_K"],
        FileType::Q4_K_M,
        Box::new(|o| Options { output_tensor_type: Some(GgmlType::Q5_K), ..o }),
    ));
    cases.push(flagged(
        "tied --pure --output-tensor-type q8_0 Q4_K_M",
        &["--pure", "--output-tensor-type", "q8_0"],
        FileType::Q4_K_M,
        Box::new(|o| Options { pure: true, output_tensor_type: Some(GgmlType::Q8_0), ..o }),
    ));
    cases.push(flagged(
        "tied --token-embedding-type q4_1 --output-tensor-type q4_K Q5_K_M",
        &["--token-embedding-type", "q4_1", "--output-tensor-type", "q4_K"],
        FileType::Q5_K_M,
        Box::new(|o| Options {
            token_embedding_type: Some(GgmlType::Q4_1),
            output_tensor_type: Some(GgmlType::Q4_K),
            ..o
        }),
    ));
    let choices = check_all(&src, dir.path(), &cases);
    let embd: Vec<GgmlType> = choices.iter().map(|c| type_of(c, "token_embd.weight")).collect();
    use GgmlType as T;
    assert_eq!(embd, [T::Q8_0, T::Q6_K, T::Q6_K, T::Q6_K, T::Q5_K, T::Q4_K, T::Q4_1]);
    assert!(choices.iter().all(|c| c.iter().all(|c| c.name != "output.weight")));
}

/// Three `--tensor-type` recipes, byte for byte against llama-quantize: a regex over layers (with a dot that
/// matches anything and a pattern that also hits `attn_qkv`-like names), an override of `output`/`token_embd` by
/// pattern (the unanchored `output` also catches every `attn_output`), and a file of patterns interleaved with a
/// command-line entry (first match wins across both). A pattern-decided tensor does not advance the layer counters,
/// so the Q4_K_M rules for later ffn_down layers shift exactly as llama-quantize's do.
#[test]
fn tensor_type_recipes_equal_llama_quantize_byte_for_byte() {
    use quantfarm_quant::mixture::TensorType;
    let dir = tempfile::tempdir().unwrap();
    let src = wide_bf16(dir.path());
    let file = dir.path().join("recipe.txt");
    std::fs::write(&file, "ffn_up=q8_0\n  blk\\.7\\..*=IQ4_NL\tattn_k=Q5_0\n").unwrap();
    let parsed =
        |specs: Vec<&str>| -> Vec<TensorType> { specs.into_iter().map(|s| TensorType::parse(s).unwrap()).collect() };
    let layers = parsed(vec!["blk\\.[0-2]\\.ffn_down=Q6_K", "blk\\.1.\\.attn_v=q8_0"]);
    let ends = parsed(vec!["output=q8_0", "token_embd=Q5_K"]);
    let mut file_entries = parsed(vec!["attn_k=q4_0"]);
    file_entries.extend(TensorType::parse_file(&std::fs::read_to_string(&file).unwrap()).unwrap());
    let case = |label: &str, flags: Vec<String>, ftype, tt: Vec<TensorType>| Case {
        label: label.into(),
        flags,
        ftype,
        imatrix: None,
        opts: Box::new(move |o| Options { tensor_types: tt.clone(), ..o }),
    };
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let cases = vec![
        case(
            "layer regex Q4_K_M",
            s(&["--tensor-type", "blk\\.[0-2]\\.ffn_down=Q6_K", "--tensor-type", "blk\\.1.\\.attn_v=q8_0"]),
            FileType::Q4_K_M,
            layers,
        ),
        case(
            "output and token_embd Q3_K_M",
            s(&["--tensor-type", "output=q8_0", "--tensor-type", "token_embd=Q5_K"]),
            FileType::Q3_K_M,
            ends,
        ),
        case(
            "a file after an entry Q5_K_S",
            vec![
                "--tensor-type".into(),
                "attn_k=q4_0".into(),
                "--tensor-type-file".into(),
                file.to_string_lossy().into_owned(),
            ],
            FileType::Q5_K_S,
            file_entries,
        ),
    ];
    let choices = check_all(&src, dir.path(), &cases);
    let c = &choices[0];
    assert_eq!(type_of(c, "blk.2.ffn_down.weight"), GgmlType::Q6_K);
    // ffn_down of layers 0–2 went by pattern, so the rules' counter starts at layer 3: use_more_bits(0, 8) → Q6_K.
    assert_eq!(type_of(c, "blk.3.ffn_down.weight"), GgmlType::Q6_K);
    assert_eq!(type_of(c, "blk.4.ffn_down.weight"), GgmlType::Q4_K);
    assert_eq!(type_of(&choices[1], "blk.0.attn_output.weight"), GgmlType::Q8_0);
    assert_eq!(type_of(&choices[1], "token_embd.weight"), GgmlType::Q5_K);
    assert_eq!(type_of(&choices[2], "blk.0.attn_k.weight"), GgmlType::Q4_0, "the command-line entry comes first");
    assert_eq!(type_of(&choices[2], "blk.7.ffn_up.weight"), GgmlType::Q8_0, "ffn_up=q8_0 precedes blk.7");
    assert_eq!(type_of(&choices[2], "blk.7.ffn_down.weight"), GgmlType::IQ4_NL);
}
