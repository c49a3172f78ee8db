//! [`Runs`]: the batches of a streamed source, one [`Run`] per version it reads, made by a
//! [`Sink`]. A loader that follows (`LoaderSpec::follow`) ends each run at a round boundary,
//! looks for a newer version in the store, and starts the next run there: on the newer version
//! (numbered from the batch where it begins) or on the same one.

use super::{
    BatchSource, Cursor, LoaderOptions, Run, Sink, StreamFollow, StreamPlan, StreamStats, mix,
};
use crate::error::{Error, Result};
use crate::remote::Stream;

/// The batches of a streamed source made by a [`Sink`], one [`Run`] per version: what every
/// loader of a stream runs ([`StreamLoader`], [`super::super::StagedLoader`], the `torch`
/// loader).
pub(crate) struct Runs<T: Send + 'static> {
    run: Option<Run<T>>,
    source: BatchSource,
    opts: LoaderOptions,
    /// One past the last batch (`max_batches`), if any.
    end: Option<u64>,
    sink: Sink<T>,
    pub(crate) refreshes: u64,
    pub(crate) failures: u64,
    /// What the runs before the current one downloaded and held.
    before: StreamStats,
    /// The batch where the current run's version began (its batch 0).
    base: u64,
}

impl<T: Send + 'static> Runs<T> {
    /// Starts the batches of a streamed `source` (see [`StreamLoader::new`]), made by `sink`.
    pub(crate) fn new(source: &BatchSource, opts: LoaderOptions, sink: Sink<T>) -> Result<Self> {
        let plan = plan_of(source)?;
        let start = opts.start.unwrap_or(0);
        let end = opts.max_batches.map(|n| start.saturating_add(n));
        let mut me = Self {
            run: None,
            source: source.clone(),
            opts,
            end,
            sink,
            refreshes: 0,
            failures: 0,
            before: StreamStats::default(),
            base: 0,
        };
        let cursor = plan
            .cursor
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if start < cursor.base {
            return Err(Error::argument(
                "start",
                format!(
                    "batch {start} comes before batch {}, where version {} of the stream began \
                     (a following loader continues forward only)",
                    cursor.base,
                    cursor.stream.catalog().version()
                ),
            ));
        }
        let run = me.start_run(plan, &cursor, start)?;
        // A following loader that starts at a round boundary after its version began (the
        // next iteration of an epoch sampler, a restart) looks for a newer version there too.
        if plan.follow == Some(StreamFollow::Look)
            && start > cursor.base
            && run.is_round_start(start - cursor.base)
        {
            drop(run);
            let cursor = me.look(plan, start);
            me.run = Some(me.start_run(plan, &cursor, start)?);
            me.base = cursor.base;
        } else {
            me.run = Some(run);
            me.base = cursor.base;
        }
        Ok(me)
    }

    /// A run of `cursor`'s version from the loader's batch `start`.
    fn start_run(&self, plan: &StreamPlan, cursor: &Cursor, start: u64) -> Result<Run<T>> {
        let mut o = self.opts.clone();
        o.start = Some(start - cursor.base);
        o.max_batches = self.end.map(|e| e.saturating_sub(start));
        Run::start(
            plan,
            (&cursor.stream, cursor.base),
            seed_at(plan.sampler.seed, cursor.base),
            o,
            plan.follow.is_some(),
            &self.sink,
        )
    }

    /// The next batch, blocking until it is ready; `None` at the end.
    pub(crate) fn next_batch(&mut self) -> Option<Result<T>> {
        loop {
            let run = self.run.as_mut()?;
            if let Some(item) = run.next_batch() {
                return Some(item);
            }
            // The run ended: at `max_batches`, at an epoch's end, or (following) at a round's.
            let source = self.source.clone();
            let plan = plan_of(&source).ok()?;
            let position = self.position();
            // Following by the caller: it decides the next round's version.
            if plan.follow != Some(StreamFollow::Look)
                || self.end.is_some_and(|e| position >= e)
                || plan.sampler.kind == crate::sample::SamplerKind::Epoch
            {
                return None;
            }
            // Drop the run first: the next one opens the same rank's cache.
            if let Some(done) = self.run.take() {
                self.before = self.before.clone().plus(&done.stats());
            }
            let cursor = self.look(plan, position);
            match self.start_run(plan, &cursor, position) {
                Ok(run) => {
                    self.run = Some(run);
                    self.base = cursor.base;
                }
                Err(e) => return Some(Err(e)),
            }
        }
    }

    /// At batch `position`, a round boundary: the newest version of the store if it is newer
    /// than the cursor's (the cursor then moves to it, from `position`), else the cursor. One
    /// listing of the store's manifests; its catalog is fetched only when it is newer.
    fn look(&mut self, plan: &StreamPlan, position: u64) -> Cursor {
        let cursor = plan
            .cursor
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let newer = match cursor.stream.newest_version() {
            Ok(v) if v > cursor.stream.catalog().version() => v,
            Ok(_) => return cursor,
            Err(_) => {
                self.failures += 1;
                return cursor;
            }
        };
        let mut o = cursor.stream.options().clone();
        o.version = Some(newer);
        match Stream::open(cursor.stream.url(), o) {
            Ok(stream) => {
                let next = Cursor {
                    stream,
                    base: position,
                };
                *plan.cursor.lock().unwrap_or_else(|e| e.into_inner()) = next.clone();
                self.refreshes += 1;
                next
            }
            Err(_) => {
                self.failures += 1;
                cursor
            }
        }
    }

    /// The number of the batch [`Runs::next_batch`] returns next.
    pub(crate) fn position(&self) -> u64 {
        self.run
            .as_ref()
            .map_or(self.base, |r| self.base + r.position())
    }

    /// What the runs downloaded and held so far (see [`StreamLoader::stats`]).
    pub(crate) fn stats(&self) -> StreamStats {
        match &self.run {
            Some(run) => self.before.clone().plus(&run.stats()),
            None => self.before.clone(),
        }
    }

    /// See [`StreamLoader::window_episodes`].
    pub(crate) fn window_episodes(&self, k: u64) -> Vec<std::ops::Range<u64>> {
        self.run
            .as_ref()
            .map(|r| r.window_episodes(k.saturating_sub(self.base)))
            .unwrap_or_default()
    }

    /// The source of these batches.
    pub(crate) fn source(&self) -> &BatchSource {
        &self.source
    }
}

/// The streamed plan of `source`, or an error naming the loader to use.
fn plan_of(source: &BatchSource) -> Result<&StreamPlan> {
    source.streamed().ok_or_else(|| {
        Error::argument(
            "source",
            "a StreamLoader reads a streamed source (LoaderSpec::streamed); this source's \
             datasets are local: use Loader::new",
        )
    })
}

/// The sampling seed of the version that began at batch `base`: the sampler's own for the
/// first (so that a following loader draws what a loader that does not follow draws until it
/// moves), a distinct one for every later base.
fn seed_at(seed: u64, base: u64) -> u64 {
    if base == 0 {
        seed
    } else {
        mix(seed ^ mix(base ^ 0xf011_0000))
    }
}
