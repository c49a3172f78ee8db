//! Mixing two datasets in every batch (RLPD-style symmetric sampling, issue 22): a
//! `MixSampler` of one slice sampler per dataset plans part 0's slices then part 1's, and a
//! mixed `Gatherer` of one gatherer per dataset gathers each range from its own dataset. Every
//! batch holds exactly its counts from each part, with the same values as the part's own
//! gatherer; within the mix each part keeps its own sampling law (chi-square); mismatched parts
//! are refused; the batches do not depend on the loader's workers.

use std::sync::Arc;

use crate::common::sampling::{assert_fits, check_gathered};
use crate::common::{TestData, assert_invalid_argument, err_of, open_loader};
use arrow::array::AsArray;
use arrow::datatypes::UInt16Type;
use trajstore::format::col;
use trajstore::{
    Batch, BoundaryPolicy, EpochSampler, Error, GatherInto, Gatherer, LoaderOptions, LoaderSpec,
    MixSampler, ReadAhead, Sampler, SamplerSpec, SliceRef, SliceSampler, Snapshot, mix_counts,
};

const L: u32 = 5;
/// "Offline" data: many short episodes, in several segments (two shorter than a slice).
const LENS_A: [u64; 9] = [6, 9, 12, 20, 3, 30, 15, 5, 4];
/// "Online" data: fewer, longer episodes, of other observations (another seed).
const LENS_B: [u64; 5] = [40, 11, 25, 8, 18];
/// `next_observation` is derived (from the final observations at episode ends).
const COLUMNS: [&str; 5] = [
    col::OBSERVATION,
    col::NEXT_OBSERVATION,
    col::REWARD,
    col::EPISODE_ID,
    col::STEP,
];

fn datasets(dir: &std::path::Path) -> (Snapshot, Snapshot) {
    let a = TestData::new()
        .obs_dim(3)
        .seed(11)
        .episodes(LENS_A)
        .segment_bytes(1500)
        .snapshot(&dir.join("offline"));
    let b = TestData::new()
        .obs_dim(3)
        .seed(12)
        .episodes(LENS_B)
        .snapshot(&dir.join("online"));
    assert!(a.segments().len() > 1);
    (a, b)
}

fn sampler(snap: &Snapshot, num_slices: usize, seed: u64) -> Arc<SliceSampler> {
    let index = snap.slice_index(L, BoundaryPolicy::Strict).unwrap();
    let opts = SamplerSpec::uniform(L, num_slices).with_seed(seed);
    Arc::new(SliceSampler::try_new(index, snap.episodes(), &opts).unwrap())
}

/// What [`half_and_half`] builds by hand, as a loader's spec: the same parts (seeds 1 and 2),
/// half of `num_slices` each.
fn half_and_half_spec(a: &Snapshot, b: &Snapshot, num_slices: usize) -> LoaderSpec {
    LoaderSpec::new(&COLUMNS)
        .part(
            a.clone(),
            SamplerSpec::uniform(L, num_slices).with_seed(1),
            0.5,
        )
        .part(
            b.clone(),
            SamplerSpec::uniform(L, num_slices).with_seed(2),
            0.5,
        )
        .with_num_slices(num_slices)
}

fn gatherer(snap: &Snapshot, columns: &[&str]) -> Arc<Gatherer> {
    Arc::new(Gatherer::try_new(snap, columns).unwrap())
}

/// Windows of `L` steps per episode (strict policy): the law of the windows weighting.
fn windows(lens: &[u64]) -> Vec<f64> {
    lens.iter()
        .map(|&n| (n + 1).saturating_sub(L as u64) as f64)
        .collect()
}

/// A 50/50 mix of the two datasets, `per_part` slices each: the parts' samplers and gatherers,
/// the mix and the mixed gatherer.
struct Mix {
    parts: [Arc<SliceSampler>; 2],
    gatherers: [Arc<Gatherer>; 2],
    mix: MixSampler,
    gatherer: Gatherer,
}

fn half_and_half(a: &Snapshot, b: &Snapshot, num_slices: usize) -> Mix {
    let counts = mix_counts(&[0.5, 0.5], num_slices).unwrap();
    assert_eq!(counts, [num_slices / 2; 2]);
    let parts = [sampler(a, counts[0], 1), sampler(b, counts[1], 2)];
    let mix = MixSampler::try_new(vec![parts[0].clone(), parts[1].clone()]).unwrap();
    assert_eq!((mix.num_slices(), mix.slice_len()), (num_slices, L));
    assert_eq!(mix.counts(), counts);
    let gatherers = [gatherer(a, &COLUMNS), gatherer(b, &COLUMNS)];
    let gatherer = Gatherer::mixed(gatherers.to_vec(), mix.counts()).unwrap();
    Mix {
        parts,
        gatherers,
        mix,
        gatherer,
    }
}

fn plan_of(s: &dyn Sampler, k: u64) -> Vec<SliceRef> {
    let mut p = vec![];
    s.plan(k, &mut p);
    p
}

/// Slices `[from, from + n)` of `big` equal the whole of `small` (columns, flags, per-slice).
fn assert_slices_equal(big: &Batch, from: usize, small: &Batch, what: &str) {
    let (n, l) = (small.num_slices, small.slice_len);
    assert_eq!(big.slice_len, l, "{what}");
    for (c, s) in big.columns.iter().zip(&small.columns) {
        assert_eq!(c.name, s.name, "{what}");
        let step = c.step_bytes();
        assert_eq!(
            &c.data.as_slice()[from * l * step..(from + n) * l * step],
            s.data.as_slice(),
            "{what}: column {}",
            c.name
        );
    }
    let steps = from * l..(from + n) * l;
    for (name, x, y) in [
        ("mask", &big.mask, &small.mask),
        ("is_first", &big.is_first, &small.is_first),
        ("is_last", &big.is_last, &small.is_last),
        ("terminated", &big.terminated, &small.terminated),
        ("truncated", &big.truncated, &small.truncated),
        ("slice_end", &big.slice_end, &small.slice_end),
    ] {
        assert_eq!(&x[steps.clone()], &y[..], "{what}: {name}");
    }
    assert_eq!(
        &big.episode_id[from..from + n],
        &small.episode_id[..],
        "{what}"
    );
    assert_eq!(
        &big.start_step[from..from + n],
        &small.start_step[..],
        "{what}"
    );
}

#[test]
fn every_batch_takes_half_its_slices_from_each_dataset_with_their_values() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = datasets(dir.path());
    let m = half_and_half(&a, &b, 64);
    let g = &m.gatherer;
    assert!(g.is_mixed() && !m.gatherers[0].is_mixed());
    assert_eq!(g.mix_parts().unwrap().1, [32, 32]);
    assert_eq!(g.columns().count(), COLUMNS.len());
    assert_eq!(g.step_bytes(), m.gatherers[0].step_bytes());
    assert_eq!(
        g.batch_bytes(64, L as usize).unwrap(),
        m.gatherers[1].batch_bytes(64, L as usize).unwrap()
    );
    assert_eq!(g.snapshot().path(), a.path(), "part 0's snapshot");
    assert_eq!(g.episode_flags(), m.gatherers[0].episode_flags());
    let sources: Vec<u16> = [0u16, 1].iter().flat_map(|&p| [p; 32]).collect();
    assert_eq!(g.slice_sources(64), sources);
    assert_eq!(m.gatherers[0].slice_sources(3), [0, 0, 0]);

    let (mut batch, mut part) = (Batch::default(), [Batch::default(), Batch::default()]);
    let (mut plan, mut from_a, mut from_b) = (vec![], 0, 0);
    for k in 0..40 {
        m.mix.plan(k, &mut plan);
        let plans = [
            plan_of(m.parts[0].as_ref(), k),
            plan_of(m.parts[1].as_ref(), k),
        ];
        assert_eq!(plan.len(), 64, "batch {k}");
        assert_eq!(&plan[..32], plans[0], "batch {k}: part 0 first");
        assert_eq!(&plan[32..], plans[1], "batch {k}: then part 1");
        g.gather(&plan, &mut batch).unwrap();
        assert_eq!(batch.source, sources, "batch {k}: exactly half from each");
        for (i, p) in plans.iter().enumerate() {
            m.gatherers[i].gather(p, &mut part[i]).unwrap();
            assert_eq!(part[i].source, [0; 32], "a plain gatherer's source");
            assert_slices_equal(&batch, 32 * i, &part[i], &format!("batch {k} part {i}"));
        }
        // The parts' batches are the datasets' rows (so the mix's are too), and the two
        // datasets' observations differ.
        check_gathered(&a, &plans[0], &part[0]);
        check_gathered(&b, &plans[1], &part[1]);
        let obs = |p: &Batch| p.column(col::OBSERVATION).unwrap().values::<f32>().to_vec();
        assert_ne!(obs(&part[0]), obs(&part[1]));
        from_a += plans[0].len();
        from_b += plans[1].len();
    }
    assert_eq!((from_a, from_b), (40 * 32, 40 * 32));

    // The Arrow copy says which part each step came from; a plain batch has no such column.
    let rb = batch.to_record_batch().unwrap();
    let source = rb
        .column_by_name("source")
        .unwrap()
        .as_primitive::<UInt16Type>();
    let want: Vec<u16> = sources.iter().flat_map(|&s| [s; L as usize]).collect();
    assert_eq!(source.values().to_vec(), want);
    assert!(
        part[0]
            .to_record_batch()
            .unwrap()
            .column_by_name("source")
            .is_none()
    );

    // gather_into caller memory: the same bytes as gather.
    let (n, l) = (64, L as usize);
    let mut cols: Vec<Vec<u8>> = g
        .step_bytes()
        .iter()
        .map(|s| vec![0xAB; n * l * s])
        .collect();
    let mut flags: [Vec<u8>; 6] = std::array::from_fn(|_| vec![0xAB; n * l]);
    let (mut ids, mut starts) = (vec![7u64; n], vec![7i64; n]);
    let dest = GatherInto {
        columns: cols.iter_mut().map(|c| c.as_mut_slice()).collect(),
        flags: flags.each_mut().map(|f| f.as_mut_slice()),
        episode_id: &mut ids,
        start_step: &mut starts,
    };
    g.gather_into(&plan, l, dest).unwrap();
    for (c, got) in batch.columns.iter().zip(&cols) {
        assert_eq!(c.data.as_slice(), got.as_slice(), "gather_into: {}", c.name);
    }
    assert_eq!(
        (ids, starts),
        (batch.episode_id.clone(), batch.start_step.clone())
    );
    assert_eq!(flags[0], batch.mask);
    assert_eq!(flags[5], batch.slice_end);

    // Per-plan helpers go to the parts by range: the datasets are other files, so no page is
    // shared.
    let plans = [
        plan_of(m.parts[0].as_ref(), 39),
        plan_of(m.parts[1].as_ref(), 39),
    ];
    assert_eq!(
        g.pages_touched(&plan),
        m.gatherers[0].pages_touched(&plans[0]) + m.gatherers[1].pages_touched(&plans[1])
    );
    g.advise(&plan);
    g.set_read_ahead(ReadAhead::Never);
    assert_eq!(m.gatherers[1].read_ahead(), ReadAhead::Never);
    assert!(!g.reading_ahead());
}

#[test]
fn each_part_keeps_its_own_episode_distribution_within_the_mix() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = datasets(dir.path());
    let m = half_and_half(&a, &b, 1000);
    let (mut per_a, mut per_b) = (vec![0u64; LENS_A.len()], vec![0u64; LENS_B.len()]);
    let mut plan = vec![];
    for k in 0..200 {
        m.mix.plan(k, &mut plan);
        for s in &plan[..500] {
            per_a[s.episode as usize] += 1;
        }
        for s in &plan[500..] {
            per_b[s.episode as usize] += 1;
        }
    }
    // Uniform over windows: an episode is drawn in proportion to its number of windows (those
    // shorter than a slice never).
    assert_fits("offline part", &per_a, &windows(&LENS_A));
    assert_fits("online part", &per_b, &windows(&LENS_B));
    assert_eq!(per_a.iter().sum::<u64>(), per_b.iter().sum::<u64>());
}

#[test]
fn parts_gathering_other_columns_are_refused_at_construction() {
    let dir = tempfile::tempdir().unwrap();
    let (a, _b) = datasets(dir.path());
    let ga = gatherer(&a, &COLUMNS);
    // Another observation shape.
    let wide = TestData::new()
        .obs_dim(4)
        .episodes(LENS_B)
        .snapshot(&dir.path().join("wide"));
    let e = Gatherer::mixed(vec![ga.clone(), gatherer(&wide, &COLUMNS)], &[2, 2]).unwrap_err();
    let Error::SchemaMismatch {
        column,
        expected,
        found,
        ..
    } = &e
    else {
        panic!("not a schema mismatch: {e}");
    };
    assert_eq!(column.as_deref(), Some(col::OBSERVATION), "{e}");
    assert!(expected.as_deref().unwrap().contains("[3]"), "{e}");
    assert!(found.as_deref().unwrap().contains("[4] in part 1"), "{e}");
    // Another action type (discrete: int64 scalars, not float32 pairs).
    let discrete = TestData::new()
        .discrete_actions(true)
        .obs_dim(3)
        .episodes(LENS_B)
        .snapshot(&dir.path().join("discrete"));
    let cols = [col::OBSERVATION, col::ACTION];
    let e = err_of(Gatherer::mixed(
        vec![
            gatherer(&a, &cols),
            gatherer(&a, &cols),
            gatherer(&discrete, &cols),
        ],
        &[1, 1, 1],
    ));
    let msg = e.to_string();
    assert!(matches!(e, Error::SchemaMismatch { .. }), "{msg}");
    assert!(
        msg.contains("column `action`") && msg.contains("part 2"),
        "{msg}"
    );
    assert!(msg.contains("Float32") && msg.contains("Int64"), "{msg}");
    // Other columns, or the same in another order.
    for other in [vec![col::OBSERVATION], vec![col::REWARD, col::OBSERVATION]] {
        let e = err_of(Gatherer::mixed(
            vec![
                gatherer(&a, &[col::OBSERVATION, col::REWARD]),
                gatherer(&a, &other),
            ],
            &[1, 1],
        ));
        assert_invalid_argument(&e, Some("columns"), "other columns");
        assert!(e.to_string().contains("part 1"), "{e}");
    }
    assert_invalid_argument(
        &err_of(Gatherer::mixed(vec![ga.clone(), ga.clone()], &[4])),
        Some("counts"),
        "counts of another length",
    );
    assert_invalid_argument(
        &err_of(Gatherer::mixed(vec![ga.clone(), ga.clone()], &[0, 0])),
        Some("counts"),
        "no slice",
    );
    assert_invalid_argument(
        &err_of(Gatherer::mixed(vec![], &[])),
        Some("parts"),
        "no part",
    );
}

#[test]
fn mixes_refuse_epoch_samplers_and_other_slice_lengths() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = datasets(dir.path());
    let index = b.slice_index(L, BoundaryPolicy::Strict).unwrap();
    let epoch = Arc::new(EpochSampler::windows(index, 8, 3, false).unwrap());
    let e = err_of(MixSampler::try_new(vec![sampler(&a, 8, 1), epoch]));
    assert_invalid_argument(&e, Some("parts"), "an epoch part");
    let msg = e.to_string();
    assert!(msg.contains("part 1 samples without replacement"), "{msg}");
    assert!(msg.contains("use an endless sampler"), "{msg}");

    let index = b.slice_index(L + 1, BoundaryPolicy::Strict).unwrap();
    let longer =
        SliceSampler::try_new(index, b.episodes(), &SamplerSpec::uniform(L + 1, 8)).unwrap();
    let e = err_of(MixSampler::try_new(vec![
        sampler(&a, 8, 1),
        Arc::new(longer),
    ]));
    assert_invalid_argument(&e, Some("slice_len"), "other slice lengths");
    assert!(
        e.to_string().contains("5 steps and part 1 slices of 6"),
        "{e}"
    );
}

#[test]
fn bad_mixed_plans_are_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = datasets(dir.path());
    let m = half_and_half(&a, &b, 8);
    let g = &m.gatherer;
    let mut plan = plan_of(&m.mix, 0);
    let mut batch = Batch::default();
    let e = g.gather(&plan[..7], &mut batch).unwrap_err();
    assert_invalid_argument(&e, Some("plan"), "a plan of 7 slices for 8");
    assert!(e.to_string().contains("counts [4, 4]"), "{e}");
    // Episode position 8 is in the offline data, not in the online data (5 episodes).
    plan[6].episode = 8;
    let (n, l) = (8, L as usize);
    let mut cols: Vec<Vec<u8>> = g
        .step_bytes()
        .iter()
        .map(|s| vec![0xAB; n * l * s])
        .collect();
    let mut flags: [Vec<u8>; 6] = std::array::from_fn(|_| vec![0xAB; n * l]);
    let (mut ids, mut starts) = (vec![7u64; n], vec![7i64; n]);
    let dest = GatherInto {
        columns: cols.iter_mut().map(|c| c.as_mut_slice()).collect(),
        flags: flags.each_mut().map(|f| f.as_mut_slice()),
        episode_id: &mut ids,
        start_step: &mut starts,
    };
    let e = g.gather_into(&plan, l, dest).unwrap_err();
    assert_invalid_argument(&e, Some("plan"), "an online slice of an offline position");
    assert!(e.to_string().contains("part 1 of the mix"), "{e}");
    assert!(cols.iter().flatten().all(|&x| x == 0xAB), "nothing written");
    assert!(
        flags.iter().flatten().all(|&x| x == 0xAB),
        "nothing written"
    );
    assert!(ids.iter().all(|&x| x == 7) && starts.iter().all(|&x| x == 7));
}

#[test]
fn mixed_batches_do_not_depend_on_the_loader_workers() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = datasets(dir.path());
    let m = half_and_half(&a, &b, 256);
    let (mix, gatherer) = (Arc::new(m.mix), Arc::new(m.gatherer));
    let n = 16;
    let key = |b: &Batch| {
        let cols: Vec<Vec<u8>> = b
            .columns
            .iter()
            .map(|c| c.data.as_slice().to_vec())
            .collect();
        (
            cols,
            b.episode_id.clone(),
            b.start_step.clone(),
            b.mask.clone(),
            b.source.clone(),
        )
    };
    let mut want = vec![];
    let (mut plan, mut batch) = (vec![], Batch::default());
    for k in 0..n {
        mix.plan(k, &mut plan);
        gatherer.gather(&plan, &mut batch).unwrap();
        want.push(key(&batch));
    }
    for workers in [1, 4] {
        let opts = LoaderOptions::default()
            .with_workers(workers)
            .with_max_batches(n);
        // The loader builds its own mix from the spec: the same batches as the one by hand.
        let loader = open_loader(half_and_half_spec(&a, &b, 256), opts).unwrap();
        let got: Vec<_> = loader.map(|b| key(&b)).collect();
        assert_eq!(got.len(), n as usize, "{workers} workers");
        assert!(got == want, "{workers} workers: other batches");
    }
    assert_eq!(want[0].4.iter().filter(|&&s| s == 1).count(), 128);
}

/// The torch loader streams mixed batches (gathered into its staging memory by range), and
/// refuses to make a mix resident (it would upload part 0's snapshot only).
#[cfg(feature = "torch")]
#[test]
fn the_torch_loader_streams_a_mix_but_does_not_make_it_resident() {
    use trajstore::BatchSource;
    use trajstore::torch::{TorchLoader, TorchLoaderOptions};
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = datasets(dir.path());
    let m = half_and_half(&a, &b, 16);
    let (mix, gatherer) = (Arc::new(m.mix), Arc::new(m.gatherer));
    let cpu = || {
        TorchLoaderOptions::new(tch::Device::Cpu)
            .with_loader(LoaderOptions::default().with_workers(2).with_max_batches(4))
    };
    let source = BatchSource::open(half_and_half_spec(&a, &b, 16)).unwrap();
    let loader = TorchLoader::new(&source, cpu()).unwrap();
    let (mut plan, mut batch) = (vec![], Batch::default());
    for (k, t) in loader.enumerate() {
        let t = t.unwrap();
        mix.plan(k as u64, &mut plan);
        gatherer.gather(&plan, &mut batch).unwrap();
        let ids: Vec<i64> = Vec::try_from(&t.episode_id.flatten(0, -1)).unwrap();
        let want: Vec<i64> = batch.episode_id.iter().map(|&i| i as i64).collect();
        assert_eq!(ids, want, "batch {k}");
        let obs = t.get(col::OBSERVATION).unwrap().flatten(0, -1);
        let obs: Vec<f32> = Vec::try_from(&obs).unwrap();
        assert_eq!(
            obs,
            batch.column(col::OBSERVATION).unwrap().values::<f32>(),
            "batch {k}"
        );
    }
    let e = err_of(TorchLoader::new(&source, cpu().with_resident(1 << 30)));
    assert_invalid_argument(&e, Some("gatherer"), "a resident mix");
    assert!(e.to_string().contains("mixed gatherer"), "{e}");
}
