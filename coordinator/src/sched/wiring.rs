//! The task graph's bookkeeping: tasks added with their dependencies, a task made ready when its last
//! dependency is done (with the inputs it reads and their digests), and each change journaled.

use super::*;
use quantfarm_store::Digest;

impl Sched {
    /// Adds tasks to a release (journalled in one transaction) and readies those with no open dependency. A task
    /// already in the graph is not added again (two rungs may reach the same base-logits group).
    pub(super) fn add_tasks(&mut self, ri: usize, mut defs: Vec<TaskDef>) -> Result<(), SchedError> {
        let prio = kinds::priorities(&defs);
        let rel = &mut self.releases[ri];
        let mut seen = std::collections::HashSet::new();
        defs.retain(|d| !rel.index.contains_key(&d.key) && seen.insert(d.key.clone()));
        let first_new = rel.tasks.len();
        for d in &defs {
            rel.push_task(TaskRec::new(d.key.clone(), prio.get(&d.key).copied().unwrap_or(d.cost)));
        }
        for (k, d) in defs.iter().enumerate() {
            for dep in &d.deps {
                let di = rel.task_index(dep)?;
                rel.wire(first_new + k, di);
            }
        }
        let rel = &self.releases[ri];
        let rows: Vec<TaskRow> = rel.tasks[first_new..].iter().map(|t| t.row(&rel.tasks)).collect();
        let id = rel.id.clone();
        self.journal.batch(|b| {
            for (k, r) in rows.iter().enumerate() {
                b.insert_task(&id, first_new + k, r)?;
            }
            Ok(())
        })?;
        for i in first_new..self.releases[ri].tasks.len() {
            if self.releases[ri].tasks[i].waiting == 0 {
                self.ready_up(ri, i)?;
            }
        }
        Ok(())
    }

    /// Makes an existing task also wait for `deps` (tasks of the same release), journalled.
    pub(super) fn add_deps(&mut self, ri: usize, key: &TaskKey, deps: &[TaskKey]) -> Result<(), SchedError> {
        let rel = &mut self.releases[ri];
        let ti = rel.task_index(key)?;
        for dep in deps {
            let di = rel.task_index(dep)?;
            rel.wire(ti, di);
        }
        self.journal_task(ri, ti)
    }

    /// A task whose dependencies are all done: build its message and queue it (or queue the report).
    pub(super) fn ready_up(&mut self, ri: usize, ti: usize) -> Result<(), SchedError> {
        let rel = &self.releases[ri];
        let key = rel.tasks[ti].key.clone();
        if key == TaskKey::REPORT {
            let t = &mut self.releases[ri].tasks[ti];
            t.state = TState::Reporting;
            t.attempts += 1;
            self.journal_task(ri, ti)?;
            self.effects.reports.push(ReportJob { release_id: self.releases[ri].id.clone() });
            return Ok(());
        }
        let built = {
            let ctx = rel.ctx(&self.store);
            let results = |k: &TaskKey| rel.result(k);
            key.message(&ctx, &results)
        };
        match built {
            Ok(task) => {
                let t = &mut self.releases[ri].tasks[ti];
                t.task = Some(task);
                t.state = TState::Ready;
                self.journal_task(ri, ti)?;
                self.make_ready(ri, ti);
            }
            Err(e) => self.fail_release(ri, format!("task {key}: cannot be built: {e}"))?,
        }
        Ok(())
    }

    pub(super) fn make_ready(&mut self, ri: usize, ti: usize) {
        self.effects.ready_changed = true;
        let inputs = self.inputs_of(self.releases[ri].tasks[ti].task.as_ref());
        self.releases[ri].tasks[ti].inputs = inputs;
        self.ready.insert((Reverse(self.releases[ri].tasks[ti].priority), ri, ti));
    }

    /// The digest and size recorded for the output at `url` (a journal lookup; an unreadable journal is logged and
    /// reads as unknown).
    pub(super) fn output(&self, url: &str) -> Option<Digest> {
        self.journal.output(url).unwrap_or_else(|e| {
            tracing::error!("{e}");
            None
        })
    }

    /// The farm-made files `task` reads whose digests the farm recorded.
    pub(super) fn inputs_of(&self, task: Option<&pb::Task>) -> Vec<pb::InputFile> {
        let Some(kind) = task.and_then(|t| t.kind.as_ref()) else { return Vec::new() };
        kind.reads()
            .into_iter()
            .filter_map(|url| {
                let Digest { sha256, bytes } = self.output(&url)?;
                Some(pb::InputFile { url, sha256, bytes })
            })
            .collect()
    }

    pub(super) fn journal_task(&mut self, ri: usize, ti: usize) -> Result<(), SchedError> {
        let rel = &self.releases[ri];
        let row = rel.tasks[ti].row(&rel.tasks);
        let id = rel.id.clone();
        self.journal.batch(|b| b.update_task(&id, &row))?;
        Ok(())
    }
}
