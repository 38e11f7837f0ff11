/* What the AVX-512 and AMX paths of the int8 kernel share: loading a group's weights as bytes, and the floating-point
 * work per block (one function, so both give the same bits). */
#include "cpu_int8.h"

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vnni"), always_inline)) inline

/* a sub-block's scales or offsets of 16 rows (at), as fp32; KQ, KQ6: times their super-block's (at8) */
static AVX512 __m512 load16(const void* p, const float* per8, int64_t at, int64_t at8, const int fmt) {
    if (fmt == KQ || fmt == KQ6) {
        const __m128i b = _mm_loadu_si128((const __m128i*)((const uint8_t*)p + at));
        const __m512i v = fmt == KQ ? _mm512_cvtepu8_epi32(b) : _mm512_cvtepi8_epi32(b);
        return _mm512_mul_ps(_mm512_cvtepi32_ps(v), _mm512_loadu_ps(per8 + at8));
    }
    return fmt == F16 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)((const uint16_t*)p + at)))
                      : _mm512_loadu_ps((const float*)p + at);
}

/* the 64 bytes of q for inputs k..k+3 of a group's 16 rows (wi: the group's packed weights), byte (n % 16)·4 + k % 4;
 * raw: the 8 inputs' nibbles, loaded at k % 8 == 0 and kept for k + 4 */
static AVX512 __m512i weights512(const int bits, const int8_t* wi, int64_t k, __m512i* raw) {
    const __m512i nibble = _mm512_set1_epi8(0x0F);
    if (bits == 8) return _mm512_loadu_si512((const void*)(wi + k * 16));
    __m512i wv;
    if ((k & 7) == 0) {  /* 8 k of 16 rows: this k's in the low nibbles, k + 4's in the high */
        *raw = _mm512_loadu_si512((const void*)(wi + nibble_at(k, bits)));
        wv = _mm512_and_si512(*raw, nibble);
    } else {
        wv = _mm512_and_si512(_mm512_srli_epi16(*raw, 4), nibble);
    }
    if (bits == 5 || bits == 6) {  /* q's bit 4 (and 5) from the masks: added where set (the nibble is below 16) */
        const uint64_t* m = (const uint64_t*)(wi + mask_at(k, bits));
        wv = _mm512_mask_add_epi8(wv, _cvtu64_mask64(m[0]), wv, _mm512_set1_epi8(16));
        if (bits == 6) wv = _mm512_mask_add_epi8(wv, _cvtu64_mask64(m[1]), wv, _mm512_set1_epi8(32));
    }
    return wv;
}

/* the correction of int8 weights' unsigned activation bytes: 2^15 times the block's sum of q */
static AVX512 __m512i corr512(const int bits, const int16_t* qsum, int64_t at) {
    if (bits != 8) return _mm512_setzero_si512();
    return _mm512_slli_epi32(_mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i*)(qsum + at))), 15);
}

/* one block's term of 16 outputs of one input row: its exact sums of the high and low activation bytes, dh and dl
 * (0 where the block is at 8 bits), less corr, times the block's scales, plus its activation sum t times the offsets;
 * at abits 8 times the activations' block scale sa */
static AVX512 __m512 term512(const int fmt, const int ab, __m512i dl, __m512i dh, __m512i corr, __m512 s, __m512 z,
                             int32_t t, float sa) {
    const __m512i d = _mm512_sub_epi32(_mm512_add_epi32(_mm512_slli_epi32(dh, 8), dl), corr);
    /* KQ6: z = -32 s, so d·s + t·z = (d - 32 t)·s, the integer exact: one product, not two */
    __m512 term = fmt == KQ6 ? _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(d, _mm512_set1_epi32(32 * t))), s)
                             : _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(d), s),
                                             _mm512_mul_ps(_mm512_set1_ps((float)t), z));
    return ab == 8 ? _mm512_mul_ps(term, _mm512_set1_ps(sa)) : term;
}

/* whether block b (of 32 k, B a row) of any of rows 0..M-1 is held at 16 bits: its low bytes need their products */
static AVX512 int any_wide(const int ab, const int M, const uint8_t* wide, int64_t B, int64_t b) {
    int w = ab == 16;
    for (int j = 0; j < M && !w; j++) w = wide[j * B + b];
    return w;
}

/* group g's q for every k, a byte each (the int8 layout), into u: a long pass unpacks its nibbles once, not once
 * per 4 inputs */
static AVX512 void unpack512(const int bits, const int8_t* wg, int64_t Kp, int8_t* u) {
    __m512i raw;
    for (int64_t k = 0; k < Kp; k += 4) _mm512_store_si512((void*)(u + k * 16), weights512(bits, wg, k, &raw));
}

