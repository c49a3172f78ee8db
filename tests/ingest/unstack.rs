//! `--unstack K` (`IngestOptions::unstack`, `src/ingest/unstack.rs`): NumPy arrays of Atari-style
//! frame stacks (`[N, 84, 84, 4]` channels last, `[N, 4, 84, 84]` channels first; episodes padded
//! by repeating their first frame or with zeros) ingest as one frame per step, the newest of each
//! stack, equal to the frames the stacks were built from; the gather's `frame_stack=4` gives the
//! stacks back; stacks that do not overlap, a first stack that is not padding, and shapes that
//! are not stacks of K are named errors; the CLI's `--unstack` and its help. And the zstd level a
//! new dataset's frames are written at (`--frame-level`, `IngestOptions::frame_level`), which an
//! append keeps.

use std::path::{Path, PathBuf};

use trajstore::ingest::{IngestOptions, InputFormat, ingest};
use trajstore::{Dataset, Error, FrameStack, Gatherer, SliceRef, Snapshot};

use super::numpy::write_npy;
use crate::common::{run_cli, small_segments};
use crate::store::frames::frame;

const K: usize = 4;
const SHAPE: [usize; 2] = [84, 84];
const F: usize = 84 * 84;
/// Episode lengths, and whether each is padded with zeros (else by repeating its first frame).
const EPISODES: [(usize, bool); 4] = [(23, false), (1, false), (40, true), (17, false)];

/// The frames of episode `e`, one per step.
fn frames(e: usize) -> Vec<Vec<u8>> {
    (0..EPISODES[e].0)
        .map(|t| frame(&SHAPE, e * 7, t))
        .collect()
}

/// The stack of step `t` of episode `e`: frames t-3..t, oldest first, padded.
fn stack(e: usize, t: usize) -> Vec<Vec<u8>> {
    let f = frames(e);
    (0..K)
        .map(|j| match (t + j).checked_sub(K - 1) {
            Some(i) => f[i].clone(),
            None if EPISODES[e].1 => vec![0u8; F],
            None => f[0].clone(),
        })
        .collect()
}

/// A directory of `.npy` files: observations (stacks, channels last or first), actions,
/// rewards, terminals. `edit` may change the stacks first (episode, step, stack).
fn arrays(root: &Path, last: bool, edit: impl Fn(usize, usize, &mut Vec<Vec<u8>>)) -> PathBuf {
    let d = root.join(if last { "last" } else { "first" });
    std::fs::create_dir_all(&d).unwrap();
    let (mut obs, mut acts, mut terms) = (vec![], vec![], vec![]);
    for (e, &(len, _)) in EPISODES.iter().enumerate() {
        for t in 0..len {
            let mut s = stack(e, t);
            edit(e, t, &mut s);
            if last {
                obs.extend((0..F).flat_map(|p| (0..K).map(|j| s[j][p]).collect::<Vec<_>>()));
            } else {
                obs.extend(s.concat());
            }
            acts.extend(((e * 100 + t) as i64).to_le_bytes());
            terms.push(u8::from(t + 1 == len));
        }
    }
    let n = terms.len();
    let shape = if last { [n, 84, 84, K] } else { [n, K, 84, 84] };
    write_npy(&d.join("observations.npy"), "|u1", false, &shape, &obs);
    write_npy(&d.join("actions.npy"), "<i8", false, &[n], &acts);
    let rewards: Vec<u8> = (0..n).flat_map(|i| (i as f32).to_le_bytes()).collect();
    write_npy(&d.join("rewards.npy"), "<f4", false, &[n], &rewards);
    write_npy(&d.join("terminals.npy"), "|b1", false, &[n], &terms);
    d
}

fn ingest_unstacked(input: &Path, out: &Path, k: usize) -> trajstore::Result<Snapshot> {
    let opts = IngestOptions::default().with_unstack(Some(k));
    ingest(input, InputFormat::Numpy, out, &opts, small_segments())?;
    Dataset::open(out)?.snapshot()
}

/// Every stored frame, decoded, per episode.
fn stored(snap: &Snapshot) -> Vec<Vec<Vec<u8>>> {
    let mut dec = snap.frame_column("observation").unwrap().decoder().unwrap();
    let mut out = vec![];
    for seg in snap.segments() {
        let t = seg.episode_table();
        for i in 0..t.len() {
            let run = seg
                .frames("observation", t.row_starts()[i], t.lengths()[i] as usize)
                .unwrap();
            out.push(
                (0..run.len())
                    .map(|r| {
                        let mut buf = vec![0u8; F];
                        dec.decode_into(run.frame(r).unwrap(), &mut buf).unwrap();
                        buf
                    })
                    .collect(),
            );
        }
    }
    out
}

#[test]
fn stacks_channels_last_and_first_become_one_frame_per_step() {
    let dir = tempfile::tempdir().unwrap();
    for last in [true, false] {
        let input = arrays(dir.path(), last, |_, _, _| {});
        let out = dir.path().join(format!("ds-{last}"));
        let snap = ingest_unstacked(&input, &out, K).unwrap();
        let col = snap.frame_column("observation").expect("a frame column");
        assert_eq!(col.spec.shape, SHAPE, "one frame, not a stack");
        let want: Vec<_> = (0..EPISODES.len()).map(frames).collect();
        assert_eq!(stored(&snap), want, "channels last: {last}");
        let lengths: Vec<u64> = EPISODES.iter().map(|e| e.0 as u64).collect();
        assert_eq!(snap.num_transitions(), lengths.iter().sum::<u64>());

        // The gather's stacks of 4 (repeat padding) are the input's stacks, where the input
        // repeated its first frame.
        let stack4 = FrameStack::new(K).unwrap();
        let g = Gatherer::with_frame_stack(&snap, &["observation"], Some(stack4)).unwrap();
        for (e, &(len, zeros)) in EPISODES.iter().enumerate() {
            if zeros {
                continue;
            }
            let plan = [SliceRef {
                episode: e as u32,
                start: 0,
                len: len as u32,
            }];
            let mut b = trajstore::Batch::default();
            g.gather(&plan, &mut b).unwrap();
            let want: Vec<u8> = (0..len).flat_map(|t| stack(e, t).concat()).collect();
            assert!(
                b.columns[0].data.as_slice() == want.as_slice(),
                "episode {e}: [L, K, H, W]"
            );
        }
    }
}

#[test]
fn stacks_that_do_not_overlap_and_shapes_that_are_not_stacks_are_named_errors() {
    let dir = tempfile::tempdir().unwrap();
    // Episode 2, step 9: one older frame replaced (a stack that does not continue step 8's).
    // Input row = 23 + 1 + 9 = 33.
    for last in [true, false] {
        let input = arrays(dir.path(), last, |e, t, s| {
            if (e, t) == (2, 9) {
                s[1] = frame(&SHAPE, 99, 0);
            }
        });
        let e = ingest_unstacked(&input, &dir.path().join("x"), K).unwrap_err();
        assert!(matches!(e, Error::InvalidData { .. }), "{e:?}");
        let text = e.to_string();
        assert!(
            text.contains("input row 33") && text.contains("does not continue"),
            "{text}"
        );
        assert!(!dir.path().join("x").exists(), "nothing is left");
    }
    // Episode 3's first stack holds real older frames (an episode cut from a longer run).
    let input = arrays(dir.path(), true, |e, t, s| {
        if (e, t) == (3, 0) {
            s[0] = frame(&SHAPE, 5, 3);
        }
    });
    let e = ingest_unstacked(&input, &dir.path().join("x"), K).unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("input row 64") && text.contains("first step"),
        "{text}"
    );
    // K that is not the stack axis, and K = 1.
    let input = arrays(dir.path(), true, |_, _, _| {});
    for (k, needle) in [(3, "not a stack of 3"), (1, "at least 2")] {
        let e = ingest_unstacked(&input, &dir.path().join("x"), k).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidArgument { .. }) && e.to_string().contains(needle),
            "{e}"
        );
    }
}

#[test]
fn the_cli_unstacks_and_its_help_says_how() {
    let dir = tempfile::tempdir().unwrap();
    let input = arrays(dir.path(), false, |_, _, _| {});
    let out = dir.path().join("ds");
    let (code, _, err) = run_cli(&[
        "ingest",
        input.to_str().unwrap(),
        out.to_str().unwrap(),
        "--unstack",
        "4",
    ]);
    assert_eq!(code, 0, "{err}");
    let snap = Dataset::open(&out).unwrap().snapshot().unwrap();
    assert_eq!(stored(&snap)[2], frames(2));
    let (code, help, _) = run_cli(&["ingest", "--help"]);
    assert_eq!(code, 0);
    for needle in ["--unstack <K>", "[H, W, K]", "newest", "--frame-stack K"] {
        assert!(help.contains(needle), "{needle:?} not in the help:\n{help}");
    }
}

#[test]
fn a_new_dataset_takes_the_frame_level_and_appends_keep_it() {
    let dir = tempfile::tempdir().unwrap();
    let input = arrays(dir.path(), true, |_, _, _| {});
    let level = |ds: &Path| {
        let snap = Dataset::open(ds).unwrap().snapshot().unwrap();
        snap.frame_column("observation").unwrap().spec.level
    };
    let all: Vec<Vec<Vec<u8>>> = (0..EPISODES.len()).map(frames).collect();
    let out = dir.path().join("ds");
    let opts = IngestOptions::default().with_unstack(Some(K));
    let at = |l: i32| opts.clone().with_frame_level(Some(l));
    ingest(&input, InputFormat::Numpy, &out, &at(19), small_segments()).unwrap();
    assert_eq!(level(&out), 19);
    assert_eq!(
        stored(&Dataset::open(&out).unwrap().snapshot().unwrap()),
        all
    );
    // Another level on an append is refused before anything is written.
    let versions = Dataset::open(&out).unwrap().versions().unwrap();
    let e = ingest(&input, InputFormat::Numpy, &out, &at(3), small_segments()).unwrap_err();
    assert!(
        matches!(&e, Error::InvalidArgument { argument: Some(a), .. } if a == "frame_level")
            && e.to_string().contains("zstd level 19"),
        "{e}"
    );
    assert_eq!(Dataset::open(&out).unwrap().versions().unwrap(), versions);
    // Without a level (or with the same) an append compresses at the dataset's own.
    ingest(&input, InputFormat::Numpy, &out, &opts, small_segments()).unwrap();
    ingest(&input, InputFormat::Numpy, &out, &at(19), small_segments()).unwrap();
    assert_eq!(level(&out), 19);
    let thrice: Vec<_> = (0..3).flat_map(|_| all.iter().cloned()).collect();
    assert_eq!(
        stored(&Dataset::open(&out).unwrap().snapshot().unwrap()),
        thrice
    );
    // A new dataset without a level: the default.
    let fresh = dir.path().join("fresh");
    ingest(&input, InputFormat::Numpy, &fresh, &opts, small_segments()).unwrap();
    assert_eq!(level(&fresh), trajstore::frames::DEFAULT_LEVEL);

    // The CLI: the range is checked, a level without a frame column is refused, and a level
    // given is the dataset's.
    let cli = |out: &str, extra: &[&str]| {
        let out = dir.path().join(out);
        let mut args = vec!["ingest", input.to_str().unwrap(), out.to_str().unwrap()];
        args.extend(["--unstack", "4"]);
        args.extend(extra);
        (run_cli(&args), out)
    };
    let ((code, _, err), out) = cli("zero", &["--frame-level", "0"]);
    assert!(
        code != 0 && err.contains("--frame-level") && err.contains("1..=22"),
        "{err}"
    );
    assert!(!out.exists(), "nothing is created");
    let ((code, _, err), out) = cli("tensor", &["--frame-level", "9", "--keep-tensor"]);
    assert!(code != 0 && err.contains("no frame column"), "{err}");
    assert!(!out.exists(), "nothing is created");
    let ((code, _, err), out) = cli("nine", &["--frame-level", "9"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(level(&out), 9);
    let (code, info, err) = run_cli(&["info", out.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(info.contains("zstd-dict level 9 [84, 84]"), "{info}");
    let (_, help, _) = run_cli(&["ingest", "--help"]);
    assert!(help.contains("--frame-level <LEVEL>"), "{help}");
}
