/* Decode's matrix products on a CPU: y [T, N] = x [T, K] @ W [N, K]^T for a few rows T (1..MAX_ROWS).
 *
 * At decode's row counts the product is a stream over W: each weight is read once and multiplied into every row
 * of x, kept in registers, so the time is W's bytes over the memory's bandwidth. The weight formats:
 *   f32   W float32
 *   bf16  W bfloat16 (widened to float32 by a shift)
 *   i8    W int8, one scale per output row (G = 0) or per block of 32 inputs (G = 32: llama.cpp's Q8_0, scales
 *         [N, K / 32] in x's dtype): w = q * s (in bf16 with AVX2 and K a multiple of 32, x is rounded to int8 per
 *         block of 32 and the dot product runs in integers, as llama.cpp's Q8_0 x Q8_0)
 *   q4    W in llama.cpp-style blocks of 32 inputs: 16 bytes, byte j holding input j (low nibble) and
 *         input j + 16 (high nibble), codes 0..15; per group of G inputs (a multiple of 32) a scale s and a zero z
 *         : w = (q - 8) * s + z, so a row's sum is s * dot(x, q) + (z - 8 s) * sum(x) per group (sum(x) of the x
 *         the dot takes: rounded to int8 on the integer path, as llama.cpp's Q8_1 blocks carry theirs). The scales and
 *         zeros come row by row, [N, K / G, 2] (each row's beside each other: one stream per row, not K / G).
 * x, y and the scales are float32 or bfloat16 (x_bf16); sums run in float32, in a fixed order per row whatever T is.
 * Built with -march=native at first use (kernels/cpu_gemv.py); GCC's vector extensions pick the machine's widest
 * registers. Threads split the output rows (OpenMP, `threads` of them).
 */
#include <stdlib.h>

#define GROUP 8     /* rows of x one pass over a weight row holds in registers */
#define MAX_ROWS 64 /* rows of x one call takes: GROUP at a time over each weight row, read once from memory */
#define PARALLEL_WORK 65536 /* weights x rows under which one thread beats waking the others */
#include "cpu_kernels.h"
#include "cpu_simd.h"

int gemv_max_rows(void) { return MAX_ROWS; }

/* One weight row (dense formats) against T rows of x: two accumulators per row of x, K a multiple of 16
 * (the Python side checks). */
#define DENSE_ROW(NAME, WTYPE, WIDEN)                                                                       \
    static inline __attribute__((always_inline)) void NAME(const WTYPE *w, const float *x, int T, int K,    \
                                                           float *out) {                                   \
        vf acc[GROUP][2];                                                                                \
        for (int t = 0; t < T; t++) acc[t][0] = acc[t][1] = (vf){0};                                        \
        for (int k = 0; k < K; k += 2 * LANES) {                                                            \
            vf w0 = WIDEN(w + k), w1 = WIDEN(w + k + LANES);                                                \
            for (int t = 0; t < T; t++) {                                                                   \
                acc[t][0] += w0 * load_f32(x + (size_t)t * K + k);                                          \
                acc[t][1] += w1 * load_f32(x + (size_t)t * K + k + LANES);                                  \
            }                                                                                               \
        }                                                                                                   \
        for (int t = 0; t < T; t++) out[t] = hsum(acc[t][0] + acc[t][1]);                                   \
    }

DENSE_ROW(row_f32, float, load_f32)
DENSE_ROW(row_bf16, uint16_t, widen_bf16)
DENSE_ROW(row_i8, int8_t, widen_i8)

/* One int8 row with a scale per block of 32 inputs, on the float path: the block's weights scaled, then multiplied. */
static inline __attribute__((always_inline)) void row_i8_blocks(const int8_t *w, const void *block_scales,
                                                                int aux_bf16, const float *x, int T, int K,
                                                                float *out) {
    vf acc[GROUP];
    for (int t = 0; t < T; t++) acc[t] = (vf){0};
    for (int b = 0; b < K; b += 32) {
        const float s = scalar_at(block_scales, b / 32, aux_bf16);
        vf block[32 / LANES];
        for (int i = 0; i < 32 / LANES; i++) block[i] = widen_i8(w + b + i * LANES) * s;
        for (int t = 0; t < T; t++)
            for (int i = 0; i < 32 / LANES; i++) acc[t] += block[i] * load_f32(x + (size_t)t * K + b + i * LANES);
    }
    for (int t = 0; t < T; t++) out[t] = hsum(acc[t]);
}

/* The inputs of a product: x [T, K] in float32, its per-group sums (q4's zeros' term, [T, K / G]) and, where the
 * integer dot product runs (AVX2, and x in bfloat16: 8 bits of precision already), x rounded to int8 per block of
 * 32 with one scale each, as llama.cpp's Q8 activations are; xq is NULL otherwise (float products). */
typedef struct {
    const float *x, *xsum, *xscale; /* xscale: [T, K / 32] */
    const int8_t *xq;               /* [T, K] */
    /* q4 on the integer path: the same in row_q4_paired's order (paired_layout) */
    const int8_t *paired_xq;                  /* [T, K]: per pair of blocks, j's 0..15, j+1's 0..15, j's 16..31 */
    const float *paired_xscale, *paired_xsum; /* [T, K / 32]: per 8 blocks in ORDER (the last K % 256 inputs' scales
                                                 in input order, their sums unused) */
} Inputs;

#ifdef __AVX2__
/* dot(x block, q block) of 32 inputs as int8 x times u8 codes, in int32, as float lanes. */
static inline vf block_dot(__m256i codes, const int8_t *xq) {
    const __m256i pairs = _mm256_maddubs_epi16(codes, _mm256_loadu_si256((const __m256i *)xq));
    return (vf)_mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}
#endif

#ifdef __AVX2__
/* dot(x block, w block) of 32 int8 inputs and int8 weights in int32, as float lanes: vpmaddubsw multiplies unsigned
 * by signed bytes, so |w| times x carrying w's sign (|-128| reads as 128 unsigned; x is within +-127). */
static inline vf block_dot_i8(__m256i w, __m256i magnitude, const int8_t *xq) {
    const __m256i pairs = _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)xq), w));
    return (vf)_mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

/* One int8 row on the integer path (K a multiple of 32): per block its integer dot times x's block scale (and the
 * weight's, where it has one a block: block_scales, else NULL). */
static inline __attribute__((always_inline)) void row_i8_q8(const int8_t *w, const void *block_scales, int aux_bf16,
                                                            Inputs in, int T, int K, float *out) {
    vf acc[GROUP][2];
    for (int t = 0; t < T; t++) acc[t][0] = acc[t][1] = (vf){0};
    for (int b = 0; b < K; b += 64) { /* two blocks a pass, one into each accumulator (fixed indices: registers) */
        const int pair = b + 64 <= K;
        const __m256i first = _mm256_loadu_si256((const __m256i *)(w + b)), first_size = _mm256_sign_epi8(first, first);
        const __m256i second = pair ? _mm256_loadu_si256((const __m256i *)(w + b + 32)) : _mm256_setzero_si256();
        const __m256i second_size = _mm256_sign_epi8(second, second);
        const float s0 = block_scales ? scalar_at(block_scales, b / 32, aux_bf16) : 1.0f;
        const float s1 = block_scales && pair ? scalar_at(block_scales, b / 32 + 1, aux_bf16) : 1.0f;
        for (int t = 0; t < T; t++) {
            const size_t at = (size_t)t * K + b;
            acc[t][0] += block_dot_i8(first, first_size, in.xq + at) * (in.xscale[at / 32] * s0);
            if (pair) acc[t][1] += block_dot_i8(second, second_size, in.xq + at + 32) * (in.xscale[at / 32 + 1] * s1);
        }
    }
    for (int t = 0; t < T; t++) out[t] = hsum(acc[t][0] + acc[t][1]);
}
#endif

/* One q4 row: per block of 32 inputs dot(x, q), scaled by the group's s (and x's block scale); the zeros' term
 * from the per-group sums of x. */
static inline __attribute__((always_inline)) void row_q4(const uint8_t *w, const void *scales_zeros, int aux_bf16,
                                                         Inputs in, int T, int K, int G, float *out) {
    vf acc[GROUP];
    float zero_term[GROUP];
    for (int t = 0; t < T; t++) acc[t] = (vf){0}, zero_term[t] = 0.0f;
    const int groups = K / G;
    for (int g = 0; g < groups; g++) {
        const float s = scalar_at(scales_zeros, 2 * g, aux_bf16), z = scalar_at(scales_zeros, 2 * g + 1, aux_bf16);
        for (int b = g * G; b < (g + 1) * G; b += 32) {
#ifdef __AVX2__
            if (in.xq) {
                const __m128i packed = _mm_loadu_si128((const __m128i *)(w + b / 2)), low4 = _mm_set1_epi8(15);
                const __m256i codes = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(packed, 4), low4),
                                                       _mm_and_si128(packed, low4));
                for (int t = 0; t < T; t++) {
                    const float scale = s * in.xscale[((size_t)t * K + b) / 32];
                    acc[t] += block_dot(codes, in.xq + (size_t)t * K + b) * scale;
                }
                continue;
            }
#endif
            const vu8x16 block = *(const vu8x16 *)(w + b / 2), lo = block & 15, hi = block >> 4;
            const vf q0 = widen_u8(&lo, 0), q1 = widen_u8(&lo, 8), q2 = widen_u8(&hi, 0), q3 = widen_u8(&hi, 8);
            for (int t = 0; t < T; t++) {
                const float *xb = in.x + (size_t)t * K + b;
                acc[t] += (q0 * load_f32(xb) + q1 * load_f32(xb + 8) + q2 * load_f32(xb + 16) +
                           q3 * load_f32(xb + 24)) * s;
            }
        }
        for (int t = 0; t < T; t++) zero_term[t] += (z - 8.0f * s) * in.xsum[(size_t)t * groups + g];
    }
    for (int t = 0; t < T; t++) out[t] = hsum(acc[t]) + zero_term[t];
}

#include "cpu_q4.h" /* row_q4_paired and paired_layout: q4 on the integer path */

#ifdef __AVX2__
/* x [T, K] rounded to int8 per block of 32 (round to nearest even, as lrintf; the block's largest magnitude maps to
 * 127), with each block's scale and the sum of the x its codes stand for (scale times the codes' sum). */
static void quantize_blocks(const float *x, size_t count, int8_t *xq, float *xscale, float *xblock_sum) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7); /* undoes the packs' per-128-bit interleave */
    for (size_t b = 0; b < count / 32; b++) {
        __m256 v[4], amax = _mm256_setzero_ps();
        for (int i = 0; i < 4; i++)
            v[i] = _mm256_loadu_ps(x + b * 32 + 8 * i), amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[i]));
        __m128 half = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
        half = _mm_max_ps(half, _mm_movehl_ps(half, half));
        const float largest = _mm_cvtss_f32(_mm_max_ss(half, _mm_movehdup_ps(half)));
        const float scale = largest / 127.0f, inverse = largest > 0 ? 127.0f / largest : 0.0f;
        __m256i q[4];
        for (int i = 0; i < 4; i++) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], _mm256_set1_ps(inverse)));
        const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        _mm256_storeu_si256((__m256i *)(xq + b * 32), _mm256_permutevar8x32_epi32(bytes, order));
        const __m256i sums = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        __m128i total = _mm_add_epi32(_mm256_castsi256_si128(sums), _mm256_extracti128_si256(sums, 1));
        total = _mm_add_epi32(total, _mm_shuffle_epi32(total, 0x4e));
        total = _mm_add_epi32(total, _mm_shuffle_epi32(total, 0xb1));
        xscale[b] = scale, xblock_sum[b] = scale * (float)_mm_cvtsi128_si32(total);
    }
}
#endif

/* n values (float32 or bfloat16) as float32. */
static void widen_values(const void *from, float *to, int n, int bf16) {
    int k = 0;
    if (bf16)
        for (; k + LANES <= n; k += LANES) *(vf_u *)(to + k) = widen_bf16((const uint16_t *)from + k);
    for (; k < n; k++) to[k] = load_value(from, k, bf16);
}

enum { W_F32 = 0, W_BF16 = 1, W_I8 = 2, W_Q4 = 3 };

/* Rows of one weight format with T fixed at compile time (so the accumulators stay in registers). */
#define DISPATCH_T(BODY)                        \
    switch (T) {                                \
    case 1: { const int TT = 1; BODY; } break;  \
    case 2: { const int TT = 2; BODY; } break;  \
    case 3: { const int TT = 3; BODY; } break;  \
    case 4: { const int TT = 4; BODY; } break;  \
    case 5: { const int TT = 5; BODY; } break;  \
    case 6: { const int TT = 6; BODY; } break;  \
    case 7: { const int TT = 7; BODY; } break;  \
    default: { const int TT = 8; BODY; } break; \
    }

/* Weight row n against T <= GROUP rows of x: out [T]. */
static inline __attribute__((always_inline)) void group_rows(int format, const void *w, const void *aux,
                                                            int aux_bf16, int n, const Inputs *restrict in_rows,
                                                            int T, int K, int G, float *out) {
    const Inputs in = *in_rows;
    const float *x = in.x;
    switch (format) {
    case W_F32: DISPATCH_T(row_f32((const float *)w + (size_t)n * K, x, TT, K, out)); break;
    case W_BF16: DISPATCH_T(row_bf16((const uint16_t *)w + (size_t)n * K, x, TT, K, out)); break;
    case W_I8: {
        const int8_t *codes = (const int8_t *)w + (size_t)n * K;
        if (G == 32) { /* a scale per block */
            const void *block_scales = (const char *)aux + (size_t)n * (K / 32) * (aux_bf16 ? 2 : 4);
            if (in.xq) {
#ifdef __AVX2__
                DISPATCH_T(row_i8_q8(codes, block_scales, aux_bf16, in, TT, K, out));
#endif
            } else {
                DISPATCH_T(row_i8_blocks(codes, block_scales, aux_bf16, x, TT, K, out));
            }
            break;
        }
        if (in.xq) {
#ifdef __AVX2__
            DISPATCH_T(row_i8_q8(codes, NULL, 0, in, TT, K, out));
#endif
        } else {
            DISPATCH_T(row_i8(codes, x, TT, K, out));
        }
        for (int t = 0; t < T; t++) out[t] *= scalar_at(aux, n, aux_bf16);
        break;
    }
    default: {
        const uint8_t *codes = (const uint8_t *)w + (size_t)n * K / 2;
        const void *scales_zeros = (const char *)aux + (size_t)n * (K / G) * 2 * (aux_bf16 ? 2 : 4);
#ifdef __AVX2__
        if (in.paired_xq) {
            DISPATCH_T(row_q4_paired(codes, (const uint16_t *)scales_zeros, in, TT, K, G, out));
            break;
        }
#endif
        DISPATCH_T(row_q4(codes, scales_zeros, aux_bf16, in, TT, K, G, out));
    }
    }
}

/* Output rows n0 .. n1 of y [T, N]: each weight row against every row of x, GROUP rows of x at a time (the weight
 * row stays in cache between the groups). */
static void rows(int format, const void *w, const void *aux, int aux_bf16, int N, int n0, int n1, Inputs in,
                 int T, int K, int G, float *y) {
    float out[GROUP];
    if (T <= GROUP) { /* one group: the common case, kept lean (a weight row is ~100 cycles of work) */
        for (int n = n0; n < n1; n++) {
            group_rows(format, w, aux, aux_bf16, n, &in, T, K, G, out);
            for (int t = 0; t < T; t++) y[(size_t)t * N + n] = out[t];
        }
        return;
    }
    Inputs parts[(MAX_ROWS + GROUP - 1) / GROUP]; /* x's rows GROUP at a time */
    const int groups = format == W_Q4 ? K / G : 0, count = (T + GROUP - 1) / GROUP;
    for (int part = 0; part < count; part++) {
        const size_t t0 = (size_t)part * GROUP;
        parts[part] = in;
        parts[part].x = in.x + t0 * K, parts[part].xsum = in.xsum + t0 * groups;
        if (in.xq) parts[part].xq = in.xq + t0 * K, parts[part].xscale = in.xscale + t0 * K / 32;
        if (in.paired_xq)
            parts[part].paired_xq = in.paired_xq + t0 * K, parts[part].paired_xscale = in.paired_xscale + t0 * K / 32,
            parts[part].paired_xsum = in.paired_xsum + t0 * K / 32;
    }
    for (int n = n0; n < n1; n++)
        for (int part = 0; part < count; part++) {
            const int t0 = part * GROUP, rows_here = T - t0 < GROUP ? T - t0 : GROUP;
            group_rows(format, w, aux, aux_bf16, n, &parts[part], rows_here, K, G, out);
            for (int t = 0; t < rows_here; t++) y[(size_t)(t0 + t) * N + n] = out[t];
        }
}

/* y [T, N] (float32 or bfloat16 as x) = x [T, K] @ W^T, or [x, x] [T, K] with x [T, K / 2] when `doubled`
 * (int8-split). aux: the i8 scales ([N] at G = 0, [N, K / 32] at G = 32) or the q4 scales and zeros [N, K / G, 2], in
 * x's dtype; G: the q4 group, or i8's. Returns 0, or -1 when a buffer could not be had. */
int gemv(int format, const void *w, const void *aux, int N, int K, int G, int doubled, const void *x, int x_bf16,
         int T, void *y, int threads) {
    const size_t inputs = (size_t)T * K, groups = format == W_Q4 ? (size_t)K / G : 0;
#ifdef __AVX2__
    const int integer = x_bf16 && (format == W_Q4 || (format == W_I8 && K % 32 == 0));
    const size_t blocks = integer ? inputs / 32 : 0;
#else
    const size_t blocks = 0;
#endif
    const size_t paired = format == W_Q4 ? blocks : 0; /* row_q4_paired's copy of x's blocks */
    /* one buffer: x and y in float32, the per-group sums and block scales of x (and their paired copies), then x in
     * int8 (and its copy) */
    float *xf = malloc(sizeof(float) * (inputs + (size_t)T * groups + 2 * blocks + 2 * paired + (size_t)T * N) +
                       (blocks + paired) * 32);
    if (!xf) return -1;
    float *xsum = xf + inputs, *xscale = xsum + (size_t)T * groups, *xblock_sum = xscale + blocks;
    float *paired_xscale = xblock_sum + blocks, *paired_xsum = paired_xscale + paired, *yf = paired_xsum + paired;
    int8_t *xq = (int8_t *)(yf + (size_t)T * N), *paired_xq = xq + blocks * 32;
    const int width = doubled ? K / 2 : K; /* x's inputs: int8-split multiplies [x, x] (its hi halves', then lo's) */
    for (int t = 0; t < T; t++)
        for (int k = 0; k < K; k += width)
            widen_values((const char *)x + (size_t)t * width * (x_bf16 ? 2 : 4), xf + (size_t)t * K + k, width, x_bf16);
#ifdef __AVX2__
    if (blocks) quantize_blocks(xf, inputs, xq, xscale, xblock_sum);
#endif
    /* the zeros' terms' sums of x: of the x the dots multiply (rounded to int8: the codes' mean, 8 s, then cancels
     * against the same x; with the float x, 8 s times the rounding errors' sum stays, ~10 % of an int8-split row) */
    for (int t = 0; t < T; t++)
        for (size_t g = 0; g < groups; g++) {
            float s = 0.0f;
            if (blocks)
                for (size_t b = ((size_t)t * K + g * G) / 32; b < ((size_t)t * K + (g + 1) * G) / 32; b++)
                    s += xblock_sum[b];
            else
                for (size_t k = g * G; k < (g + 1) * G; k++) s += xf[(size_t)t * K + k];
            xsum[(size_t)t * groups + g] = s;
        }
    Inputs in = {xf, xsum, xscale, blocks ? xq : NULL, NULL, NULL, NULL};
#ifdef __AVX2__
    if (paired) {
        paired_layout(in, T, K, G, paired_xq, paired_xscale, paired_xsum);
        in.paired_xq = paired_xq, in.paired_xscale = paired_xscale, in.paired_xsum = paired_xsum;
    }
#endif
    float *dest = x_bf16 ? yf : (float *)y;
    const int chunk = 16; /* rows per scheduling unit: a cache line of y per row of x at least */
#pragma omp parallel for schedule(static) num_threads(threads) if ((size_t)N * K * T >= PARALLEL_WORK)
    for (int c = 0; c < (N + chunk - 1) / chunk; c++) {
        const int n0 = c * chunk, n1 = n0 + chunk < N ? n0 + chunk : N;
        rows(format, w, aux, x_bf16, N, n0, n1, in, T, K, G, dest);
    }
    if (x_bf16)
        for (size_t i = 0; i < (size_t)T * N; i++) ((uint16_t *)y)[i] = f32_to_bf16(yf[i]);
    free(xf);
    return 0;
}
