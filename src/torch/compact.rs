//! The compact batch ([`crate::CompactInto`]) expanded where it lies, on the device after its one
//! copy: the flag planes from the per-slice spans, and a derived `next_observation` from the
//! observation one step later plus each slice's tail row. A few elementwise kernels on the GPU
//! in place of `L - 1` rows of observations and six `[B, L]` planes over PCIe.

use tch::{Kind, Tensor};

use super::layout::{Layout, Slot, window_view};
use super::{TensorBatch, widen};
use crate::error::Result;
use crate::format::col;
use crate::gather::CompactInto;

/// The batch of `slot`: views of its tensors ([`Slot::view`]), or for a compact slot the full
/// batch expanded where the slot lies (new tensors, besides the columns shipped whole).
pub(crate) fn batch(slot: &Slot, layout: &Layout) -> Result<TensorBatch> {
    if layout.compact {
        expand(layout, &slot.columns, &slot.flags, &slot.meta)
    } else {
        slot.view(layout)
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
    let obs = layout
        .columns
        .iter()
        .zip(&layout.tails)
        .position(|((name, _, _), &tail)| name == col::OBSERVATION && !tail);
    let mut out = Vec::with_capacity(columns.len());
    for (((((name, _, shape), dt), &tail), t), &lead) in layout
        .columns
        .iter()
        .zip(&layout.types)
        .zip(&layout.tails)
        .zip(columns)
        .zip(&layout.leads)
    {
        let full = match obs.filter(|_| tail) {
            Some(o) => next_observation(&columns[o], t, &mask, &slice_end, shape)?,
            None => window_view(t, lead)?,
        };
        out.push((name.clone(), widen(full, dt)?));
    }
    Ok(TensorBatch {
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

/// `next_observation` `[B, L, ...]`: `tail` where `slice_end`, the observation one step later at
/// the other valid steps, zero where padded.
fn next_observation(
    obs: &Tensor,
    tail: &Tensor,
    mask: &Tensor,
    slice_end: &Tensor,
    shape: &[i64],
) -> Result<Tensor> {
    let l = shape[1];
    // Per-step conditions broadcast over the step's own dimensions.
    let mut cond = shape[..2].to_vec();
    cond.extend(std::iter::repeat_n(1, shape.len() - 2));
    let later = obs.f_narrow(1, 1, l - 1)?;
    let zero_row = obs.f_narrow(1, 0, 1)?.f_zeros_like()?;
    let shifted = Tensor::f_cat(&[later, zero_row], 1)?;
    let valid = shifted.f_where_scalarother(&mask.f_view(cond.as_slice())?, 0)?;
    let tail = tail.f_unsqueeze(1)?.f_expand_as(&valid)?;
    Ok(tail.f_where_self(&slice_end.f_view(cond.as_slice())?, &valid)?)
}
