//! Which tasks a release starts with, and what each finished plan adds (the conversions and quantizations after
//! the source's plan, the merge after the merge plan, the chunk tasks after an evaluation text's plan), with the
//! critical-path priorities the scheduler orders ready tasks by.

use std::collections::HashMap;

use quantfarm_proto::{self as pb, task_result};

use super::lookup::{computes_imatrix, merge_plan_of, plan_of};
use super::subjects::{CheckPart, EvalTarget, MlxSubject, Subject};
use super::{
    Gguf, Greedy, Imatrix, Kld, KldBase, Merge, MergeCheck, Mlx, MlxLm, Noop, PeerRun, Probe, Quantize, Results,
    TaskDef, TaskKey, Verify,
};
use crate::graph::Ctx;

/// The tasks a release starts with: the merge plan when there is an adapter, else planning (and the scheduler's
/// benchmark no-ops).
pub fn initial(ctx: &Ctx) -> Vec<TaskDef> {
    let mut out = Vec::new();
    if !ctx.adapter.is_empty() {
        out.push(TaskDef { key: TaskKey::Merge(Merge::Plan), deps: vec![], cost: 1 });
    } else if ctx.spec.converts() {
        out.push(TaskDef { key: TaskKey::PLAN, deps: vec![], cost: 1 });
    }
    if let Some(noop) = &ctx.spec.outputs.noop {
        for n in 0..noop.tasks {
            out.push(TaskDef { key: TaskKey::Noop(Noop { n }), deps: vec![], cost: noop.sleep_ms as u64 + 1 });
        }
    }
    if !ctx.spec.converts() {
        let deps = out.iter().map(|t| t.key.clone()).collect();
        out.push(TaskDef { key: TaskKey::REPORT, deps, cost: 1 });
    }
    out
}

/// After the merge plan: one merge task per safetensors file and one for the side files, each with its
/// verification, then planning the conversions from the merged checkpoint; and, with prompts to check it on, the
/// merge check (link 1): its three GGUF inputs, then per prompt share the base with the adapter at run time and the
/// merge compared with it.
fn expand_merge(ctx: &Ctx, mp: &pb::MergePlanResult) -> Vec<TaskDef> {
    let mut out = Vec::new();
    let mut merges = Vec::new();
    for (file, bytes) in (0..mp.files.len() as u32).zip(mp.file_bytes.iter().copied().chain(std::iter::repeat(1))) {
        let m = TaskKey::Merge(Merge::File { file });
        out.push(TaskDef { key: m.clone(), deps: vec![TaskKey::Merge(Merge::Plan)], cost: bytes });
        out.push(TaskDef { key: TaskKey::Verify(Verify::Merge { file }), deps: vec![m.clone()], cost: bytes });
        merges.push(m);
    }
    out.push(TaskDef { key: TaskKey::Merge(Merge::Side), deps: vec![TaskKey::Merge(Merge::Plan)], cost: 1 });
    out.push(TaskDef { key: TaskKey::Verify(Verify::MergeSide), deps: vec![TaskKey::Merge(Merge::Side)], cost: 1 });
    merges.push(TaskKey::Merge(Merge::Side));
    out.push(TaskDef { key: TaskKey::PLAN, deps: merges, cost: 1 });
    if let Some(e) = merge_checked(ctx, mp) {
        // F32 is twice the bytes of a bf16 base.
        let cost = 2 * mp.file_bytes.iter().sum::<u64>().max(1);
        for part in CheckPart::ALL {
            out.push(TaskDef { key: TaskKey::MergeCheck(MergeCheck { part }), deps: vec![TaskKey::Merge(Merge::Plan)], cost });
        }
        let part = |part| TaskKey::MergeCheck(MergeCheck { part });
        for share in 0..e.prompt_shares {
            let reference = TaskKey::Greedy(Greedy { subject: Subject::Adapter, share });
            out.push(TaskDef {
                key: reference.clone(),
                deps: vec![part(CheckPart::Lora), part(CheckPart::Base)],
                cost,
            });
            let key = TaskKey::Greedy(Greedy { subject: Subject::MergedF32, share });
            out.push(TaskDef { key, deps: vec![reference, part(CheckPart::Merged)], cost });
        }
    }
    out
}

/// The evaluation settings when the release checks its merge: it has an adapter, prompts to check it on, and the
/// adapter is one llama.cpp can apply at run time — not an embedding LoRA on a base with tied embeddings (llama.cpp
/// would apply it to the output layer too; the merge unties them, `mp.untied`): then the report says why the check
/// was not made and the `merge` gate fails with that reason.
fn merge_checked<'a>(ctx: &Ctx<'a>, mp: &pb::MergePlanResult) -> Option<&'a crate::spec::Evaluation> {
    let e = ctx.spec.evaluation.as_ref()?;
    (!ctx.adapter.is_empty() && e.prompts.is_some() && !mp.untied).then_some(e)
}

/// The merge check's measurements, which the report waits for.
fn merge_check_measured(ctx: &Ctx, mp: &pb::MergePlanResult) -> Vec<TaskKey> {
    let shares = merge_checked(ctx, mp).map_or(0, |e| e.prompt_shares);
    (0..shares).map(|share| TaskKey::Greedy(Greedy { subject: Subject::MergedF32, share })).collect()
}

/// Everything after planning, from the plan's inventory: per split file a conversion and its verification, per
/// (level, split file) a quantization and its verification, per MLX bit width a checkpoint and its verification,
/// then the report over all of them (and over the merge's verifications, when there was one).
fn expand(ctx: &Ctx, plan: &pb::PlanResult, results: &Results) -> Vec<TaskDef> {
    let shard_bytes: Vec<u64> = plan
        .shards
        .iter()
        .map(|r| plan.tensors[r.start as usize..r.end as usize].iter().map(|t| t.bytes).sum())
        .collect();
    let n = if ctx.spec.outputs.gguf.is_some() { shard_bytes.len() as u32 } else { 0 };
    let mut out = Vec::new();
    let mut verifies = Vec::new();
    if let Ok(mp) = merge_plan_of(results) {
        verifies.extend((0..mp.files.len() as u32).map(|file| TaskKey::Verify(Verify::Merge { file })));
        verifies.push(TaskKey::Verify(Verify::MergeSide));
        verifies.extend(merge_check_measured(ctx, mp));
    }
    for &bits in ctx.spec.mlx_bits() {
        let bytes = plan.source_bytes;
        out.push(TaskDef { key: TaskKey::Mlx(Mlx { bits }), deps: vec![TaskKey::PLAN], cost: bytes });
        out.push(TaskDef { key: TaskKey::Verify(Verify::Mlx { bits }), deps: vec![TaskKey::Mlx(Mlx { bits })], cost: bytes });
        verifies.push(TaskKey::Verify(Verify::Mlx { bits }));
    }
    let ggufs: Vec<TaskKey> = (0..n).map(|shard| TaskKey::Gguf(Gguf { shard })).collect();
    for shard in 0..n {
        let bytes = shard_bytes[shard as usize];
        out.push(TaskDef { key: TaskKey::Gguf(Gguf { shard }), deps: vec![TaskKey::PLAN], cost: bytes });
        let v = TaskKey::Verify(Verify::Gguf { shard });
        out.push(TaskDef { key: v.clone(), deps: vec![TaskKey::Gguf(Gguf { shard })], cost: bytes });
        verifies.push(v);
    }
    let mut quant_deps = ggufs.clone();
    if computes_imatrix(ctx) && n > 0 {
        // The merge waits for the plan; the plan's result adds the chunk groups before it.
        out.push(TaskDef { key: TaskKey::Imatrix(Imatrix::Plan), deps: ggufs.clone(), cost: plan.source_bytes });
        out.push(TaskDef { key: TaskKey::Imatrix(Imatrix::Merge), deps: vec![TaskKey::Imatrix(Imatrix::Plan)], cost: 1 });
        quant_deps.push(TaskKey::Imatrix(Imatrix::Merge));
    }
    for level in ctx.spec.quants() {
        for shard in 0..n {
            let bytes = shard_bytes[shard as usize] * 2;
            let q = TaskKey::Quantize(Quantize { level: level.level(), shard });
            out.push(TaskDef { key: q.clone(), deps: quant_deps.clone(), cost: bytes });
            let v = TaskKey::Verify(Verify::Quantize { level: level.level(), shard });
            out.push(TaskDef { key: v.clone(), deps: vec![q], cost: bytes });
            verifies.push(v);
        }
    }
    if let (Some(e), true) = (&ctx.spec.evaluation, n > 0) {
        let cost = plan.source_bytes;
        if e.text.is_some() {
            // The report waits for the KL-divergence plan; the plan's result adds the chunk tasks before it.
            out.push(TaskDef { key: TaskKey::Kld(Kld::Plan), deps: ggufs.clone(), cost });
            verifies.push(TaskKey::Kld(Kld::Plan));
        }
        let targets = eval_targets(ctx);
        let mlx_lm = mlx_lm_subjects(ctx);
        // The reference's continuations are only run for models to compare with them.
        if e.prompts.is_some() && !(targets.is_empty() && mlx_lm.is_empty()) {
            for share in 0..e.prompt_shares {
                let reference = TaskKey::Greedy(Greedy { subject: Subject::Reference, share });
                out.push(TaskDef { key: reference.clone(), deps: ggufs.clone(), cost });
                for &t in &targets {
                    let key = TaskKey::Greedy(Greedy { subject: Subject::Model(t), share });
                    let mut deps = vec![reference.clone()];
                    deps.extend(model_tasks(t, n));
                    out.push(TaskDef { key: key.clone(), deps, cost });
                    verifies.push(key);
                }
                // In mlx-lm: the bf16 weights against llama.cpp's reference, each MLX rung against mlx-lm's bf16.
                for &subject in &mlx_lm {
                    let key = TaskKey::MlxLm(MlxLm::Greedy { subject, share });
                    let deps = match subject {
                        MlxSubject::Bf16 => vec![reference.clone()],
                        MlxSubject::Rung { bits } => {
                            vec![TaskKey::MlxLm(MlxLm::Greedy { subject: MlxSubject::Bf16, share }), TaskKey::Mlx(Mlx { bits })]
                        }
                    };
                    out.push(TaskDef { key: key.clone(), deps, cost });
                    verifies.push(key);
                }
            }
        }
        for &peer in &e.peers {
            // After the KL-divergence plan: its text checksum names the peer's base file.
            let base = TaskKey::Peer(PeerRun::Base { peer });
            out.push(TaskDef { key: base.clone(), deps: vec![TaskKey::Kld(Kld::Plan)], cost });
            for level in ctx.spec.quants().iter().map(|l| l.level()).filter(|l| ctx.spec.measures(&l.to_string())) {
                let key = TaskKey::Peer(PeerRun::Kld { peer, level });
                let mut deps = vec![base.clone()];
                deps.extend(model_tasks(EvalTarget::Quant(level), n));
                out.push(TaskDef { key: key.clone(), deps, cost });
                verifies.push(key);
            }
        }
        for &subject in mlx_lm.iter().filter(|_| e.probes.is_some()) {
            let key = TaskKey::MlxLm(MlxLm::Probe { subject });
            let deps = match subject {
                MlxSubject::Bf16 => vec![TaskKey::PLAN],
                MlxSubject::Rung { bits } => vec![TaskKey::Mlx(Mlx { bits })],
            };
            out.push(TaskDef { key: key.clone(), deps, cost });
            verifies.push(key);
        }
        if e.probes.is_some() {
            let reference = TaskKey::Probe(Probe { subject: Subject::Reference });
            out.push(TaskDef { key: reference.clone(), deps: ggufs.clone(), cost });
            verifies.push(reference);
            for &t in &targets {
                let key = TaskKey::Probe(Probe { subject: Subject::Model(t) });
                out.push(TaskDef { key: key.clone(), deps: model_tasks(t, n), cost });
                verifies.push(key);
            }
        }
    }
    if let Some(noop) = &ctx.spec.outputs.noop {
        verifies.extend((0..noop.tasks).map(|n| TaskKey::Noop(Noop { n })));
    }
    out.push(TaskDef { key: TaskKey::REPORT, deps: verifies, cost: 1 });
    out
}

/// The tasks that make a measured model (every split file of a quant level, or the MLX checkpoint).
fn model_tasks(target: EvalTarget, n_shards: u32) -> Vec<TaskKey> {
    match target {
        EvalTarget::Quant(level) => (0..n_shards).map(|shard| TaskKey::Quantize(Quantize { level, shard })).collect(),
        EvalTarget::Mlx { bits } => vec![TaskKey::Mlx(Mlx { bits })],
    }
}

/// The models measured against the reference: every GGUF quant level, then every MLX checkpoint, less those the
/// release skips (`evaluation.skip`).
pub fn eval_targets(ctx: &Ctx) -> Vec<EvalTarget> {
    let quants = ctx.spec.quants().iter().map(|q| EvalTarget::Quant(q.level()));
    quants
        .chain(ctx.spec.mlx_bits().iter().map(|&bits| EvalTarget::Mlx { bits }))
        .filter(|t| ctx.spec.measures(&t.to_string()))
        .collect()
}

/// What the release runs in mlx-lm: the bf16 weights, then every measured MLX rung (none when it runs nothing
/// there, `ReleaseSpec::runs_mlx_lm`).
pub fn mlx_lm_subjects(ctx: &Ctx) -> Vec<MlxSubject> {
    if !ctx.spec.runs_mlx_lm() {
        return Vec::new();
    }
    let rungs =
        ctx.spec.mlx_bits().iter().copied().filter(|&bits| ctx.spec.measures(&EvalTarget::Mlx { bits }.to_string()));
    std::iter::once(MlxSubject::Bf16).chain(rungs.map(|bits| MlxSubject::Rung { bits })).collect()
}

/// After the imatrix plan: one task per chunk group of the calibration text. Returns them, and the merge's new
/// dependencies.
fn expand_imatrix(kp: &pb::KldPlanResult, results: &Results) -> (Vec<TaskDef>, Vec<TaskKey>) {
    let cost = plan_of(results).map_or(1, |p| p.source_bytes);
    let groups: Vec<TaskKey> =
        (0..kp.n_chunks.div_ceil(kp.n_seq.max(1))).map(|group| TaskKey::Imatrix(Imatrix::Group { group })).collect();
    let defs = groups.iter().map(|k| TaskDef { key: k.clone(), deps: vec![TaskKey::Imatrix(Imatrix::Plan)], cost }).collect();
    (defs, groups)
}

/// After the KL-divergence plan: per chunk group the reference's base logits, and per (model, group) its
/// statistics. Returns the tasks and the ones the report must wait for.
fn expand_kld(ctx: &Ctx, kp: &pb::KldPlanResult, results: &Results) -> (Vec<TaskDef>, Vec<TaskKey>) {
    let cost = plan_of(results).map_or(1, |p| p.source_bytes);
    let n_shards = plan_of(results).map_or(0, |p| p.shards.len() as u32);
    let groups = kp.n_chunks.div_ceil(kp.n_seq.max(1));
    let mut out = Vec::new();
    let mut measured = Vec::new();
    for group in 0..groups {
        out.push(TaskDef { key: TaskKey::KldBase(KldBase { group }), deps: vec![TaskKey::Kld(Kld::Plan)], cost });
    }
    for target in eval_targets(ctx) {
        let model = model_tasks(target, n_shards);
        for group in 0..groups {
            let key = TaskKey::Kld(Kld::Measure { target, group });
            let mut deps = vec![TaskKey::KldBase(KldBase { group })];
            deps.extend(model.iter().cloned());
            out.push(TaskDef { key: key.clone(), deps, cost });
            measured.push(key);
        }
    }
    for subject in mlx_lm_subjects(ctx) {
        for group in 0..groups {
            let key = TaskKey::MlxLm(MlxLm::Kld { subject, group });
            let mut deps = vec![TaskKey::KldBase(KldBase { group })];
            if let MlxSubject::Rung { bits } = subject {
                deps.push(TaskKey::Mlx(Mlx { bits }));
            }
            out.push(TaskDef { key: key.clone(), deps, cost });
            measured.push(key);
        }
    }
    (out, measured)
}

/// What a finished task adds to its release's graph: new tasks, and existing tasks that now also wait for some of
/// them (added before the finished task's dependents are released).
#[derive(Debug, Default)]
pub struct Growth {
    pub tasks: Vec<TaskDef>,
    pub waits: Vec<(TaskKey, Vec<TaskKey>)>,
}

impl Growth {
    fn tasks(tasks: Vec<TaskDef>) -> Growth {
        Growth { tasks, waits: Vec::new() }
    }
}

/// What task `key`'s `result` adds: a plan's result expands the graph, every other result adds nothing. An error
/// says why the result cannot be expanded; the release fails with it. `results` holds the finished tasks' results,
/// this one's included.
pub fn grows(ctx: &Ctx, key: &TaskKey, result: &pb::TaskResult, results: &Results) -> Result<Growth, String> {
    use task_result::Kind as K;
    let Some(kind) = &result.kind else { return Ok(Growth::default()) };
    match kind {
        K::MergePlan(mp) => {
            if mp.files.is_empty() {
                return Err("merge plan: the base has no safetensors files".into());
            }
            Ok(Growth::tasks(expand_merge(ctx, mp)))
        }
        K::Plan(plan) => {
            check_plan(plan).map_err(|e| format!("plan: {e}"))?;
            Ok(Growth::tasks(expand(ctx, plan, results)))
        }
        // The same plan message counts the chunks of the evaluation text and of the imatrix's calibration text.
        K::KldPlan(kp) if *key == TaskKey::Imatrix(Imatrix::Plan) => {
            if kp.n_chunks == 0 || kp.n_seq == 0 {
                return Err("imatrix/plan: the calibration text has no whole chunk".into());
            }
            let (tasks, parts) = expand_imatrix(kp, results);
            // The merge now waits for every part.
            Ok(Growth { tasks, waits: vec![(TaskKey::Imatrix(Imatrix::Merge), parts)] })
        }
        K::KldPlan(kp) => {
            if kp.n_chunks == 0 || kp.n_seq == 0 {
                return Err("kld/plan: the evaluation text has no whole chunk".into());
            }
            let (tasks, measured) = expand_kld(ctx, kp, results);
            // The report now waits for every chunk's figures too.
            Ok(Growth { tasks, waits: vec![(TaskKey::REPORT, measured)] })
        }
        K::Artifact(_) | K::Verify(_) | K::Noop(_) | K::Kld(_) | K::Greedy(_) | K::Probe(_) | K::PeerKld(_) => {
            Ok(Growth::default())
        }
    }
}

/// A plan's split ranges cover its tensors in order, each file holding at least one.
fn check_plan(p: &pb::PlanResult) -> Result<(), String> {
    if p.shards.is_empty() || p.tensors.is_empty() {
        return Err("the source has no tensors".into());
    }
    let mut next = 0u32;
    for s in &p.shards {
        if s.start != next || s.end <= s.start || s.end as usize > p.tensors.len() {
            return Err("the split ranges do not cover the tensors in order".into());
        }
        next = s.end;
    }
    if next as usize != p.tensors.len() {
        return Err("the split ranges do not cover every tensor".into());
    }
    if p.shards.len() > 99_999 {
        return Err("more than 99999 split files".into());
    }
    Ok(())
}

/// Critical-path priorities: a task's cost plus the most expensive chain of tasks that wait on it, so the
/// scheduler starts the work that gates the release's end first.
pub fn priorities(tasks: &[TaskDef]) -> HashMap<TaskKey, u64> {
    let mut dependents: HashMap<&TaskKey, Vec<&TaskDef>> = HashMap::new();
    for t in tasks {
        for d in &t.deps {
            dependents.entry(d).or_default().push(t);
        }
    }
    let mut memo: HashMap<TaskKey, u64> = HashMap::new();
    fn visit<'a>(
        t: &'a TaskDef,
        dependents: &HashMap<&TaskKey, Vec<&'a TaskDef>>,
        memo: &mut HashMap<TaskKey, u64>,
    ) -> u64 {
        if let Some(&p) = memo.get(&t.key) {
            return p;
        }
        let tail =
            dependents.get(&t.key).map_or(0, |ds| ds.iter().map(|d| visit(d, dependents, memo)).max().unwrap_or(0));
        let p = t.cost.saturating_add(tail);
        memo.insert(t.key.clone(), p);
        p
    }
    for t in tasks {
        visit(t, &dependents, &mut memo);
    }
    memo
}

#[cfg(test)]
mod tests {
    use quantfarm_ggml::FileType;
    use quantfarm_store::Location;

    use super::*;
    use crate::graph::EvalInputs;
    use crate::spec::ReleaseSpec;

    #[test]
    fn the_merge_check_is_not_scheduled_for_an_embedding_lora_on_a_tied_base() {
        let yaml =
            "name: r\nsource: ./m\nadapter: ./a\noutputs:\n  gguf: {quants: [Q8_0]}\nevaluation: {prompts: p.json}\n";
        let spec = ReleaseSpec::parse(yaml, "r.yaml").unwrap();
        let eval = EvalInputs { text: String::new(), prompts: "/p.json".into(), probes: String::new() };
        let store = Location::local("/tmp/store");
        let ctx = Ctx { spec: &spec, source: "/m", imatrix: "", adapter: "/a", eval: &eval, store: &store };
        let checks = |untied| {
            let mp = pb::MergePlanResult { files: vec!["model.safetensors".into()], untied, ..Default::default() };
            expand_merge(&ctx, &mp).iter().filter(|t| matches!(t.key, TaskKey::MergeCheck(MergeCheck { .. }))).count()
        };
        assert_eq!(checks(false), 3, "lora, base and merged GGUFs for the check");
        assert_eq!(checks(true), 0, "llama.cpp cannot apply the adapter at run time: no check to schedule");
    }

    #[test]
    fn critical_path_prefers_long_chains() {
        let t = |key: TaskKey, deps: Vec<TaskKey>, cost| TaskDef { key, deps, cost };
        let tasks = vec![
            t(TaskKey::Gguf(Gguf { shard: 0 }), vec![], 10),
            t(TaskKey::Gguf(Gguf { shard: 1 }), vec![], 10),
            t(TaskKey::Quantize(Quantize { level: FileType::Q8_0.into(), shard: 0 }), vec![TaskKey::Gguf(Gguf { shard: 0 })], 100),
            t(
                TaskKey::REPORT,
                vec![TaskKey::Quantize(Quantize { level: FileType::Q8_0.into(), shard: 0 }), TaskKey::Gguf(Gguf { shard: 1 })],
                1,
            ),
        ];
        let p = priorities(&tasks);
        assert_eq!(p[&TaskKey::REPORT], 1);
        assert_eq!(p[&TaskKey::Gguf(Gguf { shard: 0 })], 111);
        assert_eq!(p[&TaskKey::Gguf(Gguf { shard: 1 })], 11);
    }
}
