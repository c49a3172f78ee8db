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

use arrow::array::{
    Array, ArrayRef, AsArray, FixedSizeListArray, Float64Array, RecordBatch, UInt64Array,
};
use arrow::compute::{cast, take};
use arrow::datatypes::{DataType, Field, FieldRef, Float64Type, SchemaRef, UInt64Type};
use async_trait::async_trait;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::stats::Precision;
use datafusion::common::{ScalarValue, Statistics};
use datafusion::datasource::memory::{DataSourceExec, MemTable, MemorySourceConfig};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, ColumnarValue, Expr, Operator, ScalarFunctionArgs,
    ScalarUDF, ScalarUDFImpl, Signature, TableProviderFilterPushDown, TableType, Volatility,
};
use datafusion::physical_plan::{ExecutionPlan, displayable};
use datafusion::prelude::{SessionConfig, SessionContext};

use crate::dataset::{Catalog, Snapshot};
use crate::error::{Error, Result};
use crate::format::{col, ep};

mod episode_agg;
use episode_agg::{EpisodeGroupBy, SegmentScan};

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
    ctx.register_udf(ScalarUDF::new_from_impl(FslGet::new()));
    ctx.register_udf(ScalarUDF::new_from_impl(VecNorm::new()));
    for kind in [DimKind::Mean, DimKind::Min, DimKind::Max, DimKind::Std] {
        ctx.register_udaf(AggregateUDF::new_from_impl(DimAgg::new(kind)));
    }
    ctx.register_udaf(AggregateUDF::new_from_impl(DiscountedReturn::new()));
}

/// The session configuration trajstore uses: DataFusion's defaults with the information schema
/// on (so `SHOW TABLES` and `information_schema.columns` work).
pub fn default_config() -> SessionConfig {
    SessionConfig::new().with_information_schema(true)
}

/// A session context with `config` and the tables and functions of `snap` registered.
pub async fn context(snap: &Snapshot, config: SessionConfig) -> Result<SessionContext> {
    let ctx = SessionContext::new_with_config(config);
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
pub struct SqlSession {
    ctx: SessionContext,
    rt: tokio::runtime::Runtime,
}

impl fmt::Debug for SqlSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlSession").finish_non_exhaustive()
    }
}

impl SqlSession {
    /// A session over `snap` with [`default_config`].
    pub fn new(snap: &Snapshot) -> Result<Self> {
        Self::with_config(snap, default_config())
    }

    /// A session over `snap` with `config` (e.g. `default_config().with_target_partitions(1)`).
    pub fn with_config(snap: &Snapshot, config: SessionConfig) -> Result<Self> {
        let rt = runtime()?;
        let ctx = rt.block_on(context(snap, config))?;
        Ok(Self { ctx, rt })
    }

    /// A session over `catalog`'s version whose `transitions` table calls `open` on its first
    /// scan (see [`register_deferred`]): for a remote dataset, `open` pulls the transition files,
    /// which queries of `episodes` alone never need.
    pub fn deferred(
        catalog: &Catalog,
        open: impl Fn() -> Result<Snapshot> + Send + Sync + 'static,
    ) -> Result<Self> {
        let rt = runtime()?;
        let ctx = SessionContext::new_with_config(default_config());
        rt.block_on(register_deferred(&ctx, catalog, open))?;
        Ok(Self { ctx, rt })
    }

    /// The DataFusion context (to register more tables or functions).
    pub fn context(&self) -> &SessionContext {
        &self.ctx
    }

    /// Runs `sql` and collects its result.
    pub fn query(&self, sql: &str) -> Result<QueryResult> {
        self.rt.block_on(async {
            let df = self.ctx.sql(sql).await?;
            let schema = Arc::new(df.schema().as_arrow().clone());
            let batches = df.collect().await?;
            Ok(QueryResult { schema, batches })
        })
    }

    /// The physical plan of `sql`, indented, one operator a line; with `schemas`, each operator's
    /// output schema too (which shows the columns a scan reads).
    pub fn explain(&self, sql: &str, schemas: bool) -> Result<String> {
        self.rt.block_on(async {
            let plan = self.ctx.sql(sql).await?.create_physical_plan().await?;
            Ok(displayable(plan.as_ref())
                .set_show_schema(schemas)
                .indent(true)
                .to_string())
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
        .build()
        .map_err(|e| Error::Sql(DataFusionError::External(Box::new(e))))
}

/// Runs `sql` over `snap` (a convenience for one-off queries: builds a session each call).
pub fn query(snap: &Snapshot, sql: &str) -> Result<Vec<RecordBatch>> {
    Ok(SqlSession::new(snap)?.query(sql)?.batches)
}

/// SQL on snapshots.
pub trait SnapshotSql {
    /// Runs `sql` over this snapshot's tables.
    fn sql(&self, sql: &str) -> Result<Vec<RecordBatch>>;
    /// The episode ids returned by `sql` (a query with an `episode_id` column), sorted and
    /// deduplicated, for [`crate::SliceOptions::with_episode_ids`]. Cached per (dataset, version,
    /// query).
    fn episodes_where(&self, sql: &str) -> Result<Vec<u64>>;
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
        let result = SqlSession::new(self)?.query(sql)?;
        let idx = result.schema.index_of(col::EPISODE_ID).map_err(|_| {
            Error::InvalidArgument(format!(
                "the subset query must return an `{}` column; it returns ({})",
                col::EPISODE_ID,
                result
                    .schema
                    .fields()
                    .iter()
                    .map(|f| f.name().as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })?;
        let mut ids = Vec::with_capacity(result.num_rows());
        for b in &result.batches {
            let c = cast(b.column(idx), &DataType::UInt64).map_err(|e| {
                Error::InvalidArgument(format!("`{}` is not an id column: {e}", col::EPISODE_ID))
            })?;
            if c.null_count() > 0 {
                return Err(Error::InvalidArgument(format!(
                    "the subset query returned a null or negative `{}`",
                    col::EPISODE_ID
                )));
            }
            ids.extend_from_slice(c.as_primitive::<UInt64Type>().values());
        }
        ids.sort_unstable();
        ids.dedup();
        let mut c = cache.lock().unwrap_or_else(|e| e.into_inner());
        if c.len() >= SUBSET_CACHE_ENTRIES {
            c.clear();
        }
        c.insert(key, Arc::new(ids.clone()));
        Ok(ids)
    }
}

// ---------------------------------------------------------------------------------------------
// Tables

/// One zero-copy slice of a segment's batch, with the ranges it covers (inclusive, as f64).
#[derive(Debug, Clone)]
struct Part {
    episodes: (f64, f64),
    steps: (f64, f64),
    batch: RecordBatch,
}

/// The `transitions` table: a provider over the mapped segments.
#[derive(Debug)]
pub struct TransitionsTable {
    schema: SchemaRef,
    /// One entry per segment.
    segments: Vec<Vec<Part>>,
    /// The episode ids of each segment (`first..end`).
    episodes: Vec<(u64, u64)>,
    rows: usize,
}

impl TransitionsTable {
    /// The table over `snap`'s segments. O(segments + episodes); no transition is read except
    /// the first and last `episode_id` of each slice.
    pub fn new(snap: &Snapshot) -> Self {
        let schema = snap.schema().arrow_schema().clone();
        let mut rows = 0;
        let segments = snap
            .segments()
            .iter()
            .map(|seg| {
                let max_len = seg
                    .episode_table()
                    .column_by_name(ep::LENGTH)
                    .map(|c| c.as_primitive::<UInt64Type>())
                    .and_then(|c| c.values().iter().copied().max())
                    .unwrap_or(0);
                let steps = (0.0, max_len.saturating_sub(1) as f64);
                let mut parts = vec![];
                for b in seg.batches() {
                    let ids = b
                        .column_by_name(col::EPISODE_ID)
                        .map(|c| c.as_primitive::<UInt64Type>().clone());
                    let mut off = 0;
                    while off < b.num_rows() {
                        let len = SCAN_BATCH_ROWS.min(b.num_rows() - off);
                        let episodes = match &ids {
                            // Rows are in episode order: the first and last ids bound the slice.
                            Some(ids) => (ids.value(off) as f64, ids.value(off + len - 1) as f64),
                            None => (f64::NEG_INFINITY, f64::INFINITY),
                        };
                        parts.push(Part {
                            episodes,
                            steps,
                            batch: b.slice(off, len),
                        });
                        off += len;
                    }
                }
                rows += seg.num_rows() as usize;
                parts
            })
            .collect();
        let episodes = snap
            .segments()
            .iter()
            .map(|s| {
                let e = s.entry();
                (e.first_episode_id, e.first_episode_id + e.episodes)
            })
            .collect();
        Self {
            schema,
            segments,
            episodes,
            rows,
        }
    }
}

#[async_trait]
impl TableProvider for TransitionsTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let mut partitions: Vec<Vec<RecordBatch>> = vec![];
        let mut episodes = vec![];
        let mut budget = limit.filter(|_| filters.is_empty());
        'segments: for (seg, &ids) in self.segments.iter().zip(&self.episodes) {
            let mut batches = vec![];
            for p in seg {
                if budget == Some(0) {
                    if !batches.is_empty() {
                        partitions.push(batches);
                        episodes.push(ids);
                    }
                    break 'segments;
                }
                if filters.iter().all(|f| may_match(f, p).unwrap_or(true)) {
                    if let Some(b) = &mut budget {
                        *b = b.saturating_sub(p.batch.num_rows());
                    }
                    batches.push(p.batch.clone());
                }
            }
            if !batches.is_empty() {
                partitions.push(batches);
                episodes.push(ids);
            }
        }
        if partitions.is_empty() {
            partitions.push(vec![]);
            episodes.push((0, 0));
        }
        // No output ordering is declared although each segment is in (episode_id, step) order:
        // with it, GROUP BY episode_id took an order-preserving repartition that was 2x slower.
        // `SegmentScan` carries what GROUP BY episode_id needs instead (see `episode_agg`).
        let source =
            MemorySourceConfig::try_new(&partitions, self.schema.clone(), projection.cloned())?
                .with_limit(limit);
        Ok(DataSourceExec::from_data_source(SegmentScan::new(
            source, episodes,
        )))
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> DfResult<Vec<TableProviderFilterPushDown>> {
        Ok(filters.iter().map(|f| pushdown(f, &self.schema)).collect())
    }

    fn statistics(&self) -> Option<Statistics> {
        Some(Statistics::new_unknown(&self.schema).with_num_rows(Precision::Exact(self.rows)))
    }
}

/// The `transitions` table of a version whose transition files are not at hand yet (a remote
/// dataset read through its [`Catalog`]). Planning needs only the schema and the row count,
/// which the catalog has; the first scan calls `open` (e.g. a pull of the transition files) on a
/// blocking thread and scans a [`TransitionsTable`] over the snapshot it returns, which must be
/// the catalog's version. A failed `open` is retried by the next scan.
pub struct DeferredTransitions {
    schema: SchemaRef,
    version: u64,
    rows: usize,
    state: Arc<Deferred>,
}

type OpenFn = dyn Fn() -> Result<Snapshot> + Send + Sync;

struct Deferred {
    open: Box<OpenFn>,
    table: Mutex<Option<Arc<TransitionsTable>>>,
}

impl fmt::Debug for DeferredTransitions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeferredTransitions")
            .field("version", &self.version)
            .field("rows", &self.rows)
            .finish_non_exhaustive()
    }
}

impl DeferredTransitions {
    /// The table of `catalog`'s version; `open` is called on the first scan.
    pub fn new(
        catalog: &Catalog,
        open: impl Fn() -> Result<Snapshot> + Send + Sync + 'static,
    ) -> Self {
        Self {
            schema: catalog.schema().arrow_schema().clone(),
            version: catalog.version(),
            rows: catalog.num_transitions() as usize,
            state: Arc::new(Deferred {
                open: Box::new(open),
                table: Mutex::new(None),
            }),
        }
    }

    /// Whether `open` has been called successfully.
    pub fn is_open(&self) -> bool {
        self.state
            .table
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    async fn table(&self) -> DfResult<Arc<TransitionsTable>> {
        let (state, version) = (self.state.clone(), self.version);
        tokio::task::spawn_blocking(move || -> Result<Arc<TransitionsTable>> {
            let mut slot = state.table.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(t) = &*slot {
                return Ok(t.clone());
            }
            let snap = (state.open)()?;
            if snap.version() != version {
                return Err(Error::InvalidData(format!(
                    "the transitions opened are of version {}, the catalog's of version {version}",
                    snap.version()
                )));
            }
            let t = Arc::new(TransitionsTable::new(&snap));
            *slot = Some(t.clone());
            Ok(t)
        })
        .await
        .map_err(|e| DataFusionError::External(Box::new(e)))?
        .map_err(|e| DataFusionError::External(Box::new(e)))
    }
}

#[async_trait]
impl TableProvider for DeferredTransitions {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        self.table()
            .await?
            .scan(state, projection, filters, limit)
            .await
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> DfResult<Vec<TableProviderFilterPushDown>> {
        Ok(filters.iter().map(|f| pushdown(f, &self.schema)).collect())
    }

    fn statistics(&self) -> Option<Statistics> {
        Some(Statistics::new_unknown(&self.schema).with_num_rows(Precision::Exact(self.rows)))
    }
}

/// How a `transitions` scan handles filter `f`: inexact when it prunes by `episode_id`/`step`.
fn pushdown(f: &Expr, schema: &SchemaRef) -> TableProviderFilterPushDown {
    let probe = Part {
        episodes: (0.0, 0.0),
        steps: (0.0, 0.0),
        batch: RecordBatch::new_empty(schema.clone()),
    };
    match may_match(f, &probe) {
        Some(_) => TableProviderFilterPushDown::Inexact,
        None => TableProviderFilterPushDown::Unsupported,
    }
}

/// Whether rows of `p` may satisfy `e`; `None` when `e` is not a predicate on `episode_id`/`step`
/// that this understands (so nothing can be pruned by it).
fn may_match(e: &Expr, p: &Part) -> Option<bool> {
    match e {
        Expr::BinaryExpr(b) if b.op == Operator::And => {
            match (may_match(&b.left, p), may_match(&b.right, p)) {
                (None, None) => None,
                (l, r) => Some(l.unwrap_or(true) && r.unwrap_or(true)),
            }
        }
        Expr::BinaryExpr(b) if b.op == Operator::Or => {
            Some(may_match(&b.left, p)? || may_match(&b.right, p)?)
        }
        Expr::BinaryExpr(b) => {
            let (range, v, op) = match (column_range(&b.left, p), literal(&b.right)) {
                (Some(r), Some(v)) => (r, v, b.op),
                _ => (column_range(&b.right, p)?, literal(&b.left)?, b.op.swap()?),
            };
            let (lo, hi) = range;
            Some(match op {
                Operator::Eq => lo <= v && v <= hi,
                Operator::NotEq => !(lo == hi && lo == v),
                Operator::Lt => lo < v,
                Operator::LtEq => lo <= v,
                Operator::Gt => hi > v,
                Operator::GtEq => hi >= v,
                _ => return None,
            })
        }
        Expr::Between(b) if !b.negated => {
            let (lo, hi) = column_range(&b.expr, p)?;
            let (a, z) = (literal(&b.low)?, literal(&b.high)?);
            Some(hi >= a && lo <= z)
        }
        Expr::InList(l) if !l.negated => {
            let (lo, hi) = column_range(&l.expr, p)?;
            let vals = l.list.iter().map(literal).collect::<Option<Vec<_>>>()?;
            Some(vals.iter().any(|&v| lo <= v && v <= hi))
        }
        _ => None,
    }
}

/// The range of `episode_id` or `step` in `p` if `e` is one of those columns (possibly widened
/// by an order-preserving cast).
fn column_range(e: &Expr, p: &Part) -> Option<(f64, f64)> {
    match e {
        Expr::Column(c) if c.name == col::EPISODE_ID => Some(p.episodes),
        Expr::Column(c) if c.name == col::STEP => Some(p.steps),
        Expr::Cast(c)
            if matches!(
                c.field.data_type(),
                DataType::Int64
                    | DataType::UInt64
                    | DataType::Float64
                    | DataType::Decimal128(_, _)
                    | DataType::Decimal256(_, _)
            ) =>
        {
            column_range(&c.expr, p)
        }
        _ => None,
    }
}

/// A numeric literal as f64 (exact for ids below 2^53).
fn literal(e: &Expr) -> Option<f64> {
    let Expr::Literal(v, _) = e else {
        return None;
    };
    Some(match v {
        ScalarValue::Int8(Some(x)) => *x as f64,
        ScalarValue::Int16(Some(x)) => *x as f64,
        ScalarValue::Int32(Some(x)) => *x as f64,
        ScalarValue::Int64(Some(x)) => *x as f64,
        ScalarValue::UInt8(Some(x)) => *x as f64,
        ScalarValue::UInt16(Some(x)) => *x as f64,
        ScalarValue::UInt32(Some(x)) => *x as f64,
        ScalarValue::UInt64(Some(x)) => *x as f64,
        ScalarValue::Float32(Some(x)) if x.is_finite() => *x as f64,
        ScalarValue::Float64(Some(x)) if x.is_finite() => *x,
        ScalarValue::Decimal128(Some(x), _, s) => *x as f64 / 10f64.powi(*s as i32),
        _ => return None,
    })
}

/// The `episodes` table: zero-copy projections of the episode tables, one partition per segment.
fn episodes_table(catalog: &Catalog) -> Result<MemTable> {
    let full = catalog.schema().episode_schema();
    let keep: Vec<usize> = (0..full.fields().len())
        .filter(|&i| full.field(i).name() != ep::ROW_START)
        .collect();
    let schema = Arc::new(full.project(&keep)?);
    let mut parts: Vec<Vec<RecordBatch>> = catalog
        .episode_tables()
        .iter()
        .map(|t| Ok(vec![t.project(&keep)?]))
        .collect::<Result<_>>()?;
    if parts.is_empty() {
        parts.push(vec![]);
    }
    Ok(MemTable::try_new(schema, parts)?)
}

// ---------------------------------------------------------------------------------------------
// Scalar functions

fn fsl_arg<'a>(name: &str, a: &'a ArrayRef) -> DfResult<&'a FixedSizeListArray> {
    a.as_fixed_size_list_opt().ok_or_else(|| {
        DataFusionError::Plan(format!(
            "{name} takes a fixed-size-list column, got {}",
            a.data_type()
        ))
    })
}

fn fsl_type_check(name: &str, t: &DataType) -> DfResult<(FieldRef, i32)> {
    match t {
        DataType::FixedSizeList(f, n) if f.data_type().is_numeric() => Ok((f.clone(), *n)),
        other => Err(DataFusionError::Plan(format!(
            "{name} takes a fixed-size list of numbers (e.g. observation or action), got {other}"
        ))),
    }
}

/// `fsl_get(col, i)`: element `i` (1-based) of each fixed-size list; null when out of range.
#[derive(Debug, PartialEq, Eq, Hash)]
struct FslGet {
    signature: Signature,
}

impl FslGet {
    fn new() -> Self {
        Self {
            signature: Signature::any(2, Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for FslGet {
    fn name(&self) -> &str {
        "fsl_get"
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn return_type(&self, arg_types: &[DataType]) -> DfResult<DataType> {
        match &arg_types[0] {
            DataType::FixedSizeList(f, _) if arg_types[1].is_integer() => Ok(f.data_type().clone()),
            _ => Err(DataFusionError::Plan(format!(
                "fsl_get(list, index) takes a fixed-size list and an integer, got ({}, {})",
                arg_types[0], arg_types[1]
            ))),
        }
    }
    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let n = args.number_rows;
        let arrays = ColumnarValue::values_to_arrays(&args.args)?;
        let list = fsl_arg("fsl_get", &arrays[0])?;
        let idx = cast(&arrays[1], &DataType::Int64)?;
        let idx = idx.as_primitive::<arrow::datatypes::Int64Type>();
        // A fixed-size list's `values()` start at its first row (slicing slices them).
        let w = list.value_length() as i64;
        let indices: UInt64Array = (0..n)
            .map(|r| {
                if list.is_null(r) || idx.is_null(r) {
                    return None;
                }
                let i = idx.value(r);
                (1..=w).contains(&i).then(|| (r as i64 * w + i - 1) as u64)
            })
            .collect();
        Ok(ColumnarValue::Array(take(
            list.values().as_ref(),
            &indices,
            None,
        )?))
    }
}

/// `vec_norm(col)`: the L2 norm of each fixed-size list, as float64.
#[derive(Debug, PartialEq, Eq, Hash)]
struct VecNorm {
    signature: Signature,
}

impl VecNorm {
    fn new() -> Self {
        Self {
            signature: Signature::any(1, Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for VecNorm {
    fn name(&self) -> &str {
        "vec_norm"
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn return_type(&self, arg_types: &[DataType]) -> DfResult<DataType> {
        fsl_type_check("vec_norm", &arg_types[0])?;
        Ok(DataType::Float64)
    }
    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let arrays = ColumnarValue::values_to_arrays(&args.args)?;
        let list = fsl_arg("vec_norm", &arrays[0])?;
        let w = list.value_length() as usize;
        let values = f64_values(list)?;
        let out: Float64Array = (0..list.len())
            .map(|r| {
                (!list.is_null(r)).then(|| {
                    values[r * w..(r + 1) * w]
                        .iter()
                        .map(|x| x * x)
                        .sum::<f64>()
                        .sqrt()
                })
            })
            .collect();
        Ok(ColumnarValue::Array(Arc::new(out)))
    }
}

/// The values of `list`'s rows as f64, `len * width` of them.
fn f64_values(list: &FixedSizeListArray) -> DfResult<Vec<f64>> {
    let values = cast(list.values(), &DataType::Float64)?;
    Ok(values.as_primitive::<Float64Type>().values().to_vec())
}

// ---------------------------------------------------------------------------------------------
// Aggregates

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum DimKind {
    Mean,
    Min,
    Max,
    Std,
}

/// `dim_mean/min/max/std(col)`: per-dimension statistics of a fixed-size-list column.
#[derive(Debug, PartialEq, Eq, Hash)]
struct DimAgg {
    kind: DimKind,
    signature: Signature,
}

impl DimAgg {
    fn new(kind: DimKind) -> Self {
        Self {
            kind,
            signature: Signature::any(1, Volatility::Immutable),
        }
    }
}

fn f64_fsl_type(n: i32) -> DataType {
    DataType::FixedSizeList(Arc::new(Field::new_list_field(DataType::Float64, true)), n)
}

impl AggregateUDFImpl for DimAgg {
    fn name(&self) -> &str {
        match self.kind {
            DimKind::Mean => "dim_mean",
            DimKind::Min => "dim_min",
            DimKind::Max => "dim_max",
            DimKind::Std => "dim_std",
        }
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn return_type(&self, arg_types: &[DataType]) -> DfResult<DataType> {
        let (_, n) = fsl_type_check(self.name(), &arg_types[0])?;
        Ok(f64_fsl_type(n))
    }
    fn accumulator(&self, args: AccumulatorArgs) -> DfResult<Box<dyn Accumulator>> {
        let (_, n) = fsl_type_check(self.name(), args.expr_fields[0].data_type())?;
        Ok(Box::new(DimAccumulator::new(self.kind, n as usize)))
    }
    fn state_fields(&self, args: StateFieldsArgs) -> DfResult<Vec<FieldRef>> {
        let (_, n) = fsl_type_check(self.name(), args.input_fields[0].data_type())?;
        let f = |s: &str, t: DataType| Arc::new(Field::new(format!("{}_{s}", args.name), t, true));
        Ok(vec![
            f("count", DataType::UInt64),
            f("mean", f64_fsl_type(n)),
            f("m2", f64_fsl_type(n)),
            f("min", f64_fsl_type(n)),
            f("max", f64_fsl_type(n)),
        ])
    }
}

/// Count, mean, sum of squared deviations (merged with Chan et al.'s formula), min and max per
/// dimension.
#[derive(Debug)]
struct DimAccumulator {
    kind: DimKind,
    n: usize,
    count: u64,
    mean: Vec<f64>,
    m2: Vec<f64>,
    min: Vec<f64>,
    max: Vec<f64>,
}

impl DimAccumulator {
    fn new(kind: DimKind, n: usize) -> Self {
        Self {
            kind,
            n,
            count: 0,
            mean: vec![0.0; n],
            m2: vec![0.0; n],
            min: vec![f64::INFINITY; n],
            max: vec![f64::NEG_INFINITY; n],
        }
    }

    /// Merges a partial state (count, mean, m2, min, max) into this one.
    fn merge(&mut self, count: u64, mean: &[f64], m2: &[f64], min: &[f64], max: &[f64]) {
        if count == 0 {
            return;
        }
        let (na, nb) = (self.count as f64, count as f64);
        let total = na + nb;
        for d in 0..self.n {
            let delta = mean[d] - self.mean[d];
            self.mean[d] += delta * nb / total;
            self.m2[d] += m2[d] + delta * delta * na * nb / total;
            self.min[d] = self.min[d].min(min[d]);
            self.max[d] = self.max[d].max(max[d]);
        }
        self.count += count;
    }

    fn fsl(&self, v: &[f64]) -> ScalarValue {
        let item = Arc::new(Field::new_list_field(DataType::Float64, true));
        let values = Arc::new(Float64Array::from(v.to_vec()));
        ScalarValue::FixedSizeList(Arc::new(FixedSizeListArray::new(
            item,
            self.n as i32,
            values,
            None,
        )))
    }

    fn null(&self) -> ScalarValue {
        let item = Arc::new(Field::new_list_field(DataType::Float64, true));
        ScalarValue::FixedSizeList(Arc::new(FixedSizeListArray::new_null(
            item,
            self.n as i32,
            1,
        )))
    }
}

impl Accumulator for DimAccumulator {
    fn update_batch(&mut self, values: &[ArrayRef]) -> DfResult<()> {
        let list = fsl_arg("dim_*", &values[0])?;
        let (n, rows) = (self.n, list.len());
        let all = f64_values(list)?;
        let valid: Vec<usize> = (0..rows).filter(|&r| list.is_valid(r)).collect();
        if valid.is_empty() {
            return Ok(());
        }
        let k = valid.len() as f64;
        let mut mean = vec![0.0; n];
        let mut min = vec![f64::INFINITY; n];
        let mut max = vec![f64::NEG_INFINITY; n];
        for &r in &valid {
            let row = &all[r * n..(r + 1) * n];
            for d in 0..n {
                mean[d] += row[d];
                min[d] = min[d].min(row[d]);
                max[d] = max[d].max(row[d]);
            }
        }
        mean.iter_mut().for_each(|m| *m /= k);
        let mut m2 = vec![0.0; n];
        if self.kind == DimKind::Std {
            for &r in &valid {
                let row = &all[r * n..(r + 1) * n];
                for d in 0..n {
                    let x = row[d] - mean[d];
                    m2[d] += x * x;
                }
            }
        }
        self.merge(valid.len() as u64, &mean, &m2, &min, &max);
        Ok(())
    }

    fn evaluate(&mut self) -> DfResult<ScalarValue> {
        Ok(match self.kind {
            _ if self.count == 0 => self.null(),
            DimKind::Mean => self.fsl(&self.mean),
            DimKind::Min => self.fsl(&self.min),
            DimKind::Max => self.fsl(&self.max),
            DimKind::Std if self.count < 2 => self.null(),
            DimKind::Std => {
                let c = (self.count - 1) as f64;
                let v: Vec<f64> = self.m2.iter().map(|m| (m / c).sqrt()).collect();
                self.fsl(&v)
            }
        })
    }

    fn size(&self) -> usize {
        std::mem::size_of_val(self) + 4 * self.n * 8
    }

    fn state(&mut self) -> DfResult<Vec<ScalarValue>> {
        Ok(vec![
            ScalarValue::UInt64(Some(self.count)),
            self.fsl(&self.mean),
            self.fsl(&self.m2),
            self.fsl(&self.min),
            self.fsl(&self.max),
        ])
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> DfResult<()> {
        let counts = states[0].as_primitive::<UInt64Type>();
        let n = self.n;
        let vecs = states[1..5]
            .iter()
            .map(|a| f64_values(fsl_arg("dim_*", a)?))
            .collect::<DfResult<Vec<_>>>()?;
        for r in 0..counts.len() {
            if counts.is_null(r) {
                continue;
            }
            let s = |i: usize| &vecs[i][r * n..(r + 1) * n];
            self.merge(counts.value(r), s(0), s(1), s(2), s(3));
        }
        Ok(())
    }
}

/// `discounted_return(reward, step, gamma)`: `sum(gamma^step * reward)` over the group.
#[derive(Debug, PartialEq, Eq, Hash)]
struct DiscountedReturn {
    signature: Signature,
}

impl DiscountedReturn {
    fn new() -> Self {
        Self {
            signature: Signature::any(3, Volatility::Immutable),
        }
    }
}

impl AggregateUDFImpl for DiscountedReturn {
    fn name(&self) -> &str {
        "discounted_return"
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn return_type(&self, arg_types: &[DataType]) -> DfResult<DataType> {
        if !arg_types.iter().all(|t| t.is_numeric()) {
            return Err(DataFusionError::Plan(format!(
                "discounted_return(reward, step, gamma) takes numbers, got ({})",
                arg_types
                    .iter()
                    .map(|t| t.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        Ok(DataType::Float64)
    }
    fn accumulator(&self, _args: AccumulatorArgs) -> DfResult<Box<dyn Accumulator>> {
        Ok(Box::new(DiscountedAccumulator {
            sum: 0.0,
            any: false,
        }))
    }
    fn state_fields(&self, args: StateFieldsArgs) -> DfResult<Vec<FieldRef>> {
        Ok(vec![Arc::new(Field::new(
            format!("{}_sum", args.name),
            DataType::Float64,
            true,
        ))])
    }
}

#[derive(Debug)]
struct DiscountedAccumulator {
    sum: f64,
    any: bool,
}

impl Accumulator for DiscountedAccumulator {
    fn update_batch(&mut self, values: &[ArrayRef]) -> DfResult<()> {
        let f = |a: &ArrayRef| cast(a, &DataType::Float64);
        let (r, s, g) = (f(&values[0])?, f(&values[1])?, f(&values[2])?);
        let (r, s, g) = (
            r.as_primitive::<Float64Type>(),
            s.as_primitive::<Float64Type>(),
            g.as_primitive::<Float64Type>(),
        );
        for i in 0..r.len() {
            if r.is_valid(i) && s.is_valid(i) && g.is_valid(i) {
                self.sum += g.value(i).powf(s.value(i)) * r.value(i);
                self.any = true;
            }
        }
        Ok(())
    }
    fn evaluate(&mut self) -> DfResult<ScalarValue> {
        Ok(ScalarValue::Float64(self.any.then_some(self.sum)))
    }
    fn size(&self) -> usize {
        std::mem::size_of_val(self)
    }
    fn state(&mut self) -> DfResult<Vec<ScalarValue>> {
        Ok(vec![self.evaluate()?])
    }
    fn merge_batch(&mut self, states: &[ArrayRef]) -> DfResult<()> {
        let s = states[0].as_primitive::<Float64Type>();
        for i in 0..s.len() {
            if s.is_valid(i) {
                self.sum += s.value(i);
                self.any = true;
            }
        }
        Ok(())
    }
}
