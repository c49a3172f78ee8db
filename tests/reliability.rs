//! Issue 19's data-loss and concurrency defects, one regression test each: no command deletes
//! committed data, retention keeps the newest transitions, creation is atomic.

mod common;

use std::path::Path;
use std::process::Command;

use common::TestData;
use trajstore::{Dataset, Error, WriterOptions};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_trajstore"))
}

fn run(args: &[&str]) -> (i32, String, String) {
    let out = bin().args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

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
    assert_eq!(old.episode(0), before.episode(0));
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
    assert!(snap.episode(id).is_some(), "the newest episode is kept");

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
    let (code, out, err) = run(&["vacuum", d_s, "--older-than", "0s", "--json"]);
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
