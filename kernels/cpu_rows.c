/* Row-wise ops of a decode step on a CPU, one call each where torch's composite ops take several: RMSNorm fused
 * with the residual add before it. x, the residual and the output are float32 or bfloat16 (bf16); the sums run in
 * float32 and each output rounds once. Built and loaded by kernels/cpu_build.py. */
#include <float.h>
#include <math.h>

#include "cpu_kernels.h"
#include "cpu_simd.h"

/* For each of T rows of D: h = x (+ residual), written to residual_out when a residual is given (rounded to the
 * dtype, as torch's add would be); out = h / sqrt(mean(h^2) + eps) * weight. residual and residual_out may be
 * NULL (no residual). float32 scratch of D per row on the stack for D <= 16384. Returns -1 past that. */
int rms_norm(const void *x, const void *residual, const void *weight, float eps, void *out, void *residual_out,
             int T, int D, int bf16) {
    if (D > 16384) return -1;
    float h[16384];
    for (int t = 0; t < T; t++) {
        const size_t row = (size_t)t * D;
        double squares = 0.0; /* in double: torch sums pairwise in float32, a running float32 sum drifts further */
        for (int d = 0; d < D; d++) {
            float v = load_value(x, row + d, bf16);
            if (residual) {
                v += load_value(residual, row + d, bf16);
                store_value(residual_out, row + d, v, bf16);
                v = load_value(residual_out, row + d, bf16); /* the stream as stored: its dtype's rounding */
            }
            h[d] = v;
            squares += (double)v * v;
        }
        const float inverse = (float)(1.0 / sqrt(squares / D + eps));
        for (int d = 0; d < D; d++) store_value(out, row + d, h[d] * inverse * load_value(weight, d, bf16), bf16);
    }
    return 0;
}

/* Decode attention (decode_attention, below) takes a sequence's keys TILE at a time, up to HEADS_A_TASK query heads
 * in a task. */
#define TILE 16
#define HEADS_A_TASK 16
#define TASK_WIDTH 4096 /* floats of queries (and of accumulators) a task holds: heads x d */
#define MAX_HEAD_DIM 512 /* an int8 tile's widened keys: cpu_rows.py's MAX_HEAD_DIM, past which no wrapper calls */

/* An int8 pool's (token, KV head) row (kernels/kv_quant.py): d codes, then the row's scale, a bfloat16 in two
 * bytes; a value is code * scale. */
static inline float row_scale(const int8_t *row, int d) {
    uint16_t bits;
    memcpy(&bits, row + d, sizeof bits); /* no alignment: a row is d + 2 bytes */
    return bf16_to_f32(bits);
}

/* rows[0 .. n): the rows of a sequence's keys p .. p + n - 1 (base: the pool's first row of their KV head), through
 * its block table: one division a tile, not one a key. */
static inline void key_rows(const char *base, const int32_t *table, int bs, size_t token_bytes, int p, int n,
                            const char **rows) {
    int block = p / bs, offset = p % bs;
    for (int i = 0; i < n; i++) {
        rows[i] = base + ((size_t)table[block] * bs + offset) * token_bytes;
        if (++offset == bs) offset = 0, block++;
    }
}

/* A tile's n scores (TILE lanes, those past n unused) into their softmax weights under the head's running maximum,
 * first raised to the tile's (rescaling the head's running total and accumulator acc [d] to it); the weights are
 * added to the total. */
static inline void softmax_tile(float *weights, int n, float *running_max, float *total, float *acc, int d) {
    float tile_max = -INFINITY;
    for (int i = 0; i < n; i++) tile_max = weights[i] > tile_max ? weights[i] : tile_max;
    if (tile_max > *running_max) { /* rescale what was summed under the old maximum */
        const float factor = expf(*running_max - tile_max);
        *total *= factor;
        for (int i = 0; i < d; i++) acc[i] *= factor;
        *running_max = tile_max;
    }
    for (int i = 0; i < TILE; i += LANES) {
        vf lanes;
        memcpy(&lanes, weights + i, sizeof lanes);
        lanes = exp_lanes(lanes - *running_max);
        memcpy(weights + i, &lanes, sizeof lanes);
    }
    for (int i = 0; i < n; i++) *total += weights[i];
}

/* Lane j: the sum of v[j]'s lanes (pairwise, in a fixed order): eight dot products' last step at once. */
static inline vf hsum8(const vf v[LANES]) {
#ifdef __AVX2__
    const __m256 a = _mm256_hadd_ps((__m256)v[0], (__m256)v[1]), b = _mm256_hadd_ps((__m256)v[2], (__m256)v[3]);
    const __m256 c = _mm256_hadd_ps((__m256)v[4], (__m256)v[5]), e = _mm256_hadd_ps((__m256)v[6], (__m256)v[7]);
    /* lanes 0-3: v[0..3]'s sums over their lanes 0-3, lanes 4-7: over their lanes 4-7; then v[4..7]'s */
    const __m256 low = _mm256_hadd_ps(a, b), high = _mm256_hadd_ps(c, e);
    return (vf)_mm256_add_ps(_mm256_permute2f128_ps(low, high, 0x20), _mm256_permute2f128_ps(low, high, 0x31));
#else
    vf sums;
    for (int j = 0; j < LANES; j++) sums[j] = hsum(v[j]);
    return sums;
#endif
}

/* An int8 pool's tile of n keys (rows of row_scale) against `heads` queries of d: scores[g][i] = query_g . codes_i
 * * scale_i. Each key is widened to float32 once for all the heads (they share it: GQA), and eight keys' dot
 * products end in one hsum8. */
static void int8_scores(const float *query, int heads, int d, const char *const *keys, int n,
                        float scores[][TILE]) {
    float widened[TILE * MAX_HEAD_DIM] __attribute__((aligned(32)));
    float scales[TILE] __attribute__((aligned(32)));
    for (int i = 0; i < TILE; i++) { /* a short tile's missing keys: zeros, scale 0 */
        for (int c = 0; c < d; c += LANES)
            *(vf *)(widened + i * d + c) = i < n ? widen_i8((const int8_t *)keys[i] + c) : (vf){0};
        scales[i] = i < n ? row_scale((const int8_t *)keys[i], d) : 0.0f;
    }
    for (int g = 0; g < heads; g++)
        for (int k0 = 0; k0 < n; k0 += LANES) {
            vf sums[LANES] = {0};
            for (int c = 0; c < d; c += LANES) {
                const vf x = load_f32(query + g * d + c);
                for (int j = 0; j < LANES; j++) sums[j] += x * *(const vf *)(widened + (k0 + j) * d + c);
            }
            const vf tile = hsum8(sums) * load_f32(scales + k0);
            memcpy(scores[g] + k0, &tile, sizeof tile);
        }
}

/* acc_g [d] += sum over the tile's n values (an int8 pool's rows) of weights[g][i] * scale_i * codes_i, for each of
 * `heads`: eight values' codes at a time widened once for all the heads. The weights past n must be finite (0). */
static void int8_values(float *acc, int heads, int d, const char *const *values, int n,
                        const float weights[][TILE]) {
    for (int k0 = 0; k0 < n; k0 += LANES) {
        const int8_t *rows[LANES];
        float scaled[HEADS_A_TASK][LANES]; /* the weights times their rows' scales; 0 past the tile's end */
        for (int j = 0; j < LANES; j++) {
            rows[j] = (const int8_t *)values[k0 + j < n ? k0 + j : k0]; /* a missing value: a real row, weight 0 */
            const float scale = k0 + j < n ? row_scale(rows[j], d) : 0.0f;
            for (int g = 0; g < heads; g++) scaled[g][j] = weights[g][k0 + j] * scale;
        }
        for (int c = 0; c < d; c += LANES) {
            vf v[LANES];
            for (int j = 0; j < LANES; j++) v[j] = widen_i8(rows[j] + c);
            for (int g = 0; g < heads; g++) {
                const float *w = scaled[g];
                vf even = w[0] * v[0], odd = w[1] * v[1]; /* two chains of products, not one of eight */
                for (int j = 2; j < LANES; j += 2) even += w[j] * v[j], odd += w[j + 1] * v[j + 1];
                *(vf_u *)(acc + g * d + c) = load_f32(acc + g * d + c) + (even + odd);
            }
        }
    }
}

/* Decode attention over a paged KV cache: each of B sequences' H query heads (one query each, the sequence's last
 * position) against its keys 0 .. context_len - 1, or the last `window` of them (window 0: all). q [B, H, d], its
 * sequences q_stride values apart (H * d: contiguous; more: views of a qkv row); out [B, H, d];
 * kv [2, blocks, bs, Hkv, d] in q's dtype, or with kv_int8 [2, blocks, bs, Hkv, d + 2] int8 (row_scale's rows, read
 * as they are: d <= MAX_HEAD_DIM); tables [B, max_blocks] int32; context_lens [B] int32. A task takes one sequence's
 * query heads of one KV head (GQA: up to HEADS_A_TASK of them, each key and value read once for all), the keys TILE
 * at a time: their scores, one running-softmax rescale per tile, their weights by exp_lanes, then the values. In
 * float32; each output rounds once. */
void decode_attention(const void *q, size_t q_stride, const void *kv, const int32_t *tables, int max_blocks,
                      const int32_t *context_lens, int B, int H, int Hkv, int d, int blocks, int bs, float scale,
                      int window, void *out, int bf16, int kv_int8, int threads) {
    const int group = H / Hkv;
    int per_task = group < HEADS_A_TASK ? group : HEADS_A_TASK;
    if (per_task * d > TASK_WIDTH) per_task = TASK_WIDTH / d;
    const int parts = (group + per_task - 1) / per_task;
    const size_t row_bytes = kv_int8 ? (size_t)d + 2 : (size_t)d * (bf16 ? 2 : 4);
    const size_t token_bytes = (size_t)Hkv * row_bytes, half = (size_t)blocks * bs * token_bytes;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int task = 0; task < B * Hkv * parts; task++) {
        const int b = task / (Hkv * parts), kv_head = task / parts % Hkv;
        const int h0 = kv_head * group + task % parts * per_task;
        const int heads = kv_head * group + group - h0 < per_task ? kv_head * group + group - h0 : per_task;
        const int length = context_lens[b], start = window > 0 && length > window ? length - window : 0;
        const int32_t *table = tables + (size_t)b * max_blocks;
        const char *base = (const char *)kv + (size_t)kv_head * row_bytes;
        float query[TASK_WIDTH] __attribute__((aligned(32))), acc[TASK_WIDTH] __attribute__((aligned(32)));
        float running_max[HEADS_A_TASK], total[HEADS_A_TASK];
        for (int g = 0; g < heads; g++) {
            for (int i = 0; i < d; i++)
                query[g * d + i] = load_value(q, (size_t)b * q_stride + (size_t)(h0 + g) * d + i, bf16) * scale;
            memset(acc + g * d, 0, sizeof(float) * d);
            running_max[g] = -INFINITY, total[g] = 0.0f;
        }
        for (int p0 = start; p0 < length; p0 += TILE) {
            const int n = length - p0 < TILE ? length - p0 : TILE;
            const char *keys[TILE], *values[TILE], *next[TILE];
            float weights[HEADS_A_TASK][TILE] __attribute__((aligned(32)));
            key_rows(base, table, bs, token_bytes, p0, n, keys);
            for (int i = 0; i < n; i++) values[i] = keys[i] + half;
            /* the next tile's rows on their way while this one computes: its blocks are anywhere in the pool */
            const int ahead = length - p0 - n < TILE ? length - p0 - n : TILE;
            key_rows(base, table, bs, token_bytes, p0 + n, ahead, next);
            for (int i = 0; i < ahead; i++) {
                __builtin_prefetch(next[i]), __builtin_prefetch(next[i] + row_bytes - 1);
                __builtin_prefetch(next[i] + half), __builtin_prefetch(next[i] + half + row_bytes - 1);
            }
            if (kv_int8) { /* every head's scores at once, then their weights, then every head's values */
                int8_scores(query, heads, d, keys, n, weights);
                for (int g = 0; g < heads; g++) {
                    softmax_tile(weights[g], n, running_max + g, total + g, acc + g * d, d);
                    for (int i = n; i < TILE; i++) weights[g][i] = 0.0f; /* a short tile's: int8_values reads them */
                }
                int8_values(acc, heads, d, values, n, weights);
                continue;
            }
            for (int g = 0; g < heads; g++) {
                for (int i = 0; i < n; i++) weights[g][i] = dot_values(query + g * d, keys[i], d, bf16);
                softmax_tile(weights[g], n, running_max + g, total + g, acc + g * d, d);
            }
            for (int i = 0; i < n; i++)
                for (int g = 0; g < heads; g++) add_scaled(acc + g * d, weights[g][i], values[i], d, bf16);
        }
        for (int g = 0; g < heads; g++)
            for (int i = 0; i < d; i++)
                store_value(out, ((size_t)b * H + h0 + g) * d + i, acc[g * d + i] / total[g], bf16);
    }
}

/* One (token, KV head) row of d values (float32 or bfloat16) into an int8 pool's row, as kv_quant.quantize_rows:
 * scale = bf16(max |x| / 127), code = clamp(round_half_even(x / scale), -127, 127), in the same float32 steps (a true
 * division, not a product by the reciprocal), so the bytes are the reference's. A NaN in the row makes its scale NaN
 * (its codes 0), as torch's amax does. */
static void quantize_row(const void *x, size_t at, int d, int bf16, int8_t *row) {
    float amax = 0.0f;
    for (int i = 0; i < d; i++) {
        const float a = fabsf(load_value(x, at + i, bf16));
        amax = a > amax || a != a ? a : amax;
    }
    const uint16_t scale_bits = f32_to_bf16(amax / 127.0f);
    const float scale = bf16_to_f32(scale_bits);
    /* the reference divides by the scale clamped to FLT_MIN: it differs from the scale where that is subnormal */
    const float divisor = scale < FLT_MIN ? FLT_MIN : scale;
    for (int i = 0; i < d; i++) {
        const long code = scale > 0.0f ? lrintf(load_value(x, at + i, bf16) / divisor) : 0; /* half to even */
        row[i] = (int8_t)(code > 127 ? 127 : code < -127 ? -127 : code);
    }
    memcpy(row + d, &scale_bits, sizeof scale_bits);
}

/* k, v [T, Hkv * d] (tokens source_stride values apart, in float32 or bfloat16) into their slots of kv
 * [2, blocks * bs, Hkv, d] (slots [T] int64), in place: copied, in the pool's dtype (k's), or with kv_int8 quantized
 * into rows of d + 2 int8 (quantize_row). */
void store_kv(const void *k, const void *v, size_t source_stride, void *kv, const int64_t *slots, int T, int Hkv,
              int d, int blocks_x_bs, int bf16, int kv_int8) {
    const size_t element = bf16 ? 2 : 4, row_bytes = kv_int8 ? (size_t)d + 2 : (size_t)d * element;
    const size_t token_bytes = (size_t)Hkv * row_bytes, half = (size_t)blocks_x_bs * token_bytes;
    for (int t = 0; t < T; t++) {
        char *keys = (char *)kv + (size_t)slots[t] * token_bytes;
        const size_t at = (size_t)t * source_stride;
        if (!kv_int8) {
            memcpy(keys, (const char *)k + at * element, token_bytes);
            memcpy(keys + half, (const char *)v + at * element, token_bytes);
            continue;
        }
        for (int h = 0; h < Hkv; h++) {
            quantize_row(k, at + (size_t)h * d, d, bf16, (int8_t *)(keys + h * row_bytes));
            quantize_row(v, at + (size_t)h * d, d, bf16, (int8_t *)(keys + half + h * row_bytes));
        }
    }
}

/* Rotary embedding in place ("rotate half"): for each of T tokens, `heads` heads from x + t * stride, head_stride
 * values apart, each rotating its first d values: x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin over the halves;
 * cos and sin [*, d / 2] taken at row positions[t] (positions NULL: row t). In float32, each value rounds once. */
void rotary(void *x, size_t stride, int heads, int head_stride, const void *cos, const void *sin,
            const int64_t *positions, int T, int d, int bf16) {
    const int half = d / 2;
    for (int t = 0; t < T; t++) {
        const size_t row = (size_t)(positions ? positions[t] : t) * half;
        for (int h = 0; h < heads; h++) {
            const size_t at = (size_t)t * stride + (size_t)h * head_stride;
            for (int i = 0; i < half; i++) {
                const float c = load_value(cos, row + i, bf16), s = load_value(sin, row + i, bf16);
                const float x1 = load_value(x, at + i, bf16), x2 = load_value(x, at + half + i, bf16);
                store_value(x, at + i, x1 * c - x2 * s, bf16);
                store_value(x, at + half + i, x2 * c + x1 * s, bf16);
            }
        }
    }
}

/* The gated MLP's activation over a fused [gate | up] row: for each of T rows of 2I, out [T, I] = act(gate) * up,
 * act silu (x / (1 + e^-x), eight lanes at a time: exp_lanes) or, with gelu, GELU's tanh form
 * (x / 2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), libm's tanh per value: where 1 + tanh cancels, another tanh
 * would round differently from torch's), as torch writes both. The activation rounds to the dtype before the
 * product, as torch's two ops do. */
static vf activation_lanes(vf gate, int gelu) {
    if (!gelu) return gate / (1.0f + exp_lanes(-gate));
    for (int l = 0; l < LANES; l++) {
        const float x = gate[l];
        gate[l] = 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
    }
    return gate;
}

void glu(const void *gate_up, int T, int I, int gelu, void *out, int bf16, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if ((size_t)T * I >= 16384)
    for (int t = 0; t < T; t++) {
        const size_t row = (size_t)t * 2 * I;
        for (int i = 0; i < I; i += LANES) {
            const int lanes = I - i < LANES ? I - i : LANES;
            float gate[LANES] = {0}, up[LANES] = {0}, act[LANES];
            for (int l = 0; l < lanes; l++)
                gate[l] = load_value(gate_up, row + i + l, bf16), up[l] = load_value(gate_up, row + I + i + l, bf16);
            vf value;
            memcpy(&value, gate, sizeof value);
            value = activation_lanes(value, gelu);
            memcpy(act, &value, sizeof act);
            for (int l = 0; l < lanes; l++) {
                const float a = bf16 ? bf16_to_f32(f32_to_bf16(act[l])) : act[l];
                store_value(out, (size_t)t * I + i + l, a * up[l], bf16);
            }
        }
    }
}
