//! A writer process commits in a loop with retention on (FIFO `--max-transitions`, `--keep-versions
//! 2`, a short `--retention-grace`) while reader processes loop `verify`, `sample`, `info` and
//! `sql` over the same dataset: no reader may fail. Before the grace period, retention deleted
//! files at once and `verify` failed in about half its runs.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::common::bin;

fn writer_round(d: &Path) -> std::process::Child {
    bin()
        .args([
            "demo",
            d.to_str().unwrap(),
            "--append",
            "--transitions",
            "3000",
            "--mean-episode-len",
            "30",
            "--commit-every",
            "10",
            "--segment-size",
            "16KiB",
            "--max-transitions",
            "6000",
            "--keep-versions",
            "2",
            "--retention-grace",
            "2s",
            "--json",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn readers_never_fail_while_a_writer_commits_with_retention() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("live");
    let ds = d.to_str().unwrap().to_string();
    let out = bin()
        .args([
            "demo",
            &ds,
            "--transitions",
            "3000",
            "--mean-episode-len",
            "30",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let run_for = Duration::from_secs(8);
    let readers: Vec<Vec<String>> = vec![
        vec!["verify".into(), ds.clone(), "--json".into()],
        vec![
            "sample".into(),
            ds.clone(),
            "--slice-len".into(),
            "8".into(),
            "--num-slices".into(),
            "16".into(),
            "--json".into(),
        ],
        vec!["info".into(), ds.clone(), "--json".into()],
        #[cfg(feature = "sql")]
        vec![
            "sql".into(),
            ds.clone(),
            "SELECT count(*), sum(reward) FROM transitions".into(),
        ],
    ];
    let (failures, runs, commits) = std::thread::scope(|s| {
        let writer = s.spawn(|| {
            let start = Instant::now();
            let mut rounds = 0;
            while start.elapsed() < run_for {
                let out = writer_round(&d).wait_with_output().unwrap();
                assert!(
                    out.status.success(),
                    "writer: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                rounds += 1;
            }
            rounds
        });
        let handles: Vec<_> = readers
            .iter()
            .map(|args| {
                s.spawn(move || {
                    let start = Instant::now();
                    let (mut failures, mut runs) = (vec![], 0);
                    while start.elapsed() < run_for {
                        let out = bin().args(args).output().unwrap();
                        runs += 1;
                        if !out.status.success() {
                            failures.push(format!(
                                "{}: {}",
                                args[0],
                                String::from_utf8_lossy(&out.stderr)
                            ));
                        }
                    }
                    (failures, runs)
                })
            })
            .collect();
        let mut failures = vec![];
        let mut runs = 0;
        for h in handles {
            let (f, r) = h.join().unwrap();
            failures.extend(f);
            runs += r;
        }
        (failures, runs, writer.join().unwrap())
    });
    eprintln!("{runs} reader runs against {commits} writer rounds");
    assert!(
        runs >= 8 && commits >= 2,
        "{runs} reader runs, {commits} writer rounds"
    );
    assert!(
        failures.is_empty(),
        "{} failures: {:#?}",
        failures.len(),
        failures
    );
    // Retention did run: old versions were removed once out of their grace period.
    let versions = trajstore::Dataset::open(&d).unwrap().versions().unwrap();
    assert!(versions.first() > Some(&1), "{versions:?}");
}
