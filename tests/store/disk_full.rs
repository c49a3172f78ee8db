//! A full disk at many write points: each round mounts a small tmpfs of another size, so the
//! writer runs out of space at a different point (a segment, an episode table, a manifest, a
//! directory sync), and checks that the error is an I/O error, that the previous version still
//! verifies, and that the next writer removes the leftover temporary files. Needs to mount a tmpfs
//! (root); skipped with a note where it cannot.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::TestData;
use trajstore::{Dataset, Error, WriterOptions};

struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, kib: u64) -> Option<Self> {
        std::fs::create_dir_all(at).ok()?;
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={kib}k"), "tmpfs"])
            .arg(at)
            .output()
            .ok()?
            .status
            .success();
        ok.then(|| Tmpfs(at.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

fn tmp_files(root: &Path) -> Vec<PathBuf> {
    let mut out = vec![];
    for sub in ["segments", "_versions"] {
        if let Ok(rd) = std::fs::read_dir(root.join(sub)) {
            for e in rd.flatten() {
                if e.file_name()
                    .to_string_lossy()
                    .ends_with(trajstore::format::TMP_SUFFIX)
                {
                    out.push(e.path());
                }
            }
        }
    }
    out
}

#[test]
fn a_full_disk_at_any_write_point_keeps_the_previous_version() {
    let dir = tempfile::tempdir().unwrap();
    let data = TestData::new().obs_dim(16).act_dim(4).seed(3);
    let spec = data.spec();
    let mut failures = 0;
    for round in 0..10u64 {
        let at = dir.path().join(format!("fs{round}"));
        let Some(_fs) = Tmpfs::mount(&at, 600 + 37 * round) else {
            eprintln!("note: skipped: cannot mount a tmpfs here (needs root)");
            return;
        };
        let root = at.join("d");
        let ds = match Dataset::create(&root, &data.schema()) {
            Ok(ds) => ds,
            Err(e) => panic!("round {round}: even an empty dataset does not fit: {e}"),
        };
        let opts = WriterOptions::default().with_segment_bytes(48 << 10);
        let mut w = ds.writer(opts.clone()).unwrap();
        let mut committed = ds.snapshot().unwrap().version();
        let err = (0..10_000u64)
            .find_map(|i| {
                let (b, e) = spec.episode(i, 20 + (i * 7 + round) % 40);
                if let Err(e) = w.append_episode(&b, e) {
                    return Some(e);
                }
                if i % 3 == 2 {
                    match w.commit() {
                        Ok(v) => committed = v,
                        Err(e) => return Some(e),
                    }
                }
                None
            })
            .expect("the filesystem fills up");
        failures += 1;
        assert!(
            matches!(err, Error::Io { .. } | Error::Arrow(_)),
            "round {round}: {err}"
        );
        drop(w);
        // The newest committed version is the one before the failure, and it verifies.
        let snap = Dataset::open(&root).unwrap().snapshot().unwrap();
        assert_eq!(snap.version(), committed, "round {round}");
        trajstore::store::verify::verify(&snap, |_| {}).unwrap();
        // The next writer removes what the failed one left.
        let w = ds.writer(opts).unwrap();
        assert!(
            tmp_files(&root).is_empty(),
            "round {round}: {:?}",
            tmp_files(&root)
        );
        drop(w);
    }
    assert_eq!(failures, 10);
}

/// The CLI on a full disk: one error line that says the OS cause once and which version the
/// dataset keeps; the kept version verifies.
#[test]
fn a_full_disk_under_the_cli_says_so_once_and_names_the_kept_version() {
    let dir = tempfile::tempdir().unwrap();
    let at = dir.path().join("fs");
    let Some(_fs) = Tmpfs::mount(&at, 900) else {
        eprintln!("note: skipped: cannot mount a tmpfs here (needs root)");
        return;
    };
    let d = at.join("d");
    let out = crate::common::bin()
        .args([
            "demo",
            d.to_str().unwrap(),
            "--transitions",
            "200000",
            "--obs-dim",
            "8",
        ])
        .args([
            "--mean-episode-len",
            "50",
            "--commit-every",
            "5",
            "--segment-size",
            "64KiB",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("error: "))
        .expect("an error line");
    assert_eq!(line.matches("No space left on device").count(), 1, "{line}");
    let snap = Dataset::open(&d).unwrap().snapshot().unwrap();
    assert!(
        line.contains(&format!("keeps version {}", snap.version())),
        "{line}"
    );
    trajstore::store::verify::verify(&snap, |_| {}).unwrap();
}
