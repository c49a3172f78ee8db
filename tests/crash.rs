//! Crash consistency: a real writer process is killed at random points and at every named crash
//! point; the dataset must then open at a whole committed version that passes `verify`.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use trajstore::{Dataset, WriterOptions};

const BIN: &str = env!("CARGO_BIN_EXE_trajstore");

fn demo(dataset: &Path, seed: u64, append: bool, transitions: u64) -> Command {
    let mut c = Command::new(BIN);
    c.arg("demo")
        .arg(dataset)
        .args([
            "--transitions",
            &transitions.to_string(),
            "--obs-dim",
            "4",
            "--act-dim",
            "2",
        ])
        .args([
            "--mean-episode-len",
            "40",
            "--commit-every",
            "25",
            "--segment-size",
            "48KiB",
        ])
        .args(["--seed", &seed.to_string(), "--json"])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if append {
        c.arg("--append");
    }
    c
}

/// Opens the newest version, checks it completely, and returns (version, transitions).
fn check_whole(dataset: &Path) -> (u64, u64) {
    let ds = Dataset::open(dataset).expect("dataset opens after a crash");
    let snap = ds.snapshot().expect("newest version maps");
    trajstore::store::verify::verify(&snap, |_| {}).expect("newest version verifies");
    let idx = snap.episodes();
    assert_eq!(idx.num_rows(), snap.num_transitions());
    assert_eq!(
        idx.first_id() + idx.len() as u64,
        snap.manifest().next_episode_id
    );
    (snap.version(), snap.num_transitions())
}

fn leftovers(dataset: &Path) -> Vec<String> {
    let mut names = vec![];
    for dir in ["segments", "_versions"] {
        for e in std::fs::read_dir(dataset.join(dir)).unwrap() {
            names.push(e.unwrap().file_name().to_string_lossy().into_owned());
        }
    }
    names.retain(|n| n.ends_with(".tmp"));
    names
}

/// Waits (up to 120 s, while `child` runs) until the dataset has a version newer than
/// `version` (`committed`), or a temporary file with bytes in it (the writer is mid-segment or
/// mid-commit). Returns whether it saw that.
fn wait_for_progress(
    d: &Path,
    version: u64,
    committed: bool,
    child: &mut std::process::Child,
) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while std::time::Instant::now() < deadline {
        let progressed = if committed {
            Dataset::open(d)
                .and_then(|ds| ds.versions())
                .is_ok_and(|v| v.last().is_some_and(|&l| l > version))
        } else {
            ["segments", "_versions"].iter().any(|dir| {
                std::fs::read_dir(d.join(dir)).is_ok_and(|rd| {
                    rd.flatten().any(|e| {
                        e.file_name().to_string_lossy().ends_with(".tmp")
                            && e.metadata().is_ok_and(|m| m.len() > 0)
                    })
                })
            })
        };
        if progressed {
            return true;
        }
        if child.try_wait().ok().flatten().is_some() {
            return true; // it finished: nothing left to interrupt
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    false
}

#[test]
fn killed_writers_leave_a_whole_committed_version() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("crash.trajstore");
    let status = demo(&d, 0, false, 2000).status().unwrap();
    assert!(status.success());
    let (mut version, mut rows) = check_whole(&d);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(2026);
    let mut advanced = 0;
    for round in 1..=24u64 {
        let mut child = demo(&d, round, true, 300_000).spawn().unwrap();
        // Kill at a random point after evidence of progress, never after a fixed time (a slow
        // or busy machine may not have started writing yet): odd rounds once this writer has
        // committed a version (the kill then lands in a later commit), even rounds once it has
        // written bytes of an uncommitted file.
        let committed = round % 2 == 1;
        let seen = wait_for_progress(&d, version, committed, &mut child);
        std::thread::sleep(Duration::from_micros(rng.random_range(0..30_000)));
        let _ = child.kill(); // SIGKILL: no destructor, no flush, lock released by the kernel
        child.wait().unwrap();
        assert!(seen, "round {round}: the writer made no progress in 120 s");
        let (v, n) = check_whole(&d);
        assert!(
            v >= version && n >= rows,
            "round {round}: went back from v{version} to v{v}"
        );
        advanced += (v > version) as usize;
        (version, rows) = (v, n);
    }
    assert!(advanced > 0, "no round got to commit anything; kill later");
    // The next writer takes the lock and removes what the killed ones left behind.
    let ds = Dataset::open(&d).unwrap();
    let w = ds.writer(WriterOptions::default()).unwrap();
    assert!(leftovers(&d).is_empty(), "{:?}", leftovers(&d));
    let referenced: std::collections::HashSet<String> = ds
        .versions()
        .unwrap()
        .iter()
        .flat_map(|&v| trajstore::store::manifest::read(&d, v).unwrap().segments)
        .flat_map(|s| [s.path, s.episodes_path])
        .collect();
    for e in std::fs::read_dir(d.join("segments")).unwrap() {
        let name = format!("segments/{}", e.unwrap().file_name().to_string_lossy());
        assert!(
            referenced.contains(&name),
            "unreferenced file {name} survived cleanup"
        );
    }
    drop(w);
    check_whole(&d);
}

#[test]
fn every_crash_point_keeps_the_previous_or_the_new_version() {
    let dir = tempfile::tempdir().unwrap();
    for (point, publishes) in [
        ("segment-before-rename", false),
        ("commit-before-manifest", false),
        ("manifest-before-rename", false),
        ("manifest-after-rename", true),
    ] {
        let d = dir.path().join(point);
        assert!(demo(&d, 0, false, 3000).status().unwrap().success());
        let (v0, n0) = check_whole(&d);
        let status = demo(&d, 1, true, 5000)
            .env("TRAJSTORE_CRASH_AT", point)
            .status()
            .unwrap();
        assert!(
            !status.success(),
            "{point}: the process should have crashed"
        );
        let (v1, n1) = check_whole(&d);
        if publishes {
            assert_eq!(v1, v0 + 1, "{point}");
            assert!(n1 > n0);
        } else {
            assert_eq!((v1, n1), (v0, n0), "{point}");
        }
        // And the dataset stays writable.
        assert!(demo(&d, 2, true, 1000).status().unwrap().success());
        let (v2, n2) = check_whole(&d);
        assert!(v2 > v1 && n2 == n1 + 1000, "{point}");
    }
}
