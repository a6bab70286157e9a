use quantfarm_ggml::FileType;

use super::*;
use crate::spec::{Level, MlxRung, Peer, RecipeName, VllmRung};

fn q(f: FileType) -> Level {
    Level::File(f)
}

#[test]
fn keys_round_trip() {
    let examples: Vec<TaskKey> = vec![
        TaskKey::PLAN,
        TaskKey::REPORT,
        Gguf { shard: 3 }.into(),
        Noop { n: 7 }.into(),
        Quantize { level: q(FileType::Q4_K_M), shard: 0 }.into(),
        Quantize { level: Level::Recipe(RecipeName::new("Q4_K_XL").unwrap()), shard: 1 }.into(),
        Verify::Gguf { shard: 1 }.into(),
        Verify::Quantize { level: q(FileType::Q8_0), shard: 2 }.into(),
        Verify::Merge { file: 0 }.into(),
        Verify::MergeSide.into(),
        Verify::Mlx { rung: MlxRung::Bits(8) }.into(),
        Merge::Plan.into(),
        Merge::File { file: 1 }.into(),
        Merge::Side.into(),
        MergeCheck { part: CheckPart::Lora }.into(),
        MergeCheck { part: CheckPart::Merged }.into(),
        Mlx { rung: MlxRung::Bits(4) }.into(),
        Vllm { rung: VllmRung::Fp8Dynamic }.into(),
        Vllm { rung: VllmRung::W4A16 }.into(),
        Verify::Vllm { rung: VllmRung::W4A16 }.into(),
        Kld::Measure { target: EvalTarget::Vllm(VllmRung::Fp8Dynamic), group: 1 }.into(),
        Probe { subject: Subject::Model(EvalTarget::Vllm(VllmRung::W4A16)) }.into(),
        Imatrix::Plan.into(),
        Imatrix::Group { group: 4 }.into(),
        Imatrix::Merge.into(),
        Search::Plan.into(),
        Search::Lookup.into(),
        Search::Base { group: 1 }.into(),
        Search::Probe { group: 12, variant: 3 }.into(),
        Search::Write.into(),
        Kld::Plan.into(),
        Kld::Measure { target: EvalTarget::Quant(q(FileType::Q4_K_M)), group: 3 }.into(),
        Kld::Measure { target: EvalTarget::Mlx(MlxRung::Bits(4)), group: 0 }.into(),
        Kld::Measure { target: EvalTarget::Quant(Level::Recipe(RecipeName::new("UD-IQ2").unwrap())), group: 0 }.into(),
        KldBase { group: 2 }.into(),
        Greedy { subject: Subject::Reference, share: 1 }.into(),
        Greedy { subject: Subject::Model(EvalTarget::Quant(q(FileType::Q8_0))), share: 0 }.into(),
        Greedy { subject: Subject::Adapter, share: 0 }.into(),
        Greedy { subject: Subject::MergedF32, share: 1 }.into(),
        Probe { subject: Subject::Model(EvalTarget::Mlx(MlxRung::Bits(8))) }.into(),
        Probe { subject: Subject::Reference }.into(),
        Choice { subject: Subject::Reference }.into(),
        ThirdParty { index: 1, group: 3 }.into(),
        Choice { subject: Subject::Model(EvalTarget::Quant(q(FileType::Q4_0))) }.into(),
        PeerRun::Base { peer: Peer::LlamaPerplexity }.into(),
        PeerRun::Kld { peer: Peer::LlamaPerplexity, level: q(FileType::Q6_K) }.into(),
        MlxLm::Greedy { subject: MlxSubject::Bf16, share: 1 }.into(),
        MlxLm::Greedy { subject: MlxSubject::Rung { rung: MlxRung::Bits(4) }, share: 0 }.into(),
        MlxLm::Kld { subject: MlxSubject::Rung { rung: MlxRung::Bits(8) }, group: 2 }.into(),
        MlxLm::Kld { subject: MlxSubject::Bf16, group: 0 }.into(),
        MlxLm::Probe { subject: MlxSubject::Rung { rung: MlxRung::Bits(6) } }.into(),
        MlxLm::Probe { subject: MlxSubject::Bf16 }.into(),
        Transformers::Greedy { subject: TfSubject::Bf16, share: 0 }.into(),
        Transformers::Greedy { subject: TfSubject::Adapter, share: 1 }.into(),
        Transformers::Greedy { subject: TfSubject::MergedF32, share: 0 }.into(),
        Transformers::Probe { subject: TfSubject::Bf16 }.into(),
        Transformers::Probe { subject: TfSubject::Rung { rung: VllmRung::Fp8Dynamic, weight_only: false } }.into(),
        Transformers::Greedy { subject: TfSubject::Rung { rung: VllmRung::W4A16, weight_only: false }, share: 1 }
            .into(),
        Transformers::Kld { subject: TfSubject::Rung { rung: VllmRung::Fp8Dynamic, weight_only: true }, group: 1 }
            .into(),
        Transformers::Kld { subject: TfSubject::Rung { rung: VllmRung::Fp8Dynamic, weight_only: false }, group: 0 }
            .into(),
    ];
    let mut families = std::collections::BTreeSet::new();
    let mut ids = std::collections::BTreeSet::new();
    for k in &examples {
        let id = k.to_string();
        assert_eq!(TaskKey::parse(&id).as_ref(), Some(k), "{id}");
        // The family is the id's first segment, by the table rather than by splitting the string.
        assert_eq!(id.split('/').next(), Some(k.family()), "{id}");
        assert!(ids.insert(id.clone()), "two keys print as {id}");
        families.insert(k.family());
    }
    // `parse` matches strings, which the compiler cannot check against the keys: every family of the table has an
    // example above, so a new one fails this test until it has one.
    assert_eq!(families, FAMILIES.iter().copied().collect(), "every family has an example");
    assert_eq!(TaskKey::parse("quantize/q8_0/1"), None);
    assert_eq!(TaskKey::parse("gguf/x"), None);
    assert_eq!(TaskKey::parse("gguf/1/2"), None);
    assert_eq!(TaskKey::parse("plan/1"), None);
    assert_eq!(TaskKey::parse("search/probe/1"), None);
    assert_eq!(TaskKey::parse("nothing/1"), None);
    assert_eq!(TaskKey::parse("mlx-lm/kld/Q8_0/0"), None, "mlx-lm runs BF16 and MLX rungs only");
    assert_eq!(TaskKey::parse("mlx-lm/kld/vLLM-W4A16/0"), None, "mlx-lm runs BF16 and MLX rungs only");
    assert_eq!(TaskKey::parse("vllm/fp8_dynamic"), None);
    // W4A16 quantizes no activations: it has no weight-only twin.
    assert_eq!(TaskKey::parse("transformers/kld/vLLM-W4A16-weight-only/0"), None);
    assert_eq!(TaskKey::parse("transformers/kld/Q8_0/0"), None, "transformers runs BF16 and vLLM rungs only");
    // The merge check's pair is compared by its greedy continuations only.
    assert_eq!(TaskKey::parse("transformers/kld/adapter/0"), None);
    assert_eq!(TaskKey::parse("transformers/kld/merged-f32/0"), None);
    assert_eq!(TaskKey::parse("transformers/probe/adapter"), None);
    assert_eq!(TaskKey::parse("transformers/probe/vLLM-FP8_DYNAMIC-weight-only"), None, "probes run as saved");
}

/// Every vLLM rung has a default KLD limit (a rung without one could never pass its `kld` gate).
#[test]
fn every_vllm_rung_has_a_default_kld_limit() {
    for r in VllmRung::ALL {
        let name = EvalTarget::Vllm(r).to_string();
        assert!(crate::gates::default_kld_max(&name).is_some(), "no default limit for {name}");
        assert_eq!(EvalTarget::parse(&name), Some(EvalTarget::Vllm(r)));
    }
}

#[test]
fn a_task_of_one_sort_is_a_family_s_variant() {
    let a: TaskKey = Verify::Gguf { shard: 0 }.into();
    let b: TaskKey = Verify::Gguf { shard: 1 }.into();
    let c: TaskKey = Verify::Quantize { level: q(FileType::Q8_0), shard: 0 }.into();
    let d: TaskKey = Gguf { shard: 0 }.into();
    assert_eq!(a.sort(), b.sort());
    assert_ne!(a.sort(), c.sort());
    assert_ne!(a.sort(), d.sort());
}
