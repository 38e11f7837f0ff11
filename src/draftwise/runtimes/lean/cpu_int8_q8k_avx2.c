/* The Q8_K prompt path (`cpu_int8_q8k.c` says what it computes) on AVX2: the same bits, for CPUs without AVX-512
 * VNNI (an AMD EPYC Zen 3), where the exact path multiplies 16-bit activations with vpmaddwd.
 *
 * Products: vpmaddubsw multiplies 32 unsigned weight bytes by 32 signed activation bytes and sums pairs into int16
 * (lane = (row, pair of k): one row's 4 inputs in two lanes), which saturates nowhere here: a lane is at most 2·63·127
 * (Q6_K's 6 bits) or 2·15·127 (Q4_K), so 2 (Q6_K) or 8 (Q4_K) of them add in int16 before vpmaddwd folds them into
 * int32 times each row's integer block scale at once. Every sum is an integer, and the floating-point work once a
 * super-block is `cpu_int8_q8k.c`'s, in its order: the same bits as `prompt.reference_q8k` whatever the order of the
 * integer sums. A tile is 8 output rows (half a packed group) against up to 4 input rows, within AVX2's 16
 * registers; a long pass unpacks a group's nibbles to bytes once, not once per tile.
 */
#include <stdlib.h>

#include "cpu_int8_avx2.h"

#define TILE_M 4 /* input rows a tile */
#define INLINE static inline __attribute__((always_inline))

INLINE int32_t hsum8(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1)));
}

/* |x| of 8 inputs from xr + k, zero past K */
INLINE __m256 abs8(const float* xr, int64_t k, int64_t K) {
    return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), load8x(xr, k, K));
}

/* x [M, K] -> v, sA, t, sh, ts as `cpu_int8_q8k.c`'s quantize256 makes them, the same values */
void draftwise_q8k_quantize_avx2(const float* x, int64_t M, int64_t K, int64_t Kp, int sb, int8_t* v, float* sA,
                                 int32_t* t, int32_t* sh, int32_t* ts, int nthreads) {
    const int64_t NS = Kp / SUPER, NB = Kp / sb, B = Kp / BLOCK;
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int64_t r = 0; r < M; r++) {
        const float* xr = x + r * K;
        for (int64_t s = 0; s < NS; s++) {
            float top_b[SUPER / BLOCK];
            __m256 top = _mm256_setzero_ps();
            for (int b = 0; b < SUPER / BLOCK; b++) {
                const int64_t k = s * SUPER + b * BLOCK;
                __m256 m = _mm256_setzero_ps();
                for (int i = 0; i < BLOCK; i += 8) m = _mm256_max_ps(m, abs8(xr, k + i, K));
                top_b[b] = hmax8(m);
                top = _mm256_max_ps(top, m);
            }
            const float amax = hmax8(top);
            sA[r * NS + s] = amax / 127.0f * (1.0f / (1 << Q8K_E));
            const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
            for (int b = 0; b < SUPER / BLOCK; b++) {
                const int64_t k = s * SUPER + b * BLOCK, bb = k / BLOCK;
                int e = 0;
                while (e < Q8K_E && top_b[b] * (float)(2 << e) <= amax) e++;
                sh[r * B + bb] = Q8K_E - e;
                const __m256 scale = _mm256_set1_ps(inv * (float)(1 << e));
                __m256i q[4];
                for (int i = 0; i < 4; i++) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(load8x(xr, k + 8 * i, K), scale));
                const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
                _mm256_storeu_si256((__m256i*)(v + r * Kp + k), _mm256_permutevar8x32_epi32(bytes, order));
                if (sb == SUB16) {
                    t[r * NB + k / 16] = hsum8(_mm256_add_epi32(q[0], q[1]));
                    t[r * NB + k / 16 + 1] = hsum8(_mm256_add_epi32(q[2], q[3]));
                } else {
                    t[r * NB + bb] = hsum8(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
                    ts[r * B + bb] = t[r * NB + bb] << sh[r * B + bb];
                }
            }
        }
    }
}

/* a block's integer scales of rows 8h..8h+7 in both int16 halves of each row's lane (vpmaddwd's second operand), and
 * as int32 */
INLINE __m256i scales32(const int bits, const uint8_t* at) {
    const __m128i b = _mm_loadl_epi64((const __m128i*)at);
    return bits == 6 ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b);
}
INLINE __m256i pair16(__m256i s32) {
    return _mm256_or_si256(_mm256_and_si256(s32, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(s32, 16));
}

/* rows 8h..8h+7 of group g (wg: its weights packed, or `pre` a byte each) against M <= TILE_M input rows */
INLINE void tile(const int M, const int bits, const int pre, const int8_t* wg, int64_t g, int h, const int8_t* v,
                 const float* sA, const int32_t* t, const int32_t* sh, const int32_t* ts, const operands* o) {
    const int sb = bits == 6 ? SUB16 : BLOCK, flush = bits == 6 ? 8 : 32; /* k a flush of int16 sums covers */
    const int64_t Kp = o->Kp, NB = Kp / sb, NS = Kp / SUPER, B = Kp / BLOCK;
    __m256 acc[TILE_M];
    __m256i raw = _mm256_setzero_si256();
    for (int j = 0; j < M; j++) acc[j] = _mm256_setzero_ps();
    for (int64_t s = 0; s < NS; s++) {
        __m256i I1[TILE_M];
        for (int j = 0; j < M; j++) I1[j] = _mm256_setzero_si256();
        for (int64_t b = s * (SUPER / sb); b < (s + 1) * (SUPER / sb); b++) {
            const __m256i sc = scales32(bits, (const uint8_t*)o->s + (g * NB + b) * 16 + 8 * h), sc16 = pair16(sc);
            for (int kf = 0; kf < sb; kf += flush) {
                __m256i p[TILE_M];
                for (int j = 0; j < M; j++) p[j] = _mm256_setzero_si256();
#pragma GCC unroll 8
                for (int kk = kf; kk < kf + flush; kk += 4) {
                    const int64_t k = b * sb + kk;
                    const __m256i wv = pre ? _mm256_load_si256((const __m256i*)(wg + k * 16 + 32 * h))
                                           : half_bytes(bits, wg, k, h, &raw);
                    for (int j = 0; j < M; j++)
                        p[j] = _mm256_add_epi16(p[j], _mm256_maddubs_epi16(wv, _mm256_set1_epi32(*(const int32_t*)(v + j * Kp + k))));
                }
                for (int j = 0; j < M; j++) { /* sc·Σ q·v, shifted by the activations' E - e */
                    const __m128i e = _mm_cvtsi32_si128(sh[j * B + b * sb / BLOCK]);
                    I1[j] = _mm256_add_epi32(I1[j], _mm256_sll_epi32(_mm256_madd_epi16(p[j], sc16), e));
                }
            }
            for (int j = 0; j < M && bits == 6; j++) { /* Q6_K's offsets: z = -32 s, so less sc·32·Σ v */
                const __m128i e = _mm_cvtsi32_si128(sh[j * B + b / 2]);
                const __m256i tz = _mm256_mullo_epi32(sc, _mm256_set1_epi32(32 * t[j * NB + b]));
                I1[j] = _mm256_sub_epi32(I1[j], _mm256_sll_epi32(tz, e));
            }
        }
        const int64_t at8 = (g * NS + s) * 16 + 8 * h;
        const __m256 d = _mm256_loadu_ps(o->sd + at8);
        for (int j = 0; j < M; j++) {
            __m256 term = _mm256_mul_ps(_mm256_cvtepi32_ps(I1[j]), d);
            if (bits != 6) { /* I2 = Σ mn·Σ v·2^(E-e) over the super-block's 8 blocks (ts: those sums, shifted) */
                __m256i I2 = _mm256_setzero_si256();
                for (int b = 0; b < 8; b++) {
                    const __m256i mn = scales32(4, (const uint8_t*)o->z + (g * NB + s * 8 + b) * 16 + 8 * h);
                    I2 = _mm256_add_epi32(I2, _mm256_mullo_epi32(mn, _mm256_set1_epi32(ts[j * B + s * 8 + b])));
                }
                term = _mm256_add_ps(term, _mm256_mul_ps(_mm256_cvtepi32_ps(I2), _mm256_loadu_ps(o->zd + at8)));
            }
            acc[j] = _mm256_add_ps(acc[j], _mm256_mul_ps(term, _mm256_set1_ps(sA[j * NS + s])));
        }
    }
    const int64_t n0 = g * 16 + 8 * h;
    if (n0 >= o->N) return;
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(o->N - n0 < 8 ? o->N - n0 : 8)),
                                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    for (int j = 0; j < M; j++) _mm256_maskstore_ps(o->y + j * o->N + n0, mask, acc[j]);
}

/* groups g..g+3 against all M input rows, TILE_M at a time; past one tile a group is unpacked to bytes first */
INLINE void groups(const int bits, const int8_t* w, const operands* o, const int8_t* v, const float* sA,
                   const int32_t* t, const int32_t* sh, const int32_t* ts, int64_t M, int64_t g) {
    const int64_t group = o->Kp * 2 * bits, NB = o->Kp / (bits == 6 ? SUB16 : BLOCK), NS = o->Kp / SUPER;
    const int64_t B = o->Kp / BLOCK;
    const int pre = M > TILE_M;
    int8_t* u = pre ? (int8_t*)aligned_alloc(32, (size_t)(o->Kp * 16)) : NULL;
    for (int64_t g2 = g; g2 < g + 4; g2++) {
        if (pre) unpack_group(bits, w + g2 * group, o->Kp, u);
        const int8_t* wg = pre ? u : w + g2 * group;
        for (int64_t m0 = 0; m0 < M; m0 += TILE_M) {
            operands at = *o;
            at.y = o->y + m0 * o->N;
            const int8_t* vm = v + m0 * o->Kp;
            const float* sm = sA + m0 * NS;
            const int32_t *tm = t + m0 * NB, *hm = sh + m0 * B, *hs = ts + m0 * B;
            for (int h = 0; h < 2; h++) switch ((M - m0 < TILE_M ? M - m0 : TILE_M) + TILE_M * pre) {
                    case 1: tile(1, bits, 0, wg, g2, h, vm, sm, tm, hm, hs, &at); break;
                    case 2: tile(2, bits, 0, wg, g2, h, vm, sm, tm, hm, hs, &at); break;
                    case 3: tile(3, bits, 0, wg, g2, h, vm, sm, tm, hm, hs, &at); break;
                    case 4: tile(4, bits, 0, wg, g2, h, vm, sm, tm, hm, hs, &at); break;
                    case 5: tile(1, bits, 1, wg, g2, h, vm, sm, tm, hm, hs, &at); break;
                    case 6: tile(2, bits, 1, wg, g2, h, vm, sm, tm, hm, hs, &at); break;
                    case 7: tile(3, bits, 1, wg, g2, h, vm, sm, tm, hm, hs, &at); break;
                    default: tile(4, bits, 1, wg, g2, h, vm, sm, tm, hm, hs, &at); break;
                }
        }
    }
    free(u);
}

/* groups g..g+3 of `bits` 4 or 6 (`cpu_int8_q8k.c`'s entry point calls it where AVX2 serves the Q8_K path) */
void draftwise_q8k_groups_avx2(const int bits, const int8_t* w, const operands* o, const int8_t* v, const float* sA,
                               const int32_t* t, const int32_t* sh, const int32_t* ts, int64_t M, int64_t g) {
    if (bits == 6)
        groups(6, w, o, v, sA, t, sh, ts, M, g);
    else
        groups(4, w, o, v, sA, t, sh, ts, M, g);
}
