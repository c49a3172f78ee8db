//! `trajstore cluster` (feature `ballista`): the processes of a Ballista cluster that runs
//! trajstore's SQL (`trajstore sql URL Q --cluster df://HOST:PORT`).

use std::net::SocketAddr;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use trajstore::sql::ballista::{ExecutorOptions, run_executor, run_scheduler};

#[derive(Args)]
pub(crate) struct ClusterArgs {
    #[command(subcommand)]
    role: Role,
}

#[derive(Subcommand)]
enum Role {
    /// Run a scheduler: clients connect to it (`--cluster df://HOST:PORT`), executors register
    /// with it.
    Scheduler {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:50050")]
        bind: SocketAddr,
    },
    /// Run an executor that takes tasks from a scheduler. It reads datasets by URL, with the S3
    /// settings of its environment, into its own cache ($TRAJSTORE_CACHE).
    Executor {
        /// The scheduler's address.
        #[arg(long, default_value = "127.0.0.1:50050")]
        scheduler: SocketAddr,
        /// Address to serve results and shuffle data on (Arrow Flight); the host is also what
        /// other processes connect to.
        #[arg(long, default_value = "127.0.0.1:50051")]
        bind: SocketAddr,
        /// Port of the executor's gRPC service (on the --bind host).
        #[arg(long, default_value_t = 50052)]
        grpc_port: u16,
        /// Tasks run at once (default: the number of cores).
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
        concurrency: Option<u32>,
    },
}

pub(crate) fn run(a: ClusterArgs) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    match a.role {
        Role::Scheduler { bind } => {
            eprintln!("trajstore cluster scheduler listening on {bind}");
            rt.block_on(run_scheduler(bind))?;
        }
        Role::Executor {
            scheduler,
            bind,
            grpc_port,
            concurrency,
        } => {
            eprintln!("trajstore cluster executor on {bind} (scheduler {scheduler})");
            rt.block_on(run_executor(ExecutorOptions {
                scheduler,
                bind,
                grpc_port,
                concurrency: concurrency.map(|n| n as usize),
            }))?;
        }
    }
    Ok(())
}
