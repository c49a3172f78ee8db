// The resident gather kernel (resident_gather.cu) run on the CPU with a GPU's launch geometry:
// every block of a (x, y) grid and every thread of a block, one after the other. The kernel
// has no shared memory and no synchronisation, so any order of its threads is one a GPU may
// run, and the CPU tests check the grid-stride loops, the blocks per column and each thread's
// share of a run as NVRTC's launch lays them out (src/torch/kernel.rs), without a GPU. Only the
// tests call it (src/torch/kernel.rs, its unit tests).

namespace {
struct Dim3 {
    unsigned int x, y, z;
};
thread_local Dim3 blockIdx, threadIdx, blockDim, gridDim;
}  // namespace

// Internal linkage for the kernel's helpers, so that they are not merged with
// resident_host.cc's copies (whose built-ins are constants); the kernel under another name.
#define __global__
#define __device__ static
#define trajstore_resident_gather trajstore_resident_gather_in_grid

#include "resident_gather.cu"

extern "C" void trajstore_resident_gather_grid(unsigned int grid_x, unsigned int grid_y,
                                               unsigned int block, const long long* params,
                                               const long long* cols, int ncols, int B, int L,
                                               unsigned char* out, long long flags_offset,
                                               long long* params_out) {
    gridDim = {grid_x, grid_y, 1};
    blockDim = {block, 1, 1};
    for (unsigned int y = 0; y < grid_y; ++y) {
        for (unsigned int x = 0; x < grid_x; ++x) {
            for (unsigned int t = 0; t < block; ++t) {
                blockIdx = {x, y, 0};
                threadIdx = {t, 0, 0};
                trajstore_resident_gather_in_grid(params, cols, ncols, B, L, out, flags_offset, 0,
                                                  (long long)B * L, params_out);
            }
        }
    }
}
