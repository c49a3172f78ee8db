//! Exact resume (issue 22): a loader state taken at a random batch continues with the same next
//! 100 batches as the uninterrupted run, for every sampler, with 1 → 4 and 4 → 1 workers and
//! per rank; priorities survive; states of another dataset, rank or sampler are refused; a state
//! resumes on its version after the dataset grew.

use std::sync::{Arc, Mutex};

use crate::common::{TestData, err_of, open_loader};
use rand::{Rng, SeedableRng};
use trajstore::format::col;
use trajstore::{
    Batch, BatchSource, Dataset, GatherInto, Gatherer, Loader, LoaderOptions, LoaderSpec,
    LoaderState, SamplerKind, SamplerSpec, Snapshot, StagedLoader, StagingSlot, Weighting,
};

const COLUMNS: [&str; 4] = [col::OBSERVATION, col::REWARD, col::EPISODE_ID, col::STEP];

/// Everything a batch holds, as bytes, to compare batches bit for bit.
fn fingerprint(b: &Batch) -> Vec<u8> {
    let mut out = Vec::new();
    for c in &b.columns {
        out.extend_from_slice(c.name.as_bytes());
        out.extend_from_slice(c.data.as_slice());
    }
    for f in [
        &b.mask,
        &b.is_first,
        &b.is_last,
        &b.terminated,
        &b.truncated,
        &b.slice_end,
    ] {
        out.extend_from_slice(f);
    }
    out.extend(b.episode_id.iter().flat_map(|x| x.to_le_bytes()));
    out.extend(b.start_step.iter().flat_map(|x| x.to_le_bytes()));
    out.extend(b.source.iter().flat_map(|x| x.to_le_bytes()));
    out
}

fn opts(workers: usize) -> LoaderOptions {
    LoaderOptions::default()
        .with_workers(workers)
        .with_prefetch(3)
}

/// `snap` sampled by `s`, as rank `rank` of `world`.
fn spec_of(snap: &Snapshot, s: &SamplerSpec, (rank, world): (u64, u64)) -> LoaderSpec {
    LoaderSpec::single(snap.clone(), s.clone(), &COLUMNS).with_rank(rank, world)
}

/// Priorities the prioritized cases set before sampling (the same in both runs).
fn set_priorities(loader: &Loader) {
    if let Some(p) = loader.prioritized(0) {
        let n = 40u64;
        let windows: Vec<u64> = (0..n).map(|i| i * 7).collect();
        let prios: Vec<f64> = (0..n).map(|i| 0.5 + (i % 5) as f64 * 3.0).collect();
        p.update_priorities(&windows, &prios).unwrap();
    }
}

/// The batches `k..k + 100` of an uninterrupted run, and of a run stopped after `k` batches
/// (workers `a`), whose state goes through bytes into a new loader (workers `b`).
fn compare(snap: &Snapshot, s: &SamplerSpec, k: u64, (a, b): (usize, usize), rank: (u64, u64)) {
    let ctx = format!("{:?} at {k}, workers {a} -> {b}, rank {rank:?}", s.kind);
    let mut whole = open_loader(spec_of(snap, s, rank), opts(a).with_max_batches(k + 100)).unwrap();
    set_priorities(&whole);
    let want: Vec<Vec<u8>> = whole
        .by_ref()
        .skip(k as usize)
        .map(|b| fingerprint(&b))
        .collect();
    assert_eq!(want.len(), 100, "{ctx}");

    // (Epoch samplers stop at the end of an epoch unless told how many batches to give.)
    let mut first = open_loader(spec_of(snap, s, rank), opts(a).with_max_batches(k + 100)).unwrap();
    set_priorities(&first);
    for _ in 0..k {
        first.next_batch().unwrap();
    }
    let bytes = first.state().to_bytes();
    drop(first);
    let state = LoaderState::from_bytes(&bytes).unwrap();
    assert_eq!(state.next_batch, k, "{ctx}");
    assert_eq!(
        state.parts[0].priorities.is_some(),
        s.kind == SamplerKind::Prioritized,
        "{ctx}"
    );
    let resumed = open_loader(
        spec_of(snap, s, rank).with_resume(state),
        opts(b).with_max_batches(100),
    )
    .unwrap();
    let got: Vec<Vec<u8>> = resumed.map(|b| fingerprint(&b)).collect();
    assert_eq!(got.len(), 100, "{ctx}");
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            g == w,
            "{ctx}: batch {} differs after the resume",
            k + i as u64
        );
    }
}

fn dataset(dir: &std::path::Path) -> Snapshot {
    TestData::new()
        .obs_dim(3)
        .seed(5)
        .episodes((0..40u64).map(|i| 5 + (i * 13) % 37))
        .snapshot(&dir.join("d"))
}

fn samplers() -> Vec<SamplerSpec> {
    let s = |k| SamplerSpec::new(k, 6, 8).with_seed(11);
    vec![
        s(SamplerKind::Uniform),
        s(SamplerKind::Uniform).with_weighting(Weighting::Episodes),
        s(SamplerKind::Uniform).with_episode_ids((0..40).step_by(3).collect()),
        s(SamplerKind::Epoch),
        s(SamplerKind::EpochEpisodes).with_drop_last(true),
        SamplerSpec::new(SamplerKind::Episodes, 45, 4).with_seed(3),
        s(SamplerKind::Prioritized).with_alpha(0.8),
    ]
}

#[test]
fn resume_continues_with_the_same_batches_for_every_sampler_and_worker_count() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path());
    let mut rng = rand::rngs::StdRng::seed_from_u64(22);
    for s in samplers() {
        for workers in [(1, 4), (4, 1)] {
            // At least the batches in flight, so that priorities set at the start are in
            // effect for every compared batch.
            let k = rng.random_range(12..60);
            compare(&snap, &s, k, workers, (0, 1));
        }
    }
}

#[test]
fn resume_continues_each_rank_of_an_unchanged_world() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path());
    for s in [&samplers()[0], &samplers()[3]] {
        for rank in 0..3 {
            compare(&snap, s, 17 + rank, (2, 3), (rank, 3));
        }
    }
}

#[test]
fn states_that_do_not_match_the_loader_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path());
    let other = TestData::new()
        .obs_dim(3)
        .seed(5)
        .episodes((0..40u64).map(|i| 5 + (i * 13) % 37))
        .snapshot(&dir.path().join("other"));
    let s = &samplers()[0];
    let mut l = open_loader(spec_of(&snap, s, (0, 2)), opts(2)).unwrap();
    l.next_batch().unwrap();
    let state = l.state();
    drop(l);
    // The source checks the state it is opened at.
    let refuse = |snap: &Snapshot, s: &SamplerSpec, rank: (u64, u64), what: &str| {
        let e = err_of(BatchSource::open(
            spec_of(snap, s, rank).with_resume(state.clone()),
        ));
        assert!(e.to_string().contains(what), "{what}: {e}");
    };
    // The same episodes written again are still another dataset.
    refuse(&other, s, (0, 2), "another dataset");
    refuse(&snap, s, (1, 2), "rank 0 of 2");
    refuse(&snap, s, (0, 1), "rank 0 of 2");
    refuse(&snap, &s.clone().with_seed(12), (0, 2), "seed");
    refuse(
        &snap,
        &s.clone().with_weighting(Weighting::Episodes),
        (0, 2),
        "weighting",
    );
    refuse(
        &snap,
        &SamplerSpec::new(SamplerKind::Uniform, 6, 9),
        (0, 2),
        "slices",
    );
    refuse(&snap, &samplers()[3], (0, 2), "sampler");
    // Bytes that are not a state, or a state of a later layout.
    for bad in [&b"TSLOADST\x05"[..], b"{}", b""] {
        assert!(LoaderState::from_bytes(bad).is_err());
    }
    let json = state
        .to_json()
        .replace("\"state_version\":1", "\"state_version\":9");
    let e = LoaderState::from_json(&json).unwrap_err().to_string();
    assert!(e.contains("version 9"), "{e}");
    assert_eq!(LoaderState::from_json(&state.to_json()).unwrap(), state);
}

#[test]
fn a_state_resumes_on_its_version_after_the_dataset_grew() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path());
    let s = &samplers()[0];
    let mut l = open_loader(spec_of(&snap, s, (0, 1)), opts(2)).unwrap();
    for _ in 0..30 {
        l.next_batch().unwrap();
    }
    let state = l.state();
    let want: Vec<Vec<u8>> = l.by_ref().take(50).map(|b| fingerprint(&b)).collect();
    drop(l);
    // A collector appends episodes: version V + 1.
    let ds = Dataset::open(dir.path().join("d")).unwrap();
    TestData::new()
        .obs_dim(3)
        .seed(5)
        .episodes([30, 30, 30])
        .append_to(&ds);
    let newest = ds.snapshot().unwrap();
    assert_eq!(newest.version(), snap.version() + 1);
    let resumed = open_loader(
        spec_of(&newest, s, (0, 1)).with_resume(state.clone()),
        opts(3).with_max_batches(50),
    )
    .unwrap();
    assert_eq!(resumed.versions(), vec![snap.version()]);
    let got: Vec<Vec<u8>> = resumed.map(|b| fingerprint(&b)).collect();
    assert!(got == want, "the resumed batches are those of version V");
    // The same state through a loader of the old version's snapshot itself (this used to be a
    // loader built by hand, `Loader::try_new`, over that snapshot's sampler and gatherer).
    let on_old = open_loader(
        spec_of(&snap, s, (0, 1)).with_resume(state.clone()),
        opts(1).with_max_batches(50),
    )
    .unwrap();
    assert_eq!(on_old.versions(), vec![snap.version()]);
    let got: Vec<Vec<u8>> = on_old.map(|b| fingerprint(&b)).collect();
    assert!(got == want);
}

#[test]
fn a_mix_with_a_followed_part_keeps_its_proportions_follows_and_resumes() {
    use std::time::{Duration, Instant};
    use trajstore::Follow;
    let dir = tempfile::tempdir().unwrap();
    let offline = dataset(dir.path());
    let online_path = dir.path().join("online");
    let online = TestData::new()
        .obs_dim(3)
        .seed(9)
        .episodes([30u64; 3])
        .snapshot(&online_path);
    let uniform = |seed| SamplerSpec::new(SamplerKind::Uniform, 6, 8).with_seed(seed);
    let spec = |off: &Snapshot, on: &Snapshot| {
        LoaderSpec::new(&COLUMNS)
            .part(off.clone(), uniform(1), 0.5)
            .part(on.clone(), uniform(2), 0.5)
            .follow(Follow::every(Duration::from_millis(20)))
            .with_num_slices(16)
    };
    let mut l = open_loader(spec(&offline, &online), opts(2)).unwrap();
    let ds = Dataset::open(&online_path).unwrap();
    let check = |b: &Batch, online_ids: u64| {
        assert_eq!(
            b.source,
            [vec![0u16; 8], vec![1u16; 8]].concat(),
            "exactly half from each"
        );
        for (i, &id) in b.episode_id.iter().enumerate() {
            assert!(
                id < if i < 8 { 40 } else { online_ids },
                "slice {i}: id {id}"
            );
        }
    };
    for round in 0..3u64 {
        let v = TestData::new()
            .obs_dim(3)
            .seed(round)
            .episodes([30u64])
            .append_to(&ds);
        let new_id = 3 + round;
        let t = Instant::now();
        loop {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "online episode {new_id} not sampled"
            );
            let versions = l.versions();
            let b = l.next_batch().unwrap();
            check(&b, new_id + 1);
            if versions == [offline.version(), v] && b.episode_id[8..].contains(&new_id) {
                break;
            }
        }
    }
    // No commit any more: the stream after a state is fixed; a resume continues it exactly.
    let state = l.state();
    assert!(state.parts[1].follow && !state.parts[0].follow);
    assert_eq!(state.parts[1].version, ds.snapshot().unwrap().version());
    let want: Vec<Vec<u8>> = l.by_ref().take(30).map(|b| fingerprint(&b)).collect();
    drop(l);
    let newest = ds.snapshot().unwrap();
    let resumed = open_loader(
        spec(&offline, &newest).with_resume(state),
        opts(3).with_max_batches(30),
    )
    .unwrap();
    let got: Vec<Vec<u8>> = resumed.map(|b| fingerprint(&b)).collect();
    assert!(got == want, "the resumed mix continues exactly");
    // Mixing datasets whose columns differ is refused when the loader is made.
    let wide = TestData::new()
        .obs_dim(4)
        .episodes([30u64; 2])
        .snapshot(&dir.path().join("w"));
    let e = err_of(open_loader(spec(&offline, &wide), opts(1)));
    assert!(e.to_string().contains("observation"), "{e}");
}

/// Issue 30: a state whose numbers are out of range, or that lacks what checks it, is refused
/// with a message; it never hangs a loader or silently yields another loader's batches.
#[test]
fn states_out_of_range_or_missing_what_checks_them_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path());
    let s = &samplers()[0];
    let mut l = open_loader(spec_of(&snap, s, (0, 1)), opts(2)).unwrap();
    l.next_batch().unwrap();
    let state = l.state();
    drop(l);
    let json = state.to_json();
    let edited = |from: &str, to: &str| {
        assert!(json.contains(from), "{from} in {json}");
        json.replacen(from, to, 1)
    };
    // Out of range: a far batch number (the loader used to hang on it), ranks, slices.
    for (from, to, what) in [
        (
            "\"next_batch\":1,",
            "\"next_batch\":18446744073709551615,",
            "next_batch",
        ),
        (
            "\"next_batch\":1,",
            "\"next_batch\":281474976710657,",
            "next_batch",
        ),
        ("\"world_size\":1", "\"world_size\":0", "world_size"),
        ("\"rank\":0", "\"rank\":3", "rank 3"),
        ("\"num_slices\":8", "\"num_slices\":0", "slices"),
        ("\"slices\":8", "\"slices\":7", "add up"),
        (
            "\"fingerprint\":\"fnv1a64:",
            "\"fingerprint\":\"x",
            "fingerprint",
        ),
    ] {
        let e = LoaderState::from_json(&edited(from, to)).unwrap_err();
        assert!(e.to_string().contains(what), "{to}: {e}");
    }
    // A loader started at such a batch is refused too, not left waiting.
    let e = err_of(open_loader(
        spec_of(&snap, s, (0, 1)),
        opts(1).with_start(u64::MAX),
    ));
    assert!(e.to_string().contains("largest batch number"), "{e}");

    // The sampler's options removed: refused by a loader with another seed, and by one with
    // the same seed too (nothing says the batches would be the same).
    let no_sampler = LoaderState::from_json(&edited(
        &format!(
            "\"sampler\":{}",
            serde_json::to_string(&state.parts[0].sampler).unwrap()
        ),
        "\"sampler\":null",
    ))
    .unwrap();
    for seed in [12, 11] {
        let e = err_of(BatchSource::open(
            spec_of(&snap, &s.clone().with_seed(seed), (0, 1)).with_resume(no_sampler.clone()),
        ));
        assert!(e.to_string().contains("no sampler options"), "{e}");
    }
    // The dataset id removed.
    let id = state.parts[0].dataset_id.clone().expect("an id");
    let no_id = LoaderState::from_json(&edited(
        &format!("\"dataset_id\":\"{id}\""),
        "\"dataset_id\":null",
    ))
    .unwrap();
    let e = err_of(BatchSource::open(
        spec_of(&snap, s, (0, 1)).with_resume(no_id),
    ));
    assert!(e.to_string().contains("no dataset_id"), "{e}");

    // An epoch sampler's epoch that does not match the batch number.
    let ep = &samplers()[3];
    let mut l = open_loader(spec_of(&snap, ep, (0, 1)), opts(1)).unwrap();
    l.next_batch().unwrap();
    let st = l.state();
    drop(l);
    let wrong =
        LoaderState::from_json(&st.to_json().replace("\"epoch\":0", "\"epoch\":1")).unwrap();
    let e = err_of(BatchSource::open(
        spec_of(&snap, ep, (0, 1)).with_resume(wrong),
    ));
    assert!(e.to_string().contains("epoch"), "{e}");

    // A prioritized state without its priorities (to_json drops them) is refused.
    let pr = &samplers()[6];
    let mut l = open_loader(spec_of(&snap, pr, (0, 1)), opts(1)).unwrap();
    l.next_batch().unwrap();
    let st = l.state();
    drop(l);
    let e = err_of(BatchSource::open(
        spec_of(&snap, pr, (0, 1)).with_resume(LoaderState::from_json(&st.to_json()).unwrap()),
    ));
    assert!(e.to_string().contains("priorities"), "{e}");
    open_loader(
        spec_of(&snap, pr, (0, 1)).with_resume(LoaderState::from_bytes(&st.to_bytes()).unwrap()),
        opts(1),
    )
    .unwrap();
}

/// A state taken inside an iteration (`with_max_batches(60)`, 23 consumed) resumes the rest of
/// that iteration (37 batches, the same as the uninterrupted run's), not a whole new one, for
/// every sampler; a state taken at an iteration's end starts a whole one.
#[test]
fn a_resumed_iteration_yields_only_its_remaining_batches() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path());
    for s in samplers() {
        let o = || opts(2).with_max_batches(60);
        let spec = || spec_of(&snap, &s, (0, 1));
        let whole: Vec<Vec<u8>> = open_loader(spec(), o())
            .unwrap()
            .map(|b| fingerprint(&b))
            .collect();
        // An epoch sampler's iteration may end sooner (the end of its epoch).
        let n = whole.len();
        let mut first = open_loader(spec(), o()).unwrap();
        let k = 23.min(n - 1);
        for _ in 0..k {
            first.next_batch().unwrap();
        }
        let state = LoaderState::from_bytes(&first.state().to_bytes()).unwrap();
        assert_eq!(state.iteration_end, Some(n as u64), "{:?}", s.kind);
        drop(first);
        let rest: Vec<Vec<u8>> = open_loader(spec().with_resume(state), o())
            .unwrap()
            .map(|b| fingerprint(&b))
            .collect();
        assert_eq!(rest.len(), n - k, "{:?}: the rest of the iteration", s.kind);
        assert!(rest == whole[k..], "{:?}: the same batches", s.kind);
        // At the end of an iteration: no iteration_end, and the next iteration is whole.
        let mut done = open_loader(spec(), o()).unwrap();
        while done.next_batch().is_some() {}
        let at_end = done.state();
        assert_eq!(at_end.iteration_end, None);
        let next = open_loader(spec().with_resume(at_end), o()).unwrap();
        assert!(next.count() > 0, "{:?}", s.kind);
    }
}

/// Staging memory for one batch that keeps what was gathered into it: when a worker asks for it
/// again (its batch was released) and when the loader drops it, it appends the batch it holds,
/// as [`staged_key`] lays it out, to `log` (a slot's batches come in number order).
struct Keeping {
    columns: Vec<Vec<u8>>,
    flags: [Vec<u8>; 6],
    ids: Vec<u64>,
    starts: Vec<i64>,
    full: bool,
    log: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl Keeping {
    fn keep(&mut self) {
        if self.full {
            let mut out: Vec<u8> = self.columns.concat();
            out.extend(self.flags.concat());
            out.extend(self.ids.iter().flat_map(|x| x.to_le_bytes()));
            out.extend(self.starts.iter().flat_map(|x| x.to_le_bytes()));
            self.log.lock().unwrap().push(out);
        }
    }
}

impl StagingSlot for Keeping {
    fn dest(&mut self) -> GatherInto<'_> {
        self.keep();
        self.full = true;
        GatherInto {
            columns: self.columns.iter_mut().map(|c| c.as_mut_slice()).collect(),
            flags: self.flags.each_mut().map(|f| f.as_mut_slice()),
            episode_id: &mut self.ids,
            start_step: &mut self.starts,
        }
    }
}

impl Drop for Keeping {
    fn drop(&mut self) {
        self.keep();
    }
}

/// A batch as a [`Keeping`] slot records it.
fn staged_key(b: &Batch) -> Vec<u8> {
    let mut out: Vec<u8> = b
        .columns
        .iter()
        .flat_map(|c| c.data.as_slice().to_vec())
        .collect();
    for f in [
        &b.mask,
        &b.is_first,
        &b.is_last,
        &b.terminated,
        &b.truncated,
        &b.slice_end,
    ] {
        out.extend_from_slice(f);
    }
    out.extend(b.episode_id.iter().flat_map(|x| x.to_le_bytes()));
    out.extend(b.start_step.iter().flat_map(|x| x.to_le_bytes()));
    out
}

/// The batches a staged loader of `source` (two slots) yields, as [`staged_key`]s in order.
fn staged(
    source: &BatchSource,
    snap: &Snapshot,
    s: &SamplerSpec,
    o: LoaderOptions,
) -> Vec<Vec<u8>> {
    let g = Gatherer::try_new(snap, &COLUMNS).unwrap();
    let steps = s.num_slices * s.slice_len as usize;
    let logs: Vec<Arc<Mutex<Vec<Vec<u8>>>>> = (0..2).map(|_| Arc::default()).collect();
    let slots: Vec<Box<dyn StagingSlot>> = logs
        .iter()
        .map(|log| {
            Box::new(Keeping {
                columns: g.step_bytes().iter().map(|b| vec![0; steps * b]).collect(),
                flags: std::array::from_fn(|_| vec![0; steps]),
                ids: vec![0; s.num_slices],
                starts: vec![0; s.num_slices],
                full: false,
                log: log.clone(),
            }) as Box<dyn StagingSlot>
        })
        .collect();
    let mut loader = StagedLoader::new(source, o, slots).unwrap();
    let mut numbers = vec![];
    while let Some(b) = loader.next_batch() {
        let b = b.unwrap();
        assert_eq!(b.num_slices, s.num_slices);
        numbers.push(b.number);
        loader.release(b.number).unwrap();
    }
    drop(loader);
    let mut logs: Vec<std::vec::IntoIter<Vec<u8>>> = logs
        .iter()
        .map(|l| std::mem::take(&mut *l.lock().unwrap()).into_iter())
        .collect();
    let out: Vec<Vec<u8>> = numbers
        .iter()
        .map(|&k| logs[(k % 2) as usize].next().expect("a kept batch"))
        .collect();
    assert!(
        logs.iter_mut().all(|l| l.next().is_none()),
        "batches never returned"
    );
    out
}

/// A source opened at a state (`LoaderSpec::with_resume`) continues the interrupted run:
/// a loader made from it without a start yields exactly the rest of the interrupted iteration
/// (whatever its own `max_batches`); a loader of the same source with an explicit start yields
/// from that start, and the state's iteration end no longer applies; staged and torch loaders
/// of a resumed source do as `Loader` does. (This test used to check that `with_resume` was
/// honoured the same way by every constructor: that `Loader::from_source` refused a state its
/// source was not opened at. Loader options no longer carry a state: only the source does, and
/// every loader is made from a source.)
#[test]
fn a_resumed_source_yields_the_rest_then_from_the_start_its_loaders_name() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path());
    let s = &samplers()[0];
    let spec = || spec_of(&snap, s, (0, 1));
    // The uninterrupted stream (endless sampler: batch k is the same in every run).
    let stream: Vec<Batch> = open_loader(spec(), opts(2)).unwrap().take(40).collect();
    let want: Vec<Vec<u8>> = stream.iter().map(fingerprint).collect();
    // An iteration of 17 batches interrupted after 7.
    let mut l = open_loader(spec(), opts(2).with_max_batches(17)).unwrap();
    for _ in 0..7 {
        l.next_batch().unwrap();
    }
    let state = l.state();
    assert_eq!((state.next_batch, state.iteration_end), (7, Some(17)));
    drop(l);
    let source = BatchSource::open(spec().with_resume(state.clone())).unwrap();
    assert_eq!(source.rank(), (0, 1));
    let mut at = source.state(7).unwrap();
    at.iteration_end = state.iteration_end;
    assert_eq!(at, state, "the source's state at the interrupted batch");
    // The first loader: the rest of the iteration, batches 7..17, and no more.
    let rest: Vec<Vec<u8>> = Loader::new(&source, opts(1))
        .unwrap()
        .map(|b| fingerprint(&b))
        .collect();
    assert_eq!(rest.len(), 10);
    assert!(rest == want[7..17], "the rest of the interrupted iteration");
    // Another loader of the source without a start: the rest again, even with max_batches.
    let again: Vec<Vec<u8>> = Loader::new(&source, opts(3).with_max_batches(30))
        .unwrap()
        .map(|b| fingerprint(&b))
        .collect();
    assert!(again == want[7..17], "the rest again");
    // With an explicit start: from there, past the interrupted iteration's end.
    let from_3: Vec<Vec<u8>> = Loader::new(&source, opts(2).with_start(3))
        .unwrap()
        .take(30)
        .map(|b| fingerprint(&b))
        .collect();
    assert!(from_3 == want[3..33], "from the explicit start, endless");
    let five: Vec<Vec<u8>> = Loader::new(&source, opts(2).with_start(3).with_max_batches(5))
        .unwrap()
        .map(|b| fingerprint(&b))
        .collect();
    assert!(five == want[3..8], "from the explicit start, max_batches");
    // A start past the largest batch number is refused by the loader.
    let e = err_of(Loader::new(&source, opts(1).with_start(u64::MAX)));
    assert!(e.to_string().contains("largest batch number"), "{e}");
    // Staged loaders of the resumed source: the same batches.
    let keys: Vec<Vec<u8>> = stream.iter().map(staged_key).collect();
    assert!(
        staged(&source, &snap, s, opts(2)) == keys[7..17],
        "staged: the rest of the iteration"
    );
    assert!(
        staged(
            &source,
            &snap,
            s,
            opts(2).with_start(3).with_max_batches(20)
        ) == keys[3..23],
        "staged: from the explicit start"
    );
    // Torch loaders too.
    #[cfg(feature = "torch")]
    {
        use trajstore::torch::{TorchLoader, TorchLoaderOptions};
        let torch = |o: LoaderOptions| -> Vec<(Vec<i64>, Vec<i64>, Vec<f32>)> {
            let to = TorchLoaderOptions::new(tch::Device::Cpu).with_loader(o);
            TorchLoader::new(&source, to)
                .unwrap()
                .map(|t| {
                    let t = t.unwrap();
                    (
                        Vec::try_from(&t.episode_id.flatten(0, -1)).unwrap(),
                        Vec::try_from(&t.start_step.flatten(0, -1)).unwrap(),
                        Vec::try_from(&t.get(col::OBSERVATION).unwrap().flatten(0, -1)).unwrap(),
                    )
                })
                .collect()
        };
        let of = |b: &Batch| {
            (
                b.episode_id.iter().map(|&i| i as i64).collect::<Vec<i64>>(),
                b.start_step.clone(),
                b.column(col::OBSERVATION).unwrap().values::<f32>().to_vec(),
            )
        };
        let keys: Vec<_> = stream.iter().map(of).collect();
        assert!(
            torch(opts(2)) == keys[7..17],
            "torch: the rest of the iteration"
        );
        assert!(
            torch(opts(2).with_start(3).with_max_batches(20)) == keys[3..23],
            "torch: from the explicit start"
        );
    }
}
