//! Datasets that are not in memory: segments stay mapped for random access (a fault reads its own
//! page, never megabytes around it) whatever reads them, and `ReadAhead::Auto` switches itself on
//! when gathers take major page faults and off when the pages are found in memory, without
//! changing a single byte of any batch.
#![cfg(target_os = "linux")]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::common::{TestData, open_loader};
use trajstore::format::col;
use trajstore::{
    Batch, BoundaryPolicy, Dataset, Gatherer, LoaderOptions, LoaderSpec, ReadAhead, Sampler,
    SamplerSpec, SliceSampler, Snapshot,
};

const COLUMNS: [&str; 4] = [
    col::OBSERVATION,
    col::ACTION,
    col::REWARD,
    col::NEXT_OBSERVATION,
];

/// About 20 MB of transitions in several segments.
fn write(dir: &Path) -> PathBuf {
    let path = dir.join("d");
    TestData::new()
        .obs_dim(64)
        .act_dim(8)
        .seed(5)
        .episodes((0..120u64).map(|i| 100 + i * 53 % 400))
        .segment_bytes(4 << 20)
        .batch_bytes(1 << 20)
        .write(&path);
    path
}

fn files(path: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(path.join(trajstore::format::SEGMENTS_DIR))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    v.sort();
    v
}

/// The `VmFlags` of every mapping of a file under `dir`, from /proc/self/smaps.
fn vm_flags_under(dir: &Path) -> Vec<(String, Vec<String>)> {
    let dir = std::fs::canonicalize(dir).unwrap();
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut out = vec![];
    let mut current: Option<String> = None;
    for line in smaps.lines() {
        let head = line.split_whitespace().next().unwrap_or("");
        if head.contains('-') && !head.ends_with(':') {
            // A mapping's header: address range, perms, offset, dev, inode, path.
            current = line
                .split_whitespace()
                .nth(5)
                .filter(|p| Path::new(p).starts_with(&dir))
                .map(str::to_string);
        } else if let (Some(p), Some(flags)) = (&current, line.strip_prefix("VmFlags:")) {
            out.push((
                p.clone(),
                flags.split_whitespace().map(String::from).collect(),
            ));
        }
    }
    out
}

fn sampler_spec(seed: u64) -> SamplerSpec {
    SamplerSpec::uniform(16, 32)
        .with_policy(BoundaryPolicy::Strict)
        .with_seed(seed)
}

fn sampler(snap: &Snapshot, seed: u64) -> Arc<SliceSampler> {
    let index = snap.slice_index(16, BoundaryPolicy::Strict).unwrap();
    Arc::new(SliceSampler::try_new(index, snap.episodes(), &sampler_spec(seed)).unwrap())
}

fn bytes_of(b: &Batch) -> Vec<Vec<u8>> {
    b.columns
        .iter()
        .map(|c| c.data.as_slice().to_vec())
        .collect()
}

#[test]
fn segments_stay_mapped_for_random_access_whatever_reads_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path());
    let snap = Dataset::open(&path).unwrap().snapshot().unwrap();
    let mut loader = open_loader(
        LoaderSpec::single(snap.clone(), sampler_spec(1), &COLUMNS),
        LoaderOptions::default().with_max_batches(6),
    )
    .unwrap();
    while let Some(b) = loader.next_batch() {
        loader.recycle(b);
    }
    // Sequential readers of the same snapshot read ahead explicitly; they must not turn the
    // mappings back to read-around.
    let report = trajstore::store::verify::verify(&snap, |_| {}).unwrap();
    assert_eq!(report.transitions, snap.num_transitions());
    #[cfg(feature = "sql")]
    {
        let rows = trajstore::sql::SnapshotSql::sql(&snap, "SELECT SUM(reward) FROM transitions");
        assert_eq!(rows.unwrap()[0].num_rows(), 1);
    }
    let maps = vm_flags_under(&path);
    let segments: Vec<_> = maps
        .iter()
        .filter(|(p, _)| p.ends_with(trajstore::format::SEGMENT_SUFFIX))
        .collect();
    assert!(
        segments.len() >= snap.segments().len(),
        "segment mappings not found in /proc/self/smaps: {maps:?}"
    );
    for (p, flags) in segments {
        assert!(
            flags.iter().any(|f| f == "rr"),
            "{p} is mapped without MADV_RANDOM (VmFlags {flags:?}): a cold fault would read \
             read_ahead_kb around each page"
        );
        assert!(!flags.iter().any(|f| f == "sr"), "{p}: {flags:?}");
    }
    drop(loader);
}

/// Drops `path`'s files from the page cache (their pages are clean: the writer synced them).
/// `false` where the kernel kept them (then the test cannot make data cold and says so).
fn evict(path: &Path) -> bool {
    use std::os::fd::AsRawFd;
    let mut resident = 0u64;
    let mut total = 0u64;
    for f in files(path) {
        let file = std::fs::File::open(&f).unwrap();
        // SAFETY: posix_fadvise on an open descriptor; a hint with no memory effects.
        unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        let len = file.metadata().unwrap().len() as usize;
        // SAFETY: read-only map of a file nobody modifies during the test.
        let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
        let pages = len.div_ceil(trajstore::iofloor::page_size());
        let mut v = vec![0u8; pages];
        // SAFETY: `v` has one byte per page of the mapping.
        let rc = unsafe { libc::mincore(map.as_ptr() as *mut libc::c_void, len, v.as_mut_ptr()) };
        assert_eq!(rc, 0);
        resident += v.iter().filter(|b| **b & 1 != 0).count() as u64;
        total += pages as u64;
    }
    resident * 10 < total
}

#[test]
fn auto_read_ahead_follows_whether_the_data_is_in_memory() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path());
    if !evict(&path) {
        eprintln!("skipped: this file system keeps the dataset's pages cached after DONTNEED");
        return;
    }
    let snap = Dataset::open(&path).unwrap().snapshot().unwrap();
    let auto = Gatherer::try_new(&snap, &COLUMNS).unwrap();
    assert_eq!(auto.read_ahead(), ReadAhead::Auto);
    assert!(auto.reading_ahead(), "on until plans are found in memory");
    let reference = Gatherer::try_new(&snap, &COLUMNS).unwrap();
    reference.set_read_ahead(ReadAhead::Never);
    let s = sampler(&snap, 9);
    let (mut plan, mut a, mut b) = (vec![], Batch::default(), Batch::default());
    s.plan(0, &mut plan);
    auto.gather(&plan, &mut a).unwrap();
    assert!(auto.reading_ahead(), "evicted pages were found in memory");
    reference.gather(&plan, &mut b).unwrap();
    assert_eq!(bytes_of(&a), bytes_of(&b));
    // While on, every new plan's pages are asked for before the copy; batches do not change.
    for k in 1..4 {
        s.plan(k, &mut plan);
        auto.gather(&plan, &mut a).unwrap();
        reference.gather(&plan, &mut b).unwrap();
        assert_eq!(bytes_of(&a), bytes_of(&b), "batch {k}");
    }
    assert!(auto.plans_read_ahead() >= 1);
    // Once everything is in memory, plans found resident switch it off again.
    for f in files(&path) {
        std::hint::black_box(std::fs::read(f).unwrap());
    }
    for k in 100..100 + 2 * trajstore::gather::WARM_AFTER as u64 {
        s.plan(k, &mut plan);
        auto.gather(&plan, &mut a).unwrap();
        reference.gather(&plan, &mut b).unwrap();
        assert_eq!(bytes_of(&a), bytes_of(&b), "batch {k}");
    }
    assert!(
        !auto.reading_ahead(),
        "still reading ahead data that is in memory"
    );
}

#[test]
fn a_loader_over_evicted_data_gives_the_same_stream() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path());
    let stream = |mode: ReadAhead| -> Vec<Vec<Vec<u8>>> {
        let snap = Dataset::open(&path).unwrap().snapshot().unwrap();
        // The source sets the read-ahead of its gatherer and of its workers.
        let mut loader = open_loader(
            LoaderSpec::single(snap, sampler_spec(3), &COLUMNS).with_read_ahead(mode),
            LoaderOptions::default()
                .with_workers(3)
                .with_max_batches(12),
        )
        .unwrap();
        let mut out = vec![];
        while let Some(b) = loader.next_batch() {
            out.push(bytes_of(&b));
        }
        out
    };
    let cold = evict(&path);
    let auto = stream(ReadAhead::Auto);
    assert_eq!(auto.len(), 12);
    if cold {
        evict(&path);
    }
    assert_eq!(stream(ReadAhead::Always), auto);
    assert_eq!(stream(ReadAhead::Never), auto);
}
