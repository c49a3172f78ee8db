// The resident mode's gather (src/torch/resident.rs): one kernel per batch that reads every
// requested column's rows from the uploaded device tensors into one packed output buffer and
// writes the six [B, L] flag planes, from the per-slice parameters the loader's workers computed.
//
// One source, two compilers:
// - on a GPU, NVRTC compiles it at run time (src/torch/kernel.rs) and it is launched on the
//   legacy default stream, after the parameters' copy and before the views are used;
// - on the CPU, the build compiles it as C++ (src/torch/resident_host.cc defines the CUDA
//   built-ins it uses), so the CPU resident mode runs this very code and the CPU tests check it
//   against the streaming loader, bit for bit.
// So it uses only what both accept: no shared memory, no synchronisation, no headers.
//
// Parameters, `params` [11, B] int64 (rows as src/torch/resident.rs's P_* constants): per slice
// the row gathered at position 0 (`row0`; row r of an uploaded tensor is transition r - 1, row 0
// is zeros), the valid positions lo..hi, the positions of the episode's first and last steps, the
// row of its final observation, its terminated and truncated flags, its id, its start step and
// the slice's last valid position. `params` may be pinned host memory the device maps (the
// workers' buffer, read in place: no copy a batch); then `params_out`, when not null, receives
// a copy on the device (the batch's episode ids and start steps are views of it), written by the
// call that gathers each slice's step 0.
// Columns, `cols` [ncols, 4] int64: the source tensor's address, the bytes of one row, whether it
// is the derived next observation (rows one step later, the final observation after the last
// step), and the column's byte offset in `out` (on the CPU, `out` is 0 and each column's output
// has an address of its own, as has `flags_offset`).
// Output: column c's [B, L, row] bytes at its offset; from `flags_offset`, six [B, L] bool planes:
// mask, is_first, is_last, terminated, truncated, slice_end. Only rows first_row..end_row of the
// B * L (step j of slice b is row b * L + j) are written: the whole batch on a GPU, a chunk per
// thread on the CPU.
//
// A block per slice and column (grid-stride in x over slices; in y over the columns and, after
// the last, the flag planes): a slice's rows of one column are one contiguous run of L * row bytes
// in `out`, and its valid rows come from consecutive rows of the source, so the block's threads
// copy 4-byte words side by side (thread k the k-th word of the run): every load and store of a
// warp is coalesced. A batch of a few hundred slices is bound by memory latency, not bandwidth:
// the columns of a slice run in blocks of their own, and each thread has four loads in flight.
// (A warp per row, the first version, left 15 of 32 lanes idle on a 68-byte row and waited on
// each row's parameters in turn: 0.3 TB/s on an H200.)

#define TRAJSTORE_P_ROW0 0
#define TRAJSTORE_P_LO 1
#define TRAJSTORE_P_HI 2
#define TRAJSTORE_P_FIRST 3
#define TRAJSTORE_P_LAST_STEP 4
#define TRAJSTORE_P_FINAL 5
#define TRAJSTORE_P_TERMINATED 6
#define TRAJSTORE_P_TRUNCATED 7
#define TRAJSTORE_P_SLICE_END 10
#define TRAJSTORE_P_ROWS 11

// Units k0..k1 of one slice's run of one column into `d`: units v0..m from the source run `run`
// (unit k of the run), m..v1 from the row `fin` (unit k mod per_row, where m is a row's first
// unit), the rest zeros (row 0's). I is the index type: 32 bits where the run fits, as it
// nearly always does (64-bit compares and adds are two instructions each on a GPU).
// Unit k of one slice's run of one column: units v0..m from the source run `run` (unit k of the
// run), m..v1 from the row `fin` (unit k mod per_row, where m is a row's first unit), the rest
// zeros (row 0's).
template <typename T, typename I>
__device__ inline T trajstore_unit(const T* __restrict__ run, const T* __restrict__ fin, I per_row,
                                   I v0, I m, I v1, I k)
{
    if (k >= v0 && k < m) {
        return run[k];
    }
    if (k >= m && k < v1) {
        I u = k - m;
        if (u >= per_row) {
            u %= per_row;
        }
        return fin[u];
    }
    return 0;
}

// Units k0..k1 of one slice's run of one column into `d` (see trajstore_unit). Each thread loads
// four units before it stores any, so that four loads are in flight and a batch of a few hundred
// slices does not wait one memory latency per unit. I is the index type: 32 bits where the run
// fits, as it nearly always does (64-bit compares and adds are two instructions each on a GPU).
template <typename T, typename I>
__device__ inline void trajstore_copy_units(const T* __restrict__ run, const T* __restrict__ fin,
                                            T* __restrict__ d, I per_row, I k0, I k1, I v0, I m,
                                            I v1)
{
    const I step = blockDim.x;
    I k = k0 + threadIdx.x;
    for (; k + 3 * step < k1; k += 4 * step) {
        const T a = trajstore_unit(run, fin, per_row, v0, m, v1, k);
        const T b = trajstore_unit(run, fin, per_row, v0, m, v1, k + step);
        const T c = trajstore_unit(run, fin, per_row, v0, m, v1, k + 2 * step);
        const T e = trajstore_unit(run, fin, per_row, v0, m, v1, k + 3 * step);
        d[k] = a;
        d[k + step] = b;
        d[k + 2 * step] = c;
        d[k + 3 * step] = e;
    }
    for (; k < k1; k += step) {
        d[k] = trajstore_unit(run, fin, per_row, v0, m, v1, k);
    }
}

// Positions j0..j1 of one slice's run of one column, `per_row` units of T a row, into `d` (the
// slice's run: unit k is unit k mod per_row of position k / per_row). Valid positions lo..hi
// read the source rows row0 + j (the derived next observation: row0 + j + 1 before the episode's
// last step `last`, its final row from there); invalid ones write the zeros of row 0. Each
// region is a contiguous run of the source, so a unit needs no division (a division a word,
// the first version, cost more instructions than the copy); only positions past `last`, at most
// one in a slice that stays in its episode, take a remainder.
template <typename T>
__device__ inline void trajstore_copy_run(const T* src, T* d, long long per_row, int L,
                                          long long j0, long long j1, long long lo, long long hi,
                                          long long row0, bool derived, long long last,
                                          long long final_row)
{
    const long long v0 = lo * per_row;
    const long long v1 = hi > lo ? hi * per_row : v0;
    // Units v0..m read the shifted run, m..v1 the final row.
    long long m = v1;
    if (derived && last < hi) {
        m = last > lo ? last * per_row : v0;
    }
    const T* run = src + (derived ? row0 + 1 : row0) * per_row;
    const T* fin = src + final_row * per_row;
    if ((long long)L * per_row < 0x7FFFFFFFLL) {
        trajstore_copy_units<T, unsigned int>(run, fin, d, (unsigned int)per_row,
                                              (unsigned int)(j0 * per_row),
                                              (unsigned int)(j1 * per_row), (unsigned int)v0,
                                              (unsigned int)m, (unsigned int)v1);
    } else {
        trajstore_copy_units<T, long long>(run, fin, d, per_row, j0 * per_row, j1 * per_row, v0,
                                           m, v1);
    }
}

extern "C" __global__ void trajstore_resident_gather(
    const long long* __restrict__ params,
    const long long* __restrict__ cols,
    int ncols,
    int B,
    int L,
    unsigned char* out,
    long long flags_offset,
    long long first_row,
    long long end_row,
    long long* __restrict__ params_out)
{
    const long long n = (long long)B * L;
    for (long long b = first_row / L + blockIdx.x; b < B && b * L < end_row; b += gridDim.x) {
        // This call's rows of slice b: j0..j1.
        const long long j0 = first_row > b * L ? first_row - b * L : 0;
        const long long j1 = end_row - b * L < L ? end_row - b * L : L;
        if (j0 >= j1) {
            continue;
        }
        const long long row0 = params[TRAJSTORE_P_ROW0 * (long long)B + b];
        const long long lo = params[TRAJSTORE_P_LO * (long long)B + b];
        const long long hi = params[TRAJSTORE_P_HI * (long long)B + b];
        const long long last = params[TRAJSTORE_P_LAST_STEP * (long long)B + b];
        // Block y of the slice's blocks: column y, and after the last column the flag planes
        // and the parameters' copy (grid-stride: on the CPU one block does them all, in turn).
        for (int c = blockIdx.y; c <= ncols; c += gridDim.y) {
            if (c < ncols) {
                const long long final_row = params[TRAJSTORE_P_FINAL * (long long)B + b];
                const unsigned char* src = (const unsigned char*)(unsigned long long)cols[4 * c];
                const long long w = cols[4 * c + 1];
                const bool derived = cols[4 * c + 2] != 0;
                // `out` plus the column's offset: on the CPU `out` is 0 and the offset an
                // address.
                unsigned char* d =
                    (unsigned char*)((unsigned long long)out + (unsigned long long)cols[4 * c + 3]) +
                    b * L * w;
                // Words where the row and both bases are 4-byte aligned, else bytes.
                if ((w & 3) == 0 && (((unsigned long long)src | (unsigned long long)d) & 3) == 0) {
                    trajstore_copy_run((const unsigned int*)src, (unsigned int*)d, w / 4, L, j0, j1,
                                       lo, hi, row0, derived, last, final_row);
                } else {
                    trajstore_copy_run(src, d, w, L, j0, j1, lo, hi, row0, derived, last,
                                       final_row);
                }
                continue;
            }
            if (params_out != 0 && j0 == 0) {
                for (long long r = threadIdx.x; r < TRAJSTORE_P_ROWS; r += blockDim.x) {
                    params_out[r * B + b] = params[r * B + b];
                }
            }
            unsigned char* f =
                (unsigned char*)((unsigned long long)out + (unsigned long long)flags_offset);
            const long long first = params[TRAJSTORE_P_FIRST * (long long)B + b];
            const bool terminated = params[TRAJSTORE_P_TERMINATED * (long long)B + b] != 0;
            const bool truncated = params[TRAJSTORE_P_TRUNCATED * (long long)B + b] != 0;
            const long long slice_end = params[TRAJSTORE_P_SLICE_END * (long long)B + b];
            for (long long j = j0 + threadIdx.x; j < j1; j += blockDim.x) {
                const long long i = b * L + j;
                const bool is_last = j == last;
                f[i] = j >= lo && j < hi;
                f[n + i] = j == first;
                f[2 * n + i] = is_last;
                f[3 * n + i] = is_last && terminated;
                f[4 * n + i] = is_last && truncated;
                f[5 * n + i] = j == slice_end;
            }
        }
    }
}
