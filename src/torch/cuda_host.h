// The CUDA built-ins the kernels read, for their C++ copies on the CPU (resident_host.cc,
// frames_host.cc): one block of one thread, so that a kernel's grid-stride loop visits its
// range in order on the calling thread.
#pragma once

namespace {
struct Dim3 {
    unsigned int x, y, z;
};
const Dim3 blockIdx = {0, 0, 0};
const Dim3 threadIdx = {0, 0, 0};
const Dim3 blockDim = {1, 1, 1};
const Dim3 gridDim = {1, 1, 1};
}  // namespace

#define __global__
#define __device__
