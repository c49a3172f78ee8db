//! `--unstack K` ([`IngestOptions::unstack`](super::IngestOptions::unstack)): observations stored
//! as stacks of the last K frames, as many Atari datasets store them (`[84, 84, 4]` channels last,
//! `[4, 84, 84]` channels first, `[4, H, W, C]` color channels first), become one frame per step,
//! the newest of each stack (the last along the stack axis, as gymnasium's
//! `FrameStackObservation`, dopamine and Stable-Baselines3 order them). A loader rebuilds the
//! stacks with `frame_stack=K`.
//!
//! Nothing is dropped silently: within an episode, every stack must continue the previous one
//! (its frames `0..K-1` are the previous stack's frames `1..K`), and an episode's first stack's
//! K-1 older frames must be the padding a frame stack starts with, either copies of its newest
//! frame (gymnasium's default) or zeros (dopamine's); otherwise the ingest fails naming the
//! first step (input row) where they do not. The older frames of a first step are therefore
//! never stored: they are what `frame_stack=K` with the matching padding (repeat or zeros)
//! rebuilds.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, FixedSizeListArray, RecordBatch, UInt8Array};
use arrow::datatypes::{DataType, Field, Schema};

use crate::error::{Error, Result};
use crate::format::col;
use crate::schema::{TransitionSchema, tensor_field};

/// Where the stack axis is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    /// `[H, W, K]`: frame j is every K-th byte from j.
    Last,
    /// `[K, H, W]` or `[K, H, W, C]`: frame j is the j-th run of H*W*C bytes.
    First,
}

/// How to unstack the observations of one ingest.
#[derive(Debug, Clone)]
pub(crate) struct Unstack {
    k: usize,
    layout: Layout,
    /// One frame's shape (`[H, W]` or `[H, W, C]`).
    pub(crate) frame_shape: Vec<usize>,
    /// The schema of converted chunks, whose observation is the stack.
    pub(crate) stacked: TransitionSchema,
}

impl Unstack {
    /// The unstacking of `stacked`'s observation into frames of `k`-stacks, and the schema of
    /// what is stored (the observation one `uint8` frame, a tensor of the frame's shape).
    pub(crate) fn new(k: usize, stacked: TransitionSchema) -> Result<(Self, TransitionSchema)> {
        let shape = stacked.observation_shape().to_vec();
        let arg = |why: String| Error::argument("unstack", why);
        if k < 2 {
            return Err(arg(format!("--unstack {k}: a stack has at least 2 frames")));
        }
        let uint8 = matches!(stacked.observation_field().data_type(),
            DataType::FixedSizeList(c, _) if c.data_type() == &DataType::UInt8);
        if !uint8 {
            return Err(arg(format!(
                "--unstack {k} unstacks uint8 image observations; this observation is {}",
                stacked.observation_field().data_type()
            )));
        }
        if stacked.has_next_observation() {
            return Err(arg(format!(
                "--unstack {k}: the input has a next-observation column; frames are stored once \
                 (o_t+1 is the next row's frame), so drop it (--drop-cols)"
            )));
        }
        let (first, last) = (shape.first() == Some(&k), shape.last() == Some(&k));
        let (layout, frame_shape) = match shape.len() {
            3 if first && last => {
                return Err(arg(format!(
                    "--unstack {k}: observation shape {shape:?} has {k} both first and last; \
                     which axis is the stack is ambiguous"
                )));
            }
            3 if last => (Layout::Last, shape[..2].to_vec()),
            3 | 4 if first => (Layout::First, shape[1..].to_vec()),
            _ => {
                return Err(arg(format!(
                    "--unstack {k}: observation shape {shape:?} is not a stack of {k} frames \
                     ([H, W, {k}] channels last, [{k}, H, W] or [{k}, H, W, C] channels first)"
                )));
            }
        };
        let fields: Vec<Field> = stacked
            .payload_schema()
            .fields()
            .iter()
            .map(|f| match f.name().as_str() {
                col::OBSERVATION => {
                    tensor_field(col::OBSERVATION, DataType::UInt8, &frame_shape, false)
                }
                _ => Ok(f.as_ref().clone()),
            })
            .collect::<Result<_>>()?;
        let stored = TransitionSchema::from_payload(&Schema::new(fields))?;
        let u = Unstack {
            k,
            layout,
            frame_shape,
            stacked,
        };
        Ok((u, stored))
    }

    fn frame_len(&self) -> usize {
        self.frame_shape.iter().product()
    }

    /// Whether frame `j` of stack `s` equals frame `i` of stack `r`.
    fn same(&self, s: &[u8], j: usize, r: &[u8], i: usize) -> bool {
        let (f, k) = (self.frame_len(), self.k);
        match self.layout {
            Layout::First => s[j * f..(j + 1) * f] == r[i * f..(i + 1) * f],
            Layout::Last => (0..f).all(|p| s[p * k + j] == r[p * k + i]),
        }
    }

    /// Whether stack `s` continues stack `prev`: its frames `0..K-1` are `prev`'s `1..K`.
    fn continues(&self, s: &[u8], prev: &[u8]) -> bool {
        let (f, k) = (self.frame_len(), self.k);
        match self.layout {
            Layout::First => s[..(k - 1) * f] == prev[f..],
            Layout::Last => (0..f).all(|p| s[p * k..p * k + k - 1] == prev[p * k + 1..(p + 1) * k]),
        }
    }

    /// Whether the older frames of an episode's first stack are its padding: copies of its
    /// newest frame, or zeros.
    fn padded(&self, s: &[u8]) -> bool {
        let (f, k) = (self.frame_len(), self.k);
        let repeat = (0..k - 1).all(|j| self.same(s, j, s, k - 1));
        let zeros = match self.layout {
            Layout::First => s[..(k - 1) * f].iter().all(|&b| b == 0),
            Layout::Last => (0..f).all(|p| s[p * k..p * k + k - 1].iter().all(|&b| b == 0)),
        };
        repeat || zeros
    }

    /// One episode's converted rows (stacked observations; its first row is input row
    /// `first_row`) with each observation replaced by the newest frame of its stack, after the
    /// checks of the module documentation. `stored` is the stored schema's input schema.
    pub(crate) fn episode(
        &self,
        batch: &RecordBatch,
        stored: &arrow::datatypes::SchemaRef,
        first_row: u64,
    ) -> Result<RecordBatch> {
        let obs = batch
            .column_by_name(col::OBSERVATION)
            .and_then(|a| a.as_fixed_size_list_opt())
            .ok_or_else(|| Error::invalid_argument("the converted observation is not a list"))?;
        let values = obs.values().as_primitive::<arrow::datatypes::UInt8Type>();
        let (f, k) = (self.frame_len(), self.k);
        let stack = |t: usize| {
            let at = obs.value_offset(t) as usize;
            &values.values()[at..at + f * k]
        };
        let bad = |t: usize, why: String| {
            Error::invalid_data(format!(
                "--unstack {k}: input row {} (step {t} of the episode starting at input row \
                 {first_row}): {why}",
                first_row + t as u64
            ))
            .in_column(col::OBSERVATION)
        };
        let axis = match self.layout {
            Layout::Last => "last",
            Layout::First => "first",
        };
        let mut out = Vec::with_capacity(obs.len() * f);
        for t in 0..obs.len() {
            let s = stack(t);
            if t == 0 {
                if !self.padded(s) {
                    return Err(bad(
                        t,
                        format!(
                            "the first step's {} older frames are neither copies of its newest \
                             frame nor zeros, as a frame stack starts; the episode may begin in \
                             the middle of a run, or the observation is not a stack of {k} \
                             (stack axis {axis})",
                            k - 1
                        ),
                    ));
                }
            } else if !self.continues(s, stack(t - 1)) {
                return Err(bad(
                    t,
                    format!(
                        "its stack does not continue the previous step's (frames 0..{} should \
                         be the previous stack's frames 1..{k}); is the observation a stack of \
                         {k} frames, oldest first, along the {axis} axis?",
                        k - 1
                    ),
                ));
            }
            match self.layout {
                Layout::First => out.extend_from_slice(&s[(k - 1) * f..]),
                Layout::Last => out.extend((0..f).map(|p| s[p * k + k - 1])),
            }
        }
        let item = Arc::new(Field::new("item", DataType::UInt8, false));
        let frames: ArrayRef = Arc::new(FixedSizeListArray::try_new(
            item,
            f as i32,
            Arc::new(UInt8Array::from(out)),
            None,
        )?);
        let columns: Vec<ArrayRef> = batch
            .schema()
            .fields()
            .iter()
            .zip(batch.columns())
            .map(|(field, c)| match field.name().as_str() {
                col::OBSERVATION => frames.clone(),
                _ => c.clone(),
            })
            .collect();
        Ok(RecordBatch::try_new(stored.clone(), columns)?)
    }
}
