//! A corpus of malformed GGUF and safetensors files, each of which must give an error naming the file and the
//! field at fault — with no panic, and no single allocation larger than the file (a counting allocator checks).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use quantfarm_store::Location;
use quantfarm_tensors::gguf::{encode_header, TensorDesc, Value};
use quantfarm_tensors::{GgmlType, TensorSource};

/// Records the largest single allocation made while `ARMED` is set.
struct Counting;
static ARMED: AtomicBool = AtomicBool::new(false);
static LARGEST: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if ARMED.load(Ordering::Relaxed) {
            LARGEST.fetch_max(l.size(), Ordering::Relaxed);
        }
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        if ARMED.load(Ordering::Relaxed) {
            LARGEST.fetch_max(new, Ordering::Relaxed);
        }
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static A: Counting = Counting;

/// Allocations that any open makes whatever the file (the path, the runtime's task, error strings).
const SMALL: usize = 16 << 10;

fn valid_gguf() -> Vec<u8> {
    let metadata = vec![
        ("general.architecture".to_string(), Value::String("llama".into())),
        ("llama.block_count".to_string(), Value::U32(1)),
    ];
    let tensors = vec![
        TensorDesc { name: "w".into(), dims: vec![4, 2], ty: GgmlType::F32 },
        TensorDesc { name: "b".into(), dims: vec![4], ty: GgmlType::F32 },
    ];
    let layout = encode_header(3, &metadata, &tensors).unwrap();
    let mut out = layout.header.clone();
    out.resize(layout.file_len as usize, 0x11);
    out
}

fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len()).position(|w| w == needle).expect("needle in file")
}

fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

/// A GGUF built from raw parts after the fixed header, for cases the mutations above cannot express.
fn gguf_raw(n_tensors: u64, kvs: &[u8], n_kv: u64, rest: &[u8]) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&n_tensors.to_le_bytes());
    b.extend_from_slice(&n_kv.to_le_bytes());
    b.extend_from_slice(kvs);
    b.extend_from_slice(rest);
    b
}

fn kv(key: &[u8], ty: u32, value: &[u8]) -> Vec<u8> {
    let mut b = (key.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(key);
    b.extend_from_slice(&ty.to_le_bytes());
    b.extend_from_slice(value);
    b
}

fn tinfo(name: &[u8], dims: &[u64], ty: u32, offset: u64) -> Vec<u8> {
    let mut b = (name.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(name);
    b.extend_from_slice(&(dims.len() as u32).to_le_bytes());
    for d in dims {
        b.extend_from_slice(&d.to_le_bytes());
    }
    b.extend_from_slice(&ty.to_le_bytes());
    b.extend_from_slice(&offset.to_le_bytes());
    b
}

fn st(header: &str, data_len: usize) -> Vec<u8> {
    let mut b = (header.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(header.as_bytes());
    b.extend(std::iter::repeat_n(0u8, data_len));
    b
}

/// (file name, bytes, a piece of text the error must contain to name the field).
fn corpus() -> Vec<(&'static str, Vec<u8>, &'static str)> {
    let v = valid_gguf();
    let mut c: Vec<(&'static str, Vec<u8>, &'static str)> = Vec::new();
    let mutate = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut b = v.clone();
        f(&mut b);
        b
    };
    let w_info = find(&v, b"\x01\x00\x00\x00\x00\x00\x00\x00w"); // name length 1 + "w"
    let b_info = find(&v, b"\x01\x00\x00\x00\x00\x00\x00\x00b\x01");
    let w_type = w_info + 9 + 4 + 16;
    let b_off = b_info + 9 + 4 + 8 + 4;

    c.push(("empty.gguf", vec![], "magic"));
    c.push(("short-magic.gguf", b"GG".to_vec(), "magic"));
    c.push(("wrong-magic.gguf", mutate(&|b| b[0] = b'X'), "magic"));
    c.push(("version-1.gguf", mutate(&|b| put_u32(b, 4, 1)), "version"));
    c.push(("version-4.gguf", mutate(&|b| put_u32(b, 4, 4)), "version"));
    c.push(("version-big-endian.gguf", mutate(&|b| put_u32(b, 4, 0x0300_0000)), "endianness"));
    c.push(("n-tensors-2e60.gguf", mutate(&|b| put_u64(b, 8, 1 << 60)), "n_tensors"));
    c.push(("n-kv-2e60.gguf", mutate(&|b| put_u64(b, 16, 1 << 60)), "n_kv"));
    c.push(("n-tensors-negative.gguf", mutate(&|b| put_u64(b, 8, u64::MAX)), "n_tensors"));
    c.push(("truncated-counts.gguf", v[..40].to_vec(), "n_tensors"));
    c.push((
        "truncated-string.gguf",
        gguf_raw(0, &kv(b"general.name", 8, &[5, 0, 0, 0, 0, 0, 0, 0, b'a']), 1, &[]),
        "general.name",
    ));
    c.push(("key-length-2e62.gguf", mutate(&|b| put_u64(b, 24, 1 << 62)), "metadata[0].key"));
    c.push(("key-not-utf8.gguf", mutate(&|b| b[32] = 0xff), "metadata[0].key"));
    c.push(("key-empty.gguf", gguf_raw(0, &kv(b"", 4, &1u32.to_le_bytes()), 1, &[]), "metadata[0].key"));
    let dup = [kv(b"a.b", 4, &1u32.to_le_bytes()), kv(b"a.b", 4, &2u32.to_le_bytes())].concat();
    c.push(("key-duplicate.gguf", gguf_raw(0, &dup, 2, &[]), "a.b"));
    c.push(("value-type-13.gguf", gguf_raw(0, &kv(b"k", 13, &[0; 8]), 1, &[]), "value type"));
    let arr = [8u32.to_le_bytes().to_vec(), (1u64 << 60).to_le_bytes().to_vec()].concat();
    c.push(("array-count-2e60.gguf", gguf_raw(0, &kv(b"tokens", 9, &arr), 1, &[]), "tokens"));
    c.push(("bool-2.gguf", gguf_raw(0, &kv(b"flag", 7, &[2]), 1, &[]), "flag"));
    c.push((
        "alignment-3.gguf",
        gguf_raw(0, &kv(b"general.alignment", 4, &3u32.to_le_bytes()), 1, &[]),
        "general.alignment",
    ));
    c.push((
        "alignment-u64.gguf",
        gguf_raw(0, &kv(b"general.alignment", 10, &32u64.to_le_bytes()), 1, &[]),
        "general.alignment",
    ));
    let mut nest = Vec::new();
    for _ in 0..10 {
        nest.extend_from_slice(&9u32.to_le_bytes());
        nest.extend_from_slice(&1u64.to_le_bytes());
    }
    nest.extend_from_slice(&0u32.to_le_bytes());
    nest.extend_from_slice(&0u64.to_le_bytes());
    c.push(("arrays-nested-10-deep.gguf", gguf_raw(0, &kv(b"deep", 9, &nest[4..]), 1, &[0; 64]), "deep"));
    let two = [tinfo(b"x", &[4], 0, 0), tinfo(b"x", &[4], 0, 32)].concat();
    c.push(("tensor-duplicate-name.gguf", gguf_raw(2, &[], 0, &[two, vec![0; 128]].concat()), "duplicate tensor name"));
    c.push((
        "tensor-5-dims.gguf",
        gguf_raw(1, &[], 0, &[tinfo(b"x", &[1, 1, 1, 1, 1], 0, 0), vec![0; 64]].concat()),
        "n_dims",
    ));
    c.push((
        "tensor-dims-overflow.gguf",
        gguf_raw(1, &[], 0, &[tinfo(b"x", &[1 << 40, 1 << 40], 0, 0), vec![0; 64]].concat()),
        "ne",
    ));
    c.push((
        "tensor-dim-negative.gguf",
        gguf_raw(1, &[], 0, &[tinfo(b"x", &[u64::MAX], 0, 0), vec![0; 64]].concat()),
        "ne[0]",
    ));
    c.push(("tensor-removed-type-4.gguf", mutate(&|b| put_u32(b, w_type, 4)), "tensor \"w\".type"));
    c.push(("tensor-type-99.gguf", mutate(&|b| put_u32(b, w_type, 99)), "tensor \"w\".type"));
    c.push((
        "tensor-not-whole-blocks.gguf",
        mutate(&|b| put_u32(b, w_type, GgmlType::Q4_0.id())),
        "tensor \"w\".ne[0]",
    ));
    c.push(("tensor-offset-past-end.gguf", mutate(&|b| put_u64(b, b_off, 1 << 20)), "tensor \"b\".offset"));
    c.push(("tensor-offset-misaligned.gguf", mutate(&|b| put_u64(b, b_off, 4)), "tensor \"b\".offset"));
    c.push(("tensor-overlap.gguf", mutate(&|b| put_u64(b, b_off, 0)), "overlaps"));
    c.push(("data-truncated.gguf", v[..v.len() - 20].to_vec(), "tensor \"b\".offset"));
    let long = vec![b'n'; 64];
    c.push((
        "tensor-name-64-bytes.gguf",
        gguf_raw(1, &[], 0, &[tinfo(&long, &[4], 0, 0), vec![0; 64]].concat()),
        "tensor_info[0].name",
    ));
    c.push((
        "tensor-name-not-utf8.gguf",
        gguf_raw(1, &[], 0, &[tinfo(b"\xc3\x28", &[4], 0, 0), vec![0; 64]].concat()),
        "tensor_info[0].name",
    ));

    c.push(("tiny.safetensors", vec![1, 2, 3], "header length"));
    let mut lie = st(r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#, 8);
    lie[0] = 200;
    c.push(("header-length-lies.safetensors", lie, "header length"));
    let mut huge = st("{}", 0);
    put_u64(&mut huge, 0, 1 << 63);
    c.push(("header-length-2e63.safetensors", huge, "header length"));
    c.push(("header-not-json.safetensors", st("{\"a\": [", 0), "header"));
    c.push(("header-array.safetensors", st("[1, 2]", 0), "header"));
    c.push((
        "header-not-utf8.safetensors",
        [8u64.to_le_bytes().to_vec(), b"{\"\xff\":1} ".to_vec()].concat(),
        "header",
    ));
    c.push((
        "dtype-unknown.safetensors",
        st(r#"{"a":{"dtype":"F17","shape":[2],"data_offsets":[0,8]}}"#, 8),
        "a.dtype",
    ));
    c.push((
        "dtype-size-lies.safetensors",
        st(r#"{"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,8]}}"#, 8),
        "a.data_offsets",
    ));
    c.push((
        "offsets-past-end.safetensors",
        st(r#"{"a":{"dtype":"U8","shape":[64],"data_offsets":[0,64]}}"#, 8),
        "a.data_offsets",
    ));
    c.push((
        "offsets-reversed.safetensors",
        st(r#"{"a":{"dtype":"U8","shape":[0],"data_offsets":[8,0]}}"#, 8),
        "a.data_offsets",
    ));
    c.push(("overlap.safetensors", st(r#"{"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},"b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}}"#, 8), "b.data_offsets"));
    c.push((
        "shape-negative.safetensors",
        st(r#"{"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,8]}}"#, 8),
        "a.shape",
    ));
    c.push((
        "shape-overflow.safetensors",
        st(r#"{"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}}"#, 8),
        "a.shape",
    ));
    c.push((
        "shape-zero-hides-overflow.safetensors",
        st(r#"{"a":{"dtype":"F64","shape":[4294967296,4294967296,0],"data_offsets":[0,0]}}"#, 8),
        "a.shape",
    ));
    c.push(("offsets-missing.safetensors", st(r#"{"a":{"dtype":"U8","shape":[8]}}"#, 8), "a.data_offsets"));
    c.push(("metadata-not-string.safetensors", st(r#"{"__metadata__":{"format":1}}"#, 0), "__metadata__.format"));
    c.push((
        "unknown-field.safetensors",
        st(r#"{"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8],"extra":1}}"#, 8),
        "a.extra",
    ));
    c
}

#[test]
fn every_malformed_file_is_refused_naming_file_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let cases = corpus();
    assert!(cases.len() >= 25, "the corpus has {} files", cases.len());
    let mut failures = Vec::new();
    for (name, bytes, field) in &cases {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        let loc = Location::local(&path);
        LARGEST.store(0, Ordering::SeqCst);
        ARMED.store(true, Ordering::SeqCst);
        let result = rt.block_on(TensorSource::open(&loc));
        ARMED.store(false, Ordering::SeqCst);
        let largest = LARGEST.load(Ordering::SeqCst);
        match result {
            Ok(_) => failures.push(format!("{name}: opened without error")),
            Err(e) => {
                let msg = e.to_string();
                if !msg.contains(path.to_str().unwrap()) || !msg.contains(field) {
                    failures.push(format!("{name}: error {msg:?} does not name the file and {field:?}"));
                }
            }
        }
        if largest > bytes.len().max(SMALL) {
            failures.push(format!("{name}: allocated {largest} bytes at once for a {}-byte file", bytes.len()));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_valid_base_file_opens() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("valid.gguf");
    std::fs::write(&path, valid_gguf()).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let src = rt.block_on(TensorSource::open(&Location::local(&path))).unwrap();
    let names: Vec<_> = src.tensors().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["w", "b"]);
    assert_eq!(src.tensors()[0].shape, [2, 4]);
}

/// The corpus is also the seed of the fuzz targets: `cargo test -p quantfarm-tensors --test malformed -- --ignored`
/// writes it to `fuzz/corpus/`.
#[test]
#[ignore = "writes the fuzz seed corpus into fuzz/corpus/; run by scripts/fuzz"]
fn write_fuzz_seed_corpus() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus");
    for (name, bytes, _) in corpus() {
        let target = if name.ends_with(".gguf") { "gguf_header" } else { "safetensors_header" };
        std::fs::create_dir_all(root.join(target)).unwrap();
        std::fs::write(root.join(target).join(name), bytes).unwrap();
    }
    std::fs::write(root.join("gguf_header/valid.gguf"), valid_gguf()).unwrap();
}

/// Every input a fuzzer once crashed on (`fuzz/regressions/TARGET-what`) now holds the target's property: an error
/// naming the file, or (GGUF) a header that re-encodes to itself.
#[test]
fn fuzz_regressions_hold() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/regressions");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let bytes = std::fs::read(&path).unwrap();
        if name.starts_with("gguf_header") {
            match quantfarm_tensors::gguf::GgufHeader::parse(&bytes, bytes.len() as u64, &name) {
                Err(e) => assert!(e.to_string().contains(&name), "{name}: {e}"),
                Ok(h) => {
                    let layout = h.layout().unwrap_or_else(|e| panic!("{name}: parsed but does not re-encode: {e}"));
                    let again =
                        quantfarm_tensors::gguf::GgufHeader::parse(&layout.header, layout.file_len, &name).unwrap();
                    assert_eq!(again.layout().unwrap().header, layout.header, "{name}");
                }
            }
        } else {
            let err = quantfarm_tensors::safetensors::StHeader::parse_file(&bytes, &name).expect_err(&name);
            assert!(err.to_string().contains(&name), "{name}: {err}");
        }
        seen += 1;
    }
    assert!(seen >= 2, "regression files missing from {}", dir.display());
}
