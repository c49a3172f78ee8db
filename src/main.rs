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
use trajstore::{Dataset, Snapshot, WriterOptions};

/// `println!` through [`emit`].
macro_rules! outln {
    ($($t:tt)*) => { emit(&format!("{}\n", format_args!($($t)*))) };
}

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
trajstore export hopper.trajstore hopper-out.parquet"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Write a seeded synthetic D4RL-shaped dataset (the quickest way to see the whole path).
    Demo(DemoArgs),
    /// Ingest an offline-RL dataset file (Parquet) into a dataset, creating it if needed.
    Ingest(Box<IngestArgs>),
    /// Show transitions, episodes, sizes, schema and episode length/return summaries.
    Info(InfoArgs),
    /// Check every checksum and that boundary columns agree with the episode tables.
    Verify(VersionArgs),
    /// Write every transition (boundary columns included) to a Parquet file.
    Export(ExportArgs),
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

#[derive(Args)]
struct IngestArgs {
    /// Input file (.parquet).
    input: PathBuf,
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
    /// Store this column as next_observation (default: derived from the next row).
    #[arg(long, value_name = "NAME")]
    next_observation_col: Option<String>,
    /// Columns to leave out (other columns are kept as user columns).
    #[arg(long, value_delimiter = ',', value_name = "A,B,..")]
    drop_cols: Vec<String>,
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
    /// Dataset directory.
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
    /// Dataset directory.
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
    let ds =
        Dataset::open(path).with_context(|| format!("cannot open dataset {}", path.display()))?;
    Ok(match version {
        Some(v) => ds.snapshot_at(v)?,
        None => ds.snapshot()?,
    })
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
        let mut v = info_json(&snap);
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
        emit(&render_info(&snap, 12));
        outln!(
            "\nnext: trajstore info {0} --json | trajstore verify {0} | trajstore export {0} out.parquet",
            a.dataset.display()
        );
    }
    Ok(())
}

fn ingest(a: IngestArgs) -> Result<()> {
    let ext = a
        .input
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase();
    if !matches!(ext.as_str(), "parquet" | "pq") {
        bail!(
            "{}: only Parquet input (.parquet) is supported so far",
            a.input.display()
        );
    }
    let mut o = trajstore::ingest::ParquetIngestOptions::default();
    o.episode_col = a.episode_col;
    o.terminated_col = a.terminated_col;
    o.truncated_col = a.truncated_col;
    o.observation_col = a.observation_col;
    o.observation_cols = a.observation_cols;
    o.action_col = a.action_col;
    o.action_cols = a.action_cols;
    o.reward_col = a.reward_col;
    o.next_observation_col = a.next_observation_col;
    o.drop_cols = a.drop_cols;
    o.progress = !a.json;
    let report = trajstore::ingest::ingest_parquet(&a.input, &a.dataset, &o, a.write.options())?;
    if a.json {
        outln!(
            "{}",
            json!({"rows": report.rows, "episodes": report.episodes, "version": report.version,
                   "seconds": report.seconds, "rows_per_s": report.rows as f64 / report.seconds})
        );
    } else {
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

fn episode_values(snap: &Snapshot, name: &str) -> Vec<f64> {
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

fn count_true(snap: &Snapshot, name: &str) -> usize {
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

fn info_json(snap: &Snapshot) -> serde_json::Value {
    let m = snap.manifest();
    json!({
        "path": snap.path(),
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

fn render_info(snap: &Snapshot, bins: usize) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let m = snap.manifest();
    let n = snap.num_transitions();
    writeln!(
        o,
        "dataset      {} (version {}, format v{})",
        snap.path().display(),
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
    let snap = open_snapshot(&a.v.dataset, a.v.version)?;
    let open_ms = start.elapsed().as_secs_f64() * 1e3;
    if a.v.json {
        let mut v = info_json(&snap);
        v["open_ms"] = json!(open_ms);
        emit(&format!("{}\n", serde_json::to_string_pretty(&v)?));
    } else {
        emit(&format!(
            "{}opened in {open_ms:.1} ms\n",
            render_info(&snap, a.bins)
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
