//! The bounded segment cache of a streaming reader: transition files fetched on demand into a
//! private directory, at most `limit` bytes of them on disk (downloads in progress included),
//! evicting the least recently used segment that nothing pins. One fetcher thread starts
//! downloads in order of need (the batch number that first needs the segment), at most
//! `concurrency` at a time, on the remote's runtime; a download resumes from the bytes a killed
//! one left (`<name>.partial`), and every file is checked against the manifest's size and
//! CRC-32C before it is renamed into place. Files are not fsynced (a cache is not the dataset):
//! instead, a complete file that an earlier loader left, or that another rank holds, is checked
//! again (read, not downloaded) before its first use here.
//!
//! The ranks of one node keep their caches side by side (`_stream/rank-<r>/` of the node's
//! mirror), each within its share of the node's limit. A file that another rank of the node
//! holds complete is hard-linked instead of downloaded, so the node fetches and stores it once.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use futures::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{GetOptions, GetRange, GetResultPayload, ObjectStore};

use crate::error::{Error, IoContext, Result};
use crate::remote::{Remote, copy_local, remote_err};

/// Suffix of a download in progress (kept across a crash, to be resumed).
const PARTIAL: &str = ".partial";

/// One transition file the cache can hold.
#[derive(Debug, Clone)]
pub(crate) struct CachedFile {
    /// Object key.
    pub key: ObjectPath,
    /// URL, for messages.
    pub url: String,
    /// File name in the cache directory.
    pub name: String,
    pub bytes: u64,
    pub checksum: String,
}

#[derive(Debug, Clone, PartialEq)]
enum St {
    Absent,
    Queued,
    Loading,
    Ready,
    Failed(Arc<String>, bool),
}

#[derive(Debug)]
struct Entry {
    st: St,
    pins: u32,
    last_use: u64,
    /// Batch number that first needs it (lower: sooner).
    need: u64,
    /// Bytes it holds on disk (or has reserved while loading).
    on_disk: u64,
}

#[derive(Debug)]
struct State {
    entries: Vec<Entry>,
    used: u64,
    loading: usize,
    tick: u64,
    stop: bool,
}

/// Counters of a cache (see [`super::StreamStats`]).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub files_downloaded: AtomicU64,
    pub bytes_downloaded: AtomicU64,
    pub bytes_resumed: AtomicU64,
    pub files_evicted: AtomicU64,
    pub files_shared: AtomicU64,
    pub peak_bytes: AtomicU64,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    dir: PathBuf,
    files: Vec<CachedFile>,
    limit: u64,
    concurrency: usize,
    counters: Counters,
}

/// The cache. Dropping it stops the fetcher and waits for the downloads in flight (at most 30
/// s); a process that dies leaves them partial, to be resumed by the next cache over the same
/// directory.
pub(crate) struct Cache {
    shared: Arc<Shared>,
    fetcher: Option<JoinHandle<()>>,
    /// The remote whose runtime runs the downloads: dropped after the fetcher, never inside it.
    _remote: Arc<Remote>,
    _lock: File,
}

/// Segments pinned in the cache (not evicted) until dropped.
pub(crate) struct Pins {
    shared: Arc<Shared>,
    segments: Vec<usize>,
}

impl Cache {
    /// Opens the cache directory `dir` (created if needed; a second cache over it, in this or
    /// another process, gets [`Error::Locked`]), keeps the complete files of `files` it holds
    /// and the partial downloads it can resume, removes anything else, and starts the fetcher.
    pub(crate) fn open(
        remote: Arc<Remote>,
        dir: &Path,
        files: Vec<CachedFile>,
        limit: u64,
    ) -> Result<Self> {
        std::fs::create_dir_all(dir).at(dir)?;
        let lock_path = dir.with_extension("lock");
        let lock = crate::store::writer::lock_file(&lock_path)?;
        if lock.try_lock().is_err() {
            return Err(Error::argument(
                "cache",
                format!(
                    "the streaming cache {} is in use by another loader (lock {}); give each \
                     process its own rank or cache directory",
                    dir.display(),
                    lock_path.display()
                ),
            ));
        }
        let mut entries: Vec<Entry> = files
            .iter()
            .map(|_| Entry {
                st: St::Absent,
                pins: 0,
                last_use: 0,
                need: u64::MAX,
                on_disk: 0,
            })
            .collect();
        let by_name: std::collections::HashMap<&str, usize> = files
            .iter()
            .enumerate()
            .map(|(i, f)| (f.name.as_str(), i))
            .collect();
        let mut used = 0u64;
        for item in std::fs::read_dir(dir).at(dir)? {
            let item = item.at(dir)?;
            let path = item.path();
            let name = item.file_name().to_string_lossy().into_owned();
            let len = match item.metadata() {
                Ok(m) => m.len(),
                // Gone since the listing (a file being renamed by a download that was given up
                // on): nothing to keep.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(Error::io(&path, e)),
            };
            let (stem, partial) = match name.strip_suffix(PARTIAL) {
                Some(s) => (s, true),
                None => (name.as_str(), false),
            };
            let keep = by_name.get(stem).copied().filter(|&i| {
                entries[i].on_disk == 0 && used + len <= limit && len <= files[i].bytes
            });
            match keep {
                Some(i) => {
                    // Files are not fsynced: a complete file an earlier loader left is checked
                    // (CRC-32C, no download) before its first use, as a partial one is resumed.
                    if !partial {
                        std::fs::rename(&path, partial_path(&path)).at(&path)?;
                    }
                    entries[i].on_disk = len;
                    used += len;
                }
                None => std::fs::remove_file(&path).at(&path)?,
            }
        }
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                entries,
                used,
                loading: 0,
                tick: 0,
                stop: false,
            }),
            changed: Condvar::new(),
            dir: dir.to_path_buf(),
            files,
            limit,
            concurrency: remote.options.concurrency.max(1),
            counters: Counters::default(),
        });
        shared.counters.peak_bytes.store(used, Relaxed);
        let fetcher = {
            let (shared, remote) = (shared.clone(), remote.clone());
            std::thread::Builder::new()
                .name("trajstore-fetch".into())
                .spawn(move || fetch_loop(&shared, &remote))
                .map_err(|e| Error::io(dir, e))?
        };
        Ok(Self {
            shared,
            fetcher: Some(fetcher),
            _remote: remote,
            _lock: lock,
        })
    }

    /// Pins `segments` and queues the absent ones for download, needed by batch `need`.
    pub(crate) fn pin(&self, segments: &[usize], need: u64) -> Pins {
        let mut st = self.shared.lock();
        for &i in segments {
            let e = &mut st.entries[i];
            e.pins += 1;
            e.need = e.need.min(need);
            if e.st == St::Absent {
                e.st = St::Queued;
                e.need = need;
            }
        }
        drop(st);
        self.shared.changed.notify_all();
        Pins {
            shared: self.shared.clone(),
            segments: segments.to_vec(),
        }
    }

    /// Blocks until every segment of `pins` is on disk. A failed download is returned as its
    /// error (naming the object); the segment is then fetched again by the next pin.
    pub(crate) fn wait(&self, pins: &Pins) -> Result<()> {
        let mut st = self.shared.lock();
        loop {
            let mut ready = true;
            for &i in &pins.segments {
                match &st.entries[i].st {
                    St::Ready => {}
                    St::Failed(message, corrupt) => {
                        let f = &self.shared.files[i];
                        let err = if *corrupt {
                            Error::corrupt(&f.url, message.to_string())
                        } else {
                            Error::Remote {
                                url: f.url.clone(),
                                message: message.to_string(),
                                source: None,
                            }
                        };
                        st.entries[i].st = St::Queued;
                        return Err(err);
                    }
                    _ => ready = false,
                }
            }
            if ready {
                return Ok(());
            }
            st = self
                .shared
                .changed
                .wait(st)
                .unwrap_or_else(|e| e.into_inner());
        }
    }

    /// The path of segment `i`'s file in the cache directory.
    pub(crate) fn path(&self, i: usize) -> PathBuf {
        self.shared.dir.join(&self.shared.files[i].name)
    }

    /// Bytes on disk (and reserved by downloads in progress) now.
    pub(crate) fn used(&self) -> u64 {
        self.shared.lock().used
    }

    pub(crate) fn counters(&self) -> &Counters {
        &self.shared.counters
    }
}

impl Drop for Cache {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.changed.notify_all();
        if let Some(h) = self.fetcher.take() {
            let _ = h.join();
        }
        // The downloads in flight finish (each calls `finish`) before the directory's lock goes
        // with this cache: one that renamed or removed its file after the next cache over the
        // directory had scanned it would race with that cache. A store that hangs is given up
        // on after a while (its partial file is then resumed or removed by the next cache).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let mut st = self.shared.lock();
        while st.loading > 0 && std::time::Instant::now() < deadline {
            st = self
                .shared
                .changed
                .wait_timeout(st, std::time::Duration::from_millis(50))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

impl Drop for Pins {
    fn drop(&mut self) {
        let mut st = self.shared.lock();
        st.tick += 1;
        let tick = st.tick;
        for &i in &self.segments {
            let e = &mut st.entries[i];
            e.pins = e.pins.saturating_sub(1);
            e.last_use = tick;
            if e.pins == 0 {
                e.need = u64::MAX;
                if e.st == St::Queued {
                    e.st = St::Absent;
                }
            }
        }
        drop(st);
        self.shared.changed.notify_all();
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Frees space for `need` more bytes, evicting unpinned complete files (least recently
    /// used first), then abandoned partial downloads. `false` when that is not enough yet.
    fn make_room(&self, st: &mut State, need: u64, keep: usize) -> bool {
        while st.used + need > self.limit {
            let victim = (0..st.entries.len())
                .filter(|&i| i != keep)
                .filter(|&i| {
                    let e = &st.entries[i];
                    e.pins == 0
                        && e.on_disk > 0
                        && matches!(e.st, St::Ready | St::Absent | St::Failed(..))
                })
                .min_by_key(|&i| (st.entries[i].st != St::Ready, st.entries[i].last_use));
            let Some(v) = victim else { return false };
            let path = self.dir.join(&self.files[v].name);
            let partial = partial_path(&path);
            // Best effort: a file that cannot be removed is still counted as gone, as the
            // next open of the directory removes or reuses it.
            let _ = std::fs::remove_file(&path);
            let _ = std::fs::remove_file(&partial);
            let e = &mut st.entries[v];
            if e.st == St::Ready {
                self.counters.files_evicted.fetch_add(1, Relaxed);
            }
            st.used -= e.on_disk;
            e.on_disk = 0;
            e.st = St::Absent;
        }
        true
    }
}

fn fetch_loop(shared: &Arc<Shared>, remote: &Remote) {
    let mut st = shared.lock();
    loop {
        if st.stop {
            return;
        }
        let next = (st.loading < shared.concurrency)
            .then(|| {
                (0..st.entries.len())
                    .filter(|&i| st.entries[i].st == St::Queued && st.entries[i].pins > 0)
                    .min_by_key(|&i| (st.entries[i].need, i))
            })
            .flatten();
        if let Some(i) = next {
            let f = &shared.files[i];
            let more = f.bytes - st.entries[i].on_disk;
            if shared.make_room(&mut st, more, i) {
                st.used += more;
                let peak = st.used;
                shared.counters.peak_bytes.fetch_max(peak, Relaxed);
                let dest = shared.dir.join(&f.name);
                let e = &mut st.entries[i];
                e.on_disk = f.bytes;
                // A file another rank of the node holds is linked as this cache's partial file:
                // the "download" below then only checks it.
                let shared_file = shared.link_from_sibling(f, &dest);
                if shared_file {
                    shared.counters.files_shared.fetch_add(1, Relaxed);
                }
                e.st = St::Loading;
                st.loading += 1;
                let (sh, store, f) = (shared.clone(), remote.store.clone(), f.clone());
                remote.rt.spawn(async move {
                    let r = fetch_file(&store, &f, &dest, &sh.counters).await;
                    sh.finish(i, &dest, r, shared_file);
                });
                continue;
            }
        }
        st = shared.changed.wait(st).unwrap_or_else(|e| e.into_inner());
    }
}

impl Shared {
    /// Takes `f` from the cache of another rank of this node (a sibling directory of this one,
    /// `_stream/rank-<r>/`) when it holds the complete file: a hard link, so the node downloads
    /// and stores the file once. Counted here at its full size as if downloaded (conservative:
    /// the node's disk holds it once). `false` when no sibling has it (or it was evicted
    /// between the look and the link): then it is downloaded.
    fn link_from_sibling(&self, f: &CachedFile, dest: &Path) -> bool {
        let Some(parent) = self.dir.parent() else {
            return false;
        };
        let Ok(dirs) = std::fs::read_dir(parent) else {
            return false;
        };
        for d in dirs.flatten() {
            let path = d.path();
            if path == self.dir || !d.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let from = path.join(&f.name);
            if std::fs::metadata(&from).is_ok_and(|m| m.is_file() && m.len() == f.bytes) {
                let part = partial_path(dest);
                let _ = std::fs::remove_file(&part);
                let _ = std::fs::remove_file(dest);
                if std::fs::hard_link(&from, &part).is_ok() {
                    return true;
                }
            }
        }
        false
    }

    fn finish(&self, i: usize, dest: &Path, r: Result<()>, shared_file: bool) {
        let mut st = self.lock();
        st.loading -= 1;
        let e = &mut st.entries[i];
        let reserved = e.on_disk;
        match r {
            Ok(()) => {
                e.st = St::Ready;
                if !shared_file {
                    self.counters.files_downloaded.fetch_add(1, Relaxed);
                }
            }
            Err(err) => {
                let corrupt = matches!(err, Error::Corrupt { .. });
                let message = match err {
                    Error::Corrupt { reason, .. } => reason,
                    Error::Remote { message, .. } => message,
                    other => other.to_string(),
                };
                e.st = St::Failed(Arc::new(message), corrupt);
                e.on_disk = std::fs::metadata(partial_path(dest)).map_or(0, |m| m.len());
                let freed = reserved - e.on_disk.min(reserved);
                st.used -= freed;
            }
        }
        drop(st);
        self.changed.notify_all();
    }
}

fn partial_path(dest: &Path) -> PathBuf {
    let mut s = dest.as_os_str().to_owned();
    s.push(PARTIAL);
    PathBuf::from(s)
}

/// Downloads `f` to `dest`, resuming from `dest.partial` when an earlier download left one. A
/// resumed file that fails its check is downloaded once more from the start (the prefix left
/// on disk may be what was damaged).
async fn fetch_file(
    store: &Arc<dyn ObjectStore>,
    f: &CachedFile,
    dest: &Path,
    counters: &Counters,
) -> Result<()> {
    let resumed = std::fs::metadata(partial_path(dest)).is_ok_and(|m| m.len() > 0);
    match fetch_once(store, f, dest, counters).await {
        Err(Error::Corrupt { .. }) if resumed => fetch_once(store, f, dest, counters).await,
        r => r,
    }
}

async fn fetch_once(
    store: &Arc<dyn ObjectStore>,
    f: &CachedFile,
    dest: &Path,
    counters: &Counters,
) -> Result<()> {
    let part = partial_path(dest);
    // The prefix already on disk, and its CRC (read on a blocking thread).
    let p = part.clone();
    let (mut out, mut crc, mut have) = tokio::task::spawn_blocking(move || -> Result<_> {
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .append(true)
            .open(&p)
            .at(&p)?;
        let (mut crc, mut have) = (0u32, 0u64);
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = match file.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(Error::io(&p, e)),
            };
            crc = crc32c::crc32c_append(crc, &buf[..n]);
            have += n as u64;
        }
        Ok((file, crc, have))
    })
    .await
    .map_err(|e| Error::Remote {
        url: f.url.clone(),
        message: "read task failed".into(),
        source: Some(Box::new(e)),
    })??;
    if have > f.bytes {
        let _ = std::fs::remove_file(&part);
        return Err(Error::corrupt(
            &f.url,
            format!(
                "a partial download of {have} bytes is longer than the manifest's {}",
                f.bytes
            ),
        ));
    }
    if have > 0 {
        counters.bytes_resumed.fetch_add(have, Relaxed);
    }
    if have < f.bytes {
        let start = have;
        let opts = GetOptions {
            range: Some(GetRange::Offset(have)),
            ..Default::default()
        };
        let got = store
            .get_opts(&f.key, opts)
            .await
            .map_err(|e| remote_err(&f.url, e))?;
        if got.meta.size != f.bytes {
            let _ = std::fs::remove_file(&part);
            return Err(Error::corrupt(
                &f.url,
                format!(
                    "has {} bytes but the manifest says {}",
                    got.meta.size, f.bytes
                ),
            ));
        }
        let range = got.range.clone();
        let mut stream = match got.payload {
            // A `file://` store hands over the open file: copied here in large reads on a
            // blocking thread (its own stream reads 8 KiB per hop through tokio's blocking pool,
            // which measured at a third of the disk's rate).
            GetResultPayload::File(file, path) => {
                let mut first = true;
                let on_chunk = move |_| {
                    if std::mem::take(&mut first) {
                        // A rank killed in the middle of a download (tests: resumed).
                        crate::fault::point("stream-download");
                    }
                };
                let (o, c, copied) =
                    copy_local(&f.url, file, path, range, out, part.clone(), crc, on_chunk).await?;
                counters.bytes_downloaded.fetch_add(copied, Relaxed);
                (out, crc, have) = (o, c, have + copied);
                futures::stream::empty().boxed()
            }
            GetResultPayload::Stream(stream) => stream,
        };
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| remote_err(&f.url, e))?;
            let take = chunk.len().min((f.bytes - have) as usize);
            crc = crc32c::crc32c_append(crc, &chunk[..take]);
            out.write_all(&chunk[..take]).at(&part)?;
            if have == start && take > 0 {
                // A rank killed in the middle of a download (tests: the partial file is resumed).
                crate::fault::point("stream-download");
            }
            have += take as u64;
            counters.bytes_downloaded.fetch_add(take as u64, Relaxed);
            if have == f.bytes {
                break;
            }
        }
    }
    let found = crate::store::ipc::checksum_string(crc);
    if have != f.bytes || found != f.checksum {
        let _ = std::fs::remove_file(&part);
        return Err(Error::corrupt(
            &f.url,
            format!(
                "downloaded {have} bytes with {found}; the manifest says {} bytes with {}",
                f.bytes, f.checksum
            ),
        ));
    }
    let (p, d) = (part.clone(), dest.to_path_buf());
    // No fsync: a cache is not the dataset. A process that dies leaves its writes in the page
    // cache; after a power loss, a kept file is checked before use (see `Cache::open`).
    tokio::task::spawn_blocking(move || -> Result<()> {
        drop(out);
        std::fs::rename(&p, &d).at(&d)
    })
    .await
    .map_err(|e| Error::Remote {
        url: f.url.clone(),
        message: "sync task failed".into(),
        source: Some(Box::new(e)),
    })?
}
