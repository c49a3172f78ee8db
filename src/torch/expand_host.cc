// The compact batch's expansion (expand.cu) compiled for the CPU: the CUDA built-ins it reads are
// defined in cuda_host.h, and one call does a range of work items in order on the calling thread.
// build.rs compiles this file with the `torch` feature; src/torch/kernel.rs calls it where a
// compact batch lies on the CPU, so the CPU tests hold the kernel to the tensor operations.

#include "cuda_host.h"

#include "expand.cu"

extern "C" void trajstore_expand_compact_host(const TrajstoreExpand* args, long long first,
                                              long long end) {
    trajstore_expand_compact(*args, first, end);
}
