//! The resident gather kernel (resident_gather.cu, as compiled for the CPU) against a reference
//! written position by position: every column width (4-byte words and bytes), the derived next
//! observation with the episode's last step before, inside and after the valid positions, empty
//! and reversed valid ranges, and calls that cover part of a slice (the CPU's row ranges). The
//! same kernel also runs with a GPU's launch geometry (grid_sim.cc: blocks per slice and column,
//! threads striding a run, grids smaller than the work), so that the CUDA half's indexing is
//! checked without a GPU.

use super::trajstore_resident_gather_host;

unsafe extern "C" {
    /// grid_sim.cc: the kernel with a GPU's launch geometry, every block and thread in turn.
    fn trajstore_resident_gather_grid(
        grid_x: u32,
        grid_y: u32,
        block: u32,
        params: *const i64,
        cols: *const i64,
        ncols: i32,
        b: i32,
        l: i32,
        out: *mut u8,
        flags_offset: i64,
        params_out: *mut i64,
    );
}

/// How a test runs the kernel: the CPU's row ranges (ending anywhere, inside a slice or at its
/// end), or a grid of (x, y) blocks of so many threads.
#[derive(Clone, Copy, Debug)]
enum Run {
    Ranges,
    Grid(u32, u32, u32),
}

/// The kernel's parameter rows (resident.rs's `P_*`): row0, lo, hi, first, last step, final
/// row, terminated, truncated, id, start step, slice end.
const P: usize = 11;

struct Column {
    /// Source rows, row 0 zeros; `skew` bytes in front so that the base may be unaligned.
    src: Vec<u8>,
    skew: usize,
    w: usize,
    derived: bool,
}

fn next(state: &mut u64) -> u64 {
    // splitmix64
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn between(state: &mut u64, lo: i64, hi: i64) -> i64 {
    lo + (next(state) % (hi - lo + 1) as u64) as i64
}

/// What the kernel must write, position by position.
fn reference(params: &[i64], cols: &[Column], b: usize, l: usize) -> (Vec<Vec<u8>>, Vec<u8>) {
    let p = |r: usize, s: usize| params[r * b + s];
    let outs = cols
        .iter()
        .map(|c| {
            let mut out = vec![0u8; b * l * c.w];
            for s in 0..b {
                for j in 0..l as i64 {
                    let valid = j >= p(1, s) && j < p(2, s);
                    let row = match (valid, c.derived) {
                        (false, _) => 0,
                        (true, false) => p(0, s) + j,
                        (true, true) if j < p(4, s) => p(0, s) + j + 1,
                        (true, true) => p(5, s),
                    } as usize;
                    let at = (s * l + j as usize) * c.w;
                    let from = c.skew + row * c.w;
                    out[at..at + c.w].copy_from_slice(&c.src[from..from + c.w]);
                }
            }
            out
        })
        .collect();
    let n = b * l;
    let mut flags = vec![0u8; 6 * n];
    for s in 0..b {
        for j in 0..l as i64 {
            let i = s * l + j as usize;
            let last = j == p(4, s);
            flags[i] = (j >= p(1, s) && j < p(2, s)) as u8;
            flags[n + i] = (j == p(3, s)) as u8;
            flags[2 * n + i] = last as u8;
            flags[3 * n + i] = (last && p(6, s) != 0) as u8;
            flags[4 * n + i] = (last && p(7, s) != 0) as u8;
            flags[5 * n + i] = (j == p(10, s)) as u8;
        }
    }
    (outs, flags)
}

#[test]
fn the_kernel_writes_what_a_position_by_position_reference_writes() {
    let mut rng = 7u64;
    let rows = 400usize;
    for round in 0..60 {
        let b = between(&mut rng, 1, 9) as usize;
        let l = between(&mut rng, 1, 20) as usize;
        // Widths: words (20, 8, 4), bytes (3, 1), a word width whose base is unaligned.
        let cols: Vec<Column> = [(20, 0, false), (8, 0, true), (20, 0, true), (3, 0, false)]
            .into_iter()
            .chain([(3, 0, true), (4, 1, true), (1, 0, false), (4, 0, false)])
            .map(|(w, skew, derived)| {
                let mut src = vec![0u8; skew + rows * w];
                for v in &mut src[skew + w..] {
                    *v = 1 + (next(&mut rng) % 255) as u8;
                }
                Column {
                    src,
                    skew,
                    w,
                    derived,
                }
            })
            .collect();
        let mut params = vec![0i64; P * b];
        for s in 0..b {
            let li = l as i64;
            let row0 = between(&mut rng, 1, rows as i64 - li - 2);
            let (lo, hi) = (between(&mut rng, 0, li), between(&mut rng, 0, li));
            // Mostly a valid run, sometimes none or reversed.
            let (lo, hi) = if round % 5 == 0 {
                (hi, lo)
            } else {
                (lo.min(hi), lo.max(hi))
            };
            let values = [
                row0,
                lo,
                hi,
                between(&mut rng, -2, li + 1),
                between(&mut rng, -2, li + 2),
                between(&mut rng, 1, rows as i64 - 1),
                between(&mut rng, 0, 1),
                between(&mut rng, 0, 1),
                between(&mut rng, 0, 1000),
                between(&mut rng, 0, 1000),
                between(&mut rng, -1, li),
            ];
            for (r, v) in values.into_iter().enumerate() {
                params[r * b + s] = v;
            }
        }
        let (want, want_flags) = reference(&params, &cols, b, l);
        let n = b * l;
        let nc = cols.len() as u32;
        // Ranges as the CPU runs them; the launch NVRTC's kernel gets (a block a slice and
        // column, the flags last: kernel.rs); fewer blocks and threads than the work, which the
        // grid-stride loops must cover; a block wider than a run.
        let grids = [
            Run::Ranges,
            Run::Grid(b as u32, nc + 1, 256),
            Run::Grid(1, 1, 1),
            Run::Grid(2, 3, 5),
            Run::Grid(b as u32, nc + 1, 3),
        ];
        for how in grids {
            let mut outs: Vec<Vec<u8>> = cols.iter().map(|c| vec![0xAAu8; n * c.w]).collect();
            let mut flags = vec![0xAAu8; 6 * n];
            let mut params_out = vec![-1i64; P * b];
            let table: Vec<i64> = cols
                .iter()
                .zip(&mut outs)
                .flat_map(|(c, o)| {
                    let src = c.src[c.skew..].as_ptr() as i64;
                    [src, c.w as i64, c.derived as i64, o.as_mut_ptr() as i64]
                })
                .collect();
            // Both calls: `params` is [11, b], `table` names `cols.len()` columns whose sources
            // hold every row the parameters name and whose outputs hold [b, l] rows; `flags`
            // holds the six planes; `params_out` is [11, b]. All outlive the calls.
            match how {
                Run::Ranges => {
                    let mut first = 0usize;
                    while first < n {
                        let end = (first + between(&mut rng, 1, 2 * l as i64) as usize).min(n);
                        // SAFETY: as above, rows first..end.
                        unsafe {
                            trajstore_resident_gather_host(
                                params.as_ptr(),
                                table.as_ptr(),
                                cols.len() as _,
                                b as _,
                                l as _,
                                std::ptr::null_mut(),
                                flags.as_mut_ptr() as i64,
                                first as i64,
                                end as i64,
                                params_out.as_mut_ptr(),
                            )
                        };
                        first = end;
                    }
                }
                // SAFETY: as above, every row.
                Run::Grid(x, y, threads) => unsafe {
                    trajstore_resident_gather_grid(
                        x,
                        y,
                        threads,
                        params.as_ptr(),
                        table.as_ptr(),
                        cols.len() as _,
                        b as _,
                        l as _,
                        std::ptr::null_mut(),
                        flags.as_mut_ptr() as i64,
                        params_out.as_mut_ptr(),
                    )
                },
            }
            for (c, (got, want)) in cols.iter().zip(outs.iter().zip(&want)) {
                assert!(
                    got == want,
                    "round {round}, {how:?}: column of {} B (derived {}, skew {}), b {b} l {l}, \
                     params {params:?}",
                    c.w,
                    c.derived,
                    c.skew
                );
            }
            assert_eq!(flags, want_flags, "round {round}, {how:?}: flags");
            // The parameters' copy, written by the call that gathers each slice's step 0.
            assert_eq!(
                params_out, params,
                "round {round}, {how:?}: the parameters' copy"
            );
        }
    }
}
