/* The prompt path of the integer kernel for K-quant weights (Q4_K, Q6_K), AVX-512 (AVX2: `cpu_int8_q8k_avx2.c`):
 * llama.cpp's Q8_K numerics made finer, a lossy choice for prompt passes only (`prompt.py`, chosen by the ladder
 * where it was timed faster).
 *
 * Activations: 8 bits per super-block of 256 inputs of a row, one scale each, sA = amax / 127, and each block of 32
 * within it a power of two finer where its own values allow (x = v·sA / 2^e, e = 0..E the most that keeps |v| <= 127:
 * a block beside an outlier channel keeps its own resolution, which one scale per 256, Q8_K's, loses: on
 * Qwen2.5-Coder-1.5B agreement with fp32 after a prefill 0.990 with one scale, see docs/results.md). Then every block's
 * scale is an integer, so a super-block sums in integers, each block's term shifted by E - e: Q4_K (s = d·sc, z = m·mn
 * per block of 32) I1 = Σ sc·Σ q·v·2^(E-e) and I2 = Σ mn·Σ v·2^(E-e) over its 8 blocks, y += (I1·d + I2·m)·sA/2^E;
 * Q6_K (s = d·sc per 16, z = -32 s) I1 = Σ sc·(Σ q·v - 32 Σ v)·2^(E-e) over its 16 sub-blocks, y += I1·d·sA/2^E. The
 * floating-point work is once a super-block, not once a block as on the exact path (`cpu_int8.c`), where at 8 bits it
 * costs as much as the products; every integer fits int32 (Q4_K |I1| < 8·32·15·127·63·2^E, Q6_K < 16·16·32·127·128·
 * 2^E: below 2^31 at E = 3). A row's result depends on that row alone, so a prompt's cache is the same whole or in
 * chunks. `prompt.reference_q8k` computes the same bits in torch.
 */
#include <math.h>
#include <stdlib.h>

#include "cpu_int8_avx512.h"


/* x [M, K] -> v [M, Kp] int8, sA [M, Kp / 256] (its super-block's scale / 2^E), t [M, Kp / sb] (the sums of v per
 * block of sb), sh [M, Kp / 32] (each block's E - e), ts [M, Kp / 32] (sb 32: t << sh) */
static __attribute__((target("avx512f,avx512bw"))) void quantize256(const float* x, int64_t M, int64_t K, int64_t Kp,
                                                                     int sb, int8_t* v, float* sA, int32_t* t,
                                                                     int32_t* sh, int32_t* ts, int nthreads) {
    const int64_t NS = Kp / SUPER, NB = Kp / sb, B = Kp / BLOCK;
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int64_t r = 0; r < M; r++) {
        const float* xr = x + r * K;
        for (int64_t s = 0; s < NS; s++) {
            __m512 top = _mm512_setzero_ps();
            for (int64_t k = s * SUPER; k < s * SUPER + SUPER; k += 16) {
                const __mmask16 in = k >= K ? 0 : K - k >= 16 ? 0xFFFF : (__mmask16)((1u << (K - k)) - 1);
                top = _mm512_max_ps(top, _mm512_abs_ps(_mm512_maskz_loadu_ps(in, xr + k)));
            }
            const float amax = _mm512_reduce_max_ps(top);
            sA[r * NS + s] = amax / 127.0f * (1.0f / (1 << Q8K_E));
            const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
            for (int64_t b = s * (SUPER / BLOCK); b < (s + 1) * (SUPER / BLOCK); b++) { /* each block's e */
                const int64_t k = b * BLOCK;
                const __mmask16 in0 = k >= K ? 0 : K - k >= 16 ? 0xFFFF : (__mmask16)((1u << (K - k)) - 1);
                const __mmask16 in1 = k + 16 >= K ? 0 : K - k - 16 >= 16 ? 0xFFFF : (__mmask16)((1u << (K - k - 16)) - 1);
                const float top_b = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(_mm512_maskz_loadu_ps(in0, xr + k)),
                                                                       _mm512_abs_ps(_mm512_maskz_loadu_ps(in1, xr + k + 16))));
                int e = 0;
                while (e < Q8K_E && top_b * (float)(2 << e) <= amax) e++;
                sh[r * B + b] = Q8K_E - e;
            }
            for (int64_t k = s * SUPER; k < s * SUPER + SUPER; k += BLOCK) { /* a block of 32: two vectors */
                const __m512 scale = _mm512_set1_ps(inv * (float)(1 << (Q8K_E - sh[r * B + k / BLOCK])));
                __m512i q[2];
                for (int h = 0; h < 2; h++) {
                    const int64_t kh = k + 16 * h;
                    const __mmask16 in = kh >= K ? 0 : K - kh >= 16 ? 0xFFFF : (__mmask16)((1u << (K - kh)) - 1);
                    q[h] = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(in, xr + kh), scale));
                    _mm_storeu_si128((__m128i*)(v + r * Kp + kh), _mm512_cvtsepi32_epi8(q[h]));
                }
                if (sb == 16) {
                    t[r * NB + k / 16] = _mm512_reduce_add_epi32(q[0]);
                    t[r * NB + k / 16 + 1] = _mm512_reduce_add_epi32(q[1]);
                } else {
                    t[r * NB + k / 32] = _mm512_reduce_add_epi32(_mm512_add_epi32(q[0], q[1]));
                    ts[r * B + k / 32] = t[r * NB + k / 32] << sh[r * B + k / 32];
                }
            }
        }
    }
}

/* one group (16 output rows: wg its weights, packed, or `pre` unpacked to a byte each) against M <= 8 input rows */
static AVX512 void tile_q8k(const int M, const int bits, const int pre, const int8_t* wg, int64_t g, const int8_t* v,
                            const float* sA, const int32_t* t, const int32_t* sh, const int32_t* ts,
                            const operands* o) {
    const int sb = bits == 6 ? SUB16 : BLOCK;
    const int64_t Kp = o->Kp, NB = Kp / sb, NS = Kp / SUPER, B = Kp / BLOCK;
    __m512 acc[8];
    __m512i raw;
    for (int j = 0; j < M; j++) acc[j] = _mm512_setzero_ps();
    for (int64_t s = 0; s < NS; s++) {
        __m512i I1[8];
        for (int j = 0; j < M; j++) I1[j] = _mm512_setzero_si512();
        for (int64_t b = s * (SUPER / sb); b < (s + 1) * (SUPER / sb); b++) {
            __m512i ds[8];
            for (int j = 0; j < M; j++) ds[j] = _mm512_setzero_si512();
#pragma GCC unroll 8
            for (int kk = 0; kk < sb; kk += 4) {
                const int64_t k = b * sb + kk;
                const __m512i wv = weights512(pre ? 8 : bits, wg, k, &raw);
#pragma GCC unroll 8
                for (int j = 0; j < M; j++)
                    ds[j] = _mm512_dpbusd_epi32(ds[j], wv, _mm512_set1_epi32(*(const int32_t*)(v + j * Kp + k)));
            }
            const int64_t at = (g * NB + b) * 16;
            const __m128i sc = _mm_loadu_si128((const __m128i*)((const uint8_t*)o->s + at));
            if (bits == 6) { /* signed scales per 16; z = -32 s: (Σ q·v - 32 Σ v)·sc */
                const __m512i s16 = _mm512_cvtepi8_epi32(sc);
                for (int j = 0; j < M; j++) {
                    const __m512i d = _mm512_sub_epi32(ds[j], _mm512_set1_epi32(32 * t[j * NB + b]));
                    const __m512i term = _mm512_mullo_epi32(d, s16);
                    I1[j] = _mm512_add_epi32(I1[j], _mm512_sllv_epi32(term, _mm512_set1_epi32(sh[j * B + b / 2])));
                }
            } else { /* unsigned scales per 32 (the mins below) */
                const __m512i s32 = _mm512_cvtepu8_epi32(sc);
                for (int j = 0; j < M; j++)
                    I1[j] = _mm512_add_epi32(
                        I1[j], _mm512_sllv_epi32(_mm512_mullo_epi32(ds[j], s32), _mm512_set1_epi32(sh[j * B + b])));
            }
        }
        const int64_t at8 = (g * NS + s) * 16;
        const __m512 d = _mm512_loadu_ps(o->sd + at8);
        const __m512 m = bits == 6 ? d : _mm512_loadu_ps(o->zd + at8);
        __m512i mn[8]; /* Q4_K's mins of the super-block's 8 blocks, read once for every row */
        for (int b = 0; b < 8 && bits != 6; b++)
            mn[b] = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)((const uint8_t*)o->z + (g * NB + s * 8 + b) * 16)));
        for (int j = 0; j < M; j++) {
            __m512 term = _mm512_mul_ps(_mm512_cvtepi32_ps(I1[j]), d);
            if (bits != 6) { /* I2 = Σ mn·Σ v·2^(E-e) over the super-block's blocks (ts: those sums, shifted) */
                __m512i I2 = _mm512_setzero_si512();
#pragma GCC unroll 8
                for (int b = 0; b < 8; b++)
                    I2 = _mm512_add_epi32(I2, _mm512_mullo_epi32(mn[b], _mm512_set1_epi32(ts[j * B + s * 8 + b])));
                term = _mm512_add_ps(term, _mm512_mul_ps(_mm512_cvtepi32_ps(I2), m));
            }
            acc[j] = _mm512_add_ps(acc[j], _mm512_mul_ps(term, _mm512_set1_ps(sA[j * NS + s])));
        }
    }
    const int64_t n0 = g * 16;
    if (n0 >= o->N) return;
    const __mmask16 rows = o->N - n0 >= 16 ? 0xFFFF : (__mmask16)((1u << (o->N - n0)) - 1);
    for (int j = 0; j < M; j++) _mm512_mask_storeu_ps(o->y + j * o->N + n0, rows, acc[j]);
}

/* Rows from which a group's 6-bit weights are unpacked to bytes once, not in registers per tile of rows */
#define Q8K_UNPACK_ROWS 9

static AVX512 void groups_q8k(const int bits, const int8_t* w, const operands* o, const int8_t* v, const float* sA,
                              const int32_t* t, const int32_t* sh, const int32_t* ts, int64_t M, int64_t g) {
    const int64_t group = o->Kp * 2 * bits, NB = o->Kp / (bits == 6 ? SUB16 : BLOCK), NS = o->Kp / SUPER;
    const int64_t B = o->Kp / BLOCK;
    const int pre = bits == 6 && M >= Q8K_UNPACK_ROWS;
    int8_t* u = pre ? (int8_t*)aligned_alloc(64, (size_t)(o->Kp * 16)) : NULL;
    for (int64_t g2 = g; g2 < g + 4; g2++) {
        if (pre) unpack512(bits, w + g2 * group, o->Kp, u);
        const int8_t* wg = pre ? u : w + g2 * group;
        for (int64_t m0 = 0; m0 < M; m0 += 8) {
            operands at = *o;
            at.y = o->y + m0 * o->N;
            const int8_t* vm = v + m0 * o->Kp;
            const float* sm = sA + m0 * NS;
            const int32_t* tm = t + m0 * NB;
            const int32_t* hm = sh + m0 * B;
            const int32_t* hs = ts + m0 * B;
            switch ((M - m0 < 8 ? M - m0 : 8) + 8 * pre) {
                case 1: tile_q8k(1, bits, 0, wg, g2, vm, sm, tm, hm, hs, &at); break;
                case 2: tile_q8k(2, bits, 0, wg, g2, vm, sm, tm, hm, hs, &at); break;
                case 3: tile_q8k(3, bits, 0, wg, g2, vm, sm, tm, hm, hs, &at); break;
                case 4: tile_q8k(4, bits, 0, wg, g2, vm, sm, tm, hm, hs, &at); break;
                case 5: tile_q8k(5, bits, 0, wg, g2, vm, sm, tm, hm, hs, &at); break;
                case 6: tile_q8k(6, bits, 0, wg, g2, vm, sm, tm, hm, hs, &at); break;
                case 7: tile_q8k(7, bits, 0, wg, g2, vm, sm, tm, hm, hs, &at); break;
                case 8: tile_q8k(8, bits, 0, wg, g2, vm, sm, tm, hm, hs, &at); break;
                case 9: tile_q8k(1, bits, 1, wg, g2, vm, sm, tm, hm, hs, &at); break;
                case 10: tile_q8k(2, bits, 1, wg, g2, vm, sm, tm, hm, hs, &at); break;
                case 11: tile_q8k(3, bits, 1, wg, g2, vm, sm, tm, hm, hs, &at); break;
                case 12: tile_q8k(4, bits, 1, wg, g2, vm, sm, tm, hm, hs, &at); break;
                case 13: tile_q8k(5, bits, 1, wg, g2, vm, sm, tm, hm, hs, &at); break;
                case 14: tile_q8k(6, bits, 1, wg, g2, vm, sm, tm, hm, hs, &at); break;
                case 15: tile_q8k(7, bits, 1, wg, g2, vm, sm, tm, hm, hs, &at); break;
                default: tile_q8k(8, bits, 1, wg, g2, vm, sm, tm, hm, hs, &at); break;
            }
        }
    }
    free(u);
}

static __attribute__((target("avx512f,avx512bw,avx512vnni"))) void groups_q8k4(const int8_t* w, const operands* o,
                                                                              const int8_t* v, const float* sA,
                                                                              const int32_t* t, const int32_t* sh,
                                                                              const int32_t* ts, int64_t M, int64_t g) {
    groups_q8k(4, w, o, v, sA, t, sh, ts, M, g);
}

static __attribute__((target("avx512f,avx512bw,avx512vnni"))) void groups_q8k6(const int8_t* w, const operands* o,
                                                                              const int8_t* v, const float* sA,
                                                                              const int32_t* t, const int32_t* sh,
                                                                              const int32_t* ts, int64_t M, int64_t g) {
    groups_q8k(6, w, o, v, sA, t, sh, ts, M, g);
}

int draftwise_int8_isa(void); /* cpu_int8.c */
void draftwise_q8k_quantize_avx2(const float* x, int64_t M, int64_t K, int64_t Kp, int sb, int8_t* v, float* sA,
                                 int32_t* t, int32_t* sh, int32_t* ts, int nthreads); /* cpu_int8_q8k_avx2.c */
void draftwise_q8k_groups_avx2(const int bits, const int8_t* w, const operands* o, const int8_t* v, const float* sA,
                               const int32_t* t, const int32_t* sh, const int32_t* ts, int64_t M, int64_t g);

/* y[M, N] = x[M, K] @ w^T on Q4_K (bits 4, fmt KQ) or Q6_K (bits 6, fmt KQ6) weights as `cpu_int8.c` packs them (s
 * and z their bytes, sd and zd their super-blocks' d and m), at llama.cpp's Q8_K activations (file header); the same
 * bits on AVX2 where the CPU lacks AVX-512 VNNI (or built with DRAFTWISE_Q8K_AVX2: its tests on an AVX-512 machine).
 * Whether either is faster here than the exact path is the ladder's to time. */
void draftwise_q8k_gemm(const float* x, const int8_t* w, const void* s, const void* z, const float* sd,
                        const float* zd, float* y, int64_t M, int64_t N, int64_t K, int64_t Kp, int nthreads,
                        int bits) {
#ifdef DRAFTWISE_Q8K_AVX2
    const int avx2 = 1;
#else
    const int avx2 = draftwise_int8_isa() < 2;
#endif
    const int sb = bits == 6 ? SUB16 : BLOCK;
    int8_t* v = (int8_t*)aligned_alloc(64, (size_t)(M * Kp + 63) / 64 * 64);
    float* sA = (float*)malloc(M * (Kp / SUPER) * sizeof(float));
    int32_t* t = (int32_t*)malloc(M * (Kp / sb) * sizeof(int32_t));
    int32_t* sh = (int32_t*)malloc(2 * M * (Kp / BLOCK) * sizeof(int32_t)), *ts = sh + M * (Kp / BLOCK);
    if (avx2)
        draftwise_q8k_quantize_avx2(x, M, K, Kp, sb, v, sA, t, sh, ts, nthreads);
    else
        quantize256(x, M, K, Kp, sb, v, sA, t, sh, ts, nthreads);
    const operands o = {NULL, NULL, NULL, NULL, NULL, NULL, NULL, s, z, sd, zd, NULL, y, N, Kp};
    const int64_t G = (N + 63) / 64 * 4;
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int64_t g = 0; g < G; g += 4) {
        if (avx2)
            draftwise_q8k_groups_avx2(bits, w, &o, v, sA, t, sh, ts, M, g);
        else if (bits == 6)
            groups_q8k6(w, &o, v, sA, t, sh, ts, M, g);
        else
            groups_q8k4(w, &o, v, sA, t, sh, ts, M, g);
    }
    free(v);
    free(sA);
    free(t);
    free(sh);
}
