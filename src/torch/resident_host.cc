// The resident gather kernel (resident_gather.cu) compiled for the CPU: the CUDA built-ins it
// reads are defined here, and one call runs a range of rows as one block of one thread (the
// kernel's grid-stride loop then visits them in order); src/torch/kernel.rs runs ranges on
// several threads. build.rs compiles this file with
// the `torch` feature; src/torch/kernel.rs calls it for resident mode on the CPU.

#include "cuda_host.h"

#include "resident_gather.cu"

extern "C" void trajstore_resident_gather_host(const long long* params, const long long* cols,
                                               int ncols, int B, int L, unsigned char* out,
                                               long long flags_offset, long long first_row,
                                               long long end_row, long long* params_out) {
    trajstore_resident_gather(params, cols, ncols, B, L, out, flags_offset, first_row, end_row,
                              params_out);
}
