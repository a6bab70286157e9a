//! When tasks enter a release's graph: at its start, when one of its plans finishes (the merge plan, the source's
//! plan, the calibration text's and the evaluation text's), and, with `evaluation.stop`, when a rung's chunk group
//! is measured. At each such [`Stage`] every family adds its
//! own tasks ([`super::Family::grow`]), in the table's order, into a [`Grown`]: the tasks with what each waits for,
//! and the ones the report waits for. Also the critical-path priorities the scheduler orders ready tasks by.

use std::collections::HashMap;

use quantfarm_proto as pb;

use super::lookup::{merge_plan_of, plan_of};
use super::subjects::{EvalTarget, MlxSubject, TfSubject};
use super::{Mlx, Quantize, Results, TaskDef, TaskKey, Vllm};
use crate::graph::Ctx;
use crate::spec::{Evaluation, ReleaseSpec};

/// When tasks enter the graph.
#[derive(Clone, Copy, Debug)]
pub enum Stage<'a> {
    /// The release is submitted.
    Start,
    /// The merge plan finished: the merge's files are known.
    Merged(&'a pb::MergePlanResult),
    /// The source's (or the merge's) plan finished: its tensors and split files are known.
    Planned(&'a Inventory<'a>),
    /// The importance matrix's calibration text was tokenized: its chunk groups are known.
    Calibrated(&'a pb::KldPlanResult),
    /// The evaluation text was tokenized: its chunk groups are known.
    TextPlanned(&'a pb::KldPlanResult),
    /// One of a rung's chunk groups was measured (`evaluation.stop` looks at the rung again).
    Measured(EvalTarget),
    /// The search looked for stored sensitivities: found (nothing to measure) or not (the probes).
    Looked(bool),
    /// The search's sensitivities are known (stored): its candidate recipes can be measured.
    Sensed,
}

/// The plan's result as the families that follow it read it.
#[derive(Debug)]
pub struct Inventory<'a> {
    pub plan: &'a pb::PlanResult,
    /// The bytes of each split file's tensors.
    pub shard_bytes: Vec<u64>,
    /// The GGUF split files the release makes (0 without a GGUF output).
    pub n: u32,
}

impl<'a> Inventory<'a> {
    fn new(ctx: &Ctx, plan: &'a pb::PlanResult) -> Inventory<'a> {
        let shard_bytes: Vec<u64> = plan
            .shards
            .iter()
            .map(|r| plan.tensors[r.start as usize..r.end as usize].iter().map(|t| t.bytes).sum())
            .collect();
        let n = if ctx.spec.outputs.gguf.is_some() { shard_bytes.len() as u32 } else { 0 };
        Inventory { plan, shard_bytes, n }
    }

    /// The GGUF BF16's files: the reference every evaluation task reads.
    pub fn ggufs(&self) -> Vec<TaskKey> {
        (0..self.n).map(|shard| super::Gguf { shard }.into()).collect()
    }

    /// The evaluation settings, when the release evaluates (it has an evaluation and a GGUF reference).
    pub fn evaluated<'c>(&self, ctx: &Ctx<'c>) -> Option<&'c Evaluation> {
        ctx.spec.evaluation.as_ref().filter(|_| self.n > 0)
    }
}

/// What the families add at one stage.
#[derive(Debug, Default)]
pub struct Grown {
    pub tasks: Vec<TaskDef>,
    /// The new tasks the report waits for (their figures or verdicts are in it).
    pub measured: Vec<TaskKey>,
    /// Existing tasks that now also wait for some of the new ones.
    pub waits: Vec<(TaskKey, Vec<TaskKey>)>,
}

impl Grown {
    /// A new task.
    pub fn add(&mut self, key: impl Into<TaskKey>, deps: Vec<TaskKey>, cost: u64) {
        self.tasks.push(TaskDef { key: key.into(), deps, cost });
    }

    /// A new task the report waits for.
    pub fn add_measured(&mut self, key: impl Into<TaskKey>, deps: Vec<TaskKey>, cost: u64) {
        let key = key.into();
        self.measured.push(key.clone());
        self.tasks.push(TaskDef { key, deps, cost });
    }
}

/// What a finished task adds to its release's graph: new tasks, and existing tasks that now also wait for some of
/// them (added before the finished task's dependents are released).
#[derive(Debug, Default)]
pub struct Growth {
    pub tasks: Vec<TaskDef>,
    pub waits: Vec<(TaskKey, Vec<TaskKey>)>,
}

/// Every family's tasks at `stage`; what the report is to wait for and was not given to it at its making is added
/// to its waits.
fn grow(stage: Stage, ctx: &Ctx, results: &Results) -> Growth {
    let mut out = Grown::default();
    TaskKey::grow(stage, ctx, results, &mut out);
    let Grown { tasks, measured, mut waits } = out;
    if !measured.is_empty() {
        waits.push((TaskKey::REPORT, measured));
    }
    Growth { tasks, waits }
}

/// The tasks a release starts with: the merge plan when there is an adapter, else planning (and the scheduler's
/// benchmark no-ops).
pub fn initial(ctx: &Ctx) -> Vec<TaskDef> {
    grow(Stage::Start, ctx, &|_| None).tasks
}

/// What a finished task's result opens ([`super::Family::opens`]): a stage at which the families add tasks.
#[derive(Clone, Copy, Debug)]
pub enum Opens<'r> {
    Nothing,
    Merged(&'r pb::MergePlanResult),
    Planned(&'r pb::PlanResult),
    Calibrated(&'r pb::KldPlanResult),
    TextPlanned(&'r pb::KldPlanResult),
    Measured(EvalTarget),
    Looked(bool),
    Sensed,
}

/// What task `key`'s `result` adds: a plan's result expands the graph (the task's family says which stage it
/// opens), every other result adds nothing. An error says why the result cannot be expanded; the release fails with
/// it. `results` holds the finished tasks' results, this one's included.
pub fn grows(ctx: &Ctx, key: &TaskKey, result: &pb::TaskResult, results: &Results) -> Result<Growth, String> {
    let inventory;
    let stage = match key.opens(result)? {
        Opens::Nothing => return Ok(Growth::default()),
        Opens::Merged(mp) => Stage::Merged(mp),
        Opens::Planned(plan) => {
            inventory = Inventory::new(ctx, plan);
            Stage::Planned(&inventory)
        }
        Opens::Calibrated(kp) => Stage::Calibrated(kp),
        Opens::TextPlanned(kp) => Stage::TextPlanned(kp),
        Opens::Measured(target) => Stage::Measured(target),
        Opens::Looked(found) => Stage::Looked(found),
        Opens::Sensed => Stage::Sensed,
    };
    Ok(grow(stage, ctx, results))
}

/// A text plan's result, checked: it has a whole chunk (`what` names the plan and its text in the error).
pub(super) fn chunked<'r>(result: &'r pb::TaskResult, what: &str) -> Result<Option<&'r pb::KldPlanResult>, String> {
    match result.kld_plan() {
        Some(kp) if kp.n_chunks == 0 || kp.n_seq == 0 => Err(format!("{what} has no whole chunk")),
        other => Ok(other),
    }
}

/// The tasks that make a measured model (every split file of a quant level, or the MLX checkpoint).
pub(super) fn model_tasks(target: EvalTarget, n_shards: u32) -> Vec<TaskKey> {
    match target {
        EvalTarget::Quant(level) => (0..n_shards).map(|shard| Quantize { level, shard }.into()).collect(),
        EvalTarget::Mlx(rung) => vec![Mlx { rung }.into()],
        EvalTarget::Vllm(rung) => vec![Vllm { rung }.into()],
    }
}

/// The models measured against the reference: every GGUF quant level, then every MLX checkpoint and every vLLM one,
/// less those the release skips (`evaluation.skip`).
pub fn eval_targets(ctx: &Ctx) -> Vec<EvalTarget> {
    eval_targets_of(ctx.spec)
}

/// [`eval_targets`] of a spec.
pub fn eval_targets_of(spec: &ReleaseSpec) -> Vec<EvalTarget> {
    spec.levels().into_iter().filter(|&t| spec.measures(t)).collect()
}

/// What the release runs in mlx-lm: the bf16 weights, then every measured MLX rung (none when it runs nothing
/// there, `ReleaseSpec::runs_mlx_lm`).
pub(super) fn mlx_lm_subjects(ctx: &Ctx) -> Vec<MlxSubject> {
    if !ctx.spec.runs_mlx_lm() {
        return Vec::new();
    }
    let rungs = ctx.spec.mlx_rungs().into_iter().filter(|&rung| ctx.spec.measures(EvalTarget::Mlx(rung)));
    std::iter::once(MlxSubject::Bf16).chain(rungs.map(|rung| MlxSubject::Rung { rung })).collect()
}

/// What the release runs in transformers: the bf16 checkpoint, then every measured vLLM rung as saved, and weight-only
/// where its scheme quantizes activations (none when it runs nothing there, `ReleaseSpec::runs_transformers`).
pub(super) fn tf_subjects(ctx: &Ctx, results: &Results) -> Vec<TfSubject> {
    if !ctx.spec.runs_transformers() {
        return Vec::new();
    }
    let rungs = ctx.spec.vllm_rungs().iter().copied().filter(|&r| ctx.spec.measures(EvalTarget::Vllm(r)));
    let rungs = rungs.flat_map(|rung| {
        let weight_only = rung.quantizes_activations().then_some(TfSubject::Rung { rung, weight_only: true });
        std::iter::once(TfSubject::Rung { rung, weight_only: false }).chain(weight_only)
    });
    let pair =
        if merged(results).is_some_and(peft_adapter) { &[TfSubject::Adapter, TfSubject::MergedF32][..] } else { &[] };
    std::iter::once(TfSubject::Bf16).chain(pair.iter().copied()).chain(rungs).collect()
}

/// Whether the merged adapter is one PEFT applies at run time (link 1 in transformers): PEFT's own format, not
/// mlx-lm's.
pub fn peft_adapter(mp: &pb::MergePlanResult) -> bool {
    mp.format == quantfarm_tensors::merge::AdapterFormat::Peft.name()
}

/// Whether the greedy continuations run: the release has prompts and a model to compare (in llama.cpp or mlx-lm).
/// The reference's continuations are only run for models to compare with them.
pub(super) fn runs_greedy(ctx: &Ctx, e: &Evaluation) -> bool {
    e.prompts.is_some()
        && !(eval_targets(ctx).is_empty() && mlx_lm_subjects(ctx).is_empty() && !ctx.spec.runs_transformers())
}

/// The evaluation settings when the release checks its merge: it has an adapter, prompts to check it on, and the
/// adapter is one llama.cpp can apply at run time — not an embedding LoRA on a base with tied embeddings (llama.cpp
/// would apply it to the output layer too; the merge unties them, `mp.untied`): then the report says why the check
/// was not made and the `merge` gate fails with that reason.
pub(super) fn merge_checked<'a>(ctx: &Ctx<'a>, mp: &pb::MergePlanResult) -> Option<&'a Evaluation> {
    let e = ctx.spec.evaluation.as_ref()?;
    (ctx.adapter.is_some() && e.prompts.is_some() && !mp.untied).then_some(e)
}

/// The merge plan's files with their sizes (1 where the plan gives none).
pub(super) fn merge_files(mp: &pb::MergePlanResult) -> impl Iterator<Item = (u32, u64)> + '_ {
    (0..mp.files.len() as u32).zip(mp.file_bytes.iter().copied().chain(std::iter::repeat(1)))
}

/// The merge plan's result, if the release merged an adapter.
pub(super) fn merged<'a>(results: &Results<'a>) -> Option<&'a pb::MergePlanResult> {
    merge_plan_of(results).ok()
}

/// The cost of the tasks that read the whole model: the source's bytes (1 before the plan).
pub(super) fn model_cost(results: &Results) -> u64 {
    plan_of(results).map_or(1, |p| p.source_bytes)
}

/// A plan's split ranges cover its tensors in order, each file holding at least one.
pub(super) fn check_plan(p: &pb::PlanResult) -> Result<(), String> {
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
    use crate::kinds::{Gguf, MergeCheck};
    use crate::spec::ReleaseSpec;

    #[test]
    fn the_merge_check_is_not_scheduled_for_an_embedding_lora_on_a_tied_base() {
        let yaml =
            "name: r\nsource: ./m\nadapter: ./a\noutputs:\n  gguf: {quants: [Q8_0]}\nevaluation: {prompts: p.json}\n";
        let spec = ReleaseSpec::parse(yaml, "r.yaml").unwrap();
        let eval = EvalInputs {
            text: None,
            prompts: Some("/p.json".into()),
            probes: None,
            choices: None,
            third_party: Vec::new(),
            search_text: None,
        };
        let store = Location::local("/tmp/store");
        let ctx = Ctx { spec: &spec, source: "/m", imatrix: None, adapter: Some("/a"), eval: &eval, store: &store };
        let checks = |untied| {
            let mp = pb::MergePlanResult { files: vec!["model.safetensors".into()], untied, ..Default::default() };
            let grown = grow(Stage::Merged(&mp), &ctx, &|_| None);
            grown.tasks.iter().filter(|t| matches!(t.key, TaskKey::MergeCheck(MergeCheck { .. }))).count()
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
            t(
                TaskKey::Quantize(Quantize { level: FileType::Q8_0.into(), shard: 0 }),
                vec![TaskKey::Gguf(Gguf { shard: 0 })],
                100,
            ),
            t(
                TaskKey::REPORT,
                vec![
                    TaskKey::Quantize(Quantize { level: FileType::Q8_0.into(), shard: 0 }),
                    TaskKey::Gguf(Gguf { shard: 1 }),
                ],
                1,
            ),
        ];
        let p = priorities(&tasks);
        assert_eq!(p[&TaskKey::REPORT], 1);
        assert_eq!(p[&TaskKey::Gguf(Gguf { shard: 0 })], 111);
        assert_eq!(p[&TaskKey::Gguf(Gguf { shard: 1 })], 11);
    }
}
