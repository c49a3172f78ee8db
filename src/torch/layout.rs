//! Shapes and kinds of one batch's host tensors, and the host slot a batch is gathered into.

use std::sync::Arc;

use arrow::datatypes::DataType;

use tch::{Device, Kind, Tensor};

use super::{TensorBatch, storage_kind, widen};
use crate::error::{Error, Result};
use crate::gather::either::Dest;
use crate::gather::{CompactInto, FrameArena, GatherInto, Gatherer};
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
    /// Per column: whether the device decodes it (a frame window left by the gather as a table
    /// of stored frames, [`crate::gather::TABLE_ROW`] bytes per row, `Int64 [B, L + K - 1, 3]`
    /// in a slot, `[B, 3]` as a compact tail), see `frame_decode.rs`.
    pub(crate) stored: Vec<bool>,
    /// Bytes of a slot's arena of stored frames (0 without a stored column); grown by a worker
    /// whose batch did not fit.
    pub(crate) arena: usize,
}

impl Layout {
    pub(crate) fn new(gatherer: &Gatherer, b: usize, l: usize) -> Result<Self> {
        let mut layout = Self::of_columns(gatherer.columns(), b, l)?;
        layout.leads = gatherer.leads();
        layout.stored = gatherer
            .stored_frame_columns()
            .iter()
            .map(Option::is_some)
            .collect();
        // A first guess, 1/16 of the decoded frames (at least 4 KiB); a batch that does not fit
        // grows it.
        layout.arena = (0..layout.columns.len())
            .filter(|&i| layout.stored[i])
            .map(|i| layout.storage_shape(i).iter().product::<i64>() as usize / 16)
            .sum::<usize>();
        if layout.arena > 0 {
            layout.arena = layout.arena.max(4 << 10);
        }
        Ok(layout)
    }

    /// Whether some column is decoded on the device.
    pub(crate) fn decodes(&self) -> bool {
        self.arena > 0
    }

    /// Bytes of one decoded frame of column `i` (a frame window's row).
    pub(crate) fn frame_len(&self, i: usize) -> usize {
        self.columns[i].2[3..].iter().product::<i64>() as usize
    }

    /// The shape column `i` has once decoded where it is stored: its storage shape, or a compact
    /// tail's `[B, ...frame]`.
    pub(crate) fn decoded_shape(&self, i: usize) -> Vec<i64> {
        let shape = &self.columns[i].2;
        if self.compact && self.tails[i] {
            [&shape[..1], &shape[3..]].concat()
        } else {
            self.storage_shape(i)
        }
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
            stored: vec![false; out.len()],
            arena: 0,
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
    /// The arena of stored frames, where the device decodes some column ([`Layout::decodes`]),
    /// and the bytes its last gather used.
    pub(crate) arena: Option<Tensor>,
    pub(crate) arena_used: usize,
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
            if layout.stored[i] {
                // A table of stored frames: a row per frame of the window, or of the tail.
                return if layout.compact && tail {
                    (vec![b, 3], Kind::Int64)
                } else {
                    (vec![b, l + layout.leads[i] as i64, 3], Kind::Int64)
                };
            }
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
    if layout.decodes() {
        // The arena last, so that a copy to the device carries only its used bytes.
        specs.push((vec![layout.arena as i64], Kind::Uint8));
    }
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
    /// Columns, flags, metadata and the arena (`arena`: if there is one) in [`slot_specs`]
    /// order.
    fn from_tensors(
        mut t: Vec<Tensor>,
        packed: Option<(Tensor, Arc<[Piece]>)>,
        arena: bool,
    ) -> Self {
        let arena = if arena { t.pop() } else { None };
        let meta = t.pop().expect("metadata tensor");
        let flags = t.pop().expect("flags tensor");
        Slot {
            columns: t,
            flags,
            meta,
            packed,
            arena,
            arena_used: 0,
        }
    }

    /// A placeholder while a slot is taken out of its ring.
    pub(crate) fn empty() -> Self {
        let t = || Tensor::new();
        Slot {
            columns: Vec::new(),
            flags: t(),
            meta: t(),
            packed: None,
            arena: None,
            arena_used: 0,
        }
    }

    pub(crate) fn alloc(layout: &Layout, pin: Option<Device>) -> Result<Self> {
        let tensors = slot_specs(layout)
            .iter()
            .map(|(shape, kind)| {
                let t = Tensor::f_empty(shape.as_slice(), (*kind, Device::Cpu))?;
                Ok(match pin {
                    Some(d) => super::pin(&t, d)?,
                    None => t,
                })
            })
            .collect::<Result<_>>()?;
        Ok(Self::from_tensors(tensors, None, layout.decodes()))
    }

    /// A slot whose tensors are views of one (pinned, on CUDA) buffer: what the CUDA staging ring
    /// uses, so that a batch is one host-to-device copy and one device allocation, not one per
    /// tensor.
    pub(crate) fn alloc_packed(layout: &Layout, pin: Option<Device>) -> Result<Self> {
        let (total, pieces) = packed_pieces(layout);
        let mut buf = Tensor::f_empty([total.max(1)], (Kind::Uint8, Device::Cpu))?;
        if let Some(d) = pin {
            buf = super::pin(&buf, d)?;
        }
        Self::views_of(buf, pieces, layout.decodes())
    }

    /// A packed slot on `device` (a device ring's buffer, `device_ring.rs`).
    pub(crate) fn alloc_packed_on(layout: &Layout, device: Device) -> Result<Self> {
        let (total, pieces) = packed_pieces(layout);
        let buf = Tensor::f_empty([total.max(1)], (Kind::Uint8, device))?;
        Self::views_of(buf, pieces, layout.decodes())
    }

    /// The slot's tensors as views of `buf` (the last an arena if `arena`).
    fn views_of(buf: Tensor, pieces: Arc<[Piece]>, arena: bool) -> Result<Self> {
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
        Ok(Self::from_tensors(views, Some((buf, pieces)), arena))
    }

    /// Bytes [`Slot::to_device`] copies: the packed buffer, up to the arena's used bytes (for
    /// an unpacked slot, what a packed one's copy would carry, less the alignment).
    pub(crate) fn copy_bytes(&self) -> u64 {
        let bytes = |t: &Tensor| (t.numel() * t.kind().elt_size_in_bytes()) as u64;
        match (&self.packed, &self.arena) {
            (Some((_, pieces)), Some(_)) => {
                pieces.last().map_or(0, |p| p.0) as u64 + self.arena_used as u64
            }
            (Some((buf, _)), None) => buf.size()[0] as u64,
            (None, _) => {
                self.columns.iter().map(bytes).sum::<u64>()
                    + bytes(&self.flags)
                    + bytes(&self.meta)
                    + self.arena.as_ref().map_or(0, |_| self.arena_used as u64)
            }
        }
    }

    /// A packed slot's copy on `device`, in one non-blocking copy (None for an unpacked slot).
    /// Of an arena, only the bytes the gather used cross (it is the slot's last piece).
    pub(crate) fn to_device(&self, device: Device) -> Result<Option<Self>> {
        let Some((buf, pieces)) = &self.packed else {
            return Ok(None);
        };
        let arena = self.arena.is_some();
        let (len, pieces) = match pieces.last() {
            Some((off, _, kind)) if arena => {
                let used = self.arena_used as i64;
                let mut p = pieces.to_vec();
                *p.last_mut().expect("the arena") = (*off, vec![used], *kind);
                (off + used, p.into())
            }
            _ => (buf.size()[0], pieces.clone()),
        };
        let on = buf
            .f_narrow(0, 0, len.max(1))?
            .f_to_device_(device, Kind::Uint8, true, false)?;
        Ok(Some(Self::views_of(on, pieces, arena)?))
    }

    /// Takes the tensors of a recycled batch back if they still have the layout's shapes and
    /// kinds (a transform may have replaced them).
    pub(crate) fn reclaim(batch: TensorBatch, layout: &Layout) -> Option<Self> {
        let ok = |t: &Tensor, kind: Kind, shape: &[i64]| {
            t.device() == Device::Cpu && t.kind() == kind && t.size() == shape && t.is_contiguous()
        };
        // A compact slot's batch is expanded into new tensors, a decoded column is a new tensor:
        // nothing to take back.
        if layout.compact || layout.decodes() || batch.base_columns.len() != layout.columns.len() {
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
            arena: None,
            arena_used: 0,
        })
    }

    /// Gathers `plan` into the slot. False where the slot's arena was too small for the batch's
    /// stored frames ([`Slot::arena_used`] says how many bytes they need): gather it again into
    /// a slot with a larger one.
    pub(crate) fn fill(
        &mut self,
        gatherer: &Gatherer,
        plan: &[SliceRef],
        layout: &Layout,
    ) -> Result<bool> {
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
        let dest = if layout.compact {
            let spans = bytes(&self.flags);
            // SAFETY: the spans tensor is Int [B, 3]: 12 * B bytes, 4-byte aligned.
            let spans: &mut [i32] =
                unsafe { std::slice::from_raw_parts_mut(spans.as_mut_ptr() as *mut i32, 3 * b) };
            Dest::Compact(CompactInto {
                columns,
                spans,
                episode_id: ids,
                start_step: starts,
            })
        } else {
            let mut planes = bytes(&self.flags).chunks_exact_mut(b * l);
            let flags = std::array::from_fn(|_| planes.next().expect("a [6, B, L] flag tensor"));
            Dest::Planes(GatherInto {
                columns,
                flags,
                episode_id: ids,
                start_step: starts,
            })
        };
        match (self.arena.as_ref().map(bytes), dest) {
            (Some(a), dest) => {
                let arena = FrameArena::new(a);
                gatherer.gather_stored(&plan[..n], l, dest, &arena)?;
                self.arena_used = arena.used();
            }
            (None, Dest::Compact(d)) => gatherer.gather_compact(&plan[..n], l, d)?,
            (None, Dest::Planes(d)) => gatherer.gather_into(&plan[..n], l, d)?,
        }
        if self
            .arena
            .as_ref()
            .is_some_and(|a| self.arena_used > a.numel())
        {
            return Ok(false);
        }
        if n < b {
            self.pad_tail(n, layout)?;
        }
        Ok(true)
    }

    /// Zeroes slices `n..` (a short last batch of an epoch); a stored column's table gets rows
    /// of zero frames.
    pub(crate) fn pad_tail(&mut self, n: usize, layout: &Layout) -> Result<()> {
        for (i, t) in self.columns.iter_mut().enumerate() {
            let b = t.size()[0];
            let mut rest = t.f_narrow(0, n as i64, b - n as i64)?;
            if layout.stored.get(i).copied().unwrap_or(false) {
                // [.., 3] rows (offset, length, destination): no stored bytes (-1), and the
                // destination of each row's decoded frame, which is its place in the column.
                let rows = rest.numel() as i64 / 3;
                let first = (n * t.numel() / b as usize / 3) as i64;
                let frame = layout.frame_len(i) as i64;
                let dst = Tensor::f_arange_start(first, first + rows, (Kind::Int64, Device::Cpu))?
                    .f_mul_scalar(frame)?;
                let rest3 = rest.f_view([rows, 3])?;
                let _ = rest3.f_select(1, 0)?.f_fill_(0)?;
                let _ = rest3.f_select(1, 1)?.f_fill_(-1)?;
                rest3.f_select(1, 2)?.f_copy_(&dst)?;
                continue;
            }
            let _ = rest.f_zero_()?;
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
        let columns = layout
            .columns
            .iter()
            .zip(&layout.types)
            .zip(&self.columns)
            .zip(&layout.leads)
            .map(|((((n, _, _), dt), t), &lead)| Ok((n.clone(), widen(window_view(t, lead)?, dt)?)))
            .collect::<Result<_>>()?;
        let flag = |i: i64| Ok(self.flags.f_select(0, i)?);
        let (ids, starts) = (self.meta.f_select(0, 0)?, self.meta.f_select(0, 1)?);
        let mut batch = TensorBatch::of_planes(columns, flag, ids, starts)?;
        batch.flag_base = Some(self.flags.shallow_clone());
        batch.meta_base = Some(self.meta.shallow_clone());
        batch.base_columns = self.columns.iter().map(Tensor::shallow_clone).collect();
        Ok(batch)
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
