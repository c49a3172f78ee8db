//! Shapes and kinds of one batch's host tensors, and the host slot a batch is gathered into.

use std::sync::Arc;

use arrow::datatypes::DataType;

use tch::{Device, Kind, Tensor};

use super::{TensorBatch, storage_kind, widen};
use crate::error::{Error, Result};
use crate::gather::{CompactInto, GatherInto, Gatherer};
use crate::index::SliceRef;

/// Shapes and kinds of one batch's host tensors.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    pub(crate) b: usize,
    pub(crate) l: usize,
    /// Per column: name, storage kind, full shape `[B, L, ...]`.
    pub(crate) columns: Vec<(String, Kind, Vec<i64>)>,
    /// Per column: its Arrow element type.
    pub(crate) types: Vec<DataType>,
    /// Whether slots hold the compact batch ([`crate::CompactInto`]), expanded on the device.
    pub(crate) compact: bool,
    /// Per column: whether a compact slot holds it as one row per slice
    /// ([`Gatherer::tail_columns`]).
    pub(crate) tails: Vec<bool>,
    /// Per column: the rows before each slice's step 0 ([`Gatherer::leads`]): `K - 1` for a
    /// frame window, held as `[B, L + K - 1, ...frame]` and handed out as a `[B, L, K,
    /// ...frame]` view of it ([`window_view`]).
    pub(crate) leads: Vec<usize>,
}

impl Layout {
    pub(crate) fn new(gatherer: &Gatherer, b: usize, l: usize) -> Result<Self> {
        let mut layout = Self::of_columns(gatherer.columns(), b, l)?;
        layout.leads = gatherer.leads();
        Ok(layout)
    }

    /// The shape column `i` is stored in: its full shape, or a frame window's `[B, L + K - 1,
    /// ...frame]`.
    pub(crate) fn storage_shape(&self, i: usize) -> Vec<i64> {
        let shape = &self.columns[i].2;
        match self.leads[i] {
            0 => shape.clone(),
            lead => [&[shape[0], shape[1] + lead as i64], &shape[3..]].concat(),
        }
    }

    /// The layout of batches of `columns` (name, element type, per-step shape), as a
    /// [`Gatherer`] or a streamed [`crate::BatchSource`] describes them.
    pub(crate) fn of_columns<'a>(
        columns: impl ExactSizeIterator<Item = (&'a str, &'a DataType, &'a [usize])>,
        b: usize,
        l: usize,
    ) -> Result<Self> {
        let mut out = Vec::with_capacity(columns.len());
        let mut types = Vec::with_capacity(columns.len());
        for (name, dt, shape) in columns {
            let mut full = vec![b as i64, l as i64];
            full.extend(shape.iter().map(|&d| d as i64));
            let kind = storage_kind(dt).map_err(|_| {
                Error::argument(
                    "gatherer",
                    format!("column `{name}` of type {dt} has no torch dtype; gather without it"),
                )
            })?;
            out.push((name.to_string(), kind, full));
            types.push(dt.clone());
        }
        Ok(Self {
            b,
            l,
            tails: vec![false; out.len()],
            leads: vec![0; out.len()],
            columns: out,
            types,
            compact: false,
        })
    }

    /// The same batch with slots that hold the compact batch, `tails` saying which columns
    /// are one row per slice ([`Gatherer::tail_columns`]).
    pub(crate) fn compact(mut self, tails: &[bool]) -> Self {
        self.compact = true;
        self.tails = tails.to_vec();
        self
    }

    /// Bytes of a packed slot of this layout (what one host-to-device copy carries).
    pub(crate) fn packed_bytes(&self) -> u64 {
        let (total, _) = packed_pieces(self);
        total.max(1) as u64
    }

    /// Whether some column is widened after the gather (unsigned 16/32-bit integers).
    pub(crate) fn widens(&self) -> bool {
        self.types
            .iter()
            .any(|t| matches!(t, DataType::UInt16 | DataType::UInt32))
    }
}

/// Host tensors one batch is gathered into: one per column, a `[6, B, L]` flag tensor and a
/// `[2, B]` metadata tensor, all contiguous.
pub(crate) struct Slot {
    pub(crate) columns: Vec<Tensor>,
    pub(crate) flags: Tensor,
    pub(crate) meta: Tensor,
    /// For a packed slot: the one byte buffer all of the above are views of, and where each
    /// lies in it (columns, flags, metadata), so that the slot crosses to a device in one copy.
    pub(crate) packed: Option<(Tensor, Arc<[Piece]>)>,
}

/// Offsets of packed slot tensors are multiples of this power of two (any dtype's alignment, and the
/// alignment CUDA's vectorised kernels like).
const PACK_ALIGN: i64 = 256;

/// One tensor of a packed slot: byte offset, shape, kind.
type Piece = (i64, Vec<i64>, Kind);

/// Shapes and kinds of a slot's tensors: the columns, the `[6, B, L]` flags, the `[2, B]` ids
/// and start steps. A compact slot holds its tail columns as `[B, ...]` (a frame window's as `[B,
/// ...frame]`) and the flags as `[B, 3]` `Int` spans; a frame window is `[B, L + K - 1,
/// ...frame]`.
fn slot_specs(layout: &Layout) -> Vec<(Vec<i64>, Kind)> {
    let (b, l) = (layout.b as i64, layout.l as i64);
    let mut specs: Vec<_> = layout
        .columns
        .iter()
        .zip(&layout.tails)
        .enumerate()
        .map(|(i, ((_, k, shape), &tail))| {
            if layout.compact && tail {
                // [B, ...step], or a window's one frame: [B, ...frame].
                let skip = if layout.leads[i] > 0 { 3 } else { 2 };
                let s = [&shape[..1], &shape[skip..]].concat();
                (s, *k)
            } else {
                (layout.storage_shape(i), *k)
            }
        })
        .collect();
    if layout.compact {
        specs.push((vec![b, 3], Kind::Int));
    } else {
        specs.push((vec![6, b, l], Kind::Bool));
    }
    specs.push((vec![2, b], Kind::Int64));
    specs
}

/// Where each tensor of a packed slot lies, and the slot's bytes.
fn packed_pieces(layout: &Layout) -> (i64, Arc<[Piece]>) {
    let mut total = 0i64;
    let pieces = slot_specs(layout)
        .into_iter()
        .map(|(shape, kind)| {
            let off = (total + PACK_ALIGN - 1) & !(PACK_ALIGN - 1);
            total = off + shape.iter().product::<i64>() * kind.elt_size_in_bytes() as i64;
            (off, shape, kind)
        })
        .collect();
    (total, pieces)
}

impl Slot {
    /// Columns, flags and metadata in [`slot_specs`] order.
    fn from_tensors(mut t: Vec<Tensor>, packed: Option<(Tensor, Arc<[Piece]>)>) -> Self {
        let meta = t.pop().expect("metadata tensor");
        let flags = t.pop().expect("flags tensor");
        Slot {
            columns: t,
            flags,
            meta,
            packed,
        }
    }

    pub(crate) fn alloc(layout: &Layout, pin: Option<Device>) -> Result<Self> {
        let tensors = slot_specs(layout)
            .iter()
            .map(|(shape, kind)| {
                let t = Tensor::f_empty(shape.as_slice(), (*kind, Device::Cpu))?;
                Ok(match pin {
                    Some(d) => t.f_pin_memory(d)?,
                    None => t,
                })
            })
            .collect::<Result<_>>()?;
        Ok(Self::from_tensors(tensors, None))
    }

    /// A slot whose tensors are views of one (pinned, on CUDA) buffer: what the CUDA staging ring
    /// uses, so that a batch is one host-to-device copy and one device allocation, not one per
    /// tensor.
    pub(crate) fn alloc_packed(layout: &Layout, pin: Option<Device>) -> Result<Self> {
        let (total, pieces) = packed_pieces(layout);
        let mut buf = Tensor::f_empty([total.max(1)], (Kind::Uint8, Device::Cpu))?;
        if let Some(d) = pin {
            buf = buf.f_pin_memory(d)?;
        }
        Self::views_of(buf, pieces)
    }

    /// The slot's tensors as views of `buf`.
    fn views_of(buf: Tensor, pieces: Arc<[Piece]>) -> Result<Self> {
        let views = pieces
            .iter()
            .map(|(off, shape, kind)| {
                let n = shape.iter().product::<i64>() * kind.elt_size_in_bytes() as i64;
                Ok(buf
                    .f_narrow(0, *off, n)?
                    .f_view_dtype(*kind)?
                    .f_view(shape.as_slice())?)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self::from_tensors(views, Some((buf, pieces))))
    }

    /// A packed slot's copy on `device`, in one non-blocking copy (None for an unpacked slot).
    pub(crate) fn to_device(&self, device: Device) -> Result<Option<Self>> {
        let Some((buf, pieces)) = &self.packed else {
            return Ok(None);
        };
        let on = buf.f_to_device_(device, Kind::Uint8, true, false)?;
        Ok(Some(Self::views_of(on, pieces.clone())?))
    }

    /// Takes the tensors of a recycled batch back if they still have the layout's shapes and
    /// kinds (a transform may have replaced them).
    pub(crate) fn reclaim(batch: TensorBatch, layout: &Layout) -> Option<Self> {
        let ok = |t: &Tensor, kind: Kind, shape: &[i64]| {
            t.device() == Device::Cpu && t.kind() == kind && t.size() == shape && t.is_contiguous()
        };
        // A compact slot's batch is expanded into new tensors: nothing to take back.
        if layout.compact || batch.base_columns.len() != layout.columns.len() {
            return None;
        }
        let mut columns = Vec::with_capacity(layout.columns.len());
        for (i, (t, (_, kind, _))) in batch
            .base_columns
            .into_iter()
            .zip(&layout.columns)
            .enumerate()
        {
            if !ok(&t, *kind, &layout.storage_shape(i)) {
                return None;
            }
            columns.push(t);
        }
        Some(Slot {
            columns,
            flags: batch.flag_base?,
            meta: batch.meta_base?,
            packed: None,
        })
    }

    /// Gathers `plan` into the slot.
    pub(crate) fn fill(
        &mut self,
        gatherer: &Gatherer,
        plan: &[SliceRef],
        layout: &Layout,
    ) -> Result<()> {
        let (b, l) = (layout.b, layout.l);
        // SAFETY: every tensor of the slot is a contiguous CPU tensor this worker owns and that no
        // other thread reads or writes while it is filled (a slot is filled only when none of its
        // copies is pending and it was not handed out); the byte lengths are the tensors' own.
        let bytes = |t: &Tensor| unsafe {
            std::slice::from_raw_parts_mut(
                t.data_ptr() as *mut u8,
                t.numel() * t.kind().elt_size_in_bytes(),
            )
        };
        let columns = self.columns.iter().map(bytes).collect();
        let meta = bytes(&self.meta);
        // SAFETY: the metadata tensor is Int64 [2, B]: 16 * B bytes, 8-byte aligned.
        let meta: &mut [i64] =
            unsafe { std::slice::from_raw_parts_mut(meta.as_mut_ptr() as *mut i64, 2 * b) };
        let (ids, starts) = meta.split_at_mut(b);
        // SAFETY: u64 and i64 have the same size and alignment; ids are below 2^63.
        let ids: &mut [u64] =
            unsafe { std::slice::from_raw_parts_mut(ids.as_mut_ptr() as *mut u64, b) };
        // Plans shorter than B (the end of an epoch with drop_last off) leave trailing slices as
        // padding.
        let n = plan.len().min(b);
        if layout.compact {
            let spans = bytes(&self.flags);
            // SAFETY: the spans tensor is Int [B, 3]: 12 * B bytes, 4-byte aligned.
            let spans: &mut [i32] =
                unsafe { std::slice::from_raw_parts_mut(spans.as_mut_ptr() as *mut i32, 3 * b) };
            let dest = CompactInto {
                columns,
                spans,
                episode_id: ids,
                start_step: starts,
            };
            gatherer.gather_compact(&plan[..n], l, dest)?;
        } else {
            let mut planes = bytes(&self.flags).chunks_exact_mut(b * l);
            let flags = std::array::from_fn(|_| planes.next().expect("a [6, B, L] flag tensor"));
            let dest = GatherInto {
                columns,
                flags,
                episode_id: ids,
                start_step: starts,
            };
            gatherer.gather_into(&plan[..n], l, dest)?;
        }
        if n < b {
            self.pad_tail(n)?;
        }
        Ok(())
    }

    /// Zeroes slices `n..` (a short last batch of an epoch).
    pub(crate) fn pad_tail(&mut self, n: usize) -> Result<()> {
        for t in &mut self.columns {
            let b = t.size()[0];
            let _ = t.f_narrow(0, n as i64, b - n as i64)?.f_zero_()?;
        }
        // Flag planes are [6, B, L]; compact spans [B, 3] (all zero: an empty slice).
        let dim = if self.flags.dim() == 2 { 0 } else { 1 };
        let b = self.flags.size()[dim];
        let _ = self
            .flags
            .f_narrow(dim as i64, n as i64, b - n as i64)?
            .f_zero_()?;
        let _ = self.meta.f_narrow(1, n as i64, b - n as i64)?.f_fill_(-1)?;
        Ok(())
    }

    /// A batch of views of the slot's tensors (sharing their memory). A compact slot's batch is
    /// [`super::compact::batch`].
    pub(crate) fn view(&self, layout: &Layout) -> Result<TensorBatch> {
        let flag = |i: i64| self.flags.f_select(0, i);
        Ok(TensorBatch {
            columns: layout
                .columns
                .iter()
                .zip(&layout.types)
                .zip(&self.columns)
                .zip(&layout.leads)
                .map(|((((n, _, _), dt), t), &lead)| {
                    Ok((n.clone(), widen(window_view(t, lead)?, dt)?))
                })
                .collect::<Result<_>>()?,
            mask: flag(0)?,
            is_first: flag(1)?,
            is_last: flag(2)?,
            terminated: flag(3)?,
            truncated: flag(4)?,
            slice_end: flag(5)?,
            episode_id: self.meta.f_select(0, 0)?,
            start_step: self.meta.f_select(0, 1)?,
            flag_base: Some(self.flags.shallow_clone()),
            meta_base: Some(self.meta.shallow_clone()),
            base_columns: self.columns.iter().map(Tensor::shallow_clone).collect(),
        })
    }
}

/// Column `t` as handed out: itself, or for a frame window (`lead = K - 1`, `t` `[B, L + K - 1,
/// ...frame]`) the `[B, L, K, ...frame]` view whose step `j` is rows `j..j + K` of its slice,
/// sharing `t`'s memory (what `unfold` gives; the stacks are never written out).
pub(crate) fn window_view(t: &Tensor, lead: usize) -> Result<Tensor> {
    if lead == 0 {
        return Ok(t.shallow_clone());
    }
    let n = t.dim() as i64;
    // unfold gives [B, L, ...frame, K]: move K before the frame's dimensions.
    let mut order = vec![0, 1, n];
    order.extend(2..n);
    Ok(t.f_unfold(1, lead as i64 + 1, 1)?
        .f_permute(order.as_slice())?)
}
