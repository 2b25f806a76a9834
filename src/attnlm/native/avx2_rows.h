/* The C step's own products (16-bit floats, q8, q4) and attention's query-key scores where
 * vectors are 8 lanes: AVX2 with FMA and without AVX-512 (x86-64-v3, most laptops). Included
 * by decode_step.c, which defines vf, Linear, from_f16, store and prefetch.
 *
 * The generic code works on 16-lane vectors (vf); GCC compiles them for AVX2 as pairs of 8-lane
 * registers but moves their halves, widenings and shuffles through memory and keeps too many
 * of them live for AVX2's 16 registers (measured on one thread: bfloat16 rows 7.4x, q8 5x,
 * q4 11-22x the time of the AVX-512 build). Here the same sums are taken in halves of 8 lanes:
 * lane l of a 16-lane sum is lane l % 8 of half l / 8, every multiply-add fused as GCC fuses
 * the generic code's, every total in the generic code's order (hsum: lanes 0..15 in turn), so
 * that a build for x86-64-v3 gives the numbers of a build for AVX-512 bit for bit
 * (tests/native/test_avx2_products.py). */

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
#include <immintrin.h>
#define AVX2_ROWS 1

/* two 8-lane halves summed as hsum sums a 16-lane vector: lanes 0..15 in turn */
static inline float hsum_halves(__m256 lo, __m256 hi) {
    float t[16], s = 0.0f;
    _mm256_storeu_ps(t, lo), _mm256_storeu_ps(t + 8, hi);
    for (int i = 0; i < 16; i++) s += t[i];
    return s;
}

/* rows_f32's sum of one row: two 16-lane sums (32 values a pass) in halves, added, then
 * hsum, the values past the last 16 fused in turn */
static inline float f32_row_sum(const float *w, const float *xm, int64_t K) {
    const int64_t K16 = K & ~(int64_t)15;
    __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()}; /* the two sums' halves */
    int64_t k = 0;
    for (; k + 32 <= K16; k += 32)
        for (int h = 0; h < 4; h++)
            a[h] = _mm256_fmadd_ps(_mm256_loadu_ps(w + k + 8 * h), _mm256_loadu_ps(xm + k + 8 * h),
                                   a[h]);
    for (; k < K16; k += 16)
        for (int h = 0; h < 2; h++)
            a[h] = _mm256_fmadd_ps(_mm256_loadu_ps(w + k + 8 * h), _mm256_loadu_ps(xm + k + 8 * h),
                                   a[h]);
    float s = hsum_halves(_mm256_add_ps(a[0], a[2]), _mm256_add_ps(a[1], a[3]));
    for (; k < K; k++) s = fmaf(w[k], xm[k], s);
    return s;
}

/* 8 16-bit floats (bits) as floats: bfloat16 shifted into place; IEEE float16 as from_f16x16
 * takes it (the exponent re-biased by a multiplication) */
static inline __m256 half8(__m128i h, const int brain) {
    const __m256i v = _mm256_cvtepu16_epi32(h);
    if (brain) return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    const __m256 mag = _mm256_mul_ps(
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0x7fff)), 13)),
        _mm256_set1_ps(0x1p112f));
    return _mm256_or_ps(mag, _mm256_castsi256_ps(_mm256_slli_epi32(
                                 _mm256_and_si256(v, _mm256_set1_epi32(0x8000)), 16)));
}

/* 8 int8 (p[0..7]) as floats */
static inline __m256 i8x8(const int8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

/* rows_half's sum of one row (16-bit floats, bfloat16 where `brain`) over the first K16
 * values (a multiple of 16), in halves, then hsum */
static inline float half_row_sum(const uint16_t *w, const float *xm, int64_t K16,
                                 const int brain) {
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    for (int64_t k = 0; k < K16; k += 16) {
        const __m256i raw = _mm256_loadu_si256((const __m256i *)(w + k));
        lo = _mm256_fmadd_ps(half8(_mm256_castsi256_si128(raw), brain), _mm256_loadu_ps(xm + k),
                             lo);
        hi = _mm256_fmadd_ps(half8(_mm256_extracti128_si256(raw, 1), brain),
                             _mm256_loadu_ps(xm + k + 8), hi);
    }
    return hsum_halves(lo, hi);
}

/* rows_q8's sums of one weight row (int8 codes w, float16 scales s of G groups of 32) for
 * the R rows of x at x (stride ldx), in halves: per group (w0 x0 + w1 x1) sg into each row's
 * sums (the first product fused into the second, then the scale's fused into the sum) */
static inline __attribute__((always_inline)) void q8_row_sums(const int8_t *w, const uint16_t *s,
                                                              int64_t G, const float *x,
                                                              int64_t ldx, const int R,
                                                              float *out) {
    __m256 lo[4], hi[4];
    for (int r = 0; r < R; r++) lo[r] = hi[r] = _mm256_setzero_ps();
    for (int64_t g = 0; g < G; g++) {
        const int8_t *q = w + 32 * g;
        const __m256 a0 = i8x8(q), b0 = i8x8(q + 8), a1 = i8x8(q + 16), b1 = i8x8(q + 24);
        const __m256 sg = _mm256_set1_ps(from_f16(s[g]));
        for (int r = 0; r < R; r++) {
            const float *xg = x + r * ldx + 32 * g;
            const __m256 tl = _mm256_fmadd_ps(a0, _mm256_loadu_ps(xg),
                                              _mm256_mul_ps(a1, _mm256_loadu_ps(xg + 16)));
            const __m256 th = _mm256_fmadd_ps(b0, _mm256_loadu_ps(xg + 8),
                                              _mm256_mul_ps(b1, _mm256_loadu_ps(xg + 24)));
            lo[r] = _mm256_fmadd_ps(tl, sg, lo[r]);
            hi[r] = _mm256_fmadd_ps(th, sg, hi[r]);
        }
    }
    for (int r = 0; r < R; r++) out[r] = hsum_halves(lo[r], hi[r]);
}

/* q4_block's 64 sums per row of x in halves, out (R, 64) floats: rows 0..31 (the low nibbles)
 * then 32..63 (the high ones) in two passes over a group's 32 columns, so that each pass's sums
 * stay in registers; per group out += d (sum u x) + m (sum x) (d's product fused) */
static inline __attribute__((always_inline)) void q4_block_avx2(
    const Linear *L, int64_t blk, const float *x, int64_t ldx, const int R, int ahead,
    float out[][64]) {
    const int64_t G = L->k / 32;
    const uint8_t *wb = (const uint8_t *)L->w + blk * L->k * 32;
    for (int r = 0; r < R; r++)
        for (int j = 0; j < 64; j++) out[r][j] = 0.0f;
    const __m256i low = _mm256_set1_epi32(15);
    for (int64_t g = 0; g < G; g++) {
        const uint8_t *p = wb + g * 32 * 32;
        if (ahead) { /* two groups ahead (the next block's follow its last group) */
            prefetch(p + 2 * 1024, 1024);
            prefetch(L->scales + (blk * G + g + 2) * 128, 256);
        }
        float xs[4] = {0}; /* R <= 4 (Q4_ROWS) */
        for (int kk = 0; kk < 32; kk++)
            for (int r = 0; r < R; r++) xs[r] += x[r * ldx + 32 * g + kk];
        const uint16_t *dm = L->scales + (blk * G + g) * 64 * 2;
        for (int pass = 0; pass < 2; pass++) { /* rows 32 pass .. 32 pass + 31 */
            __m256 a[4][4];
            for (int r = 0; r < R; r++)
                for (int h = 0; h < 4; h++) a[r][h] = _mm256_setzero_ps();
            const uint8_t *pk = p;
            for (int kk = 0; kk < 32; kk++, pk += 32) {
                __m256 w[4];
                for (int h = 0; h < 4; h++) {
                    const __m256i b =
                        _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(pk + 8 * h)));
                    w[h] = _mm256_cvtepi32_ps(pass ? _mm256_srli_epi32(b, 4)
                                                   : _mm256_and_si256(b, low));
                }
                for (int r = 0; r < R; r++) {
                    const __m256 xk = _mm256_broadcast_ss(x + r * ldx + 32 * g + kk);
                    for (int h = 0; h < 4; h++) a[r][h] = _mm256_fmadd_ps(w[h], xk, a[r][h]);
                }
            }
            for (int h = 0; h < 4; h++) { /* rows 32 pass + 8 h ..: their (d, m) pairs */
                const uint16_t *pair = dm + 2 * (32 * pass + 8 * h);
                const __m256 p0 = half8(_mm_loadu_si128((const __m128i *)pair), 0);
                const __m256 p1 = half8(_mm_loadu_si128((const __m128i *)(pair + 8)), 0);
                /* even lanes d, odd lanes m: in-lane shuffles leave the 64-bit pairs 0 2 1 3 */
                const __m256 d = _mm256_castpd_ps(_mm256_permute4x64_pd(
                    _mm256_castps_pd(_mm256_shuffle_ps(p0, p1, 0x88)), 0xd8));
                const __m256 mn = _mm256_castpd_ps(_mm256_permute4x64_pd(
                    _mm256_castps_pd(_mm256_shuffle_ps(p0, p1, 0xdd)), 0xd8));
                for (int r = 0; r < R; r++) {
                    float *o = out[r] + 32 * pass + 8 * h;
                    const __m256 t =
                        _mm256_fmadd_ps(d, a[r][h], _mm256_mul_ps(mn, _mm256_set1_ps(xs[r])));
                    _mm256_storeu_ps(o, _mm256_add_ps(_mm256_loadu_ps(o), t));
                }
            }
        }
    }
}

/* dot16 where vectors are 8 lanes: the same numbers in halves of 8 lanes (tree16t's shuffles
 * of 16-lane vectors went through memory: 5.7x the time of AVX-512's in a prefill) */
static inline void dot16_halves(const float *q, const float *k, int64_t D, float *out) {
    __m256 a[16], b[8], c[4], d[2];
    const int64_t D64 = D & ~(int64_t)63;
    for (int j = 0; j < 16; j++) {
        const float *kj = k + j * D;
        __m256 s[8];
        for (int h = 0; h < 8; h++) s[h] = _mm256_setzero_ps();
        for (int64_t i = 0; i < D64; i += 64)
            for (int h = 0; h < 8; h++) /* h / 2: dot()'s sum, h % 2: its half */
                s[h] = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8 * h),
                                       _mm256_loadu_ps(kj + i + 8 * h), s[h]);
        const __m256 lo = _mm256_add_ps(_mm256_add_ps(s[0], s[4]), _mm256_add_ps(s[2], s[6]));
        const __m256 hi = _mm256_add_ps(_mm256_add_ps(s[1], s[5]), _mm256_add_ps(s[3], s[7]));
        a[j] = _mm256_add_ps(lo, hi); /* lanes i and i + 8 */
    }
    for (int j = 0; j < 8; j++) /* i and i + 4: key j's in the low 128 bits, j + 8's high */
        b[j] = _mm256_add_ps(_mm256_permute2f128_ps(a[j], a[j + 8], 0x20),
                             _mm256_permute2f128_ps(a[j], a[j + 8], 0x31));
    for (int j = 0; j < 4; j++) /* i and i + 2: keys 2j, 2j + 1 (and + 8) */
        c[j] = _mm256_add_ps(_mm256_shuffle_ps(b[2 * j], b[2 * j + 1], 0x44),
                             _mm256_shuffle_ps(b[2 * j], b[2 * j + 1], 0xee));
    for (int j = 0; j < 2; j++) /* i and i + 1: keys 4j .. 4j + 3 (and + 8) */
        d[j] = _mm256_add_ps(_mm256_shuffle_ps(c[2 * j], c[2 * j + 1], 0x88),
                             _mm256_shuffle_ps(c[2 * j], c[2 * j + 1], 0xdd));
    _mm256_storeu_ps(out, _mm256_permute2f128_ps(d[0], d[1], 0x20));
    _mm256_storeu_ps(out + 8, _mm256_permute2f128_ps(d[0], d[1], 0x31));
    for (int j = 0; j < 16; j++)
        for (int64_t i = D64; i < D; i++) out[j] = fmaf(q[i], k[j * D + i], out[j]);
}

/* vexp in 8 lanes (the same steps; lanes with |n| > 126, rare, as the generic code takes
 * them) */
static inline __m256 vexp8(__m256 x) {
#define C8(v) _mm256_set1_ps(v)
    const __m256 r = C8(0x1.8p23f);
    const __m256 n = _mm256_sub_ps(_mm256_fmadd_ps(x, C8(0x1.715476p+0f), r), r);
    const __m256 mn = _mm256_xor_ps(n, C8(-0.0f));
    const __m256 b = _mm256_fmadd_ps(mn, C8(0x1.7f7d1cp-20f),
                                     _mm256_fmadd_ps(mn, C8(0x1.62e4p-1f), x));
    const __m256 u = _mm256_mul_ps(b, b);
    const __m256 j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(_mm256_fmadd_ps(C8(0x1.0e4020p-7f), b, C8(0x1.573e2ep-5f)), u,
                        _mm256_fmadd_ps(C8(0x1.555e66p-3f), b, C8(0x1.fffdb6p-2f))),
        u, _mm256_fmadd_ps(C8(0x1.ffffecp-1f), b, C8(1.0f)));
    const __m256 in = _mm256_and_ps(_mm256_cmp_ps(n, C8(-126.0f), _CMP_GE_OQ),
                                    _mm256_cmp_ps(n, C8(126.0f), _CMP_LE_OQ));
#undef C8
    const __m256i e = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_and_si256(_mm256_cvttps_epi32(n), _mm256_castps_si256(in)),
                         _mm256_set1_epi32(127)), 23);
    __m256 res = _mm256_mul_ps(j, _mm256_castsi256_ps(e));
    const int all = _mm256_movemask_ps(in);
    if (all != 0xff) { /* rare: e^x below 2^-126 or above 2^127 */
        float rs[8], ns[8], js[8];
        _mm256_storeu_ps(rs, res), _mm256_storeu_ps(ns, n), _mm256_storeu_ps(js, j);
        for (int i = 0; i < 8; i++)
            if (!(all >> i & 1))
                rs[i] = ns[i] > 192.0f   ? INFINITY
                        : ns[i] < -192.0f ? 0.0f
                                          : ldexpf(js[i], (int)ns[i]);
        res = _mm256_loadu_ps(rs);
    }
    return res;
}

/* SwiGLU's g / (1 + e^-g) u in halves (activate: 16 lanes a step) */
static inline void swiglu16(float *h, const float *up) {
    for (int k = 0; k < 16; k += 8) {
        const __m256 g = _mm256_loadu_ps(h + k);
        const __m256 e = vexp8(_mm256_xor_ps(g, _mm256_set1_ps(-0.0f)));
        const __m256 s = _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
        _mm256_storeu_ps(h + k, _mm256_mul_ps(s, _mm256_loadu_ps(up + k)));
    }
}

/* attend()'s weighted values in halves: out (D,) = the sums over the cells of p[s] v[s] per
 * class of cells c mod L (L = 16 with several rows a step, 64 with one: then the classes
 * l, l + 16, l + 32, l + 48 added as (0 + 2) + (1 + 3)), each fused in order of s, the 16 sums
 * added as tree16 adds them; 8 classes of 8 values at a time (16 of 16 spilled AVX2's 16
 * registers) */
static void pv_halves(const float *v, int64_t D, const float *p, int64_t S, int64_t c0,
                      int batch, float *out) {
    const int64_t L = batch ? 16 : 64;
    for (int64_t i = 0; i < D; i += 8) {
        __m256 acc[16], part[4][8];
        for (int g = 0; g < 2; g++) { /* the classes 8 g .. 8 g + 7 (of 16) */
            for (int j = 0; j < (batch ? 1 : 4); j++) {
                __m256 a[8];
                for (int l = 0; l < 8; l++) a[l] = _mm256_setzero_ps();
                for (int64_t b = c0 - c0 % L + 16 * j + 8 * g; b < c0 + S; b += L) {
                    const int64_t s0 = b - c0;
                    if (s0 >= 0 && s0 + 8 <= S) {
#pragma GCC unroll 8
                        for (int l = 0; l < 8; l++)
                            a[l] = _mm256_fmadd_ps(_mm256_loadu_ps(v + (s0 + l) * D + i),
                                                   _mm256_set1_ps(p[s0 + l]), a[l]);
                    } else {
                        for (int l = 0; l < 8; l++)
                            if (s0 + l >= 0 && s0 + l < S)
                                a[l] = _mm256_fmadd_ps(_mm256_loadu_ps(v + (s0 + l) * D + i),
                                                       _mm256_set1_ps(p[s0 + l]), a[l]);
                    }
                }
                for (int l = 0; l < 8; l++) part[j][l] = a[l];
            }
            for (int l = 0; l < 8; l++)
                acc[8 * g + l] = batch ? part[0][l]
                                       : _mm256_add_ps(_mm256_add_ps(part[0][l], part[2][l]),
                                                       _mm256_add_ps(part[1][l], part[3][l]));
        }
        __m256 t[8];
        for (int l = 0; l < 8; l++) t[l] = _mm256_add_ps(acc[l], acc[l + 8]);
        for (int l = 0; l < 4; l++) t[l] = _mm256_add_ps(t[l], t[l + 4]);
        const __m256 t02 = _mm256_add_ps(t[0], t[2]), t13 = _mm256_add_ps(t[1], t[3]);
        _mm256_storeu_ps(out + i, _mm256_add_ps(t02, t13));
    }
}
#else
#define AVX2_ROWS 0
#endif
