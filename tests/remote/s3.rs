//! Datasets in object storage, against a real S3-compatible server: moto's server
//! (`python -m moto.server`, installed by `scripts/setup-python.sh`), spoken to over HTTP by
//! object_store's S3 client exactly as AWS would be. The tests run where that Python
//! (`TRAJSTORE_PYTHON`, else `python3`) can import moto; under `CI=true` a missing moto is a
//! failure. The `file://` test needs no server.

#![cfg(feature = "remote")]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::TestData;
use crate::common::s3::S3Server;
use object_store::ObjectStore;
use object_store::path::Path as ObjectPath;
use trajstore::remote::{Remote, RemoteOptions};
use trajstore::{ConflictKind, Dataset, Error};

/// The data of these tests: 6000 transitions in episodes of ~60 steps, in 64 KiB segments (the
/// seed and observation dimension are set by each test).
fn data() -> TestData {
    TestData::new()
        .transitions(6_000)
        .mean_episode_len(60.0)
        .segment_bytes(64 << 10)
}

/// A dataset of `data` at `root`, written in several commits.
fn make(root: &Path, data: TestData) -> Dataset {
    data.commit_every(40).write(root)
}

/// Same version, counts, transitions and episode tables, and the mirror verifies.
fn assert_same_data(a: &Dataset, b: &Dataset) {
    let (sa, sb) = (a.snapshot().unwrap(), b.snapshot().unwrap());
    assert_eq!(sa.version(), sb.version());
    assert_eq!(sa.num_transitions(), sb.num_transitions());
    assert_eq!(sa.num_episodes(), sb.num_episodes());
    assert_eq!(sa.segments().len(), sb.segments().len());
    for (x, y) in sa.segments().iter().zip(sb.segments()) {
        assert_eq!(
            x.batches().unwrap(),
            y.batches().unwrap(),
            "segment {}",
            x.entry().id
        );
        assert_eq!(x.episode_table(), y.episode_table());
    }
    let report = trajstore::store::verify::verify(&sb, |_| {}).unwrap();
    assert_eq!(report.transitions, sb.num_transitions());
}

fn files_in(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    v.sort();
    v
}

#[test]
fn push_and_pull_round_trip_and_move_only_what_changed() {
    let Some(s3) = S3Server::start() else { return };
    let url = format!("{}/d4rl/hopper", s3.bucket("round-trip"));
    let dir = tempfile::tempdir().unwrap();
    let ds = make(&dir.path().join("local"), data().seed(1).obs_dim(5));
    let segs = ds.snapshot().unwrap().segments().len() as u64;
    assert!(segs >= 3, "several segments ({segs})");
    let remote = s3.remote(&url);
    assert_eq!(remote.latest().unwrap(), None, "empty prefix: no dataset");

    let p = remote.push(&ds).unwrap();
    assert_eq!(
        (
            p.files_uploaded,
            p.files_present,
            p.previous_version,
            p.up_to_date
        ),
        (2 * segs, 0, None, false)
    );
    let total_bytes: u64 = ds.snapshot().unwrap().bytes_on_disk();
    assert_eq!(p.bytes_uploaded, total_bytes);
    assert_eq!(remote.versions().unwrap(), vec![p.version]);
    // Content-addressed names in the store.
    let keys = s3.keys("round-trip", "d4rl/hopper/segments");
    assert_eq!(keys.len() as u64, 2 * segs);
    assert!(keys.iter().all(|k| k.contains('-')), "{keys:?}");

    let mirror = dir.path().join("mirror");
    let r = remote.pull(&mirror, None).unwrap();
    assert_eq!(
        (r.version, r.files_downloaded, r.files_cached),
        (p.version, 2 * segs, 0)
    );
    assert_eq!(r.bytes_downloaded, total_bytes);
    assert_same_data(&ds, &Dataset::open(&mirror).unwrap());

    // Nothing new: nothing moves.
    assert!(remote.push(&ds).unwrap().up_to_date);
    let again = remote.pull(&mirror, None).unwrap();
    assert_eq!((again.files_downloaded, again.files_cached), (0, 2 * segs));

    // Append: only the new segments travel, both ways; the old manifest leaves the mirror.
    let v2 = data().seed(2).obs_dim(5).append_to(&ds);
    let segs2 = ds.snapshot().unwrap().segments().len() as u64;
    let p2 = remote.push(&ds).unwrap();
    assert_eq!(
        (
            p2.version,
            p2.previous_version,
            p2.files_present,
            p2.files_uploaded
        ),
        (v2, Some(p.version), 2 * segs, 2 * (segs2 - segs))
    );
    let r2 = remote.pull(&mirror, None).unwrap();
    assert_eq!(
        (r2.files_downloaded, r2.files_cached),
        (2 * (segs2 - segs), 2 * segs)
    );
    assert_eq!(r2.files_pruned, 1, "the older manifest");
    assert_same_data(&ds, &Dataset::open(&mirror).unwrap());
    assert_eq!(
        Dataset::open(&mirror).unwrap().versions().unwrap(),
        vec![v2]
    );

    // An older version can still be pulled (into another directory) and matches the local one.
    let old = dir.path().join("old");
    remote.pull(&old, Some(p.version)).unwrap();
    let old_snap = Dataset::open(&old).unwrap().snapshot().unwrap();
    let local_old = ds.snapshot_at(p.version).unwrap();
    assert_eq!(old_snap.num_transitions(), local_old.num_transitions());
    assert_eq!(old_snap.segments().len() as u64, segs);

    // A pull never writes into a directory that is not a mirror of the same URL: not into a
    // dataset of its own (whose history it would prune), not into another URL's mirror.
    let (files_before, versions_before) = (files_in(&ds.path().join("segments")), ds.versions());
    let e = remote.pull(ds.path(), None).unwrap_err();
    assert!(e.to_string().contains("is not a mirror of"), "{e}");
    assert_eq!(files_in(&ds.path().join("segments")), files_before);
    assert_eq!(ds.versions().unwrap(), versions_before.unwrap());
    let other = s3.remote(&format!("{}/other", s3.bucket("round-trip-2")));
    let e = other.pull(&mirror, None).unwrap_err();
    assert!(
        e.to_string()
            .contains("is the mirror of s3://round-trip/d4rl/hopper"),
        "{e}"
    );

    // The library's one-call open, through a cache directory.
    let cache = dir.path().join("cache");
    let (opened, rep) = trajstore::remote::open(&url, Some(&cache), None, s3.options()).unwrap();
    assert_eq!(opened.path(), cache.join("s3/round-trip/d4rl/hopper"));
    assert_eq!(rep.files_downloaded, 2 * segs2);
    assert_same_data(&ds, &opened);

    // Looking without downloading the transitions: a catalog fetches the episode tables only,
    // commits nothing in the mirror, and a later pull of that version reuses what it fetched.
    let look = dir.path().join("look");
    let (cat, c) = remote.catalog(&look, None).unwrap();
    let snap = ds.snapshot().unwrap();
    assert_eq!(
        (c.version, c.files_downloaded, c.files_cached),
        (v2, segs2, 0)
    );
    let episode_bytes: u64 = snap
        .manifest()
        .segments
        .iter()
        .map(|s| s.episodes_bytes)
        .sum();
    assert_eq!(c.bytes_downloaded, episode_bytes);
    assert_eq!(cat.episode_tables(), ds.catalog().unwrap().episode_tables());
    assert_eq!(
        (cat.num_transitions(), cat.bytes_on_disk()),
        (snap.num_transitions(), snap.bytes_on_disk())
    );
    let fetched = files_in(&look.join("segments"));
    assert_eq!(fetched.len() as u64, segs2);
    assert!(
        fetched
            .iter()
            .all(|f| f.to_string_lossy().ends_with(".episodes.arrow")),
        "{fetched:?}"
    );
    // A mirror with an empty `_versions` has no version yet. Today that is `Corrupt` ("no
    // committed manifest"); `NotFound` would fit better, and is accepted too.
    let e = Dataset::open(&look).unwrap_err();
    assert!(
        matches!(e, Error::NotFound { .. } | Error::Corrupt { .. }),
        "no version in the mirror yet: {e}"
    );
    let full = remote.pull(&look, None).unwrap();
    assert_eq!((full.files_downloaded, full.files_cached), (segs2, segs2));
    assert_same_data(&ds, &Dataset::open(&look).unwrap());
    // An older version's catalog leaves the mirror at its version.
    let (old_cat, o) = remote.catalog(&look, Some(p.version)).unwrap();
    assert_eq!(old_cat.num_episodes(), local_old.num_episodes());
    assert_eq!((o.files_downloaded, o.files_cached), (0, segs));
    assert_eq!(Dataset::open(&look).unwrap().versions().unwrap(), vec![v2]);
}

#[test]
fn pushes_only_fast_forward_and_a_lost_race_leaves_the_winner() {
    let Some(s3) = S3Server::start() else { return };
    let url = format!("{}/ds", s3.bucket("races"));
    let dir = tempfile::tempdir().unwrap();
    let base = make(&dir.path().join("base"), data().seed(3).obs_dim(4));
    let remote = s3.remote(&url);
    let v1 = remote.push(&base).unwrap().version;

    // Two copies of the base grow apart; both try to push at once.
    let copy_of = |from: &Path, name: &str, seed: u64| {
        let to = dir.path().join(name);
        copy_dir(from, &to);
        let ds = Dataset::open(&to).unwrap();
        data().seed(seed).obs_dim(4).append_to(&ds);
        ds
    };
    let (a, b) = (copy_of(base.path(), "a", 10), copy_of(base.path(), "b", 11));
    let (ra, rb) = std::thread::scope(|s| {
        let ha = s.spawn(|| s3.remote(&url).push(&a));
        let hb = s.spawn(|| s3.remote(&url).push(&b));
        (ha.join().unwrap(), hb.join().unwrap())
    });
    let (winner, loser_err) = match (ra, rb) {
        (Ok(_), Err(e)) => (&a, e),
        (Err(e), Ok(_)) => (&b, e),
        (x, y) => panic!("exactly one push must win: {x:?} {y:?}"),
    };
    assert!(matches!(loser_err, Error::Conflict { .. }), "{loser_err}");
    let mirror = dir.path().join("mirror");
    remote.pull(&mirror, None).unwrap();
    assert_same_data(winner, &Dataset::open(&mirror).unwrap());
    assert!(remote.latest().unwrap().unwrap().version > v1);

    // The same race, made exact (needs the pause points of the `fault-injection` feature, which
    // scripts/test.sh turns on).
    if cfg!(feature = "fault-injection") {
        // The same race, made exact: one push is held just before it writes its manifest while
        // another completes. The held one passed the ancestry check against the same remote version,
        // so only the store's conditional create (If-None-Match) can stop it.
        let v_now = remote.latest().unwrap().unwrap().version;
        let (c, d) = (copy_of(&mirror, "c", 20), copy_of(&mirror, "d", 21));
        let hold = dir.path().join("hold");
        std::fs::write(&hold, b"").unwrap();
        let held = s3
            .cli(&dir.path().join("cache"))
            .args(["push", c.path().to_str().unwrap(), &url])
            .env("TRAJSTORE_PAUSE_AT", "remote-push-before-manifest")
            .env("TRAJSTORE_PAUSE_FILE", &hold)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let reached = dir.path().join("hold.reached");
        let deadline = Instant::now() + Duration::from_secs(60);
        while !reached.exists() {
            assert!(
                Instant::now() < deadline,
                "the held push never reached its manifest"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let won = remote.push(&d).unwrap();
        assert_eq!(won.previous_version, Some(v_now));
        std::fs::remove_file(&hold).unwrap();
        let out = held.wait_with_output().unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("another writer committed version"), "{err}");
        let mirror2 = dir.path().join("mirror2");
        remote.pull(&mirror2, None).unwrap();
        assert_same_data(&d, &Dataset::open(&mirror2).unwrap());
    } else {
        crate::common::skipped(
            "the exact held-push race part only (the rest runs): it needs --features fault-injection",
        );
    }

    // The loser stays refused on retry; the base (older than the remote) too.
    let loser = if std::ptr::eq(winner, &a) { &b } else { &a };
    let e = remote.push(loser).unwrap_err();
    let head = remote.latest().unwrap().unwrap().version;
    assert!(
        matches!(
            e,
            Error::Conflict { kind: ConflictKind::Diverged { remote, .. }, ref reason, .. }
                if remote == head && reason.contains("not an ancestor")
        ),
        "{e}"
    );
    let e = remote.push(&base).unwrap_err();
    assert!(
        matches!(e, Error::Conflict { kind: ConflictKind::Diverged { remote, local }, .. } if remote == head && local < head),
        "{e}"
    );

    // Another schema is refused before anything is uploaded.
    let other = make(&dir.path().join("other"), data().seed(4).obs_dim(9));
    let before = s3.keys("races", "ds");
    let e = remote.push(&other).unwrap_err();
    assert!(matches!(e, Error::SchemaMismatch { .. }), "{e}");
    assert_eq!(s3.keys("races", "ds"), before);

    // A mirror that is brought up to date and appended to fast-forwards.
    remote.pull(&mirror, None).unwrap();
    let grown = Dataset::open(&mirror).unwrap();
    let v = data().seed(12).obs_dim(4).append_to(&grown);
    assert_eq!(remote.push(&grown).unwrap().version, v);
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

#[test]
fn damaged_or_missing_objects_are_errors_and_the_mirror_keeps_its_version() {
    let Some(s3) = S3Server::start() else { return };
    let url = format!("{}/ds", s3.bucket("damage"));
    let dir = tempfile::tempdir().unwrap();
    let ds = make(&dir.path().join("local"), data().seed(5).obs_dim(3));
    let remote = s3.remote(&url);
    let v1 = remote.push(&ds).unwrap().version;
    let mirror = dir.path().join("mirror");
    remote.pull(&mirror, None).unwrap();
    let v2 = data().seed(6).obs_dim(3).append_to(&ds);
    remote.push(&ds).unwrap();
    let m2 = remote.latest().unwrap().unwrap();
    let new_seg = m2.segments.last().unwrap();
    let key = format!("ds/{}", new_seg.path);
    let good = s3.get_raw("damage", &key);

    let still_v1 = |what: &str| {
        let d = Dataset::open(&mirror).unwrap();
        assert_eq!(d.snapshot().unwrap().version(), v1, "{what}");
        let leftovers: Vec<_> = files_in(&mirror.join("segments"))
            .into_iter()
            .filter(|p| p.to_string_lossy().ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty(), "{what}: {leftovers:?}");
    };

    // A flipped byte: the checksum catches it.
    let mut bad = good.clone();
    bad[good.len() / 2] ^= 0x40;
    s3.put_raw("damage", &key, &bad);
    let e = remote.pull(&mirror, None).unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, Error::Corrupt { .. }), "{e}");
    assert!(
        text.contains(&new_seg.path) && text.contains(&new_seg.checksum),
        "{text}"
    );
    still_v1("after a flipped byte");

    // A truncated object.
    s3.put_raw("damage", &key, &good[..good.len() - 100]);
    let e = remote.pull(&mirror, None).unwrap_err();
    assert!(e.to_string().contains("bytes but the manifest says"), "{e}");
    still_v1("after a truncation");

    // A missing object.
    s3.delete_raw("damage", &key);
    let e = remote.pull(&mirror, None).unwrap_err();
    assert!(
        matches!(e, Error::NotFound { ref path } if path.to_string_lossy().contains(&new_seg.path)),
        "{e}"
    );
    still_v1("after a deletion");

    // Restored: the pull completes.
    s3.put_raw("damage", &key, &good);
    assert_eq!(remote.pull(&mirror, None).unwrap().version, v2);
    assert_same_data(&ds, &Dataset::open(&mirror).unwrap());

    // A damaged manifest is an error naming it; so is an unknown scheme and an absent bucket.
    let mkey = format!("ds/_versions/{}", trajstore::format::manifest_name(v2));
    s3.put_raw("damage", &mkey, b"{\"format\": \"trajstore\"");
    let e = remote.pull(&dir.path().join("m3"), None).unwrap_err();
    assert!(
        matches!(e, Error::Corrupt { .. }) && e.to_string().contains("_versions"),
        "{e}"
    );
    let e = Remote::open("gs://bucket/x", s3.options()).unwrap_err();
    assert!(e.to_string().contains("unsupported storage scheme"), "{e}");
    let e = s3.remote("s3://no-such-bucket/x").latest().unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("s3://no-such-bucket/x")
            && text.contains("NoSuchBucket")
            && !text.contains("<?xml"),
        "{text}"
    );

    // A local file damaged before a push: refused, nothing becomes visible.
    let url2 = format!("{}/ds2", s3.bucket("damage2"));
    let seg = ds
        .path()
        .join(&ds.latest_manifest().unwrap().segments[0].path);
    let mut bytes = std::fs::read(&seg).unwrap();
    bytes[100] ^= 1;
    std::fs::write(&seg, &bytes).unwrap();
    let e = s3.remote(&url2).push(&ds).unwrap_err();
    assert!(
        matches!(e, Error::Corrupt { ref path, .. } if path == &seg),
        "{e}"
    );
    assert_eq!(s3.remote(&url2).latest().unwrap(), None);
}

#[test]
fn an_interrupted_push_is_invisible_and_resumes() {
    let Some(s3) = S3Server::start() else { return };
    let url = format!("{}/ds", s3.bucket("crash"));
    let dir = tempfile::tempdir().unwrap();
    let ds = make(&dir.path().join("local"), data().seed(7).obs_dim(3));
    let segs = ds.snapshot().unwrap().segments().len() as u64;
    let out = s3
        .cli(&dir.path().join("cache"))
        .args(["push", ds.path().to_str().unwrap(), &url])
        .env("TRAJSTORE_CRASH_AT", "remote-push-before-manifest")
        .output()
        .unwrap();
    assert!(!out.status.success(), "the simulated crash aborts");
    let remote = s3.remote(&url);
    assert_eq!(remote.latest().unwrap(), None, "no version is visible");
    assert_eq!(s3.keys("crash", "ds/segments").len() as u64, 2 * segs);
    let p = remote.push(&ds).unwrap();
    assert_eq!((p.files_uploaded, p.files_present), (0, 2 * segs));
    let mirror = dir.path().join("mirror");
    remote.pull(&mirror, None).unwrap();
    assert_same_data(&ds, &Dataset::open(&mirror).unwrap());
}

#[test]
fn the_cli_reads_urls_and_pushes_and_pulls_with_json() {
    let Some(s3) = S3Server::start() else { return };
    let url = format!("{}/demo", s3.bucket("cli"));
    let dir = tempfile::tempdir().unwrap();
    let ds = make(&dir.path().join("local"), data().seed(8).obs_dim(3));
    let snap = ds.snapshot().unwrap();
    let cache = dir.path().join("cache");
    let run = |args: &[&str]| -> serde_json::Value {
        let out = s3.cli(&cache).args(args).output().unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{args:?}: {e}: {}", String::from_utf8_lossy(&out.stdout)))
    };
    let p = run(&["push", ds.path().to_str().unwrap(), &url, "--json"]);
    assert_eq!(p["version"], snap.version());
    assert_eq!(p["bytes_uploaded"], snap.bytes_on_disk());

    // `info` on the URL says what `info` on the local dataset says, and fetches only the
    // episode tables into the cache's mirror.
    let segs = snap.segments().len();
    let info = run(&["info", &url, "--json"]);
    let local = run(&["info", ds.path().to_str().unwrap(), "--json"]);
    for key in [
        "version",
        "transitions",
        "episodes",
        "segments",
        "bytes_on_disk",
        "terminated_episodes",
        "truncated_episodes",
        "episode_length",
        "episode_return",
        "schema",
    ] {
        assert_eq!(info[key], local[key], "{key}");
    }
    assert_eq!(info["transitions"], snap.num_transitions());
    let mirror = cache.join("s3/cli/demo");
    assert_eq!(
        (info["path"].as_str(), info["mirror"].as_str()),
        (Some(url.as_str()), mirror.to_str())
    );
    let fetched = files_in(&mirror.join("segments"));
    assert_eq!(fetched.len(), segs, "{fetched:?}");
    assert!(
        fetched
            .iter()
            .all(|f| f.to_string_lossy().ends_with(".episodes.arrow")),
        "{fetched:?}"
    );

    // A query of `episodes` needs nothing more; one that scans `transitions` pulls the rest:
    // the transition files only.
    let sql_with = |q: &str, more: &[&str]| {
        let out = s3
            .cli(&cache)
            .args(["sql", &url, q, "--format", "json"])
            .args(more)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{q}: {err}");
        (String::from_utf8(out.stdout).unwrap(), err)
    };
    let sql = |q: &str| sql_with(q, &[]);
    let (text, err) = sql("SELECT count(*) AS n, sum(length) AS l FROM episodes");
    assert!(
        text.contains(&format!("\"n\":{}", snap.num_episodes()))
            && text.contains(&format!("\"l\":{}", snap.num_transitions())),
        "{text}"
    );
    assert!(!err.contains("pulled"), "{err}");
    assert_eq!(
        files_in(&mirror.join("segments")),
        fetched,
        "nothing more fetched"
    );
    // A scan reads the segment objects' projected columns in place: nothing is pulled.
    let (text, err) = sql_with(
        "SELECT count(*) AS n, max(step) AS s FROM transitions",
        &["--timer"],
    );
    let max_step = snap
        .catalog()
        .episode_tables()
        .iter()
        .flat_map(|t| t.lengths().iter().copied())
        .max()
        .unwrap()
        - 1;
    let want = format!("\"n\":{},\"s\":{max_step}", snap.num_transitions());
    assert!(text.contains(&want), "{text}");
    assert!(
        !err.contains("pulled") && err.contains("fetched: "),
        "{err}"
    );
    assert_eq!(files_in(&mirror.join("segments")), fetched);
    // With --pull, the first scan pulls the transition files and queries the mirror.
    let (text, err) = sql_with(
        "SELECT count(*) AS n, max(step) AS s FROM transitions",
        &["--pull"],
    );
    assert!(text.contains(&want), "{text}");
    assert!(
        err.contains(&format!(": {segs} files ("))
            && err.contains(&format!("downloaded, {segs} (")),
        "{err}"
    );
    assert_eq!(files_in(&mirror.join("segments")).len(), 2 * segs);

    let to = dir.path().join("pulled");
    let r = run(&["pull", &url, "--to", to.to_str().unwrap(), "--json"]);
    assert_eq!(r["files_downloaded"], 2 * snap.segments().len());
    assert_same_data(&ds, &Dataset::open(&to).unwrap());
    let v = run(&["verify", &url, "--json"]);
    assert_eq!(v["transitions"], snap.num_transitions());

    // Errors name what went wrong.
    let out = s3
        .cli(&cache)
        .args(["info", "s3://cli/nothing-here"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("s3://cli/nothing-here"), "{err}");
    let help = s3.cli(&cache).args(["push", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.contains("AWS_ENDPOINT_URL") && help.contains("fast-forwards"),
        "{help}"
    );
}

#[test]
fn pyarrow_reads_the_pushed_segments_from_s3() {
    let Some(s3) = S3Server::start() else { return };
    let Some(py) = crate::common::python_with("pyarrow.fs", "reading S3 from pyarrow") else {
        return;
    };
    let url = format!("{}/ds", s3.bucket("interop"));
    let dir = tempfile::tempdir().unwrap();
    let ds = make(&dir.path().join("local"), data().seed(9).obs_dim(3));
    s3.remote(&url).push(&ds).unwrap();
    let m = s3.remote(&url).latest().unwrap().unwrap();
    let script = r#"
import sys, json, pyarrow.fs as fs, pyarrow.ipc as ipc, pyarrow.compute as pc
s3 = fs.S3FileSystem(endpoint_override=sys.argv[1], scheme="http", access_key="trajstore",
                     secret_key="trajstore", region="us-east-1")
out = []
for path in sys.argv[2:]:
    with s3.open_input_file("interop/ds/" + path) as f:
        t = ipc.open_file(f).read_all()
    out.append([t.num_rows, float(pc.sum(t["reward"]).as_py())])
print(json.dumps(out))
"#;
    let mut cmd = Command::new(py);
    cmd.args(["-c", script, &s3.endpoint()]);
    for s in &m.segments {
        cmd.arg(&s.path);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: Vec<(u64, f64)> = serde_json::from_slice(&out.stdout).unwrap();
    let snap = ds.snapshot().unwrap();
    for ((rows, sum), seg) in got.iter().zip(snap.segments()) {
        assert_eq!(*rows, seg.num_rows());
        let want: f64 = seg
            .batches()
            .unwrap()
            .iter()
            .flat_map(|b| {
                b.column_by_name("reward")
                    .unwrap()
                    .as_any()
                    .downcast_ref::<arrow::array::Float32Array>()
                    .unwrap()
                    .values()
                    .to_vec()
            })
            .map(f64::from)
            .sum();
        assert!(
            (sum - want).abs() <= 1e-6 * want.abs().max(1.0),
            "{sum} vs {want}"
        );
    }
    assert_eq!(got.len(), snap.segments().len());
}

#[test]
fn file_urls_work_without_a_server() {
    let dir = tempfile::tempdir().unwrap();
    let ds = make(&dir.path().join("local"), data().seed(13).obs_dim(3));
    let store = dir.path().join("store");
    let url = format!("file://{}", store.display());
    let remote = Remote::open(&url, RemoteOptions::default()).unwrap();
    let e = remote.pull(&dir.path().join("nothing"), None).unwrap_err();
    assert!(matches!(e, Error::NotFound { .. }), "{e}");
    assert!(!store.exists(), "reading creates nothing");
    let p = remote.push(&ds).unwrap();
    assert!(
        store
            .join("_versions")
            .join(trajstore::format::manifest_name(p.version))
            .is_file()
    );
    let mirror = dir.path().join("mirror");
    remote.pull(&mirror, None).unwrap();
    assert_same_data(&ds, &Dataset::open(&mirror).unwrap());
    // The store itself is a dataset too (content-addressed file names).
    assert_same_data(&ds, &Dataset::open(&store).unwrap());
}

#[test]
fn large_segments_travel_in_parts_and_a_bad_one_is_abandoned() {
    let Some(s3) = S3Server::start() else { return };
    let url = format!("{}/big", s3.bucket("big"));
    let dir = tempfile::tempdir().unwrap();
    // ~22 MB in one segment: three 8 MiB parts.
    let ds = TestData::new()
        .transitions(200_000)
        .obs_dim(17)
        .act_dim(6)
        .mean_episode_len(1000.0)
        .seed(14)
        .write(&dir.path().join("local"));
    let m = ds.latest_manifest().unwrap();
    assert_eq!(m.segments.len(), 1);
    assert!(
        m.segments[0].bytes > 16 << 20,
        "{} bytes",
        m.segments[0].bytes
    );

    // A damaged local file is found while it streams; the upload is abandoned unfinished.
    let seg = ds.path().join(&m.segments[0].path);
    let good = std::fs::read(&seg).unwrap();
    let mut bad = good.clone();
    let at = bad.len() - 1000;
    bad[at] ^= 1;
    std::fs::write(&seg, &bad).unwrap();
    let e = s3.remote(&url).push(&ds).unwrap_err();
    assert!(matches!(e, Error::Corrupt { .. }), "{e}");
    assert_eq!(
        s3.remote(&url).latest().unwrap(),
        None,
        "no version is visible"
    );
    let keys = s3.keys("big", "big");
    assert!(
        keys.iter()
            .all(|k| !k.ends_with(".arrow") || k.ends_with(".episodes.arrow")),
        "the transition file was not completed: {keys:?}"
    );

    std::fs::write(&seg, &good).unwrap();
    let p = s3.remote(&url).push(&ds).unwrap();
    // The episode table went up the first time; only the transition file is sent now.
    assert_eq!((p.files_uploaded, p.files_present), (1, 1));
    let mirror = dir.path().join("mirror");
    s3.remote(&url).pull(&mirror, None).unwrap();
    assert_same_data(&ds, &Dataset::open(&mirror).unwrap());
}

/// A remote `transitions` table of `catalog`'s version and a session over it.
#[cfg(feature = "sql")]
fn remote_sql(
    remote: &Remote,
    catalog: &trajstore::Catalog,
) -> (
    trajstore::sql::SqlSession,
    std::sync::Arc<trajstore::sql::RemoteTransitions>,
) {
    let table =
        std::sync::Arc::new(trajstore::sql::RemoteTransitions::new(remote, catalog).unwrap());
    let s = trajstore::sql::SqlSession::with_transitions(catalog, table.clone()).unwrap();
    (s, table)
}

/// A store that counts the bytes its GETs return, around a real one.
#[cfg(feature = "sql")]
#[derive(Debug)]
struct CountingStore {
    inner: std::sync::Arc<dyn ObjectStore>,
    bytes: std::sync::atomic::AtomicU64,
    gets: std::sync::atomic::AtomicU64,
}

#[cfg(feature = "sql")]
impl std::fmt::Display for CountingStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Counting({})", self.inner)
    }
}

#[cfg(feature = "sql")]
impl CountingStore {
    fn bytes(&self) -> u64 {
        self.bytes.load(std::sync::atomic::Ordering::SeqCst)
    }
}

#[cfg(feature = "sql")]
#[async_trait::async_trait]
impl ObjectStore for CountingStore {
    async fn put_opts(
        &self,
        location: &ObjectPath,
        payload: object_store::PutPayload,
        opts: object_store::PutOptions,
    ) -> object_store::Result<object_store::PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &ObjectPath,
        opts: object_store::PutMultipartOptions,
    ) -> object_store::Result<Box<dyn object_store::MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &ObjectPath,
        options: object_store::GetOptions,
    ) -> object_store::Result<object_store::GetResult> {
        let r = self.inner.get_opts(location, options).await?;
        // What the server sends for this GET: the range it answered with.
        self.bytes.fetch_add(
            r.range.end - r.range.start,
            std::sync::atomic::Ordering::SeqCst,
        );
        self.gets.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(r)
    }

    fn delete_stream(
        &self,
        locations: futures::stream::BoxStream<'static, object_store::Result<ObjectPath>>,
    ) -> futures::stream::BoxStream<'static, object_store::Result<ObjectPath>> {
        self.inner.delete_stream(locations)
    }

    fn list(
        &self,
        prefix: Option<&ObjectPath>,
    ) -> futures::stream::BoxStream<'static, object_store::Result<object_store::ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(
        &self,
        prefix: Option<&ObjectPath>,
    ) -> object_store::Result<object_store::ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &ObjectPath,
        to: &ObjectPath,
        options: object_store::CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

#[cfg(feature = "sql")]
fn pretty(r: &trajstore::sql::QueryResult) -> String {
    arrow::util::pretty::pretty_format_batches(&r.batches)
        .unwrap()
        .to_string()
}

#[cfg(feature = "sql")]
#[test]
fn sql_on_a_url_reads_only_the_projected_columns_with_ranged_gets() {
    let Some(s3) = S3Server::start() else { return };
    let url = format!("{}/ds", s3.bucket("sqlremote"));
    let dir = tempfile::tempdir().unwrap();
    let ds = data()
        .transitions(40_000)
        .seed(11)
        .obs_dim(16)
        .segment_bytes(1 << 20)
        .batch_bytes(256 << 10)
        .commit_every(100)
        .write(&dir.path().join("local"));
    let remote = s3.remote(&url);
    remote.push(&ds).unwrap();
    let mirror = dir.path().join("mirror");
    let (catalog, _) = remote.catalog(&mirror, None).unwrap();
    let snap = ds.snapshot().unwrap();
    let local = trajstore::sql::SqlSession::try_new(&snap).unwrap();
    let (sql, table) = remote_sql(&remote, &catalog);
    let segment_bytes: u64 = catalog.manifest().segments.iter().map(|s| s.bytes).sum();
    assert!(catalog.manifest().segments.len() > 3);

    // COUNT(*) and `episodes` read no segment object.
    let n = sql.query("SELECT count(*) AS n FROM transitions").unwrap();
    assert_eq!(
        pretty(&n),
        pretty(
            &local
                .query("SELECT count(*) AS n FROM transitions")
                .unwrap()
        )
    );
    sql.query("SELECT count(*), max(length) FROM episodes")
        .unwrap();
    assert_eq!(table.fetched().bytes, 0);

    // One small column: its buffers, footers and headers only.
    let q = "SELECT round(sum(reward), 3) AS r FROM transitions";
    assert_eq!(
        pretty(&sql.query(q).unwrap()),
        pretty(&local.query(q).unwrap())
    );
    let one = table.fetched();
    assert!(
        one.bytes > 0 && one.bytes * 8 < segment_bytes,
        "{one:?} of {segment_bytes} bytes"
    );

    // The same answers as the local session.
    for q in [
        "SELECT episode_id, step, reward, observation FROM transitions \
         WHERE episode_id BETWEEN 40 AND 42 AND step < 5 ORDER BY episode_id, step",
        "SELECT episode_id, count(*) AS n, round(sum(reward), 4) AS r, max(step) AS s \
         FROM transitions GROUP BY episode_id ORDER BY episode_id",
        "SELECT e.episode_id, e.length, count(*) AS n, round(avg(t.reward), 4) AS r \
         FROM transitions t JOIN episodes e ON t.episode_id = e.episode_id \
         WHERE e.length > 50 GROUP BY e.episode_id, e.length ORDER BY e.episode_id",
        "SELECT episode_id, round(discounted_return(reward, step, 0.99), 3) AS g \
         FROM transitions GROUP BY episode_id ORDER BY episode_id",
        "SELECT round(sum(vec_norm(observation)), 2) AS n, count(*) AS c FROM transitions \
         WHERE step = 3",
        "SELECT count(*) AS n FROM transitions WHERE episode_id < 10",
        "SELECT * FROM transitions ORDER BY episode_id, step LIMIT 5",
    ] {
        assert_eq!(
            pretty(&sql.query(q).unwrap()),
            pretty(&local.query(q).unwrap()),
            "{q}"
        );
    }
    // The per-episode GROUP BY rule runs over the remote table too.
    let plan = sql
        .explain(
            "SELECT episode_id, sum(reward) FROM transitions GROUP BY episode_id",
            false,
        )
        .unwrap();
    assert!(plan.contains("EpisodeAggregateExec"), "{plan}");

    // A filter on episode_id fetches a fraction of what the whole column does.
    let (sql2, table2) = remote_sql(&remote, &catalog);
    sql2.query("SELECT sum(reward) FROM transitions WHERE episode_id < 5")
        .unwrap();
    let few = table2.fetched();
    assert!(few.bytes < one.bytes / 2, "{few:?} vs {one:?}");
    // A limit without filters reads only the first segment's batches it needs.
    let (sql3, table3) = remote_sql(&remote, &catalog);
    assert_eq!(
        sql3.query("SELECT observation FROM transitions LIMIT 3")
            .unwrap()
            .num_rows(),
        3
    );
    assert!(table3.fetched().bytes < catalog.manifest().segments[0].bytes);

    // Counted by the store itself, through `Remote::with_store`: the same bytes, and a small
    // fraction of the transition files.
    let counted = std::sync::Arc::new(CountingStore {
        inner: std::sync::Arc::new(s3.store("sqlremote")),
        bytes: Default::default(),
        gets: Default::default(),
    });
    let remote4 = Remote::with_store(&url, counted.clone(), s3.options()).unwrap();
    let (sql4, table4) = remote_sql(&remote4, &catalog);
    let q = "SELECT round(sum(reward), 3) AS r FROM transitions";
    assert_eq!(
        pretty(&sql4.query(q).unwrap()),
        pretty(&local.query(q).unwrap())
    );
    let stats = table4.fetched();
    assert_eq!(
        (
            counted.bytes(),
            counted.gets.load(std::sync::atomic::Ordering::SeqCst)
        ),
        (stats.bytes, stats.requests)
    );
    assert!(
        counted.bytes() * 8 < segment_bytes,
        "{stats:?} of {segment_bytes}"
    );

    // No transition file came into the mirror.
    let transition_files: Vec<_> = files_in(&mirror.join("segments"))
        .into_iter()
        .filter(|p| !p.to_string_lossy().ends_with(".episodes.arrow"))
        .collect();
    assert!(transition_files.is_empty(), "{transition_files:?}");

    // A truncated, damaged or missing segment object is an error naming it.
    let seg = &catalog.manifest().segments[1];
    let key = format!("ds/{}", seg.path);
    let good = s3.get_raw("sqlremote", &key);
    let fails = |what: &str, needle: &str| {
        let (s, _) = remote_sql(&remote, &catalog);
        let e = s
            .query("SELECT sum(reward) FROM transitions")
            .unwrap_err()
            .to_string();
        assert!(e.contains(&seg.path) && e.contains(needle), "{what}: {e}");
    };
    s3.put_raw("sqlremote", &key, &good[..good.len() - 100]);
    fails("truncated", "but the manifest says");
    let mut bad = good.clone();
    let n = bad.len();
    bad[n - 7] ^= 0x40; // the footer length
    s3.put_raw("sqlremote", &key, &bad);
    fails("damaged footer", "footer");
    s3.delete_raw("sqlremote", &key);
    fails("missing", "");
    s3.put_raw("sqlremote", &key, &good);
    let (s, _) = remote_sql(&remote, &catalog);
    s.query("SELECT sum(reward) FROM transitions").unwrap();
}
