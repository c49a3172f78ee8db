// The resident gather kernel (resident_gather.cu) compiled for the CPU: the CUDA built-ins it
// reads are defined here, and one call runs a range of rows as one block of one thread (the
// kernel's grid-stride loop then visits them in order); src/torch/kernel.rs runs ranges on
// several threads. build.rs compiles this file with
// the `torch` feature; src/torch/kernel.rs calls it for resident mode on the CPU.

namespace {
struct Dim3 {
    unsigned int x, y, z;
};
// Constant here: one block of one thread. The kernel reads them like CUDA's built-ins.
const Dim3 blockIdx = {0, 0, 0};
const Dim3 threadIdx = {0, 0, 0};
const Dim3 blockDim = {1, 1, 1};
const Dim3 gridDim = {1, 1, 1};
}  // namespace

#define __global__

#include "resident_gather.cu"

extern "C" void trajstore_resident_gather_host(const long long* params, const long long* cols,
                                               int ncols, int B, int L, unsigned char* out,
                                               long long flags_offset, long long first_row,
                                               long long end_row) {
    trajstore_resident_gather(params, cols, ncols, B, L, out, flags_offset, first_row, end_row);
}
