/* The decoder layers of the lean forward in one call: the kernels of cpu_kernels.c and cpu_int8.c in the order
 * `lean.Layer.forward` calls them, layer after layer, for a decoding step, a verify pass or a prompt's chunk.
 *
 * Why: at batch 1 a layer is ~10 kernel calls and ~10 torch ops, each a few microseconds of Python and dispatch;
 * with int8 weights the layer's own work is ~0.1 ms, so that overhead was a third of a step. One call a layer still
 * left ~25 us of Python a layer (a quarter of a 135M step, measured by perf); one call for the whole stack leaves
 * one. Every value is computed by the same functions in the same order as the unfused path (rms_norm, gemm + bias,
 * attention, residual adds), so they give the same bits; what changes is only who calls them.
 */
#include <stdint.h>
#include <stdlib.h>

void draftwise_small_gemm(const float* x, const float* w, float* y, int64_t M, int64_t N, int64_t K, int nthreads);
void draftwise_int8_gemm(const float* x, const int8_t* w, const void* s, const void* z, const float* sd,
                         const float* zd, const int16_t* qsum, float* y, int64_t M, int64_t N, int64_t K, int64_t Kp,
                         int nthreads, const uint8_t* route, int bits, int fmt, int abits);
void draftwise_rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t D, float eps);
void draftwise_attention(float* qkv, const float* rot, float* k_cache, float* v_cache, float* out, int64_t T,
                         int64_t pos, int64_t start, int64_t H, int64_t KV, int64_t hd, int64_t S, float scale,
                         int nthreads, const float* q_norm, const float* k_norm, float norm_eps, int64_t window,
                         float softcap);
void draftwise_silu_mul(const float* gu, float* out, int64_t rows, int64_t F);
void draftwise_gelu_tanh_mul(const float* gu, float* out, int64_t rows, int64_t F);

/* a weight y = x @ w^T (+ bias): fp32 (w) or int8 / q4 (q, block scales s, offsets z, Q4_K's super-block factors
 * sd and zd, sums of q; w NULL; bits 8 or 4; fmt: how s and z are held; abits: the activations' bits, cpu_int8.c) */
typedef struct {
    const float* w;
    const int8_t* q;
    const void* s;
    const void* z;
    const float* sd;
    const float* zd;
    const int16_t* qsum;
    const float* bias;
    int64_t N, K, Kp, bits, fmt, abits;
} dw_matrix;

/* a layer's weights and settings (NULL norms: the family has none); mirrors kernels.LayerStruct */
typedef struct {
    dw_matrix qkv, o, gu, down;
    const float *ln_attn, *ln_attn_out, *ln_mlp, *ln_mlp_out, *q_norm, *k_norm;
    int64_t H, KV, hd, window;
    float eps, scale, softcap;
    int gelu;
} dw_layer;

static void matmul(const dw_matrix* m, const float* x, float* y, int64_t rows, int nthreads, const uint8_t* route) {
    if (m->w)
        draftwise_small_gemm(x, m->w, y, rows, m->N, m->K, nthreads);
    else
        draftwise_int8_gemm(x, m->q, m->s, m->z, m->sd, m->zd, m->qsum, y, rows, m->N, m->K, m->Kp, nthreads, route,
                            (int)m->bits, (int)m->fmt, (int)m->abits);
    if (m->bias)
        for (int64_t r = 0; r < rows; r++)
            for (int64_t n = 0; n < m->N; n++) y[r * m->N + n] += m->bias[n];
}

static void add(float* x, const float* y, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] += y[i];
}

/* the layer over nseg segments of rows: segment b is lens[b] consecutive rows of x (NULL: T each), written in cache row
 * slots[b] (NULL: b) from position poss[b] (NULL: pos), its first real position start[b] (NULL: 0) */
static void layer_rows(const dw_layer* L, float* x, const float* rot, float* k_cache, float* v_cache, int64_t nseg,
                       int64_t T, const int64_t* lens, const int64_t* slots, int64_t pos, const int64_t* poss,
                       const int64_t* start, int64_t S, int nthreads, const uint8_t* route) {
    int64_t rows = 0;
    for (int64_t b = 0; b < nseg; b++) rows += lens ? lens[b] : T;
    const int64_t D = L->o.N, F = L->down.K, nqkv = L->qkv.N, natt = L->H * L->hd, cache_row = L->KV * S * L->hd;
    float* h = (float*)malloc(rows * D * sizeof(float));
    float* qkv = (float*)malloc(rows * nqkv * sizeof(float));
    float* att = (float*)malloc(rows * natt * sizeof(float));
    float* out = (float*)malloc(rows * D * sizeof(float));
    float* gu = (float*)malloc(rows * 2 * F * sizeof(float));
    float* act = (float*)malloc(rows * F * sizeof(float));

    draftwise_rms_norm(x, L->ln_attn, h, rows, D, L->eps);
    matmul(&L->qkv, h, qkv, rows, nthreads, route);
    for (int64_t b = 0, r = 0; b < nseg; r += lens ? lens[b] : T, b++) {
        const int64_t slot = slots ? slots[b] : b;
        draftwise_attention(qkv + r * nqkv, rot, k_cache + slot * cache_row, v_cache + slot * cache_row,
                            att + r * natt, lens ? lens[b] : T, poss ? poss[b] : pos, start ? start[b] : 0, L->H,
                            L->KV, L->hd, S, L->scale, nthreads, L->q_norm, L->k_norm, L->eps, L->window, L->softcap);
    }
    matmul(&L->o, att, out, rows, nthreads, route);
    if (L->ln_attn_out) draftwise_rms_norm(out, L->ln_attn_out, out, rows, D, L->eps);
    add(x, out, rows * D);

    draftwise_rms_norm(x, L->ln_mlp, h, rows, D, L->eps);
    matmul(&L->gu, h, gu, rows, nthreads, route);
    if (L->gelu)
        draftwise_gelu_tanh_mul(gu, act, rows, F);
    else
        draftwise_silu_mul(gu, act, rows, F);
    matmul(&L->down, act, out, rows, nthreads, route);
    if (L->ln_mlp_out) draftwise_rms_norm(out, L->ln_mlp_out, out, rows, D, L->eps);
    add(x, out, rows * D);

    free(h), free(qkv), free(att), free(out), free(gu), free(act);
}

/* n layers one after another in one call (a step, a verify pass, a prompt's chunk: the whole stack without Python
 * between its layers): layer i reads RoPE table rots[i] [*, hd/2] complex and its cache at k_cache / v_cache + i *
 * stride floats ([rows, KV, S, hd]). x [rows, D] is updated in place. The rows: nseg segments, segment b lens[b]
 * consecutive rows (NULL: T each) into cache row slots[b] (NULL: b) from position poss[b] (NULL: pos), its first
 * real position start[b] (NULL: 0; keys before it are a left padding); every row computed as in its own pass (the
 * matrices' rows are independent, `cpu_int8.c`), so a continuous batch's rows and a joining prompt's chunk share one
 * read of the weights. */
void draftwise_layers(const dw_layer* const* layers, const float* const* rots, int64_t n, float* x, float* k_cache,
                      float* v_cache, int64_t stride, int64_t nseg, int64_t T, const int64_t* lens,
                      const int64_t* slots, int64_t pos, const int64_t* poss, const int64_t* start, int64_t S,
                      int nthreads, const uint8_t* route) {
    for (int64_t i = 0; i < n; i++)
        layer_rows(layers[i], x, rots[i], k_cache + i * stride, v_cache + i * stride, nseg, T, lens, slots, pos, poss,
                   start, S, nthreads, route);
}
