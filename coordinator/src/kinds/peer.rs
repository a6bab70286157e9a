//! `peer`: a peer tool's own run (`llama-perplexity --kl-divergence`), for the report to set its printed figures
//! beside quantfarm's: its base run on the reference (its base-logits file), then its run on each quant level.

use std::fmt;

use quantfarm_proto::{self as pb, task, task_result};

use super::expand::model_tasks;
use super::lookup::{kld_plan_of, kld_settings, model_of, reference_files};
use super::subjects::{EvalTarget, Subject};
use super::{Done, Family, Folded, Grown, Kld, Results, Stage};
use crate::graph::naming::artifact;
use crate::graph::Ctx;
use crate::spec::{Level, Peer};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PeerRun {
    /// The tool's base run on the reference.
    Base { peer: Peer },
    /// The tool's KL-divergence run on one quant level.
    Kld { peer: Peer, level: Level },
}

impl PeerRun {
    fn peer(self) -> Peer {
        match self {
            PeerRun::Base { peer } | PeerRun::Kld { peer, .. } => peer,
        }
    }
}

impl Family for PeerRun {
    const NAME: &'static str = "peer";

    fn write_rest(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PeerRun::Base { peer } => write!(f, "/{}/base", peer.tool()),
            PeerRun::Kld { peer, level } => write!(f, "/{}/{level}", peer.tool()),
        }
    }

    fn parse(rest: &[&str]) -> Option<PeerRun> {
        match rest {
            [p, "base"] => Some(PeerRun::Base { peer: Peer::parse(p)? }),
            [p, l] => Some(PeerRun::Kld { peer: Peer::parse(p)?, level: Level::parse(l)? }),
            _ => None,
        }
    }

    fn worker_kind(&self) -> Option<pb::WorkerKind> {
        Some(pb::WorkerKind::Peer)
    }

    fn runtime(&self) -> Option<&'static str> {
        Some(self.peer().tool())
    }

    fn stage(&self) -> String {
        self.peer().tool().to_string()
    }

    fn message(&self, ctx: &Ctx, results: &Results) -> Result<task::Kind, String> {
        let settings = kld_settings(ctx)?;
        let task = match *self {
            PeerRun::Base { peer } => {
                let kp = kld_plan_of(results)?;
                let refs = reference_files(results)?;
                let (c, b, m) = (settings.ctx.to_string(), settings.batch.to_string(), settings.max_chunks.to_string());
                let mut parts = vec!["quantfarm peer-base v1", peer.tool(), &kp.text_sha256, &c, &b, &m];
                parts.extend(refs.iter().map(|a| a.sha256.as_str()));
                let name = format!("{}-BF16-{}.logits", ctx.spec.prefix(), peer.tool());
                let output = artifact(ctx, &parts, &name)?;
                pb::PeerKldTask {
                    tool: peer.tool().into(),
                    model: refs[0].url.clone(),
                    settings: Some(settings),
                    base: String::new(),
                    base_sha256: String::new(),
                    output: output.to_string(),
                }
            }
            PeerRun::Kld { peer, level } => {
                let base = match results(&PeerRun::Base { peer }.into()).and_then(|r| r.kind.as_ref()) {
                    Some(task_result::Kind::PeerKld(p)) => {
                        p.base.as_ref().ok_or("the peer's base run wrote no file")?
                    }
                    _ => return Err(format!("peer/{}/base has no result", peer.tool())),
                };
                pb::PeerKldTask {
                    tool: peer.tool().into(),
                    model: model_of(results, Subject::Model(EvalTarget::Quant(level)))?.url.clone(),
                    settings: Some(settings),
                    base: base.url.clone(),
                    base_sha256: base.sha256.clone(),
                    output: String::new(),
                }
            }
        };
        Ok(task::Kind::PeerKld(task))
    }

    /// Every run reports the tool's version; a level's run, the figures the tool printed.
    fn fold<'a>(&self, done: Done<'a>, into: &mut Folded<'a>) {
        let Some(p) = done.result.and_then(pb::TaskResult::peer_kld) else { return };
        into.peer_versions.insert(p.tool.clone(), p.version.clone());
        match *self {
            PeerRun::Base { .. } => {}
            PeerRun::Kld { level, .. } => into.peers.push((level, p)),
        }
    }

    /// After the plan, per peer tool of the evaluation: its base run after the KL-divergence plan (whose text
    /// checksum names the base file), then its run on each measured quant level. The report waits for those.
    fn grow(stage: Stage, ctx: &Ctx, _: &Results, out: &mut Grown) {
        let Stage::Planned(inv) = stage else { return };
        let Some(e) = inv.evaluated(ctx) else { return };
        let cost = inv.plan.source_bytes;
        for peer in e.peer_tools() {
            out.add(PeerRun::Base { peer }, vec![Kld::Plan.into()], cost);
            for level in
                ctx.spec.quants().iter().map(|l| l.level()).filter(|&l| ctx.spec.measures(EvalTarget::Quant(l)))
            {
                let mut deps = vec![PeerRun::Base { peer }.into()];
                deps.extend(model_tasks(EvalTarget::Quant(level), inv.n));
                out.add_measured(PeerRun::Kld { peer, level }, deps, cost);
            }
        }
    }
}
