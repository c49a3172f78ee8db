// The compact batch expanded where it lands (src/torch/compact.rs): one kernel per batch writes
// the six [B, L] flag planes from each slice's span and derives every `next_*` column from its
// observation and the slice's tail row, in place of the ~40 small libtorch kernels (and as many
// allocations) the same expansion takes as tensor operations.
//
// One source, two compilers, like resident_gather.cu: NVRTC compiles it on a GPU (in the same
// program, src/torch/kernel.rs) and it runs on the legacy default stream after the batch's copy;
// the build compiles it as C++ (src/torch/expand_host.cc), so the CPU tests hold it to the
// tensor operations' expansion byte for byte.
//
// Inputs, all addresses on the kernel's side: `spans` int32 [B, 3] (each slice's first valid
// position, its valid steps, and its end bits, TRAJSTORE_END_*); per derived column (at most
// TRAJSTORE_EXPAND_TAILS) the observation `obs` [B, R, row bytes] (R = L + lead, a frame
// window's lead frames first), the tail `tail` [B, row bytes] and the output `out` [B, R, row].
// Row r of slice b's output is the tail where r == off + n - 1 + lead and n > 0, the
// observation's row r + 1 where off <= r < off + n - 1 + lead, zeros elsewhere.
// Output `flags`: six [B, L] bool planes: mask, is_first, is_last, terminated, truncated,
// slice_end.
//
// Work items: the B * L flag rows, then each derived column's B * R rows; a group of `lanes`
// threads (a warp on a GPU, one thread on the CPU) per item. Only items first..end are done.

#define TRAJSTORE_END_FIRST 1
#define TRAJSTORE_END_LAST 2
#define TRAJSTORE_END_TERMINATED 4
#define TRAJSTORE_END_TRUNCATED 8
#define TRAJSTORE_EXPAND_TAILS 4

struct TrajstoreExpandTail {
    unsigned long long obs;
    unsigned long long tail;
    unsigned long long out;
    long long rows;
    long long row;
    long long lead;
};

struct TrajstoreExpand {
    unsigned long long spans;
    unsigned long long flags;
    long long b;
    long long l;
    long long ntails;
    TrajstoreExpandTail tails[TRAJSTORE_EXPAND_TAILS];
};

// Copies `w` bytes with `lanes` threads side by side (4 bytes a thread where both ends are
// aligned), or zeros them where `s` is null.
__device__ static void trajstore_expand_row(unsigned char* d, const unsigned char* s, long long w,
                                            int lane, int lanes) {
    if ((w & 3) == 0 && (((unsigned long long)s | (unsigned long long)d) & 3) == 0) {
        unsigned int* d4 = (unsigned int*)d;
        const unsigned int* s4 = (const unsigned int*)s;
        for (long long k = lane; k < w / 4; k += lanes) {
            d4[k] = s ? s4[k] : 0u;
        }
    } else {
        for (long long k = lane; k < w; k += lanes) {
            d[k] = s ? s[k] : (unsigned char)0;
        }
    }
}

extern "C" __global__ void trajstore_expand_compact(TrajstoreExpand a, long long first, long long end) {
    const int lanes = blockDim.x < 32 ? (int)blockDim.x : 32;
    const long long groups = (long long)(blockDim.x / lanes);
    const int lane = (int)(threadIdx.x % lanes);
    const int* spans = (const int*)a.spans;
    const long long steps = a.b * a.l;
    long long items = steps;
    for (int t = 0; t < a.ntails && t < TRAJSTORE_EXPAND_TAILS; ++t) {
        items += a.b * a.tails[t].rows;
    }
    for (long long i = first + (long long)blockIdx.x * groups + threadIdx.x / lanes; i < end && i < items;
         i += (long long)gridDim.x * groups) {
        if (i < steps) {
            if (lane != 0) {
                continue;
            }
            const long long b = i / a.l;
            const long long j = i % a.l;
            const long long off = spans[3 * b], n = spans[3 * b + 1];
            const int bits = spans[3 * b + 2];
            const bool any = n > 0;
            const bool end_ = any && j == off + n - 1;
            unsigned char* f = (unsigned char*)a.flags;
            f[i] = j >= off && j < off + n;
            f[steps + i] = any && j == off && (bits & TRAJSTORE_END_FIRST) != 0;
            f[2 * steps + i] = end_ && (bits & TRAJSTORE_END_LAST) != 0;
            f[3 * steps + i] = end_ && (bits & TRAJSTORE_END_TERMINATED) != 0;
            f[4 * steps + i] = end_ && (bits & TRAJSTORE_END_TRUNCATED) != 0;
            f[5 * steps + i] = end_;
            continue;
        }
        long long k = i - steps;
        int t = 0;
        while (k >= a.b * a.tails[t].rows) {
            k -= a.b * a.tails[t].rows;
            ++t;
        }
        const TrajstoreExpandTail c = a.tails[t];
        const long long b = k / c.rows;
        const long long r = k % c.rows;
        const long long off = spans[3 * b], n = spans[3 * b + 1];
        const long long last = off + n - 1 + c.lead;
        const unsigned char* s = 0;
        if (n > 0 && r == last) {
            s = (const unsigned char*)c.tail + b * c.row;
        } else if (r >= off && r < last && r + 1 < c.rows) {
            s = (const unsigned char*)c.obs + (b * c.rows + r + 1) * c.row;
        }
        trajstore_expand_row((unsigned char*)c.out + k * c.row, s, c.row, lane, lanes);
    }
}
