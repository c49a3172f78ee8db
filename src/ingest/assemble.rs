//! Episode assembly: converted chunks, in input order, cut into episodes and appended to the
//! writer (runs on the calling thread).

use std::collections::HashSet;
use std::sync::mpsc::sync_channel;

use arrow::array::{BooleanArray, RecordBatch};
use arrow::compute::concat_batches;
use rayon::prelude::*;

use super::*;
use crate::error::{Error, Result};
use crate::format::col;
use crate::progress::Unit;
use crate::store::{DatasetWriter, EpisodeEnd};

pub(crate) struct Assembler<'a> {
    pub(crate) writer: &'a mut DatasetWriter,
    mapping: &'a Mapping,
    /// Columns added to each episode (a LeRobot dataset's cameras).
    extra: Option<&'a mut dyn EpisodeColumns>,
    /// Converted rows of the episode in progress.
    pending: Vec<RecordBatch>,
    /// The input row of the first of them.
    start_row: u64,
    /// Episode-id mode: id of the episode in progress and ids of finished episodes.
    current: Option<u64>,
    finished: HashSet<u64>,
    /// Flags of the last row added to `pending`.
    last_terminated: bool,
    /// Episode-id mode with [`Mapping::final_row`]: the row after a terminated row was taken
    /// as the episode's final state row (any further row of the episode is an error).
    state_row: bool,
    last_truncated: bool,
    pub(crate) episodes: u64,
    pub(crate) rows: u64,
    /// Input rows that were not transitions: the final state rows of a
    /// [`Mapping::final_row`] input.
    pub(crate) states: u64,
}

impl<'a> Assembler<'a> {
    pub(crate) fn new(writer: &'a mut DatasetWriter, mapping: &'a Mapping) -> Self {
        Assembler {
            writer,
            mapping,
            extra: None,
            pending: vec![],
            start_row: 0,
            current: None,
            finished: HashSet::new(),
            last_terminated: false,
            state_row: false,
            last_truncated: false,
            episodes: 0,
            rows: 0,
            states: 0,
        }
    }

    /// Transitions appended so far (input rows less the final state rows).
    pub(crate) fn transitions(&self) -> u64 {
        self.rows - self.states
    }

    /// Whether rows of an unfinished episode are held.
    pub(crate) fn in_episode(&self) -> bool {
        !self.pending.is_empty()
    }

    fn show_id(&self, bits: u64) -> String {
        match &self.mapping.episode {
            Some(e) if e.signed => (bits as i64).to_string(),
            _ => bits.to_string(),
        }
    }

    fn take(&mut self, chunk: &Chunk, from: usize, to: usize) {
        if to > from {
            if self.pending.is_empty() {
                self.start_row = chunk.base + from as u64;
            }
            self.pending.push(chunk.payload.slice(from, to - from));
        }
    }

    fn end_episode(&mut self, terminated: bool, truncated: bool) -> Result<()> {
        let batch = match self.pending.len() {
            0 => return Ok(()),
            1 => self.pending.pop().expect("one batch"),
            _ => concat_batches(
                self.mapping.converted_schema().input_schema(),
                &self.pending,
            )?,
        };
        self.pending.clear();
        let batch = match &self.mapping.unstack {
            Some(u) => u.episode(&batch, self.mapping.schema.input_schema(), self.start_row)?,
            None => batch,
        };
        let mut end = EpisodeEnd {
            terminated,
            truncated: truncated || !terminated,
            ..Default::default()
        };
        let batch = if self.mapping.final_row {
            // The last row is the state after the last step: its observation ends the episode.
            let n = batch.num_rows();
            self.states += 1;
            if n == 1 {
                // A trajectory of one state holds no transition (ogbench's loader keeps none).
                return Ok(());
            }
            end = end.with_final_observation(batch.column(0).slice(n - 1, 1));
            batch.slice(0, n - 1)
        } else {
            batch
        };
        let batch = match self.extra.as_mut() {
            Some(extra) => extra.attach(batch)?,
            None => batch,
        };
        self.writer.append_episode(&batch, end)?;
        self.episodes += 1;
        Ok(())
    }

    pub(crate) fn push(&mut self, chunk: Chunk) -> Result<()> {
        let n = chunk.payload.num_rows();
        let flag = |a: &Option<BooleanArray>, i: usize| a.as_ref().is_some_and(|a| a.value(i));
        let mut from = 0;
        if let Some(ids) = &chunk.ids {
            for (i, &id) in ids.iter().enumerate() {
                let row = chunk.base + i as u64;
                match self.current {
                    Some(c) if c == id => {
                        // With final state rows, the one row after the last step's flag is
                        // the state row.
                        if self.state_row || (self.last_terminated && !self.mapping.final_row) {
                            let flagged = row - 1 - u64::from(self.state_row);
                            let name = self
                                .mapping
                                .terminated
                                .as_deref()
                                .unwrap_or(col::TERMINATED);
                            return Err(Error::invalid_data(format!(
                                "row {flagged}: `{name}` is set, but row {row} continues episode {}; a terminated \
                                 flag may only be set on the last row of an episode",
                                self.show_id(id)
                            )));
                        }
                        self.state_row = self.last_terminated;
                    }
                    Some(c) => {
                        self.take(&chunk, from, i);
                        from = i;
                        self.end_episode(self.last_terminated, self.last_truncated)?;
                        self.state_row = false;
                        self.finished.insert(c);
                        if self.finished.contains(&id) {
                            let name =
                                &self.mapping.episode.as_ref().expect("episode-id mode").name;
                            return Err(Error::invalid_data(format!(
                                "row {row}: episode id {} (column `{name}`) reappears after other episodes; \
                                 the rows of one episode must be contiguous (sort the file by episode, then step)",
                                self.show_id(id)
                            )));
                        }
                        self.current = Some(id);
                    }
                    None => self.current = Some(id),
                }
                self.last_terminated = flag(&chunk.terminated, i);
                self.last_truncated = flag(&chunk.truncated, i);
            }
        } else {
            for i in 0..n {
                let (t, tr) = (flag(&chunk.terminated, i), flag(&chunk.truncated, i));
                if t || tr {
                    self.take(&chunk, from, i + 1);
                    from = i + 1;
                    self.end_episode(t, tr)?;
                }
            }
            self.last_terminated = false;
            self.last_truncated = false;
        }
        self.take(&chunk, from, n);
        self.rows += n as u64;
        Ok(())
    }

    /// Ends the last episode: its last row's flags decide, and without a terminated flag it is
    /// truncated (end of data).
    pub(crate) fn finish(&mut self) -> Result<()> {
        self.end_episode(self.last_terminated, self.last_truncated)
    }
}

/// Reads and converts one unit.
pub(crate) fn decode_unit(
    source: &dyn Source,
    mapping: &Mapping,
    unit: usize,
    base: u64,
    batch_rows: usize,
) -> Result<Vec<Chunk>> {
    let mut row = base;
    let mut out = vec![];
    for batch in source.read(unit, &mapping.projection, batch_rows)? {
        out.push(convert(mapping, &batch, row)?);
        row += batch.num_rows() as u64;
    }
    Ok(out)
}

/// Decodes units (in parallel windows where the source allows) on a producer thread and
/// assembles episodes in order on this one. Returns (rows, episodes).
pub(crate) fn stream(
    source: &dyn Source,
    mapping: &Mapping,
    opts: &IngestOptions,
    writer: &mut DatasetWriter,
    extra: Option<&mut dyn EpisodeColumns>,
) -> Result<(u64, u64)> {
    let batch_rows = opts.batch_rows;
    let units = source.units(batch_rows);
    let total = units.last().map_or(0, |&(_, base, rows)| base + rows);
    let pb = &opts.progress;
    pb.start("ingest", Unit::Rows, Some(total));
    let window = if source.parallel() {
        rayon::current_num_threads().max(1)
    } else {
        1
    };
    let mut asm = Assembler::new(writer, mapping);
    if let Some(extra) = extra {
        asm.extra = Some(extra);
    }
    // Input files that must end on an episode end (OGBench's).
    let ends = source.file_ends();
    let mut ends = ends.iter().peekable();
    let result = std::thread::scope(|s| -> Result<()> {
        let (tx, rx) = sync_channel::<Result<Vec<Chunk>>>(window);
        s.spawn(move || {
            for win in units.chunks(window) {
                let decoded: Vec<Result<Vec<Chunk>>> = win
                    .par_iter()
                    .map(|&(unit, base, _)| {
                        decode_unit(source, mapping, unit, base, batch_rows)
                            .map_err(|e| in_file_of(e, source, base))
                    })
                    .collect();
                for r in decoded {
                    let failed = r.is_err();
                    // A closed channel means the consumer stopped (on an error): stop decoding.
                    if tx.send(r).is_err() || failed {
                        return;
                    }
                }
            }
        });
        for group in rx {
            for chunk in group? {
                let n = chunk.payload.num_rows() as u64;
                let base = chunk.base;
                asm.push(chunk).map_err(|e| in_file_of(e, source, base))?;
                pb.advance(n);
                while let Some((_, file)) = ends.next_if(|(end, _)| *end <= asm.rows) {
                    if asm.in_episode() {
                        return Err(Error::invalid_data(format!(
                            "the file ends inside a trajectory: its last row's `{}` is not \
                             set, and OGBench files end every trajectory with it (a truncated \
                             or damaged file?)",
                            mapping.truncated.as_deref().unwrap_or("terminals")
                        ))
                        .in_input(file.display()));
                    }
                }
            }
        }
        asm.finish()
    });
    pb.finish(result.is_ok());
    result?;
    Ok((asm.transitions(), asm.episodes))
}
