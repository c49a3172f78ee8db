//! What keeps a query from taking the process down with it: a bound on expression depth (SQL
//! from a config file or a generator can nest deeper than DataFusion's recursive planner has
//! stack for), planning on a thread whose stack is sized for that bound, and a memory pool by
//! default (sorts and aggregations spill to disk, the rest fails with "resources exhausted"
//! instead of growing until the OOM killer ends the process).

use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use datafusion::execution::memory_pool::{FairSpillPool, TrackConsumersPool};
use datafusion::execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};
use datafusion::sql::parser::{CopyToSource, DFParser, Statement};
use datafusion::sql::sqlparser::ast::{Expr, Visit, Visitor};

use crate::error::{Error, Result};

/// The deepest expression a query may have (nested operators, function calls, subqueries'
/// expressions): SQLite's `SQLITE_MAX_EXPR_DEPTH` and DuckDB's `max_expression_depth`, 1000 too.
/// A chain `a OR b OR c ...` of `n` terms is `n` deep; `x IN (a, b, c, ...)` is 2 deep whatever
/// its length.
pub const MAX_EXPR_DEPTH: usize = 1000;

/// The stack of the thread that parses, checks and plans a query (and of the runtime's
/// workers): enough for [`MAX_EXPR_DEPTH`] in a debug build, with a wide margin. Reserved, not
/// committed: the pages a query does not touch cost nothing.
pub(crate) const SQL_STACK_BYTES: usize = 256 << 20;

/// The environment variable that sets the SQL memory limit (a size: `8GiB`, `512MiB`, bytes).
pub const MEMORY_LIMIT_ENV: &str = "TRAJSTORE_SQL_MEMORY";

/// The share of this machine's memory (or of the cgroup's limit, when lower) that queries may
/// use by default.
pub const DEFAULT_MEMORY_FRACTION: f64 = 0.5;

/// Set by [`set_memory_limit`]; 0 = unset.
static MEMORY_LIMIT: AtomicU64 = AtomicU64::new(0);

/// Sets the memory limit of every SQL session created afterwards in this process (`None`: back
/// to [`MEMORY_LIMIT_ENV`], else [`DEFAULT_MEMORY_FRACTION`] of the memory). Sessions already
/// open keep theirs.
pub fn set_memory_limit(bytes: Option<u64>) {
    MEMORY_LIMIT.store(bytes.unwrap_or(0), Ordering::Relaxed);
}

/// The memory limit of new SQL sessions in bytes, and where it comes from: what
/// [`set_memory_limit`] set, else [`MEMORY_LIMIT_ENV`], else [`DEFAULT_MEMORY_FRACTION`] of the
/// machine's (or cgroup's) memory. Errors when the environment variable is not a size.
pub fn memory_limit() -> Result<(u64, &'static str)> {
    let set = MEMORY_LIMIT.load(Ordering::Relaxed);
    if set > 0 {
        return Ok((set, "set by the caller"));
    }
    if let Ok(v) = std::env::var(MEMORY_LIMIT_ENV) {
        let n = parse_size(&v).ok_or_else(|| {
            Error::argument(
                MEMORY_LIMIT_ENV,
                format!("`{v}` is not a size (e.g. 8GiB, 512MiB, or bytes)"),
            )
        })?;
        return Ok((n, MEMORY_LIMIT_ENV));
    }
    let total = physical_memory().unwrap_or(8 << 30);
    Ok((
        ((total as f64) * DEFAULT_MEMORY_FRACTION) as u64,
        "half of the memory",
    ))
}

/// `123`, `64KiB`, `256MiB`, `8GiB`, `1.5GB` in bytes ([`crate::units::parse_size`]), at least
/// 1 MiB.
pub fn parse_size(s: &str) -> Option<u64> {
    crate::units::parse_size(s).ok().filter(|&n| n >= 1 << 20)
}

/// Physical memory, or the cgroup v2 limit when it is lower.
fn physical_memory() -> Option<u64> {
    // SAFETY: sysconf reads process-independent constants; no memory is passed.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    let phys = (pages > 0 && page > 0).then(|| pages as u64 * page as u64)?;
    let cgroup = std::fs::read_to_string("/sys/fs/cgroup/memory.max")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    Some(cgroup.map_or(phys, |c| c.min(phys)))
}

/// The runtime environment of trajstore's SQL sessions: a spilling memory pool of
/// [`memory_limit`] bytes (sorts, aggregations and joins that can spill do, to the OS temporary
/// directory; what cannot fails with DataFusion's "Resources exhausted", naming the largest
/// consumers).
pub fn runtime_env() -> Result<Arc<RuntimeEnv>> {
    let (limit, _) = memory_limit()?;
    let pool = TrackConsumersPool::new(
        FairSpillPool::new(usize::try_from(limit).unwrap_or(usize::MAX)),
        std::num::NonZeroUsize::new(5).expect("5 > 0"),
    );
    Ok(RuntimeEnvBuilder::new()
        .with_memory_pool(Arc::new(pool))
        .build_arc()?)
}

/// `e`, with what to do about it when the query ran out of its memory pool.
pub(crate) fn explain_exhausted(e: Error) -> Error {
    use datafusion::error::DataFusionError;
    match e {
        Error::Sql(df) if matches!(df.find_root(), DataFusionError::ResourcesExhausted(_)) => {
            let (limit, from) = memory_limit().unwrap_or((0, "unknown"));
            Error::Sql(DataFusionError::Context(
                format!(
                    "the query needs more memory than the SQL limit of {:.1} GiB ({from}); \
                     raise it with `trajstore sql --memory-limit SIZE`, {MEMORY_LIMIT_ENV}=SIZE or \
                     `trajstore.set_sql_memory_limit` in Python, or select fewer rows or \
                     columns",
                    limit as f64 / (1u64 << 30) as f64
                ),
                Box::new(df),
            ))
        }
        e => e,
    }
}

/// Counts expression nesting, stopping at the first expression deeper than the bound.
struct Depth {
    now: usize,
    max: usize,
}

impl Visitor for Depth {
    type Break = ();

    fn pre_visit_expr(&mut self, _: &Expr) -> ControlFlow<()> {
        self.now += 1;
        self.max = self.max.max(self.now);
        if self.now > MAX_EXPR_DEPTH {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    }

    fn post_visit_expr(&mut self, _: &Expr) -> ControlFlow<()> {
        self.now -= 1;
        ControlFlow::Continue(())
    }
}

fn statement_depth(s: &Statement, d: &mut Depth) -> ControlFlow<()> {
    match s {
        Statement::Statement(s) => s.visit(d),
        Statement::Explain(e) => statement_depth(&e.statement, d),
        Statement::CopyTo(c) => match &c.source {
            CopyToSource::Query(q) => q.visit(d),
            CopyToSource::Relation(_) => ControlFlow::Continue(()),
        },
        Statement::CreateExternalTable(_) | Statement::Reset(_) => ControlFlow::Continue(()),
    }
}

/// Refuses `sql` when an expression in it is nested deeper than [`MAX_EXPR_DEPTH`]. SQL that
/// does not parse passes (DataFusion reports the syntax error with its position). Runs on the
/// caller's thread: call it from one with [`SQL_STACK_BYTES`] of stack (see [`on_sql_stack`]).
pub(crate) fn check_depth(sql: &str) -> Result<()> {
    let Ok(statements) = DFParser::parse_sql(sql) else {
        return Ok(());
    };
    let mut d = Depth { now: 0, max: 0 };
    let too_deep = statements
        .iter()
        .any(|s| statement_depth(s, &mut d).is_break());
    // The parsed tree is dropped here, on the big stack (dropping a deep tree recurses too).
    drop(statements);
    if too_deep {
        return Err(Error::argument(
            "sql",
            format!(
                "an expression is nested more than {MAX_EXPR_DEPTH} deep (a long chain of \
                 AND/OR/+ terms, or nested calls); like SQLite and DuckDB, trajstore refuses \
                 it rather than risk the stack. For a list of values use `x IN (v1, v2, ...)`, \
                 whose length has no limit"
            ),
        ));
    }
    Ok(())
}

/// Runs `f` on a thread with [`SQL_STACK_BYTES`] of stack and waits for it: DataFusion plans
/// recursively (parsing, `Expr` clones and rewrites, physical planning), deeper than a
/// training thread's or Python's stack may allow for expressions near [`MAX_EXPR_DEPTH`].
pub(crate) fn on_sql_stack<T: Send>(f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
    std::thread::scope(|s| {
        let h = std::thread::Builder::new()
            .name("trajstore-sql".into())
            .stack_size(SQL_STACK_BYTES)
            .spawn_scoped(s, f)
            .map_err(|e| Error::invalid_argument(format!("cannot start the SQL thread: {e}")))?;
        h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(n: usize, op: &str) -> String {
        let terms: Vec<String> = (0..n).map(|i| format!("episode_id = {i}")).collect();
        format!("SELECT episode_id FROM episodes WHERE {}", terms.join(op))
    }

    #[test]
    fn depth_is_counted_and_bounded() {
        on_sql_stack(|| {
            // `n` terms `episode_id = i` joined by OR: n - 1 ORs, an `=` and its operand.
            check_depth(&chain(MAX_EXPR_DEPTH - 1, " OR "))?;
            assert!(check_depth(&chain(MAX_EXPR_DEPTH, " OR ")).is_err());
            let e = check_depth(&chain(20_000, " OR ")).unwrap_err();
            assert!(e.to_string().contains("nested more than 1000"), "{e}");
            let plus = format!("SELECT {} FROM t", vec!["1"; 5000].join(" + "));
            assert!(check_depth(&plus).is_err());
            // An IN list of any length is shallow.
            let ids: Vec<String> = (0..50_000).map(|i| i.to_string()).collect();
            check_depth(&format!(
                "SELECT * FROM episodes WHERE episode_id IN ({})",
                ids.join(",")
            ))?;
            // Inside EXPLAIN and COPY too.
            assert!(check_depth(&format!("EXPLAIN {plus}")).is_err());
            assert!(check_depth(&format!("COPY ({plus}) TO 'x.csv'")).is_err());
            // Not SQL: DataFusion says why.
            check_depth("SELEC 1")?;
            Ok(())
        })
        .unwrap();
    }

    #[test]
    fn sizes_parse_and_saturate() {
        assert_eq!(parse_size("8GiB"), Some(8 << 30));
        assert_eq!(parse_size("512MiB"), Some(512 << 20));
        assert_eq!(parse_size("1e400"), None);
        assert_eq!(parse_size("100"), None, "below 1 MiB");
        assert_eq!(parse_size("99999999999999999999999TiB"), Some(u64::MAX));
        assert_eq!(parse_size("-5GiB"), None);
    }
}
