//! Push, pull and their failure modes against object_store's `InMemory` store, through
//! `Remote::with_store`: the protocol (content-addressed segments, conditional manifest
//! creation, fast-forward checks, checksummed downloads) without a server. tests/remote.rs runs
//! the same protocol against a real S3-compatible server (moto) for the S3 client itself.
#![cfg(feature = "remote")]

use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::common::TestData;
use object_store::memory::InMemory;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use trajstore::progress::Unit;
use trajstore::remote::{Remote, RemoteOptions};
use trajstore::{ConflictKind, Dataset, DatasetBuilder, Error, Progress};

const URL: &str = "memory:///runs/walker";

fn remote(store: &Arc<InMemory>) -> Remote {
    Remote::with_store(URL, store.clone(), RemoteOptions::default()).unwrap()
}

fn data(seed: u64) -> TestData {
    TestData::new()
        .obs_dim(3)
        .seed(seed)
        .transitions(600)
        .segment_bytes(8 << 10)
        .commit_every(10)
}

/// Copies a dataset directory (a second writer's clone).
fn clone_dir(from: &Path, to: &Path) -> Dataset {
    std::fs::create_dir_all(to).unwrap();
    for entry in walk(from) {
        let rel = entry.strip_prefix(from).unwrap();
        let dest = to.join(rel);
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        std::fs::copy(&entry, &dest).unwrap();
    }
    Dataset::open(to).unwrap()
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = vec![];
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else if !p.ends_with("_lock") {
            out.push(p);
        }
    }
    out
}

fn same_episodes(a: &Dataset, b: &Dataset) {
    let (sa, sb) = (a.snapshot().unwrap(), b.snapshot().unwrap());
    assert_eq!(sa.version(), sb.version());
    assert_eq!(sa.num_transitions(), sb.num_transitions());
    assert_eq!(sa.num_episodes(), sb.num_episodes());
    for id in 0..sa.num_episodes() {
        assert_eq!(
            sa.episode(id).unwrap(),
            sb.episode(id).unwrap(),
            "episode {id}"
        );
    }
    trajstore::store::verify::verify(&sb, |_| {}).unwrap();
}

/// Records what the library reports.
#[derive(Default)]
struct Recorder {
    starts: Mutex<Vec<(String, Unit, Option<u64>)>>,
    advanced: Mutex<u64>,
    finished: Mutex<Vec<bool>>,
}

/// What the options hold (the test keeps the other `Arc`).
struct Shared(Arc<Recorder>);

impl Progress for Shared {
    fn start(&self, what: &str, unit: Unit, total: Option<u64>) {
        self.0
            .starts
            .lock()
            .unwrap()
            .push((what.into(), unit, total));
    }
    fn advance(&self, n: u64) {
        *self.0.advanced.lock().unwrap() += n;
    }
    fn finish(&self, ok: bool) {
        self.0.finished.lock().unwrap().push(ok);
    }
}

#[test]
fn push_then_pull_round_trips_and_transfers_only_what_is_new() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(InMemory::new());
    let local = data(1).write(&dir.path().join("local"));
    let v1 = local.snapshot().unwrap().version();

    let rec = Arc::new(Recorder::default());
    let r = Remote::with_store(
        URL,
        store.clone(),
        RemoteOptions::default().with_progress(Shared(rec.clone())),
    )
    .unwrap();
    assert_eq!(r.versions().unwrap(), Vec::<u64>::new());
    assert!(r.latest().unwrap().is_none());
    let pushed = r.push(&local).unwrap();
    assert_eq!((pushed.version, pushed.previous_version), (v1, None));
    assert!(
        pushed.files_uploaded > 2 && pushed.files_present == 0,
        "{pushed:?}"
    );
    // The library reported the bytes it uploaded, and drew nothing itself.
    let starts = rec.starts.lock().unwrap().clone();
    assert_eq!(
        starts,
        [("push".to_string(), Unit::Bytes, Some(pushed.bytes_uploaded))]
    );
    assert_eq!(*rec.advanced.lock().unwrap(), pushed.bytes_uploaded);
    assert_eq!(*rec.finished.lock().unwrap(), [true]);
    // The objects live under the URL's path in the store.
    let keys: Vec<String> = futures_keys(&store);
    assert!(
        keys.iter().all(|k| k.starts_with("runs/walker/")),
        "{keys:?}"
    );
    assert_eq!(r.versions().unwrap().last(), Some(&v1));

    let mirror = dir.path().join("mirror");
    let pulled = r.pull(&mirror, None).unwrap();
    assert_eq!(pulled.version, v1);
    assert_eq!(pulled.files_downloaded, pushed.files_uploaded);
    same_episodes(&local, &Dataset::open(&mirror).unwrap());

    // Pushing the same version again writes nothing.
    let again = remote(&store).push(&local).unwrap();
    assert!(again.up_to_date && again.files_uploaded == 0, "{again:?}");

    // Append, push: only the new files go; pull: only those come.
    let more = data(2).transitions(300).append_to(&local);
    let pushed2 = remote(&store).push(&local).unwrap();
    assert_eq!(
        (pushed2.version, pushed2.previous_version),
        (more, Some(v1))
    );
    assert!(pushed2.files_present > 0, "{pushed2:?}");
    let pulled2 = remote(&store).pull(&mirror, None).unwrap();
    assert_eq!(pulled2.version, more);
    assert!(pulled2.files_cached > 0, "{pulled2:?}");
    assert!(pulled2.files_downloaded < pulled.files_downloaded + pushed2.files_uploaded);
    same_episodes(&local, &Dataset::open(&mirror).unwrap());

    // An older version is still there to pull.
    let old = dir.path().join("old");
    remote(&store).pull(&old, Some(v1)).unwrap();
    assert_eq!(
        Dataset::open(&old).unwrap().snapshot().unwrap().version(),
        v1
    );
}

fn futures_keys(store: &Arc<InMemory>) -> Vec<String> {
    use futures::TryStreamExt;
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        store
            .list(None)
            .map_ok(|m| m.location.to_string())
            .try_collect::<Vec<_>>()
            .await
            .unwrap()
    })
}

fn put(store: &Arc<InMemory>, key: &str, bytes: &[u8]) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(store.put(&ObjectPath::from(key), PutPayload::from(bytes.to_vec())))
        .unwrap();
}

#[test]
fn diverged_histories_are_conflicts_that_say_which_versions() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(InMemory::new());
    let base = data(3).write(&dir.path().join("base"));
    remote(&store).push(&base).unwrap();
    let a = clone_dir(base.path(), &dir.path().join("a"));
    let b = clone_dir(base.path(), &dir.path().join("b"));
    let va = data(4).transitions(200).append_to(&a);
    let vb = data(5).transitions(200).append_to(&b);
    assert_eq!(va, vb, "both writers committed the same next version");
    remote(&store).push(&a).unwrap();

    let e = remote(&store).push(&b).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Conflict { kind: ConflictKind::Diverged { remote, local }, ref dataset, .. }
                if remote == va && local == vb && dataset == URL
        ),
        "{e}"
    );
    // The loser's data did not reach the store: a pull still gets the winner's.
    let mirror = dir.path().join("mirror");
    remote(&store).pull(&mirror, None).unwrap();
    same_episodes(&a, &Dataset::open(&mirror).unwrap());

    // A dataset with another schema is refused as such, before anything is uploaded.
    let keys = futures_keys(&store);
    let other = TestData::new()
        .obs_dim(5)
        .transitions(100)
        .write(&dir.path().join("other"));
    let e = remote(&store).push(&other).unwrap_err();
    assert!(matches!(e, Error::SchemaMismatch { .. }), "{e}");
    assert_eq!(futures_keys(&store), keys);
}

#[test]
fn foreign_or_damaged_objects_are_refused_and_never_land_in_a_mirror() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(InMemory::new());
    let local = data(6).write(&dir.path().join("local"));
    remote(&store).push(&local).unwrap();
    let segment_keys: Vec<String> = futures_keys(&store)
        .into_iter()
        .filter(|k| k.contains("/segments/") && !k.contains("episodes"))
        .collect();
    assert!(!segment_keys.is_empty());

    // Another object of the same content-addressed name but other bytes: a push that needs it
    // refuses to trust it.
    let victim = &segment_keys[0];
    put(&store, victim, b"not the segment");
    data(7).transitions(100).append_to(&local);
    let e = remote(&store).push(&local).unwrap_err();
    assert!(
        matches!(e, Error::Conflict { kind: ConflictKind::ObjectDiffers { ref object }, .. }
            if object.ends_with(victim.rsplit('/').next().unwrap())),
        "{e}"
    );

    // A pull of the damaged version fails on that object and leaves no partial file behind.
    let mirror = dir.path().join("mirror");
    let e = remote(&store).pull(&mirror, None).unwrap_err();
    assert!(matches!(e, Error::Corrupt { .. }), "{e}");
    let leftovers: Vec<_> = walk(&mirror)
        .into_iter()
        .filter(|p| p.to_string_lossy().ends_with(trajstore::format::TMP_SUFFIX))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    // A version that does not exist is NotFound.
    let e = remote(&store)
        .pull(&dir.path().join("m2"), Some(999))
        .unwrap_err();
    assert!(matches!(e, Error::NotFound { .. }), "{e}");
}

#[test]
fn bad_urls_name_the_argument() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let e = Remote::with_store("not a url", store, RemoteOptions::default()).unwrap_err();
    assert!(
        matches!(e, Error::InvalidArgument { argument: Some(ref a), .. } if a == "url"),
        "{e}"
    );
    let e = Remote::open("gopher://host/ds", RemoteOptions::default()).unwrap_err();
    assert!(
        matches!(e, Error::InvalidArgument { argument: Some(ref a), .. } if a == "url"),
        "{e}"
    );
}

#[test]
fn one_entry_point_opens_a_directory_or_a_url_at_any_version() {
    let dir = tempfile::tempdir().unwrap();
    let local = data(8).write(&dir.path().join("local"));
    let v1 = local.snapshot().unwrap().version();
    let url = format!("file://{}", dir.path().join("store/ds").display());
    let remote = Remote::open(&url, RemoteOptions::default()).unwrap();
    remote.push(&local).unwrap();
    let v2 = data(9).transitions(200).append_to(&local);
    remote.push(&local).unwrap();

    // A directory: no download, any committed version.
    let (snap, fetched) = DatasetBuilder::from_path(local.path())
        .with_version(v1)
        .load_reported()
        .unwrap();
    assert!(fetched.is_none());
    assert_eq!(snap.version(), v1);
    assert_eq!(
        trajstore::open(local.path().to_str().unwrap())
            .unwrap()
            .version(),
        v2
    );

    // A URL: mirrored under the cache given, then the same data as the directory.
    let cache = dir.path().join("cache");
    let (snap, fetched) = DatasetBuilder::from_uri(&url)
        .with_cache_dir(&cache)
        .load_reported()
        .unwrap();
    let fetched = fetched.expect("a URL is fetched");
    assert_eq!((snap.version(), fetched.version), (v2, v2));
    assert!(fetched.mirror.starts_with(&cache), "{:?}", fetched.mirror);
    same_episodes(
        &local,
        &DatasetBuilder::from_uri(&url)
            .with_cache_dir(&cache)
            .load_dataset()
            .unwrap(),
    );
    // The catalog of an older version, without its transitions.
    let catalog = DatasetBuilder::from_uri(&url)
        .with_cache_dir(dir.path().join("cache2"))
        .with_version(v1)
        .load_catalog()
        .unwrap();
    assert_eq!(catalog.version(), v1);
    assert_eq!(
        catalog.num_episodes(),
        local.snapshot_at(v1).unwrap().num_episodes()
    );
}
