//! Frame columns in the gather (`src/gather/frames.rs`): stacks of decoded frames and their
//! `next_observation` equal a reference built from the raw frames, at episode starts and ends,
//! under the strict, pad and span policies, for every codec and both paddings; the loaders give
//! the same stacks; a damaged frame is a named error from the gather, never a panic.

use std::sync::Arc;

use arrow::array::{
    ArrayRef, FixedSizeListArray, Float32Array, Int64Array, RecordBatch, UInt8Array,
};
use arrow::datatypes::{DataType, Field};
use trajstore::frames::FrameCodec;
use trajstore::{
    Batch, BatchSource, BoundaryPolicy, Dataset, EpisodeEnd, Error, FrameStack, Gatherer, Loader,
    LoaderOptions, LoaderSpec, SamplerSpec, SliceRef, Snapshot, StackPad, WriterOptions,
};

use crate::store::frames::{frame, frame_schema};

pub(crate) const SHAPE: [usize; 2] = [12, 10];
pub(crate) const F: usize = 120;
/// Episode lengths: one step, shorter than a stack, and longer ones.
pub(crate) const LENGTHS: [usize; 6] = [1, 2, 3, 7, 20, 33];

fn frames_array(frames: &[Vec<u8>]) -> ArrayRef {
    let item = Arc::new(Field::new("item", DataType::UInt8, false));
    Arc::new(FixedSizeListArray::new(
        item,
        frames[0].len() as i32,
        Arc::new(UInt8Array::from(frames.concat())),
        None,
    ))
}

/// The raw frames of each episode, and its final frame when the writer was given one (every
/// other episode ends terminated without one, as DQN Replay's do).
pub(crate) struct Episodes(Vec<Episode>);

/// One episode's raw frames and its final frame, if stored.
type Episode = (Vec<Vec<u8>>, Option<Vec<u8>>);

pub(crate) fn write(dir: &std::path::Path, codec: FrameCodec) -> (Snapshot, Episodes) {
    write_shaped(dir, codec, &SHAPE)
}

/// [`write`] with frames of `shape` (`[H, W]` or `[H, W, C]`).
fn write_shaped(dir: &std::path::Path, codec: FrameCodec, shape: &[usize]) -> (Snapshot, Episodes) {
    let name = match shape == SHAPE {
        true => codec.to_string(),
        false => format!("{codec}-{}", shape.len()),
    };
    write_in(&dir.join(name), codec, shape, LENGTHS.len())
}

/// [`write`] into `path`, committing every `per_commit` episodes (one segment each).
pub(crate) fn write_in(
    path: &std::path::Path,
    codec: FrameCodec,
    shape: &[usize],
    per_commit: usize,
) -> (Snapshot, Episodes) {
    let ds = Dataset::create(path, &frame_schema(codec, shape)).unwrap();
    let mut w = ds.writer(WriterOptions::default()).unwrap();
    let mut eps = vec![];
    for (e, &len) in LENGTHS.iter().enumerate() {
        let frames: Vec<Vec<u8>> = (0..len).map(|t| frame(shape, e * 7 + 1, t)).collect();
        let batch = RecordBatch::try_from_iter([
            ("observation", frames_array(&frames)),
            (
                "action",
                Arc::new(Int64Array::from_iter_values(0..len as i64)) as _,
            ),
            (
                "reward",
                Arc::new(Float32Array::from(vec![0.5f32; len])) as _,
            ),
        ])
        .unwrap();
        let fin = (e % 2 == 0).then(|| frame(shape, e * 7 + 1, len));
        let end = match &fin {
            Some(f) => EpisodeEnd::truncated()
                .with_final_observation(frames_array(std::slice::from_ref(f))),
            None => EpisodeEnd::terminated(),
        };
        w.append_episode(&batch, end).unwrap();
        eps.push((frames, fin));
        if (e + 1) % per_commit == 0 && e + 1 < LENGTHS.len() {
            w.commit().unwrap();
        }
    }
    w.commit().unwrap();
    drop(w);
    (ds.snapshot().unwrap(), Episodes(eps))
}

impl Episodes {
    /// Frame `u` of episode `e` as a stack slot sees it: a stored frame, the final frame after
    /// the last step (zeros where none was stored), padding before the first.
    fn frame(&self, e: usize, u: i64, pad: StackPad) -> Vec<u8> {
        let (frames, fin) = &self.0[e];
        match u {
            u if u < 0 => match pad {
                StackPad::Repeat => frames[0].clone(),
                StackPad::Zeros => vec![0; F],
            },
            u if (u as usize) < frames.len() => frames[u as usize].clone(),
            _ => fin.clone().unwrap_or_else(|| vec![0; F]),
        }
    }

    /// The reference of one slice: `[l, K * F]` observation and next-observation bytes, zero
    /// where the step is padding.
    fn slice(&self, s: &SliceRef, l: usize, k: usize, pad: StackPad) -> (Vec<u8>, Vec<u8>) {
        let e = s.episode as usize;
        let len = self.0[e].0.len() as i64;
        let (mut obs, mut next) = (vec![0u8; l * k * F], vec![0u8; l * k * F]);
        for j in 0..(s.len as usize).min(l) {
            let t = s.start + j as i64;
            if t < 0 || t >= len {
                continue;
            }
            for slot in 0..k {
                let back = (k - 1 - slot) as i64;
                let at = (j * k + slot) * F;
                obs[at..at + F].copy_from_slice(&self.frame(e, t - back, pad));
                next[at..at + F].copy_from_slice(&self.frame(e, t + 1 - back, pad));
            }
        }
        (obs, next)
    }
}

pub(crate) fn check(
    batch: &Batch,
    plan: &[SliceRef],
    eps: &Episodes,
    k: usize,
    pad: StackPad,
    what: &str,
) {
    let l = batch.slice_len;
    let obs = batch.column("observation").unwrap();
    let next = batch.column("next_observation").unwrap();
    let mut shape = SHAPE.to_vec();
    if k > 1 {
        shape.insert(0, k);
    }
    assert_eq!(obs.shape, shape, "{what}");
    assert_eq!(next.shape, shape, "{what}");
    let step = k * F;
    for (i, s) in plan.iter().enumerate() {
        let (o, n) = eps.slice(s, l, k, pad);
        let range = i * l * step..(i + 1) * l * step;
        assert!(
            obs.data.as_slice()[range.clone()] == o[..],
            "{what}: observation of slice {i} ({s:?})"
        );
        assert!(
            next.data.as_slice()[range] == n[..],
            "{what}: next_observation of slice {i} ({s:?})"
        );
    }
}

#[test]
fn frame_stacks_and_next_observations_equal_the_raw_frames_under_every_policy() {
    let dir = tempfile::tempdir().unwrap();
    for codec in [FrameCodec::ZstdDict, FrameCodec::Zstd, FrameCodec::None] {
        let (snap, eps) = write(dir.path(), codec);
        for policy in ["strict", "pad", "span:3:2"] {
            let policy: BoundaryPolicy = policy.parse().unwrap();
            for (k, pad) in [
                (1, StackPad::Repeat),
                (4, StackPad::Repeat),
                (4, StackPad::Zeros),
                (3, StackPad::Zeros),
            ] {
                let stack = (k > 1).then(|| FrameStack::new(k).unwrap().with_pad(pad));
                // Both orders: next_observation copies from the observation when it comes first.
                for cols in [
                    ["observation", "next_observation"],
                    ["next_observation", "observation"],
                ] {
                    let g = Gatherer::with_frame_stack(&snap, &cols, stack).unwrap();
                    let sampler = SamplerSpec::uniform(5, 48).with_policy(policy).with_seed(3);
                    let Ok(built) = sampler.build(&snap) else {
                        continue; // no window of 5 steps under this policy
                    };
                    let (mut plan, mut batch) = (vec![], Batch::default());
                    for b in 0..4 {
                        built.sampler.plan(b, &mut plan);
                        g.gather(&plan, &mut batch).unwrap();
                        let what = format!("{codec} {policy:?} K={k} {pad} {cols:?} batch {b}");
                        check(&batch, &plan, &eps, k, pad, &what);
                    }
                }
            }
        }
        // Whole episodes (padded to the longest), the first and last steps of every episode.
        let g = Gatherer::with_frame_stack(
            &snap,
            &["observation", "next_observation"],
            Some(FrameStack::new(4).unwrap()),
        )
        .unwrap();
        let plan: Vec<SliceRef> = (0..LENGTHS.len())
            .map(|e| SliceRef {
                episode: e as u32,
                start: 0,
                len: LENGTHS[e] as u32,
            })
            .collect();
        let mut batch = Batch::default();
        g.gather(&plan, &mut batch).unwrap();
        check(
            &batch,
            &plan,
            &eps,
            4,
            StackPad::Repeat,
            &format!("{codec} whole episodes"),
        );
    }
}

/// Every valid step's stack in a frame window equals the written-out stack, and the window holds
/// `L + K - 1` frames per slice.
fn check_window(window: &Batch, stacked: &Batch, k: usize, what: &str) {
    let (b, l) = (stacked.num_slices, stacked.slice_len);
    assert_eq!((window.num_slices, window.slice_len), (b, l), "{what}");
    for (j, c) in window.columns.iter().enumerate() {
        let full = &stacked.columns[j];
        assert_eq!((&c.name, &c.shape), (&full.name, &full.shape), "{what}");
        let lead = if c.data_type == DataType::UInt8 && c.shape.len() >= 3 {
            k - 1
        } else {
            0
        };
        assert_eq!(c.lead, lead, "{what}: {}", c.name);
        assert_eq!(
            c.data.len(),
            b * (l + lead) * full.step_bytes() / (lead + 1),
            "{what}"
        );
        for i in 0..b {
            for t in (0..l).filter(|&t| stacked.mask[i * l + t] == 1) {
                assert!(
                    window.step(j, i, t) == stacked.step(j, i, t),
                    "{what}: {} of slice {i}, step {t}",
                    c.name
                );
            }
        }
    }
    assert_eq!(window.mask, stacked.mask, "{what}");
}

#[test]
fn a_frame_window_holds_every_valid_steps_stack() {
    let dir = tempfile::tempdir().unwrap();
    for codec in [FrameCodec::ZstdDict, FrameCodec::None] {
        let (snap, _) = write(dir.path(), codec);
        for policy in ["strict", "pad", "span:3:2"] {
            let policy: BoundaryPolicy = policy.parse().unwrap();
            for (k, pad) in [
                (4, StackPad::Repeat),
                (4, StackPad::Zeros),
                (2, StackPad::Repeat),
            ] {
                let stack = FrameStack::new(k).unwrap().with_pad(pad);
                for cols in [
                    ["observation", "next_observation", "action"],
                    ["next_observation", "action", "observation"],
                    ["next_observation", "action", "reward"],
                ] {
                    let g = Gatherer::with_frame_stack(&snap, &cols, Some(stack)).unwrap();
                    let w = Gatherer::with_frame_stack(&snap, &cols, Some(stack.with_window(true)))
                        .unwrap();
                    assert!(w.has_windows() && !g.has_windows());
                    let sampler = SamplerSpec::uniform(5, 48).with_policy(policy).with_seed(5);
                    let Ok(built) = sampler.build(&snap) else {
                        continue;
                    };
                    let (mut plan, mut a, mut b) = (vec![], Batch::default(), Batch::default());
                    for n in 0..4 {
                        built.sampler.plan(n, &mut plan);
                        g.gather(&plan, &mut a).unwrap();
                        w.gather(&plan, &mut b).unwrap();
                        let what = format!("{codec} {policy:?} K={k} {pad} {cols:?} batch {n}");
                        check_window(&b, &a, k, &what);
                        // Arrow rows write the window's stacks out: the same record batch.
                        let (ra, rb) = (a.to_record_batch().unwrap(), b.to_record_batch().unwrap());
                        assert_eq!(ra.schema(), rb.schema(), "{what}");
                        let valid = |r: &RecordBatch| {
                            let m = r.column_by_name("mask").unwrap().to_data();
                            let keep: Vec<bool> =
                                m.buffers()[0].as_slice().iter().map(|&x| x == 1).collect();
                            arrow::compute::filter_record_batch(r, &keep.into()).unwrap()
                        };
                        assert_eq!(valid(&ra), valid(&rb), "{what}");
                    }
                }
            }
        }
        // Whole episodes, one per slice: every first and last step.
        let stack = FrameStack::new(4).unwrap();
        let cols = ["observation", "next_observation"];
        let g = Gatherer::with_frame_stack(&snap, &cols, Some(stack)).unwrap();
        let w = Gatherer::with_frame_stack(&snap, &cols, Some(stack.with_window(true))).unwrap();
        let plan: Vec<SliceRef> = (0..LENGTHS.len())
            .map(|e| SliceRef {
                episode: e as u32,
                start: 0,
                len: LENGTHS[e] as u32,
            })
            .collect();
        let (mut a, mut b) = (Batch::default(), Batch::default());
        g.gather(&plan, &mut a).unwrap();
        w.gather(&plan, &mut b).unwrap();
        check_window(&b, &a, 4, &format!("{codec} whole episodes"));
        // The columns' bytes a destination of gather_into needs: a window is L + K - 1 frames.
        let l = *LENGTHS.iter().max().unwrap();
        assert_eq!(
            w.column_bytes(6, l),
            vec![Some(6 * (l + 3) * F), Some(6 * (l + 3) * F)]
        );
        assert_eq!(w.leads(), vec![3, 3]);
    }
    // Stack-first only; and loaders that hold written-out stacks refuse a window by name.
    let (snap, _) = write(dir.path(), FrameCodec::Zstd);
    let last = FrameStack::new(4)
        .unwrap()
        .with_channels_last(true)
        .with_window(true);
    match Gatherer::with_frame_stack(&snap, &["observation"], Some(last)) {
        Err(Error::InvalidArgument {
            argument: Some(a), ..
        }) => assert_eq!(a, "frame_window"),
        other => panic!("expected an error about frame_window, got {other:?}"),
    }
}

#[test]
fn the_loader_gives_frame_windows_and_a_mix_of_windows_gathers_them() {
    let dir = tempfile::tempdir().unwrap();
    let (snap, _) = write(dir.path(), FrameCodec::ZstdDict);
    let stack = FrameStack::new(4).unwrap().with_pad(StackPad::Zeros);
    let sampler = SamplerSpec::uniform(6, 16)
        .with_policy(BoundaryPolicy::Pad)
        .with_seed(9);
    let cols = ["observation", "next_observation", "action"];
    let spec = LoaderSpec::single(snap.clone(), sampler.clone(), &cols)
        .with_frame_stack(stack.with_window(true));
    let source = BatchSource::open(spec).unwrap();
    let mut loader = Loader::new(
        &source,
        LoaderOptions::default().with_workers(2).with_max_batches(4),
    )
    .unwrap();
    let g = Gatherer::with_frame_stack(&snap, &cols, Some(stack)).unwrap();
    let built = sampler.build(&snap).unwrap();
    let (mut plan, mut full, mut n) = (vec![], Batch::default(), 0);
    let mut windows = Vec::new();
    while let Some(batch) = loader.next_batch() {
        built.sampler.plan(n, &mut plan);
        g.gather(&plan, &mut full).unwrap();
        check_window(&batch, &full, 4, &format!("loader batch {n}"));
        windows.push(
            batch
                .columns
                .iter()
                .map(|c| c.data.to_vec())
                .collect::<Vec<_>>(),
        );
        n += 1;
    }
    assert_eq!(n, 4);
    // A staged loader (the CUDA loaders' pinned slots) gathers the same windows into slots of
    // `B * (L + K - 1)` frames: what one copy per batch carries to the device.
    let w = Gatherer::with_frame_stack(&snap, &cols, Some(stack.with_window(true))).unwrap();
    let need: Vec<usize> = w
        .column_bytes(16, 6)
        .into_iter()
        .map(Option::unwrap)
        .collect();
    assert_eq!(need[..2], [16 * (6 + 3) * F, 16 * (6 + 3) * F]);
    // A batch's bytes (the memory checks' figure) count a window's frames once.
    let overhead = |g: &Gatherer| {
        let cols: usize = g.column_bytes(16, 6).into_iter().map(Option::unwrap).sum();
        g.batch_bytes(16, 6).unwrap() - cols as u64
    };
    assert_eq!(overhead(&w), overhead(&g));
    let (slots, mems) = crate::common::staging::slots(2, &need, (16, 6), None);
    let opts = LoaderOptions::default().with_workers(2).with_max_batches(4);
    let mut staged = trajstore::StagedLoader::new(&source, opts, slots).unwrap();
    let mut k = 0;
    while let Some(b) = staged.next_batch() {
        let b = b.unwrap();
        let m = mems[b.slot].lock().unwrap();
        assert_eq!(m.columns, windows[k], "staged batch {k}");
        drop(m);
        staged.release(b.number).unwrap();
        k += 1;
    }
    assert_eq!(k, 4);
    // A mix of two windowed parts: each slice's window from its own part.
    let part =
        Arc::new(Gatherer::with_frame_stack(&snap, &cols, Some(stack.with_window(true))).unwrap());
    let mix = Gatherer::mixed(vec![part.clone(), part], &[8, 8]).unwrap();
    let (mut a, mut b) = (Batch::default(), Batch::default());
    mix.gather(&plan, &mut a).unwrap();
    g.gather(&plan, &mut b).unwrap();
    check_window(&a, &b, 4, "a mix of windows");
    // ... and a mix of a window and written-out stacks is refused.
    let stacked = Arc::new(Gatherer::with_frame_stack(&snap, &cols, Some(stack)).unwrap());
    let windowed =
        Arc::new(Gatherer::with_frame_stack(&snap, &cols, Some(stack.with_window(true))).unwrap());
    assert!(Gatherer::mixed(vec![stacked, windowed], &[8, 8]).is_err());
}

#[test]
fn channels_last_stacks_are_the_stack_first_stacks_with_the_frame_axis_last() {
    let dir = tempfile::tempdir().unwrap();
    for shape in [vec![12, 10], vec![6, 5, 3]] {
        let (snap, _) = write_shaped(dir.path(), FrameCodec::ZstdDict, &shape);
        let (p, c) = (shape[0] * shape[1], shape.get(2).copied().unwrap_or(1));
        for (k, pad) in [
            (4, StackPad::Repeat),
            (3, StackPad::Zeros),
            (2, StackPad::Repeat),
        ] {
            let first = FrameStack::new(k).unwrap().with_pad(pad);
            let last = first.with_channels_last(true);
            let want: Vec<usize> = if c == 1 {
                vec![shape[0], shape[1], k]
            } else {
                vec![shape[0], shape[1], k * c]
            };
            assert_eq!(last.shape(&shape), want);
            for cols in [
                ["observation", "next_observation"],
                ["next_observation", "observation"],
            ] {
                let g_first = Gatherer::with_frame_stack(&snap, &cols, Some(first)).unwrap();
                let g_last = Gatherer::with_frame_stack(&snap, &cols, Some(last)).unwrap();
                let built = SamplerSpec::uniform(6, 32)
                    .with_policy(BoundaryPolicy::Pad)
                    .with_seed(k as u64)
                    .build(&snap)
                    .unwrap();
                let (mut plan, mut a, mut b) = (vec![], Batch::default(), Batch::default());
                for n in 0..3 {
                    built.sampler.plan(n, &mut plan);
                    g_first.gather(&plan, &mut a).unwrap();
                    g_last.gather(&plan, &mut b).unwrap();
                    for col in cols {
                        let (x, y) = (a.column(col).unwrap(), b.column(col).unwrap());
                        assert_eq!(y.shape, want, "{col}");
                        let (x, y) = (x.data.as_slice(), y.data.as_slice());
                        assert_eq!(x.len(), y.len());
                        let step = k * p * c;
                        for (t, (xs, ys)) in x.chunks(step).zip(y.chunks(step)).enumerate() {
                            for s in 0..k {
                                for px in 0..p {
                                    let from = &xs[(s * p + px) * c..][..c];
                                    let to = &ys[(px * k + s) * c..][..c];
                                    assert!(
                                        from == to,
                                        "{shape:?} K={k} {pad} {cols:?} {col}: step {t}, \
                                         frame {s}, pixel {px}"
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn every_loader_gives_the_stacks_the_gather_makes() {
    let dir = tempfile::tempdir().unwrap();
    let (snap, eps) = write(dir.path(), FrameCodec::ZstdDict);
    let stack = FrameStack::new(4).unwrap().with_pad(StackPad::Zeros);
    let sampler = SamplerSpec::uniform(6, 16)
        .with_policy(BoundaryPolicy::Pad)
        .with_seed(9);
    let cols = ["observation", "next_observation", "action"];
    // Decoding every frame, and copying them from a cache of every frame or of the first 20.
    for cache in [0, 1 << 20, 20 * F as u64] {
        let spec = LoaderSpec::single(snap.clone(), sampler.clone(), &cols)
            .with_frame_stack(stack.with_cache(cache));
        let source = BatchSource::open(spec).unwrap();
        let mut loader = Loader::new(
            &source,
            LoaderOptions::default().with_workers(3).with_max_batches(6),
        )
        .unwrap();
        let built = sampler.build(&snap).unwrap();
        let mut plan = vec![];
        let mut n = 0;
        while let Some(batch) = loader.next_batch() {
            built.sampler.plan(n, &mut plan);
            assert_eq!(batch.column("observation").unwrap().shape, vec![4, 12, 10]);
            let what = format!("loader batch {n}, cache {cache}");
            check(&batch, &plan, &eps, 4, StackPad::Zeros, &what);
            n += 1;
        }
        assert_eq!(n, 6);
    }
    // A stack without a frame column is refused, naming the option.
    let tensors = trajstore::synth::SynthSpec {
        transitions: 100,
        ..Default::default()
    };
    let ds = Dataset::create(dir.path().join("tensors"), &tensors.schema().unwrap()).unwrap();
    tensors
        .write(
            &mut ds.writer(WriterOptions::default()).unwrap(),
            None,
            |_| {},
        )
        .unwrap();
    let spec = LoaderSpec::single(
        ds.snapshot().unwrap(),
        SamplerSpec::uniform(4, 4),
        &["observation"],
    )
    .with_frame_stack(stack);
    match BatchSource::open(spec) {
        Err(Error::InvalidArgument {
            argument: Some(a), ..
        }) => assert_eq!(a, "frame_stack"),
        other => panic!("expected an error about frame_stack, got {other:?}"),
    }
    // So is a frame cache.
    let cached = FrameStack::unstacked().with_cache(1 << 20);
    match Gatherer::with_frame_stack(&ds.snapshot().unwrap(), &["observation"], Some(cached)) {
        Err(Error::InvalidArgument {
            argument: Some(a), ..
        }) => assert_eq!(a, "frame_cache"),
        other => panic!("expected an error about frame_cache, got {other:?}"),
    }
    assert!(FrameStack::new(0).is_err() && FrameStack::new(65).is_err());
}

#[test]
fn a_damaged_frame_is_a_named_error_from_the_gather() {
    let dir = tempfile::tempdir().unwrap();
    let (snap, _) = write(dir.path(), FrameCodec::Zstd);
    // Flip bytes inside the stored frames of the segment (its file is mapped read-only by the
    // snapshot opened next, which does not verify checksums on open).
    let (first, file) = {
        let seg = &snap.segments()[0];
        let run = seg.frames("observation", 0, LENGTHS[0]).unwrap();
        (
            run.frame(0).unwrap().to_vec(),
            dir.path().join("zstd").join(&seg.entry().path),
        )
    };
    let bytes = std::fs::read(&file).unwrap();
    let at = bytes
        .windows(first.len())
        .position(|w| w == first)
        .expect("the frame's bytes are in the file");
    drop(snap);
    let mut damaged = bytes.clone();
    for b in &mut damaged[at + 4..at + first.len()] {
        *b ^= 0x5a;
    }
    std::fs::write(&file, &damaged).unwrap();
    let snap = match Dataset::open(dir.path().join("zstd")).and_then(|d| d.snapshot()) {
        Ok(s) => s,
        // Opening may already see the damage (a checked footer or checksum): a named error too.
        Err(e) => {
            assert!(
                matches!(e, Error::Corrupt { .. } | Error::InvalidData { .. }),
                "{e}"
            );
            return;
        }
    };
    let g = Gatherer::with_frame_stack(&snap, &["observation"], Some(FrameStack::new(2).unwrap()))
        .unwrap();
    let plan = [SliceRef {
        episode: 0,
        start: 0,
        len: 1,
    }];
    let e = g.gather(&plan, &mut Batch::default()).unwrap_err();
    assert!(matches!(e, Error::InvalidData { .. }), "{e}");
    assert!(e.to_string().contains("observation"), "{e}");
    // It names the segment file and the episode too.
    let seg_path = snap.segments()[0].entry().path.clone();
    assert!(e.to_string().contains(&seg_path), "{e}");
    match &e {
        Error::InvalidData {
            episode: Some(_),
            input: Some(_),
            ..
        } => {}
        other => panic!("expected the file and episode in {other:?}"),
    }
    // With a frame cache, the frame is decoded when the gatherer is made: the same named error.
    let cached = Some(FrameStack::new(2).unwrap().with_cache(1 << 20));
    let e = Gatherer::with_frame_stack(&snap, &["observation"], cached).unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidData {
                episode: Some(_),
                ..
            }
        ),
        "{e}"
    );
    assert!(
        e.to_string().contains("observation") && e.to_string().contains(&seg_path),
        "{e}"
    );
    // Decoded where the batch lands (its C++ copy on the CPU): the frame fails there, named.
    #[cfg(feature = "torch")]
    {
        use trajstore::sample::SamplerKind;
        use trajstore::torch::{TorchLoader, TorchLoaderOptions};
        let every = SamplerSpec::new(SamplerKind::Epoch, 4, 8)
            .with_policy(BoundaryPolicy::Pad)
            .with_drop_last(false);
        let stack = FrameStack::new(2).unwrap().with_window(true);
        let spec =
            LoaderSpec::single(snap.clone(), every, &["observation"]).with_frame_stack(stack);
        let opts = TorchLoaderOptions::new(tch::Device::Cpu).with_device_decode(true);
        let source = BatchSource::open(spec).unwrap();
        let e = TorchLoader::new(&source, opts)
            .unwrap()
            .find_map(|b| b.err())
            .expect("the damaged frame is an error");
        assert!(matches!(e, Error::InvalidData { .. }), "{e}");
        assert!(e.to_string().contains("observation"), "{e}");
    }
}

#[cfg(feature = "torch")]
#[test]
fn the_torch_loader_hands_out_the_same_uint8_stacks() {
    use trajstore::torch::{TorchLoader, TorchLoaderOptions, parse_device};
    let dir = tempfile::tempdir().unwrap();
    let (snap, eps) = write(dir.path(), FrameCodec::ZstdDict);
    let sampler = SamplerSpec::uniform(3, 8).with_seed(5);
    let mut source = None;
    // Decoding, and copying the frames from a cache of every frame.
    for cache in [0, 1 << 20] {
        let stack = FrameStack::new(4).unwrap().with_cache(cache);
        let spec = LoaderSpec::single(snap.clone(), sampler.clone(), &["observation"])
            .with_frame_stack(stack);
        let src = BatchSource::open(spec).unwrap();
        let opts = TorchLoaderOptions::new(parse_device("cpu").unwrap())
            .with_loader(LoaderOptions::default().with_max_batches(3));
        let mut loader = TorchLoader::new(&src, opts).unwrap();
        let built = sampler.build(&snap).unwrap();
        let mut plan = vec![];
        for k in 0..3 {
            let batch = loader.next_batch().unwrap().unwrap();
            let obs = batch.get("observation").unwrap();
            assert_eq!(obs.size(), vec![8, 3, 4, 12, 10]);
            assert_eq!(obs.kind(), tch::Kind::Uint8);
            let got: Vec<u8> = Vec::try_from(obs.flatten(0, -1)).unwrap();
            built.sampler.plan(k, &mut plan);
            for (i, s) in plan.iter().enumerate() {
                let (want, _) = eps.slice(s, 3, 4, StackPad::Repeat);
                let step = 3 * 4 * F;
                assert!(
                    got[i * step..(i + 1) * step] == want[..],
                    "batch {k} slice {i}, cache {cache}"
                );
            }
        }
        assert!(loader.next_batch().is_none());
        source.get_or_insert(src);
    }
    let source = source.expect("made");
    // The resident mode uploads raw columns: frame columns are refused, naming the option.
    let opts = TorchLoaderOptions::new(parse_device("cpu").unwrap()).with_resident(1 << 30);
    match TorchLoader::new(&source, opts) {
        Err(Error::InvalidArgument {
            argument: Some(a), ..
        }) => assert_eq!(a, "resident_budget"),
        other => panic!(
            "expected a refusal of resident mode, got {:?}",
            other.map(|_| ())
        ),
    }
}

/// The compact batch of frame stacks (next_observation as one stack per slice, expanded by the
/// loader) equals the full one, channels first and last, under the pad policy.
#[cfg(feature = "torch")]
#[test]
fn the_torch_loader_expands_compact_frame_stacks() {
    use trajstore::torch::{TorchLoader, TorchLoaderOptions};
    let dir = tempfile::tempdir().unwrap();
    let (snap, _) = write(dir.path(), FrameCodec::Zstd);
    let cols = ["observation", "next_observation"];
    for stack in [
        FrameStack::new(4).unwrap(),
        FrameStack::new(3)
            .unwrap()
            .with_pad(StackPad::Zeros)
            .with_channels_last(true),
    ] {
        let sampler = SamplerSpec::uniform(6, 8)
            .with_policy(BoundaryPolicy::Pad)
            .with_seed(2);
        let spec = LoaderSpec::single(snap.clone(), sampler, &cols).with_frame_stack(stack);
        let source = BatchSource::open(spec).unwrap();
        let run = |compact: bool| {
            let opts = TorchLoaderOptions::new(tch::Device::Cpu)
                .with_loader(LoaderOptions::default().with_max_batches(4))
                .with_compact(compact);
            TorchLoader::new(&source, opts)
                .unwrap()
                .map(|b| {
                    let b = b.unwrap();
                    b.tensors()
                        .map(|(n, t)| {
                            (
                                n.to_string(),
                                Vec::<u8>::try_from(t.to_kind(tch::Kind::Uint8).flatten(0, -1))
                                    .unwrap(),
                            )
                        })
                        .collect::<Vec<_>>()
                })
                .collect::<Vec<_>>()
        };
        assert!(run(true) == run(false), "{stack:?}");
    }
}

/// The torch loader with frame windows: a slot holds `[B, L + K - 1, H, W]` frames (compact or
/// not), and each batch's `[B, L, K, H, W]` stacks are a view of them (steps and stack slots one
/// frame apart) equal to the written-out stacks at every valid step; a transform sees the view.
#[cfg(feature = "torch")]
#[test]
fn the_torch_loader_hands_out_frame_windows_as_views() {
    use trajstore::torch::{TensorBatch, TorchLoader, TorchLoaderOptions};
    let dir = tempfile::tempdir().unwrap();
    let (snap, _) = write(dir.path(), FrameCodec::ZstdDict);
    let cols = ["observation", "next_observation", "action"];
    let (k, l, b) = (4usize, 8usize, 6usize);
    let sampler = SamplerSpec::uniform(l as u32, b)
        .with_policy(BoundaryPolicy::Span { left: 2, right: 3 })
        .with_seed(4);
    let stack = FrameStack::new(k).unwrap();
    let source = |window: bool| {
        let spec = LoaderSpec::single(snap.clone(), sampler.clone(), &cols)
            .with_frame_stack(stack.with_window(window));
        BatchSource::open(spec).unwrap()
    };
    let opts = |compact: bool| {
        TorchLoaderOptions::new(tch::Device::Cpu)
            .with_loader(LoaderOptions::default().with_workers(2).with_max_batches(3))
            .with_compact(compact)
    };
    // Also through the device ring's CPU stand-in: windows copied into buffers made once.
    let ring = |compact: bool, ring: bool| opts(compact).with_ring_on_cpu(ring);
    let valid = |batch: &TensorBatch, name: &str| {
        let mask = batch.get("mask").unwrap();
        let t = batch.get(name).unwrap().to_kind(tch::Kind::Uint8);
        Vec::<u8>::try_from(t.index(&[Some(mask)]).flatten(0, -1)).unwrap()
    };
    let stacks: Vec<TensorBatch> = TorchLoader::new(&source(false), opts(false))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    for (compact, on) in [(false, false), (true, false), (false, true), (true, true)] {
        let mut loader = TorchLoader::new(&source(true), ring(compact, on)).unwrap();
        let got: Vec<TensorBatch> = loader.by_ref().map(Result::unwrap).collect();
        assert_eq!(got.len(), 3);
        assert_eq!(loader.device_ring().batches, if on { 3 } else { 0 });
        for (n, (w, s)) in got.iter().zip(&stacks).enumerate() {
            for name in ["observation", "next_observation"] {
                let t = w.get(name).unwrap();
                let frame = F as i64;
                assert_eq!(t.size(), [b as i64, l as i64, k as i64, 12, 10]);
                let row = ((l + k - 1) as i64) * frame;
                assert_eq!(t.stride(), [row, frame, frame, 10, 1], "{name}");
                let what = format!("compact {compact} ring {on} batch {n} {name}");
                assert!(valid(w, name) == valid(s, name), "{what}");
            }
            assert!(valid(w, "action") == valid(s, "action"));
        }
    }
    // A transform sees the view.
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    let opts = opts(false).with_transform(move |batch: &mut TensorBatch| {
        log.lock()
            .unwrap()
            .push(batch.get("observation").unwrap().size());
        Ok(())
    });
    assert_eq!(TorchLoader::new(&source(true), opts).unwrap().count(), 3);
    assert_eq!(*seen.lock().unwrap(), vec![vec![6, 8, 4, 12, 10]; 3]);
}

/// Frames decoded where the batch lands (`TorchLoaderOptions::device_decode`): the workers ship
/// each window's stored frames and a table, and the decoder (`frame_decode.cu`, its C++ copy on
/// the CPU) gives the batches the workers' own decode gives, byte for byte: every codec, both
/// paddings, the strict, pad and span policies, compact or not, with and without the
/// observation beside `next_observation`, and the short last batch of an epoch. Frames stored
/// raw (codec `none`) overflow the first arena, which grows. A damaged frame is a named error.
#[cfg(feature = "torch")]
#[test]
fn frames_decoded_where_the_batch_lands_equal_the_workers_decode() {
    use trajstore::sample::SamplerKind;
    use trajstore::torch::{TorchLoader, TorchLoaderOptions};
    let dir = tempfile::tempdir().unwrap();
    let tensors = |source: &BatchSource, opts: TorchLoaderOptions| {
        TorchLoader::new(source, opts)
            .unwrap()
            .map(|b| {
                b.unwrap()
                    .tensors()
                    .map(|(n, t)| {
                        let t = t.to_kind(tch::Kind::Uint8).contiguous().flatten(0, -1);
                        (n.to_string(), Vec::<u8>::try_from(t).unwrap())
                    })
                    .collect::<Vec<_>>()
            })
            .collect::<Vec<_>>()
    };
    let mut checked = 0;
    for codec in [FrameCodec::ZstdDict, FrameCodec::Zstd, FrameCodec::None] {
        let (snap, _) = write(dir.path(), codec);
        for (pad, policy) in [
            (StackPad::Repeat, BoundaryPolicy::Strict),
            (StackPad::Zeros, BoundaryPolicy::Pad),
            (StackPad::Repeat, BoundaryPolicy::Span { left: 2, right: 3 }),
        ] {
            let stack = FrameStack::new(4).unwrap().with_pad(pad).with_window(true);
            for cols in [
                &["observation", "next_observation", "reward"][..],
                &["next_observation"],
            ] {
                let sampler = SamplerSpec::uniform(6, 8).with_policy(policy).with_seed(3);
                let spec = LoaderSpec::single(snap.clone(), sampler, cols).with_frame_stack(stack);
                let source = BatchSource::open(spec).unwrap();
                for compact in [false, true] {
                    let opts = |on: bool| {
                        TorchLoaderOptions::new(tch::Device::Cpu)
                            .with_loader(
                                LoaderOptions::default().with_max_batches(5).with_workers(2),
                            )
                            .with_compact(compact)
                            .with_device_decode(on)
                    };
                    let what = format!("{codec} {pad} {policy:?} {cols:?} compact {compact}");
                    let (workers, device) =
                        (tensors(&source, opts(false)), tensors(&source, opts(true)));
                    assert_eq!(workers.len(), 5, "{what}");
                    assert!(workers == device, "{what}");
                    checked += 1;
                }
            }
        }
        // The short last batch of an epoch (its empty slices are tables of zero frames).
        let spec = SamplerSpec::new(SamplerKind::Epoch, 5, 7)
            .with_policy(BoundaryPolicy::Pad)
            .with_drop_last(false);
        let stack = FrameStack::new(3).unwrap().with_window(true);
        let cols = ["observation", "next_observation"];
        let spec = LoaderSpec::single(snap.clone(), spec, &cols).with_frame_stack(stack);
        let source = BatchSource::open(spec).unwrap();
        let opts = |on| TorchLoaderOptions::new(tch::Device::Cpu).with_device_decode(on);
        let (workers, device) = (tensors(&source, opts(false)), tensors(&source, opts(true)));
        assert!(workers.len() > 1 && workers == device, "{codec}: an epoch");
    }
    assert_eq!(checked, 36);
    // Written-out stacks, resident mode, a transform: refused by name.
    let (snap, _) = write(dir.path().join("x").as_path(), FrameCodec::Zstd);
    let refused = |stack: FrameStack, opts: TorchLoaderOptions| {
        let spec = LoaderSpec::single(snap.clone(), SamplerSpec::uniform(3, 4), &["observation"])
            .with_frame_stack(stack);
        match TorchLoader::new(
            &BatchSource::open(spec).unwrap(),
            opts.with_device_decode(true),
        ) {
            Err(Error::InvalidArgument {
                argument: Some(a),
                reason,
            }) => assert_eq!(a, "device_decode", "{reason}"),
            other => panic!("expected a refusal, got {:?}", other.map(|_| ())),
        }
    };
    let window = FrameStack::new(4).unwrap().with_window(true);
    let cpu = || TorchLoaderOptions::new(tch::Device::Cpu);
    refused(FrameStack::new(4).unwrap(), cpu());
    refused(window, cpu().with_resident(1 << 30));
    refused(window, cpu().with_transform(|_| Ok(())));
}
