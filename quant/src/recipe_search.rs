//! Recipes chosen to a budget from measured costs: the tensor groups a search varies, the probe recipe that
//! measures one group at one type with everything else left as the reference has it, each group's exact bytes at
//! each type, and the assignment of one type per group with the least summed cost within a byte budget.
//!
//! The method (docs/search.md): a group is the tensors of one role (the name after `blk.N.`: `attn_q.weight`,
//! `ffn_down_exps.weight`, `ssm_out.weight`, …) in one contiguous range of layers, or one tensor outside the layers
//! (`token_embd.weight`, `output.weight`). A probe quantizes that group alone to a candidate type, the rest kept as
//! the reference's floats, and its mean KL divergence against the reference on a calibration text is the group's
//! cost at that type. The costs of different groups are taken to add (the second-order term of KL divergence in
//! independent weight errors is a sum; their cross terms average out), and the assignment minimizing the summed cost
//! within the budget is a multiple-choice knapsack, solved exactly on a byte grid by dynamic programming
//! ([`allocate`]). Every recipe is llama-quantize's own: `--tensor-type PATTERN=TYPE` entries on a quantized base,
//! one anchored pattern per group, so `llama-quantize --tensor-type …` makes the same file.

use std::collections::BTreeMap;

use quantfarm_tensors::GgmlType;

use crate::mixture::{allows_quantization, fallback};

/// Why a search cannot go on: each names the group, type or budget.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SearchError {
    #[error("no tensor of the model can be quantized: nothing to search")]
    NoGroups,
    #[error("group {group}: {ty} has no fallback for tensor {tensor} (rows of {ne0})")]
    NoFallback { group: String, ty: GgmlType, tensor: String, ne0: u64 },
    #[error("group {group}: no candidate type (the candidates all failed or were left out)")]
    NoCandidate { group: String },
    #[error("the budget of {budget} bytes is below the smallest recipe the candidates make ({smallest} bytes)")]
    OverBudget { budget: u64, smallest: u64 },
    #[error("group {group}, option {option}: the cost {cost} is not a finite number")]
    BadCost { group: usize, option: usize, cost: f64 },
}

/// One tensor as the search sees it: name, shape (`ne`, innermost first) and type in the reference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tensor {
    pub name: String,
    pub ne: Vec<u64>,
    pub ty: GgmlType,
}

impl Tensor {
    fn elements(&self) -> u64 {
        self.ne.iter().product()
    }

    /// Bytes of the tensor's data at `ty` (`None` when its rows are not whole blocks of `ty`).
    fn bytes_at(&self, ty: GgmlType) -> Option<u64> {
        let ne0 = self.ne.first().copied().unwrap_or(1);
        Some(ty.row_bytes(ne0)? * (self.elements() / ne0.max(1)))
    }
}

/// A set of tensors a search gives one type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    /// `attn_q.weight@0-9` (role and layers, inclusive) or the tensor's name outside the layers.
    pub name: String,
    /// The `--tensor-type` pattern that matches its tensors and no other: anchored, escaped, lower case.
    pub pattern: String,
    /// Its tensors, as indices into the model's tensor list.
    pub tensors: Vec<usize>,
}

/// `blk.N.rest` as (N, rest).
fn layer_and_role(name: &str) -> Option<(u32, &str)> {
    let rest = name.strip_prefix("blk.")?;
    let (n, role) = rest.split_once('.')?;
    Some((n.parse().ok()?, role))
}

/// The groups of a model: every tensor llama-quantize may quantize in exactly one group. Tensors outside the layers
/// come first, one group each, in name order; then each role, in the order its first tensor comes, with its layers cut
/// into `ranges` contiguous ranges of (nearly) equal length (`ranges` 1: one group per role).
pub fn groups(tensors: &[Tensor], ranges: u32) -> Result<Vec<Group>, SearchError> {
    let ranges = ranges.max(1);
    let mut outside: Vec<(String, usize)> = Vec::new();
    let mut roles: Vec<(&str, BTreeMap<u32, Vec<usize>>)> = Vec::new();
    let mut n_layer = 0u32;
    for (i, t) in tensors.iter().enumerate() {
        if !allows_quantization(&t.name, &t.ne) {
            continue;
        }
        match layer_and_role(&t.name) {
            Some((layer, role)) => {
                n_layer = n_layer.max(layer + 1);
                match roles.iter_mut().find(|(r, _)| *r == role) {
                    Some((_, layers)) => layers.entry(layer).or_default().push(i),
                    None => roles.push((role, BTreeMap::from([(layer, vec![i])]))),
                }
            }
            None => outside.push((t.name.clone(), i)),
        }
    }
    outside.sort();
    let mut out: Vec<Group> = outside
        .into_iter()
        .map(|(name, i)| Group {
            pattern: format!("^{}$", regex::escape(&name).to_ascii_lowercase()),
            name,
            tensors: vec![i],
        })
        .collect();
    let ranges = ranges.min(n_layer.max(1));
    for (role, layers) in roles {
        for r in 0..ranges {
            let (lo, hi) = (
                (u64::from(r) * u64::from(n_layer) / u64::from(ranges)) as u32,
                (u64::from(r + 1) * u64::from(n_layer) / u64::from(ranges)) as u32,
            );
            let members: Vec<(u32, &Vec<usize>)> = layers.range(lo..hi).map(|(l, v)| (*l, v)).collect();
            let (Some(first), Some(last)) = (members.first(), members.last()) else { continue };
            let numbers: Vec<String> = members.iter().map(|(l, _)| l.to_string()).collect();
            out.push(Group {
                name: format!("{role}@{}-{}", first.0, last.0),
                pattern: format!("^blk\\.({})\\.{}$", numbers.join("|"), regex::escape(role).to_ascii_lowercase()),
                tensors: members.iter().flat_map(|(_, v)| v.iter().copied()).collect(),
            });
        }
    }
    if out.is_empty() {
        return Err(SearchError::NoGroups);
    }
    Ok(out)
}

/// What a candidate type makes of one group: the type each of its tensors gets (after llama-quantize's fallback for
/// rows that are not whole blocks) and their bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Variant {
    /// The type the recipe's pattern names: the candidate, or the one type every tensor of the group falls back to
    /// (`Q2_K` on rows of 576 is written `Q4_0`: the same bytes, and what the file holds).
    pub asked: GgmlType,
    /// The type each tensor of the group gets, in the group's order.
    pub types: Vec<GgmlType>,
    /// Their bytes.
    pub bytes: u64,
}

/// The distinct variants of a group over the candidate types, in the candidates' order: a candidate that gives every
/// tensor the same type as an earlier one is left out (it makes the same bytes).
pub fn variants(tensors: &[Tensor], group: &Group, candidates: &[GgmlType]) -> Result<Vec<Variant>, SearchError> {
    let mut out: Vec<Variant> = Vec::new();
    for &asked in candidates {
        let mut types = Vec::with_capacity(group.tensors.len());
        let mut bytes = 0;
        for &i in &group.tensors {
            let t = &tensors[i];
            let ne0 = t.ne.first().copied().unwrap_or(1);
            let no_fallback =
                || SearchError::NoFallback { group: group.name.clone(), ty: asked, tensor: t.name.clone(), ne0 };
            let ty = fallback(asked, ne0).ok_or_else(no_fallback)?;
            bytes += t.bytes_at(ty).ok_or_else(no_fallback)?;
            types.push(ty);
        }
        if !out.iter().any(|v| v.types == types) {
            let asked = match types.first() {
                Some(&first) if types.iter().all(|&t| t == first) => first,
                _ => asked,
            };
            out.push(Variant { asked, types, bytes });
        }
    }
    if out.is_empty() {
        return Err(SearchError::NoCandidate { group: group.name.clone() });
    }
    Ok(out)
}

/// The `--tensor-type` entries of a probe: the group at `ty`, then every other quantizable tensor at its reference
/// type (one entry per type the reference holds, the most common last as `.*`), so that only the group changes.
/// Applied to a quantized base (llama-quantize reads `--tensor-type` only then), e.g. `Q8_0`.
pub fn probe_rules(tensors: &[Tensor], group: &Group, ty: GgmlType) -> Vec<(String, GgmlType)> {
    let mut rules = vec![(group.pattern.clone(), ty)];
    let mut by_type: BTreeMap<&'static str, (GgmlType, Vec<&str>)> = BTreeMap::new();
    for (i, t) in tensors.iter().enumerate() {
        if allows_quantization(&t.name, &t.ne) && !group.tensors.contains(&i) {
            by_type.entry(t.ty.name()).or_insert_with(|| (t.ty, Vec::new())).1.push(&t.name);
        }
    }
    let most = by_type.values().max_by_key(|(_, names)| names.len()).map(|(ty, _)| *ty);
    for (ty, names) in by_type.values() {
        if Some(*ty) != most {
            rules.extend(names.iter().map(|n| (format!("^{}$", regex::escape(n).to_ascii_lowercase()), *ty)));
        }
    }
    if let Some(ty) = most {
        rules.push((".*".to_string(), ty));
    }
    rules
}

/// One option of a group for [`allocate`]: its bytes and its measured cost.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Priced {
    pub bytes: u64,
    pub cost: f64,
}

/// Cells of the byte grid [`allocate`] solves on: the budget above the smallest recipe is cut into this many, each
/// option's bytes above its group's smallest rounded up to whole cells, so a solution never exceeds the budget and
/// gives away at most one cell per group.
pub const GRID: u64 = 1 << 16;

/// One option per group (`options[g]`, indices into it) with the least summed cost whose bytes, with `fixed` (the
/// tensors no group holds), stay within `budget`. Exact on the byte grid ([`GRID`]); ties go to the smaller recipe,
/// then to the earlier options, so the same costs always give the same choice.
pub fn allocate(options: &[Vec<Priced>], fixed: u64, budget: u64) -> Result<Vec<usize>, SearchError> {
    for (g, opts) in options.iter().enumerate() {
        if opts.is_empty() {
            return Err(SearchError::NoCandidate { group: format!("#{g}") });
        }
        if let Some((o, p)) = opts.iter().enumerate().find(|(_, p)| !p.cost.is_finite()) {
            return Err(SearchError::BadCost { group: g, option: o, cost: p.cost });
        }
    }
    let min_of = |opts: &Vec<Priced>| opts.iter().map(|p| p.bytes).min().unwrap_or(0);
    let smallest = fixed + options.iter().map(min_of).sum::<u64>();
    if smallest > budget {
        return Err(SearchError::OverBudget { budget, smallest });
    }
    let slack = budget - smallest;
    let cell = slack.div_ceil(GRID).max(1);
    let cells = (slack / cell) as usize;
    // best[c]: the least cost of the groups so far using at most c cells (with its bytes, for ties); pick[g][c]: the
    // option group g takes there.
    let mut best: Vec<(f64, u64)> = vec![(0.0, 0); cells + 1];
    let mut pick: Vec<Vec<u16>> = Vec::with_capacity(options.len());
    for opts in options {
        let min = min_of(opts);
        let mut next = vec![(f64::INFINITY, u64::MAX); cells + 1];
        let mut chosen = vec![0u16; cells + 1];
        for (o, p) in opts.iter().enumerate() {
            let need = (p.bytes - min).div_ceil(cell) as usize;
            for c in need..=cells {
                let (cost, bytes) = best[c - need];
                let cand = (cost + p.cost, bytes + p.bytes);
                if cand.0 < next[c].0 || (cand.0 == next[c].0 && cand.1 < next[c].1) {
                    next[c] = cand;
                    chosen[c] = o as u16;
                }
            }
        }
        best = next;
        pick.push(chosen);
    }
    // Walk back from the full budget.
    let mut c = cells;
    let mut out = vec![0; options.len()];
    for (g, opts) in options.iter().enumerate().rev() {
        let o = pick[g][c] as usize;
        out[g] = o;
        c -= (opts[o].bytes - min_of(opts)).div_ceil(cell) as usize;
    }
    Ok(out)
}

/// The summed bytes and cost of a choice.
pub fn totals(options: &[Vec<Priced>], choice: &[usize]) -> (u64, f64) {
    options.iter().zip(choice).fold((0, 0.0), |(b, k), (opts, &o)| (b + opts[o].bytes, k + opts[o].cost))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(name: &str, ne: &[u64], ty: GgmlType) -> Tensor {
        Tensor { name: name.into(), ne: ne.to_vec(), ty }
    }

    fn model() -> Vec<Tensor> {
        let mut v =
            vec![t("token_embd.weight", &[576, 100], GgmlType::BF16), t("output_norm.weight", &[576], GgmlType::F32)];
        for l in 0..5 {
            v.push(t(&format!("blk.{l}.attn_norm.weight"), &[576], GgmlType::F32));
            v.push(t(&format!("blk.{l}.attn_q.weight"), &[576, 576], GgmlType::BF16));
            v.push(t(&format!("blk.{l}.ffn_down.weight"), &[1536, 576], GgmlType::BF16));
        }
        v
    }

    #[test]
    fn groups_cover_every_quantizable_tensor_once_and_their_patterns_match_only_them() {
        let m = model();
        let gs = groups(&m, 2).unwrap();
        let names: Vec<&str> = gs.iter().map(|g| g.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "token_embd.weight",
                "attn_q.weight@0-1",
                "attn_q.weight@2-4",
                "ffn_down.weight@0-1",
                "ffn_down.weight@2-4"
            ]
        );
        assert_eq!(gs[1].pattern, r"^blk\.(0|1)\.attn_q\.weight$");
        let mut seen = vec![0; m.len()];
        for g in &gs {
            let rx = regex::Regex::new(&g.pattern).unwrap();
            for (i, tensor) in m.iter().enumerate() {
                assert_eq!(rx.is_match(&tensor.name), g.tensors.contains(&i), "{} on {}", g.pattern, tensor.name);
            }
            g.tensors.iter().for_each(|&i| seen[i] += 1);
        }
        for (i, tensor) in m.iter().enumerate() {
            let want = usize::from(allows_quantization(&tensor.name, &tensor.ne));
            assert_eq!(seen[i], want, "{}", tensor.name);
        }
        // More ranges than layers: one group per layer.
        assert_eq!(groups(&m, 9).unwrap().len(), 1 + 5 + 5);
    }

    #[test]
    fn variants_follow_the_fallback_and_drop_repeats() {
        let m = model();
        let gs = groups(&m, 1).unwrap();
        let q = &gs[1]; // attn_q: rows of 576, not whole 256-blocks.
        let asked = [GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::Q8_0];
        let v = variants(&m, q, &asked).unwrap();
        let got: Vec<(GgmlType, GgmlType)> = v.iter().map(|v| (v.asked, v.types[0])).collect();
        assert_eq!(
            got,
            [(GgmlType::Q4_0, GgmlType::Q4_0), (GgmlType::Q5_0, GgmlType::Q5_0), (GgmlType::Q8_0, GgmlType::Q8_0)],
            "written as the type the tensors fall back to"
        );
        assert_eq!(v[0].bytes, 5 * 576 * (576 / 32) * 18);
        let d = variants(&m, &gs[2], &asked).unwrap(); // ffn_down: rows of 1536, whole 256-blocks.
        assert_eq!(d.len(), 5);
        assert_eq!(d[0].bytes, 5 * 576 * (1536 / 256) * 84);
    }

    #[test]
    fn a_probe_changes_its_group_alone() {
        let mut m = model();
        m[4].ty = GgmlType::F32; // blk.0.ffn_down kept in F32 by a converter
        let gs = groups(&m, 1).unwrap();
        let rules = probe_rules(&m, &gs[1], GgmlType::Q4_0);
        let got: Vec<(&str, GgmlType)> = rules.iter().map(|(p, t)| (p.as_str(), *t)).collect();
        assert_eq!(
            got,
            [
                (r"^blk\.(0|1|2|3|4)\.attn_q\.weight$", GgmlType::Q4_0),
                (r"^blk\.0\.ffn_down\.weight$", GgmlType::F32),
                (".*", GgmlType::BF16)
            ]
        );
    }

    fn brute(options: &[Vec<Priced>], budget: u64) -> Option<f64> {
        let mut best: Option<f64> = None;
        let mut idx = vec![0; options.len()];
        loop {
            let (b, k) = totals(options, &idx);
            if b <= budget && best.is_none_or(|x| k < x) {
                best = Some(k);
            }
            let mut g = 0;
            loop {
                if g == idx.len() {
                    return best;
                }
                idx[g] += 1;
                if idx[g] < options[g].len() {
                    break;
                }
                idx[g] = 0;
                g += 1;
            }
        }
    }

    #[test]
    fn allocation_is_the_least_cost_within_the_budget() {
        // Small instances against exhaustive search (byte sizes below the grid: exact).
        let mut state = 7u64;
        let mut rng = move || {
            // xorshift64
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for case in 0..300 {
            let groups = 1 + case % 6;
            let options: Vec<Vec<Priced>> = (0..groups)
                .map(|_| {
                    (0..1 + rng() % 4)
                        .map(|_| Priced { bytes: 10 + rng() % 90, cost: (rng() % 1000) as f64 / 1000.0 })
                        .collect()
                })
                .collect();
            let lo: u64 = options.iter().map(|o| o.iter().map(|p| p.bytes).min().unwrap()).sum();
            let budget = lo + rng() % 200;
            let choice = allocate(&options, 0, budget).unwrap();
            let (b, k) = totals(&options, &choice);
            assert!(b <= budget, "case {case}: {b} > {budget}");
            let want = brute(&options, budget).unwrap();
            assert!((k - want).abs() < 1e-12, "case {case}: {k} against the optimum {want}");
        }
        assert_eq!(
            allocate(&[vec![Priced { bytes: 10, cost: 0.0 }]], 5, 14),
            Err(SearchError::OverBudget { budget: 14, smallest: 15 })
        );
        let nan = [vec![Priced { bytes: 1, cost: f64::NAN }]];
        assert!(matches!(allocate(&nan, 0, 9), Err(SearchError::BadCost { group: 0, option: 0, .. })));
    }

    #[test]
    fn a_large_budget_on_the_grid_stays_within_it() {
        let options: Vec<Vec<Priced>> = (0..40)
            .map(|g| {
                (0..6)
                    .map(|o| Priced {
                        bytes: 1_000_003 * (o + 1) + g * 7919,
                        cost: 1.0 / ((o + 1) as f64) + g as f64 * 1e-3,
                    })
                    .collect()
            })
            .collect();
        for budget in [150_000_000, 170_000_017, 239_000_000] {
            let choice = allocate(&options, 12345, budget).unwrap();
            let (b, _) = totals(&options, &choice);
            assert!(b + 12345 <= budget, "{b} + fixed over {budget}");
            // At most one grid cell per group given away.
            assert!(budget - (b + 12345) <= 40 * (budget / GRID + 1) + 6 * 1_000_003, "{b} far under {budget}");
        }
    }
}
