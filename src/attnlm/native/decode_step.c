/* One decoding step of a pre-norm causal decoder (gpt, llama) in C: a few new tokens through
 * every block and the LM head in one call, the weights read in the format they are stored in
 * (float32, bfloat16, 8-bit or 4-bit groups; see attnlm/quant/ for the formats).
 *
 * Why C: a one-token step multiplies one row by every weight matrix, so its time should be
 * the time to stream the weights (about 100 MB in 4 bits for a 135M model). From Python each
 * block is some sixty small tensor calls of a few microseconds each, as long as the products
 * themselves once the weights are 4-bit; here the whole step is one call, one parallel region,
 * and the products read the 4-bit codes directly (no float32 copy of a weight is ever made).
 *
 * The arithmetic is the forward's (attnlm/models/decoder.py), in float32, the weights'
 * values defined by the formats' formulas; only the summation order differs (tested against
 * the float32 model holding the dequantized weights). Activations are never quantized.
 *
 * Threads: one OpenMP parallel region per call; each matrix product splits its output rows
 * among the threads (4-bit: blocks of 64 rows, the packed layout's unit), the small steps
 * between products (norms, rotation, cache write, activation) split the rows among them.
 *
 * Rows: each row of a step is one new token of a sequence, at its own position and in its own
 * cache slot (attnlm_step_rows: an OpenAI server's clients decoding and prefilling together,
 * one pass over the weights for all); attnlm_decode_step is the case of B sequences advancing
 * T tokens together. Gemma's parts: post-norms, soft-capped scores and logits, sliding-window
 * layers with their own rotary table, GeGLU (the model's struct says which).
 *
 * Shape legend: M rows (attnlm_decode_step: B sequences x T new tokens, row m = b T + t),
 * C model width, H / Hkv query / key-value heads, D head width, F feed-forward width,
 * V vocabulary, S positions held after the step, N / K output / input features of a product,
 * G = K / 32.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "threads.h"
#ifdef __AVX512F__
#include <immintrin.h>
#endif

typedef float vf __attribute__((vector_size(64), aligned(4)));      /* 16 floats */
typedef int32_t vi __attribute__((vector_size(64), aligned(4)));     /* 16 int32 */
typedef uint32_t vu __attribute__((vector_size(64), aligned(4)));    /* 16 uint32 */
typedef uint8_t vu8 __attribute__((vector_size(16), aligned(1)));    /* 16 uint8 */
typedef uint16_t vu16 __attribute__((vector_size(32), aligned(2)));  /* 16 bfloat16 bits */

enum { FMT_F32 = 0, FMT_BF16 = 1, FMT_Q8 = 2, FMT_Q4 = 3, FMT_F32T = 4 };
enum { NORM_RMS = 0, NORM_LAYER = 1 };
/* ACT_GEGLU_F16: GeGLU with GELU as llama.cpp's CPU backend takes it (gelu_f16) */
enum { ACT_SWIGLU = 0, ACT_GELU = 1, ACT_GELU_TANH = 2, ACT_RELU = 3, ACT_GEGLU = 4,
       ACT_GEGLU_F16 = 5, ACT_SWIGLU_OAI = 6 };
/* gpt-oss's clamped SwiGLU (ACT_SWIGLU_OAI): llama.cpp's constants */
#define OAI_ALPHA 1.702f
#define OAI_LIMIT 7.0f

/* y = x W^T + b with W (N, K) stored in fmt:
 *   f32   w: (N, K) float
 *   f32t  w: (K, N) float (W^T row-major: attnlm/nn/layout.py's decoding layout)
 *   bf16  w: (N, K) bfloat16 bits
 *   q8    w: (N, K) int8, scales (N, G) float16: W[n, k] = s[n, g] q[n, k]
 *   q4    w: (n_pad / 64 blocks, K, 32) bytes, byte j of column k holding row j (low nibble)
 *         and row j + 32 (high nibble) of the block; scales (n_pad / 64, G, 64, 2) float16 =
 *         (d, m) per row and group: W[n, k] = d u + m                                       */
typedef struct {
    int64_t fmt, n, k, n_pad;
    const void *w;
    const uint16_t *scales; /* float16 bits */
    const float *bias; /* (N,) or NULL */
    int64_t act;       /* ggml blocks: ACT_AUTO, ACT_FLOAT or ACT_INT (ggml_blocks.h) */
} Linear;

typedef struct {
    const float *w, *b; /* (C,) each; b NULL for RMSNorm or a norm without bias */
} Norm;

typedef struct {
    Norm ln_1, ln_2;
    Linear qkv, out, fc, proj; /* qkv: (H + 2 Hkv) D rows, q then k then v */
    float *k_cache, *v_cache;  /* (slots, Hkv, cap, D) each */
    /* a file's separate matrices (k.w not NULL): qkv is q alone, k and v follow; with up.w,
     * fc is the SwiGLU gate alone and up its second half */
    Linear k, v, up;
    Norm q_norm, k_norm; /* (D,) RMSNorm gains of each q / k head before rotary (w NULL: none) */
    /* (C,) RMSNorm gains of the attention's and the feed-forward's outputs before each is
     * added to the residual stream (Gemma's "sandwich"; w NULL: none) */
    Norm post_attn, post_mlp;
    int64_t window; /* a sliding layer's window W: position p sees positions (p - W, p]; 0: all */
    int64_t table;  /* the layer's rotary table (Rows.cos): 0, or 1 (Gemma's local layers);
                     * -1: no rotation (a NoPE layer: SmolLM3's every fourth) */
    /* a mixture of experts in place of the feed-forward (n_expert > 0): router (E, C) scores
     * the experts; fc, up (E F rows each) and proj (E C rows) stack the E experts' gate, up
     * and down matrices, expert e's rows at [e F, (e + 1) F) (ggml blocks or float rows);
     * n_used experts per row, their weights renormalised with norm_topk */
    Linear router;
    int64_t n_expert, n_used, norm_topk;
    /* gpt-oss: sinks (H,) each head's sink logit in its softmax (NULL: none); topk_softmax,
     * the chosen experts' weights the softmax of their router logits (llama.cpp's
     * SOFTMAX_WEIGHT gating) instead of their share of the softmax over every expert */
    const float *sinks;
    int64_t topk_softmax;
} Block;

typedef struct {
    int64_t n_layer, C, H, Hkv, D, F, V, cap;
    int64_t norm, act, rotary; /* rotary 1: rotate-half pairs (i, i + D/2) of q and k;
                                * 2: adjacent pairs (2i, 2i + 1) (llama.cpp's row order) */
    float eps, scale;          /* norm epsilon; attention score scale */
    const Block *blocks;
    Norm ln_f;
    Linear head;
    float attn_softcap, final_softcap; /* scores, logits -> cap tanh(v / cap) (Gemma; 0: none) */
    /* Granite (0: none): each sublayer's output times residual_scale before the residual add,
     * and the logits times logit_scale (1 / its logits_scaling, rounded to float) */
    float residual_scale, logit_scale;
    /* OLMo 2 (0: as the others): qk_all, q's and k's norms span all heads at once (gains of
     * H D and Hkv D); no_pre, no norms before the sublayers (ln_1, ln_2 unused) */
    int64_t qk_all, no_pre;
    /* partial rotary (0: all D features): the first rot features of each q and k head rotate
     * (Phi-4 mini: 96 of 128), the rest pass; the tables are (M, rot / 2) */
    int64_t rot;
} Model;

/* scratch, each at least the size named */
typedef struct {
    float *xn;     /* (M, C) */
    float *qkv;    /* (M, (H + 2 Hkv) D) */
    float *att;    /* (M, H D) */
    float *hid;    /* (M, F) or (M, 2 F) for SwiGLU */
    float *scores; /* (threads, cap) */
    float *part;   /* (threads, M, N) for the largest N of a column-major (f32t) product */
    uint8_t *xq;   /* (M, gg_row_bytes(K)) the rows of x quantized for ggml blocks */
    float *moe;    /* a mixture of experts' rows (moe_floats(M, E, k, C) floats), or NULL */
} Scratch;

/* the rows of one step: row m is the token at position pos[m] of the sequence whose keys and
 * values are in cache slot slot[m] */
typedef struct {
    const int64_t *slot, *pos; /* (M,) each */
    const float *cos, *sin;    /* (tables, M, R/2): row m's rotation by each table (R: the
                                * rotated features, Model.rot or D) */
    const int64_t *out;        /* (R,) the rows whose logits are computed, in this order */
    int64_t R;
} Rows;

static inline float hsum(vf v) {
    float s = 0.0f;
    for (int i = 0; i < 16; i++) s += v[i];
    return s;
}

/* Conversions go through 32-bit integers: GCC widens 8-bit lanes in one instruction
 * (vpmovzxbd) only when unsigned, and only to integers (a direct int8 -> float conversion
 * is compiled lane by lane). */

/* 16 nibbles (bytes p[0..15] shifted right by `shift`, low 4 bits) as floats */
static inline vf from_u4(const uint8_t *p, int shift) {
    vu8 b = (*(const vu8 *)p >> shift) & 15;
    return __builtin_convertvector(__builtin_convertvector(b, vi), vf);
}

/* one float16 (bits) as a float: the exponent re-biased by a multiplication (exact, subnormals
 * included; scales are never infinite or NaN) */
static inline float from_f16(uint16_t h) {
    uint32_t mag = (uint32_t)(h & 0x7fff) << 13, bits;
    float f;
    memcpy(&f, &mag, 4);
    f *= 0x1p112f;
    memcpy(&bits, &f, 4);
    bits |= (uint32_t)(h & 0x8000) << 16;
    memcpy(&f, &bits, 4);
    return f;
}

/* 16 float16 (bits) as floats, the same way */
static inline vf from_f16x16(const uint16_t *p) {
    vu h = __builtin_convertvector(*(const vu16 *)p, vu);
    vf f = (vf)((h & 0x7fff) << 13) * 0x1p112f;
    return (vf)((vu)f | ((h & 0x8000) << 16));
}

/* 16 int8 as floats: flipped to unsigned (+128), widened, then -128 */
static inline vf from_i8(const int8_t *p) {
    vu8 b = *(const vu8 *)p ^ 0x80;
    return __builtin_convertvector(__builtin_convertvector(b, vi) - 128, vf);
}

/* 16 lanes' a b + c, fused (the CPU's instruction: AVX-512, or FMA in halves) */
static inline vf vfma(vf a, vf b, vf c) {
#ifdef __AVX512F__
    return (vf)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif defined(__ARM_FEATURE_FMA) /* by name: contraction may fuse c's product instead */
    for (int i = 0; i < 16; i++) c[i] = __builtin_fmaf(a[i], b[i], c[i]);
    return c;
#else
    return a * b + c; /* contracted where the CPU has FMA (-ffp-contract=fast, GNU C's default) */
#endif
}

/* Ask for the cache lines of [p, p + bytes) ahead of use. The products stream their weights
 * once per step, from memory: the hardware prefetcher alone leaves one core waiting on most
 * lines (measured: the 4-bit products of a 135M model took 2.5 times as long without this). */
static inline void prefetch(const void *p, int64_t bytes) {
    for (int64_t i = 0; i < bytes; i += 64) __builtin_prefetch((const char *)p + i);
}

/* the half-open range [*lo, *hi) of `units` work units that thread `t` of `nt` takes */
static inline void share(int64_t units, int t, int nt, int64_t *lo, int64_t *hi) {
    int64_t base = units / nt, extra = units % nt;
    *lo = t * base + (t < extra ? t : extra);
    *hi = *lo + base + (t < extra ? 1 : 0);
}

/* -- the products: output rows [n0, n1) of y (M, ldy) = res + x (M, ldx) W^T + b ------------ */

static void store(const Linear *L, float *y, int64_t ldy, const float *res, int64_t m,
                  int64_t n, float v) {
    if (n >= L->n) return;
    if (L->bias) v += L->bias[n];
    if (res) v += res[m * ldy + n];
    y[m * ldy + n] = v;
}

#include "avx2_rows.h"

static void rows_f32(const Linear *L, const float *x, int64_t M, int64_t ldx, float *y,
                     int64_t ldy, const float *res, int64_t n0, int64_t n1) {
    const int64_t K = L->k, K16 = K & ~(int64_t)15;
    const float *W = (const float *)L->w;
    for (int64_t n = n0; n < n1; n++) {
        const float *w = W + n * K;
        if (n + 2 < n1) prefetch(w + 2 * K, K * 4);
        for (int64_t m = 0; m < M; m++) {
            const float *xm = x + m * ldx;
#if AVX2_ROWS
            store(L, y, ldy, res, m, n, f32_row_sum(w, xm, K));
            continue;
#endif
            vf a0 = {0}, a1 = {0};
            int64_t k = 0;
            for (; k + 32 <= K16; k += 32) {
                a0 += *(const vf *)(w + k) * *(const vf *)(xm + k);
                a1 += *(const vf *)(w + k + 16) * *(const vf *)(xm + k + 16);
            }
            for (; k < K16; k += 16) a0 += *(const vf *)(w + k) * *(const vf *)(xm + k);
            float s = hsum(a0 + a1);
            for (; k < K; k++) s += w[k] * xm[k];
            store(L, y, ldy, res, m, n, s);
        }
    }
}

/* W^T (K, N) row-major, thread t of nt: the rows [k0, k1) of W^T (stretches of memory that
 * stream at the memory's full speed; measured 1.3 times as fast as tiles of columns, whose
 * rows are strided) into partial sums part[t] (M, N) of every column, 4 rows of W^T per pass
 * (8 with several rows of x: cols8) over a tile of COL_TILE columns (the tile's sums stay in
 * the L1/L2 cache), the lines 8 rows ahead asked for as each line is used; after a barrier
 * each thread adds the nt partial sums of its share of the columns. The caller's barrier after
 * the product keeps `part` from being reused early. */
#define COL_TILE 8192

/* 8 rows w (8, N) of W^T into the sums acc (M, N) of the columns [c0, c1), for M > 1: two rows
 * of x at a time, their 8 values each broadcast once, each 8 x 16 weights (from memory for the
 * first pair, from the L1/L2 cache after) loaded once for both rows' 16 sums: 10 loads and 2
 * stores per 16 multiply-adds (the 4-row pass below: 5 loads and a store per 4). The weights 8
 * rows ahead are asked for during the first pair. */
static inline __attribute__((always_inline)) void cols8_rows(
    const float *w, int64_t N, const float *x0, const float *x1, float *a0, float *a1,
    int64_t c0, int64_t c16, int ahead, const int two) {
    const vf zero = {0};
    const vf p0 = zero + x0[0], p1 = zero + x0[1], p2 = zero + x0[2], p3 = zero + x0[3];
    const vf p4 = zero + x0[4], p5 = zero + x0[5], p6 = zero + x0[6], p7 = zero + x0[7];
    const vf q0 = zero + x1[0], q1 = zero + x1[1], q2 = zero + x1[2], q3 = zero + x1[3];
    const vf q4 = zero + x1[4], q5 = zero + x1[5], q6 = zero + x1[6], q7 = zero + x1[7];
    for (int64_t n = c0; n < c16; n += 16) {
        if (ahead)
            for (int j = 0; j < 8; j++) __builtin_prefetch(w + (8 + j) * N + n);
        const float *wn = w + n;
        const vf w0 = *(const vf *)wn, w1 = *(const vf *)(wn + N);
        const vf w2 = *(const vf *)(wn + 2 * N), w3 = *(const vf *)(wn + 3 * N);
        const vf w4 = *(const vf *)(wn + 4 * N), w5 = *(const vf *)(wn + 5 * N);
        const vf w6 = *(const vf *)(wn + 6 * N), w7 = *(const vf *)(wn + 7 * N);
        *(vf *)(a0 + n) += (w0 * p0 + w1 * p1 + w2 * p2 + w3 * p3) +
                           (w4 * p4 + w5 * p5 + w6 * p6 + w7 * p7);
        if (two)
            *(vf *)(a1 + n) += (w0 * q0 + w1 * q1 + w2 * q2 + w3 * q3) +
                               (w4 * q4 + w5 * q5 + w6 * q6 + w7 * q7);
    }
}

static void cols8(const float *w, int64_t N, const float *x, int64_t M, int64_t ldx, float *acc,
                  int64_t c0, int64_t c1, int ahead) {
    const int64_t c16 = c0 + ((c1 - c0) & ~(int64_t)15);
    for (int64_t m = 0; m < M; m += 2) {
        const float *xm = x + m * ldx;
        if (m + 1 < M)
            cols8_rows(w, N, xm, xm + ldx, acc + m * N, acc + (m + 1) * N, c0, c16, ahead && !m, 1);
        else /* an odd last row alone */
            cols8_rows(w, N, xm, xm, acc + m * N, NULL, c0, c16, 0, 0);
        for (int64_t r = m; r < m + 2 && r < M; r++) {
            const float *xr = x + r * ldx;
            float *ar = acc + r * N;
            for (int64_t n = c16; n < c1; n++) {
                float v = 0.0f;
                for (int j = 0; j < 8; j++) v += w[j * N + n] * xr[j];
                ar[n] += v;
            }
        }
    }
}

static void cols_f32t(const Linear *L, const float *x, int64_t M, int64_t ldx, float *y,
                      int64_t ldy, const float *res, float *part, int t, int nt) {
    const int64_t K = L->k, N = L->n;
    const float *W = (const float *)L->w;
    int64_t k0, k1;
    share(K / 4, t, nt, &k0, &k1);
    k0 *= 4;
    k1 = t == nt - 1 ? K : k1 * 4;
    float *acc = part + t * M * N; /* (M, N) */
    memset(acc, 0, M * N * sizeof(float));
    /* the tile's sums, M rows of it, kept within about 32 KB (the L1 cache) */
    const int64_t most = M > 1 ? COL_TILE / M : COL_TILE, tiles = (N + most - 1) / most;
    const int64_t tile = ((N + tiles - 1) / tiles + 15) & ~(int64_t)15; /* even tiles */
    for (int64_t c0 = 0; c0 < N; c0 += tile) {
        const int64_t c1 = c0 + tile < N ? c0 + tile : N;
        const int64_t c16 = c0 + ((c1 - c0) & ~(int64_t)15);
        for (int64_t k = k0; k < k1;) {
            if (M > 1 && k1 - k >= 8) { /* several rows of x: 8 rows of W^T per pass */
                cols8(W + k * N, N, x + k, M, ldx, acc, c0, c1, k + 16 <= k1);
                k += 8;
                continue;
            }
            const int64_t r = k1 - k >= 4 ? 4 : 1; /* W^T rows this pass */
            const float *w = W + k * N;
            const float *ahead = k + r + 8 <= k1 ? w + 8 * N : NULL;
            if (r == 4) {
                /* each 16 columns of the 4 rows loaded once, into every row of x */
                for (int64_t n = c0; n < c16; n += 16) {
                    if (ahead)
                        for (int j = 0; j < 4; j++) __builtin_prefetch(ahead + j * N + n);
                    const vf w0 = *(const vf *)(w + n), w1 = *(const vf *)(w + N + n);
                    const vf w2 = *(const vf *)(w + 2 * N + n), w3 = *(const vf *)(w + 3 * N + n);
                    for (int64_t m = 0; m < M; m++) {
                        const float *xm = x + m * ldx + k;
                        *(vf *)(acc + m * N + n) += w0 * xm[0] + w1 * xm[1] + w2 * xm[2] + w3 * xm[3];
                    }
                }
                for (int64_t m = 0; m < M; m++) {
                    const float *xm = x + m * ldx + k;
                    float *am = acc + m * N;
                    for (int64_t n = c16; n < c1; n++)
                        am[n] += w[n] * xm[0] + w[N + n] * xm[1] + w[2 * N + n] * xm[2] +
                                 w[3 * N + n] * xm[3];
                }
            } else {
                for (int64_t m = 0; m < M; m++) {
                    const float xk = x[m * ldx + k];
                    float *am = acc + m * N;
                    for (int64_t n = c0; n < c16; n += 16) *(vf *)(am + n) += *(const vf *)(w + n) * xk;
                    for (int64_t n = c16; n < c1; n++) am[n] += w[n] * xk;
                }
            }
            k += r;
        }
    }
    BARRIER();
    int64_t n0, n1;
    share(N, t, nt, &n0, &n1);
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = n0; n < n1; n++) {
            float v = 0.0f;
            for (int u = 0; u < nt; u++) v += part[(u * M + m) * N + n];
            store(L, y, ldy, res, m, n, v);
        }
}

/* 16-bit float rows (N, K): bfloat16 (``brain``) or IEEE float16 bits, widened in registers.
 * Always inlined, so each caller's copy has its format as a constant. */
static inline __attribute__((always_inline)) void rows_half(const Linear *L, const float *x,
                                                            int64_t M, int64_t ldx, float *y,
                                                            int64_t ldy, const float *res,
                                                            int64_t n0, int64_t n1, int brain) {
    const int64_t K = L->k, K16 = K & ~(int64_t)15;
    const uint16_t *W = (const uint16_t *)L->w;
    for (int64_t n = n0; n < n1; n++) {
        const uint16_t *w = W + n * K;
        if (n + 2 < n1) prefetch(w + 2 * K, K * 2);
        for (int64_t m = 0; m < M; m++) {
            const float *xm = x + m * ldx;
            int64_t k = K16;
#if AVX2_ROWS
            float s = half_row_sum(w, xm, K16, brain);
#else
            vf a = {0};
            for (k = 0; k < K16; k += 16) {
                vf wk = brain ? (vf)(__builtin_convertvector(*(const vu16 *)(w + k), vu) << 16)
                              : from_f16x16(w + k);
                a += wk * *(const vf *)(xm + k);
            }
            float s = hsum(a);
#endif
            for (; k < K; k++) {
                float f;
                if (brain) {
                    uint32_t b = (uint32_t)w[k] << 16;
                    memcpy(&f, &b, 4);
                } else {
                    f = from_f16(w[k]);
                }
                s += f * xm[k];
            }
            store(L, y, ldy, res, m, n, s);
        }
    }
}

static void rows_bf16(const Linear *L, const float *x, int64_t M, int64_t ldx, float *y,
                      int64_t ldy, const float *res, int64_t n0, int64_t n1) {
    rows_half(L, x, M, ldx, y, ldy, res, n0, n1, 1);
}

static void rows_q8(const Linear *L, const float *x, int64_t M, int64_t ldx, float *y,
                    int64_t ldy, const float *res, int64_t n0, int64_t n1) {
    const int64_t K = L->k, G = K / 32;
    const int8_t *W = (const int8_t *)L->w;
    for (int64_t n = n0; n < n1; n++) {
        const int8_t *w = W + n * K;
        const uint16_t *s = L->scales + n * G;
        if (n + 4 < n1) prefetch(w + 4 * K, K), prefetch(s + 4 * G, G * 2);
        int64_t m = 0;
#if AVX2_ROWS
        for (float out[4]; m < M;) {
            const int R = M - m >= 4 ? 4 : 1;
            if (R == 4) q8_row_sums(w, s, G, x + m * ldx, ldx, 4, out);
            else q8_row_sums(w, s, G, x + m * ldx, ldx, 1, out);
            for (int r = 0; r < R; r++) store(L, y, ldy, res, m + r, n, out[r]);
            m += R;
        }
#endif
        for (; m + 4 <= M; m += 4) { /* four rows of x per widening of the weights */
            vf a[4] = {{0}, {0}, {0}, {0}};
            for (int64_t g = 0; g < G; g++) {
                const vf w0 = from_i8(w + 32 * g), w1 = from_i8(w + 32 * g + 16);
                const float sg = from_f16(s[g]);
                for (int r = 0; r < 4; r++) {
                    const float *xg = x + (m + r) * ldx + 32 * g;
                    a[r] += (w0 * *(const vf *)xg + w1 * *(const vf *)(xg + 16)) * sg;
                }
            }
            for (int r = 0; r < 4; r++) store(L, y, ldy, res, m + r, n, hsum(a[r]));
        }
        for (; m < M; m++) {
            const float *xm = x + m * ldx;
            vf a = {0};
            for (int64_t g = 0; g < G; g++) {
                const int8_t *q = w + 32 * g;
                const float *xg = xm + 32 * g;
                vf t = from_i8(q) * *(const vf *)xg + from_i8(q + 16) * *(const vf *)(xg + 16);
                a += t * from_f16(s[g]);
            }
            store(L, y, ldy, res, m, n, hsum(a));
        }
    }
}

/* rows of x taken together by the 4-bit product: each nibble is widened once and multiplied
 * into every row (the widening, not the multiply, is the cost); as many as the vector
 * registers hold the 4 x R sums (AVX2: q4_block_avx2's two passes of 4 sums a row; 4 rows were
 * 1.1x as fast as 2 a prompt) */
#if defined(__AVX512F__) || defined(__AVX2__)
#define Q4_ROWS 4
#else
#define Q4_ROWS 2
#endif

/* The 64 sums of one 4-bit block (rows blk * 64 ..) for R rows of x (R a constant once
 * inlined): out[r][q] = sum over k of W[16 q + j, k] x[r, k] for j < 16. Per group of 32
 * columns the sums of u x are accumulated in float from the nibbles, then
 * out += d (sum u x) + m (sum x). */
static inline __attribute__((always_inline)) void q4_block(const Linear *L, int64_t blk,
                                                           const float *x, int64_t ldx, int R,
                                                           int ahead, vf out[][4]) {
    const int64_t G = L->k / 32;
    const uint8_t *wb = (const uint8_t *)L->w + blk * L->k * 32;
    for (int r = 0; r < R; r++)
        for (int q = 0; q < 4; q++) out[r][q] = (vf){0};
    for (int64_t g = 0; g < G; g++) {
        const uint8_t *p = wb + g * 32 * 32;
        vf a[Q4_ROWS][4];
        float xs[Q4_ROWS];
        for (int r = 0; r < R; r++) {
            xs[r] = 0.0f;
            for (int q = 0; q < 4; q++) a[r][q] = (vf){0};
        }
        if (ahead) { /* two groups ahead (the next block's follow its last group) */
            prefetch(p + 2 * 1024, 1024);
            prefetch(L->scales + (blk * G + g + 2) * 128, 256);
        }
        for (int kk = 0; kk < 32; kk++, p += 32) {
            const vf w0 = from_u4(p, 0), w1 = from_u4(p + 16, 0); /* rows  0..15, 16..31 */
            const vf w2 = from_u4(p, 4), w3 = from_u4(p + 16, 4); /* rows 32..47, 48..63 */
            for (int r = 0; r < R; r++) {
                const float xk = x[r * ldx + 32 * g + kk];
                xs[r] += xk;
                a[r][0] += w0 * xk;
                a[r][1] += w1 * xk;
                a[r][2] += w2 * xk;
                a[r][3] += w3 * xk;
            }
        }
        const uint16_t *dm = L->scales + (blk * G + g) * 64 * 2;
        for (int q = 0; q < 4; q++) { /* rows 16 q .. 16 q + 15: (d, m) pairs */
            vf lo = from_f16x16(dm + 32 * q), hi = from_f16x16(dm + 32 * q + 16);
            vf d = __builtin_shufflevector(lo, hi, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22,
                                           24, 26, 28, 30);
            vf m = __builtin_shufflevector(lo, hi, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23,
                                           25, 27, 29, 31);
            for (int r = 0; r < R; r++) out[r][q] += d * a[r][q] + m * xs[r];
        }
    }
}

/* 4-bit: rows of the half-blocks [h0, h1) of 32 rows (a half-block is one nibble of each byte:
 * work is shared in halves so that 9 blocks split evenly between two threads); a block whose
 * other half belongs to another thread is read whole and only this thread's half stored. */
static void rows_q4(const Linear *L, const float *x, int64_t M, int64_t ldx, float *y,
                    int64_t ldy, const float *res, int64_t h0, int64_t h1) {
    for (int64_t blk = h0 / 2; blk < (h1 + 1) / 2; blk++) {
        const int q0 = 2 * blk < h0 ? 2 : 0, q1 = 2 * blk + 1 < h1 ? 4 : 2; /* 16-row quarters */
        for (int64_t m = 0; m < M;) {
            const int R = M - m >= Q4_ROWS ? Q4_ROWS : 1;
#if AVX2_ROWS
            float sums[Q4_ROWS][64];
            if (R == Q4_ROWS) q4_block_avx2(L, blk, x + m * ldx, ldx, Q4_ROWS, m == 0, sums);
            else q4_block_avx2(L, blk, x + m * ldx, ldx, 1, m == 0, sums);
            for (int r = 0; r < R; r++)
                for (int j = 16 * q0; j < 16 * q1; j++)
                    store(L, y, ldy, res, m + r, blk * 64 + j, sums[r][j]);
            m += R;
            continue;
#endif
            vf out[Q4_ROWS][4];
            if (R == Q4_ROWS) q4_block(L, blk, x + m * ldx, ldx, Q4_ROWS, m == 0, out);
            else q4_block(L, blk, x + m * ldx, ldx, 1, m == 0, out);
            for (int r = 0; r < R; r++)
                for (int q = q0; q < q1; q++)
                    for (int j = 0; j < 16; j++)
                        store(L, y, ldy, res, m + r, blk * 64 + 16 * q + j, out[r][q][j]);
            m += R;
        }
    }
}

#include "ggml_blocks.h"

/* thread t's share of y = res + x W^T + b (call from every thread of the region); xq: x
 * quantized by quantize_for where a product in ggml blocks takes integer activations */
static void linear(const Linear *L, const float *x, int64_t M, int64_t ldx, float *y,
                   int64_t ldy, const float *res, float *part, const uint8_t *xq, int t,
                   int nt) {
    int64_t lo, hi;
    if (L->fmt >= FMT_F16) {
        share(L->n, t, nt, &lo, &hi);
        rows_ggml(L, x, M, ldx, xq, y, ldy, res, lo, hi);
        return;
    }
    if (L->fmt == FMT_Q4) {
        share(L->n_pad / 32, t, nt, &lo, &hi);
        rows_q4(L, x, M, ldx, y, ldy, res, lo, hi);
        return;
    }
    if (L->fmt == FMT_F32T) {
        cols_f32t(L, x, M, ldx, y, ldy, res, part, t, nt);
        return;
    }
    share(L->n, t, nt, &lo, &hi);
    if (L->fmt == FMT_F32) rows_f32(L, x, M, ldx, y, ldy, res, lo, hi);
    else if (L->fmt == FMT_BF16) rows_bf16(L, x, M, ldx, y, ldy, res, lo, hi);
    else rows_q8(L, x, M, ldx, y, ldy, res, lo, hi);
}

/* rotate adjacent pairs (2i, 2i + 1) of one head's first D features by cos, sin (D/2,) (D:
 * the rotated width); each first product fused with the other's rounded one, as llama.cpp's
 * rope is compiled */
static inline void rotate_pairs(float *v, const float *cs, const float *sn, int64_t D) {
    for (int64_t i = 0; i < D / 2; i++) {
        const float a = v[2 * i], b = v[2 * i + 1];
        v[2 * i] = GG_FMA(a, cs[i], -(b * sn[i]));
        v[2 * i + 1] = GG_FMA(a, sn[i], b * cs[i]);
    }
}

/* -- the small steps ----------------------------------------------------------------------- */

/* 1 / sqrt(mean(x^2) + eps) of x (n,), the squares summed in double precision (llama.cpp's
 * way: a float sum of a wide row differs from it by some 1e-7, which can flip an 8-bit code of
 * the next product's quantized input) */
static inline float rms_scale(const float *x, int64_t n, float eps) {
    double ss = 0.0;
    for (int64_t i = 0; i < n; i++) ss += (double)(x[i] * x[i]);
    return 1.0f / sqrtf((float)(ss / (double)n) + eps);
}

static void norm_rows(const Model *md, const Norm *nm, const float *x, float *out, int64_t M) {
    const int64_t C = md->C;
    for (int64_t m = 0; m < M; m++) {
        const float *xm = x + m * C;
        float *om = out + m * C;
        if (md->norm == NORM_RMS) {
            const float r = rms_scale(xm, C, md->eps);
            for (int64_t c = 0; c < C; c++) om[c] = nm->w ? xm[c] * r * nm->w[c] : xm[c] * r;
        } else {
            float mean = 0.0f, var = 0.0f;
            for (int64_t c = 0; c < C; c++) mean += xm[c];
            mean /= (float)C;
            for (int64_t c = 0; c < C; c++) var += (xm[c] - mean) * (xm[c] - mean);
            const float r = 1.0f / sqrtf(var / (float)C + md->eps);
            for (int64_t c = 0; c < C; c++) {
                float v = (xm[c] - mean) * r;
                if (nm->w) v *= nm->w[c];
                if (nm->b) v += nm->b[c];
                om[c] = v;
            }
        }
    }
}

/* a sublayer's input: the rows normed, or as they are where the model has no pre-norms */
static void pre_norm(const Model *md, const Norm *nm, const float *x, float *out, int64_t M) {
    if (md->no_pre) memcpy(out, x, (size_t)(M * md->C) * sizeof(float));
    else norm_rows(md, nm, x, out, M);
}

/* RMSNorm of one head's (D,) vector in place, gains w (D,) */
static inline void norm_head(float *v, const float *w, int64_t D, float eps) {
    const float r = rms_scale(v, D, eps);
    for (int64_t i = 0; i < D; i++) v[i] = v[i] * r * w[i];
}

/* rotate-half of one head's first D features, pairs (i, i + D/2), by cos, sin (D/2,), as
 * rotate_pairs */
static inline void rotate(float *v, const float *cs, const float *sn, int64_t D) {
    const int64_t h = D / 2;
    for (int64_t i = 0; i < h; i++) {
        const float a = v[i], b = v[i + h];
        v[i] = GG_FMA(a, cs[i], -(b * sn[i]));
        v[i + h] = GG_FMA(a, sn[i], b * cs[i]);
    }
}

/* e^x in 16 lanes as llama.cpp's CPU backend computes it on AVX-512 (ggml_v_expf; its softmax
 * and SiLU): n = x / ln2 rounded to an integer (by adding 1.5 2^23), b = x - n ln2 with ln2 in
 * two parts (each product fused), e^b by a polynomial of degree 5 (in b and b^2, each step
 * fused), then times 2^n (exact: scalef, or the exponent's bits); |n| > 192: 0 below zero,
 * infinity above. */
static inline vf vexp(vf x) {
    const vf zero = {0}, r = zero + 0x1.8p23f;
    const vf n = vfma(x, zero + 0x1.715476p+0f, r) - r;
    const vf b = vfma(-n, zero + 0x1.7f7d1cp-20f, vfma(-n, zero + 0x1.62e4p-1f, x));
    const vf u = b * b;
    const vf j = vfma(vfma(vfma(zero + 0x1.0e4020p-7f, b, zero + 0x1.573e2ep-5f), u,
                           vfma(zero + 0x1.555e66p-3f, b, zero + 0x1.fffdb6p-2f)),
                      u, vfma(zero + 0x1.ffffecp-1f, b, zero + 1.0f));
#ifdef __AVX512F__
    const __m512 res = _mm512_scalef_ps((__m512)j, (__m512)n);
    const __mmask16 big = _mm512_cmp_ps_mask(_mm512_abs_ps((__m512)n), _mm512_set1_ps(192.0f),
                                             _CMP_GT_OQ);
    if (!big) return (vf)res;
    const __m512 alt = _mm512_mask_blend_ps(
        _mm512_cmp_ps_mask((__m512)n, _mm512_setzero_ps(), _CMP_LE_OQ),
        _mm512_set1_ps(INFINITY), _mm512_setzero_ps());
    return (vf)_mm512_mask_blend_ps(big, res, alt);
#else
    const vi in = (n >= -126.0f) & (n <= 126.0f);
    const vi e = ((__builtin_convertvector(n, vi) & in) + 127) << 23; /* 2^n where in range */
    vf res = j * (vf)e;
    for (int i = 0; i < 16; i++)
        if (!in[i]) /* rare: e^x below 2^-126 or above 2^127 */
            res[i] = n[i] > 192.0f ? INFINITY : n[i] < -192.0f ? 0.0f : ldexpf(j[i], (int)n[i]);
    return res;
#endif
}

static inline float act(int64_t kind, float v) {
    if (kind == ACT_GELU) return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
    if (kind == ACT_GELU_TANH) {
        const float c = 0.79788456080286536f; /* sqrt(2 / pi) */
        return 0.5f * v * (1.0f + tanhf(c * (v + 0.044715f * v * v * v)));
    }
    return v > 0.0f ? v : 0.0f;
}

/* GELU's tanh form in 16 lanes (tanh u = 1 - 2 / (e^2u + 1)) */
static inline vf vgelu_tanh(vf v) {
    const vf u = 0.79788456080286536f * (v + 0.044715f * v * v * v);
    return 0.5f * v * (2.0f - 2.0f / (vexp(u + u) + 1.0f));
}

/* the float16 bits of v rounded to the nearest (ties to even); |v| below 65504 */
static inline uint16_t f16_bits(float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    const uint16_t sign = (u >> 16) & 0x8000;
    u &= 0x7fffffffu;
    if (u >= 0x38800000u) { /* a normal float16: 10 bits of the fraction kept, re-biased */
        u += 0xfffu + ((u >> 13) & 1);
        return sign | (uint16_t)((u >> 13) - (112u << 10));
    }
    float a; /* a subnormal one: multiples of 2^-24 */
    memcpy(&a, &u, 4);
    return sign | (uint16_t)rintf(a * 0x1p24f);
}

/* GELU's tanh form as llama.cpp's CPU backend computes it (GGML_GELU_FP16, its default): 0 at
 * or below -10, v at or above 10, else a table's value for v rounded to float16: the GELU of
 * each float16 in (-10, 10), rounded to float16 (filled when the library is loaded) */
static float gelu_table[65536];

__attribute__((constructor)) static void fill_gelu_table(void) {
    for (uint32_t i = 0; i < 65536; i++) {
        const float x = from_f16((uint16_t)i), c = 0.79788456080286536f; /* sqrt(2 / pi) */
        if (!(x > -10.0f && x < 10.0f)) continue; /* never read */
        /* the inner sum fused, as GCC contracts it where the CPU has FMA (llama.cpp's native
         * build): written out so that a build without FMA fills the same table */
        const float g = 0.5f * x * (1.0f + tanhf(c * x * fmaf(0.044715f * x, x, 1.0f)));
        gelu_table[i] = from_f16(f16_bits(g));
    }
}

static inline float gelu_f16(float v) {
    if (v <= -10.0f) return 0.0f;
    if (v >= 10.0f) return v;
    return gelu_table[f16_bits(v)];
}

/* the feed-forward's activation over one row h: a gated one's (SwiGLU: SiLU(gate) * up;
 * GeGLU: GELU_tanh(gate) * up, or gelu_f16's) into the gate's half h[0, F) (h[F, 2F): up),
 * or act() over h[0, F); SiLU and GELU's tanh form 16 lanes at a time */
static void activate(int64_t kind, float *h, int64_t F) {
    int64_t j = 0;
    if (kind == ACT_SWIGLU) {
#if AVX2_ROWS
        for (; j + 16 <= F; j += 16) swiglu16(h + j, h + F + j);
#endif
        for (; j + 16 <= F; j += 16) {
            const vf g = *(const vf *)(h + j);
            *(vf *)(h + j) = g / (1.0f + vexp(-g)) * *(const vf *)(h + F + j);
        }
        for (; j < F; j++) h[j] = h[j] / (1.0f + expf(-h[j])) * h[F + j];
        return;
    }
    if (kind == ACT_SWIGLU_OAI) { /* llama.cpp's ggml_swiglu_oai, one value at a time */
        for (; j < F; j++) {
            const float g = h[j] < OAI_LIMIT ? h[j] : OAI_LIMIT;
            const float u = h[F + j] < -OAI_LIMIT ? -OAI_LIMIT : h[F + j] > OAI_LIMIT ? OAI_LIMIT
                                                                                   : h[F + j];
            const float glu = g / (1.0f + expf(OAI_ALPHA * (-g)));
            h[j] = glu * (u + 1.0f);
        }
        return;
    }
    if (kind == ACT_GEGLU_F16) {
#ifdef __AVX512F__ /* gelu_f16 16 lanes at a time: the CPU's rounding to float16 (the same,
                    * to the nearest, ties to even), the table gathered */
        for (; j + 16 <= F; j += 16) {
            const __m512 v = _mm512_loadu_ps(h + j);
            const __m512i at = _mm512_cvtepu16_epi32(
                _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
            const __mmask16 in = _mm512_cmp_ps_mask(v, _mm512_set1_ps(-10.0f), _CMP_GT_OQ) &
                                 _mm512_cmp_ps_mask(v, _mm512_set1_ps(10.0f), _CMP_LT_OQ);
            const __mmask16 big = _mm512_cmp_ps_mask(v, _mm512_set1_ps(10.0f), _CMP_GE_OQ);
            __m512 g = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), in, at, gelu_table, 4);
            g = _mm512_mask_mov_ps(g, big, v);
            _mm512_storeu_ps(h + j, _mm512_mul_ps(g, _mm512_loadu_ps(h + F + j)));
        }
#endif
        for (; j < F; j++) h[j] = gelu_f16(h[j]) * h[F + j];
        return;
    }
    if (kind == ACT_GEGLU) {
        for (; j + 16 <= F; j += 16)
            *(vf *)(h + j) = vgelu_tanh(*(const vf *)(h + j)) * *(const vf *)(h + F + j);
        for (; j < F; j++) h[j] = act(ACT_GELU_TANH, h[j]) * h[F + j];
        return;
    }
    if (kind == ACT_GELU_TANH)
        for (; j + 16 <= F; j += 16) *(vf *)(h + j) = vgelu_tanh(*(const vf *)(h + j));
    for (; j < F; j++) h[j] = act(kind, h[j]);
}

/* scores -> cap tanh(score / cap) (Gemma 2's attention logits; cap 0: as they are), as
 * llama.cpp computes it: times 1 / cap, tanh, times cap */
static inline void softcap(float *v, int64_t n, float cap) {
    if (cap == 0.0f) return;
    const float inv = 1.0f / cap;
    for (int64_t i = 0; i < n; i++) v[i] = tanhf(v[i] * inv) * cap;
}

/* The sum of a[i] b[i], i < n, as llama.cpp's CPU backend takes the products of queries and
 * keys (ggml_vec_dot_f32 on AVX-512): 4 sums of 16 lanes, 64 values a pass (fused), added as
 * (0 + 2) + (1 + 3), their 16 lanes as a tree (gg_hsum); values past the last 64 one by one
 * (fused). */
static inline float dot(const float *a, const float *b, int64_t n) {
    vf a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        a0 = vfma(*(const vf *)(a + i), *(const vf *)(b + i), a0);
        a1 = vfma(*(const vf *)(a + i + 16), *(const vf *)(b + i + 16), a1);
        a2 = vfma(*(const vf *)(a + i + 32), *(const vf *)(b + i + 32), a2);
        a3 = vfma(*(const vf *)(a + i + 48), *(const vf *)(b + i + 48), a3);
    }
    float s = gg_hsum((a0 + a2) + (a1 + a3));
    for (; i < n; i++) s = GG_FMA(a[i], b[i], s);
    return s;
}

/* the 16 vectors' sum, lane by lane, in the order _mm512_reduce_add_ps adds 16 lanes */
static inline vf tree16(const vf *a) {
    vf t[8];
    for (int l = 0; l < 8; l++) t[l] = a[l] + a[l + 8];
    for (int l = 0; l < 4; l++) t[l] += t[l + 4];
    return (t[0] + t[2]) + (t[1] + t[3]);
}

/* lane j: v[j]'s 16 lanes added as _mm512_reduce_add_ps adds them (lanes i and i + 8, then
 * i and i + 4, i and i + 2, i and i + 1), the 16 vectors at once */
static inline vf tree16t(const vf *v) {
    vf w[8], x[4], y[2];
    for (int r = 0; r < 8; r++)
        w[r] = __builtin_shufflevector(v[r], v[r + 8], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20,
                                       21, 22, 23) +
               __builtin_shufflevector(v[r], v[r + 8], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26,
                                       27, 28, 29, 30, 31);
    for (int r = 0; r < 4; r++)
        x[r] = __builtin_shufflevector(w[r], w[r + 4], 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11,
                                       24, 25, 26, 27) +
               __builtin_shufflevector(w[r], w[r + 4], 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15,
                                       28, 29, 30, 31);
    for (int r = 0; r < 2; r++)
        y[r] = __builtin_shufflevector(x[r], x[r + 2], 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25,
                                       12, 13, 28, 29) +
               __builtin_shufflevector(x[r], x[r + 2], 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27,
                                       14, 15, 30, 31);
    return __builtin_shufflevector(y[0], y[1], 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28,
                                   14, 30) +
           __builtin_shufflevector(y[0], y[1], 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29,
                                   15, 31);
}

/* the scores of 16 keys k (16, D) at once: dot()'s numbers, its 16 lane trees together */
static inline void dot16(const float *q, const float *k, int64_t D, float *out) {
#if AVX2_ROWS
    dot16_halves(q, k, D, out);
    return;
#endif
    vf c[16];
    const int64_t D64 = D & ~(int64_t)63;
    for (int j = 0; j < 16; j++) {
        const float *kj = k + j * D;
        vf a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
        for (int64_t i = 0; i < D64; i += 64) {
            a0 = vfma(*(const vf *)(q + i), *(const vf *)(kj + i), a0);
            a1 = vfma(*(const vf *)(q + i + 16), *(const vf *)(kj + i + 16), a1);
            a2 = vfma(*(const vf *)(q + i + 32), *(const vf *)(kj + i + 32), a2);
            a3 = vfma(*(const vf *)(q + i + 48), *(const vf *)(kj + i + 48), a3);
        }
        c[j] = (a0 + a2) + (a1 + a3);
    }
    *(vf *)out = tree16t(c);
    for (int j = 0; j < 16; j++)
        for (int64_t i = D64; i < D; i++) out[j] = GG_FMA(q[i], k[j * D + i], out[j]);
}

/* acc[l] += p[s] v[s] (fused, in order of s; 16 lanes of v's rows, stride D) for the cells
 * c = c0 + s, s < S, with c mod L = off + l, l < 16: rounds of L cells, each round's 16 in
 * registers (the rounds inside [c0, c0 + S) without a test per cell) */
static inline __attribute__((always_inline)) void pv_lanes(const float *v, int64_t D,
                                                           const float *p, int64_t S, int64_t c0,
                                                           const int64_t L, int64_t off,
                                                           vf *acc) {
    for (int64_t b = c0 - c0 % L + off; b < c0 + S; b += L) {
        const int64_t s0 = b - c0;
        if (s0 >= 0 && s0 + 16 <= S) {
#pragma GCC unroll 16
            for (int l = 0; l < 16; l++)
                acc[l] = vfma(*(const vf *)(v + (s0 + l) * D), (vf){0} + p[s0 + l], acc[l]);
        } else {
#pragma GCC unroll 16
            for (int l = 0; l < 16; l++)
                if (s0 + l >= 0 && s0 + l < S)
                    acc[l] = vfma(*(const vf *)(v + (s0 + l) * D), (vf){0} + p[s0 + l], acc[l]);
        }
    }
}

/* attend() for any D, one value at a time (its e^x libm's: near llama.cpp's, not its bits) */
static void attend_any(const Model *md, const float *q, const float *k, const float *v,
                       int64_t S, int64_t c0, int pre, int batch, const float *sink,
                       float *scores, float *out) {
    const int64_t D = md->D, L = batch ? 16 : 64;
    float qq[D];
    for (int64_t i = 0; i < D; i++) qq[i] = pre ? q[i] * md->scale : q[i];
    for (int64_t s = 0; s < S; s++) scores[s] = dot(qq, k + s * D, D);
    softcap(scores, S, md->attn_softcap);
    if (!pre)
        for (int64_t s = 0; s < S; s++) scores[s] *= md->scale;
    float mx = -INFINITY;
    for (int64_t s = 0; s < S; s++) mx = scores[s] > mx ? scores[s] : mx;
    if (sink) mx = *sink > mx ? *sink : mx;
    double sum = 0.0;
    for (int64_t s = 0; s < S; s++) sum += (double)(scores[s] = expf(scores[s] - mx));
    if (sink) sum += (double)expf(*sink - mx);
    const float inv = (float)(1.0 / sum);
    for (int64_t i = 0; i < D; i++) {
        float a[64] = {0};
        for (int64_t s = 0; s < S; s++)
            a[(c0 + s) % L] = GG_FMA(v[s * D + i], scores[s] * inv, a[(c0 + s) % L]);
        float t[16];
        for (int l = 0; l < 16; l++) t[l] = batch ? a[l] : (a[l] + a[l + 32]) + (a[l + 16] + a[l + 48]);
        for (int l = 0; l < 8; l++) t[l] += t[l + 8];
        for (int l = 0; l < 4; l++) t[l] += t[l + 4];
        out[i] = (t[0] + t[2]) + (t[1] + t[3]);
    }
}

/* llama.cpp's softmax (ggml_soft_max_f32) of the scores of the cells [c0, c0 + S): e^(s -
 * max) (vexp) of the cells in 16-cell groups of the cache (cells outside masked to 0), each
 * group's sum a tree (gg_hsum) added in double, the e's times (float)(1 / sum); with a sink
 * logit (gpt-oss; NULL: none) the max is at least the sink and e^(sink - max) (expf) joins
 * the sum last */
static void softmax_cells(float *scores, int64_t S, int64_t c0, const float *sink) {
    int64_t s;
    float mx = -INFINITY;
    for (s = 0; s < S; s++) mx = scores[s] > mx ? scores[s] : mx;
    if (sink) mx = *sink > mx ? *sink : mx;
    double sum = 0.0;
    for (int64_t g = c0 & ~(int64_t)15; g < c0 + S; g += 16) {
        vf x;
        const int whole = g >= c0 && g + 16 <= c0 + S;
        if (whole) {
            x = *(const vf *)(scores + (g - c0)) - mx;
        } else { /* the cells of the group outside [c0, c0 + S) masked */
            for (int l = 0; l < 16; l++) {
                s = g + l - c0;
                x[l] = s >= 0 && s < S ? scores[s] - mx : -INFINITY;
            }
        }
        const vf e = vexp(x);
        if (whole) {
            *(vf *)(scores + (g - c0)) = e;
        } else {
            for (int l = 0; l < 16; l++) {
                s = g + l - c0;
                if (s >= 0 && s < S) scores[s] = e[l];
            }
        }
        sum += (double)gg_hsum(e);
    }
    if (sink) sum += (double)expf(*sink - mx);
    const float inv = (float)(1.0 / sum);
    for (s = 0; s < S; s++) scores[s] *= inv;
}

/* One query row (D,) against one head's keys and values (S, D) at the cache cells
 * [c0, c0 + S): out (D,), in llama.cpp's arithmetic without flash attention (float32 cache),
 * bit for bit on AVX-512: the scores q.k (dot; q scaled first where `pre`: Gemma's queries,
 * which llama.cpp scales before the product, else the scores after it), soft-capped, then its
 * softmax (ggml_soft_max_f32): e^(s - max) (vexp) of the cells in 16-cell groups of the cache
 * (cells outside [c0, c0 + S) masked to 0), each group's sum a tree (gg_hsum) added in double,
 * the e's times (float)(1 / sum); then the values weighted by them as its product of float32
 * matrices sums them: with more than one row a step (`batch`: tinyBLAS's sgemm) a sum per cell
 * c mod 16 (fused) and those 16 as a tree; one row (ggml_vec_dot_f32 over the cells) a sum per
 * cell mod 64, then as dot() adds its lanes. D a multiple of 16, at most 256. */
static void attend(const Model *md, const float *q, const float *k, const float *v, int64_t S,
                   int64_t c0, int pre, int batch, const float *sink, float *scores, float *out) {
    const int64_t D = md->D;
    float qs[256] __attribute__((aligned(64)));
    if (D % 16 || D > 256) return attend_any(md, q, k, v, S, c0, pre, batch, sink, scores, out);
    if (pre) {
        for (int64_t i = 0; i < D; i++) qs[i] = q[i] * md->scale;
        q = qs;
    }
    int64_t s = 0;
    for (; s + 16 <= S; s += 16) dot16(q, k + s * D, D, scores + s);
    for (; s < S; s++) scores[s] = dot(q, k + s * D, D);
    softcap(scores, S, md->attn_softcap);
    if (!pre)
        for (s = 0; s < S; s++) scores[s] *= md->scale;
    softmax_cells(scores, S, c0, sink);
#if AVX2_ROWS
    pv_halves(v, D, scores, S, c0, batch, out);
    return;
#endif
    for (int64_t i = 0; i < D; i += 16) {
        vf acc[16];
        for (int l = 0; l < 16; l++) acc[l] = (vf){0};
        if (batch) {
            pv_lanes(v + i, D, scores, S, c0, 16, 0, acc);
        } else { /* the sums of the cells c mod 64 = l, l + 16, l + 32, l + 48, added after */
            vf part[4][16];
            for (int j = 0; j < 4; j++) {
                for (int l = 0; l < 16; l++) part[j][l] = (vf){0};
                pv_lanes(v + i, D, scores, S, c0, 64, 16 * j, part[j]);
            }
            for (int l = 0; l < 16; l++)
                acc[l] = (part[0][l] + part[2][l]) + (part[1][l] + part[3][l]);
        }
        *(vf *)(out + i) = tree16(acc);
    }
}

#if defined(__AVX512F__) && defined(__GNUC__) && !defined(__clang__)
#define ATTEND4 1
/* lane l < L of A (4 heads x L, stride 64): sum over the cells c = c0 + s, s < S, c mod L = l,
 * of p_h[s] v[s] (fused, in order of s; v the 16 values of a slice of each row, stride 256),
 * the 4 heads' sums of 4 lanes in registers, each value row loaded once for the 4 */
static inline __attribute__((always_inline)) void pv4(const float *v, const float *p, int64_t S,
                                                      int64_t c0, const int64_t L, vf *A) {
    for (int64_t g = 0; g < L; g += 4) {
        vf acc[4][4];
        for (int h = 0; h < 4; h++)
            for (int l = 0; l < 4; l++) acc[h][l] = (vf){0};
        for (int64_t b = c0 - c0 % L + g; b < c0 + S; b += L)
            for (int l = 0; l < 4; l++) {
                const int64_t s = b + l - c0;
                if (s < 0 || s >= S) continue;
                const vf vv = *(const vf *)(v + s * 256);
                for (int h = 0; h < 4; h++)
                    acc[h][l] = vfma(vv, (vf){0} + p[h * S + s], acc[h][l]);
            }
        for (int h = 0; h < 4; h++)
            for (int l = 0; l < 4; l++) A[64 * h + g + l] = acc[h][l];
    }
}

/* attend() for 4 query heads of D = 256 sharing their keys and values (grouped-query
 * attention: Gemma 3's shape), queries scaled first as Gemma's, bit for bit the same numbers,
 * each key and value row loaded once for the 4 heads (attend() head by head took Gemma 3
 * 270M's 512-token prefill 1.2x the CPU time): per key the 4 heads' 4 partial sums of dot()
 * in registers, then each head's 16 keys' trees at once (tree16t). q (4, D) with row stride
 * ldq, out (4, D) with stride ldo, scores (4, S). */
static void attend4_256(const float *q, int64_t ldq, const float *k, const float *v, int64_t S,
                        int64_t c0, int batch, float scale, float cap, float *scores, float *out,
                        int64_t ldo) {
    enum { D = 256 };
    float qs[4][D] __attribute__((aligned(64)));
    for (int h = 0; h < 4; h++)
        for (int i = 0; i < D; i++) qs[h][i] = q[h * ldq + i] * scale;
    vf c[4][16];
    for (int64_t s = 0; s < S; s++) {
        const float *ks = k + s * D;
        vf a[4][4];
        for (int h = 0; h < 4; h++)
            for (int x = 0; x < 4; x++) a[h][x] = (vf){0};
        for (int i = 0; i < D; i += 64)
            for (int x = 0; x < 4; x++) {
                const vf kv = *(const vf *)(ks + i + 16 * x);
                for (int h = 0; h < 4; h++)
                    a[h][x] = vfma(*(const vf *)(qs[h] + i + 16 * x), kv, a[h][x]);
            }
        const int j = s % 16;
        for (int h = 0; h < 4; h++) c[h][j] = (a[h][0] + a[h][2]) + (a[h][1] + a[h][3]);
        if (j == 15)
            for (int h = 0; h < 4; h++) *(vf *)(scores + h * S + s - 15) = tree16t(c[h]);
    }
    for (int64_t s = S - S % 16; s < S; s++)
        for (int h = 0; h < 4; h++) scores[h * S + s] = gg_hsum(c[h][s % 16]);
    for (int h = 0; h < 4; h++) {
        softcap(scores + h * S, S, cap);
        softmax_cells(scores + h * S, S, c0, NULL);
    }
    vf A[4 * 64];
    for (int64_t i = 0; i < D; i += 16) {
        pv4(v + i, scores, S, c0, batch ? 16 : 64, A);
        for (int h = 0; h < 4; h++) {
            vf acc[16];
            const vf *a = A + 64 * h;
            for (int l = 0; l < 16; l++)
                acc[l] = batch ? a[l] : (a[l] + a[l + 32]) + (a[l + 16] + a[l + 48]);
            *(vf *)(out + h * ldo + i) = tree16(acc);
        }
    }
}
#else
#define ATTEND4 0
#endif

/* -- the step ------------------------------------------------------------------------------ */

/* the rows' q and k heads normalized (Qwen3, Gemma 3) and rotated by the layer's table (none
 * with table -1), their keys and values written to the cache at (slot, position) */
static void place(const Model *md, const Block *bk, float *qkv, int64_t M, const Rows *rw,
                  int64_t m0, int64_t m1) {
    const int64_t H = md->H, Hkv = md->Hkv, D = md->D, NQ = (H + 2 * Hkv) * D, cap = md->cap;
    const int64_t table = bk->table < 0 ? 0 : bk->table, turn = md->rotary && bk->table >= 0;
    const int64_t R = md->rot ? md->rot : D; /* the features rotated */
    const float *cos_t = rw->cos + table * M * (R / 2);
    const float *sin_t = rw->sin + table * M * (R / 2);
    for (int64_t m = m0; m < m1; m++) {
        float *row = qkv + m * NQ;
        if (bk->q_norm.w && md->qk_all) { /* all heads' q, then all heads' k (OLMo 2) */
            norm_head(row, bk->q_norm.w, H * D, md->eps);
            norm_head(row + H * D, bk->k_norm.w, Hkv * D, md->eps);
        } else if (bk->q_norm.w) /* per-head norms of q and k, before the rotation */
            for (int64_t h = 0; h < H + Hkv; h++)
                norm_head(row + h * D, h < H ? bk->q_norm.w : bk->k_norm.w, D, md->eps);
        if (turn)
            for (int64_t h = 0; h < H + Hkv; h++) {
                const float *cs = cos_t + m * (R / 2), *sn = sin_t + m * (R / 2);
                if (md->rotary == 2) rotate_pairs(row + h * D, cs, sn, R);
                else rotate(row + h * D, cs, sn, R);
            }
        for (int64_t h = 0; h < Hkv; h++) {
            const int64_t at = ((rw->slot[m] * Hkv + h) * cap + rw->pos[m]) * D;
            memcpy(bk->k_cache + at, row + (H + h) * D, D * sizeof(float));
            memcpy(bk->v_cache + at, row + (H + Hkv + h) * D, D * sizeof(float));
        }
    }
}

/* thread t's share of the (row, head) pairs: row m's query against its slot's keys at the
 * positions it sees, [0, pos] or the window's band (rows of this step included) */
static void attend_rows(const Model *md, const Block *bk, const Scratch *sc, int64_t M,
                        const Rows *rw, float *scores, int t, int nt) {
    const int64_t H = md->H, Hkv = md->Hkv, D = md->D, NQ = (H + 2 * Hkv) * D;
    /* the units dealt in turn (a prompt's later rows see more keys: contiguous shares
     * would leave the thread with the earlier rows waiting) */
    const int pre = bk->post_attn.w != NULL; /* Gemma's queries scaled before the product */
#if ATTEND4
    const int64_t per = H / Hkv; /* query heads per key/value head */
    if (pre && !bk->sinks && D == 256 && per % 4 == 0 && md->cap <= 4096) { /* attend4_256 */
        float four[4 * 4096] __attribute__((aligned(64)));
        for (int64_t i = t; i < M * H / 4; i += nt) {
            const int64_t m = i / (H / 4), h = 4 * (i % (H / 4)), kv = h / per, p = rw->pos[m];
            const int64_t first = bk->window && p >= bk->window ? p - bk->window + 1 : 0;
            const int64_t at = ((rw->slot[m] * Hkv + kv) * md->cap + first) * D;
            attend4_256(sc->qkv + m * NQ + h * D, D, bk->k_cache + at, bk->v_cache + at,
                        p - first + 1, first, M > 1, md->scale, md->attn_softcap, four,
                        sc->att + m * H * D + h * D, D);
        }
        return;
    }
#endif
    for (int64_t i = t; i < M * H; i += nt) {
        const int64_t m = i / H, h = i % H, kv = h / (H / Hkv), p = rw->pos[m];
        const int64_t first = bk->window && p >= bk->window ? p - bk->window + 1 : 0;
        const int64_t at = ((rw->slot[m] * Hkv + kv) * md->cap + first) * D;
        attend(md, sc->qkv + m * NQ + h * D, bk->k_cache + at, bk->v_cache + at, p - first + 1,
               first, pre, M > 1, bk->sinks ? bk->sinks + h : NULL, scores,
               sc->att + m * H * D + h * D);
    }
}

/* v (n,) times s, each product rounded before anything adds it (llama.cpp's ggml_scale, then
 * its add: a function of its own, so that no product is fused into the add) */
__attribute__((noinline)) static void scale_all(float *v, int64_t n, float s) {
    for (int64_t i = 0; i < n; i++) v[i] *= s;
}

/* x (M, C) += a sublayer's output y (M, C), RMS-normalized by the gains nm first where nm->w
 * (Gemma's post-norms) and times md->residual_scale where set (Granite) (y overwritten) */
static void add_out(const Model *md, const Norm *nm, float *y, float *x, int64_t M) {
    if (nm->w) norm_rows(md, nm, y, y, M);
    if (md->residual_scale != 0.0f) scale_all(y, M * md->C, md->residual_scale);
    for (int64_t i = 0; i < M * md->C; i++) x[i] += y[i];
}

/* -- a mixture of experts ---------------------------------------------------------------- */

/* llama.cpp's lower clamp of the sum that renormalises the chosen experts' weights */
#define MIN_WEIGHT_SUM 6.103515625e-5f

/* the bytes of one row of L's weights */
static int64_t weight_row_bytes(const Linear *L) {
    if (L->fmt == FMT_F32) return 4 * L->k;
    if (L->fmt == FMT_BF16 || L->fmt == FMT_F16) return 2 * L->k;
    int64_t bytes;
    const int64_t el = gg_block(L->fmt, &bytes);
    return L->k / el * bytes;
}

/* matrix e of `rows` rows of the stacked experts' matrices L */
static Linear expert_rows(const Linear *L, int64_t e, int64_t rows) {
    Linear out = *L;
    out.n = out.n_pad = rows;
    out.w = (const uint8_t *)L->w + e * rows * weight_row_bytes(L);
    out.bias = L->bias ? L->bias + e * rows : NULL; /* (gpt-oss: the experts' stacked biases) */
    return out;
}

/* the softmax of n values p as llama.cpp takes it for a few (ggml_soft_max_f32 below 16
 * values): e^(p - max) (expf) one at a time, the sum in
 * double, each times (float)(1 / sum) */
static GG_NOFMA void softmax_few(float *p, int64_t n) {
    float mx = -INFINITY;
    for (int64_t e = 0; e < n; e++) mx = p[e] > mx ? p[e] : mx;
    double sum = 0.0;
    for (int64_t e = 0; e < n; e++) sum += (double)(p[e] = expf(p[e] - mx));
    const float inv = (float)(1.0 / sum);
    for (int64_t e = 0; e < n; e++) p[e] *= inv;
}

/* one row's routing, as llama.cpp's build_moe_ffn: p = softmax(scores) (E,) (overwritten),
 * the k experts of highest p in that order (the lower index first among equals), their p as
 * weights, renormalised to sum to one with norm (the sum clamped below); with topk_softmax
 * (gpt-oss) the k of highest score, their weights the softmax of their scores */
static GG_NOFMA void route(float *p, int64_t E, int64_t k, int64_t norm, int64_t topk_softmax,
                           float *w, int64_t *chosen) {
    if (!topk_softmax) softmax_few(p, E);
    for (int64_t j = 0; j < k; j++) {
        int64_t best = 0;
        for (int64_t e = 1; e < E; e++) best = p[e] > p[best] ? e : best;
        w[j] = p[best], chosen[j] = best;
        p[best] = -INFINITY; /* taken */
    }
    if (topk_softmax) softmax_few(w, k);
    if (!norm) return;
    float total = 0.0f;
    for (int64_t j = 0; j < k; j++) total += w[j];
    total = total > MIN_WEIGHT_SUM ? total : MIN_WEIGHT_SUM;
    for (int64_t j = 0; j < k; j++) w[j] /= total;
}

/* out (C,) = sum over j of w[j] ys[pos[j]]: each product rounded, then added in order */
static GG_NOFMA void moe_sum(const float *ys, const int64_t *pos, const float *w, int64_t k,
                             int64_t C, float *out) {
    for (int64_t c = 0; c < C; c++) out[c] = w[0] * ys[pos[0] * C + c];
    for (int64_t j = 1; j < k; j++) {
        const float *y = ys + pos[j] * C;
        for (int64_t c = 0; c < C; c++) {
            const float p = w[j] * y[c];
            out[c] += p;
        }
    }
}

/* floats of Scratch.moe for M rows, E experts, k per row, width C, expert width F: the
 * routing (ids as int64), the gathered rows, the experts' outputs, their hidden rows and the
 * quantized rows of both products' inputs */
static int64_t moe_floats(int64_t M, int64_t E, int64_t k, int64_t C, int64_t F) {
    const int64_t rb = gg_row_bytes(C) > gg_row_bytes(F) ? gg_row_bytes(C) : gg_row_bytes(F);
    return 2 * (3 * M * k + E + 1) + M * E + M * k + 2 * M * k * C + 2 * M * k * F +
           (M * k * rb + 3) / 4 + 16;
}

/* the feed-forward of a mixture of experts over the M rows of sc->xn (normed), added to the
 * residual stream x (call from every thread of the region): each row's experts (route), the
 * rows gathered by expert and quantized once, every expert's gate and up products on its rows
 * (the products of its matrices in the stacked ones), the activation of all rows, their
 * quantization, every expert's down product, then per row the sum of its experts' outputs
 * times their weights in the order chosen (llama.cpp's sums), added to x: the experts' products
 * follow one another without a barrier between them (five barriers a layer, however many
 * experts the rows chose) */
static void experts(const Model *md, const Block *bk, const Scratch *sc, float *x, int64_t M,
                    int t, int nt) {
    const int64_t C = md->C, F = md->F, E = bk->n_expert, k = bk->n_used;
    const int64_t act = md->act == ACT_SWIGLU_OAI ? ACT_SWIGLU_OAI : ACT_SWIGLU;
    int64_t *chosen = (int64_t *)sc->moe, *pos = chosen + M * k, *src = pos + M * k;
    int64_t *base = src + M * k; /* (E + 1,) expert e's gathered rows [base[e], base[e + 1]) */
    float *logit = (float *)(base + E + 1), *w = logit + M * E, *xg = w + M * k;
    float *ys = xg + M * k * C, *hid = ys + M * k * C; /* hid (M k, 2 F) */
    uint8_t *xq = (uint8_t *)(hid + 2 * M * k * F);
    const int64_t rc = gg_row_bytes(C), rf = gg_row_bytes(F);
    int64_t lo, hi;
    quantize_for(&bk->router, NULL, NULL, sc->xn, M, C, sc->xq, t, nt);
    linear(&bk->router, sc->xn, M, C, logit, E, NULL, sc->part, sc->xq, t, nt);
    BARRIER();
    share(M, t, nt, &lo, &hi);
    for (int64_t m = lo; m < hi; m++)
        route(logit + m * E, E, k, bk->norm_topk, bk->topk_softmax, w + m * k, chosen + m * k);
    BARRIER();
    if (t == 0) { /* rows by expert, in row order */
        int64_t at = 0;
        for (int64_t e = 0; e < E; e++) {
            base[e] = at;
            for (int64_t i = 0; i < M * k; i++)
                if (chosen[i] == e) pos[i] = at, src[at++] = i / k;
        }
        base[E] = at;
    }
    BARRIER();
    share(M * k, t, nt, &lo, &hi);
    for (int64_t i = lo; i < hi; i++) memcpy(xg + i * C, sc->xn + src[i] * C, C * sizeof(float));
    BARRIER();
    const Linear gate0 = expert_rows(&bk->fc, 0, F), up0 = expert_rows(&bk->up, 0, F);
    const Linear down0 = expert_rows(&bk->proj, 0, C);
    quantize_for(&gate0, &up0, NULL, xg, M * k, C, xq, t, nt); /* every gathered row, once */
    for (int64_t e = 0; e < E; e++) { /* each thread its share of each expert's rows */
        const int64_t n = base[e + 1] - base[e];
        if (!n) continue;
        const Linear gate = expert_rows(&bk->fc, e, F), up = expert_rows(&bk->up, e, F);
        const float *xe = xg + base[e] * C;
        float *he = hid + base[e] * 2 * F;
        linear(&gate, xe, n, C, he, 2 * F, NULL, sc->part, xq + base[e] * rc, t, nt);
        linear(&up, xe, n, C, he + F, 2 * F, NULL, sc->part, xq + base[e] * rc, t, nt);
    }
    BARRIER();
    for (int64_t i = lo; i < hi; i++) activate(act, hid + i * 2 * F, F);
    BARRIER();
    quantize_for(&down0, NULL, NULL, hid, M * k, 2 * F, xq, t, nt);
    for (int64_t e = 0; e < E; e++) {
        const int64_t n = base[e + 1] - base[e];
        if (!n) continue;
        const Linear down = expert_rows(&bk->proj, e, C);
        linear(&down, hid + base[e] * 2 * F, n, 2 * F, ys + base[e] * C, C, NULL, sc->part,
               xq + base[e] * rf, t, nt);
    }
    BARRIER();
    share(M, t, nt, &lo, &hi);
    for (int64_t m = lo; m < hi; m++) moe_sum(ys, pos + m * k, w + m * k, k, C, sc->xn + m * C);
    add_out(md, &bk->post_mlp, sc->xn + lo * C, x + lo * C, hi - lo);
    BARRIER();
}

/* one block over the M rows (call from every thread of the region); the steps between the
 * products (norms, q/k norms and rotation, cache writes, the activation) each thread on its
 * share of the rows (row by row: the numbers of one thread's) */
static void layer(const Model *md, const Block *bk, const Scratch *sc, float *x, int64_t M,
                  const Rows *rw, int t, int nt) {
    const int64_t C = md->C, H = md->H, Hkv = md->Hkv, D = md->D, F = md->F;
    const int64_t NQ = (H + 2 * Hkv) * D;
    const int64_t NF = md->act == ACT_SWIGLU || md->act >= ACT_GEGLU ? 2 * F : F;
    /* sublayer outputs go through xn where they are normed (Gemma) or scaled (Granite) before
     * the residual add; else the products add them to x themselves */
    const int apart = bk->post_attn.w != NULL || md->residual_scale != 0.0f;
    int64_t lo, hi; /* this thread's rows */
    share(M, t, nt, &lo, &hi);
    pre_norm(md, &bk->ln_1, x + lo * C, sc->xn + lo * C, hi - lo);
    BARRIER();
    quantize_for(&bk->qkv, &bk->k, &bk->v, sc->xn, M, C, sc->xq, t, nt);
    linear(&bk->qkv, sc->xn, M, C, sc->qkv, NQ, NULL, sc->part, sc->xq, t, nt);
    if (bk->k.w) { /* separate k and v */
        linear(&bk->k, sc->xn, M, C, sc->qkv + H * D, NQ, NULL, sc->part, sc->xq, t, nt);
        linear(&bk->v, sc->xn, M, C, sc->qkv + (H + Hkv) * D, NQ, NULL, sc->part, sc->xq, t, nt);
    }
    BARRIER();
    place(md, bk, sc->qkv, M, rw, lo, hi);
    BARRIER();
    attend_rows(md, bk, sc, M, rw, sc->scores + t * md->cap, t, nt);
    BARRIER();
    quantize_for(&bk->out, NULL, NULL, sc->att, M, H * D, sc->xq, t, nt);
    linear(&bk->out, sc->att, M, H * D, apart ? sc->xn : x, C, apart ? NULL : x, sc->part, sc->xq,
           t, nt);
    BARRIER();
    if (apart) add_out(md, &bk->post_attn, sc->xn + lo * C, x + lo * C, hi - lo);
    pre_norm(md, &bk->ln_2, x + lo * C, sc->xn + lo * C, hi - lo);
    BARRIER();
    if (bk->n_expert) {
        experts(md, bk, sc, x, M, t, nt);
        return;
    }
    quantize_for(&bk->fc, &bk->up, NULL, sc->xn, M, C, sc->xq, t, nt);
    linear(&bk->fc, sc->xn, M, C, sc->hid, NF, NULL, sc->part, sc->xq, t, nt);
    if (bk->up.w) /* the up half apart */
        linear(&bk->up, sc->xn, M, C, sc->hid + F, NF, NULL, sc->part, sc->xq, t, nt);
    BARRIER();
    for (int64_t m = lo; m < hi; m++) activate(md->act, sc->hid + m * NF, F);
    BARRIER();
    quantize_for(&bk->proj, NULL, NULL, sc->hid, M, NF, sc->xq, t, nt);
    linear(&bk->proj, sc->hid, M, NF, apart ? sc->xn : x, C, apart ? NULL : x, sc->part, sc->xq, t,
           nt);
    BARRIER();
    if (apart) {
        add_out(md, &bk->post_mlp, sc->xn + lo * C, x + lo * C, hi - lo);
        BARRIER();
    }
}

typedef struct {
    const Model *md;
    const Scratch *sc;
    float *x, *logits;
    int64_t M;
    const Rows *rw;
} StepArgs;

static void step_team(void *ctx, int t, int nt) {
    const StepArgs *a = ctx;
    const Model *md = a->md;
    const Scratch *sc = a->sc;
    const int64_t C = md->C, R = a->rw->R, V = md->V;
    for (int64_t l = 0; l < md->n_layer; l++)
        layer(md, md->blocks + l, sc, a->x, a->M, a->rw, t, nt);
    if (t == 0)
        for (int64_t r = 0; r < R; r++) /* the rows asked for, gathered */
            norm_rows(md, &md->ln_f, a->x + a->rw->out[r] * C, sc->xn + r * C, 1);
    BARRIER();
    quantize_for(&md->head, NULL, NULL, sc->xn, R, C, sc->xq, t, nt);
    linear(&md->head, sc->xn, R, C, a->logits, V, NULL, sc->part, sc->xq, t, nt);
    if (md->final_softcap != 0.0f) {
        BARRIER();
        int64_t lo, hi;
        share(R, t, nt, &lo, &hi);
        softcap(a->logits + lo * V, (hi - lo) * V, md->final_softcap);
    }
    if (md->logit_scale != 0.0f) { /* Granite's logits, times 1 / logits_scaling */
        BARRIER();
        int64_t lo, hi;
        share(R, t, nt, &lo, &hi);
        scale_all(a->logits + lo * V, (hi - lo) * V, md->logit_scale);
    }
}

/* x (M, C) holds the rows' input embeddings (positions added, for a model with learned ones)
 * and is overwritten by the residual stream; rw says where each row is (its cache slot and
 * position: its key and value are written there, and it attends over its slot's positions up
 * to its own, those written by earlier rows of this step included) and which rows' logits
 * are wanted: logits (R, V), R of the M rows (a prompt needs only its last: the head is the
 * largest product, V C per row). The products run once over all M rows. */
void attnlm_step_rows(const Model *md, const Scratch *sc, float *x, int64_t M, const Rows *rw,
                      float *logits, int threads) {
    StepArgs a = {md, sc, x, logits, M, rw};
    run_team(threads, step_team, &a);
}

/* B sequences x T new tokens each (row m = b T + t: cache slot b, position held + t) through
 * attnlm_step_rows; cos, sin (T, R/2) for the new positions (one table); logits (M, V), or
 * with `last_only` (B, V): each sequence's last position alone */
void attnlm_decode_step(const Model *md, const Scratch *sc, float *x, int64_t B, int64_t T,
                        int64_t held, const float *cos_t, const float *sin_t, float *logits,
                        int last_only, int threads) {
    const int64_t M = B * T, half = (md->rot ? md->rot : md->D) / 2, R = last_only ? B : M;
    int64_t *idx = malloc((2 * M + R) * sizeof(int64_t));
    float *turn = malloc(2 * M * half * sizeof(float) + 1);
    if (idx && turn) {
        for (int64_t m = 0; m < M; m++) {
            idx[m] = m / T, idx[M + m] = held + m % T;
            memcpy(turn + m * half, cos_t + (m % T) * half, half * sizeof(float));
            memcpy(turn + (M + m) * half, sin_t + (m % T) * half, half * sizeof(float));
        }
        for (int64_t r = 0; r < R; r++) idx[2 * M + r] = last_only ? r * T + T - 1 : r;
        const Rows rw = {idx, idx + M, turn, turn + M * half, idx + 2 * M, R};
        attnlm_step_rows(md, sc, x, M, &rw, logits, threads);
    }
    free(idx);
    free(turn);
}

/* The rotary table of M positions, cos and sin (M, D/2), as llama.cpp's CPU backend computes
 * it (rope without YaRN): pair i's angle is freq_scale (p theta^i / factors[i]), theta =
 * base^(-2/D) (powf), its powers taken one product at a time in float; cosf and sinf of it.
 * factors (D/2,): Llama 3.1's frequency factors (a GGUF file's rope_freqs), NULL for none. */
void attnlm_rope(const int64_t *pos, int64_t M, int64_t D, float base, float freq_scale,
                 const float *factors, float *cos_t, float *sin_t) {
    const float step = powf(base, -2.0f / (float)D);
    for (int64_t m = 0; m < M; m++) {
        float theta = (float)pos[m];
        for (int64_t i = 0; i < D / 2; i++) {
            const float a = freq_scale * (factors ? theta / factors[i] : theta);
            cos_t[m * (D / 2) + i] = cosf(a);
            sin_t[m * (D / 2) + i] = sinf(a);
            theta *= step;
        }
    }
}

/* the feed-forward's activation over h alone (its own tests): kind as Model.act, h (F,) or
 * (2F,) for SwiGLU */
void attnlm_activate(int64_t kind, float *h, int64_t F) { activate(kind, h, F); }

typedef struct {
    const Linear *L;
    const float *x;
    int64_t M;
    float *y, *part;
    uint8_t *xq;
} LinearArgs;

static void linear_team(void *ctx, int t, int nt) {
    const LinearArgs *a = ctx;
    quantize_for(a->L, NULL, NULL, a->x, a->M, a->L->k, a->xq, t, nt);
    linear(a->L, a->x, a->M, a->L->k, a->y, a->L->n, NULL, a->part, a->xq, t, nt);
}

/* y (M, N) = x (M, K) W^T + b alone (the products' own tests); part (threads, M, N) */
void attnlm_linear(const Linear *L, const float *x, int64_t M, float *y, float *part,
                   int threads) {
    uint8_t *xq = gg_int(L) ? malloc(M * gg_row_bytes(L->k)) : NULL;
    if (gg_int(L) && !xq) return;
    LinearArgs a = {L, x, M, y, part, xq};
    run_team(threads, linear_team, &a);
    free(xq);
}

/* what the build's instructions include (bits: 1 FMA (x86's, or ARM's fused multiply-add),
 * 2 F16C, 4 AVX2, 8 AVX-512F, 16 VNNI) and 32 when its threads are OpenMP's (else POSIX
 * threads'): fused multiply-adds round once where a build without them rounds twice */
int64_t attnlm_features(void) {
    int64_t f = 0;
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
    f |= 1;
#endif
#ifdef __F16C__
    f |= 2;
#endif
#ifdef __AVX2__
    f |= 4;
#endif
#ifdef __AVX512F__
    f |= 8;
#endif
#if GG_VNNI
    f |= 16;
#endif
#ifdef _OPENMP
    f |= 32;
#endif
    return f;
}

/* the struct sizes, so the Python side can check its mirror */
/* floats of Scratch.moe (moe_floats) */
int64_t attnlm_moe_floats(int64_t M, int64_t E, int64_t k, int64_t C, int64_t F) {
    return moe_floats(M, E, k, C, F);
}

int64_t attnlm_sizes(int64_t which) {
    switch (which) {
    case 0: return sizeof(Linear);
    case 1: return sizeof(Norm);
    case 2: return sizeof(Block);
    case 3: return sizeof(Model);
    case 4: return sizeof(Scratch);
    case 5: return sizeof(Rows);
    default: return -1;
    }
}
