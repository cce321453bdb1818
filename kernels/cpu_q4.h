/* q4 rows on the integer path (AVX2), for cpu_gemv.c: included there after `Inputs` and `block_dot`, whose
 * types and helpers it uses; a file of its own only to keep cpu_gemv.c readable. */
#ifndef FLEETCTL_CPU_Q4_H
#define FLEETCTL_CPU_Q4_H
#ifdef __AVX2__
/* The 32 codes of a q4 block as bytes, in input order. */
static inline __m256i q4_codes(const uint8_t *block) {
    const __m128i packed = _mm_loadu_si128((const __m128i *)block);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(packed, 4), packed), _mm256_set1_epi8(15));
}

/* row_q4 on the integer path (x, and so the scales, in bf16), eight blocks a pass: four 32-byte loads of codes,
 * two blocks each (the low nibbles hold inputs 0..15 of both, the high 16..31, so x comes in that order: `paired_*`),
 * decoded once for every row of x; per row, the integer dots summed into one vector of the eight blocks' sums by
 * three hadds (in the order ORDER), scaled by a vector of the blocks' scales times x's, one FMA. At G = 32 the
 * zeros' terms ride along (a block is a group); wider groups take them per group. The last K % 256 inputs go two
 * blocks a pass (an odd last block alone). */
static const int ORDER[8] = {0, 2, 4, 6, 1, 3, 5, 7}; /* which block each lane of three hadds' result sums */

static inline void decode_pair(const uint8_t *codes, __m256i low4, __m256i *low, __m256i *high) {
    const __m256i packed = _mm256_loadu_si256((const __m256i *)codes);
    *low = _mm256_and_si256(packed, low4), *high = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low4);
}

static inline __m256i pair_dot(__m256i low, __m256i high, const int8_t *xq) {
    const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(low, _mm256_loadu_si256((const __m256i *)xq)),
                                           _mm256_maddubs_epi16(high, _mm256_loadu_si256((const __m256i *)(xq + 32))));
    return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)); /* lanes 0..3: the first block's, 4..7: the second's */
}

static inline __attribute__((always_inline)) void row_q4_paired(const uint8_t *w, const uint16_t *scales_zeros,
                                                                Inputs in, int T, int K, int G, float *out) {
    const int blocks = K / 32, full = blocks / 8 * 8, pairs = blocks / 2 * 2, shift = __builtin_ctz(G / 32);
    const int groups = K / G;
    const __m256i order = _mm256_loadu_si256((const __m256i *)ORDER), high_half = _mm256_set1_epi32((int)0xffff0000);
    const __m256i low4 = _mm256_set1_epi8(15);
    __m256 acc[GROUP];
    for (int t = 0; t < T; t++) acc[t] = _mm256_setzero_ps();
    for (int j = 0; j < full; j += 8) {
        __m256i low[4], high[4];
        if (T > 1) /* decoded once for every row; one row decodes them as it goes (fewer registers live) */
            for (int p = 0; p < 4; p++) decode_pair(w + (size_t)j * 16 + 32 * p, low4, &low[p], &high[p]);
        __m256 s, offset = _mm256_setzero_ps(); /* offset: z - 8 s, the zeros' term per unit of x's block sum */
        if (G == 32) { /* eight (scale, zero) pairs of bf16 in one load, as 32-bit lanes */
            const __m256i pairs = _mm256_permutevar8x32_epi32(
                _mm256_loadu_si256((const __m256i *)(scales_zeros + 2 * j)), order);
            s = _mm256_castsi256_ps(_mm256_slli_epi32(pairs, 16));
            offset = _mm256_fnmadd_ps(_mm256_set1_ps(8.0f), s, _mm256_castsi256_ps(_mm256_and_si256(pairs, high_half)));
        } else {
            float lanes[8] __attribute__((aligned(32)));
            for (int i = 0; i < 8; i++) lanes[i] = bf16_to_f32(scales_zeros[2 * ((j + ORDER[i]) >> shift)]);
            s = _mm256_load_ps(lanes);
        }
        for (int t = 0; t < T; t++) {
            const int8_t *xq = in.paired_xq + (size_t)t * K + (size_t)j * 32;
            if (T == 1)
                for (int p = 0; p < 4; p++) decode_pair(w + (size_t)j * 16 + 32 * p, low4, &low[p], &high[p]);
            const __m256i sums = _mm256_hadd_epi32(_mm256_hadd_epi32(pair_dot(low[0], high[0], xq),
                                                                     pair_dot(low[1], high[1], xq + 64)),
                                                   _mm256_hadd_epi32(pair_dot(low[2], high[2], xq + 128),
                                                                     pair_dot(low[3], high[3], xq + 192)));
            const size_t at = (size_t)t * blocks + j;
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(s, _mm256_loadu_ps(in.paired_xscale + at)),
                                     acc[t]);
            if (G == 32) acc[t] = _mm256_fmadd_ps(offset, _mm256_loadu_ps(in.paired_xsum + at), acc[t]);
        }
    }
    for (int j = full; j < pairs; j += 2) { /* lanes 0..3 sum block j's products, 4..7 block j + 1's */
        __m256i low, high;
        decode_pair(w + (size_t)j * 16, low4, &low, &high);
        const float s0 = bf16_to_f32(scales_zeros[2 * (j >> shift)]);
        const float s1 = bf16_to_f32(scales_zeros[2 * ((j + 1) >> shift)]);
        for (int t = 0; t < T; t++) {
            const size_t at = (size_t)t * blocks + j;
            const __m256 scale = _mm256_set_m128(_mm_set1_ps(s1 * in.paired_xscale[at + 1]),
                                                 _mm_set1_ps(s0 * in.paired_xscale[at]));
            const __m256i sums = pair_dot(low, high, in.paired_xq + (size_t)t * K + (size_t)j * 32);
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), scale, acc[t]);
        }
    }
    for (int t = 0; t < T; t++) {
        float total = hsum((vf)acc[t]);
        for (int j = pairs; j < blocks; j++)
            total += hsum(block_dot(q4_codes(w + (size_t)j * 16), in.xq + (size_t)t * K + (size_t)j * 32)) *
                     bf16_to_f32(scales_zeros[2 * (j >> shift)]) * in.xscale[(size_t)t * blocks + j];
        for (int g = G == 32 ? full : 0; g < groups; g++) {
            const float sg = bf16_to_f32(scales_zeros[2 * g]);
            total += (bf16_to_f32(scales_zeros[2 * g + 1]) - 8.0f * sg) * in.xsum[(size_t)t * groups + g];
        }
        out[t] = total;
    }
}

/* x's int8 blocks, scales and (G = 32) sums in the order row_q4_paired reads them, row by row: xq [T, K], xscale,
 * xsum [T, K / 32]. */
static void paired_layout(const Inputs in, int T, int K, int G, int8_t *xq, float *xscale, float *xsum) {
    const int blocks = K / 32, full = blocks / 8 * 8, pairs = blocks / 2 * 2;
    for (int t = 0; t < T; t++) {
        const int8_t *from = in.xq + (size_t)t * K;
        int8_t *to = xq + (size_t)t * K;
        for (int j = 0; j < pairs; j += 2)
            for (int half = 0; half < 2; half++) { /* inputs 0..15 of blocks j and j + 1, then 16..31 of both */
                memcpy(to + (size_t)j * 32 + half * 32, from + (size_t)j * 32 + half * 16, 16);
                memcpy(to + (size_t)j * 32 + half * 32 + 16, from + (size_t)(j + 1) * 32 + half * 16, 16);
            }
        for (int j = 0; j < full; j += 8)
            for (int i = 0; i < 8; i++) {
                const size_t at = (size_t)t * blocks + j;
                xscale[at + i] = in.xscale[at + ORDER[i]];
                if (G == 32) xsum[at + i] = in.xsum[at + ORDER[i]];
            }
        for (int j = full; j < pairs; j++) xscale[(size_t)t * blocks + j] = in.xscale[(size_t)t * blocks + j];
    }
}
#endif
#endif
