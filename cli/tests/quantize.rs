//! `quantfarm quantize --dry-run` against `llama-quantize --dry-run` on SmolLM2 (576 wide: most rules end in a
//! fallback): the same type for every tensor in the same order, the same totals, the same warning for a file type
//! that needs an importance matrix, and no output file from either.

use std::path::{Path, PathBuf};
use std::process::Command;

use quantfarm_e2e::{llama_bin, smollm2_derived};

/// Each listed tensor as (name, final type, lower-case), from the `[ i/ n] NAME - [shape], type = T, size = …`
/// lines both tools print (the final type is in parentheses when it changes), and the two total lines' figures.
fn listing(out: &str) -> (Vec<(String, String)>, Vec<String>) {
    let line =
        regex::Regex::new(r"\[\s*\d+/\s*\d+\] (\S+)\s+- \[[^\]]*\], type =\s*(\S+), size =[^(\n]*(?:\((\S+)\))?")
            .unwrap();
    let tensors = line
        .captures_iter(out)
        .map(|c| {
            let ty = c.get(3).or(c.get(2)).unwrap().as_str().to_ascii_lowercase();
            (c[1].to_string(), ty)
        })
        .collect();
    let totals = regex::Regex::new(r"(model|quant) size\s+=\s+([\d.]+) MiB \(([\d.]+) BPW\)").unwrap();
    let totals = totals.captures_iter(out).map(|c| format!("{} {} {}", &c[1], &c[2], &c[3])).collect();
    (tensors, totals)
}

fn both(dir: &Path, args: &[&str], ftype: &str) -> (String, String) {
    let src = smollm2_derived().join("smollm2-bf16.gguf");
    let bin = llama_bin();
    let theirs_out = dir.join("theirs.gguf");
    let r = Command::new(bin.join("llama-quantize"))
        .env("LD_LIBRARY_PATH", &bin)
        .arg("--dry-run")
        .args(args)
        .arg(&src)
        .arg(&theirs_out)
        .args([ftype, "2"])
        .output()
        .unwrap();
    let theirs = String::from_utf8_lossy(&r.stderr).into_owned() + &String::from_utf8_lossy(&r.stdout);
    assert!(r.status.success(), "llama-quantize --dry-run {ftype}:\n{theirs}");
    let ours_out = dir.join("ours.gguf");
    let r = Command::new(env!("CARGO_BIN_EXE_quantfarm"))
        .args(["quantize", "--dry-run"])
        .args(args)
        .arg(&src)
        .arg(&ours_out)
        .arg(ftype)
        .output()
        .unwrap();
    let ours = String::from_utf8_lossy(&r.stdout).into_owned() + &String::from_utf8_lossy(&r.stderr);
    assert!(r.status.success(), "quantfarm quantize --dry-run {ftype}:\n{ours}");
    assert!(!theirs_out.exists() && !ours_out.exists(), "a dry run wrote a file");
    (ours, theirs)
}

#[test]
fn dry_run_lists_llama_quantizes_types_and_totals() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = dir.path().join("recipe.txt");
    std::fs::write(&recipe, "blk\\.1[0-9]\\.ffn_up=q8_0 attn_v=Q5_K\n").unwrap();
    let recipe = recipe.to_string_lossy().into_owned();
    let cases: [(&[&str], &str); 3] = [
        (&["--tensor-type", "blk\\.[0-3]\\.ffn_down=q8_0", "--tensor-type", "output=q8_0"], "Q4_K_M"),
        (&["--tensor-type-file", &recipe, "--tensor-type", "ffn_up=iq4_xs"], "IQ3_S"),
        (&[], "Q2_K_S"),
    ];
    for (args, ftype) in cases {
        let (ours, theirs) = both(dir.path(), args, ftype);
        let (ours_t, ours_tot) = listing(&ours);
        let (theirs_t, theirs_tot) = listing(&theirs);
        assert_eq!(ours_t.len(), 272, "{ftype} {args:?}: ours lists\n{ours}");
        assert_eq!(ours_t, theirs_t, "{ftype} {args:?}: tensors and types");
        assert_eq!(ours_tot.len(), 2, "{ftype}: totals in\n{ours}");
        assert_eq!(ours_tot, theirs_tot, "{ftype} {args:?}: totals");
        let warns = |s: &str| s.contains("importance matrix") || s.contains("require an imatrix");
        assert_eq!(warns(&ours), warns(&theirs), "{ftype}: the imatrix warning\nours:\n{ours}");
        assert_eq!(warns(&ours), ftype == "Q2_K_S", "{ftype}");
    }
}

#[test]
fn bad_tensor_type_entries_are_refused_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let src = smollm2_derived().join("smollm2-bf16.gguf");
    for (arg, says) in [
        ("attn_v", "expected PATTERN=TYPE"),
        ("attn_v=q9_K", "unknown ggml type \"q9_K\""),
        ("attn_v=q8_1", "not a type llama-quantize can write"),
        ("blk\\.(0=q8_0", "not a valid regex"),
    ] {
        let r = Command::new(env!("CARGO_BIN_EXE_quantfarm"))
            .args(["quantize", "--dry-run", "--tensor-type", arg])
            .arg(&src)
            .arg(dir.path().join("x.gguf"))
            .arg("Q4_K_M")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&r.stderr);
        assert!(!r.status.success() && err.contains(says) && err.contains(arg), "{arg}: {err}");
    }
}

fn sha256(p: &Path) -> String {
    quantfarm_store::hex(&<sha2::Sha256 as sha2::Digest>::digest(std::fs::read(p).unwrap()))
}

/// `llama-quantize ARGS SRC OUT FTYPE 2` and `quantfarm quantize ARGS SRC OUT FTYPE`, each into its own folder;
/// both must succeed. Returns the two folders.
fn make_both(dir: &Path, label: &str, args: &[&str], src: &Path, out_name: &str, ftype: &str) -> (PathBuf, PathBuf) {
    let (theirs, ours) = (dir.join(format!("{label}-theirs")), dir.join(format!("{label}-ours")));
    for d in [&theirs, &ours] {
        std::fs::create_dir_all(d).unwrap();
    }
    let bin = llama_bin();
    let r = Command::new(bin.join("llama-quantize"))
        .env("LD_LIBRARY_PATH", &bin)
        .args(args)
        .arg(src)
        .arg(theirs.join(out_name))
        .args([ftype, "2"])
        .output()
        .unwrap();
    assert!(r.status.success(), "llama-quantize {label}: {}", String::from_utf8_lossy(&r.stderr));
    let r = Command::new(env!("CARGO_BIN_EXE_quantfarm"))
        .arg("quantize")
        .args(args)
        .arg(src)
        .arg(ours.join(out_name))
        .arg(ftype)
        .output()
        .unwrap();
    assert!(r.status.success(), "quantfarm quantize {label}: {}", String::from_utf8_lossy(&r.stderr));
    (theirs, ours)
}

/// Every file of two output folders, by name, with its sha256.
fn files(d: &Path) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), sha256(&p)))
        .collect();
    v.sort();
    v
}

/// `--override-kv` (every value type, an int written as the u32 of its absolute value, a key the input has and new
/// ones) and `--prune-layers` (three blocks, one of them the last; Q4_K_M, whose rules depend on the layer, with the
/// imatrix read by the old names): the same file as llama-quantize's, byte for byte.
#[test]
fn override_kv_and_prune_layers_make_llama_quantizes_file() {
    let dir = tempfile::tempdir().unwrap();
    let src = smollm2_derived().join("smollm2-bf16.gguf");
    let imatrix = quantfarm_e2e::fixtures_dir().join("smollm2/imatrix-gpl3.gguf");
    let imatrix = imatrix.to_string_lossy();
    let cases: [(&str, Vec<&str>, &str); 2] = [
        (
            "override",
            vec![
                "--override-kv",
                "general.name=str:SmolLM2 tuned",
                "--override-kv",
                "llama.context_length=int:-4096",
                "--override-kv",
                "quantfarm.test.flag=bool:true",
                "--override-kv",
                "quantfarm.test.scale=float:0.1",
            ],
            "Q8_0",
        ),
        ("prune", vec!["--prune-layers", "29,3,5", "--imatrix", &imatrix], "Q4_K_M"),
    ];
    for (label, args, ftype) in cases {
        let (theirs, ours) = make_both(dir.path(), label, &args, &src, "out.gguf", ftype);
        assert_eq!(files(&ours), files(&theirs), "{label}: {args:?}");
    }
}

/// `--keep-split` on a model in three split files (made by llama-gguf-split) and on one file: llama-quantize's
/// files, names and bytes (tensors in input-file order, the rules' counters following it; a one-file model still
/// named -00001-of-00001).
#[test]
fn keep_split_makes_llama_quantizes_files() {
    let dir = tempfile::tempdir().unwrap();
    let src = smollm2_derived().join("smollm2-bf16.gguf");
    let bin = llama_bin();
    let split = dir.path().join("split");
    std::fs::create_dir_all(&split).unwrap();
    let r = Command::new(bin.join("llama-gguf-split"))
        .env("LD_LIBRARY_PATH", &bin)
        .args(["--split", "--split-max-tensors", "100"])
        .arg(&src)
        .arg(split.join("bf16"))
        .output()
        .unwrap();
    assert!(r.status.success(), "llama-gguf-split: {}", String::from_utf8_lossy(&r.stderr));
    let first = split.join("bf16-00001-of-00003.gguf");
    let (theirs, ours) = make_both(dir.path(), "split", &["--keep-split"], &first, "q.gguf", "Q4_K_M");
    let names: Vec<String> = files(&ours).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["q-00001-of-00003.gguf", "q-00002-of-00003.gguf", "q-00003-of-00003.gguf"]);
    assert_eq!(files(&ours), files(&theirs), "--keep-split of 3 files");
    let (theirs, ours) = make_both(dir.path(), "one", &["--keep-split"], &src, "q.gguf", "Q8_0");
    assert_eq!(files(&ours).len(), 1);
    assert_eq!(files(&ours), files(&theirs), "--keep-split of one file");
}
