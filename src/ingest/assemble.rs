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

/// Bytes of decoded input rows one batch holds at most, whatever [`IngestOptions::batch_rows`]
/// says. A unit is [`UNIT_BATCHES`] batches and a window of units is decoded ahead, so that 64Ki
/// rows of 84x84 frames (7 KB each) would be 1.8 GB per unit and about 6.6 GB resident (measured
/// on a 1M-frame `.npz`), and a camera's 224x224x3 rows 39 GB per unit. 16 MiB keeps a unit at
/// 64 MiB; the same ingest then peaked at 1.04 GB, and its system time (page faults on fresh
/// buffers) fell from 9.2 s to 2.3 s.
pub(crate) const MAX_BATCH_BYTES: u64 = 16 << 20;

/// `batch_rows`, lowered where rows of the projected columns of `schema` (their fixed widths;
/// variable-size columns count 8 bytes) would make a batch of more than [`MAX_BATCH_BYTES`].
pub(crate) fn capped_batch_rows(
    schema: &arrow::datatypes::Schema,
    projection: &[usize],
    batch_rows: usize,
) -> usize {
    fn width(t: &arrow::datatypes::DataType) -> u64 {
        use arrow::datatypes::DataType;
        match t {
            DataType::FixedSizeList(f, n) => (*n).max(0) as u64 * width(f.data_type()),
            DataType::FixedSizeBinary(n) => (*n).max(0) as u64,
            DataType::Boolean => 1,
            t => t.primitive_width().unwrap_or(8) as u64,
        }
    }
    let row: u64 = projection
        .iter()
        .filter_map(|&i| schema.fields().get(i))
        .map(|f| width(f.data_type()))
        .sum();
    let cap = (MAX_BATCH_BYTES / row.max(1)).max(1);
    batch_rows
        .max(1)
        .min(usize::try_from(cap).unwrap_or(usize::MAX))
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
    let batch_rows = capped_batch_rows(&source.schema(), &mapping.projection, opts.batch_rows);
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::datatypes::{DataType, Field, Schema};

    use super::{MAX_BATCH_BYTES, capped_batch_rows};

    fn list(item: DataType, n: i32) -> DataType {
        DataType::FixedSizeList(Arc::new(Field::new("item", item, false)), n)
    }

    #[test]
    fn batches_of_image_rows_are_capped_by_bytes_and_vector_rows_are_not() {
        let frame = list(list(DataType::UInt8, 84), 84);
        let schema = Schema::new(vec![
            Field::new("frames", frame, false),
            Field::new("action", DataType::Int64, false),
            Field::new("reward", DataType::Float32, false),
            Field::new("terminated", DataType::Boolean, false),
            Field::new("obs", list(DataType::Float32, 17), false),
        ]);
        // A frame row: 7,056 + 8 + 4 + 1 bytes.
        let rows = capped_batch_rows(&schema, &[0, 1, 2, 3], 64 * 1024);
        assert_eq!(rows as u64, MAX_BATCH_BYTES / 7_069);
        assert!(rows as u64 * 7_069 <= MAX_BATCH_BYTES);
        // D4RL-sized rows keep the requested batch; the frame column not projected is not counted.
        assert_eq!(
            capped_batch_rows(&schema, &[1, 2, 3, 4], 64 * 1024),
            64 * 1024
        );
        assert_eq!(capped_batch_rows(&schema, &[1, 2, 3, 4], 100), 100);
        // A row larger than the cap is still read, one per batch.
        let huge = Schema::new(vec![Field::new(
            "x",
            list(DataType::UInt8, 32 << 20),
            false,
        )]);
        assert_eq!(capped_batch_rows(&huge, &[0], 64 * 1024), 1);
        assert_eq!(capped_batch_rows(&schema, &[0], 0), 1);
    }
}
