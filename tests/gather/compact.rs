//! The compact batch (`Gatherer::gather_compact`, what the CUDA loaders ship): expanded as
//! `CompactInto` documents it, it equals the full gather bit for bit, for derived vector
//! `next_observation` (with and without final observations), frame stacks of every padding and
//! both layouts, stored `next_observation` (no tail), mixes, and every boundary policy.

use std::sync::Arc;

use trajstore::format::col;
use trajstore::{
    Batch, BoundaryPolicy, CompactInto, Dataset, EpisodeEnd, FrameStack, Gatherer, SamplerSpec,
    SliceRef, StackPad, TransitionSchema, WriterOptions,
};

use crate::common::TestData;

/// A compact gather of `plan`, expanded on the host as [`CompactInto`] documents, against the
/// full gather of the same plan: every column and flag plane byte for byte, ids and starts.
pub(crate) fn assert_compact_equals_full(g: &Gatherer, plan: &[SliceRef], what: &str) {
    let mut full = Batch::default();
    g.gather(plan, &mut full).unwrap();
    // `gather` pads to the plan's longest slice; the compact gather is given the same L.
    let (b, l) = (plan.len(), full.slice_len);
    let tails = g.tail_columns().to_vec();
    let leads = g.leads();
    // A row: a step, or a frame window's frame (`L + lead` rows a slice, one for a tail).
    let rows: Vec<usize> = (g.step_bytes().iter().zip(&leads))
        .map(|(&s, &lead)| s / (lead + 1))
        .collect();
    let mut cols: Vec<Vec<u8>> = (rows.iter().zip(&tails).zip(&leads))
        .map(|((&row, &t), &lead)| vec![0xAB; if t { b } else { b * (l + lead) } * row])
        .collect();
    let mut spans = vec![-7i32; 3 * b];
    let (mut ids, mut starts) = (vec![0u64; b], vec![0i64; b]);
    g.gather_compact(
        plan,
        l,
        CompactInto {
            columns: cols.iter_mut().map(|c| c.as_mut_slice()).collect(),
            spans: &mut spans,
            episode_id: &mut ids,
            start_step: &mut starts,
        },
    )
    .unwrap();
    assert_eq!(ids, full.episode_id, "{what}: episode ids");
    assert_eq!(starts, full.start_step, "{what}: start steps");
    // The flag planes from the spans.
    let mut planes = vec![vec![0u8; b * l]; 6];
    for i in 0..b {
        let (off, n, bits) = (spans[3 * i], spans[3 * i + 1], spans[3 * i + 2]);
        assert!(
            off >= 0 && n >= 0 && (off + n) as usize <= l,
            "{what}: span {i}"
        );
        for j in 0..l as i32 {
            let at = i * l + j as usize;
            let end = n > 0 && j == off + n - 1;
            planes[0][at] = (off <= j && j < off + n) as u8;
            planes[1][at] = (n > 0 && j == off && bits & CompactInto::FIRST != 0) as u8;
            planes[2][at] = (end && bits & CompactInto::LAST != 0) as u8;
            planes[3][at] = (end && bits & CompactInto::TERMINATED != 0) as u8;
            planes[4][at] = (end && bits & CompactInto::TRUNCATED != 0) as u8;
            planes[5][at] = end as u8;
        }
    }
    let want = [
        &full.mask,
        &full.is_first,
        &full.is_last,
        &full.terminated,
        &full.truncated,
        &full.slice_end,
    ];
    for (k, (got, want)) in planes.iter().zip(want).enumerate() {
        assert_eq!(got, want, "{what}: flag plane {k}");
    }
    let obs = g.columns().position(|(n, _, _)| n == col::OBSERVATION);
    for (c, ((got, &tail), (&row, &lead))) in (cols.iter().zip(&tails))
        .zip(rows.iter().zip(&leads))
        .enumerate()
    {
        let want = full.columns[c].data.as_slice();
        if !tail {
            assert_eq!(got.as_slice(), want, "{what}: column {c}");
            continue;
        }
        // next_observation: the tail at the slice's last valid step, the observation one step
        // later at the other valid steps, zero where padded. For a frame window, rows of
        // frames: the tail (the frame after the last valid step) at row `off + n - 1 + lead`,
        // the observation's next row from `off` up to it, zero elsewhere.
        let o = &cols[obs.expect("a tail column has its observation")];
        let r = l + lead;
        let mut derived = vec![0u8; b * r * row];
        for i in 0..b {
            let (off, n) = (spans[3 * i] as usize, spans[3 * i + 1] as usize);
            if n == 0 {
                continue;
            }
            let last = off + n - 1 + lead;
            for j in off..=last {
                let at = (i * r + j) * row;
                let dst = &mut derived[at..at + row];
                if j == last {
                    dst.copy_from_slice(&got[i * row..(i + 1) * row]);
                } else {
                    dst.copy_from_slice(&o[at + row..at + 2 * row]);
                }
            }
        }
        assert!(
            derived == want,
            "{what}: derived next_observation (column {c})"
        );
    }
}

fn policies() -> [BoundaryPolicy; 3] {
    [
        BoundaryPolicy::Strict,
        BoundaryPolicy::Pad,
        BoundaryPolicy::Span { left: 3, right: 4 },
    ]
}

/// Vector observations in small segments, episodes of many lengths, some without a final
/// observation (their last step's next_observation is zero).
fn vectors(dir: &std::path::Path, name: &str, stored_next: bool) -> trajstore::Snapshot {
    let d = 3;
    let s = TestData::new().obs_dim(d).seed(41).spec();
    let schema = if stored_next {
        TransitionSchema::builder(&[d], 2)
            .next_observation(true)
            .build()
            .unwrap()
    } else {
        s.schema().unwrap()
    };
    let ds = Dataset::create(dir.join(name), &schema).unwrap();
    let opts = WriterOptions::default()
        .with_segment_bytes(2500)
        .with_batch_bytes(700);
    let mut w = ds.writer(opts).unwrap();
    for i in 0..30u64 {
        let len = 1 + (i * 13 % 23);
        let (batch, end) = s.episode(i, len);
        let batch = if stored_next {
            crate::common::with_next_observation(&batch, &end)
        } else {
            batch
        };
        let end = if i % 4 == 3 {
            EpisodeEnd::truncated()
        } else {
            end
        };
        w.append_episode(&batch, end).unwrap();
    }
    w.commit().unwrap();
    ds.snapshot().unwrap()
}

#[test]
fn compact_vectors_expand_to_the_full_gather_under_every_policy() {
    let dir = tempfile::tempdir().unwrap();
    let derived = vectors(dir.path(), "derived", false);
    let stored = vectors(dir.path(), "stored", true);
    assert!(derived.segments().len() > 1);
    for (snap, kind) in [(&derived, "derived"), (&stored, "stored")] {
        for cols in [
            &[col::OBSERVATION, col::NEXT_OBSERVATION, col::REWARD][..],
            &[col::NEXT_OBSERVATION, col::ACTION, col::OBSERVATION],
            &[col::NEXT_OBSERVATION, col::REWARD],
        ] {
            let g = Gatherer::try_new(snap, cols).unwrap();
            let tails = g.tail_columns().to_vec();
            let next = cols
                .iter()
                .position(|&c| c == col::NEXT_OBSERVATION)
                .unwrap();
            let has_obs = cols.contains(&col::OBSERVATION);
            assert_eq!(tails[next], kind == "derived" && has_obs, "{kind} {cols:?}");
            assert_eq!(tails.iter().filter(|&&t| t).count(), tails[next] as usize);
            for policy in policies() {
                for l in [1usize, 5, 9] {
                    let Ok(built) = SamplerSpec::uniform(l as u32, 40)
                        .with_policy(policy)
                        .with_seed(l as u64)
                        .build(snap)
                    else {
                        continue;
                    };
                    let mut plan = vec![];
                    for k in 0..6 {
                        built.sampler.plan(k, &mut plan);
                        let what = format!("{kind} {cols:?} {policy:?} L={l} batch {k}");
                        assert_compact_equals_full(&g, &plan, &what);
                    }
                }
            }
            // Whole episodes padded to the longest: every episode's first and last step.
            let plan: Vec<SliceRef> = (0..snap.episodes().len())
                .map(|e| SliceRef {
                    episode: e as u32,
                    start: 0,
                    len: snap.episodes().get(e).length as u32,
                })
                .collect();
            assert_compact_equals_full(&g, &plan, &format!("{kind} {cols:?} whole"));
            // Windows wholly outside their episode are all padding.
            let outside = [
                SliceRef {
                    episode: 0,
                    start: -9,
                    len: 4,
                },
                SliceRef {
                    episode: 1,
                    start: 40,
                    len: 4,
                },
            ];
            assert_compact_equals_full(&g, &outside, &format!("{kind} {cols:?} outside"));
        }
    }
}

#[test]
fn compact_frame_stacks_expand_to_the_full_gather() {
    let dir = tempfile::tempdir().unwrap();
    let (snap, _) =
        crate::gather::frames::write(dir.path(), trajstore::frames::FrameCodec::ZstdDict);
    // (K, padding, channels last, frame window)
    for (k, pad, last, window) in [
        (1, StackPad::Repeat, false, false),
        (4, StackPad::Repeat, false, false),
        (3, StackPad::Zeros, false, false),
        (4, StackPad::Repeat, true, false),
        (2, StackPad::Zeros, true, false),
        (4, StackPad::Repeat, false, true),
        (3, StackPad::Zeros, false, true),
        (1, StackPad::Repeat, false, true),
    ] {
        let stack = (k > 1 || last || window).then(|| {
            let s = FrameStack::new(k).unwrap().with_pad(pad);
            let s = if last { s.with_channels_last(true) } else { s };
            s.with_window(window)
        });
        for cols in [
            ["observation", "next_observation"],
            ["next_observation", "observation"],
        ] {
            let g = Gatherer::with_frame_stack(&snap, &cols, stack).unwrap();
            assert_eq!(g.tail_columns().iter().filter(|&&t| t).count(), 1);
            for policy in policies() {
                let Ok(built) = SamplerSpec::uniform(5, 32)
                    .with_policy(policy)
                    .with_seed(k as u64)
                    .build(&snap)
                else {
                    continue;
                };
                let mut plan = vec![];
                for b in 0..4 {
                    built.sampler.plan(b, &mut plan);
                    let what = format!(
                        "K={k} {pad} last={last} window={window} {cols:?} {policy:?} batch {b}"
                    );
                    assert_compact_equals_full(&g, &plan, &what);
                }
            }
        }
    }
}

#[test]
fn a_mix_ships_a_tail_only_where_every_part_derives_it() {
    let dir = tempfile::tempdir().unwrap();
    let derived = vectors(dir.path(), "derived", false);
    let stored = vectors(dir.path(), "stored", true);
    let cols = [col::OBSERVATION, col::NEXT_OBSERVATION];
    let part = |s: &trajstore::Snapshot| Arc::new(Gatherer::try_new(s, &cols).unwrap());
    let both = Gatherer::mixed(vec![part(&derived), part(&derived)], &[3, 5]).unwrap();
    assert_eq!(both.tail_columns(), vec![false, true]);
    let one = Gatherer::mixed(vec![part(&derived), part(&stored)], &[3, 5]).unwrap();
    assert_eq!(one.tail_columns(), vec![false, false]);
    let spec = SamplerSpec::uniform(6, 8).with_policy(BoundaryPolicy::Pad);
    let (a, b) = (spec.build(&derived).unwrap(), spec.build(&stored).unwrap());
    let (mut pa, mut pb) = (vec![], vec![]);
    for k in 0..4 {
        a.sampler.plan(k, &mut pa);
        b.sampler.plan(k, &mut pb);
        let plan: Vec<SliceRef> = pa[..3].iter().chain(&pb[..5]).copied().collect();
        assert_compact_equals_full(&both, &plan, &format!("derived+derived {k}"));
        assert_compact_equals_full(&one, &plan, &format!("derived+stored {k}"));
    }
}

#[test]
fn compact_destinations_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let snap = vectors(dir.path(), "derived", false);
    let g = Gatherer::try_new(&snap, &[col::OBSERVATION, col::NEXT_OBSERVATION]).unwrap();
    let plan = [SliceRef {
        episode: 2,
        start: 0,
        len: 4,
    }];
    let (mut o, mut t) = (vec![0u8; 4 * 12], vec![0u8; 12]);
    let (mut ids, mut starts) = ([0u64; 1], [0i64; 1]);
    let mut short_spans = [0i32; 2];
    let err = g
        .gather_compact(
            &plan,
            4,
            CompactInto {
                columns: vec![&mut o, &mut t],
                spans: &mut short_spans,
                episode_id: &mut ids,
                start_step: &mut starts,
            },
        )
        .unwrap_err();
    assert!(err.to_string().contains("smaller than a batch"), "{err}");
    let mut spans = [0i32; 3];
    let mut short_tail = vec![0u8; 11];
    let err = g
        .gather_compact(
            &plan,
            4,
            CompactInto {
                columns: vec![&mut o, &mut short_tail],
                spans: &mut spans,
                episode_id: &mut ids,
                start_step: &mut starts,
            },
        )
        .unwrap_err();
    assert!(err.to_string().contains("next_observation"), "{err}");
}

/// `gather_into_with_tails` (the Python ring's layout): the flag planes as `gather_into` writes
/// them, next_observation as one row per slice, derived as `CompactInto` documents; a column that
/// is not a derived next_observation cannot be a tail.
#[test]
fn planes_with_tails_derive_to_the_full_gather() {
    let dir = tempfile::tempdir().unwrap();
    let snap = vectors(dir.path(), "derived", false);
    let cols = [col::OBSERVATION, col::NEXT_OBSERVATION];
    let g = Gatherer::try_new(&snap, &cols).unwrap();
    let step = g.step_bytes()[0];
    let built = SamplerSpec::uniform(6, 12)
        .with_policy(BoundaryPolicy::Span { left: 2, right: 3 })
        .with_seed(5)
        .build(&snap)
        .unwrap();
    let mut plan = vec![];
    for k in 0..6 {
        built.sampler.plan(k, &mut plan);
        let mut full = Batch::default();
        g.gather(&plan, &mut full).unwrap();
        let (b, l) = (plan.len(), full.slice_len);
        let (mut obs, mut tail) = (vec![0u8; b * l * step], vec![0u8; b * step]);
        let mut planes = vec![vec![0u8; b * l]; 6];
        let (mut ids, mut starts) = (vec![0u64; b], vec![0i64; b]);
        let mut it = planes.iter_mut();
        let flags = std::array::from_fn(|_| it.next().unwrap().as_mut_slice());
        let dest = trajstore::GatherInto {
            columns: vec![&mut obs, &mut tail],
            flags,
            episode_id: &mut ids,
            start_step: &mut starts,
        };
        g.gather_into_with_tails(&plan, l, dest, &[false, true])
            .unwrap();
        assert_eq!(obs, full.columns[0].data.as_slice());
        assert_eq!(planes[0], full.mask);
        assert_eq!(planes[5], full.slice_end);
        let mut next = vec![0u8; b * l * step];
        for at in 0..b * l {
            let dst = &mut next[at * step..(at + 1) * step];
            if planes[5][at] == 1 {
                dst.copy_from_slice(&tail[at / l * step..(at / l + 1) * step]);
            } else if planes[0][at] == 1 {
                dst.copy_from_slice(&obs[(at + 1) * step..(at + 2) * step]);
            }
        }
        assert!(next == full.columns[1].data.as_slice(), "batch {k}");
    }
    let (mut o, mut t) = (vec![0u8; 1 << 12], vec![0u8; 1 << 12]);
    let mut planes = vec![vec![0u8; 64]; 6];
    let (mut ids, mut starts) = (vec![0u64; 8], vec![0i64; 8]);
    let mut it = planes.iter_mut();
    let flags = std::array::from_fn(|_| it.next().unwrap().as_mut_slice());
    let dest = trajstore::GatherInto {
        columns: vec![&mut o, &mut t],
        flags,
        episode_id: &mut ids,
        start_step: &mut starts,
    };
    let err = g
        .gather_into_with_tails(&plan[..1], 6, dest, &[true, true])
        .unwrap_err();
    assert!(err.to_string().contains("tails"), "{err}");
}
