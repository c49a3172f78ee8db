//! Issue 19, items 8-10: corrupt input that panicked inside a decoder, sizes from arguments that
//! overflowed or aborted on an allocation, and arguments that were silently changed. One
//! regression test each: the library refuses with an error that names the file or the argument,
//! and the CLI with a usage error or a one-line message, never a panic or an abort.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::common::{TestData, assert_invalid_argument, err_of};
use arrow::array::{ArrayRef, BooleanArray, FixedSizeListArray, Float32Array, RecordBatch};
use arrow::datatypes::{DataType, Field};
use trajstore::ingest::{IngestOptions, InputFormat, infer_schema, ingest};
use trajstore::{
    BatchSource, BoundaryPolicy, EpisodeIndex, EpisodeSampler, EpochSampler, Error, GatherInto,
    Gatherer, Loader, LoaderOptions, LoaderSpec, PrioritizedSampler, SamplerKind, SamplerSpec,
    SliceIndex, SliceRef, SliceSampler, WriterOptions,
};

/// Runs the CLI; (exit code, or `None` for a signal; stderr). The batch limit is fixed at 64 GiB
/// so that the refusals below do not depend on this machine's memory.
fn cli(args: &[&str]) -> (Option<i32>, String) {
    let out = crate::common::bin()
        .args(args)
        .env(
            trajstore::sample::MAX_BATCH_BYTES_ENV,
            (64u64 << 30).to_string(),
        )
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Asserts that a CLI run ended with `code` and one clean message: no panic, no backtrace note.
fn assert_clean_exit(run: &(Option<i32>, String), code: i32, needle: &str) {
    let (got, err) = run;
    assert_eq!(*got, Some(code), "{err}");
    assert!(!err.contains("panicked at"), "{err}");
    assert!(!err.contains("RUST_BACKTRACE"), "{err}");
    assert!(err.contains(needle), "{needle:?} not in: {err}");
}

/// A small dataset for the CLI: 3-d observations, 2-d actions, 600 transitions.
fn dataset(dir: &Path) -> PathBuf {
    let d = dir.join("ds");
    TestData::new()
        .obs_dim(3)
        .act_dim(2)
        .transitions(600)
        .write(&d);
    d
}

/// A D4RL-style Parquet file of 50 rows with its `ARROW:schema` footer entry.
fn parquet_file(path: &Path) {
    let rows = 50;
    let fsl = |n: i32, v: Vec<f32>| -> ArrayRef {
        Arc::new(FixedSizeListArray::new(
            Arc::new(Field::new("item", DataType::Float32, false)),
            n,
            Arc::new(Float32Array::from(v)),
            None,
        ))
    };
    let batch = RecordBatch::try_from_iter([
        ("observations", fsl(3, vec![0.5; rows * 3])),
        ("actions", fsl(2, vec![0.25; rows * 2])),
        (
            "rewards",
            Arc::new(Float32Array::from(vec![1.0; rows])) as ArrayRef,
        ),
        (
            "terminals",
            Arc::new(BooleanArray::from(vec![false; rows])) as ArrayRef,
        ),
    ])
    .unwrap();
    let mut w =
        parquet::arrow::ArrowWriter::try_new(File::create(path).unwrap(), batch.schema(), None)
            .unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

/// The byte range of the base64 value of `ARROW:schema` in a Parquet file.
fn arrow_schema_base64(bytes: &[u8]) -> std::ops::Range<usize> {
    let key = bytes
        .windows(12)
        .position(|w| w == b"ARROW:schema")
        .expect("ARROW:schema in the footer");
    let b64 = |c: u8| c.is_ascii_alphanumeric() || c == b'+' || c == b'/';
    let start = (key + 12..bytes.len()).find(|&k| b64(bytes[k])).unwrap();
    let end = (start..bytes.len())
        .find(|&k| !b64(bytes[k]))
        .unwrap_or(bytes.len());
    start..end
}

// ------------------------------------------------------------------------------------------
// Item 8: a panic inside a decoder is an error naming the file, and prints no panic message.
// ------------------------------------------------------------------------------------------

#[test]
fn a_parquet_file_with_a_damaged_arrow_schema_is_an_error_naming_it_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.parquet");
    parquet_file(&good);
    let bytes = std::fs::read(&good).unwrap();
    let span = arrow_schema_base64(&bytes);
    let bad = dir.path().join("damaged.parquet");
    // Every base64 character of the schema changed to a few others: arrow-ipc panics on some
    // of them (`not implemented: Type <UNKNOWN 79>`, unsupported integer widths, ...).
    let mut decoder_panics = None;
    for at in span.clone() {
        for c in [b'A', b'T', b'/', b'z', b'9'] {
            if bytes[at] == c {
                continue;
            }
            let mut b = bytes.clone();
            b[at] = c;
            std::fs::write(&bad, &b).unwrap();
            let result = std::panic::catch_unwind(|| {
                infer_schema(&bad, InputFormat::Parquet, &IngestOptions::default())
            });
            let Ok(result) = result else {
                panic!("a changed ARROW:schema character at byte {at} panicked");
            };
            // A schema that still decodes may be refused for its columns (the mapping's
            // errors); one that does not is an error of the file.
            if let Err(e @ (Error::InvalidData { .. } | Error::Corrupt { .. })) = result {
                assert!(
                    e.to_string().contains("damaged.parquet"),
                    "byte {at} = {c}: {e}"
                );
                if e.to_string().contains("undecodable") && decoder_panics.is_none() {
                    decoder_panics = Some(b);
                }
            }
        }
    }
    // One that made the decoder panic (before the guard, a panic of the whole process): the
    // library's error and the CLI's message name the file, and no panic message is printed.
    let b = decoder_panics.expect("some damaged ARROW:schema makes arrow-ipc panic");
    std::fs::write(&bad, &b).unwrap();
    let out = dir.path().join("out");
    let e = ingest(
        &bad,
        InputFormat::Parquet,
        &out,
        &IngestOptions::default(),
        WriterOptions::default(),
    )
    .unwrap_err();
    assert!(
        matches!(e, Error::InvalidData { input: Some(ref i), .. } if i.contains("damaged.parquet")),
        "{e:?}"
    );
    assert!(!out.exists());
    let run = cli(&[
        "ingest",
        bad.to_str().unwrap(),
        out.to_str().unwrap(),
        "--terminated-col",
        "terminals",
    ]);
    assert_clean_exit(&run, 1, "damaged.parquet");
    assert!(run.1.contains("undecodable"), "{}", run.1);
}

#[test]
fn a_caught_panic_in_a_decoder_prints_nothing_but_the_error() {
    // An Arrow IPC stream whose schema message is damaged: the decoder panics on some of them;
    // the CLI prints the error only, without `thread 'main' panicked at` or a backtrace note.
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.parquet");
    parquet_file(&good);
    let bytes = std::fs::read(&good).unwrap();
    let span = arrow_schema_base64(&bytes);
    let bad = dir.path().join("quiet.parquet");
    let mut checked = 0;
    for at in span.step_by(7) {
        let mut b = bytes.clone();
        b[at] = if b[at] == b'T' { b'A' } else { b'T' };
        std::fs::write(&bad, &b).unwrap();
        let out = dir.path().join(format!("out{at}"));
        let (code, err) = cli(&["ingest", bad.to_str().unwrap(), out.to_str().unwrap()]);
        assert!(matches!(code, Some(0 | 1)), "{code:?}: {err}");
        assert!(!err.contains("panicked at"), "byte {at}: {err}");
        assert!(!err.contains("RUST_BACKTRACE"), "byte {at}: {err}");
        checked += 1;
    }
    assert!(checked > 5);
}

// ------------------------------------------------------------------------------------------
// Item 9: sizes from arguments are checked against what they cost.
// ------------------------------------------------------------------------------------------

#[test]
fn info_with_more_bins_than_lines_it_can_draw_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let d = dataset(dir.path());
    let d = d.to_str().unwrap();
    let run = cli(&["info", d, "--bins", "18446744073709551615"]);
    assert_clean_exit(&run, 2, "--bins");
    let run = cli(&["info", d, "--bins", "10001"]);
    assert_clean_exit(&run, 2, "--bins");
    // The limit itself and 0 (no histograms) work.
    assert_eq!(cli(&["info", d, "--bins", "10000"]).0, Some(0));
    assert_eq!(cli(&["info", d, "--bins", "0"]).0, Some(0));
}

#[test]
fn sample_of_a_batch_larger_than_memory_is_refused_naming_the_option() {
    let dir = tempfile::tempdir().unwrap();
    let d = dataset(dir.path());
    let d = d.to_str().unwrap();
    // 4 slices of 10^9 padded steps: 380 GiB of observations, actions and rewards (this aborted
    // on the allocation).
    let run = cli(&[
        "sample",
        d,
        "--policy",
        "pad",
        "--slice-len",
        "1000000000",
        "--num-slices",
        "4",
    ]);
    assert_clean_exit(&run, 1, "--slice-len");
    assert!(run.1.contains("limit"), "{}", run.1);
    // 10^12 slices (16 TiB of plan alone).
    let run = cli(&["sample", d, "--num-slices", "1000000000000"]);
    assert_clean_exit(&run, 1, "--num-slices");
    let run = cli(&["bench", d, "--num-slices", "1000000000000", "--iters", "1"]);
    assert_clean_exit(&run, 1, "--num-slices");
    // Zero is a usage error.
    assert_clean_exit(&cli(&["sample", d, "--num-slices", "0"]), 2, "--num-slices");
    assert_clean_exit(&cli(&["sample", d, "--slice-len", "0"]), 2, "--slice-len");
    // A batch that fits still samples.
    assert_eq!(
        cli(&["sample", d, "--slice-len", "8", "--num-slices", "4"]).0,
        Some(0)
    );
}

/// An episode index of `episodes` episodes of `len` steps each, without any data: samplers only
/// read lengths.
fn lengths_only(episodes: usize, len: u64) -> EpisodeIndex {
    let starts: Vec<u64> = (0..episodes as u64).map(|i| i * len).collect();
    let lengths = vec![len; episodes];
    EpisodeIndex::from_segments(0, [(&starts[..], &lengths[..])])
}

#[test]
fn samplers_refuse_batches_larger_than_memory_naming_the_argument() {
    let episodes = lengths_only(10, 1000);
    let index = |l: u32, p: BoundaryPolicy| Arc::new(SliceIndex::build(&episodes, l, p).unwrap());
    let huge = 1usize << 50; // 2^50 slices: 32 PiB of plan
    let e = err_of(SliceSampler::try_new(
        index(4, BoundaryPolicy::Strict),
        &episodes,
        &SamplerSpec::uniform(4, huge),
    ));
    assert_invalid_argument(&e, Some("num_slices"), "SliceSampler, 2^50 slices");
    assert!(e.to_string().contains("limit"), "{e}");
    // Long padded slices: 1000 slices of u32::MAX steps.
    let pad = BoundaryPolicy::Pad;
    let e = err_of(SliceSampler::try_new(
        index(u32::MAX, pad),
        &episodes,
        &SamplerSpec::uniform(u32::MAX, 1000).with_policy(pad),
    ));
    assert_invalid_argument(&e, Some("slice_len"), "SliceSampler, u32::MAX steps");
    // The options say so themselves, and from_batch_size checks them.
    let e = SamplerSpec::uniform(4, huge).validate().unwrap_err();
    assert_invalid_argument(&e, Some("num_slices"), "SamplerSpec::validate");
    let e = SamplerSpec::from_batch_size(SamplerKind::Uniform, usize::MAX - usize::MAX % 2, 2)
        .unwrap_err();
    assert_invalid_argument(&e, Some("num_slices"), "SamplerSpec::from_batch_size");
    assert!(SamplerSpec::uniform(64, 256).validate().is_ok());
    // Epochs, whole episodes and prioritized replay.
    let e = err_of(EpochSampler::windows(
        index(4, BoundaryPolicy::Strict),
        huge,
        0,
        false,
    ));
    assert_invalid_argument(&e, Some("num_slices"), "EpochSampler::windows");
    let e = err_of(EpochSampler::episodes(index(u32::MAX, pad), 1000, 0, false));
    assert_invalid_argument(&e, Some("slice_len"), "EpochSampler::episodes");
    let e = err_of(EpisodeSampler::try_new(&episodes, huge, 10, 0));
    assert_invalid_argument(&e, Some("num_episodes"), "EpisodeSampler, 2^50 episodes");
    let e = err_of(EpisodeSampler::try_new(&episodes, 1000, u32::MAX, 0));
    assert_invalid_argument(&e, Some("max_len"), "EpisodeSampler, u32::MAX steps");
    let e = err_of(PrioritizedSampler::try_new(
        index(4, BoundaryPolicy::Strict),
        huge,
        0.6,
        0,
    ));
    assert_invalid_argument(&e, Some("num_slices"), "PrioritizedSampler, 2^50 slices");
}

#[test]
fn a_sum_tree_larger_than_memory_is_refused() {
    // One episode of 2^42 steps: 2^42 windows, a sum tree of 64 TiB (this aborted).
    let episodes = lengths_only(1, 1 << 42);
    let index = Arc::new(SliceIndex::build(&episodes, 1, BoundaryPolicy::Strict).unwrap());
    let e = err_of(PrioritizedSampler::try_new(index, 4, 0.6, 0));
    assert_invalid_argument(&e, Some("index"), "PrioritizedSampler, 2^42 windows");
    assert!(e.to_string().contains("sum tree"), "{e}");
}

#[test]
fn gather_refuses_a_plan_larger_than_memory_before_allocating() {
    let dir = tempfile::tempdir().unwrap();
    let snap = TestData::new()
        .obs_dim(3)
        .act_dim(2)
        .episodes([30, 40])
        .snapshot(&dir.path().join("d"));
    let g = Gatherer::try_new(&snap, &["observation", "action", "reward"]).unwrap();
    // 1000 slices of u32::MAX steps: 60 TiB.
    let plan = vec![
        SliceRef {
            episode: 0,
            start: 0,
            len: u32::MAX,
        };
        1000
    ];
    let mut batch = trajstore::Batch::default();
    let e = g.gather(&plan, &mut batch).unwrap_err();
    assert_invalid_argument(&e, Some("plan"), "gather, 1000 x u32::MAX steps");
    assert!(batch.columns.iter().all(|c| c.data.is_empty()));
    // The check a caller can make before sampling: the batch's bytes, or which argument is at
    // fault.
    assert_eq!(
        g.batch_bytes(2, 3).unwrap(),
        // 2 x 3 steps of (3 + 2 + 1) float32 and 6 flag bytes, plus 32 bytes per slice.
        2 * 3 * (24 + 6) + 2 * 32
    );
    let e = g.batch_bytes(1 << 50, 1).unwrap_err();
    assert_invalid_argument(&e, Some("num_slices"), "batch_bytes, 2^50 slices");
    let e = g.batch_bytes(4, usize::MAX).unwrap_err();
    assert_invalid_argument(&e, Some("slice_len"), "batch_bytes, usize::MAX steps");
    // A slice whose start and length overflow an i64 is padding, not a panic.
    let plan = [SliceRef {
        episode: 1,
        start: i64::MAX - 2,
        len: 8,
    }];
    g.gather(&plan, &mut batch).unwrap();
    assert_eq!(batch.valid_steps(), 0);
}

#[test]
fn gather_into_refuses_a_batch_whose_size_overflows() {
    let dir = tempfile::tempdir().unwrap();
    let snap = TestData::new()
        .episodes([30])
        .snapshot(&dir.path().join("d"));
    let g = Gatherer::try_new(&snap, &["reward"]).unwrap();
    let plan = [SliceRef {
        episode: 0,
        start: 0,
        len: 4,
    }; 2];
    // A slice length whose byte count wraps around to a small number must not pass for the
    // small destination it would then fit.
    let (mut col, mut flags, mut ids, mut starts) =
        (vec![0u8; 64], vec![vec![0u8; 64]; 6], [0u64; 2], [0i64; 2]);
    let [f0, f1, f2, f3, f4, f5] = &mut flags[..] else {
        unreachable!()
    };
    let e = g
        .gather_into(
            &plan,
            usize::MAX / 2 + 1,
            GatherInto {
                columns: vec![&mut col[..]],
                flags: [f0, f1, f2, f3, f4, f5],
                episode_id: &mut ids,
                start_step: &mut starts,
            },
        )
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
}

#[test]
fn a_loader_refuses_workers_and_prefetch_beyond_memory_before_starting() {
    let dir = tempfile::tempdir().unwrap();
    let snap = TestData::new()
        .episodes([30, 40])
        .snapshot(&dir.path().join("d"));
    let source = BatchSource::open(LoaderSpec::single(
        snap,
        SamplerSpec::uniform(4, 8),
        &["observation", "reward"],
    ))
    .unwrap();
    // A queue of usize::MAX batches (the channel's slots alone overflowed).
    let e = err_of(Loader::new(
        &source,
        LoaderOptions::default().with_prefetch(usize::MAX),
    ));
    assert_invalid_argument(&e, Some("prefetch"), "prefetch usize::MAX");
    // More threads than a loader starts.
    let e = err_of(Loader::new(
        &source,
        LoaderOptions::default().with_workers(trajstore::loader::MAX_WORKERS + 1),
    ));
    assert_invalid_argument(&e, Some("workers"), "workers past MAX_WORKERS");
    // Ordinary options still load.
    let mut loader = Loader::new(&source, LoaderOptions::default().with_max_batches(3)).unwrap();
    assert_eq!(loader.by_ref().count(), 3);
}

#[test]
fn the_batch_limit_is_at_most_half_of_memory() {
    let limit = trajstore::sample::max_batch_bytes();
    assert!(limit > 0);
    let total_kb = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        m.lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
    });
    if let (Some(kb), Err(_)) = (
        total_kb,
        std::env::var(trajstore::sample::MAX_BATCH_BYTES_ENV),
    ) {
        assert!(limit <= kb * 1024 / 2, "{limit} vs MemTotal {kb} kB");
    }
}

// ------------------------------------------------------------------------------------------
// Item 10: arguments that cannot work are usage errors, not silently changed.
// ------------------------------------------------------------------------------------------

#[test]
fn bench_with_zero_iterations_or_workers_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let d = dataset(dir.path());
    let d = d.to_str().unwrap();
    assert_clean_exit(&cli(&["bench", d, "--iters", "0"]), 2, "--iters");
    assert_clean_exit(&cli(&["bench", d, "--workers", "0"]), 2, "--workers");
    assert_clean_exit(&cli(&["bench", d, "--workers", "1025"]), 2, "--workers");
    assert_clean_exit(
        &cli(&["bench", d, "--iters", "18446744073709551615"]),
        2,
        "--iters",
    );
    // One iteration is one iteration (it was silently raised to 5), and it runs.
    let (code, err) = cli(&[
        "bench",
        d,
        "--iters",
        "1",
        "--workers",
        "1",
        "--slice-len",
        "8",
        "--num-slices",
        "4",
        "--json",
    ]);
    assert_eq!(code, Some(0), "{err}");
}
