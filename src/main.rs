//! The `trajstore` command-line tool: a thin layer over the library.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use indicatif::{HumanBytes, HumanCount, ProgressBar, ProgressStyle};
use serde_json::json;
use trajstore::format::ep;
use trajstore::stats::{Summary, render_histogram};
use trajstore::synth::SynthSpec;
use trajstore::{Catalog, Dataset, Snapshot, WriterOptions};

/// `println!` through [`emit`].
macro_rules! outln {
    ($($t:tt)*) => { emit(&format!("{}\n", format_args!($($t)*))) };
}

#[cfg(feature = "sql")]
mod sql_shell;

/// Writes to stdout; a closed pipe (`trajstore info d | head`) ends the program quietly.
fn emit(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("error: cannot write to stdout: {e}");
        std::process::exit(1);
    }
}

#[derive(Parser)]
#[command(
    name = "trajstore",
    version,
    about = "An Apache Arrow store for reinforcement-learning transitions",
    long_about = "trajstore stores RL transitions as memory-mapped Arrow IPC segments with precomputed \
episode boundaries, so that slices can be sampled without scanning and every file is readable by \
pyarrow, Polars, DuckDB and DataFusion.\n\n\
A dataset is a directory: `_versions/` holds one JSON manifest per commit, `segments/` the Arrow \
files. Readers always see a whole committed version.",
    after_help = "Examples:\n  \
trajstore demo                                  # 1M synthetic transitions into ./demo.trajstore\n  \
trajstore info demo.trajstore                   # counts, sizes, schema, episode histograms\n  \
trajstore ingest hopper.parquet hopper.trajstore --terminated-col terminals --truncated-col timeouts\n  \
trajstore verify hopper.trajstore               # checksums and boundary columns\n  \
trajstore export hopper.trajstore hopper-out.parquet\n  \
trajstore sql demo.trajstore \"SELECT episode_id, episode_return FROM episodes ORDER BY 2 DESC LIMIT 5\"\n  \
trajstore push demo.trajstore s3://my-bucket/demo   # then any command reads s3://my-bucket/demo"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Write a seeded synthetic D4RL-shaped dataset (the quickest way to see the whole path).
    Demo(DemoArgs),
    /// Ingest an offline-RL dataset (Parquet, Arrow IPC, NumPy, D4RL/Minari HDF5, LeRobot, TorchRL).
    ///
    /// One row (or array row) per transition. Common layouts need no flags: D4RL's
    /// `observations, actions, rewards, terminals, timeouts, next_observations` (as saved by
    /// `np.savez("hopper.npz", **env.get_dataset())`), Gymnasium's `terminated/truncated`,
    /// Minari's `terminations/truncations`, LeRobot's `episode_index`/`observation.state`/
    /// `next.reward` (give the dataset's directory: its `data/` shards are read in order), and
    /// TorchRL replay buffers
    /// saved with `rb.dumps(DIR)` (`observation`, `action`, `next/reward`, `next/terminated`,
    /// `next/truncated`, `next/observation`; oldest row first). The options below override
    /// what is detected; the output says which columns were used. Columns that are not used are
    /// kept as user columns (fixed-width ones) unless dropped with --drop-cols.
    ///
    /// Examples:
    ///   trajstore ingest hopper_medium-v2.hdf5 hopper.trajstore   # a D4RL file, as downloaded
    ///   trajstore ingest ~/.minari/datasets/mujoco/hopper/expert-v0 hopper.trajstore   # Minari
    ///   trajstore ingest hopper-medium.npz hopper.trajstore
    ///   trajstore ingest arrays/ hopper.trajstore --drop-cols infos/qpos,infos/qvel
    ///   trajstore ingest rb-dump/ buffer.trajstore                # a TorchRL rb.dumps() directory
    ///   trajstore ingest ~/lerobot/pusht pusht.trajstore           # a LeRobot v2 dataset directory
    ///   trajstore ingest steps.feather out.trajstore               # pyarrow / Polars Arrow IPC file
    ///   trajstore ingest episodes.parquet out.trajstore --episode-col ep --action-cols ax,ay
    #[command(verbatim_doc_comment)]
    Ingest(Box<IngestArgs>),
    /// Show transitions, episodes, sizes, schema and episode length/return summaries.
    Info(InfoArgs),
    /// Check every checksum and that boundary columns agree with the episode tables.
    Verify(VersionArgs),
    /// Write every transition (boundary columns included) to a Parquet file.
    Export(ExportArgs),
    /// Sample one batch of slices and show it (which episodes, which steps).
    Sample(SampleArgs),
    /// Time index-only sampling, sample+gather and the loader against a memcpy of the same bytes;
    /// with --device (a `torch` build), the torch loader to CPU or CUDA tensors, against a plain
    /// pinned host-to-device copy.
    ///
    /// Examples:
    ///   trajstore bench demo.trajstore --slice-len 64 --num-slices 256
    ///   trajstore bench demo.trajstore --device cuda            # pinned, prefetched streaming
    ///   trajstore bench demo.trajstore --device cuda --resident --cast bf16
    #[command(verbatim_doc_comment)]
    Bench(BenchArgs),
    /// Query the dataset with SQL (tables `transitions` and `episodes`); without a query, an
    /// interactive prompt.
    #[cfg(feature = "sql")]
    Sql(sql_shell::SqlArgs),
    /// Upload a local dataset's newest version to object storage (s3://BUCKET/PREFIX).
    ///
    /// Only the files the store lacks are sent; the version becomes visible to readers when
    /// its manifest is written, last, with a conditional create, so readers never see half a
    /// push and a concurrent writer's version is never overwritten. The remote must be empty
    /// or hold an older version of this same dataset (a push only fast-forwards).
    ///
    /// S3 settings come from the usual environment variables: AWS_ACCESS_KEY_ID,
    /// AWS_SECRET_ACCESS_KEY, AWS_REGION, and for S3-compatible servers (MinIO, Ceph, R2, ...)
    /// AWS_ENDPOINT_URL (plus AWS_ALLOW_HTTP=true for a plain-HTTP endpoint).
    ///
    /// Examples:
    ///   trajstore push hopper.trajstore s3://my-bucket/d4rl/hopper
    ///   trajstore info s3://my-bucket/d4rl/hopper     # any command reads a URL (see `pull`)
    #[cfg(feature = "remote")]
    #[command(verbatim_doc_comment)]
    Push(PushArgs),
    /// Mirror a dataset in object storage into a local directory (only missing files are
    /// downloaded, each checked against the manifest's checksum).
    ///
    /// Every command that reads a dataset (info, sql, sample, bench, verify, export) also
    /// accepts the URL itself and pulls into a cache first: $TRAJSTORE_CACHE, else
    /// $XDG_CACHE_HOME/trajstore, else ~/.cache/trajstore, in <scheme>/<bucket>/<prefix>.
    /// Files of older versions are removed from a mirror when a newer one is pulled.
    ///
    /// Examples:
    ///   trajstore pull s3://my-bucket/d4rl/hopper                 # into the cache
    ///   trajstore pull s3://my-bucket/d4rl/hopper --to hopper.trajstore --version 3
    #[cfg(feature = "remote")]
    #[command(verbatim_doc_comment)]
    Pull(PullArgs),
}

#[cfg(feature = "remote")]
#[derive(Args)]
struct PushArgs {
    /// Local dataset directory.
    dataset: PathBuf,
    /// Destination, e.g. s3://BUCKET/PREFIX (or file:///PATH).
    url: String,
    /// Files transferred at once.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Print a JSON summary instead of text.
    #[arg(long)]
    json: bool,
}

#[cfg(feature = "remote")]
#[derive(Args)]
struct PullArgs {
    /// The remote dataset, e.g. s3://BUCKET/PREFIX.
    url: String,
    /// Mirror directory (default: the URL's place in the cache).
    #[arg(long, value_name = "DIR")]
    to: Option<PathBuf>,
    /// Pull this version instead of the newest.
    #[arg(long)]
    version: Option<u64>,
    /// Files transferred at once.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Print a JSON summary instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct DemoArgs {
    /// Dataset directory to write (an existing dataset there is replaced unless --append).
    #[arg(default_value = "demo.trajstore")]
    dataset: PathBuf,
    /// Number of transitions.
    #[arg(long, default_value_t = 1_000_000)]
    transitions: u64,
    /// Observation dimension.
    #[arg(long, default_value_t = 17)]
    obs_dim: usize,
    /// Action dimension (number of actions with --discrete).
    #[arg(long, default_value_t = 6)]
    act_dim: usize,
    /// Discrete actions (int64) instead of continuous ones.
    #[arg(long)]
    discrete: bool,
    /// Mean episode length (lengths are exponential, clamped to [10, 4 * mean]).
    #[arg(long, default_value_t = 1000.0)]
    mean_episode_len: f64,
    /// Seed: the same arguments always produce the same bytes.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Append to an existing dataset instead of replacing it.
    #[arg(long)]
    append: bool,
    /// Commit every N episodes, as a live collector would (default: once at the end).
    #[arg(long, value_name = "N")]
    commit_every: Option<usize>,
    #[command(flatten)]
    write: WriteArgs,
    /// Print a JSON summary instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct WriteArgs {
    /// Target segment file size (e.g. 256MiB, 1GiB).
    #[arg(long, default_value = "256MiB", value_parser = parse_size)]
    segment_size: u64,
    /// Keep at most this many transitions, dropping the oldest segments (FIFO replay).
    #[arg(long)]
    max_transitions: Option<u64>,
    /// Keep only the newest N versions and delete files no kept version uses.
    #[arg(long, value_name = "N")]
    keep_versions: Option<usize>,
}

impl WriteArgs {
    fn options(&self) -> WriterOptions {
        let mut o = WriterOptions::default().with_segment_bytes(self.segment_size);
        o.batch_bytes = o.batch_bytes.min(self.segment_size);
        if let Some(m) = self.max_transitions {
            o = o.with_max_transitions(m);
        }
        if let Some(k) = self.keep_versions {
            o = o.with_keep_versions(k);
        }
        o
    }
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum IngestFormat {
    Parquet,
    Numpy,
    Torchrl,
    Hdf5,
    Arrow,
}

impl From<IngestFormat> for trajstore::ingest::InputFormat {
    fn from(f: IngestFormat) -> Self {
        match f {
            IngestFormat::Parquet => Self::Parquet,
            IngestFormat::Numpy => Self::Numpy,
            IngestFormat::Torchrl => Self::TorchRl,
            IngestFormat::Hdf5 => Self::Hdf5,
            IngestFormat::Arrow => Self::Arrow,
        }
    }
}

#[derive(Args)]
struct IngestArgs {
    /// Input: a Parquet file or a directory of Parquet shards, a NumPy .npz archive or a directory
    /// of .npy files, a D4RL HDF5 file or Minari dataset directory, an Arrow IPC file (.arrow,
    /// .feather), or a TorchRL replay buffer directory written by rb.dumps().
    input: PathBuf,
    /// Input format (default: from the extension, else the file's first bytes).
    #[arg(long, value_enum)]
    format: Option<IngestFormat>,
    /// Dataset directory (created if it does not exist, appended to otherwise).
    dataset: PathBuf,
    /// Column holding episode ids (rows of one episode must be contiguous).
    #[arg(long, value_name = "NAME")]
    episode_col: Option<String>,
    /// Per-row terminal flag; an episode ends where terminated or truncated is set (D4RL).
    #[arg(long, value_name = "NAME")]
    terminated_col: Option<String>,
    /// Per-row time-limit flag (D4RL `timeouts`).
    #[arg(long, value_name = "NAME")]
    truncated_col: Option<String>,
    /// Observation column (fixed-size list or list of numbers).
    #[arg(long, default_value = "observation", value_name = "NAME")]
    observation_col: String,
    /// Build the observation from several scalar columns instead, e.g. `x,y,vx,vy`.
    #[arg(long, value_delimiter = ',', value_name = "A,B,..")]
    observation_cols: Vec<String>,
    /// Action column (list of floats, or an integer column for discrete actions).
    #[arg(long, default_value = "action", value_name = "NAME")]
    action_col: String,
    /// Build the action from several scalar columns instead.
    #[arg(long, value_delimiter = ',', value_name = "A,B,..")]
    action_cols: Vec<String>,
    /// Reward column (cast to float32).
    #[arg(long, default_value = "reward", value_name = "NAME")]
    reward_col: String,
    /// The data has no reward (demonstrations): store 0.0 for every transition.
    #[arg(long, conflicts_with = "reward_col")]
    no_reward: bool,
    /// Store this column as next_observation (default: derived from the next row).
    #[arg(long, value_name = "NAME")]
    next_observation_col: Option<String>,
    /// Columns to leave out (other columns are kept as user columns).
    #[arg(long, value_delimiter = ',', value_name = "A,B,..")]
    drop_cols: Vec<String>,
    /// Stream input (`-` or an Arrow IPC stream file): commit once N new episodes have ended
    /// (checked after each record batch), so readers see them while the stream is still open.
    #[arg(long, value_name = "N")]
    commit_every: Option<u64>,
    /// Stream input: commit when S seconds have passed since the last commit and new episodes
    /// have arrived (checked as record batches arrive).
    #[arg(long, value_name = "S")]
    commit_secs: Option<f64>,
    #[command(flatten)]
    write: WriteArgs,
    /// Print a JSON summary instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct InfoArgs {
    #[command(flatten)]
    v: VersionArgs,
    /// Number of histogram bins (0 to hide the histograms).
    #[arg(long, default_value_t = 12)]
    bins: usize,
}

#[derive(Args)]
struct VersionArgs {
    /// Dataset directory, or a URL (s3://BUCKET/PREFIX; see `trajstore pull --help`).
    dataset: PathBuf,
    /// Read this version instead of the newest.
    #[arg(long)]
    version: Option<u64>,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct ExportArgs {
    /// Dataset directory, or a URL (s3://BUCKET/PREFIX; see `trajstore pull --help`).
    dataset: PathBuf,
    /// Output Parquet file.
    output: PathBuf,
    /// Export this version instead of the newest.
    #[arg(long)]
    version: Option<u64>,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 1 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Demo(a) => demo(a),
        Command::Ingest(a) => ingest(*a),
        Command::Info(a) => info(a),
        Command::Verify(a) => verify(a),
        Command::Export(a) => export(a),
        Command::Sample(a) => sample(a),
        Command::Bench(a) => bench(a),
        #[cfg(feature = "sql")]
        Command::Sql(a) => sql_shell::sql(a),
        #[cfg(feature = "remote")]
        Command::Push(a) => push(a),
        #[cfg(feature = "remote")]
        Command::Pull(a) => pull(a),
    }
}

fn progress(total: u64, what: &str) -> ProgressBar {
    let pb = ProgressBar::new(total);
    pb.set_style(
        ProgressStyle::with_template(&format!(
            "{what} {{bar:40}} {{human_pos}}/{{human_len}} ({{per_sec}}, eta {{eta}})"
        ))
        .expect("valid template"),
    );
    pb
}

fn open_snapshot(path: &Path, version: Option<u64>) -> Result<Snapshot> {
    if let Some(url) = path.to_str().filter(|s| trajstore::format::is_url(s)) {
        return open_remote_snapshot(url, version);
    }
    let ds =
        Dataset::open(path).with_context(|| format!("cannot open dataset {}", path.display()))?;
    Ok(match version {
        Some(v) => ds.snapshot_at(v)?,
        None => ds.snapshot()?,
    })
}

/// A snapshot of a dataset in object storage: its mirror under the cache is brought up to date
/// (missing files downloaded and checked), then mapped like any local dataset.
#[cfg(feature = "remote")]
fn open_remote_snapshot(url: &str, version: Option<u64>) -> Result<Snapshot> {
    let (ds, r) = trajstore::remote::open(url, None, version, reader_remote_options())
        .with_context(|| format!("cannot open dataset {url}"))?;
    report_fetch("pulled version", &r);
    Ok(ds.snapshot_at(r.version)?)
}

/// The catalog (manifest and episode tables) of a dataset: for a URL only the episode tables
/// are fetched into the mirror, not the transitions.
fn open_catalog(path: &Path, version: Option<u64>) -> Result<(Catalog, String)> {
    if let Some(url) = path.to_str().filter(|s| trajstore::format::is_url(s)) {
        return open_remote_catalog(url, version).map(|c| (c, url.to_string()));
    }
    let snap = open_snapshot(path, version)?;
    Ok((snap.catalog(), path.display().to_string()))
}

#[cfg(feature = "remote")]
fn open_remote_catalog(url: &str, version: Option<u64>) -> Result<Catalog> {
    let (catalog, r) = trajstore::remote::open_catalog(url, None, version, reader_remote_options())
        .with_context(|| format!("cannot open dataset {url}"))?;
    report_fetch("fetched the episode tables of version", &r);
    Ok(catalog)
}

#[cfg(not(feature = "remote"))]
fn open_remote_catalog(url: &str, _version: Option<u64>) -> Result<Catalog> {
    open_remote_snapshot(url, None).map(|s| s.catalog())
}

/// One line on stderr when files were downloaded into a mirror.
#[cfg(feature = "remote")]
fn report_fetch(what: &str, r: &trajstore::remote::PullReport) {
    if r.files_downloaded > 0 {
        eprintln!(
            "{what} {} of {}: {} files ({}) downloaded, {} ({}) already in {}",
            r.version,
            r.url,
            r.files_downloaded,
            HumanBytes(r.bytes_downloaded),
            r.files_cached,
            HumanBytes(r.bytes_cached),
            r.mirror.display()
        );
    }
}

#[cfg(not(feature = "remote"))]
fn open_remote_snapshot(url: &str, _version: Option<u64>) -> Result<Snapshot> {
    bail!("{url} is a URL, but this build of trajstore has no `remote` feature (object storage)")
}

fn demo(a: DemoArgs) -> Result<()> {
    let spec = SynthSpec {
        transitions: a.transitions,
        obs_dim: a.obs_dim,
        act_dim: a.act_dim,
        discrete_actions: a.discrete,
        mean_episode_len: a.mean_episode_len,
        seed: a.seed,
    };
    if a.transitions == 0 || a.obs_dim == 0 || a.act_dim == 0 {
        bail!("--transitions, --obs-dim and --act-dim must be positive");
    }
    let schema = spec.schema()?;
    let ds = if a.dataset.exists() && a.append {
        Dataset::open(&a.dataset)?
    } else {
        if a.dataset.exists() {
            if !a.dataset.join(trajstore::format::VERSIONS_DIR).is_dir() {
                bail!(
                    "{} exists and is not a trajstore dataset; refusing to replace it",
                    a.dataset.display()
                );
            }
            std::fs::remove_dir_all(&a.dataset)
                .with_context(|| format!("cannot replace {}", a.dataset.display()))?;
        }
        Dataset::create(&a.dataset, &schema)?
    };
    let start = Instant::now();
    let mut writer = ds.writer(a.write.options())?;
    if writer.schema() != &schema {
        bail!(
            "--append: the dataset's schema differs from the demo's (check --obs-dim/--act-dim/--discrete)"
        );
    }
    writer.set_property("source", format!("trajstore demo (seed {})", a.seed));
    let pb = if a.json {
        ProgressBar::hidden()
    } else {
        progress(a.transitions, "writing")
    };
    let version = spec.write(&mut writer, a.commit_every, |n| pb.inc(n))?;
    drop(writer);
    pb.finish_and_clear();
    let secs = start.elapsed().as_secs_f64();
    let snap = ds.snapshot()?;
    if a.json {
        let mut v = info_json(&snap.catalog(), &a.dataset.display().to_string());
        v["write_seconds"] = json!(secs);
        outln!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        outln!(
            "wrote {} transitions in {:.2} s ({}/s, {}/s) -> version {version}\n",
            HumanCount(a.transitions),
            secs,
            HumanCount((a.transitions as f64 / secs) as u64),
            HumanBytes(
                (snap.bytes_on_disk() as f64 * a.transitions as f64
                    / snap.num_transitions().max(1) as f64
                    / secs) as u64
            ),
        );
        emit(&render_info(
            &snap.catalog(),
            &a.dataset.display().to_string(),
            12,
        ));
        if let Ok(text) = demo_sample(&snap) {
            emit(&text);
        }
        let d = a.dataset.display();
        let sql = if cfg!(feature = "sql") {
            format!(
                "\n  trajstore sql {d} \"SELECT episode_id, length, episode_return FROM episodes ORDER BY episode_return DESC LIMIT 5\""
            )
        } else {
            String::new()
        };
        outln!(
            "\nnext:\n  trajstore sample {d} --slice-len 64 --num-slices 8\n  trajstore bench {d}{sql}\n  trajstore verify {d}"
        );
    }
    Ok(())
}

fn ingest(a: IngestArgs) -> Result<()> {
    use trajstore::ingest::{IngestOptions, InputFormat};
    let stdin = a.input.as_os_str() == "-";
    let format = match a.format {
        Some(f) => f.into(),
        None if stdin => InputFormat::Arrow,
        None => InputFormat::detect(&a.input)?,
    };
    if stdin && format != InputFormat::Arrow {
        bail!("`-` reads an Arrow IPC stream from stdin; --format must be arrow");
    }
    let policy = trajstore::ingest::CommitPolicy {
        episodes: a.commit_every,
        interval: match a.commit_secs {
            Some(s) if !(s.is_finite() && s > 0.0) => bail!("--commit-secs must be positive"),
            s => s.map(std::time::Duration::from_secs_f64),
        },
    };
    if a.commit_every == Some(0) {
        bail!("--commit-every must be at least 1");
    }
    let streamed = stdin
        || (format == InputFormat::Arrow
            && trajstore::ingest::is_arrow_stream(&a.input).unwrap_or(false));
    if policy != Default::default() && !streamed {
        bail!(
            "--commit-every and --commit-secs apply to streams (`-` or an Arrow IPC stream file); \
             a file is committed once, whole"
        );
    }
    let mut o = IngestOptions::default();
    o.episode_col = a.episode_col;
    o.terminated_col = a.terminated_col;
    o.truncated_col = a.truncated_col;
    o.observation_col = a.observation_col;
    o.observation_cols = a.observation_cols;
    o.action_col = a.action_col;
    o.action_cols = a.action_cols;
    o.reward_col = a.reward_col;
    o.no_reward = a.no_reward;
    o.next_observation_col = a.next_observation_col;
    o.drop_cols = a.drop_cols;
    o.progress = !a.json;
    let report = if streamed {
        let (name, input): (PathBuf, Box<dyn std::io::Read>) = if stdin {
            ("stdin".into(), Box::new(std::io::stdin().lock()))
        } else {
            let f = std::fs::File::open(&a.input)
                .with_context(|| format!("cannot open {}", a.input.display()))?;
            let name = std::fs::canonicalize(&a.input).unwrap_or_else(|_| a.input.clone());
            (name, Box::new(f))
        };
        trajstore::ingest::ingest_stream(input, &name, &a.dataset, &o, a.write.options(), policy)?
    } else {
        trajstore::ingest::ingest(&a.input, format, &a.dataset, &o, a.write.options())?
    };
    if a.json {
        let columns: serde_json::Map<String, serde_json::Value> = report
            .columns
            .iter()
            .map(|(k, v)| (k.clone(), json!(v)))
            .collect();
        outln!(
            "{}",
            json!({"rows": report.rows, "episodes": report.episodes, "version": report.version,
                   "seconds": report.seconds, "rows_per_s": report.rows as f64 / report.seconds,
                   "columns": columns, "boundaries": report.boundaries})
        );
    } else {
        outln!("episodes from {}", report.boundaries);
        for (stored, input) in &report.columns {
            outln!("  {stored} <- {input}");
        }
        outln!(
            "ingested {} transitions in {} episodes in {:.2} s ({}/s) -> {} version {}",
            HumanCount(report.rows),
            HumanCount(report.episodes),
            report.seconds,
            HumanCount((report.rows as f64 / report.seconds.max(1e-9)) as u64),
            a.dataset.display(),
            report.version
        );
    }
    Ok(())
}

fn episode_values(snap: &Catalog, name: &str) -> Vec<f64> {
    let mut out = Vec::with_capacity(snap.num_episodes() as usize);
    for a in snap.episode_column(name).unwrap_or_default() {
        if let Some(x) = a.as_any().downcast_ref::<arrow::array::Float64Array>() {
            out.extend(x.values().iter().copied());
        } else if let Some(x) = a.as_any().downcast_ref::<arrow::array::UInt64Array>() {
            out.extend(x.values().iter().map(|&v| v as f64));
        }
    }
    out
}

fn count_true(snap: &Catalog, name: &str) -> usize {
    snap.episode_column(name)
        .unwrap_or_default()
        .iter()
        .filter_map(|a| {
            a.as_any()
                .downcast_ref::<arrow::array::BooleanArray>()
                .map(|b| b.true_count())
        })
        .sum()
}

fn info_json(snap: &Catalog, name: &str) -> serde_json::Value {
    let m = snap.manifest();
    json!({
        "path": name,
        "version": snap.version(),
        "format_version": m.format_version,
        "transitions": snap.num_transitions(),
        "episodes": snap.num_episodes(),
        "segments": m.segments.len(),
        "bytes_on_disk": snap.bytes_on_disk(),
        "bytes_per_transition": snap.bytes_on_disk() as f64 / snap.num_transitions().max(1) as f64,
        "terminated_episodes": count_true(snap, ep::TERMINATED),
        "truncated_episodes": count_true(snap, ep::TRUNCATED),
        "episode_length": Summary::of(episode_values(snap, ep::LENGTH)),
        "episode_return": Summary::of(episode_values(snap, ep::EPISODE_RETURN)),
        "schema": m.columns,
        "properties": m.properties,
    })
}

fn render_info(snap: &Catalog, name: &str, bins: usize) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let m = snap.manifest();
    let n = snap.num_transitions();
    writeln!(
        o,
        "dataset      {name} (version {}, format v{})",
        snap.version(),
        m.format_version
    )
    .unwrap();
    writeln!(
        o,
        "transitions  {}   episodes {} ({} terminated, {} truncated)   segments {}",
        HumanCount(n),
        HumanCount(snap.num_episodes()),
        HumanCount(count_true(snap, ep::TERMINATED) as u64),
        HumanCount(count_true(snap, ep::TRUNCATED) as u64),
        m.segments.len()
    )
    .unwrap();
    writeln!(
        o,
        "on disk      {} ({:.1} B/transition)",
        HumanBytes(snap.bytes_on_disk()),
        snap.bytes_on_disk() as f64 / n.max(1) as f64
    )
    .unwrap();
    for (k, v) in &m.properties {
        writeln!(o, "{k:<12} {v}").unwrap();
    }
    writeln!(o, "schema").unwrap();
    for c in &m.columns {
        let shape = c
            .shape
            .as_ref()
            .map(|s| format!("  shape {s:?}"))
            .unwrap_or_default();
        writeln!(
            o,
            "  {:<18} {}{}{}",
            c.name,
            c.data_type,
            if c.nullable { " (nullable)" } else { "" },
            shape
        )
        .unwrap();
    }
    for (label, name) in [
        ("episode length", ep::LENGTH),
        ("episode return", ep::EPISODE_RETURN),
    ] {
        let v = episode_values(snap, name);
        let s = Summary::of(v.iter().copied());
        writeln!(
            o,
            "{label}: min {:.2}  p25 {:.2}  median {:.2}  mean {:.2}  p75 {:.2}  max {:.2}",
            s.min, s.p25, s.median, s.mean, s.p75, s.max
        )
        .unwrap();
        if bins > 0 && !v.is_empty() {
            o.push_str(&render_histogram(&v, bins, 40));
        }
    }
    o
}

fn info(a: InfoArgs) -> Result<()> {
    let start = Instant::now();
    let (snap, name) = open_catalog(&a.v.dataset, a.v.version)?;
    let open_ms = start.elapsed().as_secs_f64() * 1e3;
    if a.v.json {
        let mut v = info_json(&snap, &name);
        if snap.path() != Path::new(&name) {
            v["mirror"] = json!(snap.path());
        }
        v["open_ms"] = json!(open_ms);
        emit(&format!("{}\n", serde_json::to_string_pretty(&v)?));
    } else {
        emit(&format!(
            "{}opened in {open_ms:.1} ms\n",
            render_info(&snap, &name, a.bins)
        ));
    }
    Ok(())
}

fn verify(a: VersionArgs) -> Result<()> {
    let snap = open_snapshot(&a.dataset, a.version)?;
    let pb = if a.json {
        ProgressBar::hidden()
    } else {
        progress(snap.num_transitions(), "verifying")
    };
    let start = Instant::now();
    let report = trajstore::verify::verify(&snap, |n| pb.inc(n))?;
    pb.finish_and_clear();
    let secs = start.elapsed().as_secs_f64();
    if a.json {
        let mut v = serde_json::to_value(&report)?;
        v["ok"] = json!(true);
        v["seconds"] = json!(secs);
        outln!("{v}");
    } else {
        outln!(
            "ok: version {} — {} segments, {} transitions, {} episodes, {} checked in {:.2} s",
            report.version,
            report.segments,
            HumanCount(report.transitions),
            HumanCount(report.episodes),
            HumanBytes(report.bytes),
            secs
        );
    }
    Ok(())
}

fn export(a: ExportArgs) -> Result<()> {
    let snap = open_snapshot(&a.dataset, a.version)?;
    let pb = progress(snap.num_transitions(), "exporting");
    let rows = trajstore::export::export_parquet(&snap, &a.output, |n| pb.inc(n))?;
    pb.finish_and_clear();
    outln!(
        "exported {} transitions to {}",
        HumanCount(rows),
        a.output.display()
    );
    Ok(())
}

/// Parses `123`, `64KiB`, `256MiB`, `1GiB`, `1.5G`, `10MB`.
fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let num: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a size like 256MiB"))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "kib" => 1024.0,
        "m" | "mb" => 1e6,
        "mib" => 1024.0 * 1024.0,
        "g" | "gb" => 1e9,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        other => {
            return Err(format!(
                "unknown size unit `{other}` (use B, KiB, MiB, GiB)"
            ));
        }
    };
    let v = num * mult;
    if v < 1.0 {
        return Err("size must be at least 1 byte".into());
    }
    Ok(v as u64)
}

#[derive(Args)]
struct SliceArgs {
    /// Dataset directory, or a URL (s3://BUCKET/PREFIX; see `trajstore pull --help`).
    dataset: PathBuf,
    /// Steps per slice.
    #[arg(long, default_value_t = 64)]
    slice_len: u32,
    /// Slices per batch.
    #[arg(long, default_value_t = 256)]
    num_slices: usize,
    /// strict (windows inside episodes), pad (may run past the end, masked) or span:LEFT:RIGHT.
    #[arg(long, default_value = "strict")]
    policy: String,
    /// windows (uniform over windows) or episodes (uniform over episodes, TorchRL's semantics).
    #[arg(long, default_value = "windows")]
    weighting: String,
    /// Seed of the sampler.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Columns to gather.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "observation,action,reward"
    )]
    columns: Vec<String>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// Restrict sampling to the episodes this SQL query returns (a query with an `episode_id`
    /// column), e.g. "SELECT episode_id FROM episodes ORDER BY episode_return DESC LIMIT 10".
    #[arg(long, value_name = "SQL")]
    episodes: Option<String>,
}

#[derive(Args)]
struct SampleArgs {
    #[command(flatten)]
    s: SliceArgs,
    /// Which batch number of the seeded stream to show.
    #[arg(long, default_value_t = 0)]
    batch: u64,
}

#[derive(Args)]
struct BenchArgs {
    #[command(flatten)]
    s: SliceArgs,
    /// Timed iterations (after as many warm-up ones).
    #[arg(long, default_value_t = 200)]
    iters: usize,
    /// Loader workers for the loader measurement.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Let loader workers madvise(WILLNEED) the next batch's pages (for data not in the page cache).
    #[arg(long)]
    readahead: bool,
    /// Map every page before timing (MADV_POPULATE_READ), to measure steady state from the start
    /// instead of the first touches' page faults.
    #[arg(long)]
    prefault: bool,
    /// Run the torch loader to this device (cpu, cuda, cuda:N) after the CPU figures: batches/s,
    /// GB/s, and on CUDA the bandwidth of a plain pinned host-to-device copy of the same bytes
    /// as the baseline. Needs a build with `--features torch`.
    #[arg(long, value_name = "DEVICE")]
    device: Option<String>,
    /// With --device: upload the columns to the device once and sample there (GPU-resident mode).
    #[arg(long, requires = "device")]
    resident: bool,
    /// Device memory the resident columns may take.
    #[arg(long, default_value = "8GiB", value_parser = parse_size, requires = "resident")]
    resident_budget: u64,
    /// With --device: cast floating columns on the device (none, bf16, f16).
    #[arg(long, default_value = "none", requires = "device")]
    cast: String,
}

fn slice_sampler(snap: &Snapshot, a: &SliceArgs) -> Result<trajstore::SliceSampler> {
    let policy: trajstore::BoundaryPolicy = a.policy.parse()?;
    let weighting = match a.weighting.as_str() {
        "windows" => trajstore::Weighting::Windows,
        "episodes" => trajstore::Weighting::Episodes,
        other => bail!("--weighting {other}: use windows or episodes"),
    };
    let opts = trajstore::SliceOptions::new(a.slice_len, a.num_slices)
        .with_policy(policy)
        .with_weighting(weighting)
        .with_seed(a.seed);
    let opts = match &a.episodes {
        #[cfg(feature = "sql")]
        Some(q) => {
            use trajstore::sql::SnapshotSql;
            let ids = snap.episodes_where(q).map_err(one_line)?;
            if ids.is_empty() {
                bail!("--episodes: the query returned no episode");
            }
            opts.with_episode_ids(ids)
        }
        #[cfg(not(feature = "sql"))]
        Some(_) => bail!("--episodes needs SQL: rebuild with the `sql` feature (on by default)"),
        None => opts,
    };
    let index = snap.slice_index(a.slice_len, policy)?;
    Ok(trajstore::SliceSampler::new(index, snap.episodes(), &opts)?)
}

fn demo_sample(snap: &Snapshot) -> Result<String> {
    use trajstore::Sampler;
    let args = SliceArgs {
        dataset: snap.path().to_path_buf(),
        slice_len: 64,
        num_slices: 256,
        policy: "strict".into(),
        weighting: "windows".into(),
        seed: 0,
        columns: vec!["observation".into(), "action".into(), "reward".into()],
        json: false,
        episodes: None,
    };
    let sampler = slice_sampler(snap, &args)?;
    let cols: Vec<&str> = args.columns.iter().map(String::as_str).collect();
    let gatherer = trajstore::Gatherer::new(snap, &cols)?;
    let mut plan = vec![];
    let mut batch = trajstore::Batch::default();
    let t = Instant::now();
    let iters = 100;
    for k in 0..iters {
        sampler.plan(k, &mut plan);
        gatherer.gather(&plan, &mut batch);
    }
    let per = t.elapsed().as_secs_f64() / iters as f64;
    Ok(format!(
        "\nsampled {iters} batches of 256 slices x 64 steps ({} per batch): {:.1} us per batch, {}/s transitions\n",
        HumanBytes(batch.data_bytes() as u64),
        per * 1e6,
        HumanCount((256.0 * 64.0 / per) as u64)
    ))
}

fn sample(a: SampleArgs) -> Result<()> {
    use trajstore::Sampler;
    let snap = open_snapshot(&a.s.dataset, None)?;
    let sampler = slice_sampler(&snap, &a.s)?;
    let cols: Vec<&str> = a.s.columns.iter().map(String::as_str).collect();
    let gatherer = trajstore::Gatherer::new(&snap, &cols)?;
    let mut plan = vec![];
    sampler.plan(a.batch, &mut plan);
    let mut batch = trajstore::Batch::default();
    gatherer.gather(&plan, &mut batch);
    let l = batch.slice_len;
    let slices: Vec<_> = (0..batch.num_slices)
        .map(|i| {
            let valid: usize = batch.mask[i * l..(i + 1) * l].iter().map(|&m| m as usize).sum();
            json!({"episode_id": batch.episode_id[i], "start_step": batch.start_step[i], "len": l, "valid": valid})
        })
        .collect();
    if a.s.json {
        let v = json!({
            "version": snap.version(), "slice_len": l, "num_slices": batch.num_slices,
            "valid_steps": batch.valid_steps(), "bytes": batch.data_bytes(),
            "columns": batch.columns.iter().map(|c| {
                let shape: Vec<usize> = [batch.num_slices, l].into_iter().chain(c.shape.iter().copied()).collect();
                json!({"name": c.name, "dtype": c.data_type.to_string(), "shape": shape})
            }).collect::<Vec<_>>(),
            "slices": slices,
        });
        outln!("{v}");
        return Ok(());
    }
    outln!(
        "batch {} of version {}: {} slices x {} steps, {} valid steps, {}",
        a.batch,
        snap.version(),
        batch.num_slices,
        l,
        batch.valid_steps(),
        HumanBytes(batch.data_bytes() as u64)
    );
    for c in &batch.columns {
        let mut shape = vec![batch.num_slices, l];
        shape.extend(&c.shape);
        outln!("  {:<18} {:?} {}", c.name, shape, c.data_type);
    }
    outln!(
        "  {:>5} {:>12} {:>11} {:>6}",
        "slice",
        "episode_id",
        "start_step",
        "valid"
    );
    for (i, s) in slices.iter().enumerate().take(20) {
        outln!(
            "  {:>5} {:>12} {:>11} {:>6}",
            i,
            s["episode_id"],
            s["start_step"],
            s["valid"]
        );
    }
    if slices.len() > 20 {
        outln!("  ... {} more (use --json for all)", slices.len() - 20);
    }
    Ok(())
}

/// (anonymous, file-backed) resident memory of this process in MiB, from /proc/self/status
/// (file-backed pages are the mapped segments: page cache, not memory the process owns).
fn rss_mib() -> (f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map_or(f64::NAN, |kb| kb / 1024.0)
    };
    (field("RssAnon:"), field("RssFile:"))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn bench(a: BenchArgs) -> Result<()> {
    use std::hint::black_box;
    use trajstore::Sampler;
    // A device that cannot work is an error before minutes of measurements, not after.
    #[cfg(feature = "torch")]
    if let Some(d) = &a.device {
        trajstore::torch::parse_device(d).map_err(one_line)?;
    }
    #[cfg(not(feature = "torch"))]
    if a.device.is_some() {
        bail!(NO_TORCH);
    }
    let t0 = Instant::now();
    let snap = open_snapshot(&a.s.dataset, None)?;
    let mut prefault_ms = 0.0;
    if a.prefault {
        let t = Instant::now();
        snap.prefault();
        prefault_ms = t.elapsed().as_secs_f64() * 1e3;
    }
    let sampler = std::sync::Arc::new(slice_sampler(&snap, &a.s)?);
    let cols: Vec<&str> = a.s.columns.iter().map(String::as_str).collect();
    let gatherer = std::sync::Arc::new(trajstore::Gatherer::new(&snap, &cols)?);
    let mut plan = vec![];
    let mut batch = trajstore::Batch::default();
    sampler.plan(0, &mut plan);
    gatherer.gather(&plan, &mut batch);
    let first_batch_ms = t0.elapsed().as_secs_f64() * 1e3;
    let iters = a.iters.max(5);
    let mut index_us = Vec::with_capacity(iters);
    let mut sample_us = Vec::with_capacity(iters);
    let mut memcpy_us = Vec::with_capacity(iters);
    // The memcpy floor: the same number of bytes as one batch's data, copied in one go from the
    // mapped data into a destination allocated once. The source moves through the largest segment
    // every iteration, so that it comes from memory (as the gathered slices do), not from a CPU
    // cache that a repeated copy of the same bytes would hit.
    let bytes = batch.data_bytes();
    let big = snap
        .segments()
        .iter()
        .max_by_key(|s| s.num_rows())
        .expect("a segment");
    let src = big.mapped_bytes();
    let n = bytes.min(src.len());
    let spots = (src.len() / n).max(1);
    let mut dst = vec![0u8; n];
    for k in 0..2 * iters as u64 {
        let t = Instant::now();
        sampler.plan(k, &mut plan);
        let index = t.elapsed().as_secs_f64();
        black_box(&plan);
        let t = Instant::now();
        sampler.plan(k, &mut plan);
        gatherer.gather(&plan, &mut batch);
        black_box(&batch);
        let both = t.elapsed().as_secs_f64();
        let from = ((k as usize * 7919) % spots) * n;
        let t = Instant::now();
        dst.copy_from_slice(&src[from..from + n]);
        black_box(&dst);
        let copy = t.elapsed().as_secs_f64();
        if k >= iters as u64 {
            index_us.push(index * 1e6);
            sample_us.push(both * 1e6);
            memcpy_us.push(copy * 1e6);
        }
    }
    let (index_med, sample_med, memcpy_med) = (
        median(&mut index_us),
        median(&mut sample_us),
        median(&mut memcpy_us),
    );
    let steps = (a.s.num_slices * a.s.slice_len as usize) as f64;
    // The loader: background workers sampling and gathering ahead.
    let loader_batches = iters as u64;
    let t = Instant::now();
    let mut loader = trajstore::Loader::new(
        sampler.clone(),
        gatherer.clone(),
        trajstore::LoaderOptions::default()
            .with_workers(a.workers)
            .with_readahead(a.readahead)
            .with_max_batches(loader_batches),
    )?;
    let mut got = 0u64;
    while let Some(b) = loader.next_batch() {
        got += 1;
        loader.recycle(b);
    }
    let loader_s = t.elapsed().as_secs_f64();
    drop(loader);
    let torch = match &a.device {
        Some(d) => Some(torch_bench(
            &a,
            d,
            sampler.clone(),
            gatherer.clone(),
            bytes,
        )?),
        None => None,
    };
    let (rss_anon, rss_file) = rss_mib();
    let v = json!({
        "rss_anon_mib": rss_anon,
        "rss_file_mib": rss_file,
        "transitions": snap.num_transitions(),
        "episodes": snap.num_episodes(),
        "slice_len": a.s.slice_len,
        "num_slices": a.s.num_slices,
        "batch_bytes": bytes,
        "open_and_first_batch_ms": first_batch_ms,
        "prefault_ms": prefault_ms,
        "index_median_us": index_med,
        "sample_median_us": sample_med,
        "memcpy_floor_us": memcpy_med,
        "memcpy_floor_gb_per_s": bytes as f64 / (memcpy_med * 1e3),
        "sample_over_memcpy": sample_med / memcpy_med,
        "transitions_per_s": steps / (sample_med * 1e-6),
        "loader_workers": a.workers,
        "loader_batches_per_s": got as f64 / loader_s,
        "loader_transitions_per_s": got as f64 * steps / loader_s,
        "torch": torch,
    });
    if a.s.json {
        outln!("{v}");
    } else {
        outln!(
            "{} transitions, {} episodes; batches of {} slices x {} steps ({})",
            HumanCount(snap.num_transitions()),
            HumanCount(snap.num_episodes()),
            a.s.num_slices,
            a.s.slice_len,
            HumanBytes(bytes as u64)
        );
        outln!("open + first batch     {first_batch_ms:>10.2} ms");
        if a.prefault {
            outln!("prefault (excluded)    {prefault_ms:>10.2} ms");
        }
        outln!("index-only sampling    {index_med:>10.1} us (median of {iters})");
        outln!(
            "sample + gather        {sample_med:>10.1} us  = {:.2}x the memcpy floor",
            sample_med / memcpy_med
        );
        outln!("memcpy of same bytes   {memcpy_med:>10.1} us");
        outln!(
            "throughput             {:>10} transitions/s",
            HumanCount((steps / (sample_med * 1e-6)) as u64)
        );
        outln!(
            "loader ({} workers)    {:>10.0} batches/s, {} transitions/s",
            a.workers,
            got as f64 / loader_s,
            HumanCount((got as f64 * steps / loader_s) as u64)
        );
        if let Some(t) = &torch {
            print_torch_bench(t);
        }
        outln!(
            "resident memory        {rss_anon:>10.1} MiB anonymous, {rss_file:.1} MiB of mapped segments (page cache)"
        );
    }
    Ok(())
}

/// The torch loader's figures for `bench --device`.
#[cfg(feature = "torch")]
fn torch_bench(
    a: &BenchArgs,
    device: &str,
    sampler: std::sync::Arc<trajstore::SliceSampler>,
    gatherer: std::sync::Arc<trajstore::Gatherer>,
    batch_bytes: usize,
) -> Result<serde_json::Value> {
    use trajstore::torch::{TorchLoader, TorchLoaderOptions, parse_device};
    let dev = parse_device(device).map_err(one_line)?;
    let cast: trajstore::torch::FloatCast = a.cast.parse().map_err(one_line)?;
    let iters = a.iters.max(5) as u64;
    let mut opts = TorchLoaderOptions::new(dev).with_cast(cast).with_loader(
        trajstore::LoaderOptions::default()
            .with_workers(a.workers)
            .with_readahead(a.readahead)
            .with_max_batches(2 * iters),
    );
    if a.resident {
        opts = opts.with_resident(a.resident_budget);
    }
    let sync = || {
        if let tch::Device::Cuda(n) = dev {
            tch::Cuda::synchronize(n as i64);
        }
    };
    let t = Instant::now();
    let mut loader = TorchLoader::new(sampler, gatherer, opts).map_err(one_line)?;
    let setup_s = t.elapsed().as_secs_f64();
    // Warm-up: the first half of the batches (allocations, staging slots, kernels).
    for _ in 0..iters {
        let b = loader
            .next_batch()
            .expect("bounded stream")
            .map_err(one_line)?;
        loader.recycle(b);
    }
    sync();
    let t = Instant::now();
    let mut n = 0u64;
    while let Some(b) = loader.next_batch() {
        let b = b.map_err(one_line)?;
        loader.recycle(b);
        n += 1;
    }
    sync();
    let secs = t.elapsed().as_secs_f64();
    let steps = (a.s.num_slices * a.s.slice_len as usize) as f64;
    let gbps = n as f64 * batch_bytes as f64 / secs / 1e9;
    let baseline = match dev {
        tch::Device::Cuda(_) if !a.resident => Some(
            trajstore::torch::pinned_copy_bandwidth(batch_bytes, dev, 200).map_err(one_line)? / 1e9,
        ),
        _ => None,
    };
    Ok(json!({
        "device": device,
        "resident": a.resident,
        "cast": a.cast,
        "setup_s": setup_s,
        "batches": n,
        "batches_per_s": n as f64 / secs,
        "transitions_per_s": n as f64 * steps / secs,
        "gb_per_s": gbps,
        "pinned_copy_gb_per_s": baseline,
        "over_pinned_copy": baseline.map(|b| gbps / b),
    }))
}

#[cfg(not(feature = "torch"))]
const NO_TORCH: &str =
    "--device needs the torch loader: rebuild with `--features torch` (see README, GPU loading)";

#[cfg(not(feature = "torch"))]
fn torch_bench(
    _a: &BenchArgs,
    _device: &str,
    _sampler: std::sync::Arc<trajstore::SliceSampler>,
    _gatherer: std::sync::Arc<trajstore::Gatherer>,
    _batch_bytes: usize,
) -> Result<serde_json::Value> {
    bail!(NO_TORCH)
}

fn print_torch_bench(t: &serde_json::Value) {
    let f = |k: &str| t[k].as_f64().unwrap_or(f64::NAN);
    outln!(
        "torch loader ({}{})  {:>10.0} batches/s, {} transitions/s, {:.2} GB/s (setup {:.2} s)",
        t["device"].as_str().unwrap_or("?"),
        if t["resident"].as_bool() == Some(true) {
            ", resident"
        } else {
            ""
        },
        f("batches_per_s"),
        HumanCount(f("transitions_per_s") as u64),
        f("gb_per_s"),
        f("setup_s")
    );
    if t["pinned_copy_gb_per_s"].is_number() {
        outln!(
            "pinned H2D copy        {:>10.2} GB/s; the loader delivers {:.0}% of it",
            f("pinned_copy_gb_per_s"),
            100.0 * f("over_pinned_copy")
        );
    }
}

/// A library error as one line (DataFusion messages may span several).
fn one_line(e: trajstore::Error) -> anyhow::Error {
    anyhow::anyhow!(
        e.to_string()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    )
}

#[cfg(feature = "remote")]
fn remote_options(concurrency: usize) -> Result<trajstore::remote::RemoteOptions> {
    use std::io::IsTerminal;
    if concurrency == 0 {
        bail!("--concurrency must be at least 1");
    }
    let mut o =
        trajstore::remote::RemoteOptions::default().with_progress(std::io::stderr().is_terminal());
    o.concurrency = concurrency;
    Ok(o)
}

/// What a reading command uses for a URL: the default concurrency, a progress bar on a terminal.
#[cfg(feature = "remote")]
fn reader_remote_options() -> trajstore::remote::RemoteOptions {
    use std::io::IsTerminal;
    trajstore::remote::RemoteOptions::default().with_progress(std::io::stderr().is_terminal())
}

#[cfg(feature = "remote")]
fn push(a: PushArgs) -> Result<()> {
    if !trajstore::format::is_url(&a.url) {
        bail!(
            "`{}` is not a URL; push to s3://BUCKET/PREFIX (or file:///PATH)",
            a.url
        );
    }
    let ds = Dataset::open(&a.dataset)
        .with_context(|| format!("cannot open dataset {}", a.dataset.display()))?;
    let remote = trajstore::remote::Remote::open(&a.url, remote_options(a.concurrency)?)?;
    let r = remote
        .push(&ds)
        .with_context(|| format!("push of {} to {} failed", a.dataset.display(), a.url))?;
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&r)?);
    } else if r.up_to_date {
        outln!("{} is up to date (version {})", r.url, r.version);
    } else {
        outln!(
            "pushed version {} to {} in {:.2} s: {} files ({}) uploaded, {} ({}) already there{}",
            r.version,
            r.url,
            r.seconds,
            r.files_uploaded,
            HumanBytes(r.bytes_uploaded),
            r.files_present,
            HumanBytes(r.bytes_present),
            match r.previous_version {
                Some(v) => format!("; the remote was at version {v}"),
                None => String::new(),
            }
        );
    }
    Ok(())
}

#[cfg(feature = "remote")]
fn pull(a: PullArgs) -> Result<()> {
    use trajstore::remote;
    let mirror = match &a.to {
        Some(dir) => dir.clone(),
        None => remote::mirror_dir(&remote::default_cache_dir(), &a.url)?,
    };
    let r = remote::Remote::open(&a.url, remote_options(a.concurrency)?)?
        .pull(&mirror, a.version)
        .with_context(|| format!("pull of {} failed", a.url))?;
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        outln!(
            "version {} of {} is in {} ({:.2} s): {} files ({}) downloaded, {} ({}) already there, {} old files removed",
            r.version,
            r.url,
            r.mirror.display(),
            r.seconds,
            r.files_downloaded,
            HumanBytes(r.bytes_downloaded),
            r.files_cached,
            HumanBytes(r.bytes_cached),
            r.files_pruned
        );
    }
    Ok(())
}
