//! The decoded-frame cache (`src/gather/frame_cache.rs`, `FrameStack::with_cache`): batches
//! gathered with it are the batches gathered without it, byte for byte, whether it holds every
//! frame, the first ones (ending inside a segment) or none; it holds what its budget allows;
//! gatherers of one snapshot share it; a loader that follows new versions refuses it.

use trajstore::frames::FrameCodec;
use trajstore::{
    Batch, BatchSource, BoundaryPolicy, Error, Follow, FrameStack, Gatherer, LoaderSpec,
    SamplerSpec, StackPad,
};

use super::frames::{F, LENGTHS, SHAPE, check, write_in};

/// Stored frames of the fixture.
const FRAMES: u64 = 66;

#[test]
fn a_frame_cache_gives_the_batches_of_the_decoding_gather() {
    let dir = tempfile::tempdir().unwrap();
    for codec in [FrameCodec::ZstdDict, FrameCodec::None] {
        // Three segments of two episodes each (3, 10 and 53 frames).
        let (snap, eps) = write_in(&dir.path().join(codec.to_string()), codec, &SHAPE, 2);
        assert_eq!(snap.segments().len(), 3);
        let all = (FRAMES * F as u64) as usize;
        // Every frame; the first 40 (the first two segments, then 27 rows of the third); one;
        // less than a frame (none).
        for (budget, held) in [(1 << 30, FRAMES), (40 * F + 7, 40), (F, 1), (F - 1, 0)] {
            for (k, pad, window) in [
                (1, StackPad::Repeat, false),
                (4, StackPad::Repeat, false),
                (4, StackPad::Zeros, false),
                (3, StackPad::Repeat, true),
            ] {
                let stack = match k {
                    1 => FrameStack::unstacked(),
                    k => FrameStack::new(k)
                        .unwrap()
                        .with_pad(pad)
                        .with_window(window),
                };
                let cols = ["observation", "next_observation"];
                let plain = Gatherer::with_frame_stack(&snap, &cols, Some(stack)).unwrap();
                let cached =
                    Gatherer::with_frame_stack(&snap, &cols, Some(stack.with_cache(budget as u64)))
                        .unwrap();
                let stats = cached.frame_cache();
                let what = format!("{codec} budget {budget} K={k} {pad} window {window}");
                assert_eq!(stats.frames, held, "{what}");
                assert_eq!(stats.bytes, held * F as u64, "{what}");
                assert!(stats.bytes as usize <= all, "{what}");
                if held > 0 {
                    assert_eq!(stats.frames_stored, FRAMES, "{what}");
                }
                assert_eq!(plain.frame_cache().frames, 0);
                for policy in ["strict", "pad", "span:3:2"] {
                    let policy: BoundaryPolicy = policy.parse().unwrap();
                    let Ok(built) = SamplerSpec::uniform(5, 48)
                        .with_policy(policy)
                        .with_seed(7)
                        .build(&snap)
                    else {
                        continue;
                    };
                    let (mut plan, mut a, mut b) = (vec![], Batch::default(), Batch::default());
                    for n in 0..4 {
                        built.sampler.plan(n, &mut plan);
                        plain.gather(&plan, &mut a).unwrap();
                        cached.gather(&plan, &mut b).unwrap();
                        for c in cols {
                            let (x, y) = (a.column(c).unwrap(), b.column(c).unwrap());
                            assert_eq!(x.shape, y.shape, "{what} {c}");
                            assert!(
                                x.data.as_slice() == y.data.as_slice(),
                                "{what} {policy:?} batch {n}: {c} differs"
                            );
                        }
                        if !window {
                            check(&b, &plan, &eps, k, pad, &format!("{what} {policy:?} {n}"));
                        }
                    }
                }
            }
        }
    }
    assert_eq!(LENGTHS.iter().sum::<usize>() as u64, FRAMES);
}

#[test]
fn gatherers_of_one_snapshot_share_a_cache_and_following_refuses_one() {
    let dir = tempfile::tempdir().unwrap();
    let (snap, _) = write_in(&dir.path().join("d"), FrameCodec::Zstd, &SHAPE, 3);
    let stack = Some(FrameStack::new(4).unwrap().with_cache(1 << 20));
    let a = Gatherer::with_frame_stack(&snap, &["observation"], stack).unwrap();
    let b = Gatherer::with_frame_stack(&snap, &["next_observation", "observation"], stack).unwrap();
    // One fill: the second gatherer found the first one's cache (and its fill time).
    assert_eq!(a.frame_cache(), b.frame_cache());
    assert_eq!(b.frame_cache().frames, FRAMES);
    // Another budget is another cache.
    let other = Gatherer::with_frame_stack(
        &snap,
        &["observation"],
        Some(FrameStack::new(4).unwrap().with_cache(10 * F as u64)),
    )
    .unwrap();
    assert_eq!(other.frame_cache().frames, 10);
    // A loader that follows new versions is refused, naming the option.
    let spec = LoaderSpec::single(snap.clone(), SamplerSpec::uniform(4, 2), &["observation"])
        .with_frame_stack(FrameStack::new(4).unwrap().with_cache(1 << 20))
        .follow(Follow::default());
    match BatchSource::open(spec) {
        Err(Error::InvalidArgument { argument, .. }) => {
            assert_eq!(argument.as_deref(), Some("frame_cache"))
        }
        other => panic!("expected a frame_cache error, got {:?}", other.map(|_| ())),
    }
    // The same loader without following takes it, and its gatherer holds the shared cache.
    let spec = LoaderSpec::single(snap.clone(), SamplerSpec::uniform(4, 2), &["observation"])
        .with_frame_stack(FrameStack::new(4).unwrap().with_cache(1 << 20));
    let source = BatchSource::open(spec).unwrap();
    let (_, g) = source.at(0).unwrap();
    assert_eq!(g.frame_cache(), a.frame_cache());
}
