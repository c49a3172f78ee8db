//! `GROUP BY episode_id` without hashing.
//!
//! A segment holds whole episodes, in id order, and no two segments share an episode. The
//! `transitions` scan has one partition per segment, so in any subsequence of a partition's rows
//! (after filters and projections) the rows of one episode are adjacent and no episode appears
//! in two partitions. An aggregation grouped by `episode_id` can therefore give each run of equal
//! ids the next group index and feed DataFusion's own groups accumulators (same results, types,
//! null and overflow behaviour as its hash aggregate), with no hash table, no partial/final
//! split and no repartition.
//!
//! [`EpisodeGroupBy`] is a physical optimizer rule that runs after DataFusion's own rules. It
//! replaces an `AggregateExec` pair (`Partial` → `Final`/`FinalPartitioned`, or one
//! `Single`/`SinglePartitioned`) whose only group key is the `episode_id` column of a
//! [`SegmentScan`], reached through filters and projections only, by an
//! [`EpisodeAggregateExec`], followed by the repartition or coalesce that gives its parents the
//! partitioning they were planned for. Anything else (other keys, grouping sets, DISTINCT or
//! ordered aggregates, aggregates without a groups accumulator, a scan whose partitions were
//! split) keeps DataFusion's plan.
//!
//! Each partition checks that its runs of ids increase and lie in its segment's episode range,
//! so rows that disagree with the episode table (a corrupt file) are an error, never a
//! duplicated group.

use std::fmt;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Float64Array, Int64Array, PrimitiveArray, RecordBatch,
    UInt64Array,
};
use arrow::datatypes::{
    ArrowNativeTypeOp, ArrowPrimitiveType, DataType, Float64Type, Int64Type, Schema, SchemaRef,
    UInt64Type,
};
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Statistics, internal_err};
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::datasource::source::{DataSource, DataSourceExec};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::functions_aggregate::count::Count;
use datafusion::functions_aggregate::sum::Sum;
use datafusion::logical_expr::{EmitTo, GroupsAccumulator};
use datafusion::physical_expr::aggregate::AggregateFunctionExpr;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::projection::ProjectionExprs;
use datafusion::physical_expr::{EquivalenceProperties, LexOrdering, Partitioning, PhysicalExpr};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType, SchedulingType};
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet, MetricsSet};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
};
use futures::{StreamExt, TryStreamExt};

use crate::format::col;

/// The `transitions` scan: DataFusion's in-memory source over zero-copy slices of the mapped
/// segments, one partition per segment, which also knows each partition's episode id range
/// (`first..end`). Splitting partitions (`repartitioned`) returns a plain memory source, which
/// [`EpisodeGroupBy`] then leaves alone.
#[derive(Debug, Clone)]
pub(crate) struct SegmentScan {
    inner: MemorySourceConfig,
    episodes: Arc<Vec<(u64, u64)>>,
}

impl SegmentScan {
    pub(crate) fn new(inner: MemorySourceConfig, episodes: Vec<(u64, u64)>) -> Self {
        Self {
            inner,
            episodes: Arc::new(episodes),
        }
    }

    /// `source` as a segment scan again, if it is still a memory source with our partitions.
    fn keep(&self, source: Arc<dyn DataSource>) -> Arc<dyn DataSource> {
        match source.downcast_ref::<MemorySourceConfig>() {
            Some(m) if m.partitions().len() == self.episodes.len() => Arc::new(Self {
                inner: m.clone(),
                episodes: self.episodes.clone(),
            }),
            _ => source,
        }
    }
}

impl DataSource for SegmentScan {
    fn open(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        Ok(super::readahead::read_ahead(
            self.inner.open(partition, context)?,
        ))
    }

    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        self.inner.fmt_as(t, f)
    }

    fn repartitioned(
        &self,
        target_partitions: usize,
        repartition_file_min_size: usize,
        output_ordering: Option<LexOrdering>,
    ) -> DfResult<Option<Arc<dyn DataSource>>> {
        // Deliberately not re-wrapped: split partitions no longer map to whole segments.
        self.inner.repartitioned(
            target_partitions,
            repartition_file_min_size,
            output_ordering,
        )
    }

    fn output_partitioning(&self) -> Partitioning {
        self.inner.output_partitioning()
    }

    fn eq_properties(&self) -> EquivalenceProperties {
        self.inner.eq_properties()
    }

    fn scheduling_type(&self) -> SchedulingType {
        self.inner.scheduling_type()
    }

    fn partition_statistics(&self, partition: Option<usize>) -> DfResult<Arc<Statistics>> {
        self.inner.partition_statistics(partition)
    }

    fn with_fetch(&self, limit: Option<usize>) -> Option<Arc<dyn DataSource>> {
        self.inner.with_fetch(limit).map(|s| self.keep(s))
    }

    fn fetch(&self) -> Option<usize> {
        self.inner.fetch()
    }

    fn metrics(&self) -> ExecutionPlanMetricsSet {
        self.inner.metrics()
    }

    fn try_swapping_with_projection(
        &self,
        projection: &ProjectionExprs,
    ) -> DfResult<Option<Arc<dyn DataSource>>> {
        Ok(self
            .inner
            .try_swapping_with_projection(projection)?
            .map(|s| self.keep(s)))
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>,
    ) -> DfResult<TreeNodeRecursion> {
        self.inner.apply_expressions(f)
    }
}

/// The physical optimizer rule described in the module docs.
#[derive(Debug, Default)]
pub(crate) struct EpisodeGroupBy;

/// The name of [`EpisodeGroupBy`] in DataFusion's rule list.
pub(crate) const RULE_NAME: &str = "trajstore_episode_group_by";

impl PhysicalOptimizerRule for EpisodeGroupBy {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            Ok(match rewrite(&node)? {
                Some(new) => Transformed::yes(new),
                None => Transformed::no(node),
            })
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        RULE_NAME
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// The replacement of `node` if it is an aggregation this rule handles.
fn rewrite(node: &Arc<dyn ExecutionPlan>) -> DfResult<Option<Arc<dyn ExecutionPlan>>> {
    let Some(top) = node.downcast_ref::<AggregateExec>() else {
        return Ok(None);
    };
    // The aggregate that sees the rows: the partial one below a final one, or `top` itself.
    let rows_agg = match top.mode() {
        AggregateMode::Single | AggregateMode::SinglePartitioned => top,
        AggregateMode::Final | AggregateMode::FinalPartitioned => {
            let mut below = top.input();
            loop {
                if let Some(c) = below.downcast_ref::<CoalescePartitionsExec>() {
                    below = c.input();
                } else if let Some(r) = below.downcast_ref::<RepartitionExec>()
                    && matches!(r.partitioning(), Partitioning::Hash(..))
                {
                    below = r.input();
                } else {
                    break;
                }
            }
            match below.downcast_ref::<AggregateExec>() {
                Some(p) if *p.mode() == AggregateMode::Partial => p,
                _ => return Ok(None),
            }
        }
        _ => return Ok(None),
    };
    let gby = rows_agg.group_expr();
    if top.properties().output_ordering().is_some()
        || top.limit_options().is_some()
        || rows_agg.limit_options().is_some()
        || !gby.is_single()
        || gby.expr().len() != 1
        || rows_agg.aggr_expr().is_empty()
        || !rows_agg.dynamic_expressions_produced().is_empty()
        || rows_agg.aggr_expr().iter().any(|a| {
            a.is_distinct() || !a.order_bys().is_empty() || !a.groups_accumulator_supported()
        })
    {
        return Ok(None);
    }
    let key = gby.expr()[0].0.clone();
    let Some(key_col) = key.downcast_ref::<Column>() else {
        return Ok(None);
    };
    let input = rows_agg.input().clone();
    let Some(episodes) = segment_episode_column(&input, key_col.index()) else {
        return Ok(None);
    };
    let exec: Arc<dyn ExecutionPlan> = Arc::new(EpisodeAggregateExec::new(
        input,
        key,
        rows_agg.aggr_expr().to_vec(),
        rows_agg.filter_expr().to_vec(),
        top.schema(),
        episodes,
    ));
    // Give the parents the partitioning the replaced aggregate promised them.
    let want = top.properties().output_partitioning().clone();
    Ok(Some(match &want {
        Partitioning::Hash(..) => Arc::new(RepartitionExec::try_new(exec, want)?),
        p if p.partition_count() == 1 && exec.output_partitioning().partition_count() != 1 => {
            Arc::new(CoalescePartitionsExec::new(exec))
        }
        p if p.partition_count() == exec.output_partitioning().partition_count() => exec,
        _ => return Ok(None),
    }))
}

/// If column `index` of `plan`'s output is the `episode_id` column of a [`SegmentScan`], reached
/// through operators that keep each partition a subsequence of its segment, the scan's
/// per-partition episode ranges.
fn segment_episode_column(
    plan: &Arc<dyn ExecutionPlan>,
    index: usize,
) -> Option<Arc<Vec<(u64, u64)>>> {
    if let Some(f) = plan.downcast_ref::<FilterExec>() {
        let index = match f.projection() {
            Some(p) => *p.get(index)?,
            None => index,
        };
        return segment_episode_column(f.input(), index);
    }
    if let Some(p) = plan.downcast_ref::<ProjectionExec>() {
        let e = p.expr().get(index)?;
        let c = e.expr.downcast_ref::<Column>()?;
        return segment_episode_column(p.input(), c.index());
    }
    let scan = plan
        .downcast_ref::<DataSourceExec>()?
        .data_source()
        .downcast_ref::<SegmentScan>()?;
    let field = plan.schema().fields().get(index)?.clone();
    (field.name() == col::EPISODE_ID
        && *field.data_type() == DataType::UInt64
        && plan.output_partitioning().partition_count() == scan.episodes.len())
    .then(|| scan.episodes.clone())
}

/// Aggregation grouped by `episode_id` over a [`SegmentScan`]: one group per run of equal ids,
/// DataFusion's groups accumulators, final values out, one output partition per segment.
#[derive(Debug)]
pub(crate) struct EpisodeAggregateExec {
    input: Arc<dyn ExecutionPlan>,
    key: Arc<dyn PhysicalExpr>,
    aggr: Vec<Arc<AggregateFunctionExpr>>,
    filters: Vec<Option<Arc<dyn PhysicalExpr>>>,
    schema: SchemaRef,
    episodes: Arc<Vec<(u64, u64)>>,
    props: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl EpisodeAggregateExec {
    fn new(
        input: Arc<dyn ExecutionPlan>,
        key: Arc<dyn PhysicalExpr>,
        aggr: Vec<Arc<AggregateFunctionExpr>>,
        filters: Vec<Option<Arc<dyn PhysicalExpr>>>,
        schema: SchemaRef,
        episodes: Arc<Vec<(u64, u64)>>,
    ) -> Self {
        let props = PlanProperties::new(
            EquivalenceProperties::new(schema.clone()),
            Partitioning::UnknownPartitioning(input.output_partitioning().partition_count()),
            EmissionType::Final,
            Boundedness::Bounded,
        );
        Self {
            input,
            key,
            aggr,
            filters,
            schema,
            episodes,
            props: Arc::new(props),
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }
}

impl DisplayAs for EpisodeAggregateExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let aggr: Vec<&str> = self.aggr.iter().map(|a| a.name()).collect();
        write!(
            f,
            "EpisodeAggregateExec: gby=[{}], aggr=[{}], runs of one segment per partition",
            self.key,
            aggr.join(", ")
        )
    }
}

impl ExecutionPlan for EpisodeAggregateExec {
    fn name(&self) -> &str {
        "EpisodeAggregateExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.props
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    // Splitting or merging the input's partitions would break the one-segment-per-partition
    // invariant this operator relies on.
    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>,
    ) -> DfResult<TreeNodeRecursion> {
        let args = self.aggr.iter().flat_map(|a| a.expressions());
        let filters = self.filters.iter().flatten().cloned();
        for e in std::iter::once(self.key.clone()).chain(args).chain(filters) {
            if f(&e)? == TreeNodeRecursion::Stop {
                return Ok(TreeNodeRecursion::Stop);
            }
        }
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let [input] = <[_; 1]>::try_from(children)
            .map_err(|_| DataFusionError::Internal("EpisodeAggregateExec has one child".into()))?;
        if input.output_partitioning().partition_count() != self.episodes.len() {
            return internal_err!(
                "EpisodeAggregateExec's input must keep one partition per segment"
            );
        }
        Ok(Arc::new(Self::new(
            input,
            self.key.clone(),
            self.aggr.clone(),
            self.filters.clone(),
            self.schema.clone(),
            self.episodes.clone(),
        )))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let Some(&range) = self.episodes.get(partition) else {
            return internal_err!("EpisodeAggregateExec has no partition {partition}");
        };
        let mut runs = Runs {
            key: self.key.clone(),
            args: self.aggr.iter().map(|a| a.expressions()).collect(),
            filters: self.filters.clone(),
            accs: self
                .aggr
                .iter()
                .zip(&self.filters)
                .map(|(a, f)| Kernel::new(a, f.is_some(), &self.input.schema()))
                .collect::<DfResult<_>>()?,
            ids: vec![],
            group_of_row: vec![],
            runs: vec![],
            range,
        };
        let input = self.input.execute(partition, context.clone())?;
        let schema = self.schema.clone();
        let batch_size = context.session_config().batch_size().max(1);
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let out = futures::stream::once(async move {
            let mut input = input;
            while let Some(batch) = input.next().await {
                let batch = batch?;
                let _timer = baseline.elapsed_compute().timer();
                runs.update(&batch)?;
            }
            let _timer = baseline.elapsed_compute().timer();
            let out = runs.finish(&schema)?;
            baseline.record_output(out.num_rows());
            let n = out.num_rows();
            let chunks: Vec<DfResult<RecordBatch>> = (0..n)
                .step_by(batch_size)
                .map(|off| Ok(out.slice(off, batch_size.min(n - off))))
                .collect();
            Ok::<_, DataFusionError>(futures::stream::iter(chunks))
        })
        .try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema.clone(),
            out,
        )))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}

/// One aggregate of one partition: DataFusion's groups accumulator, or, for the most common
/// aggregates over non-null inputs without FILTER, a loop over each run's slice that computes
/// what that accumulator computes, in the same order (so bit for bit the same result).
enum Kernel {
    Generic(Box<dyn GroupsAccumulator>),
    /// `COUNT(x)` with `x` never null (including `COUNT(*)`).
    Count(Vec<i64>),
    /// `SUM(x)`, `x` never null and Float64 (the sum of floats; DataFusion adds in row order).
    SumF64(Vec<f64>),
    /// `SUM(x)`, `x` never null and Int64 (wrapping, as DataFusion).
    SumI64(Vec<i64>),
    /// `SUM(x)`, `x` never null and UInt64 (wrapping, as DataFusion).
    SumU64(Vec<u64>),
}

impl Kernel {
    fn new(a: &AggregateFunctionExpr, filtered: bool, input: &Schema) -> DfResult<Self> {
        let args = a.expressions();
        let non_null = args.len() == 1 && !args[0].nullable(input)?;
        let arg_type = match &args[..] {
            [x] => Some(x.data_type(input)?),
            _ => None,
        };
        let out = a.field().data_type().clone();
        let f = a.fun().inner();
        Ok(match (filtered || !non_null, arg_type, out) {
            (false, Some(_), DataType::Int64) if f.is::<Count>() => Kernel::Count(vec![]),
            (false, Some(DataType::Float64), DataType::Float64) if f.is::<Sum>() => {
                Kernel::SumF64(vec![])
            }
            (false, Some(DataType::Int64), DataType::Int64) if f.is::<Sum>() => {
                Kernel::SumI64(vec![])
            }
            (false, Some(DataType::UInt64), DataType::UInt64) if f.is::<Sum>() => {
                Kernel::SumU64(vec![])
            }
            _ => Kernel::Generic(a.create_groups_accumulator()?),
        })
    }

    /// Adds one batch: `runs` are its `(group, start, end)` runs, `group_of_row` the same as a
    /// group index per row (filled only when some kernel is generic).
    fn update(
        &mut self,
        args: &[Arc<dyn PhysicalExpr>],
        filter: Option<&Arc<dyn PhysicalExpr>>,
        batch: &RecordBatch,
        runs: &[(usize, usize, usize)],
        group_of_row: &[usize],
        groups: usize,
    ) -> DfResult<()> {
        fn values<T: ArrowPrimitiveType>(
            args: &[Arc<dyn PhysicalExpr>],
            batch: &RecordBatch,
        ) -> DfResult<PrimitiveArray<T>> {
            let a = args[0].evaluate(batch)?.into_array(batch.num_rows())?;
            match a.as_primitive_opt::<T>() {
                Some(p) if p.null_count() == 0 => Ok(p.clone()),
                _ => internal_err!("aggregate input is not a non-null {}", T::DATA_TYPE),
            }
        }
        /// Each run's slice added in row order with DataFusion's `add_wrapping` (plain `+` for
        /// floats), starting from zero, as its sum accumulator does.
        fn sum<T: ArrowPrimitiveType>(
            acc: &mut Vec<T::Native>,
            args: &[Arc<dyn PhysicalExpr>],
            batch: &RecordBatch,
            runs: &[(usize, usize, usize)],
            groups: usize,
        ) -> DfResult<()> {
            let v = values::<T>(args, batch)?;
            acc.resize(groups, T::Native::ZERO);
            for &(g, s, e) in runs {
                acc[g] = v.values()[s..e]
                    .iter()
                    .fold(acc[g], |a, &x| a.add_wrapping(x));
            }
            Ok(())
        }
        match self {
            Kernel::Generic(acc) => {
                let n = batch.num_rows();
                let values = args
                    .iter()
                    .map(|e| e.evaluate(batch)?.into_array(n))
                    .collect::<DfResult<Vec<ArrayRef>>>()?;
                let filter = match filter {
                    Some(f) => Some(f.evaluate(batch)?.into_array(n)?),
                    None => None,
                };
                let filter: Option<&BooleanArray> = match &filter {
                    Some(f) => Some(f.as_boolean_opt().ok_or_else(|| {
                        DataFusionError::Internal("FILTER clause is not boolean".into())
                    })?),
                    None => None,
                };
                acc.update_batch(&values, group_of_row, filter, groups)?;
            }
            Kernel::Count(acc) => {
                acc.resize(groups, 0);
                for &(g, s, e) in runs {
                    acc[g] += (e - s) as i64;
                }
            }
            Kernel::SumF64(acc) => sum::<Float64Type>(acc, args, batch, runs, groups)?,
            Kernel::SumI64(acc) => sum::<Int64Type>(acc, args, batch, runs, groups)?,
            Kernel::SumU64(acc) => sum::<UInt64Type>(acc, args, batch, runs, groups)?,
        }
        Ok(())
    }

    fn evaluate(&mut self) -> DfResult<ArrayRef> {
        Ok(match self {
            Kernel::Generic(acc) => acc.evaluate(EmitTo::All)?,
            Kernel::Count(acc) => Arc::new(Int64Array::from(std::mem::take(acc))),
            Kernel::SumF64(acc) => Arc::new(Float64Array::from(std::mem::take(acc))),
            Kernel::SumI64(acc) => Arc::new(Int64Array::from(std::mem::take(acc))),
            Kernel::SumU64(acc) => Arc::new(UInt64Array::from(std::mem::take(acc))),
        })
    }
}

/// The state of one partition.
struct Runs {
    key: Arc<dyn PhysicalExpr>,
    args: Vec<Vec<Arc<dyn PhysicalExpr>>>,
    filters: Vec<Option<Arc<dyn PhysicalExpr>>>,
    accs: Vec<Kernel>,
    /// The id of each group so far (increasing).
    ids: Vec<u64>,
    /// Scratch: the group index of each row of the current batch (filled only when a generic
    /// accumulator needs it).
    group_of_row: Vec<usize>,
    /// Scratch: the runs of the current batch, `(group, start, end)`.
    runs: Vec<(usize, usize, usize)>,
    /// The episode ids this partition's segment holds.
    range: (u64, u64),
}

impl Runs {
    fn update(&mut self, batch: &RecordBatch) -> DfResult<()> {
        let n = batch.num_rows();
        if n == 0 {
            return Ok(());
        }
        let keys = self.key.evaluate(batch)?.into_array(n)?;
        let Some(keys) = keys.as_primitive_opt::<UInt64Type>() else {
            return internal_err!("episode_id is not UInt64");
        };
        if keys.null_count() > 0 {
            return internal_err!("episode_id has nulls");
        }
        self.group_of_row.clear();
        self.runs.clear();
        let mut start = 0;
        let ids = keys.values();
        while start < n {
            let id = ids[start];
            let end = start
                + ids[start..]
                    .iter()
                    .position(|&x| x != id)
                    .unwrap_or(n - start);
            match self.ids.last() {
                Some(&last) if last == id => {}
                last => {
                    if last.is_some_and(|&l| id < l) || id < self.range.0 || id >= self.range.1 {
                        return Err(DataFusionError::Execution(format!(
                            "episode_id {id} is out of order in the segment holding episodes {}..{} \
                             (the rows disagree with the episode table; run `trajstore verify`)",
                            self.range.0, self.range.1
                        )));
                    }
                    self.ids.push(id);
                }
            }
            self.runs.push((self.ids.len() - 1, start, end));
            start = end;
        }
        let groups = self.ids.len();
        if self.accs.iter().any(|k| matches!(k, Kernel::Generic(_))) {
            for &(g, start, end) in &self.runs {
                self.group_of_row
                    .resize(end - start + self.group_of_row.len(), g);
            }
        }
        for ((kernel, args), filter) in self.accs.iter_mut().zip(&self.args).zip(&self.filters) {
            kernel.update(
                args,
                filter.as_ref(),
                batch,
                &self.runs,
                &self.group_of_row,
                groups,
            )?;
        }
        Ok(())
    }

    fn finish(mut self, schema: &SchemaRef) -> DfResult<RecordBatch> {
        if self.ids.is_empty() {
            return Ok(RecordBatch::new_empty(schema.clone()));
        }
        let mut cols: Vec<ArrayRef> =
            vec![Arc::new(UInt64Array::from(std::mem::take(&mut self.ids)))];
        for acc in &mut self.accs {
            cols.push(acc.evaluate()?);
        }
        Ok(RecordBatch::try_new(schema.clone(), cols)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use arrow::datatypes::{Field, Schema};
    use datafusion::functions_aggregate::sum::sum_udaf;
    use datafusion::physical_expr::aggregate::AggregateExprBuilder;

    fn runs(range: (u64, u64), generic: bool) -> (Runs, SchemaRef) {
        let input = Arc::new(Schema::new(vec![
            Field::new(col::EPISODE_ID, DataType::UInt64, false),
            Field::new(col::REWARD, DataType::Float64, false),
        ]));
        let reward: Arc<dyn PhysicalExpr> = Arc::new(Column::new(col::REWARD, 1));
        let sum = AggregateExprBuilder::new(sum_udaf(), vec![reward])
            .schema(input.clone())
            .alias("r")
            .build()
            .unwrap();
        let out = Arc::new(Schema::new(vec![
            Field::new(col::EPISODE_ID, DataType::UInt64, false),
            sum.field().as_ref().clone(),
        ]));
        let kernel = if generic {
            Kernel::Generic(sum.create_groups_accumulator().unwrap())
        } else {
            Kernel::new(&sum, false, &input).unwrap()
        };
        assert_eq!(matches!(kernel, Kernel::Generic(_)), generic);
        let runs = Runs {
            key: Arc::new(Column::new(col::EPISODE_ID, 0)),
            args: vec![sum.expressions()],
            filters: vec![None],
            accs: vec![kernel],
            ids: vec![],
            group_of_row: vec![],
            runs: vec![],
            range,
        };
        (runs, out)
    }

    fn batch(ids: &[u64]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new(col::EPISODE_ID, DataType::UInt64, false),
            Field::new(col::REWARD, DataType::Float64, false),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(UInt64Array::from(ids.to_vec())),
                Arc::new(Float64Array::from(vec![1.0; ids.len()])),
            ],
        )
        .unwrap()
    }

    #[test]
    fn runs_continue_across_batches() {
        for generic in [false, true] {
            let (mut r, schema) = runs((10, 20), generic);
            r.update(&batch(&[10, 10, 12])).unwrap();
            r.update(&batch(&[12, 12, 13])).unwrap();
            r.update(&batch(&[])).unwrap();
            let out = r.finish(&schema).unwrap();
            let ids = out.column(0).as_primitive::<UInt64Type>();
            assert_eq!(ids.values().to_vec(), vec![10, 12, 13]);
            let sums = out.column(1).as_primitive::<Float64Type>();
            assert_eq!(
                sums.values().to_vec(),
                vec![2.0, 3.0, 1.0],
                "generic {generic}"
            );
        }
    }

    #[test]
    fn rows_out_of_episode_order_are_an_error() {
        let (mut r, _) = runs((10, 20), false);
        r.update(&batch(&[10, 11])).unwrap();
        let e = r.update(&batch(&[10])).unwrap_err().to_string();
        assert!(
            e.contains("out of order") && e.contains("trajstore verify"),
            "{e}"
        );
        let (mut r, _) = runs((10, 20), false);
        let e = r.update(&batch(&[19, 20])).unwrap_err().to_string();
        assert!(e.contains("episode_id 20"), "{e}");
        let (mut r, _) = runs((10, 20), false);
        assert!(r.update(&batch(&[9])).is_err());
    }
}
