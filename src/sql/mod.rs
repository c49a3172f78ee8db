//! SQL over a [`Snapshot`] through [DataFusion](https://datafusion.apache.org), and SQL-defined
//! training subsets. This is the only module that imports datafusion.
//!
//! [`register`] adds two tables to a `SessionContext`:
//!
//! - `transitions`: every column of the segments. Scans read the memory-mapped record batches
//!   **without copying** (cut into zero-copy slices of at most [`SCAN_BATCH_ROWS`] rows), one
//!   partition per segment, with projection and limit pushdown, inexact filter pushdown on
//!   `episode_id` and `step` (comparisons, `BETWEEN`, `IN`, `AND`/`OR` of them) that prunes whole
//!   segments and slices, and exact row-count statistics.
//! - `episodes`: one row per episode (`episode_id, length, episode_return, terminated, truncated`,
//!   `final_observation` when the schema has it), zero-copy views of the episode tables.
//!
//! [`register_deferred`] (and [`SqlSession::deferred`]) does the same from a [`Catalog`] when the
//! transitions are not local yet (a remote dataset): `transitions` is then opened by its first
//! scan, so queries of `episodes` alone never fetch transition files.
//! [`register_with_transitions`] (and [`SqlSession::with_transitions`]) takes the `transitions`
//! provider instead: with feature `remote`, a [`RemoteTransitions`] reads a remote version's
//! segment objects in place, fetching only the projected columns' buffers with ranged GETs (no
//! pull; `COUNT(*)` reads nothing).
//!
//! **SQL is read-only by default.** [`SqlSession`], [`query`], [`SnapshotSql::sql`] and
//! [`SnapshotSql::episodes_where`] check every statement against [`sql_options`]`(false)` before
//! anything runs: DDL (`CREATE EXTERNAL TABLE`, which reads any file the process can,
//! `CREATE TABLE [AS]`, `CREATE VIEW`, `DROP`), DML (`INSERT`, and `COPY ... TO`, which writes any
//! path the process can) and statements that change the session (`SET`, `PREPARE`, transactions)
//! are refused with [`Error::InvalidArgument`] naming the statement. A session opens them with
//! [`SqlSession::allow_writes`] (`trajstore sql --allow-writes`); subset queries never can.
//!
//! Both add the functions RL data needs for fixed-size-list (tensor) columns; DataFusion already has
//! `col[i]` (1-based, via `array_element`), `array_distance`, `array_normalize`, `array_sum`:
//!
//! | function | kind | result |
//! |---|---|---|
//! | `fsl_get(col, i)` | scalar | element `i` (1-based, like `col[i]`) without converting the list |
//! | `vec_norm(col)` | scalar | L2 norm as float64 |
//! | `dim_mean(col)`, `dim_min`, `dim_max`, `dim_std` | aggregate | fixed-size list of float64, one value per dimension (`dim_std` is the sample standard deviation) |
//! | `discounted_return(reward, step, gamma)` | aggregate | `sum(gamma^step * reward)`; order-independent |
//!
//! ```
//! # fn main() -> trajstore::Result<()> {
//! use trajstore::sql::SnapshotSql;
//! # let dir = tempfile::tempdir().unwrap();
//! # let spec = trajstore::synth::SynthSpec { transitions: 5_000, mean_episode_len: 50.0, ..Default::default() };
//! # let ds = trajstore::Dataset::create(dir.path().join("d"), &spec.schema()?)?;
//! # spec.write(&mut ds.writer(Default::default())?, None, |_| ())?;
//! let snap = ds.snapshot()?;
//! let top = snap.episodes_where(
//!     "SELECT episode_id FROM episodes ORDER BY episode_return DESC LIMIT 10",
//! )?;
//! assert_eq!(top.len(), 10);
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::compute::cast;
use arrow::datatypes::{DataType, SchemaRef, UInt64Type};
use datafusion::error::DataFusionError;
use datafusion::logical_expr::{AggregateUDF, LogicalPlan, ScalarUDF, WriteOp};
use datafusion::physical_plan::displayable;
use datafusion::prelude::{DataFrame, SQLOptions, SessionConfig, SessionContext};

use crate::error::{Error, Result};
use crate::format::col;
use crate::store::{Catalog, Snapshot};

#[cfg(feature = "ballista")]
pub mod ballista;
#[cfg(feature = "ballista")]
mod cluster_tables;
mod episode_agg;
mod functions;
pub mod limits;
mod readahead;
#[cfg(feature = "remote")]
mod remote_scan;
mod sized;
mod table;

use episode_agg::{EpisodeGroupBy, SegmentScan};
use functions::{DimAgg, DimKind, DiscountedReturn, FslGet, OctetLength, VecNorm};
pub use limits::{MAX_EXPR_DEPTH, memory_limit, set_memory_limit};
#[cfg(feature = "remote")]
pub use remote_scan::{FetchStats, RemoteTransitions};
use table::episodes_table;
pub use table::{DeferredTransitions, TransitionsTable};

/// The name of the physical optimizer rule that runs `GROUP BY episode_id` over `transitions`
/// as a pass over each segment's runs of equal ids (`EpisodeAggregateExec` in EXPLAIN). Remove
/// it from a session's rules to get DataFusion's hash aggregation instead.
pub const EPISODE_GROUP_BY_RULE: &str = episode_agg::RULE_NAME;
/// Name of the transitions table.
pub const TRANSITIONS: &str = "transitions";
/// Name of the episodes table.
pub const EPISODES: &str = "episodes";
/// Scans hand operators zero-copy slices of at most this many rows.
pub const SCAN_BATCH_ROWS: usize = 64 * 1024;

/// Registers the `transitions` and `episodes` tables of `snap` and trajstore's functions in `ctx`.
pub async fn register(ctx: &SessionContext, snap: &Snapshot) -> Result<()> {
    ctx.register_table(TRANSITIONS, Arc::new(TransitionsTable::new(snap)))?;
    ctx.register_table(EPISODES, Arc::new(episodes_table(&snap.catalog())?))?;
    register_functions(ctx);
    add_episode_group_by(ctx);
    Ok(())
}

/// Registers the tables of `catalog`'s version and trajstore's functions in `ctx` when its
/// transitions are not at hand yet (a remote dataset): `episodes` comes from the catalog, and
/// `transitions` is a [`DeferredTransitions`] that calls `open` on its first scan. Queries that
/// read only `episodes` never call it.
pub async fn register_deferred(
    ctx: &SessionContext,
    catalog: &Catalog,
    open: impl Fn() -> Result<Snapshot> + Send + Sync + 'static,
) -> Result<()> {
    ctx.register_table(
        TRANSITIONS,
        Arc::new(DeferredTransitions::new(catalog, open)),
    )?;
    ctx.register_table(EPISODES, Arc::new(episodes_table(catalog)?))?;
    register_functions(ctx);
    add_episode_group_by(ctx);
    Ok(())
}

/// Registers `transitions` (the given provider, e.g. a [`RemoteTransitions`] that reads a
/// dataset in object storage with ranged GETs), `episodes` from `catalog`, and trajstore's
/// functions in `ctx`. The provider must be of `catalog`'s version.
pub async fn register_with_transitions(
    ctx: &SessionContext,
    catalog: &Catalog,
    transitions: Arc<dyn datafusion::catalog::TableProvider>,
) -> Result<()> {
    ctx.register_table(TRANSITIONS, transitions)?;
    ctx.register_table(EPISODES, Arc::new(episodes_table(catalog)?))?;
    register_functions(ctx);
    add_episode_group_by(ctx);
    Ok(())
}

/// Adds the physical optimizer rule that runs `GROUP BY episode_id` over `transitions` as one
/// pass over each segment's runs of equal ids instead of a hash aggregation (see
/// [`EpisodeAggregateExec`](episode_agg)); it runs after DataFusion's own rules. Idempotent.
fn add_episode_group_by(ctx: &SessionContext) {
    let state = ctx.state_ref();
    let mut state = state.write();
    if state
        .physical_optimizers()
        .iter()
        .any(|r| r.name() == episode_agg::RULE_NAME)
    {
        return;
    }
    *state = datafusion::execution::SessionStateBuilder::new_from_existing(state.clone())
        .with_physical_optimizer_rule(Arc::new(EpisodeGroupBy))
        .build();
}

/// Registers trajstore's scalar and aggregate functions (see the module docs) in `ctx`.
pub fn register_functions(ctx: &SessionContext) {
    // DataFusion's functions whose output size an argument decides, checked against the memory
    // limit first (same names: they replace the built-ins).
    sized::sized_udfs()
        .into_iter()
        .for_each(|f| ctx.register_udf(f));
    trajstore_udfs()
        .into_iter()
        .for_each(|f| ctx.register_udf(f));
    trajstore_udafs()
        .into_iter()
        .for_each(|f| ctx.register_udaf(f));
}

/// trajstore's scalar functions.
pub(crate) fn trajstore_udfs() -> Vec<ScalarUDF> {
    vec![
        ScalarUDF::new_from_impl(FslGet::new()),
        ScalarUDF::new_from_impl(VecNorm::new()),
        ScalarUDF::new_from_impl(OctetLength::new()),
    ]
}

/// trajstore's aggregate functions.
pub(crate) fn trajstore_udafs() -> Vec<AggregateUDF> {
    let dims = [DimKind::Mean, DimKind::Min, DimKind::Max, DimKind::Std]
        .map(|k| AggregateUDF::new_from_impl(DimAgg::new(k)));
    let mut all = dims.to_vec();
    all.push(AggregateUDF::new_from_impl(DiscountedReturn::new()));
    all
}

/// The session configuration trajstore uses: DataFusion's defaults with the information schema
/// on (so `SHOW TABLES` and `information_schema.columns` work).
pub fn default_config() -> SessionConfig {
    SessionConfig::new().with_information_schema(true)
}

/// DataFusion's [`SQLOptions`] for trajstore's sessions. With `allow_writes` false (the default
/// of [`SqlSession`], and always for subset queries) they refuse DDL (`CREATE EXTERNAL TABLE`,
/// `CREATE TABLE [AS]`, `CREATE VIEW`, `DROP ...`), DML (`INSERT`, `COPY ... TO`) and statements
/// (`SET`, `RESET`, `PREPARE`/`EXECUTE`, transactions), leaving queries (`SELECT`, `WITH`,
/// `EXPLAIN`, `SHOW`, `DESCRIBE`); with `allow_writes` true they allow everything.
///
/// For SQL run on your own context (e.g. one set up by [`register`]), use
/// `ctx.sql_with_options(sql, sql_options(false))`: `ctx.sql(sql)` runs anything, including
/// `COPY ... TO` any path.
pub fn sql_options(allow_writes: bool) -> SQLOptions {
    SQLOptions::new()
        .with_allow_ddl(allow_writes)
        .with_allow_dml(allow_writes)
        .with_allow_statements(allow_writes)
}

/// What a session says when it refuses a statement: how to allow it.
const SESSION_WRITES_HINT: &str = "SQL is read-only unless the session allows writes \
    (`SqlSession::allow_writes(true)` in Rust, `trajstore sql --allow-writes` on the command line)";
/// What a subset query says when it refuses a statement (subset queries never write).
const SUBSET_HINT: &str =
    "a subset query (`episodes_where`, `--episodes`) is read-only: a SELECT of `episode_id`s";

/// Refuses expressions deeper than [`MAX_EXPR_DEPTH`], plans `sql` in `ctx`, checks the plan against [`sql_options`]`(allow_writes)` and only then
/// runs what must run at once (DDL, `SET`): [`SessionContext::sql_with_options`], with an error
/// that names the refused statement and says `hint`.
async fn checked_sql(
    ctx: &SessionContext,
    sql: &str,
    allow_writes: bool,
    hint: &str,
) -> Result<DataFrame> {
    limits::check_depth(sql)?;
    let plan = ctx.state().create_logical_plan(sql).await?;
    if let Err(e) = sql_options(allow_writes).verify_plan(&plan) {
        let (what, why) = refused(&plan).unwrap_or_else(|| (e.to_string(), "it is not a query"));
        return Err(Error::argument(
            "sql",
            format!("{what} is refused: {why}; {hint}"),
        ));
    }
    Ok(ctx.execute_logical_plan(plan).await?)
}

/// The first node of `plan` (subqueries included) that a read-only session refuses: the
/// statement in SQL words, and what it would do.
fn refused(plan: &LogicalPlan) -> Option<(String, &'static str)> {
    use datafusion::common::tree_node::TreeNodeRecursion;
    let mut found = None;
    let _ = plan.apply_with_subqueries(|node| {
        found = match node {
            LogicalPlan::Copy(_) => Some(("COPY ... TO".to_string(), "it writes files")),
            LogicalPlan::Ddl(ddl) => Some(match ddl.name() {
                "CreateExternalTable" => (
                    "CREATE EXTERNAL TABLE".to_string(),
                    "it reads files outside the dataset",
                ),
                "CreateMemoryTable" => ("CREATE TABLE".to_string(), "it adds a table"),
                name => (sql_words(name), "it changes the session's tables"),
            }),
            LogicalPlan::Dml(dml) => Some((
                match &dml.op {
                    WriteOp::Ctas => "CREATE TABLE AS".to_string(),
                    op => op.name().to_uppercase(),
                },
                "it writes to a table",
            )),
            LogicalPlan::Statement(st) => Some((
                match st.name() {
                    "SetVariable" => "SET".to_string(),
                    "ResetVariable" => "RESET".to_string(),
                    name => sql_words(name),
                },
                "it changes the session",
            )),
            _ => None,
        };
        Ok(if found.is_some() {
            TreeNodeRecursion::Stop
        } else {
            TreeNodeRecursion::Continue
        })
    });
    found
}

/// `CreateView` -> `CREATE VIEW`.
fn sql_words(name: &str) -> String {
    let mut out = String::new();
    for c in name.chars() {
        if c.is_uppercase() && !out.is_empty() {
            out.push(' ');
        }
        out.extend(c.to_uppercase());
    }
    out
}

/// A session context with `config` and the tables and functions of `snap` registered.
pub async fn context(snap: &Snapshot, config: SessionConfig) -> Result<SessionContext> {
    let ctx = SessionContext::new_with_config_rt(config, limits::runtime_env()?);
    register(&ctx, snap).await?;
    Ok(ctx)
}

/// A query's result: its schema (also when there are no rows) and its batches.
#[derive(Debug, Clone)]
pub struct QueryResult {
    /// The result schema.
    pub schema: SchemaRef,
    /// The result rows.
    pub batches: Vec<RecordBatch>,
}

impl QueryResult {
    /// Total rows.
    pub fn num_rows(&self) -> usize {
        self.batches.iter().map(|b| b.num_rows()).sum()
    }
}

/// A SQL session over one snapshot for synchronous callers: a [`SessionContext`] with the tables
/// registered and the tokio runtime that runs its queries (scans of different partitions run on
/// different threads).
///
/// A session is **read-only** unless [`allow_writes`](Self::allow_writes) opens it: its
/// [`query`](Self::query) and [`explain`](Self::explain) refuse DDL, DML, `COPY` and `SET` (see
/// [`sql_options`]) with [`Error::InvalidArgument`] before anything runs.
///
/// ```
/// # fn main() -> trajstore::Result<()> {
/// # let dir = tempfile::tempdir().unwrap();
/// # let spec = trajstore::synth::SynthSpec { transitions: 1_000, ..Default::default() };
/// # let ds = trajstore::Dataset::create(dir.path().join("d"), &spec.schema()?)?;
/// # spec.write(&mut ds.writer(Default::default())?, None, |_| ())?;
/// use trajstore::sql::SqlSession;
/// let out = dir.path().join("episodes.csv");
/// let copy = format!(
///     "COPY (SELECT episode_id, length FROM episodes) TO '{}' STORED AS CSV",
///     out.display()
/// );
/// let s = SqlSession::try_new(&ds.snapshot()?)?;
/// assert!(s.query(&copy).is_err() && !out.exists()); // read-only: refused, nothing written
/// let s = s.allow_writes(true);
/// s.query(&copy)?;
/// assert!(out.exists());
/// # Ok(()) }
/// ```
pub struct SqlSession {
    ctx: SessionContext,
    rt: tokio::runtime::Runtime,
    allow_writes: bool,
}

impl fmt::Debug for SqlSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlSession")
            .field("allow_writes", &self.allow_writes)
            .finish_non_exhaustive()
    }
}

impl SqlSession {
    /// A session over `snap` with [`default_config`].
    pub fn try_new(snap: &Snapshot) -> Result<Self> {
        Self::with_config(snap, default_config())
    }

    /// A session over `snap` with `config` (e.g. `default_config().with_target_partitions(1)`).
    pub fn with_config(snap: &Snapshot, config: SessionConfig) -> Result<Self> {
        let rt = runtime()?;
        let ctx = rt.block_on(context(snap, config))?;
        Ok(Self {
            ctx,
            rt,
            allow_writes: false,
        })
    }

    /// A session over `catalog`'s version whose `transitions` table calls `open` on its first
    /// scan (see [`register_deferred`]): for a remote dataset, `open` pulls the transition files,
    /// which queries of `episodes` alone never need.
    pub fn deferred(
        catalog: &Catalog,
        open: impl Fn() -> Result<Snapshot> + Send + Sync + 'static,
    ) -> Result<Self> {
        let rt = runtime()?;
        let ctx = SessionContext::new_with_config_rt(default_config(), limits::runtime_env()?);
        rt.block_on(register_deferred(&ctx, catalog, open))?;
        Ok(Self {
            ctx,
            rt,
            allow_writes: false,
        })
    }

    /// A session over `catalog`'s version whose `transitions` table is `transitions` (see
    /// [`register_with_transitions`]). For a dataset in object storage, without a pull:
    ///
    /// ```no_run
    /// # fn main() -> trajstore::Result<()> {
    /// use std::sync::Arc;
    /// use trajstore::remote::{Remote, RemoteOptions};
    /// use trajstore::sql::{RemoteTransitions, SqlSession};
    /// let remote = Remote::open("s3://bucket/runs/walker", RemoteOptions::default())?;
    /// let (catalog, _) = remote.catalog(std::path::Path::new("/tmp/mirror"), None)?;
    /// let table = Arc::new(RemoteTransitions::new(&remote, &catalog)?);
    /// let s = SqlSession::with_transitions(&catalog, table.clone())?;
    /// s.query("SELECT avg(reward) FROM transitions")?;
    /// println!("{} bytes downloaded", table.fetched().bytes);
    /// # Ok(()) }
    /// ```
    pub fn with_transitions(
        catalog: &Catalog,
        transitions: Arc<dyn datafusion::catalog::TableProvider>,
    ) -> Result<Self> {
        let rt = runtime()?;
        let ctx = SessionContext::new_with_config_rt(default_config(), limits::runtime_env()?);
        rt.block_on(register_with_transitions(&ctx, catalog, transitions))?;
        Ok(Self {
            ctx,
            rt,
            allow_writes: false,
        })
    }

    /// With `allow` true, this session also runs SQL that reads or writes outside the dataset or
    /// changes the session: DDL (`CREATE EXTERNAL TABLE ... LOCATION` reads any file the process
    /// can read; `CREATE TABLE [AS]`, `CREATE VIEW`, `DROP`), DML (`INSERT`; `COPY ... TO` writes
    /// any path the process can write) and statements (`SET`, `PREPARE`, transactions). Sessions
    /// start read-only (`false`); open one only for SQL you trust, never for SQL from a config
    /// file or a user.
    pub fn allow_writes(mut self, allow: bool) -> Self {
        self.allow_writes = allow;
        self
    }

    /// Whether [`allow_writes`](Self::allow_writes) opened this session.
    pub fn writes_allowed(&self) -> bool {
        self.allow_writes
    }

    /// The DataFusion context (to register more tables or functions). SQL run on it directly
    /// skips this session's check: use `sql_with_options(sql, `[`sql_options`]`(false))`, not
    /// `sql(sql)`, for SQL you do not trust.
    pub fn context(&self) -> &SessionContext {
        &self.ctx
    }

    /// Runs `sql` and collects its result. Unless the session
    /// [allows writes](Self::allow_writes), SQL other than a query is refused (see
    /// [`sql_options`]) before anything runs.
    pub fn query(&self, sql: &str) -> Result<QueryResult> {
        self.collect(sql, self.allow_writes, SESSION_WRITES_HINT)
    }

    /// Runs `sql`, checked against [`sql_options`]`(allow_writes)`, and collects its result.
    ///
    /// Runs on a thread with a stack sized for [`MAX_EXPR_DEPTH`]; the collected result counts
    /// against the session's memory pool (a result larger than the limit is an error, not an
    /// OOM kill).
    fn collect(&self, sql: &str, allow_writes: bool, hint: &str) -> Result<QueryResult> {
        use datafusion::execution::memory_pool::MemoryConsumer;
        use futures::StreamExt;
        limits::on_sql_stack(|| {
            self.rt.block_on(async {
                let df = checked_sql(&self.ctx, sql, allow_writes, hint).await?;
                let schema = Arc::new(df.schema().as_arrow().clone());
                let pool = self.ctx.runtime_env().memory_pool.clone();
                let held = MemoryConsumer::new("query result").register(&pool);
                let mut stream = df.execute_stream().await?;
                let mut batches = vec![];
                while let Some(b) = stream.next().await {
                    let b = b?;
                    let bytes: usize = b
                        .columns()
                        .iter()
                        .map(|c| c.to_data().get_slice_memory_size().unwrap_or(0))
                        .sum();
                    held.try_grow(bytes)?;
                    batches.push(b);
                }
                Ok(QueryResult { schema, batches })
            })
        })
        .map_err(limits::explain_exhausted)
    }

    /// The physical plan of `sql`, indented, one operator a line; with `schemas`, each operator's
    /// output schema too (which shows the columns a scan reads). Checked like
    /// [`query`](Self::query): planning DDL would run it.
    pub fn explain(&self, sql: &str, schemas: bool) -> Result<String> {
        limits::on_sql_stack(|| {
            self.rt.block_on(async {
                let df =
                    checked_sql(&self.ctx, sql, self.allow_writes, SESSION_WRITES_HINT).await?;
                let plan = df.create_physical_plan().await?;
                Ok(displayable(plan.as_ref())
                    .set_show_schema(schemas)
                    .indent(true)
                    .to_string())
            })
        })
    }

    /// Names of the tables in the default schema, sorted.
    pub fn table_names(&self) -> Vec<String> {
        let mut names = self
            .ctx
            .catalog("datafusion")
            .and_then(|c| c.schema("public"))
            .map(|s| s.table_names())
            .unwrap_or_default();
        names.sort();
        names
    }

    /// The schema of table `name`.
    pub fn table_schema(&self, name: &str) -> Result<SchemaRef> {
        self.rt.block_on(async {
            let df = self.ctx.table(name).await?;
            Ok(Arc::new(df.schema().as_arrow().clone()))
        })
    }
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        // Executing an expression recurses as deep as it is nested (up to MAX_EXPR_DEPTH).
        .thread_stack_size(limits::SQL_STACK_BYTES / 4)
        .build()
        .map_err(|e| Error::Sql(DataFusionError::External(Box::new(e))))
}

/// Runs `sql` over `snap` (a convenience for one-off queries: builds a session each call).
/// Read-only: SQL other than a query is refused (see [`sql_options`]).
pub fn query(snap: &Snapshot, sql: &str) -> Result<Vec<RecordBatch>> {
    Ok(SqlSession::try_new(snap)?.query(sql)?.batches)
}

/// SQL on snapshots.
pub trait SnapshotSql {
    /// Runs `sql` over this snapshot's tables. Read-only: SQL other than a query (`COPY`,
    /// `CREATE EXTERNAL TABLE`, `INSERT`, `SET`, ...) is refused; see [`SqlSession::allow_writes`].
    fn sql(&self, sql: &str) -> Result<Vec<RecordBatch>>;
    /// The episode ids returned by `sql` (a query with an `episode_id` column), sorted and
    /// deduplicated, for [`crate::SamplerSpec::with_episode_ids`]. Cached per (dataset, version,
    /// query). Always read-only, so a subset query from a config file cannot read or write files:
    /// SQL other than a query is refused with [`Error::InvalidArgument`].
    fn episodes_where(&self, sql: &str) -> Result<Vec<u64>>;
}

/// SQL subsets of a dataset streamed from object storage ([`crate::remote::Stream`]).
#[cfg(feature = "remote")]
pub trait StreamSql {
    /// The ids of the episodes that SQL query `sql` returns (a query with an `episode_id`
    /// column, e.g. `SELECT episode_id FROM episodes WHERE episode_return > 3000`), sorted and
    /// distinct: for [`crate::SamplerSpec::with_episode_ids`]. `episodes` is answered from the
    /// stream's catalog; a query of `transitions` reads only its columns, with ranged GETs.
    fn episodes_where(&self, sql: &str) -> Result<Vec<u64>>;
}

#[cfg(feature = "remote")]
impl StreamSql for crate::remote::Stream {
    fn episodes_where(&self, sql: &str) -> Result<Vec<u64>> {
        let table = Arc::new(RemoteTransitions::new(&self.0.remote, &self.0.catalog)?);
        subset_ids(&SqlSession::with_transitions(&self.0.catalog, table)?, sql)
    }
}

/// The sorted, distinct `episode_id`s that subset query `sql` returns in `session`.
pub(crate) fn subset_ids(session: &SqlSession, sql: &str) -> Result<Vec<u64>> {
    let result = session.collect(sql, false, SUBSET_HINT)?;
    let idx = result.schema.index_of(col::EPISODE_ID).map_err(|_| {
        Error::argument(
            "sql",
            format!(
                "the subset query must return an `{}` column; it returns ({})",
                col::EPISODE_ID,
                result
                    .schema
                    .fields()
                    .iter()
                    .map(|f| f.name().as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )
    })?;
    let mut ids = Vec::with_capacity(result.num_rows());
    for b in &result.batches {
        let c = cast(b.column(idx), &DataType::UInt64).map_err(|e| {
            Error::argument(
                "sql",
                format!(
                    "the subset query's `{}` is not an id column: {e}",
                    col::EPISODE_ID
                ),
            )
        })?;
        if c.null_count() > 0 {
            return Err(Error::argument(
                "sql",
                format!(
                    "the subset query returned a null or negative `{}`",
                    col::EPISODE_ID
                ),
            ));
        }
        ids.extend_from_slice(c.as_primitive::<UInt64Type>().values());
    }
    ids.sort_unstable();
    ids.dedup();
    Ok(ids)
}

type SubsetKey = (PathBuf, u64, String);
static SUBSETS: OnceLock<Mutex<HashMap<SubsetKey, Arc<Vec<u64>>>>> = OnceLock::new();
const SUBSET_CACHE_ENTRIES: usize = 64;

impl SnapshotSql for Snapshot {
    fn sql(&self, sql: &str) -> Result<Vec<RecordBatch>> {
        query(self, sql)
    }

    fn episodes_where(&self, sql: &str) -> Result<Vec<u64>> {
        let key = (self.path().to_path_buf(), self.version(), sql.to_string());
        let cache = SUBSETS.get_or_init(Default::default);
        if let Some(ids) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return Ok(ids.as_ref().clone());
        }
        let ids = subset_ids(&SqlSession::try_new(self)?, sql)?;
        let mut c = cache.lock().unwrap_or_else(|e| e.into_inner());
        if c.len() >= SUBSET_CACHE_ENTRIES {
            c.clear();
        }
        c.insert(key, Arc::new(ids.clone()));
        Ok(ids)
    }
}
