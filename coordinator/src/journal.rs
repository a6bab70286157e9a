//! The coordinator's durable state: a SQLite journal of releases and tasks, written on every state change
//! (WAL mode, one transaction per change), read back on start so a restarted coordinator resumes every unfinished
//! release where it stopped. Tasks are stored with their typed messages and results (protobuf bytes), so nothing is
//! recomputed from memory that is gone.
//!
//! Finished releases stay here and only here: the coordinator reads their state, report and progress on demand
//! ([`Journal::release_row`], [`Journal::task_states`]), so its memory and start-up do not grow with its history.
//! The digest recorded for every output URL (content addressing's "one URL, one content") is a table of its own,
//! looked up by URL.

use quantfarm_store::Digest;
use std::path::Path;

use rusqlite::{params, Connection, OptionalExtension};

#[derive(Debug, thiserror::Error)]
#[error("journal {path}: {source}")]
pub struct JournalError {
    pub path: String,
    #[source]
    pub source: rusqlite::Error,
}

pub struct Journal {
    conn: Connection,
    path: String,
}

/// A release as stored.
#[derive(Clone, Debug)]
pub struct ReleaseRow {
    pub id: String,
    pub yaml: String,
    pub file_name: String,
    pub base: String,
    pub state: i32,
    pub error: Option<String>,
    pub report_json: Option<String>,
    pub report_url: Option<String>,
    pub created_ms: i64,
    pub finished_ms: Option<i64>,
}

/// A task as stored.
#[derive(Clone, Debug)]
pub struct TaskRow {
    pub id: String,
    pub deps: Vec<String>,
    pub priority: u64,
    pub state: String,
    pub attempts: u32,
    pub lease_id: Option<String>,
    pub worker: Option<String>,
    pub task: Option<Vec<u8>>,
    pub result: Option<Vec<u8>>,
    pub error: Option<String>,
    pub duration_ms: u64,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS releases (
    id TEXT PRIMARY KEY, yaml TEXT NOT NULL, file_name TEXT NOT NULL, base TEXT NOT NULL, state INTEGER NOT NULL,
    error TEXT, report_json TEXT, report_url TEXT, created_ms INTEGER NOT NULL, finished_ms INTEGER);
CREATE TABLE IF NOT EXISTS tasks (
    release_id TEXT NOT NULL, id TEXT NOT NULL, seq INTEGER NOT NULL, deps TEXT NOT NULL, priority INTEGER NOT NULL,
    state TEXT NOT NULL, attempts INTEGER NOT NULL, lease_id TEXT, worker TEXT, task BLOB, result BLOB, error TEXT,
    duration_ms INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (release_id, id));
CREATE INDEX IF NOT EXISTS releases_by_state ON releases (state);
CREATE TABLE IF NOT EXISTS outputs (url TEXT PRIMARY KEY, sha256 TEXT NOT NULL, bytes INTEGER NOT NULL);
";

/// `PRAGMA user_version` once the `outputs` table holds every output the journal's tasks made (journals written
/// before it existed are filled in once, by the scheduler, on open).
pub const OUTPUTS_VERSION: i32 = 1;

/// `ReleaseState::Running` as stored.
const RUNNING: i32 = 1;

impl Journal {
    pub fn open(path: &Path) -> Result<Journal, JournalError> {
        let p = path.display().to_string();
        let wrap = |source| JournalError { path: p.clone(), source };
        let conn = Connection::open(path).map_err(wrap)?;
        // WAL with synchronous=NORMAL: a commit is durable against a process crash (what a coordinator restart
        // needs) without an fsync per task completion; a power loss may lose the last few, which re-run.
        conn.pragma_update(None, "journal_mode", "WAL").map_err(wrap)?;
        conn.pragma_update(None, "synchronous", "NORMAL").map_err(wrap)?;
        conn.busy_timeout(std::time::Duration::from_secs(5)).map_err(wrap)?;
        conn.execute_batch(SCHEMA).map_err(wrap)?;
        Ok(Journal { conn, path: p })
    }

    fn err(&self, source: rusqlite::Error) -> JournalError {
        JournalError { path: self.path.clone(), source }
    }

    /// Runs `f` in one transaction.
    pub fn batch<T>(&mut self, f: impl FnOnce(&Batch) -> rusqlite::Result<T>) -> Result<T, JournalError> {
        let tx = self.conn.transaction().map_err(|e| JournalError { path: self.path.clone(), source: e })?;
        let out = f(&Batch { tx: &tx }).map_err(|e| JournalError { path: self.path.clone(), source: e })?;
        tx.commit().map_err(|e| JournalError { path: self.path.clone(), source: e })?;
        Ok(out)
    }

    /// The unfinished releases with their tasks, oldest first: what a starting coordinator resumes.
    pub fn load(&self) -> Result<Vec<(ReleaseRow, Vec<TaskRow>)>, JournalError> {
        let mut out = Vec::new();
        let mut stmt = self
            .conn
            .prepare(
                "SELECT id, yaml, file_name, base, state, error, report_json, report_url, created_ms, finished_ms
                 FROM releases WHERE state = ?1 ORDER BY created_ms, id",
            )
            .map_err(|e| self.err(e))?;
        let releases = stmt
            .query_map([RUNNING], release_row)
            .map_err(|e| self.err(e))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.err(e))?;
        let mut tstmt = self
            .conn
            .prepare(
                "SELECT id, deps, priority, state, attempts, lease_id, worker, task, result, error, duration_ms
                 FROM tasks WHERE release_id = ?1 ORDER BY seq",
            )
            .map_err(|e| self.err(e))?;
        for rel in releases {
            let tasks = tstmt
                .query_map([&rel.id], |r| {
                    let deps: String = r.get(1)?;
                    Ok(TaskRow {
                        id: r.get(0)?,
                        deps: deps.split(',').filter(|s| !s.is_empty()).map(String::from).collect(),
                        priority: r.get::<_, i64>(2)? as u64,
                        state: r.get(3)?,
                        attempts: r.get(4)?,
                        lease_id: r.get(5)?,
                        worker: r.get(6)?,
                        task: r.get(7)?,
                        result: r.get(8)?,
                        error: r.get(9)?,
                        duration_ms: r.get::<_, i64>(10)? as u64,
                    })
                })
                .map_err(|e| self.err(e))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| self.err(e))?;
            out.push((rel, tasks));
        }
        Ok(out)
    }

    /// One release as stored (finished or not).
    pub fn release_row(&self, id: &str) -> Result<Option<ReleaseRow>, JournalError> {
        self.conn
            .prepare_cached(
                "SELECT id, yaml, file_name, base, state, error, report_json, report_url, created_ms, finished_ms
                 FROM releases WHERE id = ?1",
            )
            .and_then(|mut st| st.query_row([id], release_row).optional())
            .map_err(|e| self.err(e))
    }

    /// A release's tasks as (id, state), in creation order: its progress, without messages or results.
    pub fn task_states(&self, release: &str) -> Result<Vec<(String, String)>, JournalError> {
        let mut st = self
            .conn
            .prepare_cached("SELECT id, state FROM tasks WHERE release_id = ?1 ORDER BY seq")
            .map_err(|e| self.err(e))?;
        let rows = st.query_map([release], |r| Ok((r.get(0)?, r.get(1)?))).map_err(|e| self.err(e))?;
        rows.collect::<Result<Vec<_>, _>>().map_err(|e| self.err(e))
    }

    /// How many releases there are in each state (the stored `ReleaseState` number).
    pub fn release_counts(&self) -> Result<Vec<(i32, u64)>, JournalError> {
        let mut st =
            self.conn.prepare_cached("SELECT state, COUNT(*) FROM releases GROUP BY state").map_err(|e| self.err(e))?;
        let rows = st.query_map([], |r| Ok((r.get(0)?, r.get::<_, i64>(1)? as u64))).map_err(|e| self.err(e))?;
        rows.collect::<Result<Vec<_>, _>>().map_err(|e| self.err(e))
    }

    /// The digest and size recorded for the output at `url`, if it was ever made.
    pub fn output(&self, url: &str) -> Result<Option<Digest>, JournalError> {
        self.conn
            .prepare_cached("SELECT sha256, bytes FROM outputs WHERE url = ?1")
            .and_then(|mut st| {
                st.query_row([url], |r| Ok(Digest { sha256: r.get(0)?, bytes: r.get::<_, i64>(1)? as u64 })).optional()
            })
            .map_err(|e| self.err(e))
    }

    pub fn user_version(&self) -> Result<i32, JournalError> {
        self.conn.query_row("PRAGMA user_version", [], |r| r.get(0)).map_err(|e| self.err(e))
    }

    pub fn set_user_version(&self, v: i32) -> Result<(), JournalError> {
        self.conn.pragma_update(None, "user_version", v).map_err(|e| self.err(e))
    }

    /// Every stored task result (protobuf bytes), for filling in the outputs table of an older journal.
    pub fn for_each_result(&self, mut f: impl FnMut(&[u8])) -> Result<(), JournalError> {
        let mut st = self.conn.prepare("SELECT result FROM tasks WHERE result IS NOT NULL").map_err(|e| self.err(e))?;
        let mut rows = st.query([]).map_err(|e| self.err(e))?;
        while let Some(r) = rows.next().map_err(|e| self.err(e))? {
            let b: Vec<u8> = r.get(0).map_err(|e| self.err(e))?;
            f(&b);
        }
        Ok(())
    }

    /// A trivial read: the database answers.
    pub fn ping(&self) -> Result<(), JournalError> {
        self.conn.query_row("SELECT 1", [], |_| Ok(())).map_err(|e| self.err(e))
    }

    pub fn release_exists(&self, id: &str) -> Result<bool, JournalError> {
        self.conn
            .query_row("SELECT 1 FROM releases WHERE id = ?1", [id], |_| Ok(()))
            .optional()
            .map(|o| o.is_some())
            .map_err(|e| self.err(e))
    }
}

fn release_row(r: &rusqlite::Row) -> rusqlite::Result<ReleaseRow> {
    Ok(ReleaseRow {
        id: r.get(0)?,
        yaml: r.get(1)?,
        file_name: r.get(2)?,
        base: r.get(3)?,
        state: r.get(4)?,
        error: r.get(5)?,
        report_json: r.get(6)?,
        report_url: r.get(7)?,
        created_ms: r.get(8)?,
        finished_ms: r.get(9)?,
    })
}

/// The writes of one transaction.
pub struct Batch<'a> {
    tx: &'a rusqlite::Transaction<'a>,
}

impl Batch<'_> {
    /// Records the digest of an output made at `url` (the first record stands: a URL has one content).
    pub fn record_output(&self, url: &str, sha256: &str, bytes: u64) -> rusqlite::Result<()> {
        self.tx
            .prepare_cached("INSERT OR IGNORE INTO outputs (url, sha256, bytes) VALUES (?1, ?2, ?3)")?
            .execute(params![url, sha256, bytes as i64])?;
        Ok(())
    }

    pub fn insert_release(&self, r: &ReleaseRow) -> rusqlite::Result<()> {
        self.tx
            .prepare_cached(
                "INSERT INTO releases (id, yaml, file_name, base, state, created_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?
            .execute(params![r.id, r.yaml, r.file_name, r.base, r.state, r.created_ms])?;
        Ok(())
    }

    pub fn finish_release(
        &self,
        id: &str,
        state: i32,
        error: Option<&str>,
        report_json: Option<&str>,
        report_url: Option<&str>,
        finished_ms: i64,
    ) -> rusqlite::Result<()> {
        self.tx
            .prepare_cached(
                "UPDATE releases SET state = ?2, error = ?3, report_json = ?4, report_url = ?5, finished_ms = ?6
                 WHERE id = ?1",
            )?
            .execute(params![id, state, error, report_json, report_url, finished_ms])?;
        Ok(())
    }

    pub fn insert_task(&self, release: &str, seq: usize, t: &TaskRow) -> rusqlite::Result<()> {
        self.tx
            .prepare_cached(
                "INSERT INTO tasks (release_id, id, seq, deps, priority, state, attempts, task)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            )?
            .execute(params![
                release,
                t.id,
                seq as i64,
                t.deps.join(","),
                t.priority as i64,
                t.state,
                t.attempts,
                t.task
            ])?;
        Ok(())
    }

    /// Stores a task's state change (everything but its identity and dependencies).
    pub fn update_task(&self, release: &str, t: &TaskRow) -> rusqlite::Result<()> {
        self.tx
            .prepare_cached(
                "UPDATE tasks SET state = ?3, attempts = ?4, lease_id = ?5, worker = ?6, task = ?7, result = ?8,
                 error = ?9, duration_ms = ?10, deps = ?11 WHERE release_id = ?1 AND id = ?2",
            )?
            .execute(params![
                release,
                t.id,
                t.state,
                t.attempts,
                t.lease_id,
                t.worker,
                t.task,
                t.result,
                t.error,
                t.duration_ms as i64,
                t.deps.join(",")
            ])?;
        Ok(())
    }
}
