//! Issue 19's and issue 30's data-loss and robustness defects, one regression test each: no
//! command deletes committed data (nor a duration that wraps, nor an output path inside the
//! dataset), retention keeps the newest transitions, creation is atomic, no query kills the
//! process, permissions are reported as such.

use std::path::Path;
use std::process::Command;

use crate::common::TestData;
use trajstore::{Dataset, Error, WriterOptions};

use crate::common::{bin, run_cli as run};

fn transitions(path: &Path) -> u64 {
    Dataset::open(path)
        .unwrap()
        .snapshot()
        .unwrap()
        .num_transitions()
}

#[test]
fn demo_refuses_an_existing_dataset_and_overwrite_keeps_the_old_versions() {
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("real");
    let real_s = real.to_str().unwrap();
    TestData::new()
        .obs_dim(17)
        .act_dim(6)
        .transitions(3000)
        .write(&real);
    let before = Dataset::open(&real).unwrap().snapshot().unwrap();

    // No flag: refused, nothing touched.
    let (code, _, err) = run(&["demo", real_s, "--transitions", "1000"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("--append") && err.contains("--overwrite"),
        "{err}"
    );
    assert_eq!(transitions(&real), 3000);
    assert_eq!(Dataset::open(&real).unwrap().versions().unwrap(), [1, 2]);

    // --overwrite: a new version with only the demo's data; the old one is still there.
    let (code, _, err) = run(&[
        "demo",
        real_s,
        "--transitions",
        "1000",
        "--overwrite",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let ds = Dataset::open(&real).unwrap();
    assert_eq!(ds.snapshot().unwrap().num_transitions(), 1000);
    let old = ds.snapshot_at(before.version()).unwrap();
    assert_eq!(old.num_transitions(), 3000);
    assert_eq!(
        old.episode(0).unwrap().unwrap(),
        before.episode(0).unwrap().unwrap()
    );
    trajstore::store::verify::verify(&old, |_| {}).unwrap();

    // A directory that is not a dataset is never written into.
    let other = dir.path().join("other");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("notes.txt"), b"mine").unwrap();
    let (code, _, err) = run(&["demo", other.to_str().unwrap(), "--overwrite"]);
    assert_eq!(code, 1);
    assert!(err.contains("not a trajstore dataset"), "{err}");
    assert_eq!(std::fs::read(other.join("notes.txt")).unwrap(), b"mine");
}

#[test]
fn demo_overwrite_waits_for_the_writer_lock_instead_of_removing_files() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("d");
    let data = TestData::new().obs_dim(17).act_dim(6).transitions(2000);
    let ds = data.write(&d);
    // Another writer holds the lock (as a long `demo --append` would).
    let held = ds.writer(WriterOptions::default()).unwrap();
    let (code, _, err) = run(&[
        "demo",
        d.to_str().unwrap(),
        "--transitions",
        "1000",
        "--overwrite",
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("locked by another writer"), "{err}");
    drop(held);
    // Every version is intact.
    for v in ds.versions().unwrap() {
        let snap = ds.snapshot_at(v).unwrap();
        trajstore::store::verify::verify(&snap, |_| {}).unwrap();
    }
    assert_eq!(transitions(&d), 2000);
}

#[test]
fn max_transitions_below_one_segment_keeps_the_newest_transitions() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("m");
    let ds = TestData::new()
        .transitions(5000)
        .writer_options(WriterOptions::default().with_max_transitions(10))
        .write(&d);
    let snap = ds.snapshot().unwrap();
    assert!(snap.num_transitions() >= 10, "{}", snap.num_transitions());
    // More data: still at least the limit, and the newest episode is there.
    let mut w = ds
        .writer(
            WriterOptions::default()
                .with_max_transitions(10)
                .with_segment_bytes(4096),
        )
        .unwrap();
    let spec = TestData::new().spec();
    let (b, e) = spec.episode(0, 30);
    let id = w.append_episode(&b, e).unwrap();
    w.commit().unwrap();
    let snap = ds.snapshot().unwrap();
    assert!(snap.num_transitions() >= 10);
    assert!(
        snap.episode(id).unwrap().is_some(),
        "the newest episode is kept"
    );

    // The CLI says so too: the demo's data is there after --max-transitions 10.
    let m2 = dir.path().join("m2");
    let (code, _, err) = run(&[
        "demo",
        m2.to_str().unwrap(),
        "--transitions",
        "5000",
        "--max-transitions",
        "10",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(transitions(&m2) >= 10);

    // A limit of 0 keeps nothing: an error before anything is written.
    let e = ds
        .writer(WriterOptions::default().with_max_transitions(0))
        .unwrap_err();
    assert!(
        matches!(e, Error::InvalidArgument { argument: Some(ref a), .. } if a == "max_transitions"),
        "{e}"
    );
}

#[test]
fn concurrent_creators_of_one_dataset_never_destroy_each_other() {
    for round in 0..5 {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join(format!("new-{round}"));
        let data = TestData::new().seed(round).transitions(300);
        let results: Vec<trajstore::Result<()>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..6)
                .map(|_| {
                    s.spawn(|| -> trajstore::Result<()> {
                        let ds = match Dataset::create(&d, &data.schema()) {
                            Ok(ds) => ds,
                            // Another thread is creating it (or has): open it once it exists.
                            Err(Error::Locked { .. }) | Err(Error::InvalidArgument { .. }) => {
                                let deadline =
                                    std::time::Instant::now() + std::time::Duration::from_secs(10);
                                loop {
                                    match Dataset::open(&d) {
                                        Ok(ds) => break ds,
                                        Err(_) if std::time::Instant::now() < deadline => {
                                            std::thread::sleep(std::time::Duration::from_millis(2))
                                        }
                                        Err(e) => return Err(e),
                                    }
                                }
                            }
                            Err(e) => return Err(e),
                        };
                        let mut w = ds.writer(
                            WriterOptions::default()
                                .with_lock_wait(std::time::Duration::from_secs(30)),
                        )?;
                        for (i, &l) in data.lengths().iter().enumerate() {
                            let (b, e) = data.spec().episode(i as u64, l);
                            w.append_episode(&b, e)?;
                        }
                        w.commit()?;
                        Ok(())
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for r in &results {
            assert!(
                r.is_ok(),
                "round {round}: {:?}",
                r.as_ref().err().map(|e| e.to_string())
            );
        }
        let snap = Dataset::open(&d).unwrap().snapshot().unwrap();
        assert_eq!(snap.num_transitions(), 6 * 300, "round {round}");
        trajstore::store::verify::verify(&snap, |_| {}).unwrap();
    }
}

#[test]
fn a_damaged_newest_manifest_leaves_older_versions_readable() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("t");
    let ds = TestData::new().transitions(2000).commit_every(20).write(&d);
    let versions = ds.versions().unwrap();
    assert!(versions.len() >= 3, "{versions:?}");
    let (newest, older) = (versions[versions.len() - 1], versions[versions.len() - 2]);
    let want = ds.snapshot_at(older).unwrap().num_transitions();
    let path = d
        .join("_versions")
        .join(trajstore::format::manifest_name(newest));
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(10)
        .unwrap();

    let ds = Dataset::open(&d).unwrap();
    assert_eq!(ds.snapshot_at(older).unwrap().num_transitions(), want);
    let e = ds.snapshot().unwrap_err();
    assert!(matches!(e, Error::Corrupt { .. }), "{e}");
    assert!(
        e.to_string()
            .contains(&format!("the newest readable version is {older}")),
        "{e}"
    );
    let d_s = d.to_str().unwrap();
    let v = older.to_string();
    let (code, _, err) = run(&["verify", d_s, "--version", &v]);
    assert_eq!(code, 0, "{err}");
    let out = dir.path().join("o.parquet");
    let (code, _, err) = run(&["export", d_s, out.to_str().unwrap(), "--version", &v]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = run(&["info", d_s]);
    assert_eq!(code, 1);
    assert!(
        err.contains(&format!("newest readable version is {older}")),
        "{err}"
    );
    // A writer refuses to build on a damaged history.
    assert!(matches!(
        ds.writer(WriterOptions::default()).unwrap_err(),
        Error::Corrupt { .. }
    ));
}

#[cfg(unix)]
#[test]
fn a_manifest_that_is_a_device_or_huge_is_refused_not_read() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("z");
    let ds = TestData::new().transitions(500).write(&d);
    let newest = *ds.versions().unwrap().last().unwrap();
    let path = d
        .join("_versions")
        .join(trajstore::format::manifest_name(newest));
    std::fs::remove_file(&path).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &path).unwrap();
    let e = ds.snapshot().unwrap_err();
    assert!(
        matches!(e, Error::Corrupt { ref reason, .. } if reason.contains("not a regular file")),
        "{e}"
    );
    // A sparse file larger than the limit: refused from its size, never read.
    std::fs::remove_file(&path).unwrap();
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(trajstore::store::manifest::MAX_MANIFEST_BYTES + 1)
        .unwrap();
    let e = ds.snapshot().unwrap_err();
    assert!(matches!(e, Error::Corrupt { .. }), "{e}");
}

#[test]
fn ingest_into_a_directory_that_is_not_a_dataset_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("d");
    std::fs::create_dir(&d).unwrap();
    std::fs::write(d.join("x"), b"").unwrap();
    let e = Dataset::open(&d).unwrap_err();
    assert!(e.to_string().contains("is not a trajstore dataset"), "{e}");
}

#[test]
fn vacuum_removes_replaced_versions_only_after_their_grace() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("v");
    let ds = TestData::new().transitions(1000).commit_every(10).write(&d);
    let before = ds.versions().unwrap();
    assert!(before.len() > 2);
    let d_s = d.to_str().unwrap();
    // Default --older-than (10 minutes): everything just written stays.
    let (code, out, err) = run(&["vacuum", d_s, "--json"]);
    assert_eq!(code, 0, "{err}");
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(r["versions_removed"].as_array().unwrap().len(), 0, "{r}");
    assert_eq!(ds.versions().unwrap(), before);
    // --older-than 0s: only the newest stays, and it verifies.
    let (code, out, err) = run(&[
        "vacuum",
        d_s,
        "--older-than",
        "0s",
        "--no-retention-check",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        r["versions_removed"].as_array().unwrap().len(),
        before.len() - 1,
        "{r}"
    );
    assert_eq!(ds.versions().unwrap(), [*before.last().unwrap()]);
    let (code, _, err) = run(&["verify", d_s]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = run(&["vacuum", d_s, "--older-than", "soon"]);
    assert_eq!(code, 2, "a usage error: {err}");
    // Zero where zero cannot mean anything is a usage error, not silently something else.
    let z = dir.path().join("z");
    let (code, _, err) = run(&["demo", z.to_str().unwrap(), "--commit-every", "0"]);
    assert_eq!(code, 2, "{err}");
    assert!(!z.exists());
}

/// The SQL text `SELECT ... WHERE episode_id = 0 OR episode_id = 1 OR ...` with `n` terms.
#[cfg(feature = "sql")]
fn or_chain(n: usize) -> String {
    let terms: Vec<String> = (0..n).map(|i| format!("episode_id = {i}")).collect();
    format!(
        "SELECT episode_id FROM episodes WHERE {}",
        terms.join(" OR ")
    )
}

#[test]
fn durations_that_overflow_mean_never_and_vacuum_has_a_safety_floor() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("v");
    let ds = TestData::new().transitions(600).commit_every(10).write(&d);
    let before = ds.versions().unwrap();
    assert!(before.len() > 2);
    let d_s = d.to_str().unwrap();
    // "Never", written as the largest number of seconds (or milliseconds) that fits: nothing
    // goes (the grace used to wrap to 384 ms and remove every version but the newest).
    for never in [
        "18446744073709552s",
        "18446744073709552000ms",
        "213503982334601d",
    ] {
        let (code, out, err) = run(&[
            "vacuum",
            d_s,
            "--older-than",
            never,
            "--no-retention-check",
            "--json",
        ]);
        assert_eq!(code, 0, "{never}: {err}");
        let r: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(
            r["versions_removed"].as_array().unwrap().len(),
            0,
            "{never}: {r}"
        );
        assert_eq!(ds.versions().unwrap(), before, "{never}");
    }
    // Below the floor without the flag: refused, nothing removed.
    for short in ["0s", "30s", "9m"] {
        let (code, _, err) = run(&["vacuum", d_s, "--older-than", short]);
        assert_eq!(code, 1, "{short}: {err}");
        assert!(err.contains("--no-retention-check"), "{err}");
        assert_eq!(ds.versions().unwrap(), before);
    }
    // The writer's grace saturates the same way: with one version kept and a grace of
    // "never", every replaced version stays.
    let w = dir.path().join("w");
    let never = std::time::Duration::from_secs(18_446_744_073_709_552);
    TestData::new()
        .transitions(600)
        .commit_every(10)
        .writer_options(
            WriterOptions::default()
                .with_keep_versions(1)
                .with_retention_grace(never),
        )
        .write(&w);
    let kept = Dataset::open(&w).unwrap().versions().unwrap();
    assert_eq!(kept.len(), before.len(), "{kept:?}");
    // And through the CLI's --retention-grace.
    let c = dir.path().join("c");
    let c_s = c.to_str().unwrap();
    for i in 0..3 {
        let mut args = vec!["demo", c_s, "--transitions", "500", "--json"];
        if i > 0 {
            args.extend(["--append", "--keep-versions", "1"]);
            args.extend(["--retention-grace", "18446744073709552s"]);
        }
        let (code, _, err) = run(&args);
        assert_eq!(code, 0, "{err}");
    }
    let v = Dataset::open(&c).unwrap().versions().unwrap();
    assert!(v.len() >= 3, "every version stays: {v:?}");
}

#[test]
fn output_files_inside_a_dataset_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("d");
    let ds = TestData::new().transitions(800).commit_every(5).write(&d);
    let snap = ds.snapshot().unwrap();
    let d_s = d.to_str().unwrap();
    let seg = d.join(trajstore::format::SEGMENTS_DIR).join(format!(
        "{}{}",
        trajstore::format::segment_name(snap.manifest().segments[0].id),
        trajstore::format::SEGMENT_SUFFIX
    ));
    let manifest = d
        .join(trajstore::format::VERSIONS_DIR)
        .join(trajstore::format::manifest_name(snap.version()));
    // Through a symbolic link to the dataset too.
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&d, &link).unwrap();
    let bytes = |p: &Path| std::fs::read(p).unwrap();
    let (seg_bytes, manifest_bytes) = (bytes(&seg), bytes(&manifest));
    let targets = [
        seg.clone(),
        manifest.clone(),
        d.join("result.csv"),
        link.join("segments").join("x.parquet"),
    ];
    for t in &targets {
        let t_s = t.to_str().unwrap();
        let (code, _, err) = run(&["sql", d_s, "SELECT 1 AS x", "--output", t_s]);
        assert_eq!(code, 1, "sql --output {t_s}: {err}");
        assert!(err.contains("inside the dataset"), "{err}");
        let (code, _, err) = run(&["export", d_s, t_s]);
        assert_eq!(code, 1, "export {t_s}: {err}");
        assert!(err.contains("inside the dataset"), "{err}");
    }
    // Into another dataset as well.
    let other = dir.path().join("other");
    TestData::new().transitions(100).write(&other);
    let (code, _, err) = run(&["export", d_s, other.join("x.parquet").to_str().unwrap()]);
    assert_eq!(code, 1, "{err}");
    let e = trajstore::store::export::export_parquet(&snap, &seg, |_| {}).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    assert_eq!(bytes(&seg), seg_bytes);
    assert_eq!(bytes(&manifest), manifest_bytes);
    assert!(!d.join("result.csv").exists());
    let (code, _, err) = run(&["verify", d_s]);
    assert_eq!(code, 0, "{err}");
    // Outside any dataset: written.
    let out = dir.path().join("out.parquet");
    let (code, _, err) = run(&["export", d_s, out.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.exists());
}

#[test]
#[cfg(feature = "sql")]
fn deep_sql_expressions_are_an_error_on_every_surface_not_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("d");
    let ds = TestData::new().transitions(2000).write(&d);
    let d_s = d.to_str().unwrap();
    // (6,000 terms: one argument of a command line holds at most 128 KiB.)
    let deep = or_chain(6_000);
    let plus = format!("SELECT {} AS s", vec!["1"; 10_000].join(" + "));
    for q in [&deep, &plus] {
        let (code, _, err) = run(&["sql", d_s, q]);
        assert_eq!(code, 1, "no crash (SIGABRT was -1): {err}");
        assert!(err.contains("nested more than 1000"), "{err}");
    }
    let (code, _, err) = run(&["sample", d_s, "--episodes", &deep]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("nested more than 1000"), "{err}");
    // At the bound it runs (999 terms: 1000 deep), in the CLI (a debug build here) and in
    // the library, on this test's own small thread stack.
    let ok = or_chain(999);
    let (code, out, err) = run(&["sql", d_s, &ok, "--format", "csv"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.lines().count() > 1, "{out}");
    let snap = ds.snapshot().unwrap();
    use trajstore::sql::SnapshotSql;
    let e = snap.episodes_where(&deep).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    let ids = std::thread::Builder::new()
        .stack_size(256 << 10)
        .spawn(move || snap.episodes_where(&ok).map(|v| v.len()))
        .unwrap()
        .join()
        .unwrap()
        .unwrap();
    assert!(ids > 0);
}

#[test]
#[cfg(feature = "sql")]
fn sql_memory_is_bounded_and_running_out_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("d");
    TestData::new().obs_dim(64).transitions(20_000).write(&d);
    let d_s = d.to_str().unwrap();
    // A result larger than the limit: an error that says so, not an OOM kill.
    let all = "SELECT * FROM transitions";
    let (code, _, err) = run(&["sql", d_s, all, "--memory-limit", "2MiB"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("needs more memory than the SQL limit"),
        "{err}"
    );
    let out = bin()
        .args(["sql", d_s, all])
        .env("TRAJSTORE_SQL_MEMORY", "2MiB")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("TRAJSTORE_SQL_MEMORY"), "{err}");
    // A sorted cross join (4M rows) spills or fails inside the limit; its result does not
    // fit: an error, never the OOM killer.
    let cross = "SELECT a.reward + b.reward AS r FROM transitions a CROSS JOIN \
                 (SELECT reward FROM transitions LIMIT 200) b ORDER BY r";
    let (code, _, err) = run(&["sql", d_s, cross, "--memory-limit", "4MiB"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("memory"), "{err}");
    // Functions whose output size an argument decides are checked before they allocate
    // (constant folding would run them while planning).
    for q in [
        "SELECT length(repeat('x', 2147483647)) AS n",
        "SELECT length(repeat(CAST(episode_id AS VARCHAR), 100000000)) FROM episodes",
        "SELECT array_length(array_repeat(1.5, 1000000000)) AS n",
        "SELECT cardinality(range(0, 9000000000000)) AS n",
        "SELECT count(*) FROM (SELECT unnest(generate_series(1, 9000000000000)))",
    ] {
        let (code, _, err) = run(&["sql", d_s, q, "--memory-limit", "1GiB"]);
        assert_eq!(code, 1, "{q}: {err}");
        assert!(err.contains("more than the SQL memory limit"), "{q}: {err}");
    }
    let (code, out, err) = run(&[
        "sql",
        d_s,
        "SELECT length(repeat('ab', 1000)) AS n",
        "--format",
        "csv",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("2000"), "{out}");
    // The default is a share of the machine's memory.
    let (limit, from) = trajstore::sql::memory_limit().unwrap();
    assert!(limit > 0 && from != "set by the caller", "{limit} {from}");
}

/// A command of the CLI as a user without the rights root has (as root: CAP_DAC_OVERRIDE and
/// CAP_DAC_READ_SEARCH dropped, so that file modes apply).
fn run_unprivileged(args: &[&str]) -> Option<(i32, String)> {
    let mut c = if is_root() {
        let setpriv = Path::new("/usr/bin/setpriv");
        if !setpriv.exists() {
            return None;
        }
        let mut c = Command::new(setpriv);
        c.args([
            "--inh-caps=-dac_override,-dac_read_search",
            "--bounding-set=-dac_override,-dac_read_search",
        ])
        .arg(env!("CARGO_BIN_EXE_trajstore"));
        c
    } else {
        bin()
    };
    let out = c.args(args).output().unwrap();
    Some((
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
}

#[test]
fn a_dataset_the_user_may_not_enter_is_permission_denied_not_missing() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    // A parent the user may not enter.
    let locked = dir.path().join("locked");
    let inner = locked.join("d");
    TestData::new().transitions(300).write(&inner);
    // Another user's dataset of mode 0700 (as root: owned by nobody).
    let private = dir.path().join("private");
    TestData::new().transitions(300).write(&private);
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o000)).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    if is_root() {
        let _ = Command::new("chown")
            .args(["-R", "65534:65534", private.to_str().unwrap()])
            .status();
    }
    let restore = || {
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    for (path, shown) in [(&inner, &inner), (&private, &private)] {
        let Some((code, err)) = run_unprivileged(&["info", path.to_str().unwrap()]) else {
            restore();
            return crate::common::skipped("setpriv is missing: cannot drop root's file rights");
        };
        assert_eq!(code, 1, "{err}");
        assert!(
            err.contains("Permission denied"),
            "{}: {err}",
            path.display()
        );
        assert!(err.contains(shown.to_str().unwrap()), "{err}");
        assert!(!err.contains("not found"), "{err}");
        assert!(!err.contains("not a trajstore dataset"), "{err}");
    }
    restore();
    let e = Dataset::open(dir.path().join("missing")).unwrap_err();
    assert!(matches!(e, Error::NotFound { .. }), "{e}");
}
