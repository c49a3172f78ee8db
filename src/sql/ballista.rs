//! SQL on an [Apache Ballista](https://datafusion.apache.org/ballista/) cluster (feature
//! `ballista`): the `transitions` and `episodes` tables of a dataset named by URL (or by a path
//! every process of the cluster can read), trajstore's functions, and the codec that carries them
//! from the client to the scheduler and from the scheduler to the executors.
//!
//! - [`SqlSession::cluster`] is a session whose queries run on the cluster (`trajstore sql URL Q
//!   --cluster df://HOST:PORT`). The client reads only the dataset's catalog, to plan.
//! - [`run_scheduler`] and [`run_executor`] are the cluster's processes (`trajstore cluster
//!   scheduler|executor`): Ballista's scheduler and executor with trajstore's [`TrajLogicalCodec`],
//!   [`TrajPhysicalCodec`] and functions.
//!
//! What travels is names, not data: a table is (dataset URL, version, table name) plus the
//! per-segment episode ranges that planning prunes with; a scan of `transitions` is a
//! [`ClusterScanExec`], one partition per segment. An executor reads a segment of a URL with ranged
//! GETs of only the projected columns' buffers ([`ranged_for_sql`]: nothing is mirrored, so a
//! query that projects few columns downloads a fraction of the version), and a segment of a
//! directory zero-copy from its memory map ([`transitions_for_sql`]). The `episodes` table is small: the scheduler builds it from the catalog and
//! its rows travel in the plan.
//!
//! The per-episode `GROUP BY episode_id` rule is not used on a cluster (the scheduler's sessions
//! lack it), so such queries run as DataFusion's hash aggregation split into Ballista stages. It
//! matches only a `SegmentScan`, and its operator keeps one episode range per *global* partition,
//! while Ballista 55 runs each task on a plan cut down to the task's partitions and re-indexes
//! only the operators on its own list (`as_partition_sliceable` in ballista-core), which other
//! crates cannot extend; its aggregate expressions would also need encoding here.

use std::fmt;
use std::io::Cursor;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use arrow::array::{AsArray, RecordBatch, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, UInt64Type};
use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::StreamWriter;
use async_trait::async_trait;
use ballista::prelude::SessionContextExt;
use ballista_core::extension::SessionConfigExt;
use ballista_core::registry::BallistaFunctionRegistry;
use ballista_core::serde::{BallistaLogicalExtensionCodec, BallistaPhysicalExtensionCodec};
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::stats::Precision;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{Statistics, TableReference};
use datafusion::datasource::TableType;
use datafusion::datasource::file_format::FileFormatFactory;
use datafusion::datasource::memory::{MemTable, MemorySourceConfig};
use datafusion::datasource::source::{DataSource, DataSourceExec};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::session_state::{SessionState, SessionStateBuilder};
use datafusion::execution::{FunctionRegistry, SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::{Expr, Extension, LogicalPlan, TableProviderFilterPushDown};
use datafusion::physical_expr::{EquivalenceProperties, Partitioning, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
};
use datafusion::prelude::SessionContext;
use datafusion_proto::logical_plan::LogicalExtensionCodec;
use datafusion_proto::physical_plan::{PhysicalExtensionCodec, PhysicalProtoConverterExtension};
use futures::TryStreamExt;
use serde::{Deserialize, Serialize};

pub use super::cluster_tables::transitions_for_sql;
use super::cluster_tables::{catalog_for_sql, ranged_for_sql};
use super::table::{Part, episodes_table, may_match, pushdown};
use super::{EPISODES, SqlSession, TRANSITIONS, default_config, runtime};
use crate::error::{Error, Result};
use crate::open::DatasetBuilder;
use crate::store::Catalog;

/// First byte of what trajstore's codecs write: the rest is trajstore's (JSON, then for a scan an
/// Arrow IPC schema) or Ballista's own encoding.
const TAG_BALLISTA: u8 = 0;
const TAG_TRAJSTORE: u8 = 1;

/// How long [`SqlSession::cluster`] waits for the scheduler's port to answer.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// One segment as planning sees it: its episode ids (`first..end`), rows and longest episode.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct SegmentSpec {
    episodes: (u64, u64),
    rows: u64,
    max_len: u64,
}

/// A table of one version of a dataset, as it travels.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct TableSpec {
    url: String,
    version: u64,
    table: String,
    /// For `transitions`: one entry per segment, in order.
    segments: Vec<SegmentSpec>,
}

impl TableSpec {
    fn of(url: &str, catalog: &Catalog, table: &str) -> Self {
        let segments = if table == TRANSITIONS {
            catalog
                .manifest()
                .segments
                .iter()
                .zip(catalog.episode_tables())
                .map(|(e, t)| SegmentSpec {
                    episodes: (e.first_episode_id, e.first_episode_id + e.episodes),
                    rows: e.rows,
                    max_len: t.lengths().iter().copied().max().unwrap_or(0),
                })
                .collect()
        } else {
            vec![]
        };
        Self {
            url: url.to_string(),
            version: catalog.version(),
            table: table.to_string(),
            segments,
        }
    }
}

/// The `transitions` table of a cluster session: planning only. Its scan is a
/// [`ClusterScanExec`] over the segments that the pushed-down filters may match.
#[derive(Debug)]
pub struct ClusterTransitions {
    spec: Arc<TableSpec>,
    schema: SchemaRef,
}

#[async_trait]
impl TableProvider for ClusterTransitions {
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
        let segments: Vec<usize> = (0..self.spec.segments.len())
            .filter(|&i| {
                let s = &self.spec.segments[i];
                let part = Part::probe(
                    (s.episodes.0 as f64, s.episodes.1.saturating_sub(1) as f64),
                    (0.0, s.max_len.saturating_sub(1) as f64),
                    &self.schema,
                );
                s.rows > 0 && filters.iter().all(|f| may_match(f, &part).unwrap_or(true))
            })
            .collect();
        Ok(Arc::new(ClusterScanExec::try_new(
            segment_tokens(&segments)?,
            ScanSpec {
                url: self.spec.url.clone(),
                version: self.spec.version,
                projection: projection.cloned(),
                limit: limit.filter(|_| filters.is_empty()),
                schema: self.schema.clone(),
            },
        )?))
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> DfResult<Vec<TableProviderFilterPushDown>> {
        Ok(filters.iter().map(|f| pushdown(f, &self.schema)).collect())
    }

    fn statistics(&self) -> Option<Statistics> {
        let rows = self.spec.segments.iter().map(|s| s.rows as usize).sum();
        Some(Statistics::new_unknown(&self.schema).with_num_rows(Precision::Exact(rows)))
    }
}

/// The `episodes` table of a cluster session: the catalog's episode tables, which travel in the
/// plan (O(episodes) rows).
#[derive(Debug)]
pub struct ClusterEpisodes {
    spec: Arc<TableSpec>,
    inner: MemTable,
}

#[async_trait]
impl TableProvider for ClusterEpisodes {
    fn schema(&self) -> SchemaRef {
        self.inner.schema()
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
        self.inner.scan(state, projection, filters, limit).await
    }
}

/// The input of a [`ClusterScanExec`]: partition `i` is one row, the number of the `i`-th
/// segment to read (one empty partition when no segment is left). An in-memory source, because
/// Ballista 55 gives each task its share of a stage's partitions by rewriting the plan's leaves
/// (`restrict_plan_to_partitions` in ballista-scheduler's `task_builder.rs`), and it can rewrite
/// only the leaves it knows (file scans, in-memory sources, shuffle readers): a custom leaf
/// with several partitions would be run whole by every task (each task reading the first
/// segments again).
fn segment_tokens(segments: &[usize]) -> DfResult<Arc<dyn ExecutionPlan>> {
    let schema = Arc::new(Schema::new(vec![Field::new(
        SEGMENT,
        DataType::UInt64,
        false,
    )]));
    let mut parts = segments
        .iter()
        .map(|&i| {
            let ids = UInt64Array::from(vec![i as u64]);
            Ok(vec![RecordBatch::try_new(
                schema.clone(),
                vec![Arc::new(ids)],
            )?])
        })
        .collect::<DfResult<Vec<_>>>()?;
    if parts.is_empty() {
        parts.push(vec![]);
    }
    Ok(DataSourceExec::from_data_source(
        MemorySourceConfig::try_new(&parts, schema, None)?,
    ))
}

/// The column of [`segment_tokens`].
const SEGMENT: &str = "segment";

/// What a [`ClusterScanExec`] carries to an executor (besides its input).
#[derive(Debug, Clone)]
struct ScanSpec {
    url: String,
    version: u64,
    projection: Option<Vec<usize>>,
    limit: Option<usize>,
    /// The table's schema (before projection).
    schema: SchemaRef,
}

/// [`ScanSpec`] without its schema, which travels as Arrow IPC after the JSON.
#[derive(Serialize, Deserialize)]
struct ScanWire {
    url: String,
    version: u64,
    projection: Option<Vec<usize>>,
    limit: Option<usize>,
}

/// The scan of `transitions` on a cluster: for each segment number its input partition holds
/// (see [`segment_tokens`]), that segment of the version, projected (see [`read_segment`]).
#[derive(Debug)]
pub struct ClusterScanExec {
    input: Arc<dyn ExecutionPlan>,
    spec: ScanSpec,
    props: Arc<PlanProperties>,
}

impl ClusterScanExec {
    fn try_new(input: Arc<dyn ExecutionPlan>, spec: ScanSpec) -> DfResult<Self> {
        let out = match &spec.projection {
            Some(p) => Arc::new(spec.schema.project(p)?),
            None => spec.schema.clone(),
        };
        let props = PlanProperties::new(
            EquivalenceProperties::new(out),
            Partitioning::UnknownPartitioning(input.output_partitioning().partition_count()),
            EmissionType::Incremental,
            Boundedness::Bounded,
        );
        Ok(Self {
            input,
            spec,
            props: Arc::new(props),
        })
    }

    fn encode(&self, buf: &mut Vec<u8>) -> DfResult<()> {
        let s = &self.spec;
        let wire = ScanWire {
            url: s.url.clone(),
            version: s.version,
            projection: s.projection.clone(),
            limit: s.limit,
        };
        let json = serde_json::to_vec(&wire).map_err(external)?;
        buf.extend_from_slice(&(json.len() as u32).to_le_bytes());
        buf.extend_from_slice(&json);
        let mut w = StreamWriter::try_new(&mut *buf, &s.schema)?;
        w.finish()?;
        Ok(())
    }

    fn decode(buf: &[u8], input: Arc<dyn ExecutionPlan>) -> DfResult<Self> {
        let bad = || DataFusionError::Internal("a truncated trajstore scan".into());
        let len = u32::from_le_bytes(
            buf.get(..4)
                .ok_or_else(bad)?
                .try_into()
                .map_err(|_| bad())?,
        );
        let json = buf.get(4..4 + len as usize).ok_or_else(bad)?;
        let wire: ScanWire = serde_json::from_slice(json).map_err(external)?;
        let schema = StreamReader::try_new(Cursor::new(&buf[4 + len as usize..]), None)?.schema();
        Self::try_new(
            input,
            ScanSpec {
                url: wire.url,
                version: wire.version,
                projection: wire.projection,
                limit: wire.limit,
                schema,
            },
        )
    }
}

impl DisplayAs for ClusterScanExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "ClusterScanExec: {} v{}, projection={:?}, limit={:?}",
            self.spec.url, self.spec.version, self.spec.projection, self.spec.limit
        )
    }
}

impl ExecutionPlan for ClusterScanExec {
    fn name(&self) -> &str {
        "ClusterScanExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.props
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    // Each input partition names whole segments; splitting or merging them changes nothing
    // but the work per task.
    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>,
    ) -> DfResult<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let [input] = <[_; 1]>::try_from(children)
            .map_err(|_| DataFusionError::Internal("ClusterScanExec has one child".into()))?;
        Ok(Arc::new(Self::try_new(input, self.spec.clone())?))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let segments = self.input.execute(partition, context.clone())?;
        let spec = self.spec.clone();
        let out = segments
            .map_ok(move |tokens| {
                let ids: Vec<u64> = tokens
                    .column_by_name(SEGMENT)
                    .and_then(|c| c.as_primitive_opt::<UInt64Type>())
                    .map(|c| c.values().to_vec())
                    .unwrap_or_default();
                futures::stream::iter(ids.into_iter().map(Ok))
                    .and_then({
                        let (spec, context) = (spec.clone(), context.clone());
                        move |segment| read_segment(spec.clone(), segment as usize, context.clone())
                    })
                    .try_flatten()
            })
            .try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(self.schema(), out)))
    }
}

/// Segment `segment` of `spec`'s version, projected and limited: for a URL, only the projected
/// columns' buffers, with ranged GETs ([`ranged_for_sql`]); for a directory, zero-copy from its
/// memory map.
async fn read_segment(
    spec: ScanSpec,
    segment: usize,
    context: Arc<TaskContext>,
) -> DfResult<SendableRecordBatchStream> {
    let (url, version) = (spec.url.clone(), spec.version);
    if DatasetBuilder::from_uri(&url).is_remote() {
        let table = tokio::task::spawn_blocking(move || ranged_for_sql(&url, version))
            .await
            .map_err(external)?
            .map_err(external)?;
        let all: Vec<usize> = (0..spec.schema.fields().len()).collect();
        let projection = spec.projection.unwrap_or(all);
        let schema = Arc::new(spec.schema.project(&projection)?);
        let batches = table
            .table
            .segment(segment, &projection, spec.limit)
            .await
            .map_err(external)?;
        let source = MemorySourceConfig::try_new(&[batches], schema, None)?.with_limit(spec.limit);
        return source.open(0, context);
    }
    let table = tokio::task::spawn_blocking(move || transitions_for_sql(&url, version))
        .await
        .map_err(external)?
        .map_err(external)?;
    let batches = table
        .segment_batches(segment, spec.projection.as_ref())
        .ok_or_else(|| {
            DataFusionError::Internal(format!(
                "{} version {} has no segment {segment}",
                spec.url, spec.version
            ))
        })?
        .map_err(external)?;
    let source = MemorySourceConfig::try_new(&[batches], table.schema(), spec.projection)?
        .with_limit(spec.limit);
    Ok(super::readahead::read_ahead(source.open(0, context)?))
}

fn external(e: impl std::error::Error + Send + Sync + 'static) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

/// Runs `f` on a thread of its own: opening a dataset blocks on its own runtime, which must not
/// happen on an async worker thread.
fn off_runtime<T: Send>(f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
    std::thread::scope(|s| {
        s.spawn(f)
            .join()
            .unwrap_or_else(|_| Err(Error::argument("cluster", "opening the dataset panicked")))
    })
}

/// trajstore's [`LogicalExtensionCodec`]: the cluster tables travel as [`TableSpec`]s; anything
/// else goes to Ballista's codec.
#[derive(Debug, Default)]
pub struct TrajLogicalCodec {
    inner: BallistaLogicalExtensionCodec,
}

impl LogicalExtensionCodec for TrajLogicalCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[LogicalPlan],
        ctx: &TaskContext,
    ) -> DfResult<Extension> {
        self.inner.try_decode(buf, inputs, ctx)
    }

    fn try_encode(&self, node: &Extension, buf: &mut Vec<u8>) -> DfResult<()> {
        self.inner.try_encode(node, buf)
    }

    fn try_decode_table_provider(
        &self,
        buf: &[u8],
        table_ref: &TableReference,
        schema: SchemaRef,
        ctx: &TaskContext,
    ) -> DfResult<Arc<dyn TableProvider>> {
        match buf.split_first() {
            Some((&TAG_TRAJSTORE, rest)) => {
                let spec: TableSpec = serde_json::from_slice(rest).map_err(external)?;
                let spec = Arc::new(spec);
                if spec.table == TRANSITIONS {
                    return Ok(Arc::new(ClusterTransitions { spec, schema }));
                }
                let (url, version) = (spec.url.clone(), spec.version);
                let catalog = off_runtime(|| catalog_for_sql(&url, version))
                    .map_err(|e| DataFusionError::External(Box::new(e)))?;
                let inner = episodes_table(&catalog).map_err(external)?;
                Ok(Arc::new(ClusterEpisodes { spec, inner }))
            }
            Some((&TAG_BALLISTA, rest)) => self
                .inner
                .try_decode_table_provider(rest, table_ref, schema, ctx),
            _ => Err(DataFusionError::Internal(
                "an unknown table encoding".into(),
            )),
        }
    }

    fn try_encode_table_provider(
        &self,
        table_ref: &TableReference,
        node: Arc<dyn TableProvider>,
        buf: &mut Vec<u8>,
    ) -> DfResult<()> {
        let spec = if let Some(t) = node.downcast_ref::<ClusterTransitions>() {
            Some(&t.spec)
        } else {
            node.downcast_ref::<ClusterEpisodes>().map(|t| &t.spec)
        };
        match spec {
            Some(spec) => {
                buf.push(TAG_TRAJSTORE);
                serde_json::to_writer(&mut *buf, spec.as_ref()).map_err(external)
            }
            None => {
                buf.push(TAG_BALLISTA);
                self.inner.try_encode_table_provider(table_ref, node, buf)
            }
        }
    }

    fn try_decode_file_format(
        &self,
        buf: &[u8],
        ctx: &TaskContext,
    ) -> DfResult<Arc<dyn FileFormatFactory>> {
        self.inner.try_decode_file_format(buf, ctx)
    }

    fn try_encode_file_format(
        &self,
        buf: &mut Vec<u8>,
        node: Arc<dyn FileFormatFactory>,
    ) -> DfResult<()> {
        self.inner.try_encode_file_format(buf, node)
    }
}

/// trajstore's [`PhysicalExtensionCodec`]: a [`ClusterScanExec`] travels as its [`ScanSpec`];
/// anything else (Ballista's shuffle operators) goes to Ballista's codec.
#[derive(Debug, Default)]
pub struct TrajPhysicalCodec {
    inner: BallistaPhysicalExtensionCodec,
}

impl PhysicalExtensionCodec for TrajPhysicalCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        match buf.split_first() {
            Some((&TAG_TRAJSTORE, rest)) => {
                let [input] = inputs else {
                    return Err(DataFusionError::Internal(
                        "ClusterScanExec has one input".into(),
                    ));
                };
                Ok(Arc::new(ClusterScanExec::decode(rest, input.clone())?))
            }
            Some((&TAG_BALLISTA, rest)) => {
                self.inner.try_decode(rest, inputs, ctx, proto_converter)
            }
            _ => Err(DataFusionError::Internal("an unknown plan encoding".into())),
        }
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> DfResult<()> {
        if let Some(scan) = node.downcast_ref::<ClusterScanExec>() {
            buf.push(TAG_TRAJSTORE);
            return scan.encode(buf);
        }
        buf.push(TAG_BALLISTA);
        self.inner.try_encode(node, buf, proto_converter)
    }
}

/// The scheduler's sessions: Ballista's defaults plus trajstore's functions (so that plans that
/// name them decode).
fn scheduler_session(config: datafusion::prelude::SessionConfig) -> DfResult<SessionState> {
    let mut state = ballista_core::utils::default_session_builder(config)?;
    for f in super::trajstore_udfs() {
        state.register_udf(Arc::new(f))?;
    }
    for f in super::trajstore_udafs() {
        state.register_udaf(Arc::new(f))?;
    }
    Ok(state)
}

/// DataFusion's and Ballista's functions plus trajstore's: what an executor decodes plans with.
fn executor_functions() -> BallistaFunctionRegistry {
    let mut reg = BallistaFunctionRegistry::default();
    for f in super::trajstore_udfs() {
        reg.scalar_functions
            .insert(f.name().to_string(), Arc::new(f));
    }
    for f in super::trajstore_udafs() {
        reg.aggregate_functions
            .insert(f.name().to_string(), Arc::new(f));
    }
    reg
}

fn cluster_error(what: &str, e: impl fmt::Display) -> Error {
    Error::argument("cluster", format!("{what}: {e}"))
}

/// Runs a Ballista scheduler with trajstore's codec and functions on `bind` until it fails.
pub async fn run_scheduler(bind: SocketAddr) -> Result<()> {
    use ballista_scheduler::cluster::BallistaCluster;
    use ballista_scheduler::config::SchedulerConfig;
    let mut config = SchedulerConfig::default()
        .with_hostname(bind.ip().to_string())
        .with_port(bind.port())
        .with_override_session_builder(Arc::new(scheduler_session));
    config.bind_host = bind.ip().to_string();
    config.override_logical_codec = Some(Arc::new(TrajLogicalCodec::default()));
    config.override_physical_codec = Some(Arc::new(TrajPhysicalCodec::default()));
    let cluster = BallistaCluster::new_from_config(&config)
        .await
        .map_err(|e| cluster_error("cannot set up the scheduler", e))?;
    ballista_scheduler::scheduler_process::start_server(cluster, bind, Arc::new(config))
        .await
        .map_err(|e| cluster_error(&format!("the scheduler on {bind} stopped"), e))
}

/// Where an executor listens and which scheduler it serves.
#[derive(Debug, Clone)]
pub struct ExecutorOptions {
    /// The scheduler's address.
    pub scheduler: SocketAddr,
    /// Where the executor serves Arrow Flight (results and shuffle data).
    pub bind: SocketAddr,
    /// Where the executor's gRPC service listens.
    pub grpc_port: u16,
    /// Tasks run at once (default: the number of cores).
    pub concurrency: Option<usize>,
}

/// Runs a Ballista executor with trajstore's codec and functions until it stops.
pub async fn run_executor(opts: ExecutorOptions) -> Result<()> {
    use ballista_executor::executor_process::{ExecutorProcessConfig, start_executor_process};
    let mut config = ExecutorProcessConfig {
        bind_host: opts.bind.ip().to_string(),
        external_host: Some(opts.bind.ip().to_string()),
        port: opts.bind.port(),
        grpc_port: opts.grpc_port,
        scheduler_host: opts.scheduler.ip().to_string(),
        scheduler_port: opts.scheduler.port(),
        override_logical_codec: Some(Arc::new(TrajLogicalCodec::default())),
        override_physical_codec: Some(Arc::new(TrajPhysicalCodec::default())),
        override_function_registry: Some(Arc::new(executor_functions())),
        ..Default::default()
    };
    if let Some(n) = opts.concurrency {
        config.vcores = n.max(1);
    }
    start_executor_process(Arc::new(config))
        .await
        .map_err(|e| cluster_error("the executor stopped", e))
}

/// `df://HOST:PORT` → the scheduler's address, checked to answer.
fn reachable(cluster: &str) -> Result<()> {
    let hostport = cluster.strip_prefix("df://").ok_or_else(|| {
        Error::argument(
            "cluster",
            format!("`{cluster}` is not a cluster URL: write df://HOST:PORT"),
        )
    })?;
    let unreachable = |why: String| Error::Remote {
        url: cluster.to_string(),
        message: format!(
            "cannot reach the Ballista scheduler ({why}); start one with \
             `trajstore cluster scheduler --bind {hostport}`"
        ),
        source: None,
    };
    let addrs: Vec<SocketAddr> = hostport
        .to_socket_addrs()
        .map_err(|e| unreachable(e.to_string()))?
        .collect();
    let mut last = String::from("no address");
    for a in addrs {
        match TcpStream::connect_timeout(&a, CONNECT_TIMEOUT) {
            Ok(_) => return Ok(()),
            Err(e) => last = format!("{a}: {e}"),
        }
    }
    Err(unreachable(last))
}

impl SqlSession {
    /// A session whose queries run on the Ballista cluster whose scheduler is at `cluster`
    /// (`df://HOST:PORT`), over version `version` (default the newest) of the dataset at
    /// `dataset`: a URL (`s3://bucket/prefix`), or a directory that every process of the
    /// cluster reads at that path. Only the catalog is read here; executors read the
    /// transitions themselves (ranged reads of a URL's projected columns). Read-only like every session; an
    /// unreachable scheduler is an [`Error::Remote`].
    pub fn cluster(cluster: &str, dataset: &str, version: Option<u64>) -> Result<Self> {
        reachable(cluster)?;
        let mut builder = DatasetBuilder::from_uri(dataset);
        if let Some(v) = version {
            builder = builder.with_version(v);
        }
        let catalog = builder.load_catalog()?;
        let schema = Arc::new(Schema::clone(catalog.schema().arrow_schema()));
        let transitions = ClusterTransitions {
            spec: Arc::new(TableSpec::of(dataset, &catalog, TRANSITIONS)),
            schema,
        };
        let episodes = ClusterEpisodes {
            spec: Arc::new(TableSpec::of(dataset, &catalog, EPISODES)),
            inner: episodes_table(&catalog)?,
        };
        let rt = runtime()?;
        let ctx = rt.block_on(async {
            let config = default_config()
                .with_ballista_logical_extension_codec(Arc::new(TrajLogicalCodec::default()))
                .with_ballista_physical_extension_codec(Arc::new(TrajPhysicalCodec::default()));
            let state = SessionStateBuilder::new()
                .with_config(config)
                .with_default_features()
                .build();
            SessionContext::remote_with_state(cluster, state).await
        })?;
        ctx.register_table(TRANSITIONS, Arc::new(transitions))?;
        ctx.register_table(EPISODES, Arc::new(episodes))?;
        super::register_functions(&ctx);
        Ok(Self {
            ctx,
            rt,
            allow_writes: false,
        })
    }
}
