/* What the CPU kernels share (cpu_gemv.c, cpu_rows.c): 8-lane float vectors through GCC's vector extensions
 * (AVX2 intrinsics where GCC's generic conversions would go through 128-bit halves), and bfloat16 <-> float32. */
#ifndef FLEETCTL_CPU_SIMD_H
#define FLEETCTL_CPU_SIMD_H
#include <stdint.h>
#include <string.h>

#define LANES 8

typedef float vf __attribute__((vector_size(LANES * 4)));
typedef uint16_t vu16 __attribute__((vector_size(LANES * 2), aligned(2)));
typedef uint32_t vu32 __attribute__((vector_size(LANES * 4)));
typedef int8_t vi8 __attribute__((vector_size(LANES), aligned(1)));
typedef uint8_t vu8 __attribute__((vector_size(LANES), aligned(1)));
typedef uint8_t vu8x16 __attribute__((vector_size(16), aligned(1)));
typedef float vf_u __attribute__((vector_size(LANES * 4), aligned(4)));

static inline vf load_f32(const float *p) { return *(const vf_u *)p; }

#ifdef __AVX2__ /* GCC's generic conversions go through 128-bit halves on some tunings (znver) */
#include <immintrin.h>
static inline vf widen_bf16(const uint16_t *p) {
    return (vf)_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16);
}
static inline vf widen_i8(const int8_t *p) {
    return (vf)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
static inline vf widen_u8(const vu8x16 *v, int half) {
    return (vf)_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)((const uint8_t *)v + half))));
}
#else
static inline vf widen_bf16(const uint16_t *p) {
    vu32 wide = __builtin_convertvector(*(const vu16 *)p, vu32) << 16;
    vf out;
    memcpy(&out, &wide, sizeof out);
    return out;
}
static inline vf widen_i8(const int8_t *p) { return __builtin_convertvector(*(const vi8 *)p, vf); }
static inline vf widen_u8(const vu8x16 *v, int half) {
    return __builtin_convertvector(*(const vu8 *)((const uint8_t *)v + half), vf);
}
#endif

/* The sum of v's lanes as a tree (three adds deep, where a chain is eight): a pairwise order, fixed. */
static inline float hsum(vf v) {
    const float a = (v[0] + v[4]) + (v[2] + v[6]), b = (v[1] + v[5]) + (v[3] + v[7]);
    return a + b;
}

static inline float bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline float scalar_at(const void *p, size_t i, int bf16) {
    return bf16 ? bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

static inline uint16_t f32_to_bf16(float f) { /* round to nearest even, as torch does */
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40); /* NaN stays NaN */
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

/* The i-th value of a float32 or bfloat16 array, as float32. */
static inline float load_value(const void *p, size_t i, int bf16) { return scalar_at(p, i, bf16); }

static inline void store_value(void *p, size_t i, float f, int bf16) {
    if (bf16)
        ((uint16_t *)p)[i] = f32_to_bf16(f);
    else
        ((float *)p)[i] = f;
}

/* dot(a, b) over n (a multiple of 8) values: a float32, b float32 or bfloat16. */
static inline float dot_values(const float *a, const void *b, int n, int bf16) {
    vf even = (vf){0}, odd = (vf){0};
    int i = 0;
    for (; i + 2 * LANES <= n; i += 2 * LANES) {
        even += load_f32(a + i) * (bf16 ? widen_bf16((const uint16_t *)b + i) : load_f32((const float *)b + i));
        odd += load_f32(a + i + LANES) *
               (bf16 ? widen_bf16((const uint16_t *)b + i + LANES) : load_f32((const float *)b + i + LANES));
    }
    if (i < n) even += load_f32(a + i) * (bf16 ? widen_bf16((const uint16_t *)b + i) : load_f32((const float *)b + i));
    return hsum(even + odd);
}

/* e^x per lane, to about an ulp: x = n ln2 + r (|r| <= ln2 / 2, ln2 in two parts), e^r by its Taylor series to
 * r^7 / 7! (error under 2^-24), times 2^n through the exponent bits; x clamped to +-87 (e^x stays normal). */
#ifdef __AVX2__
static inline vf exp_lanes(vf v) {
    const __m256 x = _mm256_max_ps(_mm256_min_ps((__m256)v, _mm256_set1_ps(87.0f)), _mm256_set1_ps(-87.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const vf r = (vf)_mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f),
                                      _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x)); /* ln2 in two parts */
    vf p = (vf){0} + 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return p * (vf)_mm256_castsi256_ps(bits);
}
#else
#include <math.h>
static inline vf exp_lanes(vf v) {
    for (int i = 0; i < LANES; i++) v[i] = expf(v[i]);
    return v;
}
#endif

/* acc[0 .. n) += weight * b[0 .. n), b float32 or bfloat16, n a multiple of 8. */
static inline void add_scaled(float *acc, float weight, const void *b, int n, int bf16) {
    const vf w = (vf){0} + weight;
    for (int i = 0; i < n; i += LANES) {
        const vf values = bf16 ? widen_bf16((const uint16_t *)b + i) : load_f32((const float *)b + i);
        *(vf_u *)(acc + i) = load_f32(acc + i) + w * values;
    }
}

#endif
