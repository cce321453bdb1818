/* Row-wise ops of a decode step on a CPU, one call each where torch's composite ops take several: RMSNorm fused
 * with the residual add before it. x, the residual and the output are float32 or bfloat16 (bf16); the sums run in
 * float32 and each output rounds once. Built and loaded by kernels/cpu_build.py. */
#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float load_value(const void *p, size_t i, int bf16) {
    if (!bf16) return ((const float *)p)[i];
    uint32_t bits = (uint32_t)((const uint16_t *)p)[i] << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline void store_value(void *p, size_t i, float f, int bf16) {
    if (!bf16) {
        ((float *)p)[i] = f;
        return;
    }
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) { /* NaN stays NaN */
        ((uint16_t *)p)[i] = (uint16_t)((bits >> 16) | 0x40);
        return;
    }
    bits += 0x7fffu + ((bits >> 16) & 1u); /* round to nearest even, as torch does */
    ((uint16_t *)p)[i] = (uint16_t)(bits >> 16);
}

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
