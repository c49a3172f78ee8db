//! The resident mode's fused gather (`resident.rs`): its parameter rows, its fixed parts
//! (`Fused`), and its output ring, buffers whose parameters, output and tensor views were made
//! once, reused when nothing outside the ring holds them (`device_ring.rs`).

use tch::{Device, Kind, Tensor};

use arrow::datatypes::DataType;

use super::TensorBatch;
use super::device_ring::{Held, RingCounts};
use super::kernel::{Kernel, Launch};
use super::layout::Layout;
use crate::error::Result;

/// Rows of the per-slice parameter tensor, in slice positions `pos` (`0..L`) where a row is
/// about steps: the first row gathered (`row0 + pos` is the row of position `pos`), the valid
/// positions `lo..hi`, the positions of the episode's first and last steps (maybe outside
/// `0..L`), the row of its final observation, its end flags, its id, the slice's start step and
/// its last valid position (`slice_end`). Everything that is per slice is computed here by the
/// workers, so that the device only expands it along `L`.
pub(super) const P_ROW0: usize = 0;
pub(super) const P_LO: usize = 1;
pub(super) const P_HI: usize = 2;
pub(super) const P_FIRST: usize = 3;
pub(super) const P_LAST_STEP: usize = 4;
pub(super) const P_FINAL: usize = 5;
pub(super) const P_TERMINATED: usize = 6;
pub(super) const P_TRUNCATED: usize = 7;
pub(super) const P_EP_ID: usize = 8;
pub(super) const P_START: usize = 9;
pub(super) const P_SLICE_END: usize = 10;
pub(super) const P_ROWS: usize = 11;

/// The fused gather's fixed parts: the kernel, its column table (`[ncols, 4]` int64: source
/// address, row bytes, derived, output offset), and the packed output's layout.
pub(super) struct Fused {
    pub(super) kernel: Kernel,
    /// The table on a GPU (None on the CPU, where `host_table` is used).
    pub(super) table: Option<Tensor>,
    /// Per column: its byte offset in the output, its device kind and the bytes of a row.
    pub(super) offsets: Vec<(usize, Kind, usize)>,
    /// The table on the host (the CPU fills in output addresses per batch).
    pub(super) host_table: Vec<i64>,
    pub(super) flags_offset: usize,
    pub(super) total: usize,
}

impl Fused {
    /// The column table and output layout of `columns` for batches of `b` × `l` steps.
    pub(super) fn new(
        kernel: Kernel,
        columns: &[(String, Tensor, bool, DataType)],
        b: usize,
        l: usize,
        device: Device,
    ) -> Result<Self> {
        let align = |n: usize| n.div_ceil(16) * 16;
        let (mut table, mut offsets, mut at) = (Vec::new(), Vec::new(), 0usize);
        for (_, t, derived, _) in columns {
            let row = t.size()[1..].iter().product::<i64>().max(1) as usize
                * t.kind().elt_size_in_bytes();
            table.extend([t.data_ptr() as i64, row as i64, *derived as i64, at as i64]);
            offsets.push((at, t.kind(), row));
            at = align(at + b * l * row);
        }
        let flags_offset = at;
        let host_table = table;
        let table = match device {
            Device::Cpu => None,
            _ => Some(
                Tensor::f_from_slice(&host_table)?
                    .f_view([columns.len() as i64, 4])?
                    .f_to_device(device)?,
            ),
        };
        Ok(Self {
            kernel,
            table,
            offsets,
            host_table,
            flags_offset,
            total: flags_offset + 6 * b * l,
        })
    }
}

/// The resident mode's output ring: every buffer's parameters, output and views on the device,
/// made once. All of it runs on the default stream, in order with the training loop's kernels,
/// so a buffer free of references is free to overwrite.
#[derive(Default)]
pub(super) struct OutRing {
    pub(super) slots: Vec<OutSlot>,
    pub(super) next: usize,
    pub(super) counts: RingCounts,
}

/// One output buffer: the batch's `[P_ROWS, B]` parameters on the device, its packed output,
/// the column table (absolute addresses, on the CPU), the batch's views and their counts.
pub(super) struct OutSlot {
    pub(super) params: Tensor,
    _out: Tensor,
    /// What `launch.cols` points to on the CPU.
    _host_table: Vec<i64>,
    pub(super) launch: Launch,
    pub(super) batch: TensorBatch,
    pub(super) held: Held,
}

/// A new output buffer of the ring: parameters, output and views on `device`, and the launch
/// that fills them.
pub(super) fn out_slot(
    fused: &Fused,
    columns: &[(String, Tensor, bool, DataType)],
    layout: &Layout,
    device: Device,
) -> Result<OutSlot> {
    let (b, l) = (layout.b, layout.l);
    let params = Tensor::f_empty([P_ROWS as i64, b as i64], (Kind::Int64, device))?;
    let out = Tensor::f_empty([fused.total.max(1) as i64], (Kind::Uint8, device))?;
    let base = out.data_ptr() as u64;
    // On a GPU the table (made once) holds offsets from `out`; on the CPU addresses.
    let mut host_table = fused.host_table.clone();
    let (at, cols, flags_at) = match &fused.table {
        Some(t) => (base, t.data_ptr() as u64, fused.flags_offset),
        None => {
            for (c, o) in fused.offsets.iter().enumerate() {
                host_table[4 * c + 3] = (base + o.0 as u64) as i64;
            }
            (0, 0, base as usize + fused.flags_offset)
        }
    };
    let mut launch = Launch {
        params: params.data_ptr() as u64,
        params_out: 0,
        cols,
        ncols: columns.len(),
        b,
        l,
        out: at,
        flags_offset: flags_at,
    };
    if fused.table.is_none() {
        launch.cols = host_table.as_ptr() as u64;
    }
    let mut cols_out = Vec::with_capacity(columns.len());
    for ((name, data, _, _), o) in columns.iter().zip(&fused.offsets) {
        let mut shape = vec![b as i64, l as i64];
        shape.extend(&data.size()[1..]);
        let t = out
            .f_narrow(0, o.0 as i64, (b * l * o.2) as i64)?
            .f_view_dtype(o.1)?
            .f_view(shape.as_slice())?;
        cols_out.push((name.clone(), t));
    }
    // The batch's views, built in a call so that no temporary view outlives it: the counts
    // taken below are those of the batch alone.
    let flags = out.f_narrow(0, fused.flags_offset as i64, (6 * b * l) as i64)?;
    let batch = fused_views(cols_out, flags, &params, b, l)?;
    Ok(OutSlot {
        held: Held::of(&batch),
        params,
        _out: out,
        _host_table: host_table,
        launch,
        batch,
    })
}

/// The batch of the fused gather's output: `columns` as they are handed out, the six flag planes
/// from the `6 * B * L` bytes of `flags`, the ids and start steps from the device's
/// `[P_ROWS, B]` parameters.
pub(super) fn fused_views(
    columns: Vec<(String, Tensor)>,
    flags: Tensor,
    params: &Tensor,
    b: usize,
    l: usize,
) -> Result<TensorBatch> {
    let planes = flags
        .f_view_dtype(Kind::Bool)?
        .f_view([6, b as i64, l as i64])?;
    TensorBatch::of_planes(
        columns,
        |k| Ok(planes.f_select(0, k)?),
        params.f_select(0, P_EP_ID as i64)?,
        params.f_select(0, P_START as i64)?,
    )
}
