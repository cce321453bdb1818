/* The kernels one file of this library calls in another's (cpu_step.c runs a whole decode step through them).
 * Tensors are float32, or bfloat16 where `bf16` is set, but for a KV pool of int8 rows where `kv_int8` is set (codes
 * and a scale: kernels/kv_quant.py); shapes are in each definition's comment. */
#ifndef FLEETCTL_CPU_KERNELS_H
#define FLEETCTL_CPU_KERNELS_H
#include <stddef.h>
#include <stdint.h>

int gemv(int format, const void *w, const void *aux, int N, int K, int G, int doubled, const void *x, int x_bf16,
         int T, void *y, int threads);
int rms_norm(const void *x, const void *residual, const void *weight, float eps, void *out, void *residual_out,
             int T, int D, int bf16);
void rotary(void *x, size_t stride, int heads, int head_stride, const void *cos, const void *sin,
            const int64_t *positions, int T, int d, int bf16);
void store_kv(const void *k, const void *v, size_t source_stride, void *kv, const int64_t *slots, int T, int Hkv,
              int d, int blocks_x_bs, int bf16, int kv_int8);
void decode_attention(const void *q, size_t q_stride, const void *kv, const int32_t *tables, int max_blocks,
                      const int32_t *context_lens, int B, int H, int Hkv, int d, int blocks, int bs, float scale,
                      int window, void *out, int bf16, int kv_int8, int threads);
void glu(const void *gate_up, int T, int I, int gelu, void *out, int bf16, int threads);

#endif
