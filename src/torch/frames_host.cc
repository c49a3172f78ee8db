// The frame decoder (frame_decode.cu) compiled for the CPU: the CUDA built-ins it reads are
// defined here (and in cuda_host.h), and one call decodes a range of a batch's frames as one block
// of one thread. build.rs compiles this file with the `torch` feature; src/torch/frame_decode.rs
// calls it, for the tests that hold the decoder to libzstd's output and for the device decode's
// CPU stand-in.

#include <barrier>
#include <thread>
#include <vector>

#include "cuda_host.h"

namespace {
// A warp's synchronisation: a barrier of the lanes' threads in trajstore_zstd_decode_lanes (the
// tests' emulation of a warp), never called with one lane per frame.
thread_local std::barrier<>* lane_barrier = nullptr;
void __syncwarp() {
    if (lane_barrier != nullptr) {
        lane_barrier->arrive_and_wait();
    }
}
int atomicAdd(int* at, int v) {
    const int old = *at;
    *at = old + v;
    return old;
}
}  // namespace

#include "frame_decode.cu"

extern "C" {
// Bytes of the prepared dictionary the device decoder takes.
unsigned long long trajstore_zstd_dict_size() { return sizeof(ts_zstd_dict); }

// Prepares `src` (a zstd dictionary of `len` bytes) into `out` (trajstore_zstd_dict_size()
// bytes); 0 or a negative TS_E_* code.
int trajstore_zstd_dict_load(const unsigned char* src, long long len, void* out) {
    return ts_zstd_dict_load(static_cast<ts_zstd_dict*>(out), src, len);
}

// Decodes one frame; the decoded size or a negative TS_E_* code.
long long trajstore_zstd_decode_host(const unsigned char* src, long long len, unsigned char* out,
                                     long long cap, const void* dict, const unsigned char* content) {
    static thread_local ts_zstd_state st;
    st.lane = 0;
    st.lanes = 1;
    return ts_zstd_decode(&st, src, len, out, cap, static_cast<const ts_zstd_dict*>(dict),
                          content);
}

// The kernel over frames[3 * first .. 3 * end) of a batch, on the calling thread.
int trajstore_decode_frames_host(const unsigned char* comp, const long long* frames,
                                 long long first, long long end, int codec, const void* dict,
                                 const unsigned char* content, unsigned char* out,
                                 long long frame_len) {
    int errors = 0;
    trajstore_decode_frames(comp, frames + 3 * first, end - first, codec,
                            static_cast<const ts_zstd_dict*>(dict), content, out, frame_len,
                            &errors);
    return errors;
}

// Decodes one frame as a warp of `lanes` lanes would (trajstore_decode_frames_warp): a thread
// per lane, __syncwarp a barrier of them. The decoded size, a negative TS_E_* code, or -100
// where the lanes disagree. What the tests run to check the warp decoder's lanes on the CPU.
long long trajstore_zstd_decode_lanes(const unsigned char* src, long long len, unsigned char* out,
                                      long long cap, const void* dict,
                                      const unsigned char* content, int lanes) {
    std::barrier<> bar(lanes);
    std::vector<long long> got(lanes);
    std::vector<std::thread> threads;
    for (int l = 0; l < lanes; ++l) {
        threads.emplace_back([&, l] {
            lane_barrier = &bar;
            std::vector<ts_zstd_state> st(1);
            st[0].lane = l;
            st[0].lanes = lanes;
            got[l] = ts_zstd_decode(st.data(), src, len, out, cap,
                                    static_cast<const ts_zstd_dict*>(dict), content);
        });
    }
    for (auto& t : threads) {
        t.join();
    }
    for (long long g : got) {
        if (g != got[0]) {
            return -100;
        }
    }
    return got[0];
}
}
