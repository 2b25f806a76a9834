/* Products of weights held in ggml's blocks, as a GGUF file stores them (included by
 * decode_step.c, which defines vf, from_f16, from_f16x16, hsum, prefetch and store).
 *
 * A weight row (K values) is a run of blocks (attnlm/quant/blocks.py has every layout). Every
 * type here is read the same way: each 32 values of a row ("chunk") are unsigned codes u
 * (0..255) and an affine map per half of 16, w = A u + B:
 *
 *   type  block  bytes  u                       A, B
 *   Q8_0  32     34     q + 128                 d, -128 d
 *   Q4_0  32     18     nibble                  d, -8 d
 *   Q4_1  32     20     nibble                  d, m
 *   Q5_0  32     22     nibble + 16 bit         d, -16 d
 *   Q5_1  32     24     nibble + 16 bit         d, m
 *   Q4_K  256    144    nibble                  d s_j, -dmin t_j   (sub-block j = the chunk)
 *   Q5_K  256    176    nibble + 16 bit         d s_j, -dmin t_j
 *   Q6_K  256    210    4 + 2 bits              d s_h, -32 d s_h   (s per 16 values)
 *   Q2_K  256    84     2 bits                  d s_h, -dmin t_h   (s, t per 16 values)
 *   Q3_K  256    110    2 + 1 bits              d s_h, -4 d s_h    (s per 16 values)
 *   IQ4_NL 32    18     table[nibble] + 128     d, -128 d          (table: 16 int8 values)
 *   IQ4_XS 256   136    table[nibble] + 128     d s_j, -128 d s_j  (s per 32 values)
 *   MXFP4  32    17     table[nibble] + 128     E, -128 E          (E = 2^(e - 128) of the
 *                                                                   E8M0 byte e; table: twice
 *                                                                   E2M1's 16 values)
 *
 * Two ways to multiply (Linear.act: ACT_FLOAT asks for float, anything else integers):
 *  - float activations: each chunk's 32 weights are computed in float (A u + B) and multiplied
 *    into the float activations (the dequantized weights' product, summed in float32);
 *  - integer activations, the default (llama.cpp's way, its numbers: see "integer
 *    activations" below): each row of x quantized as llama.cpp's CPU backend quantizes it
 *    for the weight type (Q8_0, Q8_1 or Q8_K blocks; float16 for F16), the products' sums
 *    in integers (vpdpbusd / vpmaddubsw where the CPU has them) and one float multiply a
 *    block. Measured (under load, one thread, 2048 x 1536, against the float-activation
 *    products of before): faster for every type; the K-quants 1.6-2.6x the former integer
 *    products (one scale per 256 instead of float work per 32).
 * Rows of the output are split among the threads; each row's blocks are read once for up to
 * GG_ROWS rows of x.
 */

enum {
    FMT_F16 = 5, FMT_Q8_0 = 6, FMT_Q4_0 = 7, FMT_Q4_1 = 8, FMT_Q5_0 = 9, FMT_Q5_1 = 10,
    FMT_Q4_K = 11, FMT_Q5_K = 12, FMT_Q6_K = 13, FMT_Q2_K = 14, FMT_Q3_K = 15, FMT_IQ4_NL = 16,
    FMT_IQ4_XS = 17, FMT_MXFP4 = 18
};
enum { ACT_AUTO = 0, ACT_FLOAT = 1, ACT_INT = 2 }; /* Linear.act */

typedef uint8_t vb32 __attribute__((vector_size(32), aligned(1)));   /* 32 codes */
typedef int8_t vs32 __attribute__((vector_size(32), aligned(1)));    /* 32 int8 */
typedef int32_t vi8 __attribute__((vector_size(32), aligned(4)));    /* 8 int32 */
typedef float vf8 __attribute__((vector_size(32), aligned(4)));      /* 8 floats */
typedef int16_t vh32 __attribute__((vector_size(64), aligned(2)));   /* 32 int16 */
typedef int32_t vi16 __attribute__((vector_size(64), aligned(4)));   /* 16 int32 */
typedef uint8_t vb64 __attribute__((vector_size(64), aligned(1)));   /* 64 codes */

#if defined(__AVX512VNNI__) && defined(__AVX512VL__) || defined(__AVXVNNI__)
#define GG_VNNI 1
#else
#define GG_VNNI 0
#endif
#if GG_VNNI || defined(__F16C__) || defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif
#if defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#define GG_NEON 1
#else
#define GG_NEON 0
#endif

/* one float16 (bits) as a float: the CPU's instruction where it has one */
static inline float gg_f16(uint16_t h) {
#ifdef __F16C__
    return _cvtsh_ss(h);
#else
    return from_f16(h);
#endif
}
/* rows of x taken together per weight row (a prefill's): measured 1.1x as fast at 8 as at 4
 * with AVX-512's 32 vector registers, and with AVX2's 16 (its 8-lane kernels: Qwen2.5 0.5B's
 * and 1.5B's prompts, one thread); 4 elsewhere */
#define GG_TILE 16 /* weight rows a tile (see gg_rows_fmt) */
#if defined(__AVX512F__) || defined(__AVX2__)
#define GG_ROWS 8
#else
#define GG_ROWS 4
#endif

/* the elements and bytes of one block of fmt */
static inline int64_t gg_block(int64_t fmt, int64_t *bytes) {
    static const int64_t el[] = {32, 32, 32, 32, 32, 256, 256, 256, 256, 256, 32, 256, 32};
    static const int64_t by[] = {34, 18, 20, 22, 24, 144, 176, 210, 84, 110, 18, 136, 17};
    *bytes = by[fmt - FMT_Q8_0];
    return el[fmt - FMT_Q8_0];
}

/* what a block says before its chunks: d (and m / dmin), the K-quants' scales and mins (8 or
 * 16: per chunk or per half) */
typedef struct {
    float d, m;
    float sc[16], mn[16];
} GgHead;

/* Q3_K's 16 scales (6 bits, less 32) from their 12 bytes s: the low 4 bits of scale j are
 * s[j]'s low nibble (j < 8) or s[j - 8]'s high one, its top 2 bits bits 2 (j / 4) of
 * s[8 + j % 4]; four bytes at a time */
static inline void gg_q3_scales(const uint8_t *s, int16_t *out) {
    uint32_t a[3], u[4];
    memcpy(a, s, 12);
    for (int q = 0; q < 4; q++)
        u[q] = ((a[q & 1] >> (4 * (q >> 1))) & 0x0f0f0f0fu) |
               ((a[2] >> (2 * q)) & 0x03030303u) << 4;
    uint8_t b[16];
    memcpy(b, u, 16);
    for (int j = 0; j < 16; j++) out[j] = (int16_t)(b[j] - 32);
}

/* IQ4_XS's scale of sub-block j (6 bits, less 32): 4 bits from scales_l (b + 4), 2 from
 * scales_h (b + 2) */
static inline int gg_iq4xs_scale(const uint8_t *b, int j) {
    const int low = (b[4 + j / 2] >> (4 * (j & 1))) & 15;
    const int top = (((int)b[2] | (int)b[3] << 8) >> (2 * j)) & 3;
    return (low | top << 4) - 32;
}

/* MXFP4's block scale 2^(e - 128) of its E8M0 byte e, from the bits as ggml builds it: e - 1
 * as the exponent field; e = 0, 1 the subnormals 2^-128, 2^-127 (e = 255: 2^127) */
static inline float gg_e8m0_half(uint8_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline void gg_head(int64_t fmt, const uint8_t *b, GgHead *h) {
    uint16_t v0, v1;
    switch (fmt) {
    case FMT_Q4_1: case FMT_Q5_1:
        memcpy(&v0, b, 2), memcpy(&v1, b + 2, 2);
        h->d = gg_f16(v0), h->m = gg_f16(v1);
        break;
    case FMT_Q4_K: case FMT_Q5_K: {
        memcpy(&v0, b, 2), memcpy(&v1, b + 2, 2);
        const float d = gg_f16(v0), dmin = gg_f16(v1);
        const uint8_t *s = b + 4; /* 12 bytes: see blocks.py's _k_scales */
        for (int j = 0; j < 4; j++) {
            h->sc[j] = d * (float)(s[j] & 63), h->mn[j] = -dmin * (float)(s[j + 4] & 63);
            h->sc[j + 4] = d * (float)((s[j + 8] & 15) | ((s[j] >> 6) << 4));
            h->mn[j + 4] = -dmin * (float)((s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4));
        }
        break;
    }
    case FMT_Q6_K: {
        memcpy(&v0, b + 208, 2);
        const float d = gg_f16(v0);
        for (int j = 0; j < 16; j++) h->sc[j] = d * (float)((const int8_t *)b)[192 + j];
        break;
    }
    case FMT_Q2_K: { /* 16 bytes of scale (low nibble) and min (high), 64 of codes, d, dmin */
        memcpy(&v0, b + 80, 2), memcpy(&v1, b + 82, 2);
        const float d = gg_f16(v0), dmin = gg_f16(v1);
        for (int j = 0; j < 16; j++)
            h->sc[j] = d * (float)(b[j] & 15), h->mn[j] = -dmin * (float)(b[j] >> 4);
        break;
    }
    case FMT_Q3_K: { /* hmask (32 bytes), codes (64), scales (12), d */
        memcpy(&v0, b + 108, 2);
        const float d = gg_f16(v0);
        int16_t sc[16];
        gg_q3_scales(b + 96, sc);
        for (int j = 0; j < 16; j++) h->sc[j] = d * (float)sc[j];
        break;
    }
    case FMT_IQ4_XS: { /* d, scales_h, scales_l (4 bytes), codes (128) */
        memcpy(&v0, b, 2);
        const float d = gg_f16(v0);
        for (int j = 0; j < 8; j++) h->sc[j] = d * (float)gg_iq4xs_scale(b, j);
        break;
    }
    case FMT_MXFP4: /* its E8M0 scale first */
        h->d = gg_e8m0_half(b[0]);
        break;
    default: /* Q8_0, Q4_0, Q5_0, IQ4_NL: d first */
        memcpy(&v0, b, 2);
        h->d = gg_f16(v0);
    }
}

/* 16 bytes' nibbles as 32 codes: the low nibbles, then the high ones */
static inline vb32 gg_nibbles16(const uint8_t *p) {
    const vu8 q = *(const vu8 *)p;
    return __builtin_shufflevector(q & 15, q >> 4, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13,
                                   14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28,
                                   29, 30, 31);
}

/* IQ4_NL's and IQ4_XS's 16 values of a code */
static const int8_t gg_iq4_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                         1,    13,   25,  38,  53,  69,  89,  113};
/* MXFP4's: twice E2M1's (bit 3 the sign) */
static const int8_t gg_mxfp4_values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* 16 bytes' nibbles (gg_nibbles16's order) as their values in `table` (16 int8): one byte
 * shuffle a 16 codes where the CPU has one */
static inline vs32 gg_lut_signed(const int8_t *table, const uint8_t *p) {
    const vb32 n = gg_nibbles16(p);
#if defined(__AVX2__)
    const __m256i t = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)table));
    return (vs32)_mm256_shuffle_epi8(t, (__m256i)n);
#elif GG_NEON
    const int8x16_t t = vld1q_s8(table);
    uint8x16_t q[2];
    memcpy(q, &n, 32);
    const int8x16_t w[2] = {vqtbl1q_s8(t, q[0]), vqtbl1q_s8(t, q[1])};
    vs32 v;
    memcpy(&v, w, 32);
    return v;
#else
    vs32 v;
    for (int i = 0; i < 32; i++) v[i] = table[n[i]];
    return v;
#endif
}

/* IQ4_NL's and IQ4_XS's values of 16 bytes' nibbles */
static inline vs32 gg_iq4_signed(const uint8_t *p) { return gg_lut_signed(gg_iq4_values, p); }

/* the same as a chunk's unsigned codes u = value + 128 */
static inline vb32 gg_iq4_codes(const uint8_t *p) { return (vb32)gg_iq4_signed(p) ^ 0x80; }

/* Q2_K / Q3_K: the 32 codes of chunk c (element 32 c + l: bits 2 (c % 4) of byte l of the
 * codes' half c / 4; Q3_K's third bit, bit c of hmask[l], set where the code is not less 4) */
static inline vb32 gg_k23_codes(const int64_t fmt, const uint8_t *b, int c) {
    const vb32 q = *(const vb32 *)(b + (fmt == FMT_Q2_K ? 16 : 32) + 32 * (c >> 2));
    const vb32 u = (q >> (2 * (c & 3))) & 3;
    if (fmt == FMT_Q2_K) return u;
    return u | (((*(const vb32 *)b >> c) & 1) << 2);
}

/* byte b spread over 8 bytes: bit i of b as byte i (0 or 1); filled when the library loads */
static uint64_t gg_spread[256];
__attribute__((constructor)) static void gg_fill_spread(void) {
    for (int b = 0; b < 256; b++)
        for (int i = 0; i < 8; i++) gg_spread[b] |= (uint64_t)((b >> i) & 1) << (8 * i);
}

/* bit i of the 32-bit qh (4 bytes at p) as 16 in code i (AVX-512: a mask register's bits
 * as bytes in one instruction; else four lookups of the spread table) */
static inline vb32 gg_bits32(const uint8_t *p) {
#if defined(__AVX512BW__) && defined(__AVX512VL__)
    uint32_t m;
    memcpy(&m, p, 4);
    return (vb32)_mm256_movm_epi8(m) & 16;
#elif defined(__AVX2__) /* byte i: qh's byte i / 8, then its bit i % 8 */
    uint32_t m;
    memcpy(&m, p, 4);
    const __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)m),
                                          _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                                            0x0101010101010101, 0));
    const __m256i bit = _mm256_set1_epi64x((int64_t)0x8040201008040201);
    return (vb32)_mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(b, bit), bit),
                                  _mm256_set1_epi8(16));
#endif
    const uint64_t t[4] = {gg_spread[p[0]], gg_spread[p[1]], gg_spread[p[2]], gg_spread[p[3]]};
    vb32 v;
    memcpy(&v, t, 32);
    return v << 4;
}

/* chunk c of block b: its 32 codes and (A, B) of each half */
static inline __attribute__((always_inline)) vb32 gg_chunk(int64_t fmt, const uint8_t *b,
                                                           const GgHead *h, int c, float *A,
                                                           float *B) {
    vb32 u;
    switch (fmt) {
    case FMT_Q8_0:
        A[0] = A[1] = h->d, B[0] = B[1] = -128.0f * h->d;
        return *(const vb32 *)(b + 2) ^ 0x80;
    case FMT_Q4_0:
        A[0] = A[1] = h->d, B[0] = B[1] = -8.0f * h->d;
        return gg_nibbles16(b + 2);
    case FMT_Q4_1:
        A[0] = A[1] = h->d, B[0] = B[1] = h->m;
        return gg_nibbles16(b + 4);
    case FMT_Q5_0:
        A[0] = A[1] = h->d, B[0] = B[1] = -16.0f * h->d;
        return gg_nibbles16(b + 6) | gg_bits32(b + 2);
    case FMT_Q5_1:
        A[0] = A[1] = h->d, B[0] = B[1] = h->m;
        return gg_nibbles16(b + 8) | gg_bits32(b + 4);
    case FMT_Q4_K: case FMT_Q5_K: {
        const int off = fmt == FMT_Q4_K ? 16 : 48;
        const vb32 q = *(const vb32 *)(b + off + 32 * (c >> 1));
        u = c & 1 ? q >> 4 : q & 15;
        if (fmt == FMT_Q5_K) u |= ((*(const vb32 *)(b + 16) >> c) & 1) << 4;
        A[0] = A[1] = h->sc[c], B[0] = B[1] = h->mn[c];
        return u;
    }
    case FMT_Q2_K: case FMT_Q3_K:
        A[0] = h->sc[2 * c], A[1] = h->sc[2 * c + 1];
        if (fmt == FMT_Q2_K) B[0] = h->mn[2 * c], B[1] = h->mn[2 * c + 1];
        else B[0] = -4.0f * A[0], B[1] = -4.0f * A[1];
        return gg_k23_codes(fmt, b, c);
    case FMT_IQ4_NL:
        A[0] = A[1] = h->d, B[0] = B[1] = -128.0f * h->d;
        return gg_iq4_codes(b + 2);
    case FMT_IQ4_XS:
        A[0] = A[1] = h->sc[c], B[0] = B[1] = -128.0f * h->sc[c];
        return gg_iq4_codes(b + 8 + 16 * c);
    case FMT_MXFP4:
        A[0] = A[1] = h->d, B[0] = B[1] = -128.0f * h->d;
        return (vb32)gg_lut_signed(gg_mxfp4_values, b + 1) ^ 0x80;
    default: { /* Q6_K: chunk c = half c / 4 (128 values), quarter c % 4 */
        const int hf = c >> 2, qq = c & 3;
        const vb32 ql = *(const vb32 *)(b + 64 * hf + 32 * (qq & 1));
        const vb32 qh = *(const vb32 *)(b + 128 + 32 * hf);
        u = (qq < 2 ? ql & 15 : ql >> 4) | (((qh >> (2 * qq)) & 3) << 4);
        A[0] = h->sc[2 * c], A[1] = h->sc[2 * c + 1];
        B[0] = -32.0f * A[0], B[1] = -32.0f * A[1];
        return u;
    }
    }
}

/* the sum of 16 lanes as a tree (a chain of 16 dependent additions would cost a row of a
 * short product as much as its blocks) */
static inline float gg_hsum(vf v) {
    const vf8 a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                  __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
    typedef float vf4 __attribute__((vector_size(16)));
    const vf4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
    return (b[0] + b[2]) + (b[1] + b[3]);
}

/* 16 codes (half `hi` of u) as floats */
static inline vf gg_half(vb32 u, int hi) {
    const vu8 h = hi ? __builtin_shufflevector(u, u, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26,
                                               27, 28, 29, 30, 31)
                     : __builtin_shufflevector(u, u, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,
                                               13, 14, 15);
    return __builtin_convertvector(__builtin_convertvector(h, vi), vf);
}

/* -- float activations ------------------------------------------------------------------- */

static inline __attribute__((always_inline)) void gg_row_float(
    const int64_t fmt, const uint8_t *w, int64_t nb, int64_t be, int64_t bb, const float *x,
    int64_t ldx, const int R, float *out) {
    vf acc[GG_ROWS][2];
    for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = (vf){0};
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *b = w + i * bb;
        GgHead h;
        gg_head(fmt, b, &h);
        for (int c = 0; c < be / 32; c++) {
            float A[2], B[2];
            const vb32 u = gg_chunk(fmt, b, &h, c, A, B);
            const vf lo = gg_half(u, 0) * A[0] + B[0], hi = gg_half(u, 1) * A[1] + B[1];
            const int64_t k = i * be + 32 * c;
            for (int r = 0; r < R; r++) {
                acc[r][0] += lo * *(const vf *)(x + r * ldx + k);
                acc[r][1] += hi * *(const vf *)(x + r * ldx + k + 16);
            }
        }
    }
    for (int r = 0; r < R; r++) out[r] = gg_hsum(acc[r][0] + acc[r][1]);
}

/* -- integer activations: x quantized as llama.cpp's CPU backend quantizes it ------------- */

/* llama.cpp multiplies each weight type by activations of its own kind (ggml-cpu's
 * vec_dot_type), and attnlm rounds them the same way (llama.cpp's x86 code):
 *  - "32" (Q8_0 weights, Q4_0, Q5_0, IQ4_NL, MXFP4: Q8_0 blocks; Q4_1, Q5_1: Q8_1, the
 *    same codes and scale and a float16 sum): per block of 32, amax = max |x|, the scale
 *    e = float16(amax / 127), codes a = round(x * (127 / amax)) (ties to even), and Q8_1's
 *    s = float16(amax / 127 * sum(a)) (the float32 scale before its rounding);
 *  - "K" (Q4_K, Q5_K, Q6_K, Q2_K, Q3_K, IQ4_XS: Q8_K blocks): per block of 256, m = the
 *    first x of the largest |x|, iscale = -127 / m, a = min(127, round(iscale x)),
 *    d = 1 / iscale (float32), and the sums of a per 16 ("bsums");
 *  - "H" (F16 weights): x rounded to float16.
 * A product then sums integers where llama.cpp does: a block of 32 adds
 * (d_w e) sum(u a) + B_w S (S = e sum(a), or Q8_1's s); a K-quant block of 256 adds
 * (d_x d_w) sum_j sc_j sum(u a) + (d_x B_w) sum_j mn_j bsums_j, both sums over the block's
 * sub-blocks in integers (Q4_K / Q5_K / Q2_K: B_w = -dmin, Q6_K: -32 d, Q3_K: -4 d; IQ4_XS:
 * its signed values' sums times each sub-block's scale, gg_row_iq4xs). */
enum { GG_FAM_32 = 1, GG_FAM_K = 2, GG_FAM_H = 4 };

/* the activations product L takes (0: float) */
static inline int gg_family(const Linear *L) {
    if (L->act == ACT_FLOAT) return 0;
    switch (L->fmt) {
    case FMT_F16: return GG_FAM_H;
    case FMT_Q4_K: case FMT_Q5_K: case FMT_Q6_K: return GG_FAM_K;
    case FMT_Q2_K: case FMT_Q3_K: case FMT_IQ4_XS: return GG_FAM_K;
    case FMT_Q8_0: case FMT_Q4_0: case FMT_Q4_1: case FMT_Q5_0: case FMT_Q5_1: case FMT_IQ4_NL:
    case FMT_MXFP4:
        return GG_FAM_32;
    default: return 0;
    }
}

/* whether L reads x from xq (quantize_for fills it) */
static inline int gg_int(const Linear *L) { return gg_family(L) != 0; }

/* One row of x in xq (gg_row_bytes(K) bytes; every family at its own offset, filled where a
 * product sharing the input takes it):
 *   [0, K)                "32" codes a (int8)
 *   [K, 2K)               e of each block of 32 in 8 floats (the 8 lanes of its dot product)
 *   [2K, 2.25K)           per block of 32: S0 = e sum(a), S1 = Q8_1's s (floats)
 *   [2.25K, 3.25K)        "K" codes (int8)
 *   then K / 256 floats d, then K / 16 int16 bsums
 *   then K floats: "H", x rounded to float16 */
static inline int64_t gg_off_k(int64_t K) { return 2 * K + K / 4; }
static inline int64_t gg_off_kd(int64_t K) { return 3 * K + K / 4; }
static inline int64_t gg_off_kb(int64_t K) { return gg_off_kd(K) + 4 * (K / 256); }
static inline int64_t gg_off_h(int64_t K) { return gg_off_kb(K) + 2 * (K / 16); }
static inline int64_t gg_row_bytes(int64_t K) { return gg_off_h(K) + 4 * K; }

/* the 8-lane e of each block of 32 of row xr */
static inline const float *gg_ev(const uint8_t *xr, int64_t K) { return (const float *)(xr + K); }

/* S0 (Q8_0's) or S1 (Q8_1's) of block g: gg_sum(...)[2 g] */
static inline const float *gg_sums(const int64_t fmt, const uint8_t *xr, int64_t K) {
    return (const float *)(xr + 2 * K) + (fmt == FMT_Q4_1 || fmt == FMT_Q5_1);
}

#define GG_NOFMA __attribute__((optimize("fp-contract=off")))

/* v rounded to the nearest float16 (ties to even), as a float: the CPU's conversion where it
 * has one (llama.cpp's), else by the bits */
static inline GG_NOFMA float gg_to_f16(float v) {
#ifdef __F16C__
    return _cvtsh_ss(_cvtss_sh(v, 0));
#else
    uint32_t u, s;
    memcpy(&u, &v, 4);
    s = u & 0x80000000u, u ^= s;
    if (u > 0x7f800000u) return v;                 /* NaN */
    if (u >= 0x477ff000u) u = 0x7f800000u;         /* 65520 and more: infinity */
    else if (u >= 0x38800000u) {                   /* a normal float16: 10 bits kept */
        u += 0xfffu + ((u >> 13) & 1);
        u &= ~0x1fffu;
    } else {                                        /* a subnormal one: steps of 2^-24 */
        float a;
        memcpy(&a, &u, 4);
        a = ((a * 0x1p24f + 0x1p23f) - 0x1p23f) * 0x1p-24f;
        memcpy(&u, &a, 4);
    }
    u |= s;
    memcpy(&v, &u, 4);
    return v;
#endif
}

/* the larger of a and b in each lane */
static inline vf gg_vmax(vf a, vf b) {
    const vi m = a > b;
    return (vf)(((vi)a & m) | ((vi)b & ~m));
}

/* the "32" activations of row x */
static GG_NOFMA void gg_quantize_32(const float *x, int64_t K, uint8_t *r) {
    int8_t *a = (int8_t *)r;
    float *ev = (float *)(r + K), *S = (float *)(r + 2 * K);
    const vf magic = (vf){0} + 12582912.0f; /* 1.5 2^23: round to nearest, ties to even */
    for (int64_t g = 0; g < K / 32; g++) {
        const vf x0 = *(const vf *)(x + 32 * g), x1 = *(const vf *)(x + 32 * g + 16);
        const vf b0 = (vf)((vu)x0 & 0x7fffffffu), b1 = (vf)((vu)x1 & 0x7fffffffu);
        const vf b = gg_vmax(b0, b1);
        float amax = 0.0f;
        for (int i = 0; i < 16; i++) amax = b[i] > amax ? b[i] : amax;
        const float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
        const float e = gg_to_f16(d);
        const vf p0 = x0 * id, p1 = x1 * id;
        const vi q0 = __builtin_convertvector((p0 + magic) - magic, vi);
        const vi q1 = __builtin_convertvector((p1 + magic) - magic, vi);
        int sum = 0;
        for (int i = 0; i < 16; i++) {
            a[32 * g + i] = (int8_t)q0[i], a[32 * g + 16 + i] = (int8_t)q1[i];
            sum += q0[i] + q1[i];
        }
        for (int l = 0; l < 8; l++) ev[8 * g + l] = e;
        S[2 * g] = e * (float)sum, S[2 * g + 1] = gg_to_f16(d * (float)sum);
    }
}

/* the "K" activations of row x (K a multiple of 256) */
static GG_NOFMA void gg_quantize_k(const float *x, int64_t K, uint8_t *r) {
    int8_t *a = (int8_t *)(r + gg_off_k(K));
    float *dk = (float *)(r + gg_off_kd(K));
    int16_t *bs = (int16_t *)(r + gg_off_kb(K));
    for (int64_t i = 0; i < K / 256; i++) {
        const float *xi = x + 256 * i;
        vf mx = {0};
        for (int j = 0; j < 256; j += 16) {
            const vf b = (vf)((vu) * (const vf *)(xi + j) & 0x7fffffffu);
            mx = gg_vmax(b, mx);
        }
        float amax = 0.0f;
        for (int l = 0; l < 16; l++) amax = mx[l] > amax ? mx[l] : amax;
        int8_t *ai = a + 256 * i;
        if (amax == 0.0f) {
            dk[i] = 0.0f;
            memset(ai, 0, 256), memset(bs + 16 * i, 0, 32);
            continue;
        }
        int at = 0;
        while (fabsf(xi[at]) != amax) at++;
        const float iscale = -127.0f / xi[at];
        for (int j = 0; j < 256; j += 16) {
            const vf p = *(const vf *)(xi + j) * iscale;
            const vi q = __builtin_convertvector((p + 12582912.0f) - 12582912.0f, vi);
            int s = 0;
            for (int l = 0; l < 16; l++) {
                const int v = q[l] < 127 ? q[l] : 127;
                ai[j + l] = (int8_t)v, s += v;
            }
            bs[16 * i + j / 16] = (int16_t)s;
        }
        dk[i] = 1.0f / iscale;
    }
}

/* rows [m0, m1) of x (M, ldx) quantized into xq for the families fam */
static void gg_quantize(const float *x, int64_t ldx, int64_t K, uint8_t *xq, int64_t m0,
                        int64_t m1, int fam) {
    const int64_t rb = gg_row_bytes(K);
    for (int64_t m = m0; m < m1; m++) {
        const float *xm = x + m * ldx;
        uint8_t *r = xq + m * rb;
        if (fam & GG_FAM_32) gg_quantize_32(xm, K, r);
        if ((fam & GG_FAM_K) && K % 256 == 0) gg_quantize_k(xm, K, r);
        if (fam & GG_FAM_H) {
            float *h = (float *)(r + gg_off_h(K));
            for (int64_t k = 0; k < K; k++) h[k] = gg_to_f16(xm[k]);
        }
    }
}

#if GG_NEON
/* the sums of w a over each 4 consecutive int8 of 16 (|w a| <= 2^14: int16 products exact
 * where there is no sdot) */
static inline int32x4_t gg_sdot16(int8x16_t w, int8x16_t a) {
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(vdupq_n_s32(0), w, a);
#else
    const int16x8_t lo = vmull_s8(vget_low_s8(w), vget_low_s8(a));
    const int16x8_t hi = vmull_s8(vget_high_s8(w), vget_high_s8(a));
    return vpaddq_s32(vpaddlq_s16(lo), vpaddlq_s16(hi));
#endif
}

/* two registers of 4 int32 as one vector of 8 */
static inline vi8 gg_cat2x4(int32x4_t a, int32x4_t b) {
    typedef int32_t vq32 __attribute__((vector_size(16)));
    return __builtin_shufflevector((vq32)a, (vq32)b, 0, 1, 2, 3, 4, 5, 6, 7);
}

/* four registers of 4 int32 as one vector of 16 */
static inline vi16 gg_cat4x4(const int32x4_t *s) {
    const vi8 a = gg_cat2x4(s[0], s[1]), b = gg_cat2x4(s[2], s[3]);
    return __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}
#endif

/* sums of u a over each 4 consecutive codes (8 lanes): lanes 0-3 the first half, 4-7 the second */
static inline vi8 gg_dot(vb32 u, const int8_t *a) {
#if GG_VNNI
    const __m256i ua = (__m256i)u, aa = _mm256_loadu_si256((const __m256i *)a);
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return (vi8)_mm256_dpbusd_epi32(_mm256_setzero_si256(), ua, aa);
#else
    return (vi8)_mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), ua, aa);
#endif
#elif defined(__AVX2__)
    /* pmaddubsw's pair sums saturate at 2^15: exact when every code is below 128; else the
     * codes' top bits (128 or 0, pair sums in [-2^15, 2^15)) are summed apart */
    const __m256i ua = (__m256i)u, aa = _mm256_loadu_si256((const __m256i *)a);
    const __m256i one = _mm256_set1_epi16(1);
    if (!_mm256_movemask_epi8(ua)) return (vi8)_mm256_madd_epi16(_mm256_maddubs_epi16(ua, aa), one);
    const __m256i top = _mm256_and_si256(ua, _mm256_set1_epi8((char)0x80));
    const __m256i lo = _mm256_maddubs_epi16(_mm256_xor_si256(ua, top), aa);
    return (vi8)_mm256_add_epi32(_mm256_madd_epi16(lo, one),
                                 _mm256_madd_epi16(_mm256_maddubs_epi16(top, aa), one));
#elif GG_NEON /* 16 codes a register (gg_sdot16, signed): codes of 128 or more as
                * u a = (u - 128) a + 128 a */
    uint8x16_t uq[2];
    memcpy(uq, &u, 32);
    const int high = vmaxvq_u8(vorrq_u8(uq[0], uq[1])) >= 128;
    int32x4_t s[2];
    for (int q = 0; q < 2; q++) {
        const int8x16_t aq = vld1q_s8(a + 16 * q);
        s[q] = gg_sdot16(vreinterpretq_s8_u8(high ? veorq_u8(uq[q], vdupq_n_u8(0x80)) : uq[q]), aq);
        if (high) s[q] = vaddq_s32(s[q], vshlq_n_s32(gg_sdot16(vdupq_n_s8(1), aq), 7));
    }
    return gg_cat2x4(s[0], s[1]);
#else
    const vh32 p = __builtin_convertvector(u, vh32) * __builtin_convertvector(*(const vs32 *)a, vh32);
    const vi16 q = __builtin_convertvector(
                       __builtin_shufflevector(p, p, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22,
                                               24, 26, 28, 30), vi16) +
                   __builtin_convertvector(
                       __builtin_shufflevector(p, p, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23,
                                               25, 27, 29, 31), vi16);
    return __builtin_shufflevector(q, q, 0, 2, 4, 6, 8, 10, 12, 14) +
           __builtin_shufflevector(q, q, 1, 3, 5, 7, 9, 11, 13, 15);
#endif
}

/* the same over 64 codes (two chunks): 16 lanes, the second chunk's in lanes 8-15 */
static inline vi16 gg_dot64(vb64 u, const int8_t *a) {
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
    const __m512i ua = (__m512i)u, aa = _mm512_loadu_si512((const void *)a);
    return (vi16)_mm512_dpbusd_epi32(_mm512_setzero_si512(), ua, aa);
#else
    const vb32 lo = __builtin_shufflevector(u, u, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13,
                                            14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26,
                                            27, 28, 29, 30, 31);
    const vb32 hi = __builtin_shufflevector(u, u, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43,
                                            44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56,
                                            57, 58, 59, 60, 61, 62, 63);
    const vi8 a0 = gg_dot(lo, a), a1 = gg_dot(hi, a + 32);
    return __builtin_shufflevector(a0, a1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
#endif
}

/* the offset of a 32-block type's codes (w = d (u - bias)): their integer sums with x's codes
 * are taken as llama.cpp takes them, sum((u - bias) a) = sum(u a) - sum(bias a); 0 for Q4_1
 * and Q5_1, whose minimum m adds m s */
/* acc + a b in 8 lanes, fused where the CPU can (as llama.cpp's kernels fuse it). Fused by
 * name, not left to the compiler's contraction: where acc is itself a product, GCC may fuse
 * that one instead (ARM, whose builds take the generic code, flipped codes so) */
static inline vf8 gg_fma8(vf8 a, vf8 b, vf8 acc) {
#if defined(__FMA__)
    return (vf8)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)acc);
#elif defined(__ARM_FEATURE_FMA)
    for (int i = 0; i < 8; i++) acc[i] = __builtin_fmaf(a[i], b[i], acc[i]);
    return acc;
#else
    return a * b + acc;
#endif
}

/* a b + c, fused where the CPU can (as llama.cpp's kernels are compiled) */
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
#define GG_FMA(a, b, c) fmaf(a, b, c)
#else
#define GG_FMA(a, b, c) ((a) * (b) + (c))
#endif

/* the totals of v[0..R)'s lanes (exact), v[r]'s in lane r (R a constant once inlined): one
 * vector's lanes added as a tree, or pairs, fours, then eights across the 8 vectors at once */
static inline vi8 gg_isum8x8(const vi8 *v);
static inline __attribute__((always_inline)) vi8 gg_totals(const vi8 *v, const int R) {
    if (R > 1) return gg_isum8x8(v);
    const vi8 a = v[0] + __builtin_shufflevector(v[0], v[0], 4, 5, 6, 7, 0, 1, 2, 3);
    const vi8 b = a + __builtin_shufflevector(a, a, 2, 3, 0, 1, 6, 7, 4, 5);
    return b + __builtin_shufflevector(b, b, 1, 0, 3, 2, 5, 4, 7, 6);
}

/* the totals of v[0..7]'s lanes (exact), v[r]'s in lane r: pairs, then fours, then eights
 * added across the 8 vectors at once */
static inline vi8 gg_isum8x8(const vi8 *v) {
    vi8 u[4], t[2];
    for (int r = 0; r < 4; r++)
        u[r] = __builtin_shufflevector(v[2 * r], v[2 * r + 1], 0, 8, 2, 10, 4, 12, 6, 14) +
               __builtin_shufflevector(v[2 * r], v[2 * r + 1], 1, 9, 3, 11, 5, 13, 7, 15);
    for (int r = 0; r < 2; r++)
        t[r] = __builtin_shufflevector(u[2 * r], u[2 * r + 1], 0, 1, 8, 9, 4, 5, 12, 13) +
               __builtin_shufflevector(u[2 * r], u[2 * r + 1], 2, 3, 10, 11, 6, 7, 14, 15);
    return __builtin_shufflevector(t[0], t[1], 0, 1, 2, 3, 8, 9, 10, 11) +
           __builtin_shufflevector(t[0], t[1], 4, 5, 6, 7, 12, 13, 14, 15);
}

static inline float gg_hsum8(vf8 v) {
    typedef float vf4 __attribute__((vector_size(16)));
    const vf4 b = __builtin_shufflevector(v, v, 0, 1, 2, 3) + __builtin_shufflevector(v, v, 4, 5, 6, 7);
    return (b[0] + b[2]) + (b[1] + b[3]);
}

/* Q8_0, Q4_0, Q5_0 as llama.cpp adds their blocks (ggml_vec_dot and its sgemm on x86): per
 * block the 8 integer lane sums (lane l: codes 4l..4l+3) times d (the weights' scale times
 * x's) added to 8 float sums (fused), block after block; the 8 sums added as a tree at the
 * end (gg_hsum8). Two rows' sums share a vector (lanes 0-7 and 8-15): gg_acc2 adds the
 * blocks g, g + 1 of rows a and b (fa, fb: their lane sums, block g in lanes 0-7; da, db the
 * scale products likewise). */
#define GG_CAT16(p, q)                                                                         \
    __builtin_shufflevector(p, q, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
static inline vf gg_lo2(vf a, vf b) {
    return __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);
}
static inline vf gg_hi2(vf a, vf b) {
    return __builtin_shufflevector(a, b, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29,
                                   30, 31);
}
static inline vf gg_acc2(vf fa, vf fb, vf da, vf db, vf acc) {
    acc = vfma(gg_lo2(da, db), gg_lo2(fa, fb), acc);
    return vfma(gg_hi2(da, db), gg_hi2(fa, fb), acc);
}
/* the sums of row 2i (lanes 0-7) and 2i + 1 (8-15) of a shared vector as two floats */
static inline float gg_half8(vf v, int hi) {
    return gg_hsum8(hi ? __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15)
                       : __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7));
}

static inline int gg_bias(const int64_t fmt) {
    return fmt == FMT_Q8_0 || fmt == FMT_IQ4_NL ? 128 : fmt == FMT_Q4_0 ? 8
         : fmt == FMT_Q5_0 ? 16 : 0;
}

/* the integer sums of 64 codes u (two blocks of 32) with x's codes a, less bias sum(a) */
static inline vi16 gg_dot64b(vb64 u, const int8_t *a, int bias) {
#if GG_NEON
    if (bias) { /* the signed codes u - bias (int8, exact) against a: one sdot per 16 */
        typedef int8_t vs64 __attribute__((vector_size(64), aligned(1)));
        const vs64 w = (vs64)(u - (uint8_t)bias);
        int32x4_t s[4];
        for (int q = 0; q < 4; q++) {
            int8x16_t wq;
            memcpy(&wq, (const int8_t *)&w + 16 * q, 16);
            s[q] = gg_sdot16(wq, vld1q_s8(a + 16 * q));
        }
        return gg_cat4x4(s);
    }
#endif
    const vi16 d = gg_dot64(u, a);
    return bias ? d - gg_dot64((vb64){0} + (uint8_t)bias, a) : d;
}

#define GG_CAT64(p, q)                                                                          \
    __builtin_shufflevector(p, q, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, \
                            18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34,  \
                            35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51,  \
                            52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63)

/* chunks g, g + 1 (64 codes, the scales of their halves in A, offsets in B) into the sums;
 * Q8_0, Q4_0, Q5_0 (A is d) in llama.cpp's order, rows in pairs (gg_acc2) */
static inline __attribute__((always_inline)) void gg_pair(
    const int64_t fmt, vb32 u0, vb32 u1, const float *A0, const float *B0, const float *A1,
    const float *B1, int64_t g, const uint8_t *xq, int64_t rb, int64_t K, const int R, vf *acc,
    float *off) {
    const vb64 u = GG_CAT64(u0, u1);
    const vf Av = {A0[0], A0[0], A0[0], A0[0], A0[1], A0[1], A0[1], A0[1],
                   A1[0], A1[0], A1[0], A1[0], A1[1], A1[1], A1[1], A1[1]};
    const int bias = gg_bias(fmt);
    vf f[GG_ROWS], dv[GG_ROWS];
    for (int r = 0; r < R; r++) {
        const uint8_t *xr = xq + r * rb;
        const float *ev = gg_ev(xr, K) + 8 * g, *S = gg_sums(fmt, xr, K) + 2 * g;
        f[r] = __builtin_convertvector(gg_dot64b(u, (const int8_t *)xr + 32 * g, bias), vf);
        dv[r] = Av * *(const vf *)ev;
        if (!bias) acc[r] += f[r] * dv[r], off[r] += B0[0] * S[0] + B1[0] * S[2];
    }
    if (bias)
        for (int r = 0; r < R; r += 2)
            acc[r / 2] = gg_acc2(f[r], r + 1 < R ? f[r + 1] : f[r], dv[r],
                                 r + 1 < R ? dv[r + 1] : dv[r], acc[r / 2]);
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
/* Blocks b0, b1 of Q8_0, Q4_0 or Q5_0 (AVX-512): their signed codes w = u - bias as |w| (aw:
 * b0's in bytes 0-31, b1's in 32-63), the mask of the negative ones, and their d (Av: b0's in
 * lanes 0-7, b1's in 8-15), straight from the bytes */
static inline __attribute__((always_inline)) void gg_signed2(const int64_t fmt, const uint8_t *b0,
                                                             const uint8_t *b1, __m512i *awp,
                                                             __mmask64 *negp, vf *Avp) {
    uint16_t h0, h1;
    memcpy(&h0, b0, 2), memcpy(&h1, b1, 2);
    const float d0 = gg_f16(h0), d1 = gg_f16(h1);
    const vf Av = {d0, d0, d0, d0, d0, d0, d0, d0, d1, d1, d1, d1, d1, d1, d1, d1};
    __m512i aw;
    __mmask64 neg;
    if (fmt == FMT_Q8_0) {
        const __m512i sw = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(b0 + 2))),
            _mm256_loadu_si256((const __m256i *)(b1 + 2)), 1);
        neg = _mm512_movepi8_mask(sw), aw = _mm512_abs_epi8(sw);
    } else {
        const int at = fmt == FMT_Q5_0 ? 6 : 2; /* the nibbles: each block's low ones, high */
        const __m256i q = _mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(b0 + at))),
            _mm_loadu_si128((const __m128i *)(b1 + at)), 1);
        const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(q),
                                                _mm256_srli_epi16(q, 4), 1);
        const __m512i nib = _mm512_and_si512(
            _mm512_permutexvar_epi64(_mm512_set_epi64(7, 6, 3, 2, 5, 4, 1, 0), both),
            _mm512_set1_epi8(15));
        if (fmt == FMT_Q4_0) {
            neg = _mm512_cmplt_epu8_mask(nib, _mm512_set1_epi8(8));
            aw = _mm512_abs_epi8(_mm512_sub_epi8(nib, _mm512_set1_epi8(8)));
        } else if (fmt == FMT_IQ4_NL) { /* the nibbles' values from the table */
            const __m512i w = _mm512_shuffle_epi8(
                _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)gg_iq4_values)), nib);
            neg = _mm512_movepi8_mask(w), aw = _mm512_abs_epi8(w);
        } else { /* Q5_0: w = nib where the fifth bit is set, else nib - 16 */
            uint32_t q0, q1;
            memcpy(&q0, b0 + 2, 4), memcpy(&q1, b1 + 2, 4);
            neg = _cvtu64_mask64(~((uint64_t)q1 << 32 | q0));
            aw = _mm512_mask_sub_epi8(nib, neg, _mm512_set1_epi8(16), nib);
        }
    }
    *awp = aw, *negp = neg, *Avp = Av;
}

/* Blocks b0, b1 (g, g + 1 of one weight row) against R rows of x: in each row x's codes
 * negated where w < 0 and one vpdpbusd (the sums of w a, as llama.cpp's) */
static inline __attribute__((always_inline)) void gg_pair_signed(
    const int64_t fmt, const uint8_t *b0, const uint8_t *b1, int64_t g, const uint8_t *xq,
    int64_t rb, int64_t K, const int R, vf *acc) {
    __m512i aw;
    __mmask64 neg;
    vf Av;
    gg_signed2(fmt, b0, b1, &aw, &neg, &Av);
    const __m512i zero = _mm512_setzero_si512();
    vf f[GG_ROWS], dv[GG_ROWS];
    for (int r = 0; r < R; r++) {
        const uint8_t *xr = xq + r * rb;
        const __m512i a = _mm512_loadu_si512((const void *)(xr + 32 * g));
        const __m512i as = _mm512_mask_sub_epi8(a, neg, zero, a);
        f[r] = __builtin_convertvector((vi16)_mm512_dpbusd_epi32(zero, aw, as), vf);
        dv[r] = Av * *(const vf *)(gg_ev(xr, K) + 8 * g);
    }
    for (int r = 0; r < R; r += 2) /* rows in pairs (gg_acc2; an odd last one with itself) */
        acc[r / 2] = gg_acc2(f[r], r + 1 < R ? f[r + 1] : f[r], dv[r],
                             r + 1 < R ? dv[r + 1] : dv[r], acc[r / 2]);
}

/* Two weight rows w0, w1 of Q8_0, Q4_0 or Q5_0 against R rows of x in llama.cpp's order
 * without moving lanes: block g of both rows in one vector (w0's in lanes 0-7, w1's in 8-15)
 * against x's block g twice, so that each half adds block after block into its 8 lanes */
static inline __attribute__((always_inline)) void gg_row2_signed(
    const int64_t fmt, const uint8_t *w0, const uint8_t *w1, int64_t nb, int64_t bb,
    const uint8_t *xq, int64_t K, const int R, float *out0, float *out1) {
    const int64_t rb = gg_row_bytes(K);
    const __m512i zero = _mm512_setzero_si512();
    vf acc[GG_ROWS];
    for (int r = 0; r < R; r++) acc[r] = (vf){0};
    for (int64_t g = 0; g < nb; g++) {
        __m512i aw;
        __mmask64 neg;
        vf Av;
        gg_signed2(fmt, w0 + g * bb, w1 + g * bb, &aw, &neg, &Av);
        for (int r = 0; r < R; r++) {
            const uint8_t *xr = xq + r * rb;
            const __m512i a = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(xr + 32 * g)));
            const __m512i as = _mm512_mask_sub_epi8(a, neg, zero, a);
            const vf f = __builtin_convertvector((vi16)_mm512_dpbusd_epi32(zero, aw, as), vf);
            const vf e = (vf)_mm512_broadcast_f32x8(_mm256_loadu_ps(gg_ev(xr, K) + 8 * g));
            acc[r] = vfma(Av * e, f, acc[r]);
        }
    }
    for (int r = 0; r < R; r++) out0[r] = gg_half8(acc[r], 0), out1[r] = gg_half8(acc[r], 1);
}
#define GG_TWO 1 /* two weight rows a vector (gg_row2_signed) */
#elif defined(__AVX2__)
/* block b of Q8_0, Q4_0 or Q5_0 as its 32 signed codes w = u - bias, and its d */
static inline __attribute__((always_inline)) __m256i gg_signed1(const int64_t fmt,
                                                                const uint8_t *b, float *d) {
    uint16_t h;
    memcpy(&h, b, 2);
    *d = gg_f16(h);
    if (fmt == FMT_Q8_0) return _mm256_loadu_si256((const __m256i *)(b + 2));
    if (fmt == FMT_IQ4_NL) return (__m256i)gg_iq4_signed(b + 2);
    const __m128i q = _mm_loadu_si128((const __m128i *)(b + (fmt == FMT_Q4_0 ? 2 : 6)));
    const __m256i nib = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q),
                                         _mm256_set1_epi8(15));
    if (fmt == FMT_Q4_0) return _mm256_sub_epi8(nib, _mm256_set1_epi8(8));
    return _mm256_sub_epi8(_mm256_or_si256(nib, (__m256i)gg_bits32(b + 2)), _mm256_set1_epi8(16));
}

/* the sums of |w| (sign of w) a over each 4 codes: w a, exact (|w| <= 128, |a| <= 127) */
static inline vf8 gg_wdot(__m256i aw, __m256i w, __m256i a) {
    const __m256i as = _mm256_sign_epi8(a, w);
#if GG_VNNI
    return (vf8)_mm256_cvtepi32_ps(_mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), aw, as));
#else
    const __m256i p = _mm256_maddubs_epi16(aw, as);
    return (vf8)_mm256_cvtepi32_ps(_mm256_madd_epi16(p, _mm256_set1_epi16(1)));
#endif
}

/* AVX2's gg_row2_signed: the same sums, each weight row's 8 lanes a vector of its own */
static inline __attribute__((always_inline)) void gg_row2_signed(
    const int64_t fmt, const uint8_t *w0, const uint8_t *w1, int64_t nb, int64_t bb,
    const uint8_t *xq, int64_t K, const int R, float *out0, float *out1) {
    const int64_t rb = gg_row_bytes(K);
    vf8 acc0[GG_ROWS], acc1[GG_ROWS];
    for (int r = 0; r < R; r++) acc0[r] = acc1[r] = (vf8){0};
    for (int64_t g = 0; g < nb; g++) {
        float d0, d1;
        const __m256i s0 = gg_signed1(fmt, w0 + g * bb, &d0), a0 = _mm256_abs_epi8(s0);
        const __m256i s1 = gg_signed1(fmt, w1 + g * bb, &d1), a1 = _mm256_abs_epi8(s1);
        for (int r = 0; r < R; r++) {
            const uint8_t *xr = xq + r * rb;
            const __m256i a = _mm256_loadu_si256((const __m256i *)(xr + 32 * g));
            const vf8 e = *(const vf8 *)(gg_ev(xr, K) + 8 * g);
            acc0[r] = gg_fma8(d0 * e, gg_wdot(a0, s0, a), acc0[r]);
            acc1[r] = gg_fma8(d1 * e, gg_wdot(a1, s1, a), acc1[r]);
        }
    }
    for (int r = 0; r < R; r++) out0[r] = gg_hsum8(acc0[r]), out1[r] = gg_hsum8(acc1[r]);
}
#define GG_TWO 1
#else
#define GG_TWO 0
#endif

/* One weight row of 32-blocks against R rows of quantized x, two blocks at a time (64 codes:
 * one 512-bit dot product where the CPU has them); an odd last block alone. Q8_0, Q4_0, Q5_0
 * in llama.cpp's order, two rows a vector (gg_acc2; an odd last row in both halves). */
static inline __attribute__((always_inline)) void gg_row_int(
    const int64_t fmt, const uint8_t *w, int64_t nb, int64_t bb, const uint8_t *xq, int64_t K,
    const int R, float *out) {
    const int64_t rb = gg_row_bytes(K);
    vf acc[GG_ROWS];
    float off[GG_ROWS];
    for (int r = 0; r < R; r++) acc[r] = (vf){0}, off[r] = 0.0f;
    GgHead h0, h1;
    float A0[2], B0[2], A1[2], B1[2];
    int64_t i = 0;
    for (; i + 1 < nb; i += 2) {
        const uint8_t *b0 = w + i * bb, *b1 = b0 + bb;
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
        if (gg_bias(fmt)) {
            gg_pair_signed(fmt, b0, b1, i, xq, rb, K, R, acc);
            continue;
        }
#endif
        gg_head(fmt, b0, &h0), gg_head(fmt, b1, &h1);
        const vb32 u0 = gg_chunk(fmt, b0, &h0, 0, A0, B0);
        const vb32 u1 = gg_chunk(fmt, b1, &h1, 0, A1, B1);
        gg_pair(fmt, u0, u1, A0, B0, A1, B1, i, xq, rb, K, R, acc, off);
    }
    if (i < nb) { /* an odd last block of 32 */
        const uint8_t *b = w + i * bb;
        gg_head(fmt, b, &h0);
        const vb32 u = gg_chunk(fmt, b, &h0, 0, A0, B0);
        vf8 t[GG_ROWS], dd[GG_ROWS];
        for (int r = 0; r < R; r++) {
            const uint8_t *xr = xq + r * rb;
            const int8_t *ar = (const int8_t *)xr + 32 * i;
            vi8 di = gg_dot(u, ar);
            if (gg_bias(fmt)) di -= gg_dot((vb32){0} + (uint8_t)gg_bias(fmt), ar);
            t[r] = __builtin_convertvector(di, vf8);
            dd[r] = (vf8){0} + A0[0] * gg_ev(xr, K)[8 * i];
            if (gg_bias(fmt)) continue;
            const vf8 z = {0}; /* fused, as every other block (explicitly: contraction through
                                * the shuffle differs between builds) */
            off[r] += B0[0] * gg_sums(fmt, xr, K)[2 * i];
            acc[r] = vfma(GG_CAT16(t[r], z), GG_CAT16(dd[r], z), acc[r]);
        }
        if (gg_bias(fmt))
            for (int r = 0; r < R; r += 2) {
                const int r1 = r + 1 < R ? r + 1 : r;
                acc[r / 2] = vfma(GG_CAT16(dd[r], dd[r1]), GG_CAT16(t[r], t[r1]), acc[r / 2]);
            }
    }
    for (int r = 0; r < R; r++)
        out[r] = gg_bias(fmt) ? gg_half8(acc[r / 2], r & 1) : off[r] + gg_hsum(acc[r]);
}

/* One row of quantized x against NW weight rows of 32-blocks (w, w + rowb, ...; NW a
 * constant where inlined): what a decoding step's single row takes, the activations' codes
 * and scales read once for all NW rows. */
static inline __attribute__((always_inline)) void gg_rows_x1(
    const int64_t fmt, const uint8_t *w, int64_t rowb, const int NW, int64_t nb, int64_t bb,
    const uint8_t *xq, int64_t K, float *out) {
    const float *ev = gg_ev(xq, K), *S = gg_sums(fmt, xq, K);
    const int8_t *a = (const int8_t *)xq;
    vf acc[4];
    float off[4];
    for (int j = 0; j < NW; j++) acc[j] = (vf){0}, off[j] = 0.0f;
    float A0[2], B0[2], A1[2], B1[2];
    for (int64_t g = 0; g < nb; g += 2) {
        const int odd = g + 1 == nb; /* an odd last block of 32 */
        vf f[4], dv[4];
        vf8 t[4], dd[4];
        for (int j = 0; j < NW; j++) {
            const uint8_t *b0 = w + j * rowb + g * bb, *b1 = b0 + bb;
            GgHead h0, h1;
            gg_head(fmt, b0, &h0);
            const vb32 u0 = gg_chunk(fmt, b0, &h0, 0, A0, B0);
            if (odd) { /* x's codes past the row are not there: 32 of them alone */
                vi8 di = gg_dot(u0, a + 32 * g);
                if (gg_bias(fmt)) di -= gg_dot((vb32){0} + (uint8_t)gg_bias(fmt), a + 32 * g);
                t[j] = __builtin_convertvector(di, vf8), dd[j] = (vf8){0} + A0[0] * ev[8 * g];
                if (gg_bias(fmt)) continue;
                const vf8 z = {0}; /* fused, as in gg_row_int */
                acc[j] = vfma(GG_CAT16(t[j], z), GG_CAT16(dd[j], z), acc[j]);
                off[j] += B0[0] * S[2 * g];
                continue;
            }
            gg_head(fmt, b1, &h1);
            const vb32 u1 = gg_chunk(fmt, b1, &h1, 0, A1, B1);
            const vi16 di = gg_dot64b(GG_CAT64(u0, u1), a + 32 * g, gg_bias(fmt));
            const vf Av = {A0[0], A0[0], A0[0], A0[0], A0[0], A0[0], A0[0], A0[0],
                           A1[0], A1[0], A1[0], A1[0], A1[0], A1[0], A1[0], A1[0]};
            f[j] = __builtin_convertvector(di, vf), dv[j] = Av * *(const vf *)(ev + 8 * g);
            if (gg_bias(fmt)) continue;
            acc[j] += f[j] * dv[j];
            off[j] += B0[0] * S[2 * g] + B1[0] * S[2 * g + 2];
        }
        if (gg_bias(fmt)) /* weight rows in pairs, as gg_row_int's rows of x */
            for (int j = 0; j < NW; j += 2) {
                const int j1 = j + 1 < NW ? j + 1 : j;
                acc[j / 2] = odd ? vfma(GG_CAT16(dd[j], dd[j1]), GG_CAT16(t[j], t[j1]), acc[j / 2])
                                 : gg_acc2(f[j], f[j1], dv[j], dv[j1], acc[j / 2]);
            }
    }
    for (int j = 0; j < NW; j++)
        out[j] = gg_bias(fmt) ? gg_half8(acc[j / 2], j & 1) : off[j] + gg_hsum(acc[j]);
}

/* -- K-quants against Q8_K activations ----------------------------------------------------- */

typedef int16_t vh16 __attribute__((vector_size(32), aligned(2)));  /* 16 int16 */
typedef int8_t vs16 __attribute__((vector_size(16), aligned(1)));   /* 16 int8 */
typedef int16_t vh64 __attribute__((vector_size(128), aligned(2))); /* 64 int16 */
typedef int32_t vi32 __attribute__((vector_size(128), aligned(4))); /* 32 int32 */

/* acc + the sums of u a s over each 4 consecutive codes of 64 (16 lanes): s (int16) holds
 * the scale of each pair of codes (llama.cpp's pmaddubsw then pmaddwd: u a < 2^15 per pair);
 * AVX2 without AVX-512, and NEON, take gg_kdot8 instead */
static inline vi16 gg_kdot(vi16 acc, vb64 u, const int8_t *a, vh32 s) {
#if defined(__AVX512BW__)
    const __m512i p = _mm512_maddubs_epi16((__m512i)u, _mm512_loadu_si512((const void *)a));
#if defined(__AVX512VNNI__)
    return (vi16)_mm512_dpwssd_epi32((__m512i)acc, p, (__m512i)s);
#else
    return acc + (vi16)_mm512_madd_epi16(p, (__m512i)s);
#endif
#else
    typedef int8_t vs64 __attribute__((vector_size(64), aligned(1)));
    const vh64 p = __builtin_convertvector(u, vh64) *
                   __builtin_convertvector(*(const vs64 *)a, vh64);
    const vh32 q = __builtin_shufflevector(p, p, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24,
                       26, 28, 30, 32, 34, 36, 38, 40, 42, 44, 46, 48, 50, 52, 54, 56, 58, 60,
                       62) +
                   __builtin_shufflevector(p, p, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25,
                       27, 29, 31, 33, 35, 37, 39, 41, 43, 45, 47, 49, 51, 53, 55, 57, 59, 61,
                       63);
    const vi32 t = __builtin_convertvector(q, vi32) * __builtin_convertvector(s, vi32);
    return acc + __builtin_shufflevector(t, t, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24,
                                         26, 28, 30) +
           __builtin_shufflevector(t, t, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29,
                                   31);
#endif
}

/* b[2i] m[2i] + b[2i+1] m[2i+1] (8 int32) */
static inline vi8 gg_madd16(vh16 b, vh16 m) {
#if defined(__AVX2__)
    return (vi8)_mm256_madd_epi16((__m256i)b, (__m256i)m);
#else
    const vi16 t = __builtin_convertvector(b, vi16) * __builtin_convertvector(m, vi16);
    return __builtin_shufflevector(t, t, 0, 2, 4, 6, 8, 10, 12, 14) +
           __builtin_shufflevector(t, t, 1, 3, 5, 7, 9, 11, 13, 15);
#endif
}

/* where vectors are 8 lanes (AVX2 without AVX-512) or 4 (NEON), a block's 64-code vectors
 * are kept as their two halves: GCC moves a 64-byte vector's halves byte by byte there */
#if defined(__AVX2__) && !defined(__AVX512BW__) || GG_NEON
#define GG_K8 1
#else
#define GG_K8 0
#endif

/* one K-quant block of 256, decoded once for every row of x */
typedef struct {
#if GG_K8
    vb32 u[8];   /* the codes, 32 a vector (chunk i: u[2i], u[2i + 1]) */
    vh16 s[8];   /* the scale of each pair of codes of u[i] (int16) */
#else
    vb64 u[4];   /* the codes, 64 a vector (chunks 2i, 2i + 1) */
    vh32 s[4];   /* the scale of each pair of codes of u[i] (int16) */
#endif
    vh16 m;      /* what multiplies x's 16 bsums: Q4_K / Q5_K each chunk's min twice, Q2_K its
                  * 16 mins, Q6_K and Q3_K the 16 scales */
    float d, dm; /* d, and the bsums' factor: -dmin, -32 d or -4 d */
} GgK;

#if GG_K8
/* gg_kdot's sums over chunks c .. c + n - 1 of k with lanes l and l + 8 added (exact:
 * integers) */
static inline vi8 gg_kdot8(const GgK *k, int c, int n, const int8_t *a) {
#if GG_NEON /* codes below 64: int8 as they are; a lane's 4 codes share their scale */
    int32x4_t acc[2] = {vdupq_n_s32(0), vdupq_n_s32(0)};
    for (; n > 0; n--, c++, a += 64)
        for (int hv = 0; hv < 2; hv++) { /* the chunk's halves of 32: u[2c + hv] */
            int8x16_t uq[2];
            int16x8_t sq[2];
            memcpy(uq, &k->u[2 * c + hv], 32), memcpy(sq, &k->s[2 * c + hv], 32);
            for (int q = 0; q < 2; q++) { /* lanes 4q..4q+3: pairs 8q, 8q + 2, ... of s */
                const int32x4_t sc = vmovl_s16(vget_low_s16(vuzp1q_s16(sq[q], sq[q])));
                acc[q] = vmlaq_s32(acc[q], gg_sdot16(uq[q], vld1q_s8(a + 32 * hv + 16 * q)), sc);
            }
        }
    return gg_cat2x4(acc[0], acc[1]);
#else
    __m256i acc = _mm256_setzero_si256();
    for (; n > 0; n--, c++, a += 64) {
        const __m256i p0 = _mm256_maddubs_epi16((__m256i)k->u[2 * c],
                                                _mm256_loadu_si256((const __m256i *)a));
        const __m256i p1 = _mm256_maddubs_epi16((__m256i)k->u[2 * c + 1],
                                                _mm256_loadu_si256((const __m256i *)(a + 32)));
        const __m256i s0 = _mm256_madd_epi16(p0, (__m256i)k->s[2 * c]);
        acc = _mm256_add_epi32(acc, _mm256_add_epi32(
                                        s0, _mm256_madd_epi16(p1, (__m256i)k->s[2 * c + 1])));
    }
    return (vi8)acc;
#endif
}
#else
/* one block's integer sums against the 256 codes a: gg_kdot over its four chunks of 64 */
static inline vi16 gg_kdot256(const GgK *k, const int8_t *a) {
    vi16 s = {0};
    for (int c = 0; c < 4; c++) s = gg_kdot(s, k->u[c], a + 64 * c, k->s[c]);
    return s;
}
#endif

/* w[i] for i < 16 at lanes: each of v's 16 values spread over 2 (j = 2) or 8 pair lanes */
#define GG_SPREAD2(v, i) __builtin_shufflevector(v, v, i, i, i, i, i, i, i, i, i, i, i, i, i, i, \
    i, i, i + 1, i + 1, i + 1, i + 1, i + 1, i + 1, i + 1, i + 1, i + 1, i + 1, i + 1, i + 1,     \
    i + 1, i + 1, i + 1, i + 1)
#define GG_SPREAD4(v, i) __builtin_shufflevector(v, v, i, i, i, i, i, i, i, i, i + 1, i + 1,     \
    i + 1, i + 1, i + 1, i + 1, i + 1, i + 1, i + 2, i + 2, i + 2, i + 2, i + 2, i + 2, i + 2,    \
    i + 2, i + 3, i + 3, i + 3, i + 3, i + 3, i + 3, i + 3, i + 3)
/* GG_SPREAD4 in halves of 16 lanes (GG_K8): v[i] 8 times, then v[i + 1] 8 times */
#define GG_SPREAD8(v, i) __builtin_shufflevector(v, v, i, i, i, i, i, i, i, i, i + 1, i + 1,   \
    i + 1, i + 1, i + 1, i + 1, i + 1, i + 1)

/* the codes' offset of a K-quant whose scales multiply it too (w = d s (u - bias)), taken off
 * in integers through the bsums: Q6_K's 32, Q3_K's 4; 0 where a min of its own does (-dmin t) */
static inline int gg_kbias(const int64_t fmt) {
    return fmt == FMT_Q6_K ? 32 : fmt == FMT_Q3_K ? 4 : 0;
}

static inline __attribute__((always_inline)) void gg_kblock(const int64_t fmt, const uint8_t *b,
                                                            GgK *k) {
    uint16_t h0, h1;
    if (fmt == FMT_Q2_K || fmt == FMT_Q3_K) { /* scales (and Q2_K's mins) per 16 codes */
        int16_t sc[16], mn[16];
        if (fmt == FMT_Q2_K) {
            memcpy(&h0, b + 80, 2), memcpy(&h1, b + 82, 2);
            k->d = gg_f16(h0), k->dm = -gg_f16(h1);
            for (int j = 0; j < 16; j++) sc[j] = b[j] & 15, mn[j] = b[j] >> 4;
        } else {
            memcpy(&h0, b + 108, 2);
            k->d = gg_f16(h0), k->dm = -4.0f * k->d;
            gg_q3_scales(b + 96, sc);
            memcpy(mn, sc, 32);
        }
        vh16 v;
        memcpy(&v, sc, 32), memcpy(&k->m, mn, 32);
#if GG_K8
        for (int c = 0; c < 8; c++) k->u[c] = gg_k23_codes(fmt, b, c);
        k->s[0] = GG_SPREAD8(v, 0), k->s[1] = GG_SPREAD8(v, 2);
        k->s[2] = GG_SPREAD8(v, 4), k->s[3] = GG_SPREAD8(v, 6);
        k->s[4] = GG_SPREAD8(v, 8), k->s[5] = GG_SPREAD8(v, 10);
        k->s[6] = GG_SPREAD8(v, 12), k->s[7] = GG_SPREAD8(v, 14);
#else
        for (int i = 0; i < 4; i++)
            k->u[i] = GG_CAT64(gg_k23_codes(fmt, b, 2 * i), gg_k23_codes(fmt, b, 2 * i + 1));
        k->s[0] = GG_SPREAD4(v, 0), k->s[1] = GG_SPREAD4(v, 4);
        k->s[2] = GG_SPREAD4(v, 8), k->s[3] = GG_SPREAD4(v, 12);
#endif
        return;
    }
    if (fmt == FMT_Q6_K) {
        memcpy(&h0, b + 208, 2);
        const vh16 sc = __builtin_convertvector(*(const vs16 *)(b + 192), vh16);
#if GG_K8
        k->s[0] = GG_SPREAD8(sc, 0), k->s[1] = GG_SPREAD8(sc, 2);
        k->s[2] = GG_SPREAD8(sc, 4), k->s[3] = GG_SPREAD8(sc, 6);
        k->s[4] = GG_SPREAD8(sc, 8), k->s[5] = GG_SPREAD8(sc, 10);
        k->s[6] = GG_SPREAD8(sc, 12), k->s[7] = GG_SPREAD8(sc, 14);
#else
        k->s[0] = GG_SPREAD4(sc, 0), k->s[1] = GG_SPREAD4(sc, 4);
        k->s[2] = GG_SPREAD4(sc, 8), k->s[3] = GG_SPREAD4(sc, 12);
#endif
        k->m = sc;
        k->d = gg_f16(h0), k->dm = -32.0f * k->d;
        for (int hf = 0; hf < 2; hf++) {
            const vb32 qh = *(const vb32 *)(b + 128 + 32 * hf);
#if GG_K8 /* no shifts by lane: each half its own */
            typedef uint16_t vw16 __attribute__((vector_size(32), aligned(2)));
            const vb32 l0 = *(const vb32 *)(b + 64 * hf), l1 = *(const vb32 *)(b + 64 * hf + 32);
            const vw16 h = (vw16)qh;
            k->u[4 * hf] = (l0 & 15) | ((vb32)(h << 4) & 48);
            k->u[4 * hf + 1] = (l1 & 15) | ((vb32)(h << 2) & 48);
            k->u[4 * hf + 2] = (l0 >> 4) | (qh & 48);
            k->u[4 * hf + 3] = (l1 >> 4) | ((vb32)(h >> 2) & 48);
#else
            const vb64 ql = *(const vb64 *)(b + 64 * hf);
            /* qh twice, shifted per half by 16-bit lanes (a byte's bits that cross into its
             * neighbour are masked off) */
            typedef uint16_t vw32 __attribute__((vector_size(64), aligned(2)));
            const vw32 dq = (vw32)GG_CAT64(qh, qh);
            const vw32 l42 = {4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4,
                              2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2};
            const vw32 r02 = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                              2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2};
            k->u[2 * hf] = (ql & 15) | ((vb64)(dq << l42) & 48);
            k->u[2 * hf + 1] = (ql >> 4) | ((vb64)(dq >> r02) & 48);
#endif
        }
        return;
    }
    memcpy(&h0, b, 2), memcpy(&h1, b + 2, 2);
    k->d = gg_f16(h0), k->dm = -gg_f16(h1);
    /* the 12 bytes of 6-bit scales and mins s[0..11] (blocks.py's _k_scales has the layout)
     * as 16 bytes, scales 0-7 then mins 0-7, in vector lanes: scale j < 4 is s[j] & 63, j >= 4
     * (s[j + 4] & 15) | (s[j - 4] >> 6) << 4; min j < 4 s[j + 4] & 63, j >= 4
     * (s[j + 4] >> 4) | (s[j] >> 6) << 4 */
    const vu8 v = *(const vu8 *)b; /* s[j] = v[4 + j] */
    const vu8 X = __builtin_shufflevector(v, v, 4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13,
                                          14, 15);
    const vu8 Y = __builtin_shufflevector(v, v, 4, 5, 6, 7, 4, 5, 6, 7, 8, 9, 10, 11, 8, 9, 10,
                                          11);
    const vu8 low = {63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 15, 15, 15, 15};
    const vu8 top = {0, 0, 0, 0, 48, 48, 48, 48, 0, 0, 0, 0, 48, 48, 48, 48};
    const vu8 Xs = __builtin_shufflevector(X, X >> 4, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 28,
                                           29, 30, 31);
    const vu8 sb = (Xs & low) | ((Y >> 2) & top);
    const vh16 sm = __builtin_convertvector(sb, vh16);
#if GG_K8
    for (int j = 0; j < 8; j++) k->s[j] = (vh16){0} + sm[j];
#else
    k->s[0] = GG_SPREAD2(sm, 0), k->s[1] = GG_SPREAD2(sm, 2);
    k->s[2] = GG_SPREAD2(sm, 4), k->s[3] = GG_SPREAD2(sm, 6);
#endif
    k->m = __builtin_shufflevector(sm, sm, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14,
                                   15, 15);
    const int off = fmt == FMT_Q4_K ? 16 : 48;
    for (int i = 0; i < 4; i++) {
        /* the 32 bytes twice, the second copy shifted by 4 (one variable shift of 16-bit
         * lanes: 3 instructions where the two halves took 5) */
        const vb32 q = *(const vb32 *)(b + off + 32 * i);
#if GG_K8 /* no shifts by lane: each half its own */
        typedef uint16_t vw16 __attribute__((vector_size(32), aligned(2)));
        vb32 lo = q & 15, hi = (vb32)((vw16)q >> 4) & 15;
        if (fmt == FMT_Q5_K) {
            const vw16 qh = *(const vw16 *)(b + 16);
            lo |= (vb32)((qh >> (2 * i)) & 0x0101) << 4;
            hi |= (vb32)((qh >> (2 * i + 1)) & 0x0101) << 4;
        }
        k->u[2 * i] = lo, k->u[2 * i + 1] = hi;
#else
        typedef uint16_t vw32 __attribute__((vector_size(64), aligned(2)));
        const vw32 by = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                         4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4};
        vb64 u = (vb64)((vw32)GG_CAT64(q, q) >> by) & 15;
        if (fmt == FMT_Q5_K) { /* bits 2i and 2i + 1 of qh, the same way */
            const vb32 qh = *(const vb32 *)(b + 16);
            const uint16_t s0 = (uint16_t)(2 * i), s1 = (uint16_t)(2 * i + 1);
            const vw32 at = {s0, s0, s0, s0, s0, s0, s0, s0, s0, s0, s0, s0, s0, s0, s0, s0,
                             s1, s1, s1, s1, s1, s1, s1, s1, s1, s1, s1, s1, s1, s1, s1, s1};
            u |= (vb64)((((vw32)GG_CAT64(qh, qh) >> at) & 0x0101) << 4);
        }
        k->u[i] = u;
#endif
    }
}

/* gg_isum8x8 on both 8-lane halves of 8 vectors at once: lanes 0-7 the totals of v[r]'s
 * lanes 0-7 (lane r), lanes 8-15 of its lanes 8-15 */
static inline vi16 gg_isum16x8(const vi16 *v) {
    vi16 u[4], t[2];
    for (int r = 0; r < 4; r++)
        u[r] = __builtin_shufflevector(v[2 * r], v[2 * r + 1], 0, 16, 2, 18, 4, 20, 6, 22, 8, 24,
                                       10, 26, 12, 28, 14, 30) +
               __builtin_shufflevector(v[2 * r], v[2 * r + 1], 1, 17, 3, 19, 5, 21, 7, 23, 9, 25,
                                       11, 27, 13, 29, 15, 31);
    for (int r = 0; r < 2; r++)
        t[r] = __builtin_shufflevector(u[2 * r], u[2 * r + 1], 0, 1, 16, 17, 4, 5, 20, 21, 8, 9,
                                       24, 25, 12, 13, 28, 29) +
               __builtin_shufflevector(u[2 * r], u[2 * r + 1], 2, 3, 18, 19, 6, 7, 22, 23, 10, 11,
                                       26, 27, 14, 15, 30, 31);
    return __builtin_shufflevector(t[0], t[1], 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25,
                                   26, 27) +
           __builtin_shufflevector(t[0], t[1], 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29,
                                   30, 31);
}

/* chunk c's bsums x mins of rows 0-7 (lane r) from pm (see gg_krow's mode 4) */
#define GG_CM(c)                                                                                   __builtin_shufflevector(                                                                           __builtin_shufflevector(pm[0], pm[1], 2 * c, 2 * c + 1, 8 + 2 * c, 9 + 2 * c, 0, 0, 0, 0),         __builtin_shufflevector(pm[2], pm[3], 2 * c, 2 * c + 1, 8 + 2 * c, 9 + 2 * c, 0, 0, 0, 0),         0, 1, 2, 3, 8, 9, 10, 11)
static inline __attribute__((always_inline)) vi8 gg_chunk_mins(const vi8 *pm, int c) {
    return c == 0 ? GG_CM(0) : c == 1 ? GG_CM(1) : c == 2 ? GG_CM(2) : GG_CM(3);
}

/* One K-quant weight row against R rows of x in Q8_K blocks: each block decoded once, its
 * codes and scales kept in registers for the R rows; per row and block the integer sums of
 * the sub-blocks times their scales in 16 lanes (gg_kdot) and of the bsums times the mins (or
 * Q6_K's scales) in 8. Their float arithmetic is llama.cpp's, bit for bit, in both of its
 * kernels for these types (its tiled K-quant product, which it takes for 8 rows of x or more;
 * else ggml_vec_dot_q*_K_q8_K) and for Q4_K's repacked rows:
 *  - vec_dot: the lanes folded to 8 (lane l: codes 4l..4l+3 of every 32; Q6_K's 32 bsums x
 *    scales taken off each), converted and multiplied into 8 float sums by d dx (fused);
 *    Q4_K / Q5_K's bsums x mins summed to one integer a block, multiplied by -dmin dx and
 *    added (fused) into a sum of their own; the 8 sums added as a tree, then that sum;
 *  - tiled: per block the integer totals s1 (the scaled sums; Q6_K's 32 bsums x scales taken
 *    off) and s2 (bsums x mins), v = s1 d - dmin s2 (the product d s1 rounded, the other
 *    fused), the row's sum += v dx (fused), block after block;
 *  - repacked (Q4_K, whose matrices llama.cpp's CPU backend repacks in rows of 8 and
 *    multiplies with its own kernels): per block (`mode` 2, ggml_gemv_q4_K_8x8_q8_K) or per
 *    chunk of 64 values (`mode` 4, ggml_gemm_q4_K_8x8_q8_K) a += s1 (d dx) and b += s2 (dmin
 *    dx) (each fused), the row's value a - b.
 * `mode`: 0 vec_dot, 1 tiled, 2 and 4 repacked. */
static inline __attribute__((always_inline)) void gg_krow(
    const int64_t fmt, const uint8_t *w, int64_t nb, int64_t bb, const uint8_t *xq, int64_t K,
    const int R, const int mode, float *out) {
    const int64_t rb = gg_row_bytes(K), ok = gg_off_k(K), od = gg_off_kd(K), ob = gg_off_kb(K);
    vf8 acc[GG_ROWS];          /* vec_dot: each row's 8 lane sums */
    vf8 sum = {0}, mins = {0}; /* row r's in lane r */
    for (int r = 0; r < R; r++) acc[r] = (vf8){0};
    if (mode == 4) { /* Q4_K's repacked rows in a prompt: a fused sum per chunk of 64 */
        for (int64_t i = 0; i < nb; i++) {
            GgK k;
            gg_kblock(fmt, w + i * bb, &k);
            vi8 mm[8] = {{0}};
            vf8 dx = {0};
            for (int r = 0; r < R; r++) {
                const uint8_t *xr = xq + r * rb;
                dx[r] = ((const float *)(xr + od))[i];
                mm[r] = gg_madd16(*(const vh16 *)(xr + ob + 32 * i), k.m);
            }
            const vf8 dd = dx * k.d, dm = dx * -k.dm;
            vi8 pm[4]; /* pm[q]: rows 2q, 2q + 1's bsums x mins of each chunk, interleaved */
            for (int q = 0; q < 4; q++)
                pm[q] = __builtin_shufflevector(mm[2 * q], mm[2 * q + 1], 0, 8, 2, 10, 4, 12, 6, 14) +
                        __builtin_shufflevector(mm[2 * q], mm[2 * q + 1], 1, 9, 3, 11, 5, 13, 7, 15);
            for (int c = 0; c < 4; c++) {
#if GG_K8
                vi8 s8[8] = {{0}};
                for (int r = 0; r < R; r++)
                    s8[r] = gg_kdot8(&k, c, 1, (const int8_t *)(xq + r * rb + ok) + 256 * i + 64 * c);
                const vi8 tot = gg_totals(s8, R);
#else
                vi16 s16[8] = {{0}};
                for (int r = 0; r < R; r++)
                    s16[r] = gg_kdot((vi16){0}, k.u[c], (const int8_t *)(xq + r * rb + ok) +
                                     256 * i + 64 * c, k.s[c]);
                const vi16 t = gg_isum16x8(s16);
                const vi8 tot = __builtin_shufflevector(t, t, 0, 1, 2, 3, 4, 5, 6, 7) +
                                __builtin_shufflevector(t, t, 8, 9, 10, 11, 12, 13, 14, 15);
#endif
                sum = gg_fma8(__builtin_convertvector(tot, vf8), dd, sum);
                mins = gg_fma8(__builtin_convertvector(gg_chunk_mins(pm, c), vf8), dm, mins);
            }
        }
        for (int r = 0; r < R; r++) out[r] = sum[r] - mins[r];
        return;
    }
    for (int64_t i = 0; i < nb; i++) {
        GgK k;
        gg_kblock(fmt, w + i * bb, &k);
        vi8 s8[8] = {{0}}, mm[8] = {{0}};
        vf8 dx = {0};
        for (int r = 0; r < R; r++) {
            const uint8_t *xr = xq + r * rb;
            const int8_t *a = (const int8_t *)(xr + ok) + 256 * i;
#if GG_K8
            s8[r] = gg_kdot8(&k, 0, 4, a);
#else
            const vi16 s = gg_kdot256(&k, a);
            s8[r] = __builtin_shufflevector(s, s, 0, 1, 2, 3, 4, 5, 6, 7) +
                    __builtin_shufflevector(s, s, 8, 9, 10, 11, 12, 13, 14, 15);
#endif
            dx[r] = ((const float *)(xr + od))[i];
            mm[r] = gg_madd16(*(const vh16 *)(xr + ob + 32 * i), k.m);
            if (gg_kbias(fmt)) s8[r] -= mm[r] * gg_kbias(fmt);
            if (mode == 0)
                acc[r] = gg_fma8((vf8){0} + dx[r] * k.d, __builtin_convertvector(s8[r], vf8),
                                 acc[r]);
        }
        if (mode == 0) {
            if (!gg_kbias(fmt))
                sum = gg_fma8(dx * k.dm, __builtin_convertvector(gg_totals(mm, R), vf8), sum);
            continue;
        }
        const vf8 s1 = __builtin_convertvector(gg_totals(s8, R), vf8);
        if (mode == 2) {
            sum = gg_fma8(s1, dx * k.d, sum);
            mins = gg_fma8(__builtin_convertvector(gg_totals(mm, R), vf8), dx * -k.dm, mins);
            continue;
        }
        vf8 v = s1 * k.d;
        if (!gg_kbias(fmt))
            v = gg_fma8((vf8){0} + k.dm, __builtin_convertvector(gg_totals(mm, R), vf8), v);
        sum = gg_fma8(v, dx, sum);
    }
    for (int r = 0; r < R; r++)
        out[r] = mode == 2 ? sum[r] - mins[r] : mode ? sum[r] : gg_hsum8(acc[r]) + sum[r];
}

/* sums of w a over each 4 consecutive codes (8 lanes) of the signed codes w (|w| <= 127):
 * x86 as llama.cpp's kernels take them, |w| against x's codes with w's sign (pmaddubsw's pairs
 * |w a| < 2^15, exact; vpdpbusd where the CPU has it) */
static inline vi8 gg_sdot32(vs32 w, const int8_t *a) {
#if defined(__AVX2__)
    const __m256i wv = (__m256i)w, aw = _mm256_abs_epi8(wv);
    const __m256i as = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)a), wv);
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return (vi8)_mm256_dpbusd_epi32(_mm256_setzero_si256(), aw, as);
#elif GG_VNNI
    return (vi8)_mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), aw, as);
#else
    return (vi8)_mm256_madd_epi16(_mm256_maddubs_epi16(aw, as), _mm256_set1_epi16(1));
#endif
#elif GG_NEON
    int8x16_t wq[2];
    memcpy(wq, &w, 32);
    return gg_cat2x4(gg_sdot16(wq[0], vld1q_s8(a)), gg_sdot16(wq[1], vld1q_s8(a + 16)));
#else
    return gg_dot((vb32)w ^ 0x80, a) - gg_dot((vb32){0} + 128, a); /* (w + 128) a - 128 a */
#endif
}

/* One IQ4_XS weight row against R rows of x in Q8_K blocks, as llama.cpp's vec_dot adds them:
 * per block each sub-block's 8 lane sums (lane l: codes 4l..4l+3) times its scale, summed in
 * integers over the block, then times d dx into 8 float sums (fused), block after block; the
 * 8 sums added as a tree at the end. The integer sums by llama.cpp's instructions where the CPU
 * has them: |w| against x's codes with w's sign (pmaddubsw: pairs of products, |w| <= 127),
 * then the pairs times the scale and added (pmaddwd; AVX-512: two sub-blocks a vector) */
static inline __attribute__((always_inline)) void gg_row_iq4xs(
    const uint8_t *w, int64_t nb, const uint8_t *xq, int64_t K, const int R, float *out) {
    const int64_t rb = gg_row_bytes(K), ok = gg_off_k(K), od = gg_off_kd(K);
    vf8 acc[GG_ROWS];
    for (int r = 0; r < R; r++) acc[r] = (vf8){0};
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *b = w + 136 * i;
        uint16_t h;
        memcpy(&h, b, 2);
        const float d = gg_f16(h);
        vs32 v[8];
        int ls[8];
        for (int j = 0; j < 8; j++)
            v[j] = gg_iq4_signed(b + 8 + 16 * j), ls[j] = gg_iq4xs_scale(b, j);
#if defined(__AVX512BW__) && defined(__AVX512VNNI__)
        __m512i aw[4], sc[4];
        __mmask64 neg[4];
        for (int q = 0; q < 4; q++) { /* sub-blocks 2q, 2q + 1 */
            const __m512i wq = _mm512_inserti64x4(_mm512_castsi256_si512((__m256i)v[2 * q]),
                                                  (__m256i)v[2 * q + 1], 1);
            neg[q] = _mm512_movepi8_mask(wq), aw[q] = _mm512_abs_epi8(wq);
            sc[q] = _mm512_mask_set1_epi16(_mm512_set1_epi16((short)ls[2 * q]), 0xFFFF0000u,
                                           (short)ls[2 * q + 1]);
        }
#elif defined(__AVX2__)
        __m256i aw[8], sc[8];
        for (int j = 0; j < 8; j++)
            aw[j] = _mm256_abs_epi8((__m256i)v[j]), sc[j] = _mm256_set1_epi16((short)ls[j]);
#endif
        for (int r = 0; r < R; r++) {
            const uint8_t *xr = xq + r * rb;
            const int8_t *a = (const int8_t *)(xr + ok) + 256 * i;
#if defined(__AVX512BW__) && defined(__AVX512VNNI__)
            __m512i t = _mm512_setzero_si512();
            for (int q = 0; q < 4; q++) {
                const __m512i aq = _mm512_loadu_si512((const void *)(a + 64 * q));
                const __m512i as = _mm512_mask_sub_epi8(aq, neg[q], _mm512_setzero_si512(), aq);
                t = _mm512_dpwssd_epi32(t, _mm512_maddubs_epi16(aw[q], as), sc[q]);
            }
            const vi16 t16 = (vi16)t;
            const vi8 s = __builtin_shufflevector(t16, t16, 0, 1, 2, 3, 4, 5, 6, 7) +
                          __builtin_shufflevector(t16, t16, 8, 9, 10, 11, 12, 13, 14, 15);
#elif defined(__AVX2__)
            __m256i t = _mm256_setzero_si256();
            for (int j = 0; j < 8; j++) {
                const __m256i as = _mm256_sign_epi8(
                    _mm256_loadu_si256((const __m256i *)(a + 32 * j)), (__m256i)v[j]);
                t = _mm256_add_epi32(t, _mm256_madd_epi16(_mm256_maddubs_epi16(aw[j], as), sc[j]));
            }
            const vi8 s = (vi8)t;
#else
            vi8 s = {0};
            for (int j = 0; j < 8; j++) s += gg_sdot32(v[j], a + 32 * j) * ls[j];
#endif
            const float dx = ((const float *)(xr + od))[i];
            acc[r] = gg_fma8((vf8){0} + d * dx, __builtin_convertvector(s, vf8), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) out[r] = gg_hsum8(acc[r]);
}

/* One Q4_0 or MXFP4 weight row against R rows of x as llama.cpp multiplies its repacked Q4_0
 * and MXFP4 rows (ggml_gemm/gemv_q4_0_8x8_q8_0 and _mxfp4_8x8_q8_0, all alike): per block the
 * integer total, times d dx (MXFP4: E dx), added (fused) into the row's sum, block after block */
static inline __attribute__((always_inline)) void gg_row_q40(
    const int64_t fmt, const uint8_t *w, int64_t nb, const uint8_t *xq, int64_t K, const int R,
    float *out) {
    const int64_t rb = gg_row_bytes(K);
    const int mx = fmt == FMT_MXFP4;
    vf8 sum = {0};
    for (int64_t g = 0; g < nb; g++) {
        const uint8_t *b = w + (mx ? 17 : 18) * g;
        uint16_t h;
        memcpy(&h, b, 2);
        const float d = mx ? gg_e8m0_half(b[0]) : gg_f16(h);
        const vb32 u = gg_nibbles16(b + 2 - mx); /* Q4_0's codes */
        const vs32 v = mx ? gg_lut_signed(gg_mxfp4_values, b + 1) : (vs32){0}; /* MXFP4's */
        vi8 t[8] = {{0}};
        vf8 dx = {0};
        for (int r = 0; r < R; r++) {
            const int8_t *a = (const int8_t *)(xq + r * rb) + 32 * g;
            t[r] = mx ? gg_sdot32(v, a) : gg_dot(u, a) - gg_dot((vb32){0} + 8, a);
            dx[r] = gg_ev(xq + r * rb, K)[8 * g];
        }
        sum = gg_fma8(__builtin_convertvector(gg_totals(t, R), vf8), dx * d, sum);
    }
    for (int r = 0; r < R; r++) out[r] = sum[r];
}

/* One MXFP4 weight row against R rows of x in Q8_0 blocks, as llama.cpp's vec_dot adds them
 * (ggml_vec_dot_mxfp4_q8_0 on x86, for matrices it does not repack): per block its values'
 * 8 lane sums with x's codes (lane l: codes 4l..4l+3) times s = E dx, added (fused) into one
 * of two 8-float sums, the even blocks' and the odd ones'; the two added lane by lane, then
 * as a tree (gg_hsum8); an odd last block's integer total times s added (fused) after */
static inline __attribute__((always_inline)) void gg_row_mxfp4(
    const uint8_t *w, int64_t nb, const uint8_t *xq, int64_t K, const int R, float *out) {
    const int64_t rb = gg_row_bytes(K);
    vf8 acc[2][GG_ROWS];
    for (int r = 0; r < R; r++) acc[0][r] = acc[1][r] = (vf8){0};
    int64_t g = 0;
    for (; g + 1 < nb; g += 2)
        for (int j = 0; j < 2; j++) {
            const uint8_t *b = w + 17 * (g + j);
            const vs32 v = gg_lut_signed(gg_mxfp4_values, b + 1);
            const float E = gg_e8m0_half(b[0]);
            for (int r = 0; r < R; r++) {
                const uint8_t *xr = xq + r * rb;
                const vi8 s = gg_sdot32(v, (const int8_t *)xr + 32 * (g + j));
                const vf8 d = (vf8){0} + gg_ev(xr, K)[8 * (g + j)] * E;
                acc[j][r] = gg_fma8(d, __builtin_convertvector(s, vf8), acc[j][r]);
            }
        }
    for (int r = 0; r < R; r++) out[r] = gg_hsum8(acc[0][r] + acc[1][r]);
    if (g < nb) {
        const uint8_t *b = w + 17 * g;
        const vs32 v = gg_lut_signed(gg_mxfp4_values, b + 1);
        const float E = gg_e8m0_half(b[0]);
        for (int r = 0; r < R; r++) {
            const uint8_t *xr = xq + r * rb;
            const vi8 s = gg_sdot32(v, (const int8_t *)xr + 32 * g);
            int t = 0;
            for (int l = 0; l < 8; l++) t += s[l];
            out[r] = GG_FMA(gg_ev(xr, K)[8 * g] * E, (float)t, out[r]);
        }
    }
}

/* Eight MXFP4 weight rows (w, w + rowb, ...) of a matrix llama.cpp repacks against one row of
 * x, as its gemv takes them (8 output rows in 8 lanes): gg_row_q40's numbers for one row of x,
 * the 8 rows' integer totals of a block reduced together (gg_isum8x8) instead of one by one */
static inline void gg_rows8_mxfp4(const uint8_t *w, int64_t rowb, int64_t nb, const uint8_t *xq,
                                  int64_t K, float *out) {
    const float *ev = gg_ev(xq, K);
    vf8 sum = {0};
    for (int64_t g = 0; g < nb; g++) {
        const int8_t *a = (const int8_t *)xq + 32 * g;
        typedef uint32_t vw8 __attribute__((vector_size(32)));
        vi8 t[8];
        vw8 e;
        for (int j = 0; j < 8; j++) {
            const uint8_t *b = w + j * rowb + 17 * g;
            t[j] = gg_sdot32(gg_lut_signed(gg_mxfp4_values, b + 1), a);
            e[j] = b[0];
        }
        const vw8 sub = (vw8)(e < 2); /* gg_e8m0_half's bits, 8 at once */
        const vf8 E = (vf8)((sub & (0x00200000u << (e & 1))) | (~sub & ((e - 1) << 23)));
        sum = gg_fma8(__builtin_convertvector(gg_isum8x8(t), vf8), E * ev[8 * g], sum);
    }
    memcpy(out, &sum, 32);
}

/* -- the product --------------------------------------------------------------------------- */

/* one weight row against R rows of x (R constant where inlined), fmt a constant */
static inline __attribute__((always_inline)) void gg_row(
    const int64_t fmt, int in, const uint8_t *w, int64_t K, const float *x, int64_t ldx,
    const uint8_t *xq, const int R, const int mode, float *out) {
    int64_t bb;
    const int64_t be = gg_block(fmt, &bb), nb = K / be;
    if (in && fmt == FMT_IQ4_XS) gg_row_iq4xs(w, nb, xq, K, R, out);
    else if (in && fmt == FMT_MXFP4 && mode != 2) gg_row_mxfp4(w, nb, xq, K, R, out);
    else if (in && be == 256) gg_krow(fmt, w, nb, bb, xq, K, R, mode, out);
    else if (in && mode == 2) gg_row_q40(fmt, w, nb, xq, K, R, out);
    else if (in) gg_row_int(fmt, w, nb, bb, xq, K, R, out);
    else gg_row_float(fmt, w, nb, be, bb, x, ldx, R, out);
}

static inline __attribute__((always_inline)) void gg_rows_fmt(
    const int64_t fmt, const Linear *L, const float *x, int64_t M, int64_t ldx,
    const uint8_t *xq, float *y, int64_t ldy, const float *res, int64_t n0, int64_t n1) {
    const int in = gg_int(L);
    /* the order of llama.cpp's float sums. Its CPU backend repacks Q4_K, Q4_0 and MXFP4
     * matrices of 8k rows and multiplies them with its own kernels: a prompt's rows of x in
     * fours (the first M - M % 4 from 4 rows on; gg_krow mode 4: a fused sum per 64 values of
     * Q4_K, gg_row_q40 per block of Q4_0 and MXFP4), the others one at a time (mode 2: per
     * block; MXFP4 not repacked: gg_row_mxfp4, its vec_dot's order). Other
     * K-quants from 8 rows of x on: its tiled kernel's (mode 1); below, vec_dot's (mode 0;
     * attnlm's own, mode 3, was 1.10x as fast for Q5_K, measured on one thread under load) */
    const int packed = (fmt == FMT_Q4_K || fmt == FMT_Q4_0 || fmt == FMT_MXFP4) && L->n % 8 == 0;
    const int mode = packed ? 2 : M >= 8 ? 1 : 0;
    const int64_t m4 = fmt == FMT_Q4_K && packed && M > 3 ? M - M % 4 : 0;
#if GG_TWO
    const int two = in && gg_bias(fmt) && !packed; /* Q8_0, Q5_0, Q4_0: gg_row2_signed */
#endif
    int64_t bb;
    const int64_t K = L->k, be = gg_block(fmt, &bb), rowb = K / be * bb, rb = gg_row_bytes(K);
    int64_t n = n0;
    if (in && M == 1 && be == 32 && !packed && fmt != FMT_MXFP4) /* a decoding step: 2 weight
                                     * rows at a time (measured slower for the K-quants: kept
                                     * to one) */
        for (; n + 2 <= n1; n += 2) {
            const uint8_t *w = (const uint8_t *)L->w + n * rowb;
            if (n + 4 <= n1) prefetch(w + 2 * rowb, 2 * rowb);
            float out[2];
#if GG_TWO
            if (gg_bias(fmt)) gg_row2_signed(fmt, w, w + rowb, K / be, bb, xq, K, 1, out, out + 1);
            else
#endif
                gg_rows_x1(fmt, w, rowb, 2, K / be, bb, xq, K, out);
            store(L, y, ldy, res, 0, n, out[0]);
            store(L, y, ldy, res, 0, n + 1, out[1]);
        }
    /* a decoding step's rows prefetched 4 KiB ahead at least (2 rows of 864 bytes, a 1.5B
     * Qwen's Q4_K rows, left the core waiting: 1.06x as fast its whole step, under load) */
    const int64_t ahead = rowb >= 2048 ? 2 : 4096 / rowb + 1;
    /* tiles of GG_TILE weight rows, each against every GG_ROWS rows of x in turn: the tile
     * stays in the L1/L2 cache while x's rows pass (weight row by weight row, a prefill's 64
     * rows of x would be read from the L2 cache once per weight row: measured 3x slower) */
    for (int64_t t0 = n; t0 < n1; t0 += GG_TILE) {
        const int64_t t1 = t0 + GG_TILE < n1 ? t0 + GG_TILE : n1;
        int64_t m = 0;
        for (; m + GG_ROWS <= (m4 ? m4 : M); m += GG_ROWS)
            for (int64_t r0 = t0; r0 < t1; r0++) {
                const uint8_t *w = (const uint8_t *)L->w + r0 * rowb;
                if (m == 0 && r0 + 2 < n1) prefetch(w + 2 * rowb, rowb);
                float out[GG_ROWS];
#if GG_TWO
                if (two && r0 + 1 < t1) { /* this row and the next */
                    float out1[GG_ROWS];
                    if (m == 0 && r0 + 3 < n1) prefetch(w + 3 * rowb, rowb);
                    gg_row2_signed(fmt, w, w + rowb, K / be, bb, xq + m * rb, K, GG_ROWS, out,
                                   out1);
                    for (int r = 0; r < GG_ROWS; r++) {
                        store(L, y, ldy, res, m + r, r0, out[r]);
                        store(L, y, ldy, res, m + r, r0 + 1, out1[r]);
                    }
                    r0++;
                    continue;
                }
#endif
                gg_row(fmt, in, w, K, x + m * ldx, ldx, xq + m * rb, GG_ROWS, m4 ? 4 : mode,
                       out);
                for (int r = 0; r < GG_ROWS; r++) store(L, y, ldy, res, m + r, r0, out[r]);
            }
        for (; m < M; m++)
            for (int64_t r0 = t0; r0 < t1; r0++) {
                const uint8_t *w = (const uint8_t *)L->w + r0 * rowb;
                if (M == 1 && r0 + ahead < n1) prefetch(w + ahead * rowb, rowb);
                float out[1];
#if GG_TWO
                if (two && r0 + 1 < t1) {
                    float out1[1];
                    gg_row2_signed(fmt, w, w + rowb, K / be, bb, xq + m * rb, K, 1, out, out1);
                    store(L, y, ldy, res, m, r0, out[0]);
                    store(L, y, ldy, res, m, r0 + 1, out1[0]);
                    r0++;
                    continue;
                }
#endif
                if (fmt == FMT_MXFP4 && in && packed && r0 + 8 <= t1) { /* 8 weight rows at once */
                    float out8[8];
                    if (M == 1 && r0 + 16 <= n1) prefetch(w + 8 * rowb, 8 * rowb);
                    gg_rows8_mxfp4(w, rowb, K / be, xq + m * rb, K, out8);
                    for (int j = 0; j < 8; j++) store(L, y, ldy, res, m, r0 + j, out8[j]);
                    r0 += 7;
                    continue;
                }
                gg_row(fmt, in, w, K, x + m * ldx, ldx, xq + m * rb, 1, m < m4 ? 4 : mode,
                       out);
                store(L, y, ldy, res, m, r0, out[0]);
            }
    }
}

/* float16 rows (N, K): decode_step.c's 16-bit product, of x rounded to float16 in xq (as
 * llama.cpp multiplies F16 weights) unless the product takes float activations */
static void rows_f16(const Linear *L, const float *x, int64_t M, int64_t ldx,
                     const uint8_t *xq, float *y, int64_t ldy, const float *res, int64_t n0,
                     int64_t n1) {
    if (gg_int(L))
        rows_half(L, (const float *)(xq + gg_off_h(L->k)), M, gg_row_bytes(L->k) / 4, y, ldy,
                  res, n0, n1, 0);
    else
        rows_half(L, x, M, ldx, y, ldy, res, n0, n1, 0);
}

/* one function per type (each its own symbol in a profile) */
#define GG_ROWS_OF(name, FMT)                                                                  \
    static __attribute__((noinline)) void name(const Linear *L, const float *x, int64_t M,     \
                                               int64_t ldx, const uint8_t *xq, float *y,       \
                                               int64_t ldy, const float *res, int64_t n0,      \
                                               int64_t n1) {                                   \
        gg_rows_fmt(FMT, L, x, M, ldx, xq, y, ldy, res, n0, n1);                               \
    }
GG_ROWS_OF(rows_q8_0, FMT_Q8_0)
GG_ROWS_OF(rows_q4_0, FMT_Q4_0)
GG_ROWS_OF(rows_q4_1, FMT_Q4_1)
GG_ROWS_OF(rows_q5_0, FMT_Q5_0)
GG_ROWS_OF(rows_q5_1, FMT_Q5_1)
GG_ROWS_OF(rows_q4_k, FMT_Q4_K)
GG_ROWS_OF(rows_q5_k, FMT_Q5_K)
GG_ROWS_OF(rows_q6_k, FMT_Q6_K)
GG_ROWS_OF(rows_q2_k, FMT_Q2_K)
GG_ROWS_OF(rows_q3_k, FMT_Q3_K)
GG_ROWS_OF(rows_iq4_nl, FMT_IQ4_NL)
GG_ROWS_OF(rows_iq4_xs, FMT_IQ4_XS)
GG_ROWS_OF(rows_mxfp4, FMT_MXFP4)

/* output rows [n0, n1) of a product in ggml blocks (fmt >= FMT_F16); xq: x quantized by
 * gg_quantize where gg_int(L) */
static void rows_ggml(const Linear *L, const float *x, int64_t M, int64_t ldx,
                      const uint8_t *xq, float *y, int64_t ldy, const float *res, int64_t n0,
                      int64_t n1) {
    switch (L->fmt) {
    case FMT_F16: rows_f16(L, x, M, ldx, xq, y, ldy, res, n0, n1); break;
    case FMT_Q8_0: rows_q8_0(L, x, M, ldx, xq, y, ldy, res, n0, n1); break;
    case FMT_Q4_0: rows_q4_0(L, x, M, ldx, xq, y, ldy, res, n0, n1); break;
    case FMT_Q4_1: rows_q4_1(L, x, M, ldx, xq, y, ldy, res, n0, n1); break;
    case FMT_Q5_0: rows_q5_0(L, x, M, ldx, xq, y, ldy, res, n0, n1); break;
    case FMT_Q5_1: rows_q5_1(L, x, M, ldx, xq, y, ldy, res, n0, n1); break;
    case FMT_Q4_K: rows_q4_k(L, x, M, ldx, xq, y, ldy, res, n0, n1); break;
    case FMT_Q5_K: rows_q5_k(L, x, M, ldx, xq, y, ldy, res, n0, n1); break;
    case FMT_Q2_K: rows_q2_k(L, x, M, ldx, xq, y, ldy, res, n0, n1); break;
    case FMT_Q3_K: rows_q3_k(L, x, M, ldx, xq, y, ldy, res, n0, n1); break;
    case FMT_IQ4_NL: rows_iq4_nl(L, x, M, ldx, xq, y, ldy, res, n0, n1); break;
    case FMT_IQ4_XS: rows_iq4_xs(L, x, M, ldx, xq, y, ldy, res, n0, n1); break;
    case FMT_MXFP4: rows_mxfp4(L, x, M, ldx, xq, y, ldy, res, n0, n1); break;
    default: rows_q6_k(L, x, M, ldx, xq, y, ldy, res, n0, n1); break;
    }
}

/* x (M, ldx) quantized into xq by every thread (its share of the rows) for each family of
 * activations the products a, b, c take (b, c may be NULL or unused); a barrier after */
static void quantize_for(const Linear *a, const Linear *b, const Linear *c, const float *x,
                         int64_t M, int64_t ldx, uint8_t *xq, int t, int nt) {
    const int fam = gg_family(a) | (b && b->w ? gg_family(b) : 0) | (c && c->w ? gg_family(c) : 0);
    if (!fam) return;
    int64_t lo, hi;
    share(M, t, nt, &lo, &hi);
    gg_quantize(x, ldx, a->k, xq, lo, hi, fam);
    BARRIER();
}

/* the rows of x (M, K) quantized for every family (their own tests) */
void attnlm_quantize_rows(const float *x, int64_t M, int64_t K, uint8_t *xq) {
    gg_quantize(x, K, K, xq, 0, M, GG_FAM_32 | GG_FAM_K | GG_FAM_H);
}

/* bytes of one quantized row of K values */
int64_t attnlm_quantized_row_bytes(int64_t K) { return gg_row_bytes(K); }
