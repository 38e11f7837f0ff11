/* What the AVX2 code of the int8 kernel shares (`cpu_int8_quant.c` the activations, `cpu_int8_avx2.c` the exact
 * path, `cpu_int8_q8k_avx2.c` Q8_K's): loading a row's inputs, and 4-6-bit weights as bytes, half a packed group of
 * 16 rows at a time (8 rows, byte (n % 8)·4 + k % 4: vpmaddubsw's unsigned operand, one row's 4 inputs in each 32-bit
 * lane). */
#include "cpu_int8.h"

#define AVX2_INLINE static inline __attribute__((always_inline))

AVX2_INLINE float hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
}

/* 8 inputs from xm + k (zero past K) */
AVX2_INLINE __m256 load8x(const float* xm, int64_t k, int64_t K) {
    if (k + 8 <= K) return _mm256_loadu_ps(xm + k);
    float tail[8] = {0};
    for (int64_t i = k; i < K; i++) tail[i - k] = xm[i];
    return _mm256_loadu_ps(tail);
}

/* 32 bits of a mask (bit (n % 8)·4 + k % 4 of half a group) as 32 bytes: `value` where set, else 0 */
AVX2_INLINE __m256i expand_bits(uint32_t bits32, const __m256i value) {
    const __m256i spread = _mm256_setr_epi64x(0, 0x0101010101010101LL, 0x0202020202020202LL, 0x0303030303030303LL);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i b = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)bits32), spread), bit);
    return _mm256_and_si256(_mm256_cmpeq_epi8(b, bit), value);
}

/* the 32 bytes of q for inputs k..k+3 of rows 8h..8h+7 of a group (wg packed, `bits` 4, 5 or 6; raw: its nibbles
 * for 8 k, loaded at k % 8 == 0 and kept for k + 4) */
AVX2_INLINE __m256i half_bytes(const int bits, const int8_t* wg, int64_t k, int h, __m256i* raw) {
    const __m256i nibble = _mm256_set1_epi8(0x0F);
    __m256i wv;
    if ((k & 7) == 0) {
        *raw = _mm256_loadu_si256((const __m256i*)(wg + nibble_at(k, bits) + 32 * h));
        wv = _mm256_and_si256(*raw, nibble);
    } else {
        wv = _mm256_and_si256(_mm256_srli_epi16(*raw, 4), nibble);
    }
    if (bits == 5 || bits == 6) { /* q's bit 4 (and 5) from the masks (`cpu_int8.h`), the half's 32 bits of each */
        const uint32_t* m = (const uint32_t*)(wg + mask_at(k, bits));
        wv = _mm256_add_epi8(wv, expand_bits(m[h], _mm256_set1_epi8(16)));
        if (bits == 6) wv = _mm256_add_epi8(wv, expand_bits(m[2 + h], _mm256_set1_epi8(32)));
    }
    return wv;
}

/* group wg's q for every k, a byte each (64 bytes per 4 k of 16 rows, half h at 32·h), into u (32-byte aligned): a
 * long pass unpacks a group once, not once per tile of input rows */
AVX2_INLINE void unpack_group(const int bits, const int8_t* wg, int64_t Kp, int8_t* u) {
    __m256i raw[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    for (int64_t k = 0; k < Kp; k += 4)
        for (int h = 0; h < 2; h++) _mm256_store_si256((__m256i*)(u + k * 16 + 32 * h), half_bytes(bits, wg, k, h, &raw[h]));
}
