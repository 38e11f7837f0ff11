/* CPU kernels for batch-1 decoding: small-batch matrix product, RMSNorm, attention with RoPE (and the families'
 * q/k norms, sliding windows and logit soft-capping), the SwiGLU and GeGLU products, soft-capping of logits.
 *
 * Small-batch fp32 matrix product: y[M, N] = x[M, K] @ w[N, K]^T with M small (1..16).
 *
 * Why not torch: on AVX2 machines the BLAS paths torch takes for a few rows are far from the memory floor.
 * Measured on a 2-core AMD EPYC (AVX2): streaming 425 MB of weights, F.linear reaches ~8 GB/s at M=1 and ~6 GB/s at M=5,
 * while this kernel reaches ~25 GB/s at M=1 and ~19 GB/s at M=5, so a (γ+1)-token verify pass costs little more than
 * one decoding step, as the weights are read once.
 *
 * Design: each thread owns a contiguous range of weight rows; a tile holds R rows x M inputs of 8-lane accumulators in
 * registers, with R and M compile-time constants at every call site (always_inline + full unrolling), and software
 * prefetch streams the weights a few tiles ahead. Every output is the same sequence of 8-lane FMAs over k followed by
 * the same horizontal sum, whatever M is: a row's result is bitwise identical in a 1-token step and a verify pass.
 */
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>

#define PF_TILES 16  /* prefetch distance in tiles of R rows (16 measured best of 2, 4, 8, 16 on the machine above) */

static inline float hsum(__m256 v) {
    __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

/* rows [n, n+R) of w against inputs x[0..M): R*M + R + 1 <= 16 ymm registers */
static inline __attribute__((always_inline)) void tile(const int R, const int M, const float* x, const float* w,
                                                       float* y, int64_t n, int64_t N, int64_t K, int prefetch) {
    __m256 acc[4][6];
#pragma GCC unroll 4
    for (int i = 0; i < R; i++)
#pragma GCC unroll 6
        for (int j = 0; j < M; j++) acc[i][j] = _mm256_setzero_ps();
    const float* wn = w + n * K;
    const char* ahead = (const char*)(wn + PF_TILES * R * K);
    for (int64_t k = 0; k < K; k += 8) {
        if (prefetch) {  /* R*32 bytes of the tile PF_TILES ahead per step: one whole tile per pass over k */
#pragma GCC unroll 4
            for (int i = 0; i < R; i += 2) _mm_prefetch(ahead + k * 4 * R + i * 32, _MM_HINT_T0);
        }
        __m256 wv[4];
#pragma GCC unroll 4
        for (int i = 0; i < R; i++) wv[i] = _mm256_loadu_ps(wn + i * K + k);
#pragma GCC unroll 6
        for (int j = 0; j < M; j++) {
            __m256 xv = _mm256_loadu_ps(x + j * K + k);
#pragma GCC unroll 4
            for (int i = 0; i < R; i++) acc[i][j] = _mm256_fmadd_ps(wv[i], xv, acc[i][j]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < R; i++)
#pragma GCC unroll 6
        for (int j = 0; j < M; j++) y[j * N + n + i] = hsum(acc[i][j]);
}

/* two rows against all M inputs, six at a time; the rows stay in L1 after the first group */
static void two_rows(const float* x, const float* w, float* y, int64_t M, int64_t n, int64_t N, int64_t K) {
    for (int prefetch = 1; M > 0; M -= 6, x += 6 * K, y += 6 * N, prefetch = 0) {
        switch (M < 6 ? M : 6) {
            case 1: tile(2, 1, x, w, y, n, N, K, prefetch); break;
            case 2: tile(2, 2, x, w, y, n, N, K, prefetch); break;
            case 3: tile(2, 3, x, w, y, n, N, K, prefetch); break;
            case 4: tile(2, 4, x, w, y, n, N, K, prefetch); break;
            case 5: tile(2, 5, x, w, y, n, N, K, prefetch); break;
            default: tile(2, 6, x, w, y, n, N, K, prefetch); break;
        }
    }
}

/* Contiguous fp32 x [M, K], w [N, K], y [M, N]; the caller guarantees K % 8 == 0 and N % 4 == 0. */
void draftwise_small_gemm(const float* x, const float* w, float* y, int64_t M, int64_t N, int64_t K, int nthreads) {
    if (M == 1) {
#pragma omp parallel for schedule(static) num_threads(nthreads)
        for (int64_t n = 0; n < N; n += 4) tile(4, 1, x, w, y, n, N, K, 1);
    } else {
#pragma omp parallel for schedule(static) num_threads(nthreads)
        for (int64_t n = 0; n < N; n += 2) two_rows(x, w, y, M, n, N, K);
    }
}

/* RMSNorm of each row, as transformers computes it: y = (x * rsqrt(mean(x^2) + eps)) * w. One fused pass instead of
 * the ~10 torch ops (casts, pow, mean, rsqrt, muls) that cost ~60 us per call at batch 1. */
void draftwise_rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t D, float eps) {
    for (int64_t r = 0; r < rows; r++, x += D, y += D) {
        __m256 acc = _mm256_setzero_ps();
        int64_t k = 0;
        for (; k + 8 <= D; k += 8) {
            __m256 v = _mm256_loadu_ps(x + k);
            acc = _mm256_fmadd_ps(v, v, acc);
        }
        float ss = hsum(acc);
        for (; k < D; k++) ss += x[k] * x[k];
        float inv = 1.0f / sqrtf(ss / (float)D + eps);
        for (k = 0; k < D; k++) y[k] = (x[k] * inv) * w[k];
    }
}

/* exp for 8 lanes (Cephes polynomial, as in avx_mathfun): relative error ~2e-7 on the softmax's range (x <= 0). */
static inline __m256 exp8(__m256 x) {
    const __m256 hi = _mm256_set1_ps(88.3762626647949f), lo = _mm256_set1_ps(-88.3762626647949f);
    x = _mm256_max_ps(_mm256_min_ps(x, hi), lo);
    __m256 fx = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f));
    fx = _mm256_floor_ps(fx);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500E-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    __m256i n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(0x7f)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(n));
}

/* Decoder self-attention for T new tokens of one sequence at positions pos..pos+T-1, in one call instead of ~15
 * torch ops. qkv [T, (H + 2KV) * hd] is the fused projection output, q and k in the pair-adjacent layout; RoPE is
 * applied to it in place with rot [*, hd/2] complex (cos, sin pairs, the variant's scaling folded in); keys and values
 * go to the cache k_cache, v_cache [KV, S, hd]; out [T, H * hd]. Query t sees keys start..pos+t: `start` > 0 skips a
 * left padding (a padding query sees only itself, so it stays finite); `window` > 0 keeps only the keys of the last
 * `window` positions (query q sees k > q - window, as transformers' sliding-window layers). Before RoPE, q_norm and
 * k_norm (NULL: none) RMS-normalise each q and k head (Qwen3, Gemma 3; weights in the pair-adjacent layout); scores
 * are `scale` * q.k, soft-capped to softcap * tanh(s / softcap) when softcap > 0 (Gemma 2). Each (head, query) is
 * computed the same way whatever T is, so a verify pass reproduces decoding steps exactly. hd % 8 == 0. */
static void head_norm(float* x, const float* w, int64_t hd, float eps) {
    float ss = 0.0f;
    for (int64_t i = 0; i < hd; i++) ss += x[i] * x[i];
    const float inv = 1.0f / sqrtf(ss / (float)hd + eps);
    for (int64_t i = 0; i < hd; i++) x[i] = (x[i] * inv) * w[i];
}

void draftwise_attention(float* qkv, const float* rot, float* k_cache, float* v_cache, float* out, int64_t T,
                         int64_t pos, int64_t start, int64_t H, int64_t KV, int64_t hd, int64_t S, float scale,
                         int nthreads, const float* q_norm, const float* k_norm, float norm_eps, int64_t window,
                         float softcap) {
    const int64_t row = (H + 2 * KV) * hd, G = H / KV, half = hd / 2;
    for (int64_t t = 0; t < T; t++) {
        float* x = qkv + t * row;
        const float* r = rot + 2 * (pos + t) * half;
        if (q_norm)
            for (int64_t h = 0; h < H; h++) head_norm(x + h * hd, q_norm, hd, norm_eps);
        if (k_norm)
            for (int64_t h = H; h < H + KV; h++) head_norm(x + h * hd, k_norm, hd, norm_eps);
        for (int64_t h = 0; h < H + KV; h++)  /* rotate q and k heads: (x0, x1) *= (cos + i sin) */
            for (int64_t i = 0; i < half; i++) {
                float x0 = x[h * hd + 2 * i], x1 = x[h * hd + 2 * i + 1], c = r[2 * i], s = r[2 * i + 1];
                x[h * hd + 2 * i] = x0 * c - x1 * s;
                x[h * hd + 2 * i + 1] = x0 * s + x1 * c;
            }
        for (int64_t g = 0; g < KV; g++) {
            memcpy(k_cache + (g * S + pos + t) * hd, x + (H + g) * hd, hd * sizeof(float));
            memcpy(v_cache + (g * S + pos + t) * hd, x + (H + KV + g) * hd, hd * sizeof(float));
        }
    }
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int64_t task = 0; task < H * T; task++) {
        const int64_t t = task / H, h = task % H, q_pos = pos + t;
        int64_t first = q_pos < start ? q_pos : start;
        if (window > 0 && q_pos - window + 1 > first) first = q_pos - window + 1;
        const int64_t n = q_pos + 1 - first;
        const float* q = qkv + t * row + h * hd;
        const float* K = k_cache + ((h / G) * S + first) * hd;
        const float* Vv = v_cache + ((h / G) * S + first) * hd;
        float stack_buf[2048];
        float* sc = n <= 2048 ? stack_buf : (float*)malloc(((n + 7) / 8 * 8) * sizeof(float));
        /* scores, four keys at a time so the FMA chains interleave */
        int64_t s = 0;
        for (; s + 4 <= n; s += 4) {
            const float* k0 = K + s * hd;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int64_t k = 0; k < hd; k += 8) {
                __m256 qv = _mm256_loadu_ps(q + k);
                a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + k), a0);
                a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + hd + k), a1);
                a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + 2 * hd + k), a2);
                a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + 3 * hd + k), a3);
            }
            sc[s] = hsum(a0) * scale, sc[s + 1] = hsum(a1) * scale, sc[s + 2] = hsum(a2) * scale, sc[s + 3] = hsum(a3) * scale;
        }
        for (; s < n; s++) {
            __m256 a0 = _mm256_setzero_ps();
            for (int64_t k = 0; k < hd; k += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + k), _mm256_loadu_ps(K + s * hd + k), a0);
            sc[s] = hsum(a0) * scale;
        }
        if (softcap > 0.0f)
            for (s = 0; s < n; s++) sc[s] = softcap * tanhf(sc[s] / softcap);
        float m = -INFINITY;
        for (s = 0; s < n; s++) m = sc[s] > m ? sc[s] : m;
        for (s = n; s % 8; s++) sc[s] = -INFINITY;  /* pad to whole vectors: exp(-inf) = 0 */
        __m256 sum8 = _mm256_setzero_ps(), mv = _mm256_set1_ps(m);
        for (s = 0; s < n; s += 8) {
            __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(sc + s), mv));
            _mm256_storeu_ps(sc + s, e);
            sum8 = _mm256_add_ps(sum8, e);
        }
        const float inv = 1.0f / hsum(sum8);
        float* o = out + t * H * hd + h * hd;
        for (int64_t k0 = 0; k0 < hd; k0 += 64) {  /* o = sum_s p_s v_s, 64 lanes of o in 8 registers at a time */
            const int64_t lanes = hd - k0 < 64 ? (hd - k0) / 8 : 8;
            __m256 acc[8];
            for (int j = 0; j < 8; j++) acc[j] = _mm256_setzero_ps();
            for (s = 0; s < n; s++) {
                __m256 p = _mm256_set1_ps(sc[s]);
                const float* v = Vv + s * hd + k0;
#pragma GCC unroll 8
                for (int j = 0; j < 8; j++)
                    if (j < lanes) acc[j] = _mm256_fmadd_ps(p, _mm256_loadu_ps(v + 8 * j), acc[j]);
            }
            for (int j = 0; j < lanes; j++) _mm256_storeu_ps(o + k0 + 8 * j, _mm256_mul_ps(acc[j], _mm256_set1_ps(inv)));
        }
        if (sc != stack_buf) free(sc);
    }
}

/* SwiGLU's product: out[r, j] = silu(gu[r, j]) * gu[r, F + j] for gu [rows, 2F] (gate then up, as fused). */
void draftwise_silu_mul(const float* gu, float* out, int64_t rows, int64_t F) {
    for (int64_t r = 0; r < rows; r++, gu += 2 * F, out += F) {
        int64_t j = 0;
        for (; j + 8 <= F; j += 8) {
            __m256 g = _mm256_loadu_ps(gu + j);
            __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
            __m256 silu = _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
            _mm256_storeu_ps(out + j, _mm256_mul_ps(silu, _mm256_loadu_ps(gu + F + j)));
        }
        for (; j < F; j++) out[j] = gu[j] / (1.0f + expf(-gu[j])) * gu[F + j];
    }
}

/* tanh for 8 lanes from exp8: tanh(y) = 1 - 2 / (exp(2y) + 1), saturating to +-1 where exp8 clamps. */
static inline __m256 tanh8(__m256 y) {
    const __m256 one = _mm256_set1_ps(1.0f);
    __m256 e = exp8(_mm256_add_ps(y, y));
    return _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, one)));
}

/* GeGLU's product (Gemma): out[r, j] = gelu_tanh(gu[r, j]) * gu[r, F + j], with
 * gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))), transformers' gelu_pytorch_tanh. */
void draftwise_gelu_tanh_mul(const float* gu, float* out, int64_t rows, int64_t F) {
    const float c = 0.7978845608028654f, a = 0.044715f;
    for (int64_t r = 0; r < rows; r++, gu += 2 * F, out += F) {
        int64_t j = 0;
        for (; j + 8 <= F; j += 8) {
            __m256 g = _mm256_loadu_ps(gu + j);
            __m256 inner = _mm256_mul_ps(_mm256_set1_ps(c), _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(a), g), _mm256_mul_ps(g, g), g));
            __m256 gelu = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), g), _mm256_add_ps(_mm256_set1_ps(1.0f), tanh8(inner)));
            _mm256_storeu_ps(out + j, _mm256_mul_ps(gelu, _mm256_loadu_ps(gu + F + j)));
        }
        for (; j < F; j++) {
            const float g = gu[j];
            out[j] = 0.5f * g * (1.0f + tanhf(c * (g + a * g * g * g))) * gu[F + j];
        }
    }
}

/* Soft-capping of logits in place, row by row (Gemma 2's final_logit_softcapping): x = cap * tanh(x / cap). */
void draftwise_softcap(float* x, int64_t rows, int64_t V, float cap) {
    for (int64_t r = 0; r < rows; r++, x += V)
        for (int64_t j = 0; j < V; j++) x[j] = cap * tanhf(x[j] / cap);
}
