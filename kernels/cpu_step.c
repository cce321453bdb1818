/* A whole decode step of the decoder (engine/model/decoder.py) in one call: every layer's norms, products, rotary,
 * KV store and attention, then the final norm, through the kernels of cpu_gemv.c and cpu_rows.c. The per-op path
 * calls the same kernels from Python, ~20 calls a layer at ~10 us of Python each, about as long as the layer's
 * products themselves at batch 1; here the step's Python is one call. Each op rounds where the per-op path rounds
 * (the model's dtype between ops), so the two compute the same values.
 *
 * Built and loaded with the other kernels by kernels/cpu_build.py; driven by kernels/cpu_step.py. */
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "cpu_simd.h"

/* One weight matrix as cpu_gemv.c reads it (its `gemv` arguments). */
typedef struct {
    int format;
    const void *weight, *aux;
    int out_features, in_features, group_size;
    int doubled_inputs; /* int8-split: the product over [x, x] */
} Matrix;

/* One decoder layer; a NULL norm or bias is one the family does not have. */
typedef struct {
    const void *input_norm, *post_norm, *qkv_bias, *q_norm, *k_norm, *attn_out_norm, *mlp_out_norm;
    Matrix qkv, o_proj, gate_up, down;
    int window;       /* sliding window in tokens, 0: every key; a windowed layer reads the step's window slots and
                         tables (its own pool's, or the others' where the windowed layers keep none apart) */
    int local_rope;   /* it rotates by the windowed layers' own tables */
} Layer;

/* The model's shape; constant from step to step. */
typedef struct {
    int layers, hidden, heads, kv_heads, head_dim, rotary_dim, intermediate, gelu, bf16;
    float eps, scale;
    const void *final_norm;
} Model;

/* What changes from step to step: T sequences, one new token each. */
typedef struct {
    int tokens;
    void *hidden;                /* [T, D]: the tokens' embeddings in, the final normed states out */
    const int64_t *positions;    /* [T] */
    const void *cos, *sin, *local_cos, *local_sin; /* [P, rotary_dim / 2] */
    const int64_t *slots, *window_slots;            /* [T] */
    const int32_t *tables, *window_tables;          /* [T, max_blocks], [T, window_max_blocks] */
    int max_blocks, window_max_blocks, block_size;
    const int32_t *context_lens; /* [T] */
    void *const *kv;             /* per layer: [2, blocks, block_size, Hkv, d], or [.., d + 2] int8 rows */
    const int *kv_blocks;        /* per layer */
    int kv_int8;                 /* the pools hold int8 rows, codes and a scale (kernels/kv_quant.py) */
    int threads;
} Step;

/* y [T, N] = x [T, K] @ W^T (int8-split: [x, x] @ W^T over its 2K inputs). */
static int product(const Matrix *m, const void *x, const Model *model, int T, void *y, int threads) {
    const int K = m->doubled_inputs ? 2 * m->in_features : m->in_features;
    return gemv(m->format, m->weight, m->aux, m->out_features, K, m->group_size, m->doubled_inputs, x, model->bf16, T,
                y, threads);
}

static void add_bias(void *x, const void *bias, int T, int N, int bf16) {
    for (int t = 0; t < T; t++)
        for (int n = 0; n < N; n++) {
            const size_t at = (size_t)t * N + n;
            store_value(x, at, load_value(x, at, bf16) + load_value(bias, n, bf16), bf16);
        }
}

/* Runs the step: s->hidden becomes the final normed hidden states. Returns 0, or -1 when a buffer could not be had
 * or a width exceeds a kernel's limit. */
int decode_step(const Model *m, const Layer *layers, const Step *s) {
    const int T = s->tokens, D = m->hidden, d = m->head_dim, H = m->heads, Hkv = m->kv_heads, bf16 = m->bf16;
    const size_t element = bf16 ? 2 : 4, qkv_width = (size_t)(H + 2 * Hkv) * d;
    /* scratch, in the model's dtype: residual, x, qkv, attention out, gate|up, activation */
    const size_t sizes[] = {(size_t)T * D, (size_t)T * D, T * qkv_width, (size_t)T * H * d,
                            (size_t)T * 2 * m->intermediate, (size_t)T * m->intermediate};
    size_t total = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) total += sizes[i];
    char *scratch = malloc(total * element);
    if (!scratch) return -1;
    char *at = scratch, *buffers[sizeof sizes / sizeof *sizes];
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) buffers[i] = at, at += sizes[i] * element;
    void *hidden = s->hidden, *residual = buffers[0], *x = buffers[1], *qkv = buffers[2], *attn = buffers[3];
    void *gate_up = buffers[4], *act = buffers[5];
    int status = 0;
    for (int l = 0; l < m->layers && !status; l++) {
        const Layer *L = &layers[l];
        if (l == 0) { /* the stream starts as the embeddings themselves */
            memcpy(residual, hidden, (size_t)T * D * element);
            status |= rms_norm(hidden, NULL, L->input_norm, m->eps, x, NULL, T, D, bf16);
        } else {
            status |= rms_norm(hidden, residual, L->input_norm, m->eps, x, residual, T, D, bf16);
        }
        status |= product(&L->qkv, x, m, T, qkv, s->threads);
        if (L->qkv_bias) add_bias(qkv, L->qkv_bias, T, (int)qkv_width, bf16);
        if (L->q_norm && L->k_norm)
            for (int t = 0; t < T; t++) { /* over each head, in place */
                char *row = (char *)qkv + t * qkv_width * element;
                status |= rms_norm(row, NULL, L->q_norm, m->eps, row, NULL, H, d, bf16);
                status |= rms_norm(row + (size_t)H * d * element, NULL, L->k_norm, m->eps,
                                   row + (size_t)H * d * element, NULL, Hkv, d, bf16);
            }
        rotary(qkv, qkv_width, H + Hkv, d, L->local_rope ? s->local_cos : s->cos,
               L->local_rope ? s->local_sin : s->sin, s->positions, T, m->rotary_dim, bf16);
        const int64_t *slots = L->window ? s->window_slots : s->slots;
        const int32_t *tables = L->window ? s->window_tables : s->tables;
        const int max_blocks = L->window ? s->window_max_blocks : s->max_blocks;
        const char *k = (const char *)qkv + (size_t)H * d * element, *v = k + (size_t)Hkv * d * element;
        store_kv(k, v, qkv_width, s->kv[l], slots, T, Hkv, d, s->kv_blocks[l] * s->block_size, bf16, s->kv_int8);
        decode_attention(qkv, qkv_width, s->kv[l], tables, max_blocks, s->context_lens, T, H, Hkv, d,
                         s->kv_blocks[l], s->block_size, m->scale, L->window, attn, bf16, s->kv_int8, s->threads);
        status |= product(&L->o_proj, attn, m, T, hidden, s->threads);
        if (L->attn_out_norm) status |= rms_norm(hidden, NULL, L->attn_out_norm, m->eps, hidden, NULL, T, D, bf16);
        status |= rms_norm(hidden, residual, L->post_norm, m->eps, x, residual, T, D, bf16);
        status |= product(&L->gate_up, x, m, T, gate_up, s->threads);
        glu(gate_up, T, m->intermediate, m->gelu, act, bf16, s->threads);
        status |= product(&L->down, act, m, T, hidden, s->threads);
        if (L->mlp_out_norm) status |= rms_norm(hidden, NULL, L->mlp_out_norm, m->eps, hidden, NULL, T, D, bf16);
    }
    if (!status) status |= rms_norm(hidden, residual, m->final_norm, m->eps, hidden, residual, T, D, bf16);
    free(scratch);
    return status ? -1 : 0;
}
