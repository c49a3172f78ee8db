//! Gather through the public API: padding of slices outside their episode, the parallel path
//! against per-slice gathers, derived `next_observation` against a stored one,
//! `Batch::to_record_batch`, and `gather_into` caller memory.

use crate::common::TestData;
use crate::common::sampling::plans;
use arrow::array::{Array, AsArray};
use arrow::datatypes::{Float32Type, Int64Type, UInt8Type, UInt32Type, UInt64Type};
use trajstore::format::{col, ep};
use trajstore::{
    Batch, BoundaryPolicy, Dataset, EpisodeEnd, Error, Gatherer, Sampler, SamplerSpec, SliceRef,
    SliceSampler, TransitionSchema, WriterOptions,
};

// ---------------------------------------------------------------------------------------------
// Padding and the parallel path
// ---------------------------------------------------------------------------------------------
/// A slice that ends before its episode starts is all padding, like one that starts after the
/// episode's end: gathering it must not panic.
#[test]
fn gather_of_a_slice_wholly_outside_its_episode_is_padding() {
    let dir = tempfile::tempdir().unwrap();
    let snap = TestData::new()
        .obs_dim(2)
        .seed(1)
        .episodes([10, 4])
        .snapshot(&dir.path().join("d"));
    let g = Gatherer::try_new(&snap, &[col::REWARD, col::OBSERVATION]).unwrap();
    let mut batch = Batch::default();
    // After the end: fine today.
    g.gather(
        &[SliceRef {
            episode: 1,
            start: 4,
            len: 3,
        }],
        &mut batch,
    )
    .unwrap();
    assert_eq!(batch.mask, vec![0, 0, 0]);
    // Before the start (a start the span policy produces for left >= L): panics today with
    // "range end index 24 out of range for slice of length 12" in Gatherer::gather_slice
    // (`out[..off * step]` with off = a - start = 6 > L = 3).
    let plan = [
        SliceRef {
            episode: 0,
            start: 1,
            len: 3,
        },
        SliceRef {
            episode: 1,
            start: -6,
            len: 3,
        },
    ];
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        g.gather(&plan, &mut batch).unwrap();
    }));
    assert!(
        result.is_ok(),
        "gather panicked on a slice ending before its episode's start"
    );
    assert_eq!(batch.mask, vec![1, 1, 1, 0, 0, 0]);
    assert!(
        batch.columns[0].values::<f32>()[3..]
            .iter()
            .all(|&x| x == 0.0)
    );
    assert!(
        batch.columns[1].values::<f32>()[6..]
            .iter()
            .all(|&x| x == 0.0)
    );
    assert_eq!(batch.slice_end, vec![0, 0, 1, 0, 0, 0]);
}

/// A large batch (gathered in parallel) equals the slices gathered one at a time.
#[test]
fn parallel_gather_equals_per_slice_gather() {
    let dir = tempfile::tempdir().unwrap();
    let lens: Vec<u64> = (0..40).map(|i| 5 + (i * 37 % 90)).collect();
    let opts = WriterOptions::default()
        .with_segment_bytes(40_000)
        .with_batch_bytes(9_000);
    let snap = TestData::new()
        .obs_dim(48)
        .seed(11)
        .episodes(&lens)
        .writer_options(opts)
        .snapshot(&dir.path().join("d"));
    assert!(snap.segments().len() > 2);
    let policy = BoundaryPolicy::Span { left: 7, right: 9 };
    let index = snap.slice_index(24, policy).unwrap();
    let sampler = SliceSampler::try_new(
        index,
        snap.episodes(),
        &SamplerSpec::uniform(24, 256)
            .with_policy(policy)
            .with_seed(5),
    )
    .unwrap();
    let names = [
        col::OBSERVATION,
        col::REWARD,
        col::STEP,
        col::IS_LAST,
        "next_observation",
    ];
    let gatherer = Gatherer::try_new(&snap, &names).unwrap();
    let mut plan = vec![];
    sampler.plan(0, &mut plan);
    let mut big = Batch::default();
    gatherer.gather(&plan, &mut big).unwrap();
    assert!(
        big.data_bytes() >= 256 << 10,
        "large enough for the parallel path"
    );
    let mut one = Batch::default();
    for (i, s) in plan.iter().enumerate() {
        gatherer.gather(std::slice::from_ref(s), &mut one).unwrap();
        for (a, b) in big.columns.iter().zip(&one.columns) {
            let n = b.data.len();
            assert_eq!(
                &a.data.as_slice()[i * n..(i + 1) * n],
                b.data.as_slice(),
                "{}",
                a.name
            );
        }
        let r = i * 24..(i + 1) * 24;
        assert_eq!(&big.mask[r.clone()], &one.mask[..]);
        assert_eq!(&big.is_first[r.clone()], &one.is_first[..]);
        assert_eq!(&big.is_last[r.clone()], &one.is_last[..]);
        assert_eq!(&big.terminated[r.clone()], &one.terminated[..]);
        assert_eq!(&big.truncated[r.clone()], &one.truncated[..]);
        assert_eq!(&big.slice_end[r], &one.slice_end[..]);
        assert_eq!(
            (big.episode_id[i], big.start_step[i]),
            (one.episode_id[0], one.start_step[0])
        );
    }
    // Buffers are reused: gathering a smaller plan into the big batch shrinks it consistently.
    gatherer.gather(&plan[..3], &mut big).unwrap();
    assert_eq!(
        (big.num_slices, big.mask.len(), big.episode_id.len()),
        (3, 72, 3)
    );
    let obs = big.column(col::OBSERVATION).unwrap();
    assert_eq!(obs.data.len(), 3 * 24 * 48 * 4);
    assert_eq!(obs.shape, vec![48]);
}

// ---------------------------------------------------------------------------------------------
// Derived next_observation equals a stored one
// ---------------------------------------------------------------------------------------------
#[test]
fn derived_next_observation_equals_stored() {
    let dir = tempfile::tempdir().unwrap();
    let d = 3;
    let s = TestData::new().obs_dim(d).seed(31).spec();
    let lens: Vec<u64> = (0..25).map(|i| 1 + (i * 17 % 41)).collect();
    let stored_schema = TransitionSchema::builder(&[d], 2)
        .next_observation(true)
        .build()
        .unwrap();
    let stored = Dataset::create(dir.path().join("stored"), &stored_schema).unwrap();
    let derived = Dataset::create(dir.path().join("derived"), &s.schema().unwrap()).unwrap();
    let opts = WriterOptions::default()
        .with_segment_bytes(2500)
        .with_batch_bytes(700);
    let mut ws = stored.writer(opts.clone()).unwrap();
    let mut wd = derived.writer(opts).unwrap();
    for (i, &len) in lens.iter().enumerate() {
        let (batch, end) = s.episode(i as u64, len);
        let with_next = crate::common::with_next_observation(&batch, &end);
        assert_eq!(with_next.num_rows(), len as usize);
        ws.append_episode(&with_next, end.clone()).unwrap();
        wd.append_episode(&batch, end).unwrap();
    }
    ws.commit().unwrap();
    wd.commit().unwrap();
    let (ss, sd) = (stored.snapshot().unwrap(), derived.snapshot().unwrap());
    assert!(ss.schema().has_next_observation() && !sd.schema().has_next_observation());
    assert!(sd.segments().len() > 1 && ss.segments().len() > 1);
    let gs = Gatherer::try_new(&ss, &[col::NEXT_OBSERVATION, col::OBSERVATION]).unwrap();
    let gd = Gatherer::try_new(&sd, &[col::NEXT_OBSERVATION, col::OBSERVATION]).unwrap();
    for (l, policy) in [
        (8, BoundaryPolicy::Pad),
        (1, BoundaryPolicy::Strict),
        (41, BoundaryPolicy::Pad),
        (6, BoundaryPolicy::Span { left: 4, right: 5 }),
    ] {
        let index = sd.slice_index(l, policy).unwrap();
        assert_eq!(index.as_ref(), ss.slice_index(l, policy).unwrap().as_ref());
        let sampler = SliceSampler::try_new(
            index,
            sd.episodes(),
            &SamplerSpec::uniform(l, 48)
                .with_policy(policy)
                .with_seed(l as u64),
        )
        .unwrap();
        let (mut bs, mut bd) = (Batch::default(), Batch::default());
        let mut reached_end = 0;
        for plan in plans(&sampler, 0..8) {
            gs.gather(&plan, &mut bs).unwrap();
            gd.gather(&plan, &mut bd).unwrap();
            assert_eq!(bs.mask, bd.mask);
            assert_eq!(bs.is_last, bd.is_last);
            reached_end += bd.is_last.iter().filter(|&&x| x == 1).count();
            let (ns, nd) = (&bs.columns[0], &bd.columns[0]);
            assert_eq!(
                (ns.width, &ns.shape, &ns.data_type),
                (nd.width, &nd.shape, &nd.data_type)
            );
            assert_eq!(ns.shape, vec![d]);
            assert_eq!(
                ns.values::<f32>(),
                nd.values::<f32>(),
                "next_observation, L={l} {policy:?}, plan {plan:?}"
            );
            assert_eq!(bs.columns[1].data.as_slice(), bd.columns[1].data.as_slice());
            // And o_{t+1} is the observation of the next step inside a slice.
            let (obs, next) = (bd.columns[1].values::<f32>(), nd.values::<f32>());
            for i in 0..plan.len() * l as usize {
                if bd.mask[i] == 1 && bd.is_last[i] == 0 && (i + 1) % l as usize != 0 {
                    assert_eq!(&next[i * d..(i + 1) * d], &obs[(i + 1) * d..(i + 2) * d]);
                }
            }
        }
        if policy != BoundaryPolicy::Strict || l == 1 {
            assert!(reached_end > 0, "windows reach episode ends");
        }
    }
}

/// An episode appended without a final observation derives zeros after its last step.
#[test]
fn derived_next_observation_without_final_observation_is_zero() {
    let dir = tempfile::tempdir().unwrap();
    let s = TestData::new().obs_dim(2).seed(32).spec();
    let ds = Dataset::create(dir.path().join("d"), &s.schema().unwrap()).unwrap();
    let mut w = ds.writer(WriterOptions::default()).unwrap();
    let (b0, e0) = s.episode(0, 5);
    w.append_episode(&b0, e0).unwrap();
    let (b1, _) = s.episode(1, 4);
    w.append_episode(&b1, EpisodeEnd::truncated()).unwrap();
    let (b2, e2) = s.episode(2, 3);
    let fin = e2.final_observation.clone().unwrap();
    w.append_episode(&b2, e2).unwrap();
    w.commit().unwrap();
    let snap = ds.snapshot().unwrap();
    // The episode table holds a null for episode 1.
    let finals = snap.episode_column(ep::FINAL_OBSERVATION).unwrap();
    assert_eq!(finals[0].null_count(), 1);
    assert!(finals[0].is_null(1));
    let g = Gatherer::try_new(&snap, &[col::NEXT_OBSERVATION]).unwrap();
    let mut batch = Batch::default();
    let plan = [
        SliceRef {
            episode: 1,
            start: 2,
            len: 3,
        },
        SliceRef {
            episode: 2,
            start: 1,
            len: 3,
        },
    ];
    g.gather(&plan, &mut batch).unwrap();
    let next = batch.columns[0].values::<f32>();
    let obs1 = b1
        .column_by_name(col::OBSERVATION)
        .unwrap()
        .as_fixed_size_list()
        .clone();
    let o1 = obs1.values().as_primitive::<Float32Type>().values();
    assert_eq!(&next[0..2], &o1[6..8]); // o_3 after step 2
    assert_eq!(&next[2..4], &[0.0, 0.0]); // no o_4 stored
    assert_eq!(&next[4..6], &[0.0, 0.0]); // padding
    assert_eq!(batch.mask, vec![1, 1, 0, 1, 1, 0]);
    let f = fin
        .as_fixed_size_list()
        .values()
        .as_primitive::<Float32Type>()
        .clone();
    assert_eq!(&next[8..10], f.values()); // o_3 of episode 2 is its final observation
}

// ---------------------------------------------------------------------------------------------
// Batch::to_record_batch
// ---------------------------------------------------------------------------------------------
#[test]
fn to_record_batch_round_trips_the_buffers() {
    let dir = tempfile::tempdir().unwrap();
    let lens = [5u64, 12, 3, 20, 9];
    let snap = TestData::new()
        .obs_dim(3)
        .seed(40)
        .episodes(lens)
        .snapshot(&dir.path().join("d"));
    let policy = BoundaryPolicy::Span { left: 2, right: 3 };
    let index = snap.slice_index(6, policy).unwrap();
    let sampler = SliceSampler::try_new(
        index,
        snap.episodes(),
        &SamplerSpec::uniform(6, 10).with_policy(policy).with_seed(3),
    )
    .unwrap();
    let g = Gatherer::try_new(&snap, &[col::OBSERVATION, col::ACTION, col::REWARD]).unwrap();
    let mut plan = vec![];
    sampler.plan(0, &mut plan);
    let mut batch = Batch::default();
    g.gather(&plan, &mut batch).unwrap();
    let rb = batch.to_record_batch().unwrap();
    let (b, l) = (10usize, 6usize);
    assert_eq!(rb.num_rows(), b * l);
    let u64s = |name: &str| {
        rb.column_by_name(name)
            .unwrap()
            .as_primitive::<UInt64Type>()
            .values()
            .to_vec()
    };
    let u8s = |name: &str| {
        rb.column_by_name(name)
            .unwrap()
            .as_primitive::<UInt8Type>()
            .values()
            .to_vec()
    };
    assert_eq!(
        u64s("slice"),
        (0..b * l).map(|i| (i / l) as u64).collect::<Vec<_>>()
    );
    assert_eq!(
        u64s(col::EPISODE_ID),
        (0..b * l)
            .map(|i| batch.episode_id[i / l])
            .collect::<Vec<_>>()
    );
    let steps = rb
        .column_by_name(col::STEP)
        .unwrap()
        .as_primitive::<Int64Type>()
        .values()
        .to_vec();
    assert_eq!(
        steps,
        (0..b * l)
            .map(|i| plan[i / l].start + (i % l) as i64)
            .collect::<Vec<_>>()
    );
    for name in [col::OBSERVATION, col::ACTION] {
        let a = rb.column_by_name(name).unwrap().as_fixed_size_list();
        let c = batch.column(name).unwrap();
        assert_eq!(a.len(), b * l);
        assert_eq!(a.value_length() as usize, c.width);
        assert_eq!(
            a.values().as_primitive::<Float32Type>().values(),
            c.values::<f32>(),
            "{name}"
        );
    }
    let r = rb
        .column_by_name(col::REWARD)
        .unwrap()
        .as_primitive::<Float32Type>();
    assert_eq!(
        r.values(),
        batch.column(col::REWARD).unwrap().values::<f32>()
    );
    for (name, v) in [
        ("mask", &batch.mask),
        (col::IS_FIRST, &batch.is_first),
        (col::IS_LAST, &batch.is_last),
        (col::TERMINATED, &batch.terminated),
        (col::TRUNCATED, &batch.truncated),
        ("slice_end", &batch.slice_end),
    ] {
        assert_eq!(&u8s(name), v, "{name}");
    }
    assert_eq!(rb.num_columns(), 3 + 3 + 6);
    // A stored boolean and an integer column round trip too.
    let g = Gatherer::try_new(&snap, &["is_last", "step"]).unwrap();
    g.gather(&plan, &mut batch).unwrap();
    let rb = batch.to_record_batch().unwrap();
    assert_eq!(rb.num_rows(), b * l);
    // Gathered columns take the place of the metadata and flag columns of the same name.
    let names: Vec<_> = rb
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    let unique: std::collections::HashSet<_> = names.iter().collect();
    assert_eq!(
        unique.len(),
        names.len(),
        "duplicate column names: {names:?}"
    );
    let stored_last: Vec<bool> = rb
        .column_by_name("is_last")
        .unwrap()
        .as_boolean()
        .iter()
        .map(|x| x.unwrap())
        .collect();
    assert_eq!(
        stored_last,
        batch.is_last.iter().map(|&x| x == 1).collect::<Vec<_>>(),
        "stored is_last column equals the flag"
    );
    let step_col = rb
        .column_by_name("step")
        .unwrap()
        .as_primitive::<UInt32Type>();
    for (i, (&m, &step)) in batch.mask.iter().zip(&steps).enumerate() {
        if m == 1 {
            assert_eq!(step_col.value(i) as i64, step);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// gather_into
// ---------------------------------------------------------------------------------------------
/// `gather_into` (what the torch loader's pinned staging uses) writes exactly what `gather` does,
/// pads short plans and rejects destinations or slices that do not fit, without writing.
#[test]
fn gather_into_caller_memory_equals_gather_and_checks_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let lens: Vec<u64> = (0..30).map(|i| 3 + (i * 29 % 60)).collect();
    let snap = TestData::new()
        .obs_dim(6)
        .seed(3)
        .episodes(&lens)
        .snapshot(&dir.path().join("d"));
    let policy = BoundaryPolicy::Pad;
    let index = snap.slice_index(10, policy).unwrap();
    let opts = SamplerSpec::uniform(10, 16)
        .with_policy(policy)
        .with_seed(2);
    let sampler = SliceSampler::try_new(index, snap.episodes(), &opts).unwrap();
    let names = [
        col::OBSERVATION,
        col::STEP,
        col::IS_LAST,
        "next_observation",
    ];
    let g = Gatherer::try_new(&snap, &names).unwrap();
    let steps = g.step_bytes();
    assert_eq!(steps, vec![24, 4, 1, 24]);
    let mut plan = vec![];
    sampler.plan(4, &mut plan);
    let mut want = Batch::default();
    g.gather(&plan, &mut want).unwrap();
    let (b, l) = (16, 10);
    // Caller memory, dirty on purpose: everything must be overwritten.
    let mut cols: Vec<Vec<u8>> = steps.iter().map(|s| vec![0xAB; b * l * s]).collect();
    let mut flags = vec![vec![7u8; b * l]; 6];
    let (mut ids, mut starts) = (vec![9u64; b], vec![9i64; b]);
    fn dest<'a>(
        cols: &'a mut [Vec<u8>],
        flags: &'a mut [Vec<u8>],
        ids: &'a mut [u64],
        starts: &'a mut [i64],
    ) -> trajstore::GatherInto<'a> {
        let mut f = flags.iter_mut();
        trajstore::GatherInto {
            columns: cols.iter_mut().map(|c| c.as_mut_slice()).collect(),
            flags: std::array::from_fn(|_| f.next().unwrap().as_mut_slice()),
            episode_id: ids,
            start_step: starts,
        }
    }
    g.gather_into(&plan, l, dest(&mut cols, &mut flags, &mut ids, &mut starts))
        .unwrap();
    for (c, got) in want.columns.iter().zip(&cols) {
        assert_eq!(c.data.as_slice(), got.as_slice(), "{}", c.name);
    }
    let want_flags = [
        &want.mask,
        &want.is_first,
        &want.is_last,
        &want.terminated,
        &want.truncated,
        &want.slice_end,
    ];
    for (w, got) in want_flags.iter().zip(&flags) {
        assert_eq!(*w, got);
    }
    assert_eq!(
        (ids.clone(), starts.clone()),
        (want.episode_id.clone(), want.start_step.clone())
    );
    // Slices longer than the destination's slice length, and short destinations, are errors.
    let e = g
        .gather_into(
            &plan,
            l - 1,
            dest(&mut cols, &mut flags, &mut ids, &mut starts),
        )
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    assert!(e.to_string().contains("does not fit"), "{e}");
    cols[0].truncate(b * l * steps[0] - 1);
    let e = g
        .gather_into(&plan, l, dest(&mut cols, &mut flags, &mut ids, &mut starts))
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    assert!(
        e.to_string().contains("destination of `observation`"),
        "{e}"
    );
}
