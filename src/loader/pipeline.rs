//! The worker machinery shared by [`super::Loader`] and the torch loader: which batch numbers a
//! worker produces ([`Lane`]: the next one free, whichever worker asks), its plans with optional
//! read-ahead ([`WorkerPlans`]), and a pool of threads that produce numbered items, at most a
//! window ahead of the consumer, which takes them in order from one cell per item the window
//! allows ([`Pipeline`]).

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use super::LoaderOptions;
use super::feed::{Feed, Generation};
use crate::error::{Error, Result};
use crate::gather::{Gatherer, ReadAhead};
use crate::index::SliceRef;
use crate::sample::Sampler;

/// The sampler's batch that batch `k` of `rank` among `world` ranks is. Endless samplers: `k *
/// world + rank` (ranks interleave). Epoch samplers of `per` batches per epoch: each rank takes
/// `c = ceil(per / world)` batches per epoch, batch `i` of epoch `e` being the epoch's batch
/// `(i * world + rank) mod per`, so that ranks stay inside the same epoch and take the same number
/// of batches (data-parallel steps stay in lockstep); when `world` does not divide `per`, the
/// last batches of some ranks repeat batches of the epoch another rank took, as
/// `DistributedSampler` pads.
pub fn global_batch(k: u64, rank: u64, world: u64, per_epoch: Option<u64>) -> u64 {
    match per_epoch {
        Some(per) if per > 0 && world > 1 => {
            let c = per.div_ceil(world).max(1);
            let (e, i) = (k / c, k % c);
            e * per + (i * world + rank) % per
        }
        _ => k * world + rank,
    }
}

/// The number one past the last batch a loader over `sampler` yields, batches numbered from
/// `start`: `start + max_batches`, else the end of the epoch `start` is in for epoch samplers
/// (this rank's share: `ceil(per_epoch / world_size)` batches per epoch), else endless.
pub(crate) fn loader_end(
    sampler: &dyn Sampler,
    start: u64,
    max_batches: Option<u64>,
    world_size: u64,
) -> Option<u64> {
    let count = max_batches.or_else(|| {
        sampler.batches_per_epoch().map(|per| {
            let c = per.div_ceil(world_size.max(1)).max(1);
            c - start % c
        })
    });
    count.map(|n| start.saturating_add(n))
}

/// Refuses a world size of 0 and a rank outside `0..world_size`, naming the argument.
pub(crate) fn check_rank(rank: u64, world_size: u64) -> Result<()> {
    if world_size == 0 {
        return Err(Error::argument(
            "world_size",
            format!("world_size must be at least 1 (given rank {rank} of world_size 0)"),
        ));
    }
    if rank >= world_size {
        return Err(Error::argument(
            "rank",
            format!("rank {rank} is not in 0..world_size {world_size}"),
        ));
    }
    Ok(())
}

/// The most worker threads a loader starts (each is an OS thread with its own stack and batch).
pub const MAX_WORKERS: usize = 1024;

/// Checks what a loader of `opts` over batches of `batch_bytes` would hold: at most
/// [`MAX_WORKERS`] workers, and its batches in flight (one per worker, `prefetch` queued, one
/// with the consumer) within [`crate::sample::max_batch_bytes`]. An [`Error::InvalidArgument`]
/// about `workers` or `prefetch` otherwise, before any thread or queue is made.
pub(crate) fn check_in_flight(batch_bytes: u64, opts: &LoaderOptions) -> Result<()> {
    if opts.workers > MAX_WORKERS {
        return Err(Error::argument(
            "workers",
            format!(
                "{} workers: at most {MAX_WORKERS} (each is a thread)",
                opts.workers
            ),
        ));
    }
    let (workers, prefetch) = (opts.workers.max(1) as u64, opts.prefetch.max(1) as u64);
    let batches = workers.saturating_add(prefetch).saturating_add(1);
    crate::sample::check_memory(
        if prefetch >= workers {
            "prefetch"
        } else {
            "workers"
        },
        &format!(
            "{batches} batches in flight ({workers} workers, prefetch {prefetch}, one being \
             consumed) of {} each",
            crate::format::human_bytes(batch_bytes)
        ),
        batches.checked_mul(batch_bytes),
    )
}

/// The most items a worker that reached the window waits room for ([`burst`]).
pub(crate) const MAX_BURST: usize = 4;
/// The most memory the batches a [`burst`] adds to the window may hold.
const BURST_BYTES: u64 = 64 << 20;

/// How many of its items a worker that reached the window waits room for before it is woken
/// ([`Pipeline::start`]'s `burst`), for batches of `batch_bytes`: up to [`MAX_BURST`], while the
/// `workers * (burst - 1)` batches this adds to the window hold at most 64 MiB and every batch
/// in flight (see [`check_in_flight`]) still fits [`crate::sample::max_batch_bytes`].
///
/// A worker woken for every item the consumer takes costs both threads a system call per batch
/// (the consumer's wake-up, then the worker's, when the consumer waits for it again). Measured
/// on 4 x 4 batches of the demo on 2 cores (a 1.8 µs gather), that was most of the loader's
/// time: 86,000 batches/s with one worker, 192,000 with bursts of 4.
pub(crate) fn burst(batch_bytes: u64, workers: usize, prefetch: usize) -> usize {
    let (w, p, bytes) = (
        workers.max(1) as u64,
        prefetch.max(1) as u64,
        batch_bytes.max(1),
    );
    let limit = crate::sample::max_batch_bytes();
    (1..=MAX_BURST as u64)
        .rev()
        .find(|&b| {
            let extra = w.saturating_mul(b - 1).saturating_mul(bytes);
            let all = w
                .saturating_mul(b)
                .saturating_add(p + 1)
                .saturating_mul(bytes);
            b == 1 || (extra <= BURST_BYTES && all <= limit)
        })
        .unwrap_or(1) as usize
}

/// The most items a [`Pipeline`] of `workers` with `prefetch` and `burst` has in use at once:
/// its window ahead of the consumer, one being produced by each worker, the consumer's and one
/// more. A pool of recycled items this large makes none in a steady state.
pub(crate) fn items_in_use(workers: usize, prefetch: usize, burst: usize) -> usize {
    let workers = workers.max(1);
    workers * burst.clamp(1, MAX_BURST) + prefetch.max(1) + workers + 2
}

/// [`burst`] for a loader over `feed` from batch `start`: 1 where a sampler is prioritized, whose
/// batches are drawn from the priorities current when they are planned (longer bursts would
/// plan further ahead of the priorities the training loop sets).
pub(crate) fn feed_burst(
    feed: &Feed,
    start: u64,
    batch_bytes: u64,
    (workers, prefetch): (usize, usize),
) -> usize {
    match feed.prioritized(start).iter().any(Option::is_some) {
        true => 1,
        false => burst(batch_bytes, workers, prefetch),
    }
}

/// One worker's plans: batch `k` of this rank is the sampler's batch [`global_batch`], planned
/// and gathered from the feed's generation of `k`; unless read-ahead is [`ReadAhead::Never`], the
/// worker's next batch is claimed and planned one batch early ([`Lane::after`]) so that its pages
/// can be `madvise`d while the current one is gathered.
pub(crate) struct WorkerPlans {
    feed: Arc<Feed>,
    rank: u64,
    world: u64,
    per_epoch: Option<u64>,
    read_ahead: ReadAhead,
    plan: Vec<SliceRef>,
    current_gen: Option<Arc<Generation>>,
    ahead: Vec<SliceRef>,
    ahead_gen: Option<Arc<Generation>>,
    /// The batch `ahead` is the plan of.
    ahead_for: Option<u64>,
}

impl WorkerPlans {
    pub(crate) fn new(feed: Arc<Feed>) -> Self {
        let (rank, world) = feed.rank_world();
        Self {
            per_epoch: feed.first().sampler.batches_per_epoch(),
            read_ahead: feed.read_ahead(),
            feed,
            rank,
            world,
            plan: Vec::new(),
            current_gen: None,
            ahead: Vec::new(),
            ahead_gen: None,
            ahead_for: None,
        }
    }

    /// Makes the plan of this worker's batch `k` (the worker claims its batches from `lane`),
    /// then [`WorkerPlans::current`] and [`WorkerPlans::gatherer`].
    pub(crate) fn plan(&mut self, k: u64, lane: &mut Lane) {
        let global = |k: u64| global_batch(k, self.rank, self.world, self.per_epoch);
        let make = |k: u64, out: &mut Vec<SliceRef>| {
            let g = self.feed.generation(k);
            g.sampler.plan(global(k), out);
            g
        };
        if self.read_ahead != ReadAhead::Never {
            if self.ahead_for != Some(k) {
                self.ahead_gen = Some(make(k, &mut self.ahead));
            }
            std::mem::swap(&mut self.plan, &mut self.ahead);
            self.current_gen = self.ahead_gen.take();
            self.ahead_for = lane.after();
            if let Some(next) = self.ahead_for {
                let g = make(next, &mut self.ahead);
                g.gatherer
                    .advise_ahead(&self.ahead, self.read_ahead == ReadAhead::Always);
                self.ahead_gen = Some(g);
            }
        } else {
            self.current_gen = Some(make(k, &mut self.plan));
        }
    }

    /// The plan [`WorkerPlans::plan`] made last.
    pub(crate) fn current(&self) -> &[SliceRef] {
        &self.plan
    }

    /// The gatherer of the plan [`WorkerPlans::plan`] made last.
    pub(crate) fn gatherer(&self) -> &Arc<Gatherer> {
        &self
            .current_gen
            .as_ref()
            .expect("plan() comes first")
            .gatherer
    }
}

/// The item numbers of a [`Pipeline`], handed out in order, each once, to whichever worker asks
/// first: a worker that runs slower than the others (a core shared with a hyperthread sibling or
/// with the consumer, a descheduled thread) produces fewer items instead of every `workers`-th
/// one, which the consumer, taking them in order, would wait for at that worker's pace.
#[derive(Debug)]
struct Claims {
    next: AtomicU64,
    end: Option<u64>,
}

impl Claims {
    /// The next `n` unclaimed items (fewer, or none, at the end).
    fn claim(&self, n: u64) -> Range<u64> {
        let k = self.next.fetch_add(n, Ordering::Relaxed);
        let hi = k.saturating_add(n);
        k..self.end.map_or(hi, |e| hi.min(e).max(k))
    }
}

/// Which items one worker produces: it claims them from the numbers every worker of its pipeline
/// shares ([`Claims`]), one at a time, so that they rise but are not evenly spaced; a worker that
/// must wait for the consumer ([`Window`]) first claims `burst - 1` more, to be woken once for all
/// of them.
#[derive(Debug)]
pub(crate) struct Lane {
    claims: Arc<Claims>,
    /// Items claimed and not produced yet, after the current one.
    pending: Range<u64>,
    burst: u64,
}

impl Lane {
    /// Claims one item if the worker holds none after its current one.
    fn hold_one(&mut self) {
        if self.pending.is_empty() {
            self.pending = self.claims.claim(1);
        }
    }

    /// The item this worker produces next.
    fn next(&mut self) -> Option<u64> {
        self.hold_one();
        self.pending.next()
    }

    /// The item this worker produces after its current one, claimed now if it is not yet, so
    /// that it can be planned early; `None` past the end.
    pub(crate) fn after(&mut self) -> Option<u64> {
        self.hold_one();
        (!self.pending.is_empty()).then_some(self.pending.start)
    }

    /// Before a wait for the window with item `k` current: claims `burst - 1` more items if it
    /// holds none, and returns the last item it holds, which it waits to be let produce.
    fn hold_burst(&mut self, k: u64) -> u64 {
        if self.pending.is_empty() && self.burst > 1 {
            self.pending = self.claims.claim(self.burst - 1);
        }
        match self.pending.is_empty() {
            true => k,
            false => self.pending.end - 1,
        }
    }
}

type Produced<T> = std::thread::Result<T>;

/// The items the window lets exist, in cells: item `k` in cell `k % cells` (free by then: the
/// window lets `k` be produced only once the consumer took item `k - cells`). The consumer
/// waits for the one item it needs next, and a worker wakes it only with that item: an item
/// finished before the ones ahead of it is left in its cell without a wake-up (a queue woke
/// the consumer for every item, to set aside the ones that came early).
struct Delivery<T> {
    cells: Box<[Cell<T>]>,
    /// The item the consumer waits for (`u64::MAX`: none), published before it looks at the
    /// item's cell again, under `lock`.
    waiting_for: AtomicU64,
    /// Workers still running: the consumer stops waiting when none is left.
    live: AtomicUsize,
    /// Times a worker woke the consumer with the item it waited for.
    woken: AtomicU64,
    lock: Mutex<()>,
    arrived: Condvar,
}

/// On a cache line of its own: neighbouring cells are written by different workers.
#[repr(align(128))]
struct Cell<T> {
    ready: AtomicBool,
    item: Mutex<Option<Produced<T>>>,
}

impl<T> Delivery<T> {
    fn new(cells: usize, workers: usize) -> Self {
        Self {
            cells: (0..cells)
                .map(|_| Cell {
                    ready: AtomicBool::new(false),
                    item: Mutex::new(None),
                })
                .collect(),
            waiting_for: AtomicU64::new(u64::MAX),
            live: AtomicUsize::new(workers),
            woken: AtomicU64::new(0),
            lock: Mutex::new(()),
            arrived: Condvar::new(),
        }
    }

    fn cell(&self, k: u64) -> &Cell<T> {
        &self.cells[(k % self.cells.len() as u64) as usize]
    }

    /// Leaves item `k` in its cell; wakes the consumer if it waits for `k`.
    fn put(&self, k: u64, item: Produced<T>) {
        let cell = self.cell(k);
        *cell.item.lock().unwrap_or_else(|e| e.into_inner()) = Some(item);
        // Sequentially consistent with the consumer's `waiting_for` and `ready`: either it sees
        // the item ready, or this thread sees it waiting and wakes it under the lock, which it
        // holds until it waits.
        cell.ready.store(true, Ordering::SeqCst);
        if self.waiting_for.load(Ordering::SeqCst) == k {
            self.woken.fetch_add(1, Ordering::Relaxed);
            self.wake();
        }
    }

    fn wake(&self) {
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.arrived.notify_one();
    }

    /// Item `k`, waiting for it; `None` once no worker is left to produce it.
    fn take(&self, k: u64) -> Option<Produced<T>> {
        let cell = self.cell(k);
        if !cell.ready.load(Ordering::SeqCst) {
            let mut g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.waiting_for.store(k, Ordering::SeqCst);
            while !cell.ready.load(Ordering::SeqCst) && self.live.load(Ordering::SeqCst) > 0 {
                g = self.arrived.wait(g).unwrap_or_else(|e| e.into_inner());
            }
            self.waiting_for.store(u64::MAX, Ordering::SeqCst);
        }
        let item = cell.item.lock().unwrap_or_else(|e| e.into_inner()).take();
        cell.ready.store(false, Ordering::SeqCst);
        item
    }

    /// Drops the items left in the cells.
    fn clear(&self) {
        for cell in self.cells.iter() {
            cell.item.lock().unwrap_or_else(|e| e.into_inner()).take();
            cell.ready.store(false, Ordering::SeqCst);
        }
    }
}

/// Counts a worker out of [`Delivery::live`] however its thread ends, waking the consumer.
struct Leaving<'a, T>(&'a Delivery<T>);

impl<T> Drop for Leaving<'_, T> {
    fn drop(&mut self) {
        self.0.live.fetch_sub(1, Ordering::SeqCst);
        self.0.wake();
    }
}

/// Background workers producing numbered items, consumed in number order whatever the number of
/// workers: the machinery shared by [`Loader`] and the torch loader.
pub(crate) struct Pipeline<T> {
    delivery: Arc<Delivery<T>>,
    pub(crate) next: u64,
    end: Option<u64>,
    stop: Arc<AtomicBool>,
    window: Arc<Window>,
    pub(crate) workers: Vec<JoinHandle<()>>,
}

/// How far ahead of the consumer workers may go: item `k` is produced only once the consumer
/// asked for item `k - ahead` (so at most `ahead` items exist besides the consumer's, however
/// unevenly the workers run; without it, items finished out of order pile up in `pending`).
///
/// A step of the consumer wakes only the workers that wait for an item the step lets be
/// produced, and looks at them only while some worker waits: no system call a batch while the
/// workers keep up, and never every worker woken for one of them to go on (a condition variable
/// shared by all, notified to all, cost the consumer a wake-up of every waiting worker per
/// batch).
///
/// A worker that reaches the window claims `burst - 1` more items and waits until it may
/// produce all it holds ([`Lane::hold_burst`]); the window is `burst - 1` items per worker
/// wider, so that as many items are ready as without it when the worker is woken: with workers
/// faster than the consumer, the consumer wakes a worker about once every `burst` items instead
/// of once an item.
pub(crate) struct Window {
    /// The consumer's next item.
    next: AtomicU64,
    ahead: u64,
    /// Times a worker found its item outside the window and waited.
    blocked: AtomicU64,
    /// Workers waiting now: the consumer looks for one to wake only when there is one.
    waiting: AtomicUsize,
    /// Per worker: the item it waits to be let produce (`u64::MAX`: not waiting), under its own
    /// lock.
    waits: Vec<Wait>,
    /// Per worker: the items it produced.
    made: Box<[Made]>,
}

/// One worker's: on a cache line of its own.
#[repr(align(128))]
struct Wait {
    item: AtomicU64,
    lock: Mutex<()>,
    moved: Condvar,
}

/// Items one worker produced, on a cache line of its own (written once an item; the consumer
/// reads its worker's [`Wait`] while one waits).
#[repr(align(128))]
#[derive(Default)]
struct Made(AtomicU64);

impl Window {
    fn new(first: u64, ahead: u64, workers: usize) -> Self {
        Self {
            next: AtomicU64::new(first),
            ahead,
            blocked: AtomicU64::new(0),
            waiting: AtomicUsize::new(0),
            waits: (0..workers)
                .map(|_| Wait {
                    item: AtomicU64::new(u64::MAX),
                    lock: Mutex::new(()),
                    moved: Condvar::new(),
                })
                .collect(),
            made: (0..workers).map(|_| Made::default()).collect(),
        }
    }

    fn allows(&self, k: u64) -> bool {
        k < self.next.load(Ordering::SeqCst).saturating_add(self.ahead)
    }

    /// Blocks worker `w` until item `k` may be produced; when it must wait, it holds `burst`
    /// items (see [`Lane::hold_burst`]) and waits until it may produce them all, or as many as
    /// the window allows past `k` (so that a worker holding the consumer's next item is always
    /// let go on); `false` when the pipeline stops meanwhile.
    fn wait_for(&self, w: usize, k: u64, lane: &mut Lane, stop: &AtomicBool) -> bool {
        if !self.allows(k) {
            self.blocked.fetch_add(1, Ordering::Relaxed);
            let k = lane.hold_burst(k).min(k.saturating_add(self.ahead - 1));
            let wait = &self.waits[w];
            let mut g = wait.lock.lock().unwrap_or_else(|e| e.into_inner());
            // Counted and published before `next` is read again (all sequentially consistent):
            // either the consumer's advance sees this worker waiting for this item and notifies
            // under the lock, which this thread holds until `wait` releases it, or this thread
            // sees the advance.
            self.waiting.fetch_add(1, Ordering::SeqCst);
            wait.item.store(k, Ordering::SeqCst);
            while !self.allows(k) && !stop.load(Ordering::SeqCst) {
                g = wait.moved.wait(g).unwrap_or_else(|e| e.into_inner());
            }
            wait.item.store(u64::MAX, Ordering::SeqCst);
            self.waiting.fetch_sub(1, Ordering::SeqCst);
        }
        !stop.load(Ordering::SeqCst)
    }

    /// The consumer's next item is `next` (one more than before; `u64::MAX` to stop): wakes the
    /// workers waiting for an item that may now be produced (every waiting worker when
    /// stopping).
    fn advance(&self, next: u64) {
        self.next.store(next, Ordering::SeqCst);
        if next != u64::MAX && self.waiting.load(Ordering::SeqCst) == 0 {
            return;
        }
        let newly = next.saturating_add(self.ahead) - 1;
        for wait in &self.waits {
            // Not waiting is `u64::MAX`, past any `newly`.
            if wait.item.load(Ordering::SeqCst) <= newly {
                let _g = wait.lock.lock().unwrap_or_else(|e| e.into_inner());
                wait.moved.notify_one();
            }
        }
    }
}

impl<T: Send + 'static> Pipeline<T> {
    /// Starts `workers` threads, each producing with the closure `make()` returns the items from
    /// `first` (below `end`) that it claims, the next free one each time ([`Lane`]; the closure
    /// may claim its worker's next one early with [`Lane::after`]), at most `workers * burst +
    /// prefetch` items ahead of the consumer; a worker that reaches that bound waits until it may
    /// produce about `burst` items (see [`Window`] and [`burst`]; 1: woken for every item).
    pub(crate) fn start<F>(
        (workers, prefetch, burst): (usize, usize, usize),
        first: u64,
        end: Option<u64>,
        name: &str,
        make: impl Fn() -> F,
    ) -> Result<Self>
    where
        F: FnMut(u64, &mut Lane) -> T + Send + 'static,
    {
        let (workers, burst) = (workers.max(1), burst.clamp(1, MAX_BURST));
        let ahead = workers * burst + prefetch.max(1);
        // A cell for every item the window lets exist: the window alone bounds them.
        let delivery = Arc::new(Delivery::new(ahead, workers));
        let stop = Arc::new(AtomicBool::new(false));
        let window = Arc::new(Window::new(first, ahead as u64, workers));
        let claims = Arc::new(Claims {
            next: AtomicU64::new(first),
            end,
        });
        let mut pipeline = Self {
            delivery,
            next: first,
            end,
            stop,
            window,
            workers: Vec::with_capacity(workers),
        };
        for w in 0..workers {
            let lane = Lane {
                claims: claims.clone(),
                pending: first..first,
                burst: burst as u64,
            };
            let produce = make();
            let (delivery, stop, window) = (
                pipeline.delivery.clone(),
                pipeline.stop.clone(),
                pipeline.window.clone(),
            );
            let handle = std::thread::Builder::new()
                .name(format!("trajstore-{name}-{w}"))
                .spawn(move || run_lane((w, lane), produce, &delivery, stop, &window))
                .map_err(|e| {
                    // Dropping `pipeline` stops and joins the workers already started.
                    Error::argument(
                        "workers",
                        format!("cannot start a {name} thread (worker {w}): {e}"),
                    )
                })?;
            pipeline.workers.push(handle);
        }
        Ok(pipeline)
    }

    /// The next item in number order, blocking until it is ready; `None` at the end. A worker's
    /// panic is resumed here, at the item it happened in.
    pub(crate) fn next_item(&mut self) -> Option<T> {
        if self.end.is_some_and(|e| self.next >= e) {
            return None;
        }
        let b = self.delivery.take(self.next)?;
        self.next += 1;
        self.window.advance(self.next);
        Some(b.unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
    }

    /// Number of the next item [`Pipeline::next_item`] returns.
    pub(crate) fn position(&self) -> u64 {
        self.next
    }

    /// The items each worker produced so far (taken or not): even where the workers' cores are,
    /// uneven where some run slower (each claims the next free item).
    pub(crate) fn made_per_worker(&self) -> Vec<u64> {
        let made = self.window.made.iter();
        made.map(|m| m.0.load(Ordering::Relaxed)).collect()
    }
}

impl<T> Drop for Pipeline<T> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake workers waiting for the window.
        self.window.advance(u64::MAX);
        // Items no one will take go now (what they hold, such as a slot, goes back), and again
        // once the workers are joined (one may have left an item meanwhile).
        self.delivery.clear();
        for h in self.workers.drain(..) {
            let _ = h.join();
        }
        self.delivery.clear();
    }
}

fn run_lane<T, F: FnMut(u64, &mut Lane) -> T>(
    (w, mut lane): (usize, Lane),
    mut produce: F,
    delivery: &Delivery<T>,
    stop: Arc<AtomicBool>,
    window: &Window,
) {
    let _leaving = Leaving(delivery);
    while !stop.load(Ordering::Relaxed) {
        let Some(k) = lane.next() else { return };
        if !window.wait_for(w, k, &mut lane, &stop) {
            return;
        }
        // Not `crate::guard::quietly`: this panic is a bug, not bad input, and the
        // consumer resumes it with `resume_unwind`, which runs no panic hook; the hook's message
        // here, on the worker's thread, is the only place its text and location are printed.
        let item = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| produce(k, &mut lane)));
        let failed = item.is_err();
        // A panic (a bug in a sampler or the gather) goes to the consumer at the item it happened
        // in, instead of ending the stream silently; the worker stops there.
        window.made[w].0.fetch_add(1, Ordering::Relaxed);
        delivery.put(k, item);
        if failed {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Lane, MAX_BURST, Pipeline, burst, global_batch};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    /// Runs `f` on a thread of its own and fails if it has not returned within 60 s (a worker
    /// left waiting for a wake-up that never comes hangs instead of failing).
    fn within_a_minute(f: impl FnOnce() + Send + 'static) {
        let (tx, rx) = std::sync::mpsc::channel();
        let h = std::thread::spawn(move || {
            f();
            let _ = tx.send(());
        });
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(()) => h.join().unwrap(),
            // The thread panicked (its assertion is the failure) or hangs.
            Err(_) if h.is_finished() => h.join().unwrap(),
            Err(_) => panic!("still running after 60 s: a worker was never woken"),
        }
    }

    #[test]
    fn items_come_in_order_and_no_worker_runs_past_the_window() {
        within_a_minute(items_in_order);
    }

    fn items_in_order() {
        for (workers, prefetch, burst) in [(1, 1, 1), (2, 1, 1), (4, 2, 1), (8, 4, 1), (3, 7, 1)]
            .into_iter()
            .chain([(1, 1, 4), (2, 1, 3), (4, 2, 4), (3, 7, 2)])
        {
            let ahead = (workers * burst + prefetch) as u64;
            // The consumer's next item as the workers see it, and the furthest any item was
            // produced past it.
            let next = Arc::new(AtomicU64::new(10));
            let worst = Arc::new(AtomicU64::new(0));
            let depth = (workers, prefetch, burst);
            let mut p = Pipeline::start(depth, 10, Some(410), "test", || {
                let (next, worst) = (next.clone(), worst.clone());
                move |k: u64, _: &mut Lane| {
                    let past = k - next.load(Ordering::SeqCst);
                    worst.fetch_max(past, Ordering::SeqCst);
                    // Items finish out of order.
                    std::thread::sleep(Duration::from_micros(k * 37 % 3 * 100));
                    k * 3
                }
            })
            .unwrap();
            for k in 10..410 {
                if k % 50 == 0 {
                    // A slow consumer: every worker reaches the window and waits there.
                    std::thread::sleep(Duration::from_millis(5));
                }
                assert_eq!(
                    p.next_item(),
                    Some(k * 3),
                    "{workers} workers, burst {burst}"
                );
                next.store(k + 1, Ordering::SeqCst);
            }
            assert_eq!(p.next_item(), None);
            // The window moves to k + 1 as `next_item` hands item k out, a moment before this
            // thread records it: hence at most `ahead` past the recorded position, not less.
            let worst = worst.load(Ordering::SeqCst);
            assert!(
                worst <= ahead,
                "{workers} workers, prefetch {prefetch}, burst {burst}: {worst} ahead"
            );
        }
    }

    #[test]
    fn only_the_item_the_consumer_waits_for_wakes_it() {
        within_a_minute(|| {
            // Item 0 comes last: items 1 to 3 wait in their cells without waking the consumer,
            // which waits for item 0.
            let mut p = Pipeline::start((4, 1, 1), 0, Some(4), "test", || {
                |k: u64, _: &mut Lane| {
                    if k == 0 {
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    k
                }
            })
            .unwrap();
            assert_eq!(p.next_item(), Some(0));
            assert!(p.delivery.woken.load(Ordering::SeqCst) <= 1);
            for k in 1..4 {
                assert_eq!(p.next_item(), Some(k));
            }
            assert_eq!(p.next_item(), None);
            assert!(p.delivery.woken.load(Ordering::SeqCst) <= 1);
        });
    }

    #[test]
    fn a_waiting_worker_is_woken_once_per_burst() {
        within_a_minute(|| {
            // A consumer much slower than its workers: each time a worker finds its item outside
            // the window it waits, and is woken only when it may produce `burst` items.
            for (workers, burst) in [(1, 4), (2, 4), (3, 2)] {
                let mut p = Pipeline::start((workers, 1, burst), 0, Some(240), "test", || {
                    |k: u64, _: &mut Lane| k
                })
                .unwrap();
                for k in 0..240 {
                    std::thread::sleep(Duration::from_micros(300));
                    assert_eq!(p.next_item(), Some(k));
                }
                assert_eq!(p.next_item(), None);
                // At most one wait per `burst` items of a worker's lane, plus its last short
                // burst (woken for an item at a time, it waits about once an item).
                let waits = p.window.blocked.load(Ordering::SeqCst);
                let most = (240 / (workers * burst) + 1) * workers;
                assert!(
                    waits <= most as u64,
                    "{workers} workers, burst {burst}: {waits} waits (at most {most})"
                );
            }
        });
    }

    #[test]
    fn bursts_are_as_long_as_memory_allows() {
        // Small batches: the longest bursts. Large ones: the extra batches would pass 64 MiB.
        assert_eq!(burst(1 << 20, 2, 4), MAX_BURST);
        assert_eq!(burst(16 << 20, 2, 4), 3);
        assert_eq!(burst(100 << 20, 2, 4), 1);
        assert_eq!(burst(1 << 20, 64, 4), 2);
    }

    #[test]
    fn a_slow_worker_produces_fewer_items_instead_of_setting_the_pace() {
        within_a_minute(|| {
            // Worker 0 takes 20 ms an item, the three others 0.2 ms. Had each worker every
            // fourth item, as before, the slow one would make a quarter of them and the consumer
            // would wait 20 ms every four items; claiming the next free item, the fast workers
            // fill the window while it works.
            let made = Arc::new(std::sync::Mutex::new(Vec::new()));
            let workers = Arc::new(AtomicU64::new(0));
            let mut p = Pipeline::start((4, 32, 1), 0, Some(400), "test", || {
                let w = workers.fetch_add(1, Ordering::SeqCst);
                let made = made.clone();
                move |k: u64, _: &mut Lane| {
                    let ms = if w == 0 { 20.0 } else { 0.2 };
                    std::thread::sleep(Duration::from_secs_f64(ms * 1e-3));
                    made.lock().unwrap().push(w);
                    k
                }
            })
            .unwrap();
            for k in 0..400 {
                assert_eq!(p.next_item(), Some(k));
            }
            assert_eq!(p.next_item(), None);
            let made = made.lock().unwrap();
            let slow = made.iter().filter(|&&w| w == 0).count();
            assert_eq!(made.len(), 400);
            // What the loaders report (`Loader::batches_per_worker`) says the same.
            let per = p.made_per_worker();
            assert_eq!(per.iter().sum::<u64>(), 400);
            assert_eq!(per[0], slow as u64);
            assert!(slow <= 400 / 8, "the slow worker made {slow} of 400 items");
        });
    }

    #[test]
    fn workers_claim_each_item_once_and_in_order_with_read_ahead() {
        within_a_minute(|| {
            // Each worker claims its next item early (as read-ahead planning does) and then
            // produces exactly that one: every item once, whatever the interleaving.
            let claimed = Arc::new(std::sync::Mutex::new(Vec::new()));
            let mut p = Pipeline::start((3, 2, 2), 5, Some(305), "test", || {
                let claimed = claimed.clone();
                let mut expected: Option<u64> = None;
                move |k: u64, lane: &mut Lane| {
                    if let Some(e) = expected {
                        assert_eq!(k, e, "a worker produced another item than it claimed");
                    }
                    expected = lane.after();
                    assert_eq!(lane.after(), expected, "after() claims once");
                    if let Some(e) = expected {
                        assert!(e > k);
                        claimed.lock().unwrap().push(e);
                    }
                    std::thread::sleep(Duration::from_micros(k % 7 * 50));
                    k
                }
            })
            .unwrap();
            for k in 5..305 {
                assert_eq!(p.next_item(), Some(k));
            }
            assert_eq!(p.next_item(), None);
            let mut claimed = claimed.lock().unwrap().clone();
            let n = claimed.len();
            claimed.sort_unstable();
            claimed.dedup();
            assert_eq!(claimed.len(), n, "an item claimed twice");
            assert!(claimed.iter().all(|&e| (5..305).contains(&e)));
        });
    }

    #[test]
    fn dropping_a_pipeline_whose_workers_wait_returns() {
        within_a_minute(|| {
            let mut p =
                Pipeline::start((8, 1, 2), 0, None, "test", || |k: u64, _: &mut Lane| k).unwrap();
            assert_eq!(p.next_item(), Some(0));
            // Every worker is now waiting for the window: dropping wakes and joins them.
            std::thread::sleep(Duration::from_millis(20));
            drop(p);
        });
    }

    #[test]
    fn ranks_split_each_epoch_evenly_and_stay_inside_it() {
        for per in [1u64, 4, 5, 7, 12] {
            for world in [1u64, 2, 3, 4] {
                let c = per.div_ceil(world);
                let mut seen = std::collections::BTreeSet::new();
                for rank in 0..world {
                    for e in 0..3 {
                        for i in 0..c {
                            let g = global_batch(e * c + i, rank, world, Some(per));
                            assert!((e * per..(e + 1) * per).contains(&g), "{per} {world} {g}");
                            if e == 0 {
                                seen.insert(g);
                            }
                        }
                    }
                }
                assert_eq!(
                    seen.len() as u64,
                    per,
                    "per {per} world {world}: every batch"
                );
            }
        }
        // Endless samplers interleave.
        assert_eq!(global_batch(5, 1, 3, None), 16);
    }
}
