/* Row-wise ops of a decode step on a CPU, one call each where torch's composite ops take several: RMSNorm fused
 * with the residual add before it. x, the residual and the output are float32 or bfloat16 (bf16); the sums run in
 * float32 and each output rounds once. Built and loaded by kernels/cpu_build.py. */
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

/* Decode attention over a paged KV cache: each of B sequences' H query heads (one query each, the sequence's last
 * position) against its keys 0 .. context_len - 1, or the last `window` of them (window 0: all). q [B, H, d], its
 * sequences q_stride values apart (H * d: contiguous; more: views of a qkv row); out [B, H, d];
 * kv [2, blocks, bs, Hkv, d]; tables [B, max_blocks] int32; context_lens [B] int32. A task takes one sequence's
 * query heads of one KV head (GQA: up to HEADS_A_TASK of them, each key and value read once for all), the keys
 * TILE at a time: their scores, one running-softmax rescale per tile, their weights by exp_lanes, then the values.
 * In float32; each output rounds once. */
#define TILE 16
#define HEADS_A_TASK 16
#define TASK_WIDTH 4096 /* floats of queries (and of accumulators) a task holds: heads x d */
void decode_attention(const void *q, size_t q_stride, const void *kv, const int32_t *tables, int max_blocks,
                      const int32_t *context_lens, int B, int H, int Hkv, int d, int blocks, int bs, float scale,
                      int window, void *out, int bf16, int threads) {
    const int group = H / Hkv;
    int per_task = group < HEADS_A_TASK ? group : HEADS_A_TASK;
    if (per_task * d > TASK_WIDTH) per_task = TASK_WIDTH / d;
    const int parts = (group + per_task - 1) / per_task;
    const size_t token_stride = (size_t)Hkv * d, half = (size_t)blocks * bs * token_stride, element = bf16 ? 2 : 4;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int task = 0; task < B * Hkv * parts; task++) {
        const int b = task / (Hkv * parts), kv_head = task / parts % Hkv;
        const int h0 = kv_head * group + task % parts * per_task;
        const int heads = kv_head * group + group - h0 < per_task ? kv_head * group + group - h0 : per_task;
        const int length = context_lens[b], start = window > 0 && length > window ? length - window : 0;
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
            const char *keys[TILE];
            float weights[HEADS_A_TASK][TILE] __attribute__((aligned(32)));
            for (int i = 0; i < n; i++) {
                const int p = p0 + i;
                const size_t slot = (size_t)tables[(size_t)b * max_blocks + p / bs] * bs + p % bs;
                keys[i] = (const char *)kv + (slot * token_stride + (size_t)kv_head * d) * element;
            }
            for (int g = 0; g < heads; g++) {
                float tile_max = -INFINITY;
                for (int i = 0; i < n; i++) {
                    weights[g][i] = dot_values(query + g * d, keys[i], d, bf16);
                    tile_max = weights[g][i] > tile_max ? weights[g][i] : tile_max;
                }
                if (tile_max > running_max[g]) { /* rescale what was summed under the old maximum */
                    const float factor = expf(running_max[g] - tile_max);
                    total[g] *= factor;
                    for (int i = 0; i < d; i++) acc[g * d + i] *= factor;
                    running_max[g] = tile_max;
                }
                for (int i = 0; i < TILE; i += LANES) {
                    vf lanes;
                    memcpy(&lanes, weights[g] + i, sizeof lanes);
                    lanes = exp_lanes(lanes - running_max[g]);
                    memcpy(weights[g] + i, &lanes, sizeof lanes);
                }
                for (int i = 0; i < n; i++) total[g] += weights[g][i];
            }
            for (int i = 0; i < n; i++)
                for (int g = 0; g < heads; g++) add_scaled(acc + g * d, weights[g][i], keys[i] + half * element, d, bf16);
        }
        for (int g = 0; g < heads; g++)
            for (int i = 0; i < d; i++)
                store_value(out, ((size_t)b * H + h0 + g) * d + i, acc[g * d + i] / total[g], bf16);
    }
}

/* k, v [T, Hkv * d] (tokens source_stride values apart) into their slots of kv [2, blocks * bs, Hkv * d] (slots [T]
 * int64), in place. */
void store_kv(const void *k, const void *v, size_t source_stride, void *kv, const int64_t *slots, int T,
              int row_elements, int blocks_x_bs, int element_size) {
    const size_t row_bytes = (size_t)row_elements * element_size;
    for (int t = 0; t < T; t++) {
        char *keys = (char *)kv + (size_t)slots[t] * row_bytes;
        const size_t at = (size_t)t * source_stride * element_size;
        memcpy(keys, (const char *)k + at, row_bytes);
        memcpy(keys + (size_t)blocks_x_bs * row_bytes, (const char *)v + at, row_bytes);
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
