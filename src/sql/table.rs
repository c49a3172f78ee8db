//! The `transitions` table (zero-copy slices of the mapped segments, pruned by episode and step
//! ranges) and the `episodes` table.

use std::fmt;
use std::sync::{Arc, Mutex};

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::{DataType, SchemaRef, UInt64Type};
use async_trait::async_trait;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::stats::Precision;
use datafusion::common::{ScalarValue, Statistics};
use datafusion::datasource::memory::{DataSourceExec, MemTable, MemorySourceConfig};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::logical_expr::{Expr, Operator, TableProviderFilterPushDown, TableType};
use datafusion::physical_plan::ExecutionPlan;

use super::*;
use crate::error::{Error, Result};
use crate::format::{col, ep};
use crate::store::segment::Segment;
use crate::store::{Catalog, Snapshot};

/// The `TableProvider` of a `transitions` table, for a type with `schema` and `rows` fields and
/// an inherent `scan_parts`: both tables (mapped now, or deferred) plan alike.
macro_rules! transitions_provider {
    ($table:ty) => {
        #[async_trait]
        impl TableProvider for $table {
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
                self.scan_parts(state, projection, filters, limit).await
            }

            fn supports_filters_pushdown(
                &self,
                filters: &[&Expr],
            ) -> DfResult<Vec<TableProviderFilterPushDown>> {
                Ok(filters.iter().map(|f| pushdown(f, &self.schema)).collect())
            }

            fn statistics(&self) -> Option<Statistics> {
                Some(
                    Statistics::new_unknown(&self.schema)
                        .with_num_rows(Precision::Exact(self.rows)),
                )
            }
        }
    };
}

/// One zero-copy slice of a segment's batch, with the ranges it covers (inclusive, as f64).
#[derive(Debug, Clone)]
pub(crate) struct Part {
    episodes: (f64, f64),
    steps: (f64, f64),
    batch: RecordBatch,
}

impl Part {
    /// A part with no rows that only carries ranges, for [`may_match`].
    #[cfg_attr(not(any(feature = "remote", feature = "ballista")), allow(dead_code))]
    pub(crate) fn probe(episodes: (f64, f64), steps: (f64, f64), schema: &SchemaRef) -> Self {
        Part {
            episodes,
            steps,
            batch: RecordBatch::new_empty(schema.clone()),
        }
    }
}

/// The `transitions` table: a provider over the mapped segments.
#[derive(Debug)]
pub struct TransitionsTable {
    schema: SchemaRef,
    /// One entry per segment.
    segments: Vec<Vec<Part>>,
    /// The segments themselves, whose frame offsets a scan that reads them checks first.
    sources: Vec<Arc<Segment>>,
    /// The episode ids of each segment (`first..end`).
    episodes: Vec<(u64, u64)>,
    rows: usize,
}

impl TransitionsTable {
    /// The table over `snap`'s segments. O(segments + episodes); no transition is read except
    /// the first and last `episode_id` of each slice. A frame column's offsets are checked by
    /// the first scan that reads the column (see [`Segment::batches`]), not here.
    pub fn new(snap: &Snapshot) -> Self {
        let schema = snap.schema().arrow_schema().clone();
        let mut rows = 0;
        let segments = snap
            .segments()
            .iter()
            .map(|seg| {
                let max_len = seg
                    .episode_table()
                    .lengths()
                    .iter()
                    .copied()
                    .max()
                    .unwrap_or(0);
                let steps = (0.0, max_len.saturating_sub(1) as f64);
                let mut parts = vec![];
                for b in seg.batches_unchecked() {
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
            sources: snap.segments().to_vec(),
            episodes,
            rows,
        }
    }
}

transitions_provider!(TransitionsTable);

impl TransitionsTable {
    /// The zero-copy slices of segment `i` (`None` past the last segment), for a scan of the
    /// columns `projection` (all if `None`): frame offsets it reads are checked first.
    #[cfg(feature = "ballista")]
    pub(crate) fn segment_batches(
        &self,
        i: usize,
        projection: Option<&Vec<usize>>,
    ) -> Option<Result<Vec<RecordBatch>>> {
        let source = self.sources.get(i)?;
        let reads = |c: &usize| projection.is_none_or(|p| p.contains(c));
        if source.deferred_columns().iter().any(reads)
            && let Err(e) = source.batches()
        {
            return Some(Err(e));
        }
        Some(Ok(self
            .segments
            .get(i)?
            .iter()
            .map(|p| p.batch.clone())
            .collect()))
    }
}

impl TransitionsTable {
    async fn scan_parts(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let mut partitions: Vec<Vec<RecordBatch>> = vec![];
        let mut episodes = vec![];
        let mut budget = limit.filter(|_| filters.is_empty());
        let reads = |c: usize| projection.is_none_or(|p| p.contains(&c));
        'segments: for ((seg, &ids), source) in
            (self.segments.iter().zip(&self.episodes)).zip(&self.sources)
        {
            if source.deferred_columns().iter().any(|&c| reads(c)) {
                source
                    .batches()
                    .map_err(|e| DataFusionError::External(Box::new(e)))?;
            }
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

pub(crate) type OpenFn = dyn Fn() -> Result<Snapshot> + Send + Sync;

pub(crate) struct Deferred {
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
                return Err(Error::invalid_data(format!(
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

transitions_provider!(DeferredTransitions);

impl DeferredTransitions {
    async fn scan_parts(
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
}

/// How a `transitions` scan handles filter `f`: inexact when it prunes by `episode_id`/`step`.
pub(crate) fn pushdown(f: &Expr, schema: &SchemaRef) -> TableProviderFilterPushDown {
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
pub(crate) fn may_match(e: &Expr, p: &Part) -> Option<bool> {
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
pub(crate) fn column_range(e: &Expr, p: &Part) -> Option<(f64, f64)> {
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
pub(crate) fn literal(e: &Expr) -> Option<f64> {
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
pub(crate) fn episodes_table(catalog: &Catalog) -> Result<MemTable> {
    let full = catalog.schema().episode_schema();
    let keep: Vec<usize> = (0..full.fields().len())
        .filter(|&i| full.field(i).name() != ep::ROW_START)
        .collect();
    let schema = Arc::new(full.project(&keep)?);
    let mut parts: Vec<Vec<RecordBatch>> = catalog
        .episode_tables()
        .iter()
        .map(|t| Ok(vec![t.batch().project(&keep)?]))
        .collect::<Result<_>>()?;
    if parts.is_empty() {
        parts.push(vec![]);
    }
    Ok(MemTable::try_new(schema, parts)?)
}
