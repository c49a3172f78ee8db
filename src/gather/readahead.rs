//! Read-ahead for data that is not in memory: a [`Gatherer`] notices when its gathers take major
//! page faults (the mapped segments are on disk, not in the page cache) and from then on asks the
//! kernel for every page of a plan at once (`madvise(WILLNEED)`, many reads in flight) before
//! copying, instead of faulting the pages in one at a time. It stops again once the pages it
//! probes are already resident, so that data in memory pays no system call per slice. A frame
//! slice's bytes are found through its offsets: a plan's offsets are asked for first, then read
//! to ask for its frames, and a gatherer of frames asks for all frame offsets in the background.
//!
//! Segments are mapped with `MADV_RANDOM` (see [`crate::store::segment`]): a fault reads only
//! its own page, never megabytes around it, and the reads the disk sees are the pages a batch
//! needs.

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use super::*;
use crate::iofloor::page_size;

/// How a [`Gatherer`] reads mapped data that is not in the page cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReadAhead {
    /// Read ahead while gathers find data missing from memory: on at first, off after
    /// [`WARM_AFTER`] plans in a row whose probed pages were all resident before they were asked
    /// for, on again when a gather takes major page faults. Costs one `getrusage` per batch
    /// while off.
    #[default]
    Auto,
    /// Always `madvise(WILLNEED)` the pages of every plan before gathering it (and of the next
    /// plan, in loaders). Costs about a microsecond per slice and column on data in memory.
    Always,
    /// Never: pages are faulted in one at a time as the copy reaches them.
    Never,
}

impl FromStr for ReadAhead {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(Self::Auto),
            "always" | "on" | "true" => Ok(Self::Always),
            "never" | "off" | "false" => Ok(Self::Never),
            _ => Err(Error::argument(
                "read_ahead",
                format!("`{s}`: expected auto, always or never"),
            )),
        }
    }
}

impl fmt::Display for ReadAhead {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Always => "always",
            Self::Never => "never",
        })
    }
}

/// Major faults within one gather (process-wide) that switch [`ReadAhead::Auto`] on.
pub const COLD_FAULTS: u64 = 4;
/// Plans in a row found resident that switch [`ReadAhead::Auto`] off again.
pub const WARM_AFTER: u32 = 8;
/// Slices probed per plan (one `mincore` each) while reading ahead.
const PROBES: usize = 16;
/// Fingerprints of plans advised ahead that are remembered, so that gathering them does not
/// advise them again.
const RECENT: usize = 32;

/// The process's major page faults so far (faults that had to read from disk).
pub fn major_faults() -> u64 {
    #[cfg(unix)]
    {
        let mut u = std::mem::MaybeUninit::<libc::rusage>::zeroed();
        // SAFETY: getrusage writes a `rusage` into the pointer, which is valid for one.
        let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, u.as_mut_ptr()) };
        if rc == 0 {
            // SAFETY: initialised by the successful call above (and zeroed before it).
            return unsafe { u.assume_init() }.ru_majflt as u64;
        }
    }
    0
}

/// Whether the page holding `p` is in the page cache (`mincore`); `true` where that cannot be
/// told, so that a failed probe never turns read-ahead on by itself.
fn resident(p: *const u8) -> bool {
    #[cfg(unix)]
    {
        let ps = page_size();
        let page = (p as usize) & !(ps - 1);
        let mut v = 0u8;
        // SAFETY: mincore reads no memory of the range; it writes one byte per page of the
        // one-page range into `v`. An unmapped range is an error (ENOMEM), not UB.
        let rc = unsafe { libc::mincore(page as *mut libc::c_void, ps, &mut v) };
        return rc != 0 || v & 1 != 0;
    }
    #[allow(unreachable_code)]
    {
        let _ = p;
        true
    }
}

/// The read-ahead state of one [`Gatherer`], shared by the threads that gather with it.
#[derive(Debug)]
pub(super) struct ReadAheadState {
    mode: AtomicU8,
    on: AtomicBool,
    faults: AtomicU64,
    warm_streak: AtomicU32,
    recent: [AtomicU64; RECENT],
    next: AtomicUsize,
    advised: AtomicU64,
}

impl Default for ReadAheadState {
    fn default() -> Self {
        Self {
            mode: AtomicU8::new(0),
            // On until shown otherwise: a cold first batch is then read with all its pages in
            // flight, and data in memory turns it off after WARM_AFTER plans (a few `mincore`s).
            on: AtomicBool::new(true),
            faults: AtomicU64::new(major_faults()),
            warm_streak: AtomicU32::new(0),
            recent: std::array::from_fn(|_| AtomicU64::new(0)),
            next: AtomicUsize::new(0),
            advised: AtomicU64::new(0),
        }
    }
}

fn fingerprint(plan: &[SliceRef]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ plan.len() as u64;
    let mut mix = |x: u64| {
        h ^= x;
        h = h.wrapping_mul(0x100_0000_01b3).rotate_left(29);
    };
    for s in plan.iter().take(4).chain(plan.iter().rev().take(4)) {
        mix(s.episode as u64);
        mix(s.start as u64);
        mix(s.len as u64);
    }
    h | 1
}

impl Gatherer {
    /// Sets how this gatherer reads data that is not in memory (default [`ReadAhead::Auto`]).
    /// Takes `&self`: a gatherer shared by loaders can be switched while they run. On a mix,
    /// sets every part's.
    pub fn set_read_ahead(&self, mode: ReadAhead) {
        let m = match mode {
            ReadAhead::Auto => 0,
            ReadAhead::Always => 1,
            ReadAhead::Never => 2,
        };
        self.ra.mode.store(m, Ordering::Relaxed);
        if let Some(m) = &self.mix {
            m.parts().iter().for_each(|p| p.set_read_ahead(mode));
        }
    }

    /// The read-ahead mode (see [`Gatherer::set_read_ahead`]); part 0's on a mix.
    pub fn read_ahead(&self) -> ReadAhead {
        if let Some(m) = &self.mix {
            return m.parts()[0].read_ahead();
        }
        match self.ra.mode.load(Ordering::Relaxed) {
            0 => ReadAhead::Auto,
            1 => ReadAhead::Always,
            _ => ReadAhead::Never,
        }
    }

    /// Whether gathers currently read ahead: always with [`ReadAhead::Always`], never with
    /// [`ReadAhead::Never`], and with [`ReadAhead::Auto`] while the data was last found missing
    /// from memory. On a mix, whether any part does.
    pub fn reading_ahead(&self) -> bool {
        if let Some(m) = &self.mix {
            return m.parts().iter().any(|p| p.reading_ahead());
        }
        match self.read_ahead() {
            ReadAhead::Auto => self.ra.on.load(Ordering::Relaxed),
            ReadAhead::Always => true,
            ReadAhead::Never => false,
        }
    }

    /// Plans whose pages this gatherer asked the kernel for so far; on a mix, the sum of its
    /// parts' (each counting its share of a plan).
    pub fn plans_read_ahead(&self) -> u64 {
        if let Some(m) = &self.mix {
            return m.parts().iter().map(|p| p.plans_read_ahead()).sum();
        }
        self.ra.advised.load(Ordering::Relaxed)
    }

    /// How many of up to [`PROBES`] slices of `plan` (spread over it) have the first page of
    /// their first stored column missing from the page cache.
    fn probe_missing(&self, plan: &[SliceRef]) -> usize {
        let Some(bufs) = self.columns.iter().find_map(|c| match &c.source {
            ColumnSource::Stored(b) | ColumnSource::DerivedNext { obs: b, .. } => {
                Some((b, c.width * elem_size(&c.data_type)))
            }
            ColumnSource::StoredBool(_) | ColumnSource::Frames(_) => None,
        }) else {
            return 0;
        };
        let (bufs, step) = bufs;
        let every = plan.len().div_ceil(PROBES).max(1);
        let mut missing = 0;
        for s in plan.iter().step_by(every) {
            if s.episode as usize >= self.snap.episodes().len() {
                continue;
            }
            let loc = self.snap.episodes().get(s.episode as usize);
            let a = s.start.max(0);
            if a >= loc.length as i64 {
                continue;
            }
            let (bi, r) = self.snap.segments()[loc.segment].locate(loc.segment_row + a as u64);
            let buf = bufs[loc.segment][bi].as_slice();
            if let Some(p) = buf.get(r * step) {
                missing += usize::from(!resident(p));
            }
        }
        missing
    }

    /// Probes `plan` and advises it if some of it is missing; counts towards switching
    /// [`ReadAhead::Auto`] off when none is.
    fn probe_and_advise(&self, plan: &[SliceRef]) {
        if self.read_ahead() == ReadAhead::Always || self.probe_missing(plan) > 0 {
            self.ra.warm_streak.store(0, Ordering::Relaxed);
            self.advise(plan);
            self.ra.advised.fetch_add(1, Ordering::Relaxed);
        } else if self.ra.warm_streak.fetch_add(1, Ordering::Relaxed) + 1 >= WARM_AFTER {
            self.ra.on.store(false, Ordering::Relaxed);
            self.ra.faults.store(major_faults(), Ordering::Relaxed);
        }
    }

    fn remember(&self, plan: &[SliceRef]) {
        let i = self.ra.next.fetch_add(1, Ordering::Relaxed) % RECENT;
        self.ra.recent[i].store(fingerprint(plan), Ordering::Relaxed);
    }

    fn advised_recently(&self, plan: &[SliceRef]) -> bool {
        let f = fingerprint(plan);
        self.ra
            .recent
            .iter()
            .any(|r| r.load(Ordering::Relaxed) == f)
    }

    /// For loaders: `plan` will be gathered next by this thread; while reading ahead, ask the
    /// kernel for its pages now so that they arrive while the current plan is copied.
    /// With `always`, unconditionally. A mix's parts each advise their share.
    pub(crate) fn advise_ahead(&self, plan: &[SliceRef], always: bool) {
        if let Some(m) = &self.mix {
            return m
                .ranges(plan)
                .for_each(|(p, range)| p.advise_ahead(range, always));
        }
        if always {
            self.advise(plan);
            self.ra.advised.fetch_add(1, Ordering::Relaxed);
        } else if self.reading_ahead() {
            self.probe_and_advise(plan);
        } else {
            return;
        }
        self.remember(plan);
    }

    /// Before a gather: while reading ahead, ask for all of `plan`'s pages at once (unless a
    /// loader already did).
    pub(super) fn before_gather(&self, plan: &[SliceRef]) {
        if self.reading_ahead() && !self.advised_recently(plan) {
            self.probe_and_advise(plan);
        }
    }

    /// After a gather: in [`ReadAhead::Auto`], major faults since the last look switch read-ahead
    /// on.
    pub(super) fn after_gather(&self) {
        if self.read_ahead() != ReadAhead::Auto || self.ra.on.load(Ordering::Relaxed) {
            return;
        }
        let now = major_faults();
        let before = self.ra.faults.swap(now, Ordering::Relaxed);
        if now.saturating_sub(before) >= COLD_FAULTS {
            self.ra.warm_streak.store(0, Ordering::Relaxed);
            self.ra.on.store(true, Ordering::Relaxed);
        }
    }
}

impl Gatherer {
    /// Hints the kernel to read ahead the pages `plan` will touch (`madvise(WILLNEED)`), so that
    /// a later [`Gatherer::gather`] of it finds them in the page cache. Cheap when they already are.
    pub fn advise(&self, plan: &[SliceRef]) {
        if let Some(m) = &self.mix {
            return m.ranges(plan).for_each(|(p, range)| p.advise(range));
        }
        // Frame offsets first: the frames' bytes are found by reading them, so that asking for
        // every slice's offsets at once makes a cold plan wait for one read, not one a slice.
        if self.has_frames() {
            self.advise_frames(plan, frames::FrameSource::stored_offsets);
        }
        for (loc, a, b) in plan.iter().filter_map(|s| self.stored_steps(s)) {
            let seg = &self.snap.segments()[loc.segment];
            let (bi, r) = seg.locate(loc.segment_row + a as u64);
            for c in &self.columns {
                let step = c.width * elem_size(&c.data_type);
                let bufs = match &c.source {
                    ColumnSource::Stored(bufs) | ColumnSource::DerivedNext { obs: bufs, .. } => {
                        bufs
                    }
                    ColumnSource::StoredBool(_) | ColumnSource::Frames(_) => continue,
                };
                let buf = &bufs[loc.segment][bi];
                let from = (r * step).min(buf.len());
                let n = ((b - a + 1) * step).min(buf.len() - from);
                seg.advise_willneed(&buf.as_slice()[from..from + n]);
            }
        }
        // Then the frames, whose offsets are arriving.
        if self.has_frames() {
            self.advise_frames(plan, frames::FrameSource::stored);
        }
    }

    /// Where slice `s` lies and its stored steps `a .. b` of the episode; `None` for a slice
    /// with none, or of another snapshot's plan (nothing to advise: [`Gatherer::gather`]
    /// refuses it).
    fn stored_steps(&self, s: &SliceRef) -> Option<(crate::index::EpisodeLocation, usize, usize)> {
        if s.episode as usize >= self.snap.episodes().len() {
            return None;
        }
        let loc = self.snap.episodes().get(s.episode as usize);
        let a = s.start.max(0);
        let b = s.start.saturating_add(s.len as i64).min(loc.length as i64);
        (b > a).then_some((loc, a as usize, b as usize))
    }

    /// `madvise(WILLNEED)` of the bytes `bytes` gives for each slice of `plan` and frame column.
    fn advise_frames<'s>(
        &'s self,
        plan: &[SliceRef],
        bytes: impl Fn(
            &frames::FrameSource,
            &'s Segment,
            u64,
            (usize, usize, usize),
        ) -> Option<&'s [u8]>,
    ) {
        for (loc, a, b) in plan.iter().filter_map(|s| self.stored_steps(s)) {
            let seg = &self.snap.segments()[loc.segment];
            let steps = (a, b, loc.length as usize);
            for c in &self.columns {
                if let ColumnSource::Frames(fs) = &c.source
                    && let Some(r) = bytes(fs, seg, loc.segment_row, steps)
                {
                    seg.advise_willneed(r);
                }
            }
        }
    }
}

/// Asks the kernel, from a background thread, for the frame offsets of every segment of `snap`
/// (8 bytes a frame), where they take at most a quarter of the memory this process may use
/// ([`crate::sample::max_batch_bytes`] is half): a sampler needs a slice's offsets to find its
/// frames, and offsets in memory save a cold slice one of its two reads. Opening reads none of
/// them (they are checked where they are read), so this costs a gatherer nothing; a hint only.
pub(super) fn read_frame_offsets_ahead(snap: &Snapshot) {
    let frames = snap.frame_columns().len() as u64;
    let bytes = snap.num_transitions().saturating_mul(8 * frames);
    if bytes == 0 || bytes > crate::sample::max_batch_bytes() / 2 {
        return;
    }
    let segments = snap.segments().to_vec();
    let _ = std::thread::Builder::new()
        .name("trajstore-offsets".into())
        .spawn(move || {
            for s in segments {
                s.advise_frame_offsets();
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_print() {
        for m in [ReadAhead::Auto, ReadAhead::Always, ReadAhead::Never] {
            assert_eq!(m.to_string().parse::<ReadAhead>().unwrap(), m);
        }
        assert_eq!("on".parse::<ReadAhead>().unwrap(), ReadAhead::Always);
        let e = "sometimes".parse::<ReadAhead>().unwrap_err().to_string();
        assert!(e.contains("auto, always or never"), "{e}");
    }

    #[test]
    fn fingerprints_tell_plans_apart() {
        let s = |e, st| SliceRef {
            episode: e,
            start: st,
            len: 8,
        };
        let a = vec![s(1, 0), s(2, 5)];
        let b = vec![s(1, 0), s(2, 6)];
        assert_ne!(fingerprint(&a), fingerprint(&b));
        assert_eq!(fingerprint(&a), fingerprint(&a.clone()));
    }

    /// Drops the files under `dir` from the page cache; `false` where the kernel kept them.
    fn evict(dir: &std::path::Path) -> bool {
        use std::os::fd::AsRawFd;
        let mut kept = false;
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                kept |= !evict(&p);
                continue;
            }
            let f = std::fs::File::open(&p).unwrap();
            // SAFETY: a hint on an open descriptor.
            unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
            // SAFETY: read-only map of a file nobody writes during the test.
            let map = unsafe { memmap2::Mmap::map(&f) }.unwrap();
            kept |= !map.is_empty() && resident(map.as_ptr());
        }
        !kept
    }

    #[test]
    fn major_faults_switch_auto_back_on() {
        use crate::sample::SamplerSpec;
        use crate::store::Dataset;
        let dir = tempfile::tempdir().unwrap();
        let spec = crate::synth::SynthSpec {
            transitions: 200_000,
            obs_shape: vec![64],
            ..Default::default()
        };
        let ds = Dataset::create(dir.path().join("d"), &spec.schema().unwrap()).unwrap();
        let mut w = ds.writer(Default::default()).unwrap();
        spec.write(&mut w, None, |_| {}).unwrap();
        if !evict(dir.path()) {
            eprintln!("skipped: the page cache keeps the files after DONTNEED here");
            return;
        }
        let snap = ds.snapshot().unwrap();
        let g = Gatherer::try_new(&snap, &[col::OBSERVATION]).unwrap();
        assert!(g.reading_ahead(), "Auto starts on");
        // As if earlier plans had been found in memory.
        g.ra.on.store(false, Ordering::Relaxed);
        g.ra.faults.store(major_faults(), Ordering::Relaxed);
        let s = SamplerSpec::uniform(8, 64).build(&snap).unwrap().sampler;
        let (mut plan, mut b) = (vec![], Batch::default());
        s.plan(0, &mut plan);
        g.gather(&plan, &mut b).unwrap();
        assert!(
            g.reading_ahead(),
            "a gather of evicted pages took no major fault"
        );
    }

    #[test]
    fn probes_of_anonymous_memory_say_resident() {
        let v = vec![1u8; 1 << 16];
        assert!(resident(v.as_ptr()));
        crate::store::ipc::will_need(&v);
        assert!(major_faults() < u64::MAX);
        assert!(page_size().is_power_of_two());
    }
}
