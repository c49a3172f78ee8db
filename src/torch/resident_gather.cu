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
// the slice's last valid position.
// Columns, `cols` [ncols, 4] int64: the source tensor's address, the bytes of one row, whether it
// is the derived next observation (rows one step later, the final observation after the last
// step), and the column's byte offset in `out` (on the CPU, `out` is 0 and each column's output
// has an address of its own, as has `flags_offset`).
// Output: column c's [B, L, row] bytes at its offset; from `flags_offset`, six [B, L] bool planes:
// mask, is_first, is_last, terminated, truncated, slice_end. Only rows first_row..end_row of the
// B * L (step j of slice b is row b * L + j) are written: the whole batch on a GPU, a chunk per
// thread on the CPU.

#define TRAJSTORE_P_ROW0 0
#define TRAJSTORE_P_LO 1
#define TRAJSTORE_P_HI 2
#define TRAJSTORE_P_FIRST 3
#define TRAJSTORE_P_LAST_STEP 4
#define TRAJSTORE_P_FINAL 5
#define TRAJSTORE_P_TERMINATED 6
#define TRAJSTORE_P_TRUNCATED 7
#define TRAJSTORE_P_SLICE_END 10

extern "C" __global__ void trajstore_resident_gather(
    const long long* __restrict__ params,
    const long long* __restrict__ cols,
    int ncols,
    int B,
    int L,
    unsigned char* out,
    long long flags_offset,
    long long first_row,
    long long end_row)
{
    // One row (one step of one slice) per group of `lanes` threads: a warp on a GPU, one
    // thread on the CPU.
    const int lanes = blockDim.x < 32 ? (int)blockDim.x : 32;
    const long long groups = (long long)(blockDim.x / lanes);
    const int lane = (int)(threadIdx.x % lanes);
    const long long n = (long long)B * L;
    for (long long i = first_row + (long long)blockIdx.x * groups + threadIdx.x / lanes;
         i < end_row && i < n; i += (long long)gridDim.x * groups) {
        const long long b = i / L;
        const long long j = i % L;
        const long long row0 = params[TRAJSTORE_P_ROW0 * (long long)B + b];
        const long long lo = params[TRAJSTORE_P_LO * (long long)B + b];
        const long long hi = params[TRAJSTORE_P_HI * (long long)B + b];
        const long long last = params[TRAJSTORE_P_LAST_STEP * (long long)B + b];
        const bool valid = j >= lo && j < hi;
        // Invalid positions read row 0, the zeros every uploaded tensor starts with.
        const long long row = valid ? row0 + j : 0;
        const long long next =
            valid ? (j < last ? row0 + j + 1 : params[TRAJSTORE_P_FINAL * (long long)B + b]) : 0;
        for (int c = 0; c < ncols; ++c) {
            const unsigned char* src = (const unsigned char*)(unsigned long long)cols[4 * c];
            const long long w = cols[4 * c + 1];
            const unsigned char* s = src + (cols[4 * c + 2] ? next : row) * w;
            // `out` plus the column's offset: on the CPU `out` is 0 and the offset an address.
            unsigned char* d =
                (unsigned char*)((unsigned long long)out + (unsigned long long)cols[4 * c + 3]) + i * w;
            if ((w & 3) == 0 && (((unsigned long long)s | (unsigned long long)d) & 3) == 0) {
                const unsigned int* s4 = (const unsigned int*)s;
                unsigned int* d4 = (unsigned int*)d;
                for (long long k = lane; k < w / 4; k += lanes) {
                    d4[k] = s4[k];
                }
            } else {
                for (long long k = lane; k < w; k += lanes) {
                    d[k] = s[k];
                }
            }
        }
        if (lane == 0) {
            unsigned char* f =
                (unsigned char*)((unsigned long long)out + (unsigned long long)flags_offset);
            const bool is_last = j == last;
            f[i] = valid;
            f[n + i] = j == params[TRAJSTORE_P_FIRST * (long long)B + b];
            f[2 * n + i] = is_last;
            f[3 * n + i] = is_last && params[TRAJSTORE_P_TERMINATED * (long long)B + b] != 0;
            f[4 * n + i] = is_last && params[TRAJSTORE_P_TRUNCATED * (long long)B + b] != 0;
            f[5 * n + i] = j == params[TRAJSTORE_P_SLICE_END * (long long)B + b];
        }
    }
}
