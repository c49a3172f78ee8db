// A zstd frame decoder for frame columns (src/frames.rs), written from RFC 8878, so that a
// batch's compressed frames can be decoded on the GPU (issue 35, part 5): the loader ships the
// frames as stored, tens of bytes each, and one thread per frame decodes it into the batch.
//
// One source, two compilers, like resident_gather.cu: NVRTC compiles it for a GPU at run time
// (src/torch/kernel.rs), and the build compiles it as C++ for the CPU (src/torch/frames_host.cc),
// where the tests decode every frame of real datasets with it and compare with libzstd, bit for
// bit, and check that damaged frames are errors. No headers, no shared memory, no globals.
//
// Scope: exactly what a frame column stores, one zstd frame per value, with or without the
// column's dictionary (its entropy tables, repeat offsets and content). Every read is checked
// against the frame's bytes, every write against the output's, every match against the history
// (output so far, then the dictionary's content): a damaged frame is an error code, never a read
// or a write out of bounds. The content checksum, when a frame has one, is skipped, not checked
// (the CPU's `verify` checks frames with libzstd).

typedef unsigned char ts_u8;
typedef unsigned short ts_u16;
typedef unsigned int ts_u32;
typedef unsigned long long ts_u64;

#define TS_HUF_MAX_LOG 11
#define TS_LL_MAX_LOG 9
#define TS_ML_MAX_LOG 9
#define TS_OF_MAX_LOG 8
#define TS_LL_MAX_SYM 35
#define TS_ML_MAX_SYM 52
#define TS_OF_MAX_SYM 31
#define TS_BLOCK_MAX (128 * 1024)

// Error codes (negative returns), named by src/torch/frames.rs.
#define TS_E_CORRUPT -1   // the bytes are not a valid zstd frame
#define TS_E_TRUNCATED -2 // the frame ends early
#define TS_E_SIZE -3      // it decodes to more bytes than the shape holds
#define TS_E_DICT -4      // it needs a dictionary (or another one) than the column's
#define TS_E_UNSUPPORTED -5

// An FSE decoding table entry: the symbol, the bits to read and the baseline of the next state.
struct ts_fse {
    ts_u16 base;
    ts_u8 bits;
    ts_u8 sym;
};

// A Huffman decoding table entry, indexed by the next `log` bits.
struct ts_huf {
    ts_u8 sym;
    ts_u8 bits;
};

// A dictionary's entropy tables, repeat offsets and content, prepared once on the host
// (trajstore_zstd_dict_load) and copied to the device as it is (plain data, no pointers).
struct ts_zstd_dict {
    ts_u32 id;
    int huf_log; // 0: no literals table
    int ll_log;
    int of_log;
    int ml_log;
    ts_u32 rep[3];
    long long content_offset; // of the content in the dictionary's bytes
    long long content_len;
    struct ts_huf huf[1 << TS_HUF_MAX_LOG];
    struct ts_fse ll[1 << TS_LL_MAX_LOG];
    struct ts_fse of[1 << TS_OF_MAX_LOG];
    struct ts_fse ml[1 << TS_ML_MAX_LOG];
};

// What one frame's decoding keeps between blocks: the tables in use (the dictionary's until a
// block brings its own) and the repeat offsets; and which lane of how many this is. With one
// lane (a thread per frame, and the CPU) the lane does everything. With a warp per frame, every
// lane parses the frame the same way (the same bytes, the same branches, so the warp never
// diverges there) and the lanes share the copies, each writing its own bytes, with a
// __syncwarp() after every copy that a later one may read.
struct ts_zstd_state {
    int lane, lanes;
    const struct ts_huf* huf;
    const struct ts_fse* ll;
    const struct ts_fse* of;
    const struct ts_fse* ml;
    int huf_log, ll_log, of_log, ml_log;
    ts_u32 rep[3];
    struct ts_huf huf_buf[1 << TS_HUF_MAX_LOG];
    struct ts_fse ll_buf[1 << TS_LL_MAX_LOG];
    struct ts_fse of_buf[1 << TS_OF_MAX_LOG];
    struct ts_fse ml_buf[1 << TS_ML_MAX_LOG];
};

__device__ static int ts_highbit(ts_u32 v) {
    int n = -1;
    while (v) {
        v >>= 1;
        ++n;
    }
    return n;
}

// Little-endian bytes i..i+8 of src[0..len), zeros outside it.
__device__ static ts_u64 ts_load64(const ts_u8* src, long long len, long long i) {
    if (i >= 0 && i + 8 <= len) {
        // Byte loads (a frame's bytes have no alignment), without a check each.
        const ts_u8* p = src + i;
        return (ts_u64)p[0] | ((ts_u64)p[1] << 8) | ((ts_u64)p[2] << 16) | ((ts_u64)p[3] << 24) |
               ((ts_u64)p[4] << 32) | ((ts_u64)p[5] << 40) | ((ts_u64)p[6] << 48) |
               ((ts_u64)p[7] << 56);
    }
    ts_u64 v = 0;
    for (int k = 0; k < 8; ++k) {
        const long long j = i + k;
        if (j >= 0 && j < len) {
            v |= (ts_u64)src[j] << (8 * k);
        }
    }
    return v;
}

// A backward bit stream (RFC 8878 4.1): read from the end; the last byte's highest set bit marks
// where the bits start. `left` is the number of bits not yet read; it goes negative when a read
// runs past the start (the missing bits read as zeros), which callers treat as the end.
struct ts_bits {
    const ts_u8* src;
    long long len;
    long long left;
};

__device__ static int ts_bits_init(struct ts_bits* b, const ts_u8* src, long long len) {
    if (len < 1 || src[len - 1] == 0) {
        return TS_E_CORRUPT;
    }
    b->src = src;
    b->len = len;
    b->left = (len - 1) * 8 + ts_highbit(src[len - 1]);
    return 0;
}

// The next n (0..56) bits without consuming them; the first bit is the value's highest.
__device__ static ts_u64 ts_bits_peek(const struct ts_bits* b, int n) {
    if (n == 0) {
        return 0;
    }
    const long long start = b->left - n;
    const ts_u64 mask = (((ts_u64)1) << n) - 1;
    if (start >= 0) {
        return (ts_load64(b->src, b->len, start >> 3) >> (start & 7)) & mask;
    }
    if (b->left <= 0) {
        return 0;
    }
    // Fewer than n bits left: they are the value's high bits, zeros below.
    const ts_u64 have = ts_load64(b->src, b->len, 0) & ((((ts_u64)1) << b->left) - 1);
    return (have << (-start)) & mask;
}

__device__ static ts_u64 ts_bits_read(struct ts_bits* b, int n) {
    const ts_u64 v = ts_bits_peek(b, n);
    b->left -= n;
    return v;
}

// Builds an FSE decoding table of 2^log cells from normalized counts (RFC 8878 4.1.1).
__device__ static int ts_fse_build(struct ts_fse* t, const short* norm, int max_sym, int log) {
    const int size = 1 << log;
    int high = size - 1;
    ts_u16 next[64];
    for (int s = 0; s <= max_sym; ++s) {
        if (norm[s] == -1) {
            if (high < 0) {
                return TS_E_CORRUPT;
            }
            t[high].sym = (ts_u8)s;
            --high;
            next[s] = 1;
        } else {
            next[s] = (ts_u16)(norm[s] < 0 ? 0 : norm[s]);
        }
    }
    const int step = (size >> 1) + (size >> 3) + 3;
    const int mask = size - 1;
    int pos = 0;
    for (int s = 0; s <= max_sym; ++s) {
        for (int i = 0; i < norm[s]; ++i) {
            t[pos].sym = (ts_u8)s;
            do {
                pos = (pos + step) & mask;
            } while (pos > high);
        }
    }
    if (pos != 0) {
        return TS_E_CORRUPT;
    }
    for (int u = 0; u < size; ++u) {
        const int s = t[u].sym;
        const int ns = next[s]++;
        if (ns <= 0) {
            return TS_E_CORRUPT;
        }
        const int bits = log - ts_highbit((ts_u32)ns);
        t[u].bits = (ts_u8)bits;
        t[u].base = (ts_u16)((ns << bits) - size);
    }
    return 0;
}

// Reads an FSE table description (RFC 8878 4.1.1) into norm[0..=*max_sym]; sets *max_sym to the
// last symbol read and *log to the accuracy. Returns the bytes it took.
__device__ static int ts_read_ncount(short* norm, int* max_sym, int* log, const ts_u8* src,
                                     long long len, int max_log) {
    if (len < 1) {
        return TS_E_TRUNCATED;
    }
    for (int s = 0; s <= *max_sym; ++s) {
        norm[s] = 0;
    }
    long long pos = 0;
    const int acc = (int)(src[0] & 15) + 5;
    pos = 4;
    if (acc > max_log) {
        return TS_E_CORRUPT;
    }
    int remaining = (1 << acc) + 1;
    int threshold = 1 << acc;
    int nbits = acc + 1;
    int sym = 0;
    int prev0 = 0;
    while (remaining > 1 && sym <= *max_sym) {
        if (prev0) {
            int r;
            do {
                r = (int)((ts_load64(src, len, pos >> 3) >> (pos & 7)) & 3);
                pos += 2;
                sym += r;
                if (pos > len * 8) {
                    return TS_E_TRUNCATED;
                }
            } while (r == 3);
            if (sym > *max_sym) {
                return TS_E_CORRUPT;
            }
        }
        const int v = (int)((ts_load64(src, len, pos >> 3) >> (pos & 7)) & ((1u << nbits) - 1));
        const int max = (2 * threshold - 1) - remaining;
        int count;
        if ((v & (threshold - 1)) < max) {
            count = v & (threshold - 1);
            pos += nbits - 1;
        } else {
            count = v & (2 * threshold - 1);
            if (count >= threshold) {
                count -= max;
            }
            pos += nbits;
        }
        --count;
        remaining -= count < 0 ? -count : count;
        norm[sym++] = (short)count;
        prev0 = count == 0;
        while (remaining < threshold && threshold > 1) {
            --nbits;
            threshold >>= 1;
        }
    }
    if (remaining != 1 || pos > len * 8) {
        return pos > len * 8 ? TS_E_TRUNCATED : TS_E_CORRUPT;
    }
    *max_sym = sym - 1;
    *log = acc;
    return (int)((pos + 7) >> 3);
}

// Reads a Huffman tree description (RFC 8878 4.2.1) and builds its decoding table. Returns the
// bytes it took.
__device__ static int ts_huf_read(struct ts_huf* table, int* log, const ts_u8* src, long long len) {
    if (len < 1) {
        return TS_E_TRUNCATED;
    }
    ts_u8 w[256];
    int n = 0;
    int used;
    const int head = src[0];
    if (head >= 128) {
        n = head - 127;
        used = 1 + (n + 1) / 2;
        if (used > len) {
            return TS_E_TRUNCATED;
        }
        for (int i = 0; i < n; ++i) {
            const ts_u8 byte = src[1 + i / 2];
            w[i] = (i % 2 == 0) ? (ts_u8)(byte >> 4) : (ts_u8)(byte & 15);
        }
    } else {
        used = 1 + head;
        if (used > len) {
            return TS_E_TRUNCATED;
        }
        short norm[16];
        int max_sym = 15;
        int acc = 0;
        const int c = ts_read_ncount(norm, &max_sym, &acc, src + 1, head, 6);
        if (c < 0) {
            return c;
        }
        struct ts_fse t[64];
        const int e = ts_fse_build(t, norm, max_sym, acc);
        if (e < 0) {
            return e;
        }
        struct ts_bits b;
        if (ts_bits_init(&b, src + 1 + c, head - c) < 0) {
            return TS_E_CORRUPT;
        }
        int s1 = (int)ts_bits_read(&b, acc);
        int s2 = (int)ts_bits_read(&b, acc);
        if (b.left < 0) {
            return TS_E_CORRUPT;
        }
        for (;;) {
            if (n >= 255) {
                return TS_E_CORRUPT;
            }
            w[n++] = t[s1].sym;
            s1 = t[s1].base + (int)ts_bits_read(&b, t[s1].bits);
            if (b.left < 0) {
                w[n++] = t[s2].sym;
                break;
            }
            if (n >= 255) {
                return TS_E_CORRUPT;
            }
            w[n++] = t[s2].sym;
            s2 = t[s2].base + (int)ts_bits_read(&b, t[s2].bits);
            if (b.left < 0) {
                if (n >= 255) {
                    return TS_E_CORRUPT;
                }
                w[n++] = t[s1].sym;
                break;
            }
        }
    }
    ts_u32 total = 0;
    for (int i = 0; i < n; ++i) {
        if (w[i] > TS_HUF_MAX_LOG) {
            return TS_E_CORRUPT;
        }
        total += w[i] ? (1u << (w[i] - 1)) : 0;
    }
    if (total == 0) {
        return TS_E_CORRUPT;
    }
    const int max_bits = ts_highbit(total) + 1;
    if (max_bits > TS_HUF_MAX_LOG) {
        return TS_E_CORRUPT;
    }
    const ts_u32 left = (1u << max_bits) - total;
    if (left & (left - 1)) {
        return TS_E_CORRUPT;
    }
    w[n++] = (ts_u8)(ts_highbit(left) + 1);
    int pos = 0;
    for (int weight = 1; weight <= max_bits; ++weight) {
        for (int s = 0; s < n; ++s) {
            if (w[s] != weight) {
                continue;
            }
            const int cells = 1 << (weight - 1);
            for (int k = 0; k < cells; ++k) {
                table[pos + k].sym = (ts_u8)s;
                table[pos + k].bits = (ts_u8)(max_bits + 1 - weight);
            }
            pos += cells;
        }
    }
    if (pos != (1 << max_bits)) {
        return TS_E_CORRUPT;
    }
    *log = max_bits;
    return used;
}

// Decodes one Huffman stream of `count` literals into out.
__device__ static int ts_huf_stream(const struct ts_huf* t, int log, const ts_u8* src,
                                    long long len, ts_u8* out, long long count, int lane) {
    struct ts_bits b;
    if (ts_bits_init(&b, src, len) < 0) {
        return TS_E_CORRUPT;
    }
    for (long long i = 0; i < count; ++i) {
        const struct ts_huf e = t[ts_bits_peek(&b, log)];
        if (lane == 0) {
            out[i] = e.sym;
        }
        b.left -= e.bits;
    }
    return b.left == 0 ? 0 : TS_E_CORRUPT;
}

// The predefined distributions (RFC 8878 3.1.1.3.2.2).
__device__ static void ts_predefined(int which, short* norm, int* max_sym, int* log) {
    const short ll[36] = {4, 3, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 2, 2,
                          2, 2, 2, 2, 2, 2, 2, 3, 2, 1, 1, 1, 1, 1, -1, -1, -1, -1};
    const short ml[53] = {1, 4, 3, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                          1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                          1, 1, 1, 1, 1, 1, 1, 1, 1, 1, -1, -1, -1, -1, -1, -1, -1};
    const short of[29] = {1, 1, 1, 1, 1, 1, 2, 2, 2, 1, 1, 1, 1, 1, 1,
                          1, 1, 1, 1, 1, 1, 1, 1, 1, -1, -1, -1, -1, -1};
    const short* src = which == 0 ? ll : (which == 1 ? of : ml);
    *max_sym = which == 0 ? 35 : (which == 1 ? 28 : 52);
    *log = which == 1 ? 5 : 6;
    for (int s = 0; s <= *max_sym; ++s) {
        norm[s] = src[s];
    }
}

// Literals length and match length codes: baseline and extra bits (RFC 8878 3.1.1.3.2.1.1).
__device__ static void ts_ll_code(int c, ts_u32* base, int* bits) {
    const ts_u32 b[36] = {0,  1,  2,   3,   4,   5,   6,    7,    8,    9,    10,   11,
                          12, 13, 14,  15,  16,  18,  20,   22,   24,   28,   32,   40,
                          48, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536};
    const ts_u8 n[36] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,  0,  0,  1,  1,
                         1, 1, 2, 2, 3, 3, 4, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    *base = b[c];
    *bits = n[c];
}

__device__ static void ts_ml_code(int c, ts_u32* base, int* bits) {
    if (c < 32) {
        *base = (ts_u32)c + 3;
        *bits = 0;
        return;
    }
    const ts_u32 b[21] = {35,  37,  39,  41,   43,   47,   51,   59,    67,    83,   99,
                          131, 259, 515, 1027, 2051, 4099, 8195, 16387, 32771, 65539};
    const ts_u8 n[21] = {1, 1, 1, 1, 2, 2, 3, 3, 4, 4, 5, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    *base = b[c - 32];
    *bits = n[c - 32];
}

// Reads one of a sequences section's three tables (mode 0..3) into `buf`, or keeps the current
// one (repeat). Returns the bytes it took.
__device__ static int ts_seq_table(int which, int mode, const ts_u8* src, long long len,
                                   struct ts_fse* buf, const struct ts_fse** cur, int* cur_log) {
    const int max_log = which == 1 ? TS_OF_MAX_LOG : TS_LL_MAX_LOG;
    const int max_sym_limit = which == 0 ? TS_LL_MAX_SYM : (which == 1 ? TS_OF_MAX_SYM : TS_ML_MAX_SYM);
    short norm[64];
    int max_sym = max_sym_limit;
    int log = 0;
    int used = 0;
    if (mode == 0) {
        ts_predefined(which, norm, &max_sym, &log);
    } else if (mode == 1) {
        if (len < 1) {
            return TS_E_TRUNCATED;
        }
        if (src[0] > max_sym_limit) {
            return TS_E_CORRUPT;
        }
        buf[0].sym = src[0];
        buf[0].bits = 0;
        buf[0].base = 0;
        *cur = buf;
        *cur_log = 0;
        return 1;
    } else if (mode == 2) {
        used = ts_read_ncount(norm, &max_sym, &log, src, len, max_log);
        if (used < 0) {
            return used;
        }
    } else {
        if (*cur == 0) {
            return TS_E_DICT;
        }
        return 0;
    }
    const int e = ts_fse_build(buf, norm, max_sym, log);
    if (e < 0) {
        return e;
    }
    *cur = buf;
    *cur_log = log;
    return used;
}

// Copies a match of `ml` bytes at distance `offset` to out[op..], from the output so far and,
// before its start, the dictionary's content.
__device__ static int ts_match(const struct ts_zstd_state* st, ts_u8* out, long long op,
                               ts_u64 offset, ts_u64 ml, const ts_u8* content,
                               long long content_len) {
    if (offset == 0 || offset > (ts_u64)op + (ts_u64)content_len) {
        return TS_E_CORRUPT;
    }
    if (st->lanes > 1) {
        // Byte i repeats byte i % offset of the `offset` bytes before op (what a forward copy
        // of an overlapping match makes): every lane reads only bytes before op, written by
        // earlier copies, so the lanes need no order among themselves here.
        const long long o = (long long)offset;
        for (long long i = st->lane; i < (long long)ml; i += st->lanes) {
            const long long from = op - o + (i < o ? i : i % o);
            out[op + i] = from < 0 ? content[content_len + from] : out[from];
        }
        __syncwarp();
        return 0;
    }
    long long i = 0;
    if (offset > (ts_u64)op) {
        // Starts in the dictionary's content.
        const long long back = (long long)(offset - (ts_u64)op);
        long long from = content_len - back;
        for (; i < (long long)ml && from < content_len; ++i, ++from) {
            out[op + i] = content[from];
        }
    }
    if (offset >= 8) {
        // Eight bytes at a time: no byte of a block reads one the block writes.
        ts_u8* d = out + op;
        const ts_u8* s = out + op - (long long)offset;
        for (; i + 8 <= (long long)ml; i += 8) {
            ts_u8 t[8];
            for (int k = 0; k < 8; ++k) {
                t[k] = s[i + k];
            }
            for (int k = 0; k < 8; ++k) {
                d[i + k] = t[k];
            }
        }
    }
    for (; i < (long long)ml; ++i) {
        out[op + i] = out[op + i - (long long)offset];
    }
    return 0;
}

// Copies n bytes forward from `s` to `d`, where `s` is not before `d` (they may overlap): the
// literals, from the frame or from the end of the output.
__device__ static void ts_copy_forward(const struct ts_zstd_state* st, ts_u8* d, const ts_u8* s,
                                       long long n) {
    if (st->lanes > 1) {
        // A round of `lanes` bytes at a time: every lane reads its byte, then every lane writes
        // (`d` may overlap `s` ahead of it; a round's writes land before the next round's reads).
        for (long long base = 0; base < n; base += st->lanes) {
            const long long i = base + st->lane;
            const ts_u8 t = i < n ? s[i] : 0;
            __syncwarp();
            if (i < n) {
                d[i] = t;
            }
            __syncwarp();
        }
        return;
    }
    long long k = 0;
    for (; k + 8 <= n; k += 8) {
        ts_u8 t[8];
        for (int j = 0; j < 8; ++j) {
            t[j] = s[k + j];
        }
        for (int j = 0; j < 8; ++j) {
            d[k + j] = t[j];
        }
    }
    for (; k < n; ++k) {
        d[k] = s[k];
    }
}

// Decodes one compressed block (RFC 8878 3.1.1.3) into out[*op..cap).
__device__ static int ts_block(struct ts_zstd_state* st, const ts_u8* src, long long len,
                               ts_u8* out, long long* op_io, long long cap, const ts_u8* content,
                               long long content_len) {
    long long op = *op_io;
    if (len < 1) {
        return TS_E_TRUNCATED;
    }
    // Literals section.
    const int ltype = src[0] & 3;
    const int sf = (src[0] >> 2) & 3;
    long long lit_len;
    long long p;
    const ts_u8* lits;
    if (ltype == 0 || ltype == 1) {
        long long h;
        if (sf == 0 || sf == 2) {
            h = 1;
            lit_len = src[0] >> 3;
        } else if (sf == 1) {
            h = 2;
            if (len < 2) {
                return TS_E_TRUNCATED;
            }
            lit_len = (src[0] >> 4) + ((long long)src[1] << 4);
        } else {
            h = 3;
            if (len < 3) {
                return TS_E_TRUNCATED;
            }
            lit_len = (src[0] >> 4) + ((long long)src[1] << 4) + ((long long)src[2] << 12);
        }
        if (lit_len > cap - op) {
            return TS_E_SIZE;
        }
        if (ltype == 0) {
            if (h + lit_len > len) {
                return TS_E_TRUNCATED;
            }
            lits = src + h;
            p = h + lit_len;
        } else {
            if (h + 1 > len) {
                return TS_E_TRUNCATED;
            }
            // The run goes at the end of the output, where sequences read it from.
            ts_u8* tail = out + cap - lit_len;
            for (long long i = st->lane; i < lit_len; i += st->lanes) {
                tail[i] = src[h];
            }
            lits = tail;
            p = h + 1;
        }
    } else {
        const int streams = sf == 0 ? 1 : 4;
        const int h = sf < 2 ? 3 : (sf == 2 ? 4 : 5);
        const int bits = sf < 2 ? 10 : (sf == 2 ? 14 : 18);
        if (len < h) {
            return TS_E_TRUNCATED;
        }
        const ts_u64 hdr = ts_load64(src, h, 0);
        lit_len = (long long)((hdr >> 4) & ((1u << bits) - 1));
        const long long comp = (long long)((hdr >> (4 + bits)) & ((1u << bits) - 1));
        if (h + comp > len) {
            return TS_E_TRUNCATED;
        }
        if (lit_len > cap - op || lit_len > TS_BLOCK_MAX) {
            return TS_E_SIZE;
        }
        const ts_u8* q = src + h;
        long long qlen = comp;
        if (ltype == 2) {
            const int used = ts_huf_read(st->huf_buf, &st->huf_log, q, qlen);
            if (used < 0) {
                return used;
            }
            st->huf = st->huf_buf;
            q += used;
            qlen -= used;
        } else if (st->huf == 0) {
            return TS_E_DICT;
        }
        // Decoded at the end of the output, where sequences read them from.
        ts_u8* tail = out + cap - lit_len;
        if (streams == 1) {
            const int e = ts_huf_stream(st->huf, st->huf_log, q, qlen, tail, lit_len, st->lane);
            if (e < 0) {
                return e;
            }
        } else {
            if (qlen < 6) {
                return TS_E_TRUNCATED;
            }
            long long sizes[4];
            sizes[0] = q[0] | (q[1] << 8);
            sizes[1] = q[2] | (q[3] << 8);
            sizes[2] = q[4] | (q[5] << 8);
            sizes[3] = qlen - 6 - sizes[0] - sizes[1] - sizes[2];
            if (sizes[3] < 1) {
                return TS_E_CORRUPT;
            }
            const long long seg = (lit_len + 3) / 4;
            if (3 * seg > lit_len) {
                return TS_E_CORRUPT;
            }
            const ts_u8* s = q + 6;
            for (int k = 0; k < 4; ++k) {
                const long long n = k < 3 ? seg : lit_len - 3 * seg;
                const int e =
                    ts_huf_stream(st->huf, st->huf_log, s, sizes[k], tail + k * seg, n, st->lane);
                if (e < 0) {
                    return e;
                }
                s += sizes[k];
            }
        }
        lits = tail;
        p = h + comp;
    }

    if (st->lanes > 1) {
        __syncwarp(); // the literals in place before any lane copies them
    }

    // Sequences section.
    if (p >= len) {
        return TS_E_TRUNCATED;
    }
    long long nseq;
    const int b0 = src[p];
    if (b0 < 128) {
        nseq = b0;
        p += 1;
    } else if (b0 < 255) {
        if (p + 2 > len) {
            return TS_E_TRUNCATED;
        }
        nseq = ((long long)(b0 - 128) << 8) + src[p + 1];
        p += 2;
    } else {
        if (p + 3 > len) {
            return TS_E_TRUNCATED;
        }
        nseq = src[p + 1] + ((long long)src[p + 2] << 8) + 0x7F00;
        p += 3;
    }
    long long lit_used = 0;
    if (nseq > 0) {
        if (p >= len) {
            return TS_E_TRUNCATED;
        }
        const int modes = src[p++];
        if (modes & 3) {
            return TS_E_CORRUPT;
        }
        int used = ts_seq_table(0, (modes >> 6) & 3, src + p, len - p, st->ll_buf, &st->ll,
                                &st->ll_log);
        if (used < 0) {
            return used;
        }
        p += used;
        used = ts_seq_table(1, (modes >> 4) & 3, src + p, len - p, st->of_buf, &st->of,
                            &st->of_log);
        if (used < 0) {
            return used;
        }
        p += used;
        used = ts_seq_table(2, (modes >> 2) & 3, src + p, len - p, st->ml_buf, &st->ml,
                            &st->ml_log);
        if (used < 0) {
            return used;
        }
        p += used;
        struct ts_bits b;
        if (ts_bits_init(&b, src + p, len - p) < 0) {
            return TS_E_CORRUPT;
        }
        int sll = (int)ts_bits_read(&b, st->ll_log);
        int sof = (int)ts_bits_read(&b, st->of_log);
        int sml = (int)ts_bits_read(&b, st->ml_log);
        for (long long i = 0; i < nseq; ++i) {
            const int ofc = st->of[sof].sym;
            const int llc = st->ll[sll].sym;
            const int mlc = st->ml[sml].sym;
            if (ofc > TS_OF_MAX_SYM || llc > TS_LL_MAX_SYM || mlc > TS_ML_MAX_SYM) {
                return TS_E_CORRUPT;
            }
            const ts_u64 ofv = (((ts_u64)1) << ofc) + ts_bits_read(&b, ofc);
            ts_u32 base;
            int nb;
            ts_ml_code(mlc, &base, &nb);
            const ts_u64 ml = base + ts_bits_read(&b, nb);
            ts_ll_code(llc, &base, &nb);
            const ts_u64 ll = base + ts_bits_read(&b, nb);
            if (b.left < 0) {
                return TS_E_CORRUPT;
            }
            ts_u64 offset;
            if (ofv > 3) {
                offset = ofv - 3;
                st->rep[2] = st->rep[1];
                st->rep[1] = st->rep[0];
                st->rep[0] = (ts_u32)offset;
            } else {
                const int idx = (int)ofv - 1 + (ll == 0 ? 1 : 0);
                if (idx == 0) {
                    offset = st->rep[0];
                } else {
                    offset = idx == 3 ? (ts_u64)st->rep[0] - 1 : st->rep[idx];
                    if (idx > 1) {
                        st->rep[2] = st->rep[1];
                    }
                    st->rep[1] = st->rep[0];
                    st->rep[0] = (ts_u32)offset;
                }
            }
            // The literals, then the match; the literals not yet used stay at the output's end,
            // which neither may reach.
            if (ll > (ts_u64)(lit_len - lit_used) ||
                (ts_u64)op + ll + ml + (ts_u64)(lit_len - lit_used - (long long)ll) > (ts_u64)cap) {
                return TS_E_SIZE;
            }
            ts_copy_forward(st, out + op, lits + lit_used, (long long)ll);
            op += (long long)ll;
            lit_used += (long long)ll;
            const int e = ts_match(st, out, op, offset, ml, content, content_len);
            if (e < 0) {
                return e;
            }
            op += (long long)ml;
            if (i + 1 < nseq) {
                sll = st->ll[sll].base + (int)ts_bits_read(&b, st->ll[sll].bits);
                sml = st->ml[sml].base + (int)ts_bits_read(&b, st->ml[sml].bits);
                sof = st->of[sof].base + (int)ts_bits_read(&b, st->of[sof].bits);
                if (b.left < 0) {
                    return TS_E_CORRUPT;
                }
            }
        }
        if (b.left != 0) {
            return TS_E_CORRUPT;
        }
    } else if (p != len) {
        return TS_E_CORRUPT;
    }
    // The literals after the last sequence.
    const long long rest = lit_len - lit_used;
    if (op + rest > cap) {
        return TS_E_SIZE;
    }
    ts_copy_forward(st, out + op, lits + lit_used, rest);
    *op_io = op + rest;
    return 0;
}

// Decodes one zstd frame (RFC 8878 3.1.1) into out[0..cap). `dict` is null without a dictionary;
// `content` is its content. Returns the decoded size, or a negative TS_E_* code.
__device__ static long long ts_zstd_decode(struct ts_zstd_state* st, const ts_u8* src,
                                           long long len, ts_u8* out, long long cap,
                                           const struct ts_zstd_dict* dict, const ts_u8* content) {
    // st->lane and st->lanes are set by the caller (one lane if they make no sense).
    if (st->lanes < 1 || st->lane < 0 || st->lane >= st->lanes) {
        st->lane = 0;
        st->lanes = 1;
    }
    if (len < 6) {
        return TS_E_TRUNCATED;
    }
    if (ts_load64(src, 4, 0) != 0xFD2FB528ull) {
        return TS_E_CORRUPT;
    }
    const int fhd = src[4];
    const int fcs_flag = fhd >> 6;
    const int single = (fhd >> 5) & 1;
    const int checksum = (fhd >> 2) & 1;
    const int did_flag = fhd & 3;
    if (fhd & 8) {
        return TS_E_CORRUPT;
    }
    long long p = 5 + (single ? 0 : 1);
    const int did_size = did_flag == 3 ? 4 : did_flag;
    const int fcs_size = fcs_flag == 0 ? (single ? 1 : 0) : (1 << fcs_flag);
    if (p + did_size + fcs_size > len) {
        return TS_E_TRUNCATED;
    }
    const ts_u32 did = (ts_u32)(ts_load64(src + p, did_size, 0));
    p += did_size;
    if (did != 0 && (dict == 0 || did != dict->id)) {
        return TS_E_DICT;
    }
    long long fcs = -1;
    if (fcs_size > 0) {
        fcs = (long long)ts_load64(src + p, fcs_size, 0);
        if (fcs_size == 2) {
            fcs += 256;
        }
        if (fcs > cap || fcs < 0) {
            return TS_E_SIZE;
        }
        p += fcs_size;
    }
    const long long content_len = dict ? dict->content_len : 0;
    if (dict) {
        st->huf = dict->huf_log ? dict->huf : 0;
        st->huf_log = dict->huf_log;
        st->ll = dict->ll;
        st->ll_log = dict->ll_log;
        st->of = dict->of;
        st->of_log = dict->of_log;
        st->ml = dict->ml;
        st->ml_log = dict->ml_log;
        st->rep[0] = dict->rep[0];
        st->rep[1] = dict->rep[1];
        st->rep[2] = dict->rep[2];
    } else {
        st->huf = 0;
        st->ll = 0;
        st->of = 0;
        st->ml = 0;
        st->huf_log = st->ll_log = st->of_log = st->ml_log = 0;
        st->rep[0] = 1;
        st->rep[1] = 4;
        st->rep[2] = 8;
    }
    long long op = 0;
    for (;;) {
        if (p + 3 > len) {
            return TS_E_TRUNCATED;
        }
        const ts_u32 bh = (ts_u32)ts_load64(src + p, 3, 0);
        p += 3;
        const int last = bh & 1;
        const int type = (bh >> 1) & 3;
        const long long size = bh >> 3;
        if (size > TS_BLOCK_MAX) {
            return TS_E_CORRUPT;
        }
        if (type == 0) {
            if (p + size > len) {
                return TS_E_TRUNCATED;
            }
            if (op + size > cap) {
                return TS_E_SIZE;
            }
            for (long long k = st->lane; k < size; k += st->lanes) {
                out[op + k] = src[p + k];
            }
            if (st->lanes > 1) {
                __syncwarp();
            }
            op += size;
            p += size;
        } else if (type == 1) {
            if (p + 1 > len) {
                return TS_E_TRUNCATED;
            }
            if (op + size > cap) {
                return TS_E_SIZE;
            }
            for (long long k = st->lane; k < size; k += st->lanes) {
                out[op + k] = src[p];
            }
            if (st->lanes > 1) {
                __syncwarp();
            }
            op += size;
            p += 1;
        } else if (type == 2) {
            if (p + size > len) {
                return TS_E_TRUNCATED;
            }
            const int e = ts_block(st, src + p, size, out, &op, cap, content, content_len);
            if (e < 0) {
                return e;
            }
            p += size;
        } else {
            return TS_E_CORRUPT;
        }
        if (last) {
            break;
        }
    }
    if (checksum) {
        p += 4;
    }
    if (p != len) {
        return p > len ? TS_E_TRUNCATED : TS_E_CORRUPT;
    }
    // The header's content size, where it has one, is what the blocks must have made.
    if (fcs >= 0 && op != fcs) {
        return TS_E_CORRUPT;
    }
    return op;
}

// Prepares a dictionary (RFC 8878 5): its id, entropy tables and repeat offsets into *d; its
// content stays in `src` from d->content_offset. Host code (the loader calls it once), compiled
// for the device too but never launched there. Returns 0 or a negative TS_E_* code.
__device__ static int ts_zstd_dict_load(struct ts_zstd_dict* d, const ts_u8* src, long long len) {
    if (len < 8 || ts_load64(src, 4, 0) != 0xEC30A437ull) {
        return TS_E_DICT;
    }
    d->id = (ts_u32)ts_load64(src + 4, 4, 0);
    long long p = 8;
    int used = ts_huf_read(d->huf, &d->huf_log, src + p, len - p);
    if (used < 0) {
        return TS_E_DICT;
    }
    p += used;
    short norm[64];
    int max_sym = TS_OF_MAX_SYM;
    used = ts_read_ncount(norm, &max_sym, &d->of_log, src + p, len - p, TS_OF_MAX_LOG);
    if (used < 0 || ts_fse_build(d->of, norm, max_sym, d->of_log) < 0) {
        return TS_E_DICT;
    }
    p += used;
    max_sym = TS_ML_MAX_SYM;
    used = ts_read_ncount(norm, &max_sym, &d->ml_log, src + p, len - p, TS_ML_MAX_LOG);
    if (used < 0 || ts_fse_build(d->ml, norm, max_sym, d->ml_log) < 0) {
        return TS_E_DICT;
    }
    p += used;
    max_sym = TS_LL_MAX_SYM;
    used = ts_read_ncount(norm, &max_sym, &d->ll_log, src + p, len - p, TS_LL_MAX_LOG);
    if (used < 0 || ts_fse_build(d->ll, norm, max_sym, d->ll_log) < 0) {
        return TS_E_DICT;
    }
    p += used;
    if (p + 12 > len) {
        return TS_E_DICT;
    }
    for (int k = 0; k < 3; ++k) {
        d->rep[k] = (ts_u32)ts_load64(src + p + 4 * k, 4, 0);
    }
    p += 12;
    d->content_offset = p;
    d->content_len = len - p;
    for (int k = 0; k < 3; ++k) {
        if (d->rep[k] == 0 || (long long)d->rep[k] > d->content_len) {
            return TS_E_DICT;
        }
    }
    return 0;
}

// Decodes frames group, group + groups, ... of a batch (see trajstore_decode_frames) with the
// lanes `st` names: one lane a frame (a thread), or a warp's 32 together.
__device__ static void ts_decode_frames(struct ts_zstd_state* st, const unsigned char* comp,
                                        const long long* frames, long long n, int codec,
                                        const struct ts_zstd_dict* dict,
                                        const unsigned char* content, unsigned char* out,
                                        long long frame_len, int* errors, long long group,
                                        long long groups) {
    for (long long i = group; i < n; i += groups) {
        const long long at = frames[3 * i];
        const long long len = frames[3 * i + 1];
        unsigned char* dst = out + frames[3 * i + 2];
        long long got;
        if (len < 0) {
            for (long long k = st->lane; k < frame_len; k += st->lanes) {
                dst[k] = 0;
            }
            got = frame_len;
        } else if (codec == 0) {
            got = len == frame_len ? len : TS_E_SIZE;
            for (long long k = st->lane; k < frame_len && len == frame_len; k += st->lanes) {
                dst[k] = comp[at + k];
            }
        } else {
            got = ts_zstd_decode(st, comp + at, len, dst, frame_len, dict, content);
        }
        if (got != frame_len && st->lane == 0) {
            atomicAdd(errors, 1);
        }
    }
}

// A batch's frames: frame i's stored bytes are comp[frames[3i] .. frames[3i] + frames[3i + 1]),
// decoded to out[frames[3i + 2] ..] (frame_len bytes); a frame of length -1 writes zeros, and
// with `codec` 0 (none) the stored bytes are the frame. Frames that fail count in *errors, and
// their output holds unspecified bytes. One thread per frame, with its decoder state (9 KiB) in
// the thread's local memory.
extern "C" __global__ void trajstore_decode_frames(const unsigned char* comp,
                                                   const long long* frames, long long n,
                                                   int codec, const struct ts_zstd_dict* dict,
                                                   const unsigned char* content,
                                                   unsigned char* out, long long frame_len,
                                                   int* errors) {
    struct ts_zstd_state st;
    st.lane = 0;
    st.lanes = 1;
    const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long threads = (long long)gridDim.x * blockDim.x;
    ts_decode_frames(&st, comp, frames, n, codec, dict, content, out, frame_len, errors, tid,
                     threads);
}

// trajstore_decode_frames with a warp per frame (32 lanes; blockDim.x a multiple of 32): the
// lanes of a warp decode the same frame together, each copying every 32nd byte, so that a
// warp's stores of a copy are consecutive bytes of one frame (a thread per frame writes 32
// frames 7 KB apart at once). The same arguments; one state per lane, in local memory.
extern "C" __global__ void trajstore_decode_frames_warp(const unsigned char* comp,
                                                        const long long* frames, long long n,
                                                        int codec,
                                                        const struct ts_zstd_dict* dict,
                                                        const unsigned char* content,
                                                        unsigned char* out, long long frame_len,
                                                        int* errors) {
    struct ts_zstd_state st;
    st.lanes = blockDim.x < 32 ? (int)blockDim.x : 32;
    st.lane = (int)(threadIdx.x % st.lanes);
    const long long per_block = (long long)(blockDim.x / st.lanes);
    const long long warp = (long long)blockIdx.x * per_block + threadIdx.x / st.lanes;
    ts_decode_frames(&st, comp, frames, n, codec, dict, content, out, frame_len, errors, warp,
                     (long long)gridDim.x * per_block);
}
