//! SQL through DataFusion: query results against values computed independently in Rust from the
//! written data, the pushdowns visible in EXPLAIN, the functions, SQL-defined sampling subsets
//! and the `trajstore sql` command.

use std::collections::{BTreeMap, HashSet};
use std::process::Command;

use crate::common::TestData;
use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::compute::{cast, concat_batches};
use arrow::datatypes::{DataType, Float32Type, Float64Type, UInt32Type, UInt64Type};
use trajstore::format::{col, ep};
use trajstore::sql::{QueryResult, SnapshotSql, SqlSession, default_config};
use trajstore::{Dataset, Sampler, SamplerSpec, SliceSampler, Snapshot};

use crate::common::{BIN, run_cli as run};

/// `trajstore sql DATASET --format csv` as an interactive shell fed `input` on stdin.
fn shell(d: &str, input: &[u8]) -> std::process::Output {
    use std::io::Write;
    let mut child = Command::new(BIN)
        .args(["sql", d, "--format", "csv"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    child.wait_with_output().unwrap()
}

/// 20k transitions in episodes of ~40 steps, in many small segments.
fn dataset(dir: &std::path::Path) -> Snapshot {
    let snap = TestData::new()
        .transitions(20_000)
        .obs_dim(3)
        .mean_episode_len(40.0)
        .seed(7)
        .segment_bytes(64 << 10)
        .batch_bytes(16 << 10)
        .snapshot(&dir.join("d.trajstore"));
    assert!(
        snap.segments().len() >= 8,
        "{} segments",
        snap.segments().len()
    );
    snap
}

/// One row of the written data, read straight from the segments (no SQL).
struct Row {
    episode: u64,
    step: u32,
    reward: f32,
    obs: Vec<f32>,
}

fn rows(snap: &Snapshot) -> Vec<Row> {
    let mut out = vec![];
    for seg in snap.segments() {
        for b in seg.batches().unwrap() {
            let ids = b
                .column_by_name(col::EPISODE_ID)
                .unwrap()
                .as_primitive::<UInt64Type>();
            let steps = b
                .column_by_name(col::STEP)
                .unwrap()
                .as_primitive::<UInt32Type>();
            let rew = b
                .column_by_name(col::REWARD)
                .unwrap()
                .as_primitive::<Float32Type>();
            let obs = b
                .column_by_name(col::OBSERVATION)
                .unwrap()
                .as_fixed_size_list();
            for i in 0..b.num_rows() {
                let o = obs.value(i);
                out.push(Row {
                    episode: ids.value(i),
                    step: steps.value(i),
                    reward: rew.value(i),
                    obs: o.as_primitive::<Float32Type>().values().to_vec(),
                });
            }
        }
    }
    out
}

fn one(r: &QueryResult) -> RecordBatch {
    concat_batches(&r.schema, &r.batches).unwrap()
}

fn u64s(b: &RecordBatch, name: &str) -> Vec<u64> {
    let c = cast(b.column_by_name(name).unwrap(), &DataType::UInt64).unwrap();
    c.as_primitive::<UInt64Type>().values().to_vec()
}

fn f64s(b: &RecordBatch, name: &str) -> Vec<f64> {
    f64s_of(b.column_by_name(name).unwrap())
}

fn f64s_of(a: &ArrayRef) -> Vec<f64> {
    let c = cast(a, &DataType::Float64).unwrap();
    c.as_primitive::<Float64Type>().values().to_vec()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * (1.0 + a.abs().max(b.abs()))
}

fn session(snap: &Snapshot) -> SqlSession {
    SqlSession::with_config(snap, default_config().with_target_partitions(1)).unwrap()
}

#[test]
fn group_by_episode_matches_rust_and_episode_tables() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path());
    let s = SqlSession::try_new(&snap).unwrap();
    let r = one(&s
        .query(
            "SELECT episode_id, SUM(reward) AS r, COUNT(*) AS n FROM transitions \
             GROUP BY episode_id ORDER BY episode_id",
        )
        .unwrap());
    let mut want: BTreeMap<u64, (f64, u64)> = BTreeMap::new();
    for row in rows(&snap) {
        let e = want.entry(row.episode).or_default();
        e.0 += row.reward as f64;
        e.1 += 1;
    }
    assert_eq!(
        u64s(&r, "episode_id"),
        want.keys().copied().collect::<Vec<_>>()
    );
    assert_eq!(
        u64s(&r, "n"),
        want.values().map(|v| v.1).collect::<Vec<_>>()
    );
    for (got, w) in f64s(&r, "r").iter().zip(want.values()) {
        assert!(close(*got, w.0), "{got} vs {}", w.0);
    }
    // The episodes table agrees too.
    let e = one(&s
        .query("SELECT episode_id, length, episode_return FROM episodes ORDER BY episode_id")
        .unwrap());
    assert_eq!(u64s(&e, "episode_id"), u64s(&r, "episode_id"));
    assert_eq!(u64s(&e, ep::LENGTH), u64s(&r, "n"));
    for (a, b) in f64s(&e, ep::EPISODE_RETURN).iter().zip(f64s(&r, "r")) {
        assert!(close(*a, b), "{a} vs {b}");
    }
    assert_eq!(e.num_rows() as u64, snap.num_episodes());
}

#[test]
fn filters_and_joins_match_rust() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path());
    let s = SqlSession::try_new(&snap).unwrap();
    let all = rows(&snap);
    for (sql, lo, hi) in [
        ("episode_id BETWEEN 100 AND 180", 100, 180),
        ("episode_id >= 300 AND episode_id < 310", 300, 309),
        ("episode_id IN (5, 6, 7)", 5, 7),
        ("episode_id = 0 OR episode_id = 1", 0, 1),
    ] {
        let r = one(&s
            .query(&format!(
                "SELECT episode_id, step, reward FROM transitions WHERE {sql} ORDER BY episode_id, step"
            ))
            .unwrap());
        let want: Vec<&Row> = all
            .iter()
            .filter(|x| (lo..=hi).contains(&x.episode))
            .collect();
        assert_eq!(r.num_rows(), want.len(), "{sql}");
        assert_eq!(
            u64s(&r, "episode_id"),
            want.iter().map(|x| x.episode).collect::<Vec<_>>()
        );
        assert_eq!(
            u64s(&r, "step"),
            want.iter().map(|x| x.step as u64).collect::<Vec<_>>()
        );
        let rew = f64s(&r, "reward");
        assert!(want.iter().zip(&rew).all(|(x, &g)| x.reward as f64 == g));
    }
    // A step filter.
    let r = one(&s
        .query("SELECT COUNT(*) AS n FROM transitions WHERE step >= 100")
        .unwrap());
    assert_eq!(
        u64s(&r, "n")[0],
        all.iter().filter(|x| x.step >= 100).count() as u64
    );
    // A join of transitions with episodes.
    let r = one(&s
        .query(
            "SELECT t.episode_id, e.length, COUNT(*) AS n, SUM(t.reward) AS r \
             FROM transitions t JOIN episodes e ON t.episode_id = e.episode_id \
             WHERE e.terminated GROUP BY t.episode_id, e.length ORDER BY t.episode_id",
        )
        .unwrap());
    let mut terminated = vec![];
    for seg in snap.segments() {
        let t = seg.episode_table().batch();
        let ids = t
            .column_by_name(ep::EPISODE_ID)
            .unwrap()
            .as_primitive::<UInt64Type>();
        let term = t.column_by_name(ep::TERMINATED).unwrap().as_boolean();
        terminated.extend(
            (0..t.num_rows())
                .filter(|&i| term.value(i))
                .map(|i| ids.value(i)),
        );
    }
    assert!(!terminated.is_empty());
    assert_eq!(u64s(&r, "episode_id"), terminated);
    assert_eq!(u64s(&r, "n"), u64s(&r, "length"));
}

#[test]
fn explain_shows_projection_and_pruning() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path());
    let s = session(&snap);
    let plan = s.explain("SELECT reward FROM transitions", true).unwrap();
    let scan = plan.lines().find(|l| l.contains("DataSourceExec")).unwrap();
    assert!(scan.contains("schema=[reward:"), "{plan}");
    assert!(!scan.contains("observation"), "{plan}");
    let partitions = |sql: &str| -> usize {
        let plan = s.explain(sql, false).unwrap();
        let line = plan
            .lines()
            .find(|l| l.contains("DataSourceExec"))
            .unwrap()
            .to_string();
        let n = line.split("partitions=").nth(1).unwrap();
        n[..n.find(|c: char| !c.is_ascii_digit()).unwrap()]
            .parse()
            .unwrap()
    };
    let n = snap.segments().len();
    assert_eq!(partitions("SELECT reward FROM transitions"), n);
    assert_eq!(
        partitions("SELECT reward FROM transitions WHERE reward > 0"),
        n
    );
    let first = &snap.segments()[0].entry();
    let id = first.first_episode_id + first.episodes / 2;
    assert_eq!(
        partitions(&format!(
            "SELECT reward FROM transitions WHERE episode_id = {id}"
        )),
        1
    );
    assert!(partitions("SELECT reward FROM transitions WHERE episode_id BETWEEN 10 AND 20") <= 2);
    assert_eq!(
        partitions("SELECT reward FROM transitions WHERE episode_id > 1000000"),
        1, // one empty partition
    );
    // A limit is pushed into the scan.
    let plan = s
        .explain("SELECT reward FROM transitions LIMIT 5", false)
        .unwrap();
    assert!(plan.contains("fetch=5"), "{plan}");
    // Exact row counts answer COUNT(*) without scanning.
    let plan = s
        .explain("SELECT COUNT(*) FROM transitions", false)
        .unwrap();
    assert!(!plan.contains("DataSourceExec"), "{plan}");
    let r = one(&s.query("SELECT COUNT(*) AS n FROM transitions").unwrap());
    assert_eq!(u64s(&r, "n")[0], snap.num_transitions());
}

#[test]
fn functions_match_rust() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path());
    let s = SqlSession::try_new(&snap).unwrap();
    let all = rows(&snap);
    // Element access and norm, row by row.
    let r = one(&s
        .query(
            "SELECT fsl_get(observation, 2) AS g, observation[2] AS b, vec_norm(observation) AS n \
             FROM transitions ORDER BY episode_id, step",
        )
        .unwrap());
    let g = f64s(&r, "g");
    assert_eq!(g, f64s(&r, "b"));
    assert_eq!(g.len(), all.len());
    for (x, (g, n)) in all.iter().zip(g.iter().zip(f64s(&r, "n"))) {
        assert_eq!(*g, x.obs[1] as f64);
        let want = x
            .obs
            .iter()
            .map(|&v| (v as f64) * (v as f64))
            .sum::<f64>()
            .sqrt();
        assert!(close(n, want), "{n} vs {want}");
    }
    let r = one(&s
        .query("SELECT fsl_get(observation, 9) AS g FROM transitions LIMIT 3")
        .unwrap());
    assert_eq!(r.column(0).null_count(), 3);
    // Per-dimension aggregates over everything and per episode.
    let r = one(&s
        .query(
            "SELECT dim_mean(observation) AS mean, dim_min(observation) AS lo, \
             dim_max(observation) AS hi, dim_std(observation) AS sd FROM transitions",
        )
        .unwrap());
    let d = 3;
    let n = all.len() as f64;
    let mean: Vec<f64> = (0..d)
        .map(|k| all.iter().map(|x| x.obs[k] as f64).sum::<f64>() / n)
        .collect();
    let lo: Vec<f64> = (0..d)
        .map(|k| {
            all.iter()
                .map(|x| x.obs[k] as f64)
                .fold(f64::INFINITY, f64::min)
        })
        .collect();
    let hi: Vec<f64> = (0..d)
        .map(|k| {
            all.iter()
                .map(|x| x.obs[k] as f64)
                .fold(f64::NEG_INFINITY, f64::max)
        })
        .collect();
    let sd: Vec<f64> = (0..d)
        .map(|k| {
            (all.iter()
                .map(|x| (x.obs[k] as f64 - mean[k]).powi(2))
                .sum::<f64>()
                / (n - 1.0))
                .sqrt()
        })
        .collect();
    let vec_of = |name: &str| {
        f64s_of(
            r.column_by_name(name)
                .unwrap()
                .as_fixed_size_list()
                .values(),
        )
    };
    for (got, want) in [
        (vec_of("mean"), &mean),
        (vec_of("lo"), &lo),
        (vec_of("hi"), &hi),
        (vec_of("sd"), &sd),
    ] {
        assert_eq!(got.len(), d);
        assert!(
            got.iter().zip(want).all(|(a, b)| close(*a, *b)),
            "{got:?} vs {want:?}"
        );
    }
    // Discounted return per episode, in step order in Rust; SQL's is order-independent.
    let r = one(&s
        .query(
            "SELECT episode_id, discounted_return(reward, step, 0.9) AS g, dim_mean(observation) AS m \
             FROM transitions GROUP BY episode_id ORDER BY episode_id",
        )
        .unwrap());
    let mut want: BTreeMap<u64, (f64, Vec<f64>, f64)> = BTreeMap::new();
    for x in &all {
        let e = want.entry(x.episode).or_insert((0.0, vec![0.0; d], 0.0));
        e.0 += 0.9f64.powi(x.step as i32) * x.reward as f64;
        for k in 0..d {
            e.1[k] += x.obs[k] as f64;
        }
        e.2 += 1.0;
    }
    assert_eq!(
        u64s(&r, "episode_id"),
        want.keys().copied().collect::<Vec<_>>()
    );
    let means = f64s_of(r.column_by_name("m").unwrap().as_fixed_size_list().values());
    for (i, (got, w)) in f64s(&r, "g").iter().zip(want.values()).enumerate() {
        assert!(close(*got, w.0), "{got} vs {}", w.0);
        for k in 0..d {
            assert!(close(means[i * d + k], w.1[k] / w.2));
        }
    }
    // Bad arguments are errors, not panics.
    for q in [
        "SELECT vec_norm(reward) FROM transitions",
        "SELECT dim_mean(step) FROM transitions",
    ] {
        let e = s.query(q).unwrap_err();
        assert!(matches!(e, trajstore::Error::Sql(_)), "{q}: {e}");
    }
}

#[test]
fn sql_subsets_restrict_samplers() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path());
    let ids = snap
        .episodes_where("SELECT episode_id FROM episodes ORDER BY episode_return DESC LIMIT 10")
        .unwrap();
    // The same top 10 from the episode tables.
    let mut by_return: Vec<(f64, u64)> = vec![];
    for seg in snap.segments() {
        let t = seg.episode_table().batch();
        let id = t
            .column_by_name(ep::EPISODE_ID)
            .unwrap()
            .as_primitive::<UInt64Type>();
        let ret = t
            .column_by_name(ep::EPISODE_RETURN)
            .unwrap()
            .as_primitive::<Float64Type>();
        by_return.extend((0..t.num_rows()).map(|i| (ret.value(i), id.value(i))));
    }
    by_return.sort_by(|a, b| b.0.total_cmp(&a.0));
    let mut want: Vec<u64> = by_return[..10].iter().map(|x| x.1).collect();
    want.sort_unstable();
    assert_eq!(ids, want);
    // Cached: the same answer again.
    assert_eq!(
        snap.episodes_where(
            "SELECT episode_id FROM episodes ORDER BY episode_return DESC LIMIT 10"
        )
        .unwrap(),
        want
    );
    let opts = SamplerSpec::uniform(5, 64).with_episode_ids(ids.clone());
    let index = snap.slice_index(5, opts.policy).unwrap();
    let sampler = SliceSampler::try_new(index, snap.episodes(), &opts).unwrap();
    let allowed: HashSet<u64> = ids.into_iter().collect();
    let first = snap.episodes().first_id();
    let mut plan = vec![];
    let mut seen = HashSet::new();
    for b in 0..200 {
        sampler.plan(b, &mut plan);
        for s in &plan {
            let id = first + s.episode as u64;
            assert!(allowed.contains(&id), "episode {id} outside the subset");
            seen.insert(id);
        }
    }
    assert_eq!(seen, allowed);
    // A query without an episode_id column is an error.
    let e = snap
        .episodes_where("SELECT length FROM episodes")
        .unwrap_err();
    assert!(e.to_string().contains("episode_id"), "{e}");
    let e = snap.episodes_where("SELEC nonsense").unwrap_err();
    assert!(matches!(e, trajstore::Error::Sql(_)), "{e}");
}

#[test]
fn cli_sql() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path());
    let d = snap.path().to_str().unwrap();
    // Bad SQL: exit code 1 and one line.
    for bad in [
        "SELEC episode_id FROM episodes",
        "SELECT nope FROM transitions",
        "SELECT * FROM missing",
        "SELECT vec_norm(reward) FROM transitions",
    ] {
        let (code, out, err) = run(&["sql", d, bad]);
        assert_eq!(code, 1, "{bad}: {out}{err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{bad}: {err}");
        assert!(err.starts_with("error: "), "{err}");
    }
    // CSV.
    let (code, out, err) = run(&[
        "sql",
        d,
        "SELECT episode_id, length FROM episodes ORDER BY episode_id LIMIT 3",
        "--format",
        "csv",
    ]);
    assert_eq!(code, 0, "{err}");
    let lens = snap.episodes().lengths();
    assert_eq!(
        out,
        format!(
            "episode_id,length\n0,{}\n1,{}\n2,{}\n",
            lens[0], lens[1], lens[2]
        )
    );
    // Nested values in CSV are text.
    let (code, out, _) = run(&[
        "sql",
        d,
        "SELECT observation FROM transitions LIMIT 1",
        "--format",
        "csv",
    ]);
    assert_eq!(code, 0);
    assert!(out.lines().nth(1).unwrap().starts_with("\"["), "{out}");
    // Table, with a row count.
    let (code, out, _) = run(&["sql", d, "SELECT COUNT(*) AS n FROM transitions"]);
    assert_eq!(code, 0);
    assert!(out.contains("| 20000 |"), "{out}");
    // Parquet and Arrow files.
    for (fmt, name) in [
        ("parquet", "out.parquet"),
        ("arrow", "out.arrow"),
        ("json", "out.jsonl"),
    ] {
        let path = dir.path().join(name);
        let (code, _, err) = run(&[
            "sql",
            d,
            "SELECT * FROM episodes",
            "--format",
            fmt,
            "--output",
            path.to_str().unwrap(),
        ]);
        assert_eq!(code, 0, "{err}");
        assert!(std::fs::metadata(&path).unwrap().len() > 0);
    }
    let f = std::fs::File::open(dir.path().join("out.arrow")).unwrap();
    let rows: usize = arrow::ipc::reader::FileReader::try_new(f, None)
        .unwrap()
        .map(|b| b.unwrap().num_rows())
        .sum();
    assert_eq!(rows as u64, snap.num_episodes());
    // EXPLAIN.
    let (code, out, _) = run(&["sql", d, "SELECT reward FROM transitions", "--explain"]);
    assert_eq!(code, 0);
    assert!(out.contains("DataSourceExec"), "{out}");
    // The shell, fed from stdin.
    let out = shell(
        d,
        b".tables\n.schema episodes\nSELECT COUNT(*) AS n\n  FROM episodes;\n.quit\n",
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("transitions") && text.contains("episode_return"),
        "{text}"
    );
    assert!(
        text.contains(&format!("n\n{}\n", snap.num_episodes())),
        "{text}"
    );
    // --episodes on sample.
    let (code, out, err) = run(&[
        "sample",
        d,
        "--slice-len",
        "5",
        "--num-slices",
        "32",
        "--json",
        "--episodes",
        "SELECT episode_id FROM episodes WHERE episode_id < 3",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    for s in v["slices"].as_array().unwrap() {
        assert!(s["episode_id"].as_u64().unwrap() < 3, "{s}");
    }
    let (code, _, err) = run(&["sample", d, "--episodes", "SELECT length FROM episodes"]);
    assert_eq!(code, 1);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
}

/// The interactive prompt on a real terminal (a pty from util-linux `script`): line editing,
/// a statement over two lines, and the history file it keeps. Skipped where `script` is missing.
#[test]
fn sql_prompt_on_a_terminal_keeps_history() {
    use std::io::{Read, Write};
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};
    if Command::new("script").arg("--version").output().is_err() {
        crate::common::skipped("no `script` (util-linux) to give the prompt a terminal");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path());
    let history = dir.path().join("state").join("history");
    let mut child = Command::new("script")
        .args([
            "-qfec",
            &format!("{BIN} sql {}", snap.path().display()),
            "/dev/null",
        ])
        .env("TRAJSTORE_HISTORY", &history)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let seen = Arc::new(Mutex::new(String::new()));
    let mut out = child.stdout.take().unwrap();
    let reader = {
        let seen = seen.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = out.read(&mut buf) {
                if n == 0 {
                    break;
                }
                seen.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        })
    };
    // Waits until the terminal shows `what` (at least `times` times).
    let wait_for = |what: &str, times: usize| {
        let deadline = Instant::now() + Duration::from_secs(60);
        while seen.lock().unwrap().matches(what).count() < times {
            assert!(
                Instant::now() < deadline,
                "no {what:?} in {:?}",
                seen.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let mut stdin = child.stdin.take().unwrap();
    wait_for("trajstore> ", 1);
    stdin.write_all(b"SELECT COUNT(*) AS n\r").unwrap();
    wait_for("...> ", 1);
    stdin.write_all(b"  FROM episodes;\r").unwrap();
    wait_for(&format!("| {} |", snap.num_episodes()), 1);
    wait_for("trajstore> ", 2);
    stdin.write_all(b".quit\r").unwrap();
    assert!(child.wait().unwrap().success());
    drop(stdin);
    reader.join().unwrap();
    let h = std::fs::read_to_string(&history).unwrap();
    assert!(h.contains("SELECT COUNT(*) AS n"), "{h}");
    assert!(h.contains("FROM episodes;"), "{h}");
}

/// `s` with trajstore's `GROUP BY episode_id` rule removed: DataFusion's own hash aggregation.
fn without_episode_rule(s: &SqlSession) {
    use datafusion::execution::SessionStateBuilder;
    let state = s.context().state_ref();
    let mut state = state.write();
    let rules = state
        .physical_optimizers()
        .iter()
        .filter(|r| r.name() != trajstore::sql::EPISODE_GROUP_BY_RULE)
        .cloned()
        .collect();
    *state = SessionStateBuilder::new_from_existing(state.clone())
        .with_physical_optimizer_rules(rules)
        .build();
}

fn pretty(r: &QueryResult) -> String {
    arrow::util::pretty::pretty_format_batches_with_schema(r.schema.clone(), &r.batches)
        .unwrap()
        .to_string()
}

#[test]
fn group_by_episode_runs_equal_datafusion_hash_aggregation() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path());
    let queries = [
        // (query, whether the run-based aggregation must be used)
        (
            "SELECT episode_id, SUM(reward) AS r, COUNT(*) AS n FROM transitions \
             GROUP BY episode_id ORDER BY episode_id",
            true,
        ),
        (
            "SELECT episode_id AS e, MIN(step), MAX(step), AVG(reward), COUNT(reward), SUM(step), \
             MIN(reward) FILTER (WHERE step > 3) FROM transitions WHERE reward > 0.2 \
             GROUP BY episode_id ORDER BY e",
            true,
        ),
        (
            "SELECT episode_id, SUM(reward) FROM transitions WHERE episode_id BETWEEN 50 AND 260 \
             GROUP BY episode_id HAVING COUNT(*) > 30 ORDER BY 1",
            true,
        ),
        (
            "SELECT id, SUM(r2), MAX(s) FROM (SELECT episode_id AS id, reward * 2 AS r2, \
             step AS s FROM transitions) GROUP BY id ORDER BY id",
            true,
        ),
        (
            "SELECT t.episode_id, t.r, e.episode_return FROM (SELECT episode_id, SUM(reward) AS r \
             FROM transitions GROUP BY episode_id) t JOIN episodes e \
             ON t.episode_id = e.episode_id ORDER BY 1",
            true,
        ),
        (
            "SELECT episode_id, n, SUM(n) OVER (ORDER BY episode_id) AS cum FROM \
             (SELECT episode_id, COUNT(*) AS n FROM transitions GROUP BY episode_id) \
             ORDER BY episode_id",
            true,
        ),
        (
            "SELECT n, COUNT(*) AS episodes FROM (SELECT episode_id, COUNT(*) AS n \
             FROM transitions GROUP BY episode_id) GROUP BY n ORDER BY n",
            true,
        ),
        (
            "SELECT episode_id, SUM(reward) FROM transitions GROUP BY episode_id \
             ORDER BY episode_id DESC LIMIT 7",
            true,
        ),
        // Not handled: the rows of an episode come twice, from two inputs.
        (
            "SELECT episode_id, COUNT(*) FROM (SELECT episode_id FROM transitions UNION ALL \
             SELECT episode_id FROM transitions) GROUP BY episode_id ORDER BY 1",
            false,
        ),
        // Not handled: other keys, DISTINCT, no aggregate, ordered aggregates.
        (
            "SELECT step, COUNT(*) FROM transitions GROUP BY step ORDER BY step",
            false,
        ),
        (
            "SELECT episode_id, COUNT(DISTINCT step) FROM transitions GROUP BY episode_id \
             ORDER BY 1",
            false,
        ),
        (
            "SELECT COUNT(*) FROM (SELECT episode_id FROM transitions GROUP BY episode_id)",
            false,
        ),
        (
            "SELECT episode_id, FIRST_VALUE(reward ORDER BY step DESC) FROM transitions \
             GROUP BY episode_id ORDER BY 1",
            false,
        ),
    ];
    for partitions in [1, 2, 3, 64] {
        let config = || default_config().with_target_partitions(partitions);
        let fast = SqlSession::with_config(&snap, config()).unwrap();
        let plain = SqlSession::with_config(&snap, config()).unwrap();
        without_episode_rule(&plain);
        for (q, used) in queries {
            let plan = fast.explain(q, false).unwrap();
            // With more target partitions than segments DataFusion splits the segments'
            // partitions, and the rule must step aside.
            let expect = used && partitions < snap.segments().len();
            assert_eq!(
                plan.contains("EpisodeAggregateExec"),
                expect,
                "{partitions} partitions: {q}\n{plan}"
            );
            assert!(
                !plain
                    .explain(q, false)
                    .unwrap()
                    .contains("EpisodeAggregateExec")
            );
            let (a, b) = (fast.query(q).unwrap(), plain.query(q).unwrap());
            assert_eq!(a.schema, b.schema, "{q}");
            assert!(a.num_rows() > 0, "{q}");
            assert_eq!(pretty(&a), pretty(&b), "{partitions} partitions: {q}");
        }
    }
}

/// A deferred session answers from the catalog until a query scans `transitions`; then it opens
/// the snapshot once, and every answer equals a plain session's.
#[test]
fn deferred_transitions_open_on_the_first_scan_only() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path());
    let ds = Dataset::open(snap.path()).unwrap();
    let opened = Arc::new(AtomicUsize::new(0));
    let open = {
        let (ds, opened) = (ds.clone(), opened.clone());
        move || {
            opened.fetch_add(1, Ordering::SeqCst);
            ds.snapshot()
        }
    };
    let deferred = SqlSession::deferred(&ds.catalog().unwrap(), open).unwrap();
    let plain = session(&snap);
    let same = |q: &str| {
        let (a, b) = (deferred.query(q).unwrap(), plain.query(q).unwrap());
        assert_eq!(pretty(&a), pretty(&b), "{q}");
    };

    same("SELECT count(*) AS n, sum(length) AS l, max(episode_return) AS r FROM episodes");
    same(
        "SELECT episode_id, length FROM episodes WHERE terminated ORDER BY length DESC, episode_id LIMIT 5",
    );
    assert_eq!(deferred.table_names(), plain.table_names());
    assert_eq!(
        deferred.table_schema("transitions").unwrap(),
        plain.table_schema("transitions").unwrap()
    );
    assert_eq!(
        opened.load(Ordering::SeqCst),
        0,
        "episodes alone open nothing"
    );

    same(
        "SELECT episode_id, count(*) AS n, sum(reward) AS r FROM transitions GROUP BY episode_id ORDER BY episode_id",
    );
    same(
        "SELECT t.episode_id, max(t.step) AS s, e.length FROM transitions t JOIN episodes e ON t.episode_id = e.episode_id WHERE t.episode_id BETWEEN 10 AND 20 GROUP BY t.episode_id, e.length ORDER BY t.episode_id",
    );
    assert_eq!(
        opened.load(Ordering::SeqCst),
        1,
        "opened once, on the first scan"
    );
    let plan = deferred
        .explain(
            "SELECT episode_id, sum(reward) FROM transitions GROUP BY episode_id",
            false,
        )
        .unwrap();
    assert!(plan.contains("EpisodeAggregateExec"), "{plan}");
    assert_eq!(opened.load(Ordering::SeqCst), 1);

    // An open that fails is an error of the query, retried by the next one; a snapshot of
    // another version is refused.
    let fails = SqlSession::deferred(&ds.catalog().unwrap(), || {
        Err(trajstore::Error::invalid_argument("no network"))
    })
    .unwrap();
    assert_eq!(
        fails
            .query("SELECT count(*) FROM episodes")
            .unwrap()
            .num_rows(),
        1
    );
    let e = fails
        .query("SELECT count(*) FROM transitions WHERE step = 0")
        .unwrap_err();
    assert!(e.to_string().contains("no network"), "{e}");
    let old = ds.catalog_at(1).unwrap();
    let wrong = SqlSession::deferred(&old, move || ds.snapshot()).unwrap();
    let e = wrong
        .query("SELECT * FROM transitions LIMIT 1")
        .unwrap_err();
    assert!(e.to_string().contains("version"), "{e}");
}

/// Asserts `e` is the read-only refusal of `what`: an invalid argument that names the statement
/// and says how to allow it (`hint`).
fn assert_refused(e: &trajstore::Error, what: &str, hint: &str) {
    assert!(
        matches!(e, trajstore::Error::InvalidArgument { .. }),
        "{what}: {e:?}"
    );
    let text = e.to_string();
    assert!(text.contains(what) && text.contains("refused"), "{text}");
    assert!(text.contains(hint), "{text}");
}

#[test]
fn copy_to_is_refused_and_writes_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path());
    let out = dir.path().join("copied.csv");
    let copy = format!(
        "COPY (SELECT * FROM episodes) TO '{}' STORED AS CSV",
        out.display()
    );
    let s = SqlSession::try_new(&snap).unwrap();
    assert!(!s.writes_allowed());
    assert_refused(&s.query(&copy).unwrap_err(), "COPY", "allow_writes(true)");
    assert_refused(
        &s.explain(&copy, false).unwrap_err(),
        "COPY",
        "--allow-writes",
    );
    let explain = format!("EXPLAIN ANALYZE {copy}");
    assert_refused(&s.query(&explain).unwrap_err(), "COPY", "allow_writes");
    assert_refused(&snap.sql(&copy).unwrap_err(), "COPY", "allow_writes");
    assert_refused(
        &trajstore::sql::query(&snap, &copy).unwrap_err(),
        "COPY",
        "allow_writes",
    );
    // A deferred (remote) session is read-only too.
    let ds = Dataset::open(snap.path()).unwrap();
    let deferred = SqlSession::deferred(&ds.catalog().unwrap(), move || ds.snapshot()).unwrap();
    assert_refused(&deferred.query(&copy).unwrap_err(), "COPY", "allow_writes");
    assert!(!out.exists(), "a refused COPY wrote {}", out.display());
    // Queries still run.
    assert_eq!(
        s.query("SELECT count(*) FROM episodes").unwrap().num_rows(),
        1
    );
    assert!(s.query("SHOW TABLES").unwrap().num_rows() >= 2);
    assert_eq!(
        s.query("DESCRIBE episodes").unwrap().num_rows(),
        s.table_schema("episodes").unwrap().fields().len()
    );
    assert!(s.explain("SELECT reward FROM transitions", false).is_ok());
}

#[test]
fn create_external_table_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path());
    let csv = dir.path().join("secret.csv");
    std::fs::write(&csv, "a,b\n1,hunter2\n").unwrap();
    let create = format!(
        "CREATE EXTERNAL TABLE secret STORED AS CSV LOCATION '{}' OPTIONS ('format.has_header' 'true')",
        csv.display()
    );
    let s = SqlSession::try_new(&snap).unwrap();
    assert_refused(
        &s.query(&create).unwrap_err(),
        "CREATE EXTERNAL TABLE",
        "allow_writes(true)",
    );
    assert_refused(
        &s.explain(&create, false).unwrap_err(),
        "CREATE EXTERNAL TABLE",
        "allow_writes",
    );
    assert!(!s.table_names().contains(&"secret".to_string()));
    assert!(s.query("SELECT * FROM secret").is_err());
    // With writes allowed it reads the file (what the default keeps a subset query from doing).
    let s = s.allow_writes(true);
    s.query(&create).unwrap();
    let r = s.query("SELECT b FROM secret").unwrap();
    assert!(pretty(&r).contains("hunter2"), "{}", pretty(&r));
}

#[test]
fn insert_create_table_as_and_set_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path());
    let s = SqlSession::try_new(&snap).unwrap();
    for (q, what) in [
        (
            "CREATE TABLE best AS SELECT episode_id FROM episodes LIMIT 3",
            "CREATE TABLE",
        ),
        ("CREATE TABLE empty (x INT)", "CREATE TABLE"),
        (
            "CREATE VIEW v AS SELECT episode_id FROM episodes",
            "CREATE VIEW",
        ),
        ("INSERT INTO episodes SELECT * FROM episodes", "INSERT INTO"),
        ("DROP TABLE episodes", "DROP TABLE"),
        ("SET datafusion.execution.batch_size = 1", "SET"),
    ] {
        assert_refused(&s.query(q).unwrap_err(), what, "allow_writes(true)");
    }
    assert_eq!(s.table_names(), ["episodes", "transitions"]);
    // Opted in, CREATE TABLE AS and INSERT run.
    let s = s.allow_writes(true);
    assert!(s.writes_allowed());
    s.query("CREATE TABLE best AS SELECT episode_id FROM episodes LIMIT 3")
        .unwrap();
    s.query("INSERT INTO best SELECT episode_id FROM episodes LIMIT 2")
        .unwrap();
    let n = s.query("SELECT count(*) AS n FROM best").unwrap();
    assert_eq!(u64s(&one(&n), "n"), [5]);
}

#[test]
fn episodes_where_refuses_copy_and_external_tables() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path());
    let out = dir.path().join("ids.csv");
    let copy = format!(
        "COPY (SELECT episode_id FROM episodes) TO '{}' STORED AS CSV",
        out.display()
    );
    assert_refused(
        &snap.episodes_where(&copy).unwrap_err(),
        "COPY",
        "read-only",
    );
    let csv = dir.path().join("ids_in.csv");
    std::fs::write(&csv, "episode_id\n1\n2\n").unwrap();
    let create = format!(
        "CREATE EXTERNAL TABLE ids STORED AS CSV LOCATION '{}'",
        csv.display()
    );
    assert_refused(
        &snap.episodes_where(&create).unwrap_err(),
        "CREATE EXTERNAL TABLE",
        "read-only",
    );
    assert!(
        !out.exists(),
        "a refused subset query wrote {}",
        out.display()
    );
    // The CLI's --episodes goes through it.
    let d = snap.path().to_str().unwrap();
    let (code, _, err) = run(&["sample", d, "--episodes", &copy]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("COPY") && err.contains("refused"), "{err}");
    assert!(!out.exists(), "sample --episodes wrote {}", out.display());
    // A plain subset query still works.
    assert_eq!(
        snap.episodes_where("SELECT episode_id FROM episodes WHERE episode_id < 3")
            .unwrap(),
        [0, 1, 2]
    );
}

#[test]
fn allow_writes_runs_copy_in_the_library() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path());
    let out = dir.path().join("episodes.csv");
    let copy = format!(
        "COPY (SELECT episode_id, length FROM episodes) TO '{}' STORED AS CSV",
        out.display()
    );
    let s = SqlSession::try_new(&snap).unwrap().allow_writes(true);
    s.query(&copy).unwrap();
    let text = std::fs::read_to_string(&out).unwrap();
    assert_eq!(
        text.lines().count() as u64,
        snap.num_episodes() + 1,
        "{text}"
    );
    assert!(text.starts_with("episode_id,length\n"), "{text}");
    // allow_writes(false) closes it again.
    std::fs::remove_file(&out).unwrap();
    let s = s.allow_writes(false);
    assert_refused(&s.query(&copy).unwrap_err(), "COPY", "allow_writes");
    assert!(!out.exists());
}

#[test]
fn cli_sql_is_read_only_unless_allow_writes() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path());
    let d = snap.path().to_str().unwrap();
    let out = dir.path().join("cli.csv");
    let copy = format!(
        "COPY (SELECT episode_id FROM episodes) TO '{}' STORED AS CSV",
        out.display()
    );
    // Refused: exit code 1, one line that says how to allow it, no file.
    for args in [vec!["sql", d, &copy], vec!["sql", d, &copy, "--explain"]] {
        let (code, stdout, err) = run(&args);
        assert_eq!(code, 1, "{args:?}: {stdout}{err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(
            err.starts_with("error: ") && err.contains("COPY") && err.contains("--allow-writes"),
            "{err}"
        );
    }
    // The shell refuses it too.
    let o = shell(
        d,
        format!("{copy};\nSET datafusion.execution.batch_size = 1;\n").as_bytes(),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("COPY") && err.contains("SET"), "{err}");
    assert!(!out.exists(), "a refused COPY wrote {}", out.display());
    // --help says what the flag opens.
    let (code, help, _) = run(&["sql", "--help"]);
    assert_eq!(code, 0);
    assert!(
        help.contains("--allow-writes") && help.contains("COPY") && help.contains("read-only"),
        "{help}"
    );
    // Opted in, the COPY writes the file.
    let (code, stdout, err) = run(&["sql", d, &copy, "--allow-writes"]);
    assert_eq!(code, 0, "{stdout}{err}");
    let text = std::fs::read_to_string(&out).unwrap();
    assert_eq!(text.lines().count() as u64, snap.num_episodes() + 1);
}
