/* The int8 kernel's activations (`cpu_int8.c` says what they are): each input row quantized to int16 per row, or per
 * block of 32 at 8 or 16 bits (abits 8), then the bytes the AVX-512 and AMX paths multiply and each sub-block's sum.
 * Vectorized with AVX2 (every path's machine has it) and spread over the threads by rows: done one element at a time,
 * it took as long as the product itself for a few rows and a long K (4 ns an element; a 1.5B model's 4-token verify
 * pass spent 5 ms of its 50 here). Every value is what the scalar definition gives (`int8.quantize_rows`,
 * `quantize_blocks`): max, a product, round to nearest even and clamps are exact operations in any order. */
#include "cpu_int8_avx2.h"

#define QMAX 32767.0f
#define QMAX8 127.0f

/* the largest |x| of a row's K inputs */
static float amax_of(const float* xm, int64_t K) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, load8x(xm, k, K)));
    return hmax8(m);
}

/* rint(x · inv) clamped to ±qmax, as floats */
static inline __m256 level(__m256 x, __m256 inv, __m256 qmax) {
    const __m256 v = _mm256_round_ps(_mm256_mul_ps(x, inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return _mm256_min_ps(_mm256_max_ps(v, _mm256_sub_ps(_mm256_setzero_ps(), qmax)), qmax);
}

/* 8 float levels (integers within int16) stored as int16 at q */
static inline void store16(int16_t* q, __m256 v) {
    const __m256i i = _mm256_cvtps_epi32(v);
    const __m128i packed = _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
    _mm_storeu_si128((__m128i*)q, packed);
}

/* row m at 16 bits: q [Kp] (zero past K), its scale */
static void row16(const float* xm, int64_t K, int64_t Kp, int16_t* q, float* sx) {
    const float amax = amax_of(xm, K);
    const __m256 inv = _mm256_set1_ps(amax > 0.0f ? QMAX / amax : 0.0f), qmax = _mm256_set1_ps(QMAX);
    *sx = amax / QMAX;
    for (int64_t k = 0; k < Kp; k += 8) store16(q + k, level(load8x(xm, k, K), inv, qmax));
}

/* row m per block of 32: each block's scale sa, whether at 16 bits (wide), its values in 16-bit units (8-bit ones
 * times 256). Wide: its largest row-int16 value squared times K above WIDE_C2 times the row's sum of squares, both
 * exact (float64 sums of integers below 2^53). */
static void row_blocks(const float* xm, int64_t K, int64_t Kp, int16_t* q, float* sa, uint8_t* wide) {
    const float amax = amax_of(xm, K);
    const __m256 inv = _mm256_set1_ps(amax > 0.0f ? QMAX / amax : 0.0f), q16 = _mm256_set1_ps(QMAX);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const int64_t B = Kp / BLOCK;
    float top[B > 0 ? B : 1], bmax[B > 0 ? B : 1]; /* each block's largest |row int16| and |x| */
    __m256d squares = _mm256_setzero_pd();
    for (int64_t b = 0; b < B; b++) {
        __m256 t = _mm256_setzero_ps(), m = _mm256_setzero_ps();
        for (int64_t k = b * BLOCK; k < (b + 1) * BLOCK; k += 8) {
            const __m256 x = load8x(xm, k, K), r = level(x, inv, q16);
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, x));
            t = _mm256_max_ps(t, _mm256_andnot_ps(sign, r));
            const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(r)), hi = _mm256_cvtps_pd(_mm256_extractf128_ps(r, 1));
            squares = _mm256_add_pd(squares, _mm256_add_pd(_mm256_mul_pd(lo, lo), _mm256_mul_pd(hi, hi)));
        }
        top[b] = hmax8(t), bmax[b] = hmax8(m);
    }
    double s4[4];
    _mm256_storeu_pd(s4, squares);
    const double sum = (s4[0] + s4[1]) + (s4[2] + s4[3]);
    for (int64_t b = 0; b < B; b++) {
        const int w = (double)top[b] * (double)top[b] * (double)K > (double)WIDE_C2 * sum;
        const float qmax = w ? QMAX : QMAX8;
        const __m256 binv = _mm256_set1_ps(bmax[b] > 0.0f ? qmax / bmax[b] : 0.0f), vq = _mm256_set1_ps(qmax);
        const __m256 unit = _mm256_set1_ps(w ? 1.0f : 256.0f); /* 8-bit levels in 16-bit units: exact */
        wide[b] = (uint8_t)w;
        sa[b] = w ? bmax[b] / QMAX : bmax[b] / QMAX8 / 256.0f;
        for (int64_t k = b * BLOCK; k < (b + 1) * BLOCK; k += 8)
            store16(q + k, _mm256_mul_ps(level(load8x(xm, k, K), binv, vq), unit));
    }
}

/* a row's bytes of q + 32768 (lo, hi; hi less 128 as a signed byte where `signed_hi`) */
static void row_bytes(const int16_t* q, int64_t Kp, uint8_t* lo, uint8_t* hi, const int signed_hi) {
    const __m256i flip = _mm256_set1_epi16((short)0x8000), low = _mm256_set1_epi16(0xff);
    for (int64_t k = 0; k < Kp; k += 32) {
        __m256i a = _mm256_loadu_si256((const __m256i*)(q + k)), b = _mm256_loadu_si256((const __m256i*)(q + k + 16));
        if (!signed_hi) a = _mm256_xor_si256(a, flip), b = _mm256_xor_si256(b, flip);
        const __m256i l = _mm256_packus_epi16(_mm256_and_si256(a, low), _mm256_and_si256(b, low));
        /* signed_hi: (q + 32768) >> 8 less 128 is q's own high byte */
        const __m256i h = _mm256_packus_epi16(_mm256_srli_epi16(a, 8), _mm256_srli_epi16(b, 8));
        _mm256_storeu_si256((__m256i*)(lo + k), _mm256_permute4x64_epi64(l, 0xD8));
        _mm256_storeu_si256((__m256i*)(hi + k), _mm256_permute4x64_epi64(h, 0xD8));
    }
}

/* a row's sums of q per sub-block of sb (16 or 32) */
static void row_sums(const int16_t* q, int64_t Kp, int sb, int32_t* t) {
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t k = 0; k < Kp; k += 16) {
        const __m256i p = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i*)(q + k)), ones);
        __m128i s = _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
        s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
        s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
        if (sb == 16 || (k & 16) == 0) t[k / sb] = 0;
        t[k / sb] += _mm_cvtsi128_si32(s);
    }
}

/* x [M, K] into q [M, Kp] (per row: sx; abits 8: sa, wide [M, Kp / 32], sx = 1), its bytes (lo, hi [M, Kp], when
 * not NULL) and sums t [M, Kp / sb] */
void draftwise_int8_activations(const float* x, int64_t M, int64_t K, int64_t Kp, int abits, int signed_hi, int sb,
                                int16_t* q, float* sx, float* sa, uint8_t* wide, uint8_t* lo, uint8_t* hi, int32_t* t,
                                int nthreads) {
    const int64_t B = Kp / BLOCK;
#pragma omp parallel for schedule(static) num_threads(nthreads) if (M * K >= 65536)
    for (int64_t m = 0; m < M; m++) {
        if (abits == 8) {
            row_blocks(x + m * K, K, Kp, q + m * Kp, sa + m * B, wide + m * B);
            sx[m] = 1.0f;
        } else {
            row16(x + m * K, K, Kp, q + m * Kp, sx + m);
        }
        if (lo) row_bytes(q + m * Kp, Kp, lo + m * Kp, hi + m * Kp, signed_hi);
        row_sums(q + m * Kp, Kp, sb, t + m * (Kp / sb));
    }
}
