//! SQL on a Ballista cluster (feature `ballista`): a moto S3 server holds a pushed dataset; a
//! scheduler and two executors run as `trajstore cluster` processes on loopback; queries on the
//! cluster must give what the local `SqlSession` gives on the same dataset. Runs where moto is
//! importable (see `tests/remote.rs`).
#![cfg(feature = "ballista")]

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use arrow::array::AsArray;
use arrow::datatypes::Int64Type;
use arrow::util::pretty::pretty_format_batches;
use common::TestData;
use common::s3::S3Server;
use trajstore::remote::{Remote, RemoteOptions};
use trajstore::sql::{QueryResult, SqlSession};

/// A child process killed on drop.
struct Proc(Child, &'static str);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn wait_for_port(p: &mut Proc, port: u16) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(status)) = p.0.try_wait() {
            panic!("{} exited before listening: {status}", p.1);
        }
        assert!(
            Instant::now() < deadline,
            "{} did not listen on {port}",
            p.1
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn spawn(what: &'static str, args: &[String], env: &[(&str, String)], cache: &Path) -> Proc {
    let mut c = Command::new(env!("CARGO_BIN_EXE_trajstore"));
    c.args(args)
        .env("TRAJSTORE_CACHE", cache)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    for (k, v) in env {
        c.env(k, v);
    }
    Proc(c.spawn().expect(what), what)
}

/// A TCP proxy in front of the S3 server that counts the bytes the server sends back: what the
/// processes behind it downloaded, counted at the store's side of the wire.
struct CountingProxy {
    port: u16,
    down: Arc<AtomicU64>,
}

impl CountingProxy {
    fn start(upstream: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let down = Arc::new(AtomicU64::new(0));
        let counted = down.clone();
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                std::thread::spawn(move || pipe(client, server, None));
                let counted = counted.clone();
                std::thread::spawn(move || pipe(s2, c2, Some(&counted)));
            }
        });
        Self { port, down }
    }

    fn bytes(&self) -> u64 {
        self.down.load(Ordering::SeqCst)
    }
}

/// Copies `from` to `to` until either closes, adding what it copied to `count`.
fn pipe(mut from: TcpStream, mut to: TcpStream, count: Option<&AtomicU64>) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
        if let Some(c) = count {
            c.fetch_add(n as u64, Ordering::SeqCst);
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Write);
}

/// Files under `dir` whose name ends with `suffix`, recursively.
fn files_ending(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    let mut out = vec![];
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_ending(&p, suffix));
        } else if p.to_string_lossy().ends_with(suffix) {
            out.push(p);
        }
    }
    out
}

fn text(r: &QueryResult) -> String {
    pretty_format_batches(&r.batches).unwrap().to_string()
}

/// The queries the issue names: per-episode GROUP BY, a filter, a join with `episodes`,
/// trajstore's functions (scalar and aggregate), and `episodes` alone.
const QUERIES: &[&str] = &[
    "SELECT episode_id, COUNT(*) AS n, ROUND(SUM(reward), 5) AS r FROM transitions \
     GROUP BY episode_id ORDER BY episode_id",
    "SELECT episode_id, step, reward FROM transitions \
     WHERE episode_id BETWEEN 10 AND 20 AND step < 5 ORDER BY episode_id, step",
    "SELECT e.episode_id, e.length, COUNT(*) AS n, ROUND(e.episode_return, 4) AS g \
     FROM transitions t JOIN episodes e ON t.episode_id = e.episode_id \
     WHERE e.length > 50 GROUP BY e.episode_id, e.length, e.episode_return ORDER BY e.episode_id",
    "SELECT episode_id, ROUND(discounted_return(reward, step, 0.99), 4) AS g, \
     ROUND(MAX(vec_norm(observation)), 4) AS m, ROUND(SUM(fsl_get(observation, 2)), 3) AS o2 \
     FROM transitions GROUP BY episode_id ORDER BY episode_id",
    "SELECT ROUND(fsl_get(dim_mean(observation), 1), 4) AS m1, COUNT(*) AS n FROM transitions",
    "SELECT COUNT(*) AS episodes, SUM(length) AS transitions FROM episodes",
];

#[test]
fn queries_on_a_ballista_cluster_match_the_local_session() {
    let Some(s3) = S3Server::start() else { return };
    s3.bucket("cluster");
    // The server's settings as the environment variables every process reads.
    let upper: Vec<(String, String)> = s3
        .settings()
        .into_iter()
        .map(|(k, v)| (k.to_ascii_uppercase(), v))
        .collect();
    let env: Vec<(&str, String)> = upper.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    // The client (this process) reads the catalog with the same settings as the processes.
    let dir = tempfile::tempdir().unwrap();
    let client_env = env.iter().cloned().chain([(
        "TRAJSTORE_CACHE",
        dir.path().join("client-cache").display().to_string(),
    )]);
    for (k, v) in client_env {
        // SAFETY: this test binary has one test, which sets these before it starts any thread.
        unsafe { std::env::set_var(k, v) };
    }

    let ds = TestData::new()
        .transitions(8_000)
        .mean_episode_len(60.0)
        .obs_dim(64)
        .segment_bytes(512 << 10)
        .commit_every(50)
        .write(&dir.path().join("local"));
    let snap = ds.snapshot().unwrap();
    assert!(snap.segments().len() >= 3, "several segments");
    let url = "s3://cluster/runs/a".to_string();
    Remote::open(&url, RemoteOptions::default())
        .unwrap()
        .push(&ds)
        .unwrap();

    // Unreachable cluster: a clear error before anything is read.
    let nobody = format!("df://127.0.0.1:{}", free_port());
    let e = SqlSession::cluster(&nobody, &url, None).unwrap_err();
    assert!(
        matches!(e, trajstore::Error::Remote { .. }) && e.to_string().contains("scheduler"),
        "{e}"
    );

    let sched_port = free_port();
    let mut scheduler = spawn(
        "scheduler",
        &[
            "cluster".into(),
            "scheduler".into(),
            "--bind".into(),
            format!("127.0.0.1:{sched_port}"),
        ],
        &env,
        &dir.path().join("scheduler-cache"),
    );
    wait_for_port(&mut scheduler, sched_port);
    // The executors reach the store through a proxy that counts what they download.
    let proxy = CountingProxy::start(s3.port);
    let executor_env: Vec<(&str, String)> = env
        .iter()
        .map(|(k, v)| match *k {
            "AWS_ENDPOINT" => (*k, format!("http://127.0.0.1:{}", proxy.port)),
            _ => (*k, v.clone()),
        })
        .collect();
    assert_ne!(executor_env, env, "the executors' endpoint is the proxy");
    let mut executors = vec![];
    for i in 0..2 {
        let (flight, grpc) = (free_port(), free_port());
        let mut e = spawn(
            "executor",
            &[
                "cluster".into(),
                "executor".into(),
                "--scheduler".into(),
                format!("127.0.0.1:{sched_port}"),
                "--bind".into(),
                format!("127.0.0.1:{flight}"),
                "--grpc-port".into(),
                grpc.to_string(),
                "--concurrency".into(),
                "2".into(),
            ],
            &executor_env,
            &dir.path().join(format!("executor{i}-cache")),
        );
        wait_for_port(&mut e, flight);
        executors.push(e);
    }

    let local = SqlSession::try_new(&snap).unwrap();
    let cluster = SqlSession::cluster(&format!("df://127.0.0.1:{sched_port}"), &url, None).unwrap();
    // A query of one column downloads that column's buffers (and each segment's footer and
    // message headers), not the version: far fewer bytes than a mirror, counted at the store.
    let version_bytes: u64 = snap.segments().iter().map(|s| s.entry().bytes).sum();
    let q = "SELECT ROUND(SUM(reward), 3) AS r, COUNT(*) AS n FROM transitions";
    assert_eq!(
        text(&cluster.query(q).unwrap()),
        text(&local.query(q).unwrap())
    );
    let downloaded = proxy.bytes();
    eprintln!("one column: {downloaded} bytes downloaded of a {version_bytes}-byte version");
    assert!(
        downloaded > 0 && downloaded * 4 < version_bytes,
        "the executors downloaded {downloaded} bytes for one column of a {version_bytes}-byte version"
    );
    for q in QUERIES {
        let want = local.query(q).unwrap();
        let got = cluster
            .query(q)
            .unwrap_or_else(|e| panic!("on the cluster: {q}: {e}"));
        assert!(want.num_rows() > 0, "{q}");
        assert_eq!(text(&got), text(&want), "{q}");
    }
    // The command line: `trajstore sql URL Q --cluster df://HOST:PORT`.
    let out = Command::new(env!("CARGO_BIN_EXE_trajstore"))
        .args([
            "sql",
            &url,
            "SELECT COUNT(*) AS n FROM transitions WHERE episode_id < 5",
        ])
        .args([
            "--format",
            "csv",
            "--cluster",
            &format!("df://127.0.0.1:{sched_port}"),
        ])
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .env("TRAJSTORE_CACHE", dir.path().join("client-cache"))
        .output()
        .unwrap();
    let want = local
        .query("SELECT COUNT(*) AS n FROM transitions WHERE episode_id < 5")
        .unwrap();
    let n = want.batches[0]
        .column(0)
        .as_primitive::<Int64Type>()
        .value(0);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("n\n{n}")
    );
    let out = Command::new(env!("CARGO_BIN_EXE_trajstore"))
        .args(["sql", &url, "SELECT 1", "--cluster", &nobody])
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot reach the Ballista scheduler"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Still read-only on a cluster.
    assert!(cluster.query("CREATE VIEW v AS SELECT 1").is_err());

    // The client fetched only the catalog; the executors read the transitions with ranged
    // GETs, and mirrored none of them.
    let seg = trajstore::format::SEGMENT_SUFFIX;
    let eps = trajstore::format::EPISODES_SUFFIX;
    let transitions = |d: &Path| {
        files_ending(d, seg)
            .into_iter()
            .filter(|p| !p.to_string_lossy().ends_with(eps))
            .count()
    };
    assert_eq!(transitions(&dir.path().join("client-cache")), 0);
    let mirrored: usize = (0..2)
        .map(|i| transitions(&dir.path().join(format!("executor{i}-cache"))))
        .sum();
    assert_eq!(mirrored, 0, "the executors mirrored no transition file");
    assert!(
        proxy.bytes() > downloaded,
        "the executors read the transitions"
    );
    drop(executors);
}
