/* Decode's matrix products on a CPU: y [T, N] = x [T, K] @ W [N, K]^T for a few rows T (1..GEMV_MAX_ROWS).
 *
 * At decode's row counts the product is a stream over W: each weight is read once and multiplied into every row
 * of x, kept in registers, so the time is W's bytes over the memory's bandwidth. The weight formats:
 *   f32   W float32
 *   bf16  W bfloat16 (widened to float32 by a shift)
 *   i8    W int8, one float32 scale per output row: w = q * s (in bf16 with AVX2 and K a multiple of 32, x is
 *         rounded to int8 per block of 32 and the dot product runs in integers, as llama.cpp's Q8_0 x Q8_0)
 *   q4    W in llama.cpp-style blocks of 32 inputs: 16 bytes, byte j holding input j (low nibble) and
 *         input j + 16 (high nibble), codes 0..15; per group of G inputs (a multiple of 32) a scale s and a zero z
 *         : w = (q - 8) * s + z, so a row's sum is s * dot(x, q) + (z - 8 s) * sum(x) per group. The scales and
 *         zeros come row by row, [N, K / G, 2] (each row's beside each other: one stream per row, not K / G).
 * x, y and the scales are float32 or bfloat16 (x_bf16); sums run in float32, in a fixed order per row whatever T is.
 * Built with -march=native at first use (kernels/cpu_gemv.py); GCC's vector extensions pick the machine's widest
 * registers. Threads split the output rows (OpenMP, `threads` of them).
 */
#include <stdlib.h>

#define MAX_ROWS 8
#define PARALLEL_WORK 65536 /* weights x rows under which one thread beats waking the others */
#include "cpu_kernels.h"
#include "cpu_simd.h"

int gemv_max_rows(void) { return MAX_ROWS; }

/* One weight row (dense formats) against T rows of x: two accumulators per row of x, K a multiple of 16
 * (the Python side checks). */
#define DENSE_ROW(NAME, WTYPE, WIDEN)                                                                       \
    static inline __attribute__((always_inline)) void NAME(const WTYPE *w, const float *x, int T, int K,    \
                                                           float *out) {                                   \
        vf acc[MAX_ROWS][2];                                                                                \
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

/* The inputs of a product: x [T, K] in float32, its per-group sums (q4's zeros' term, [T, K / G]) and, where the
 * integer dot product runs (AVX2, and x in bfloat16: 8 bits of precision already), x rounded to int8 per block of
 * 32 with one scale each, as llama.cpp's Q8 activations are; xq is NULL otherwise (float products). */
typedef struct {
    const float *x, *xsum, *xscale; /* xscale: [T, K / 32] */
    const int8_t *xq;               /* [T, K] */
    /* at T = 1 on the integer path, for q4: the same in row_q4_single's order (single_layout) */
    const int8_t *single_xq;              /* [K]: per pair of blocks, j's 0..15, j+1's 0..15, j's 16..31, ... */
    const float *single_xscale, *single_xsum; /* [K / 32]: per 8 blocks in ORDER */
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

/* One int8 row on the integer path (K a multiple of 32): per block its integer dot times x's block scale. */
static inline __attribute__((always_inline)) void row_i8_q8(const int8_t *w, Inputs in, int T, int K, float *out) {
    vf acc[MAX_ROWS][2];
    for (int t = 0; t < T; t++) acc[t][0] = acc[t][1] = (vf){0};
    for (int b = 0; b < K; b += 64) { /* two blocks a pass, one into each accumulator (fixed indices: registers) */
        const int pair = b + 64 <= K;
        const __m256i first = _mm256_loadu_si256((const __m256i *)(w + b)), first_size = _mm256_sign_epi8(first, first);
        const __m256i second = pair ? _mm256_loadu_si256((const __m256i *)(w + b + 32)) : _mm256_setzero_si256();
        const __m256i second_size = _mm256_sign_epi8(second, second);
        for (int t = 0; t < T; t++) {
            const size_t at = (size_t)t * K + b;
            acc[t][0] += block_dot_i8(first, first_size, in.xq + at) * in.xscale[at / 32];
            if (pair) acc[t][1] += block_dot_i8(second, second_size, in.xq + at + 32) * in.xscale[at / 32 + 1];
        }
    }
    for (int t = 0; t < T; t++) out[t] = hsum(acc[t][0] + acc[t][1]);
}
#endif

/* One q4 row: per block of 32 inputs dot(x, q), scaled by the group's s (and x's block scale); the zeros' term
 * from the per-group sums of x. */
static inline __attribute__((always_inline)) void row_q4(const uint8_t *w, const void *scales_zeros, int aux_bf16,
                                                         Inputs in, int T, int K, int G, float *out) {
    vf acc[MAX_ROWS];
    float zero_term[MAX_ROWS];
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

#ifdef __AVX2__
/* The 32 codes of a q4 block as bytes, in input order. */
static inline __m256i q4_codes(const uint8_t *block) {
    const __m128i packed = _mm_loadu_si128((const __m128i *)block);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(packed, 4), packed), _mm256_set1_epi8(15));
}

/* row_q4 for decode's batch of 1 on the integer path (x, and so the scales, in bf16), eight blocks a pass: four
 * 32-byte loads of codes, two blocks each (the low nibbles hold inputs 0..15 of both, the high 16..31, so x comes
 * in that order: `Single`), their integer dots summed into one vector of the eight blocks' sums by three hadds (in
 * the order ORDER), scaled by a vector of the blocks' scales times x's, one FMA. At G = 32 the zeros' terms ride
 * along (a block is a group); wider groups take them per group. The last K % 256 inputs go block by block. */
static const int ORDER[8] = {0, 2, 4, 6, 1, 3, 5, 7}; /* which block each lane of three hadds' result sums */

static inline __m256i pair_dot(const uint8_t *codes, const int8_t *xq) {
    const __m256i packed = _mm256_loadu_si256((const __m256i *)codes), low4 = _mm256_set1_epi8(15);
    const __m256i low = _mm256_and_si256(packed, low4), high = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low4);
    const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(low, _mm256_loadu_si256((const __m256i *)xq)),
                                           _mm256_maddubs_epi16(high, _mm256_loadu_si256((const __m256i *)(xq + 32))));
    return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)); /* lanes 0..3: the first block's, 4..7: the second's */
}

static inline __attribute__((always_inline)) float row_q4_single(const uint8_t *w, const uint16_t *scales_zeros,
                                                                 Inputs in, int K, int G) {
    const int blocks = K / 32, full = blocks / 8 * 8, shift = __builtin_ctz(G / 32);
    const __m256i order = _mm256_loadu_si256((const __m256i *)ORDER), high_half = _mm256_set1_epi32((int)0xffff0000);
    __m256 acc = _mm256_setzero_ps(), zeros = _mm256_setzero_ps();
    for (int j = 0; j < full; j += 8) {
        const __m256i d01 = pair_dot(w + (size_t)j * 16, in.single_xq + (size_t)j * 32);
        const __m256i d23 = pair_dot(w + (size_t)j * 16 + 32, in.single_xq + (size_t)j * 32 + 64);
        const __m256i d45 = pair_dot(w + (size_t)j * 16 + 64, in.single_xq + (size_t)j * 32 + 128);
        const __m256i d67 = pair_dot(w + (size_t)j * 16 + 96, in.single_xq + (size_t)j * 32 + 192);
        const __m256i sums = _mm256_hadd_epi32(_mm256_hadd_epi32(d01, d23), _mm256_hadd_epi32(d45, d67));
        __m256 s;
        if (G == 32) { /* eight (scale, zero) pairs of bf16 in one load, as 32-bit lanes */
            const __m256i pairs = _mm256_permutevar8x32_epi32(
                _mm256_loadu_si256((const __m256i *)(scales_zeros + 2 * j)), order);
            s = _mm256_castsi256_ps(_mm256_slli_epi32(pairs, 16));
            const __m256 z = _mm256_castsi256_ps(_mm256_and_si256(pairs, high_half));
            zeros = _mm256_fmadd_ps(_mm256_fnmadd_ps(_mm256_set1_ps(8.0f), s, z), _mm256_loadu_ps(in.single_xsum + j), zeros);
        } else {
            float lanes[8] __attribute__((aligned(32)));
            for (int i = 0; i < 8; i++) lanes[i] = bf16_to_f32(scales_zeros[2 * ((j + ORDER[i]) >> shift)]);
            s = _mm256_load_ps(lanes);
        }
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(s, _mm256_loadu_ps(in.single_xscale + j)), acc);
    }
    float tail = 0.0f;
    for (int j = full; j < blocks; j++)
        tail += hsum(block_dot(q4_codes(w + (size_t)j * 16), in.xq + (size_t)j * 32)) *
                bf16_to_f32(scales_zeros[2 * (j >> shift)]) * in.xscale[j];
    float zero = G == 32 ? hsum((vf)zeros) : 0.0f;
    for (int g = G == 32 ? full : 0; g < K / G; g++) {
        const float sg = bf16_to_f32(scales_zeros[2 * g]);
        zero += (bf16_to_f32(scales_zeros[2 * g + 1]) - 8.0f * sg) * in.xsum[g];
    }
    return hsum((vf)acc) + tail + zero;
}

/* x's int8 blocks, scales and (G = 32) sums in the order row_q4_single reads them: xq [K], xscale, xsum [K / 32]. */
static void single_layout(const Inputs in, int K, int G, int8_t *xq, float *xscale, float *xsum) {
    const int full = K / 256 * 8;
    for (int j = 0; j < full; j += 2)
        for (int half = 0; half < 2; half++) { /* inputs 0..15 of blocks j and j + 1, then 16..31 of both */
            memcpy(xq + (size_t)j * 32 + half * 32, in.xq + (size_t)j * 32 + half * 16, 16);
            memcpy(xq + (size_t)j * 32 + half * 32 + 16, in.xq + (size_t)(j + 1) * 32 + half * 16, 16);
        }
    for (int j = 0; j < full; j += 8)
        for (int i = 0; i < 8; i++) {
            xscale[j + i] = in.xscale[j + ORDER[i]];
            if (G == 32) xsum[j + i] = in.xsum[j + ORDER[i]];
        }
}
#endif

/* x [T, K] rounded to int8 per block of 32 (round to nearest; the block's largest magnitude maps to 127). */
static void quantize_blocks(const float *x, size_t count, int8_t *xq, float *xscale) {
    for (size_t b = 0; b < count / 32; b++) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) {
            const float v = x[b * 32 + j] < 0 ? -x[b * 32 + j] : x[b * 32 + j];
            amax = v > amax ? v : amax;
        }
        const float scale = amax / 127.0f, inverse = amax > 0 ? 127.0f / amax : 0.0f;
        xscale[b] = scale;
        for (int j = 0; j < 32; j++) xq[b * 32 + j] = (int8_t)__builtin_lrintf(x[b * 32 + j] * inverse);
    }
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

static void rows(int format, const void *w, const void *aux, int aux_bf16, int N, int n0, int n1, Inputs in,
                 int T, int K, int G, float *y) {
    const float *x = in.x;
    float out[MAX_ROWS];
    for (int n = n0; n < n1; n++) {
        switch (format) {
        case W_F32: DISPATCH_T(row_f32((const float *)w + (size_t)n * K, x, TT, K, out)); break;
        case W_BF16: DISPATCH_T(row_bf16((const uint16_t *)w + (size_t)n * K, x, TT, K, out)); break;
        case W_I8:
            if (in.xq) {
#ifdef __AVX2__
                DISPATCH_T(row_i8_q8((const int8_t *)w + (size_t)n * K, in, TT, K, out));
#endif
            } else {
                DISPATCH_T(row_i8((const int8_t *)w + (size_t)n * K, x, TT, K, out));
            }
            for (int t = 0; t < T; t++) out[t] *= scalar_at(aux, n, aux_bf16);
            break;
        default: {
            const uint8_t *codes = (const uint8_t *)w + (size_t)n * K / 2;
            const void *scales_zeros = (const char *)aux + (size_t)n * (K / G) * 2 * (aux_bf16 ? 2 : 4);
#ifdef __AVX2__
            if (T == 1 && in.xq) {
                out[0] = row_q4_single(codes, (const uint16_t *)scales_zeros, in, K, G);
                break;
            }
#endif
            DISPATCH_T(row_q4(codes, scales_zeros, aux_bf16, in, TT, K, G, out));
        }
        }
        for (int t = 0; t < T; t++) y[(size_t)t * N + n] = out[t];
    }
}

/* y [T, N] (float32 or bfloat16 as x) = x [T, K] @ W^T. aux: the i8 scales [N] or the q4 scales and zeros
 * [N, K / G, 2], in x's dtype; G: the q4 group. Returns 0, or -1 when a buffer could not be had. */
int gemv(int format, const void *w, const void *aux, int N, int K, int G, const void *x, int x_bf16, int T,
         void *y, int threads) {
    const size_t inputs = (size_t)T * K, groups = format == W_Q4 ? (size_t)K / G : 0;
#ifdef __AVX2__
    const int integer = x_bf16 && (format == W_Q4 || (format == W_I8 && K % 32 == 0));
    const size_t blocks = integer ? inputs / 32 : 0;
#else
    const size_t blocks = 0;
#endif
    const size_t single = T == 1 && format == W_Q4 ? blocks : 0; /* row_q4_single's copy of x's blocks */
    /* one buffer: x and y in float32, the per-group sums and block scales of x (and their single-row copies), then
     * x in int8 (and its copy) */
    float *xf = malloc(sizeof(float) * (inputs + (size_t)T * groups + blocks + 2 * single + (size_t)T * N) +
                       (blocks + single) * 32);
    if (!xf) return -1;
    float *xsum = xf + inputs, *xscale = xsum + (size_t)T * groups, *single_xscale = xscale + blocks;
    float *single_xsum = single_xscale + single, *yf = single_xsum + single;
    int8_t *xq = (int8_t *)(yf + (size_t)T * N), *single_xq = xq + blocks * 32;
    for (size_t i = 0; i < inputs; i++) xf[i] = x_bf16 ? bf16_to_f32(((const uint16_t *)x)[i]) : ((const float *)x)[i];
    for (int t = 0; t < T; t++)
        for (size_t g = 0; g < groups; g++) {
            float s = 0.0f;
            for (size_t k = g * G; k < (g + 1) * G; k++) s += xf[(size_t)t * K + k];
            xsum[(size_t)t * groups + g] = s;
        }
    if (blocks) quantize_blocks(xf, inputs, xq, xscale);
    Inputs in = {xf, xsum, xscale, blocks ? xq : NULL, NULL, NULL, NULL};
#ifdef __AVX2__
    if (single) {
        single_layout(in, K, G, single_xq, single_xscale, single_xsum);
        in.single_xq = single_xq, in.single_xscale = single_xscale, in.single_xsum = single_xsum;
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
