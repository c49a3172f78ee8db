//! dopamine's DQN Replay layout (`src/ingest/source/dqn.rs`): fixtures written at test time by
//! `scripts/dqn_replay_fixture.py` (NumPy + gzip, following `OutOfGraphReplayBuffer.save` and
//! the padding of `add`; a Python script rather than Rust so that the bytes are NumPy's own
//! `np.save` output inside Python's `gzip`, as dopamine writes them) ingest with the padding
//! removed and the episodes, lengths, returns, flags, actions and frames of the source; damaged
//! inputs are named errors.

use std::path::Path;

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::Int64Type;
use serde_json::Value;
use trajstore::frames::FrameCodec;
use trajstore::ingest::{DqnOptions, ingest_dqn};
use trajstore::{Dataset, Error, WriterOptions};

use crate::common::python_with;

/// Writes the fixture into `dir` with `args`; `None` (skipped) without a Python with NumPy.
pub fn fixture(dir: &Path, args: &[&str]) -> Option<Value> {
    let py = python_with("numpy", "the DQN Replay fixture")?;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/dqn_replay_fixture.py");
    let out = std::process::Command::new(py)
        .arg(script)
        .arg(dir)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(serde_json::from_slice(&std::fs::read(dir.join("expected.json")).unwrap()).unwrap())
}

fn options(codec: FrameCodec) -> DqnOptions {
    let mut o = DqnOptions::default();
    o.frame_codec = codec;
    o
}

/// Per episode: (length, return, terminated, truncated, crc32 of the frames, actions).
type Summary = (u64, f64, bool, bool, u32, Vec<i64>);

fn summaries(ds: &Dataset) -> Vec<Summary> {
    let snap = ds.snapshot().unwrap();
    let col = snap.frame_column("observation").unwrap();
    let mut dec = col.decoder().unwrap();
    let mut out = vec![];
    for seg in snap.segments() {
        let t = seg.episode_table();
        for i in 0..t.len() {
            let (start, len) = (t.row_starts()[i], t.lengths()[i]);
            let run = seg.frames("observation", start, len as usize).unwrap();
            let mut h = crc32fast::Hasher::new();
            let mut buf = vec![0u8; dec.frame_len()];
            for r in 0..run.len() {
                dec.decode_into(run.frame(r).unwrap(), &mut buf).unwrap();
                h.update(&buf);
            }
            assert!(
                t.final_frame(i).is_none(),
                "DQN Replay stores no final frame"
            );
            let rows: RecordBatch = seg.slice(start, len as usize).unwrap();
            let actions = rows
                .column_by_name("action")
                .unwrap()
                .as_primitive::<Int64Type>();
            out.push((
                len,
                t.returns()[i],
                t.terminated().value(i),
                t.truncated().value(i),
                h.finalize(),
                actions.values().to_vec(),
            ));
        }
    }
    out
}

fn expected(v: &Value) -> Vec<Summary> {
    v["episodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["length"].as_u64().unwrap(),
                e["return"].as_f64().unwrap(),
                e["terminated"].as_bool().unwrap(),
                e["truncated"].as_bool().unwrap(),
                e["crc32"].as_u64().unwrap() as u32,
                e["actions"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|a| a.as_i64().unwrap())
                    .collect(),
            )
        })
        .collect()
}

#[test]
fn a_dqn_replay_directory_ingests_without_padding_with_the_source_episodes() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("Pong/1/replay_logs");
    let Some(all) = fixture(&input, &[]) else {
        return;
    };
    let want = expected(&all);
    let entries = all["saves"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .as_u64()
        .unwrap();
    for codec in [FrameCodec::ZstdDict, FrameCodec::Zstd, FrameCodec::None] {
        let out = dir.path().join(format!("ds-{codec}"));
        // The run's directory (parent of replay_logs/) is accepted too.
        let report = ingest_dqn(
            input.parent().unwrap(),
            &out,
            &options(codec),
            WriterOptions::default(),
        )
        .unwrap();
        assert_eq!(report.checkpoints, [0, 1, 2]);
        let ds = Dataset::open(&out).unwrap();
        let got = summaries(&ds);
        assert_eq!(got.len(), want.len(), "{codec}");
        assert_eq!(got, want, "{codec}");
        assert_eq!(report.rows, want.iter().map(|e| e.0).sum::<u64>());
        assert_eq!(report.episodes, want.len() as u64);
        // Every entry ever added is a step or padding (stack_size - 1 = 3 zero entries before
        // each episode); the third checkpoint's first half was already read from the second.
        assert_eq!(report.padding + report.rows, entries);
        assert!(report.padding >= 3 * (want.len() as u64 - 1));
        assert_eq!(report.overlap, 300);
        assert_eq!(report.skipped, 0);
        // Only the last episode is truncated.
        assert!(want[..want.len() - 1].iter().all(|e| e.2 && !e.3));
    }
}

#[test]
fn a_gap_between_checkpoints_cuts_the_running_episode_and_skips_to_the_next_start() {
    let dir = tempfile::tempdir().unwrap();
    let Some(all) = fixture(dir.path(), &[]) else {
        return;
    };
    let mut o = options(FrameCodec::Zstd);
    o.checkpoints = Some(vec![0, 2]);
    o.frame_level = Some(7);
    let out = dir.path().join("ds");
    let report = ingest_dqn(dir.path(), &out, &o, WriterOptions::default()).unwrap();
    assert!(report.skipped > 0);
    let snap = Dataset::open(&out).unwrap().snapshot().unwrap();
    assert_eq!(snap.frame_column("observation").unwrap().spec.level, 7);
    let got = summaries(&Dataset::open(&out).unwrap());
    let want = expected(&all);
    // Episodes wholly inside checkpoint 0 come first, unchanged; the one running at its end is
    // cut (truncated, a prefix of the source episode).
    let k = got.iter().position(|e| e.3).unwrap();
    assert_eq!(got[..k], want[..k]);
    assert_eq!(got[k].5, want[k].5[..got[k].0 as usize]);
    // After the gap, the episodes are the source's last ones.
    let tail = got.len() - k - 1;
    assert_eq!(got[k + 1..], want[want.len() - tail..]);
}

#[test]
fn a_wrong_stack_size_and_damaged_files_are_named_errors() {
    let dir = tempfile::tempdir().unwrap();
    let Some(_) = fixture(dir.path(), &["--capacity", "200", "--shape", "8", "8"]) else {
        return;
    };
    let out = dir.path().join("ds");
    let mut o = options(FrameCodec::Zstd);
    o.stack_size = 6;
    let e = ingest_dqn(dir.path(), &out, &o, WriterOptions::default()).unwrap_err();
    assert!(
        matches!(&e, Error::InvalidData { .. }) && e.to_string().contains("padding"),
        "{e}"
    );
    assert!(
        !out.exists(),
        "a failed ingest removes the dataset it created"
    );
    let obs = dir.path().join("$store$_observation_ckpt.1.gz");
    let good = std::fs::read(&obs).unwrap();
    for bad in [good[..good.len() / 2].to_vec(), {
        let mut b = good.clone();
        let m = b.len() / 2;
        b[m] ^= 0xFF;
        b
    }] {
        std::fs::write(&obs, &bad).unwrap();
        let e = ingest_dqn(
            dir.path(),
            &out,
            &options(FrameCodec::Zstd),
            WriterOptions::default(),
        )
        .unwrap_err();
        assert!(
            matches!(&e, Error::InvalidData { input: Some(i), .. } if i.contains("observation_ckpt.1")),
            "{e}"
        );
    }
}

/// Rewrites the `.npy` header inside the gzipped `path`: its first `from` becomes `to`.
fn edit_header(path: &Path, from: &str, to: &str) {
    use std::io::{Read, Write};
    let mut npy = vec![];
    flate2::read::GzDecoder::new(std::fs::File::open(path).unwrap())
        .read_to_end(&mut npy)
        .unwrap();
    let end = 10 + u16::from_le_bytes([npy[8], npy[9]]) as usize;
    let head = String::from_utf8(npy[10..end].to_vec()).unwrap();
    assert!(head.contains(from), "{head}");
    let head = head.replacen(from, to, 1);
    let mut e = flate2::write::GzEncoder::new(vec![], flate2::Compression::fast());
    e.write_all(&npy[..8]).unwrap();
    e.write_all(&(head.len() as u16).to_le_bytes()).unwrap();
    e.write_all(head.as_bytes()).unwrap();
    e.write_all(&npy[end..]).unwrap();
    std::fs::write(path, e.finish().unwrap()).unwrap();
}

#[test]
fn shapes_that_overflow_or_claim_more_than_the_stream_holds_are_named_errors() {
    // Found by the mutation test: a product of dimensions that overflows, and a small array
    // whose header claims 2^64 entries (allocated before reading), panicked.
    let dir = tempfile::tempdir().unwrap();
    let pristine = dir.path().join("pristine");
    let Some(_) = fixture(&pristine, &["--capacity", "200", "--shape", "8", "8"]) else {
        return;
    };
    let huge = "18446744073709551615";
    let cases = [
        ("$store$_observation_ckpt.0.gz", "8,", format!("{huge},")),
        ("$store$_observation_ckpt.1.gz", "8,", "4294967296,".into()),
        ("$store$_terminal_ckpt.1.gz", "200", huge.into()),
        ("$store$_action_ckpt.2.gz", "200", "2000000000".into()),
    ];
    for (i, (name, from, to)) in cases.iter().enumerate() {
        let input = dir.path().join(format!("case-{i}"));
        crate::common::copy_tree(&pristine, &input);
        edit_header(&input.join(name), from, to);
        let out = dir.path().join(format!("ds-{i}"));
        let r = std::panic::catch_unwind(|| {
            ingest_dqn(
                &input,
                &out,
                &options(FrameCodec::Zstd),
                WriterOptions::default(),
            )
        });
        let e = r
            .unwrap_or_else(|_| panic!("{name} with {to}: panicked"))
            .unwrap_err();
        let named = matches!(&e, Error::InvalidData { input: Some(p), .. } if p.contains(name))
            || matches!(&e, Error::SchemaMismatch { .. }) && e.to_string().contains(name);
        assert!(named, "{name} with {to}: {e}");
    }
}
