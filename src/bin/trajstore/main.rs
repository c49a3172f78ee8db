//! The `trajstore` command-line tool: a thin layer over the library.

use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[macro_use]
mod output;
mod cmd;
mod open;

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
    Demo(cmd::demo::DemoArgs),
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
    ///   trajstore ingest ~/lerobot/aloha aloha.trajstore           # LeRobot v3 with cameras (feature video)
    ///   trajstore ingest steps.feather out.trajstore               # pyarrow / Polars Arrow IPC file
    ///   trajstore ingest episodes.parquet out.trajstore --episode-col ep --action-cols ax,ay
    #[command(verbatim_doc_comment)]
    Ingest(Box<cmd::ingest::IngestArgs>),
    /// Show transitions, episodes, sizes, schema and episode length/return summaries.
    Info(cmd::info::InfoArgs),
    /// Check every checksum and that boundary columns agree with the episode tables.
    Verify(cmd::VersionArgs),
    /// Remove versions older than the newest N (once replaced for --older-than) and the files
    /// only they use. Readers that opened a removed version keep reading it.
    ///
    /// Examples:
    ///   trajstore vacuum buffer.trajstore                     # keep the newest version; older ones after 10 minutes
    ///   trajstore vacuum buffer.trajstore --keep-versions 5 --older-than 7d
    #[command(verbatim_doc_comment)]
    Vacuum(cmd::vacuum::VacuumArgs),
    /// Write every transition (boundary columns included) to a Parquet file.
    Export(cmd::export::ExportArgs),
    /// Sample one batch of slices and show it (which episodes, which steps).
    Sample(cmd::sample::SampleArgs),
    /// Time index-only sampling, sample+gather and the loader against a memcpy of the same bytes;
    /// with --device (a `torch` build), the torch loader to CPU or CUDA tensors, against a plain
    /// pinned host-to-device copy.
    ///
    /// Examples:
    ///   trajstore bench demo.trajstore --slice-len 64 --num-slices 256
    ///   trajstore bench demo.trajstore --device cuda            # pinned, prefetched streaming
    ///   trajstore bench demo.trajstore --device cuda --resident --cast bf16
    #[command(verbatim_doc_comment)]
    Bench(cmd::bench::BenchArgs),
    /// Query the dataset with SQL (tables `transitions` and `episodes`); without a query, an
    /// interactive prompt.
    #[cfg(feature = "sql")]
    Sql(cmd::sql::SqlArgs),
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
    Push(cmd::push::PushArgs),
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
    Pull(cmd::pull::PullArgs),
    /// Load batches from a dataset in object storage without pulling it: transition files are
    /// fetched on first use into a cache of at most --cache-limit bytes, the segments needed
    /// next are downloaded while the current ones are sampled, and with --rank/--world-size
    /// (or torchrun's RANK/WORLD_SIZE) each rank streams a disjoint share of the segments, so
    /// that N ranks download the dataset once per round in total. Prints the loader's speed,
    /// the bytes downloaded and the cache's peak.
    ///
    /// Examples:
    ///   trajstore stream s3://my-bucket/d4rl/hopper --cache-limit 2GiB --batches 1000
    ///   trajstore stream s3://my-bucket/d4rl/hopper --cache-limit 2GiB --sampling epoch --rank 1 --world-size 4 --json
    #[cfg(feature = "remote")]
    #[command(verbatim_doc_comment)]
    Stream(cmd::stream::StreamArgs),
    /// Run a process of a Ballista cluster (a scheduler, or an executor) that runs trajstore's
    /// SQL; then `trajstore sql URL QUERY --cluster df://HOST:PORT` runs queries on it.
    ///
    /// Examples:
    ///   trajstore cluster scheduler --bind 0.0.0.0:50050
    ///   trajstore cluster executor --scheduler 10.0.0.1:50050 --bind 10.0.0.2:50051 --grpc-port 50052
    #[cfg(feature = "ballista")]
    #[command(verbatim_doc_comment)]
    Cluster(cmd::cluster::ClusterArgs),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        // clap's own exit codes: 0 for --help/--version, 2 for a usage error.
        Err(e) => e.exit(),
    };
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", output::report(&e));
            ExitCode::from(1)
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Demo(a) => cmd::demo::run(a),
        Command::Ingest(a) => cmd::ingest::run(*a),
        Command::Info(a) => cmd::info::run(a),
        Command::Verify(a) => cmd::verify::run(a),
        Command::Vacuum(a) => cmd::vacuum::run(a),
        Command::Export(a) => cmd::export::run(a),
        Command::Sample(a) => cmd::sample::run(a),
        Command::Bench(a) => cmd::bench::run(a),
        #[cfg(feature = "sql")]
        Command::Sql(a) => cmd::sql::run(a),
        #[cfg(feature = "remote")]
        Command::Push(a) => cmd::push::run(a),
        #[cfg(feature = "remote")]
        Command::Pull(a) => cmd::pull::run(a),
        #[cfg(feature = "remote")]
        Command::Stream(a) => cmd::stream::run(a),
        #[cfg(feature = "ballista")]
        Command::Cluster(a) => cmd::cluster::run(a),
    }
}
