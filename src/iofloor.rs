//! The disk's physical random-read limit, measured: `queue_depth` threads each issue synchronous
//! reads of `block` bytes at random block-aligned offsets over a set of files, for a while, with
//! `O_DIRECT` so that the page cache neither answers them nor is filled by them.
//!
//! Out-of-core sampling reads a few pages at random places per slice; its speed means something
//! only next to what the same disk can do at all, measured in the same run on the same files
//! (`trajstore bench --io-floor` reports the loader as a fraction of it).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// Alignment of the read buffers: `O_DIRECT` needs buffers, offsets and lengths aligned to the
/// device's logical block size, which 4096 covers on every common device.
const ALIGN: usize = 4096;

/// The size of a memory page (`sysconf(_SC_PAGESIZE)`; 4096 where it cannot be read): the unit
/// in which the kernel reads a memory-mapped file on a page fault.
pub fn page_size() -> usize {
    static PAGE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *PAGE.get_or_init(|| {
        // SAFETY: sysconf reads a configuration value and touches no memory of ours.
        let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if n > 0 { n as usize } else { 4096 }
    })
}

/// What [`random_reads`] measured.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct ReadRate {
    /// Bytes per read.
    pub block: usize,
    /// Reads in flight at once (one synchronous reader thread each).
    pub queue_depth: usize,
    /// Completed reads per second.
    pub ios_per_s: f64,
    /// Bytes read per second.
    pub bytes_per_s: f64,
    /// Whether the reads bypassed the page cache (`O_DIRECT`). `false` where the file system
    /// refuses direct I/O: then the reads are buffered (with `POSIX_FADV_RANDOM`), and pages
    /// already cached make the figures optimistic.
    pub direct: bool,
    /// Reads completed.
    pub ios: u64,
    /// Seconds the measurement took.
    pub secs: f64,
}

/// Measures random reads of `block` bytes at block-aligned offsets over `files` for about
/// `duration`, with `queue_depth` threads each doing one synchronous `pread` at a time. Offsets
/// are uniform over all blocks of all files (so each file is read in proportion to its size) and
/// a pure function of `seed`.
///
/// Files are opened with `O_DIRECT` (Linux) and read into 4096-aligned buffers; where the file
/// system refuses direct I/O (`EINVAL` on open or on a first read), every file is read buffered
/// instead, advised `POSIX_FADV_RANDOM`, and [`ReadRate::direct`] is `false`.
///
/// Errors: [`Error::InvalidArgument`] for a `block` or `queue_depth` of 0, no files, or files that
/// are all empty; [`Error::NotFound`] or [`Error::Io`] naming the file that cannot be opened or
/// read.
pub fn random_reads(
    files: &[PathBuf],
    block: usize,
    queue_depth: usize,
    duration: Duration,
    seed: u64,
) -> Result<ReadRate> {
    if block == 0 {
        return Err(Error::argument("block", "reads of 0 bytes measure nothing"));
    }
    if queue_depth == 0 {
        return Err(Error::argument(
            "queue_depth",
            "at least one read must be in flight",
        ));
    }
    if files.is_empty() {
        return Err(Error::argument("files", "no files to read"));
    }
    let (opened, direct) = match open_all(files, block, true)? {
        Some(o) => (o, true),
        None => (
            open_all(files, block, false)?.expect("buffered opens do not fall back"),
            false,
        ),
    };
    // Prefix sums of the files' block counts: a uniform global block picks its file by size.
    let mut ends = Vec::with_capacity(opened.len());
    let mut total = 0u64;
    for o in &opened {
        total += o.len.div_ceil(block as u64);
        ends.push(total);
    }
    if total == 0 {
        return Err(Error::argument("files", "every file is empty"));
    }
    let start = Instant::now();
    let deadline = start + duration;
    let per_thread = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..queue_depth)
            .map(|t| {
                let (opened, ends) = (&opened, &ends);
                scope.spawn(move || {
                    let mut rng =
                        SplitMix64(seed ^ (t as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
                    let mut buf = AlignedBuf::new(block);
                    let (mut ios, mut bytes) = (0u64, 0u64);
                    loop {
                        let g = rng.below(total);
                        let f = ends.partition_point(|&e| e <= g);
                        let first = if f == 0 { 0 } else { ends[f - 1] };
                        let o = &opened[f];
                        let n = o
                            .file
                            .read_at(buf.as_mut(), (g - first) * block as u64)
                            .map_err(|e| Error::io(&o.path, e))?;
                        ios += 1;
                        bytes += n as u64;
                        if Instant::now() >= deadline {
                            return Ok::<_, Error>((ios, bytes));
                        }
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a reader thread panicked"))
            .collect::<Vec<_>>()
    });
    let secs = start.elapsed().as_secs_f64();
    let (mut ios, mut bytes) = (0u64, 0u64);
    for r in per_thread {
        let (i, b) = r?;
        ios += i;
        bytes += b;
    }
    Ok(ReadRate {
        block,
        queue_depth,
        ios_per_s: ios as f64 / secs,
        bytes_per_s: bytes as f64 / secs,
        direct,
        ios,
        secs,
    })
}

struct Opened {
    path: PathBuf,
    file: File,
    len: u64,
}

/// Opens every file, direct (`O_DIRECT`, checked with one read of its first block) or buffered
/// (advised random access). `None` when direct I/O is refused (`EINVAL`), so that the caller
/// reads every file buffered.
fn open_all(files: &[PathBuf], block: usize, direct: bool) -> Result<Option<Vec<Opened>>> {
    let mut out = Vec::with_capacity(files.len());
    let mut probe = AlignedBuf::new(block);
    for path in files {
        let file = match open(path, direct) {
            Ok(f) => f,
            Err(e) if direct && is_einval(&e) => return Ok(None),
            Err(e) => return Err(Error::io(path, e)),
        };
        let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
        if direct {
            match file.read_at(probe.as_mut(), 0) {
                Ok(_) => {}
                Err(e) if is_einval(&e) => return Ok(None),
                Err(e) => return Err(Error::io(path, e)),
            }
        } else {
            advise_random(&file);
        }
        out.push(Opened {
            path: path.clone(),
            file,
            len,
        });
    }
    Ok(Some(out))
}

fn is_einval(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(libc::EINVAL)
}

fn open(path: &Path, direct: bool) -> std::io::Result<File> {
    let mut o = std::fs::OpenOptions::new();
    o.read(true);
    #[cfg(target_os = "linux")]
    if direct {
        use std::os::unix::fs::OpenOptionsExt;
        o.custom_flags(libc::O_DIRECT);
    }
    #[cfg(not(target_os = "linux"))]
    if direct {
        // No O_DIRECT here: report it as refused, and read buffered.
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    }
    o.open(path)
}

/// `posix_fadvise(POSIX_FADV_RANDOM)`: no read-ahead around each buffered read. A hint; errors
/// are ignored.
fn advise_random(file: &File) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: `file` is an open descriptor for the whole call; the advice reads no memory.
        unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
    }
    #[cfg(not(target_os = "linux"))]
    let _ = file;
}

/// A zeroed heap buffer of `len` bytes aligned to [`ALIGN`], as `O_DIRECT` reads need.
struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
    layout: std::alloc::Layout,
}

impl AlignedBuf {
    fn new(len: usize) -> Self {
        let layout = std::alloc::Layout::from_size_align(len.max(1).next_multiple_of(ALIGN), ALIGN)
            .expect("a read block fits in memory");
        // SAFETY: `layout` has a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr =
            std::ptr::NonNull::new(p).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        Self { ptr, len, layout }
    }

    /// The `len` bytes asked of [`AlignedBuf::new`] (a direct read of a length the device does
    /// not accept fails with `EINVAL`, and the reads fall back to buffered ones).
    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` points to `layout.size() >= len` initialised (zeroed) bytes owned by
        // `self`, borrowed mutably for the slice's life.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this very layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

// SAFETY: the buffer is plain bytes owned uniquely by the value; moving it to another thread
// moves that ownership.
unsafe impl Send for AlignedBuf {}

/// A small, fast, seeded generator for offsets (statistical quality is all that is needed).
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`), by multiply-shift.
    fn below(&mut self, n: u64) -> u64 {
        ((self.next() as u128 * n as u128) >> 64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_of(dir: &Path, name: &str, len: usize) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, vec![7u8; len]).unwrap();
        p
    }

    #[test]
    fn random_reads_count_reads_and_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let files = [
            file_of(dir.path(), "a", 1 << 20),
            file_of(dir.path(), "b", 3 << 20),
        ];
        for qd in [1, 3] {
            let r = random_reads(&files, 4096, qd, Duration::from_millis(100), 1).unwrap();
            assert_eq!((r.block, r.queue_depth), (4096, qd));
            assert!(r.ios >= qd as u64, "{r:?}");
            assert!(r.ios_per_s > 0.0 && r.bytes_per_s > 0.0, "{r:?}");
            assert!(r.secs >= 0.1, "{r:?}");
            // Whole blocks only: both files are multiples of the block.
            assert!((r.bytes_per_s / r.ios_per_s - 4096.0).abs() < 1e-6, "{r:?}");
        }
    }

    #[test]
    fn blocks_larger_than_a_file_and_partial_last_blocks_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let files = [file_of(dir.path(), "small", 10_000)];
        let r = random_reads(&files, 1 << 20, 2, Duration::from_millis(50), 2).unwrap();
        assert!(r.ios > 0 && r.bytes_per_s > 0.0, "{r:?}");
        // Each read returns the whole (short) file.
        assert!(r.bytes_per_s / r.ios_per_s <= 10_000.0 + 1e-6, "{r:?}");
    }

    #[test]
    fn a_missing_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.arrow");
        let files = [file_of(dir.path(), "a", 8192), missing.clone()];
        match random_reads(&files, 4096, 1, Duration::from_millis(10), 0) {
            Err(Error::NotFound { path }) => assert_eq!(path, missing),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn nothing_to_measure_is_an_invalid_argument() {
        let dir = tempfile::tempdir().unwrap();
        let files = [file_of(dir.path(), "a", 8192)];
        let d = Duration::from_millis(10);
        for (r, arg) in [
            (random_reads(&files, 0, 1, d, 0), "block"),
            (random_reads(&files, 4096, 0, d, 0), "queue_depth"),
            (random_reads(&[], 4096, 1, d, 0), "files"),
            (
                random_reads(&[file_of(dir.path(), "empty", 0)], 4096, 1, d, 0),
                "files",
            ),
        ] {
            match r {
                Err(Error::InvalidArgument { argument, .. }) => {
                    assert_eq!(argument.as_deref(), Some(arg))
                }
                other => panic!("{arg}: {other:?}"),
            }
        }
    }

    #[test]
    fn the_page_size_is_a_power_of_two() {
        assert!(page_size().is_power_of_two() && page_size() >= 4096);
    }

    #[test]
    fn offsets_are_uniform_below_n() {
        let mut r = SplitMix64(5);
        let mut counts = [0u32; 4];
        for _ in 0..40_000 {
            counts[r.below(4) as usize] += 1;
        }
        assert!(
            counts.iter().all(|&c| (9_000..11_000).contains(&c)),
            "{counts:?}"
        );
    }
}
