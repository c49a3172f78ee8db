//! The compact batch ([`crate::CompactInto`]) expanded where it lies, on the device after its one
//! copy: the flag planes from the per-slice spans, and a derived `next_observation` from the
//! observation one step later plus each slice's tail row (a frame window's: the observation
//! window one row later plus one frame). A few elementwise kernels on the GPU in place of `L - 1`
//! rows of observations (`L + K - 2` frames) and six `[B, L]` planes over PCIe.

use tch::{Kind, Tensor};

use super::kernel::{EXPAND_TAILS, ExpandArgs, ExpandTail, Kernel};
use super::layout::{Layout, Slot, window_view};
use super::{TensorBatch, widen};
use crate::error::Result;
use crate::format::col;
use crate::gather::CompactInto;

/// The batch of `slot`: views of its tensors ([`Slot::view`]), or for a compact slot the full
/// batch expanded where the slot lies (new tensors, besides the columns shipped whole): by
/// `kernel` in one launch where one is given (on the slot's side: the GPU's, or the host copy
/// for a slot on the CPU), else by tensor operations.
pub(crate) fn batch(slot: &Slot, layout: &Layout, kernel: Option<&Kernel>) -> Result<TensorBatch> {
    if !layout.compact {
        return slot.view(layout);
    }
    match kernel {
        Some(k) => expand_fused(k, layout, &slot.columns, &slot.flags, &slot.meta),
        None => expand(layout, &slot.columns, &slot.flags, &slot.meta),
    }
}

/// The position of the observation shipped whole (what derived tails come from), if any.
fn observation(layout: &Layout) -> Option<usize> {
    layout
        .columns
        .iter()
        .zip(&layout.tails)
        .position(|((name, _, _), &tail)| name == col::OBSERVATION && !tail)
}

/// Byte alignment of each piece of the fused expansion's output buffer.
const ALIGN: i64 = 16;

/// [`expand`] by one launch of `expand.cu` into one new buffer: the six flag planes, then each
/// derived column; the batch's tensors are views of it.
fn expand_fused(
    kernel: &Kernel,
    layout: &Layout,
    columns: &[Tensor],
    spans: &Tensor,
    meta: &Tensor,
) -> Result<TensorBatch> {
    let Some(fused) = Fused::new(layout, columns, spans, meta)? else {
        // Never in practice (one next_observation): the operations handle any number.
        return expand(layout, columns, spans, meta);
    };
    // SAFETY: `fused.args` addresses live tensors on the kernel's side (`Fused::new`). On a GPU
    // the launch is on the default stream, which this thread's allocations and later uses of
    // these tensors order after, and the tensors stay referenced by the batch or freed into the
    // caching allocator in stream order.
    unsafe { kernel.expand(&fused.args, std::ptr::null_mut())? };
    Ok(fused.batch)
}

/// One compact batch's fused expansion, made ready: the output buffer (the six flag planes,
/// then each derived column), the kernel's arguments, and the full batch as views of the
/// columns shipped whole and of the output. The device ring makes one per device buffer, once.
pub(crate) struct Fused {
    pub(crate) args: ExpandArgs,
    pub(crate) batch: TensorBatch,
    /// The tensors `args` addresses, besides the batch's views: the spans and the derived
    /// columns' observations and tails as contiguous tensors (the slot's own when they were),
    /// and the output buffer.
    _inputs: Vec<Tensor>,
    _out: Tensor,
}

impl Fused {
    /// The expansion of the compact batch `columns`, `spans`, `meta` (a slot's, on one device);
    /// None where it derives more columns than the kernel takes.
    pub(crate) fn new(
        layout: &Layout,
        columns: &[Tensor],
        spans: &Tensor,
        meta: &Tensor,
    ) -> Result<Option<Self>> {
        let (b, l) = (layout.b as i64, layout.l as i64);
        let device = spans.device();
        let obs = observation(layout);
        // The derived columns: (column, its observation [B, R, ...] contiguous, its tail, offset
        // and bytes in the buffer).
        let spans = spans.f_contiguous()?;
        let mut derived = Vec::new();
        let mut size = 6 * b * l;
        for (i, &tail) in layout.tails.iter().enumerate() {
            let Some(o) = obs.filter(|_| tail) else {
                continue;
            };
            let src = columns[o].f_contiguous()?;
            size = (size + ALIGN - 1) / ALIGN * ALIGN;
            let bytes = src.numel() as i64 * src.kind().elt_size_in_bytes() as i64;
            derived.push((i, src, columns[i].f_contiguous()?, size, bytes));
            size += bytes;
        }
        if derived.len() > EXPAND_TAILS {
            return Ok(None);
        }
        let buf = Tensor::f_empty([size.max(1)], (Kind::Uint8, device))?;
        let base = buf.data_ptr() as u64;
        let mut args = ExpandArgs {
            spans: spans.data_ptr() as u64,
            flags: base,
            b,
            l,
            ntails: derived.len() as i64,
            ..Default::default()
        };
        for (slot, (i, src, tail, off, _)) in args.tails.iter_mut().zip(&derived) {
            let shape = src.size();
            let row = shape[2..].iter().product::<i64>() * src.kind().elt_size_in_bytes() as i64;
            *slot = ExpandTail {
                obs: src.data_ptr() as u64,
                tail: tail.data_ptr() as u64,
                out: base + *off as u64,
                rows: shape[1],
                row,
                lead: layout.leads[*i] as i64,
            };
        }
        // The addresses above: spans `[B, 3]` int32 (contiguous), six `[B, L]` planes from
        // `base`, per derived column its contiguous observation `[B, R, row]`, tail `[B, row]`
        // and `B * R * row` bytes at its offset: what `expand.cu` reads and writes.
        let plane = |k: i64| -> Result<Tensor> {
            Ok(buf
                .f_narrow(0, k * b * l, b * l)?
                .f_view_dtype(Kind::Bool)?
                .f_view([b, l])?)
        };
        let mut out = Vec::with_capacity(columns.len());
        for (i, ((((name, _, _), dt), t), &lead)) in layout
            .columns
            .iter()
            .zip(&layout.types)
            .zip(columns)
            .zip(&layout.leads)
            .enumerate()
        {
            let full = match derived.iter().find(|d| d.0 == i) {
                Some((_, src, _, off, bytes)) => buf
                    .f_narrow(0, *off, *bytes)?
                    .f_view_dtype(src.kind())?
                    .f_view(src.size().as_slice())?,
                None => t.shallow_clone(),
            };
            out.push((name.clone(), widen(window_view(&full, lead)?, dt)?));
        }
        let batch = TensorBatch::of_planes(out, plane, meta.f_select(0, 0)?, meta.f_select(0, 1)?)?;
        let mut inputs = vec![spans];
        for (_, src, tail, _, _) in derived {
            inputs.push(src);
            inputs.push(tail);
        }
        Ok(Some(Self {
            args,
            batch,
            _inputs: inputs,
            _out: buf,
        }))
    }
}

/// The full batch of a compact slot's tensors: `columns` in layout order (tail columns `[B,
/// ...]`), `spans` `Int [B, 3]`, `meta` `Int64 [2, B]`, all on one device.
fn expand(
    layout: &Layout,
    columns: &[Tensor],
    spans: &Tensor,
    meta: &Tensor,
) -> Result<TensorBatch> {
    let (b, l) = (layout.b as i64, layout.l as i64);
    let device = spans.device();
    let j = Tensor::f_arange(l, (Kind::Int, device))?.f_view([1, l])?;
    let off = spans.f_select(1, 0)?.f_view([b, 1])?;
    let n = spans.f_select(1, 1)?.f_view([b, 1])?;
    let bits = spans.f_select(1, 2)?.f_view([b, 1])?;
    let end = off.f_add(&n)?;
    let mask = j.f_ge_tensor(&off)?.f_logical_and(&j.f_lt_tensor(&end)?)?;
    let slice_end = j
        .f_eq_tensor(&end.f_sub_scalar(1)?)?
        .f_logical_and(&n.f_gt(0)?)?;
    let bit = |v: i32| -> Result<Tensor> { Ok(bits.f_bitwise_and(i64::from(v))?.f_ne(0)?) };
    let is_first = j
        .f_eq_tensor(&off)?
        .f_logical_and(&n.f_gt(0)?)?
        .f_logical_and(&bit(CompactInto::FIRST)?)?;
    let is_last = slice_end.f_logical_and(&bit(CompactInto::LAST)?)?;
    let terminated = slice_end.f_logical_and(&bit(CompactInto::TERMINATED)?)?;
    let truncated = slice_end.f_logical_and(&bit(CompactInto::TRUNCATED)?)?;
    let obs = observation(layout);
    let mut out = Vec::with_capacity(columns.len());
    for (((((name, _, _), dt), &tail), t), &lead) in layout
        .columns
        .iter()
        .zip(&layout.types)
        .zip(&layout.tails)
        .zip(columns)
        .zip(&layout.leads)
    {
        let full = match obs.filter(|_| tail) {
            Some(o) => window_view(&next_observation(&columns[o], t, &off, &n, lead)?, lead)?,
            None => window_view(t, lead)?,
        };
        out.push((name.clone(), widen(full, dt)?));
    }
    Ok(TensorBatch {
        ready: None,
        columns: out,
        mask,
        is_first,
        is_last,
        terminated,
        truncated,
        slice_end,
        episode_id: meta.f_select(0, 0)?,
        start_step: meta.f_select(0, 1)?,
        flag_base: None,
        meta_base: None,
        base_columns: Vec::new(),
    })
}

/// `next_observation` as stored, `[B, R, ...]` like `obs` (`R = L`, or a frame window's `L +
/// lead` frames) from the observation and the `[B, ...]` tail, with `off`, `n` `[B, 1]` each
/// slice's first valid position and valid steps: row `r` is the tail at `r == off + n - 1 +
/// lead` (when `n > 0`), the observation's row `r + 1` where `off <= r < off + n - 1 + lead`,
/// zero elsewhere. For `lead = 0`: the tail at `slice_end`, the observation one step later at
/// the other valid steps, zero where padded.
fn next_observation(
    obs: &Tensor,
    tail: &Tensor,
    off: &Tensor,
    n: &Tensor,
    lead: usize,
) -> Result<Tensor> {
    let shape = obs.size();
    let (b, r) = (shape[0], shape[1]);
    let rows = Tensor::f_arange(r, (Kind::Int, obs.device()))?.f_view([1, r])?;
    let last = off.f_add(n)?.f_sub_scalar(1 - lead as i64)?;
    // Per-row conditions broadcast over the row's own dimensions.
    let mut cond = vec![b, r];
    cond.extend(std::iter::repeat_n(1, shape.len() - 2));
    let keep = (rows.f_ge_tensor(off)?)
        .f_logical_and(&rows.f_lt_tensor(&last)?)?
        .f_view(cond.as_slice())?;
    let at_tail = (rows.f_eq_tensor(&last)?)
        .f_logical_and(&n.f_gt(0)?)?
        .f_view(cond.as_slice())?;
    let later = obs.f_narrow(1, 1, r - 1)?;
    let zero_row = obs.f_narrow(1, 0, 1)?.f_zeros_like()?;
    let shifted = Tensor::f_cat(&[later, zero_row], 1)?;
    let valid = shifted.f_where_scalarother(&keep, 0)?;
    let tail = tail.f_unsqueeze(1)?.f_expand_as(&valid)?;
    Ok(tail.f_where_self(&at_tail, &valid)?)
}
