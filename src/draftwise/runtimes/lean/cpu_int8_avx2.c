/* The int8 kernel's AVX2 path (`cpu_int8.c` says what it computes): one group (four 4-row quarters, lanes =
 * (row, pair of k)) against M inputs, vpmaddwd on int16 for the exact integer sums. */
#include "cpu_int8.h"

#define INLINE static inline __attribute__((always_inline))

INLINE __m256 load8(const void* p, const float* per8, int64_t at, int64_t at8, const int fmt) {
    if (fmt == KQ || fmt == KQ6) {
        const __m128i b = _mm_loadl_epi64((const __m128i*)((const uint8_t*)p + at));
        const __m256i v = fmt == KQ ? _mm256_cvtepu8_epi32(b) : _mm256_cvtepi8_epi32(b);
        return _mm256_mul_ps(_mm256_cvtepi32_ps(v), _mm256_loadu_ps(per8 + at8));
    }
    return fmt == F16 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)((const uint16_t*)p + at)))
                      : _mm256_loadu_ps((const float*)p + at);
}

/* 16 bits of a mask as 16 int16 lanes: `value` where the lane's bit is set, else 0 */
INLINE __m256i expand(uint16_t bits16, const __m256i select, const __m256i value) {
    const __m256i v = _mm256_and_si256(_mm256_set1_epi16((int16_t)bits16), select);
    return _mm256_and_si256(_mm256_cmpeq_epi16(v, select), value);
}

INLINE void tile256(const int M, const int bits, const int fmt, const int ab, const int8_t* w, int64_t g,
                    const operands* o) {
    const int SB = SUBBLOCK(fmt);
    const int64_t Kp = o->Kp, NB = Kp / SB, B = Kp / BLOCK, group = Kp * 2 * bits;
    const __m128i nibble = _mm_set1_epi8(0x0F);
    const __m256i select = _mm256_setr_epi16(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384,
                                             (int16_t)0x8000);
    const __m256i bit4 = _mm256_set1_epi16(16), bit5 = _mm256_set1_epi16(32);
    __m128i raw[4];
    __m256 acc[2][2];
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < M; j++) acc[h][j] = _mm256_setzero_ps();
    const int8_t* wg = w + g * group;
    const __m256i order = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7);
    for (int64_t b = 0; b < NB; b++) {
        __m256i d[4][2];  /* quarter r: rows 4r..4r+3, each lane a row's partial sum over one pair of k */
        for (int r = 0; r < 4; r++)
            for (int j = 0; j < M; j++) d[r][j] = _mm256_setzero_si256();
        const int64_t k0 = b * SB;
        for (int kk = 0; kk < SB; kk += 4) {
            const int64_t k = k0 + kk;
            __m256i wv[4];
            for (int r = 0; r < 4; r++) {
                if (bits == 8) {
                    wv[r] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(wg + k * 16 + r * 16)));
                } else if ((k & 7) == 0) {
                    raw[r] = _mm_loadu_si128((const __m128i*)(wg + nibble_at(k, bits) + r * 16));
                    wv[r] = _mm256_cvtepu8_epi16(_mm_and_si128(raw[r], nibble));
                } else {
                    wv[r] = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw[r], 4), nibble));
                }
                if (bits == 5 || bits == 6) {  /* quarter r's 16 bits of each mask: q's bit 4 (and 5) */
                    const uint16_t* m = (const uint16_t*)(wg + mask_at(k, bits));
                    wv[r] = _mm256_add_epi16(wv[r], expand(m[r], select, bit4));
                    if (bits == 6) wv[r] = _mm256_add_epi16(wv[r], expand(m[4 + r], select, bit5));
                }
            }
            for (int j = 0; j < M; j++) {
                const __m256i xb = _mm256_set1_epi64x(*(const int64_t*)(o->q + j * Kp + k));
                for (int r = 0; r < 4; r++) d[r][j] = _mm256_add_epi32(d[r][j], _mm256_madd_epi16(xb, wv[r]));
            }
        }
        for (int h = 0; h < 2; h++) {  /* rows 8h..8h+7: the pairs of quarters 2h, 2h+1 summed, in row order */
            const int64_t at = (g * NB + b) * 16 + h * 8, at8 = (g * (Kp / 256) + k0 / 256) * 16 + h * 8;
            const __m256 s = load8(o->s, o->sd, at, at8, fmt), z = fmt == KQ6 ? s : load8(o->z, o->zd, at, at8, fmt);
            for (int j = 0; j < M; j++) {
                const __m256i dd = _mm256_permutevar8x32_epi32(_mm256_hadd_epi32(d[2 * h][j], d[2 * h + 1][j]), order);
                __m256 term = fmt == KQ6 ? _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(dd, _mm256_set1_epi32(32 * o->t[j * NB + b]))), s)
                                         : _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(dd), s),
                                                         _mm256_mul_ps(_mm256_set1_ps((float)o->t[j * NB + b]), z));
                if (ab == 8) term = _mm256_mul_ps(term, _mm256_set1_ps(o->sa[j * B + k0 / BLOCK]));
                acc[h][j] = _mm256_add_ps(acc[h][j], term);
            }
        }
    }
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int h = 0; h < 2; h++) {
        const int64_t n0 = g * 16 + h * 8;
        if (n0 >= o->N) break;
        const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(o->N - n0 < 8 ? o->N - n0 : 8)), lanes);
        for (int j = 0; j < M; j++)
            _mm256_maskstore_ps(o->y + j * o->N + n0, mask, _mm256_mul_ps(acc[h][j], _mm256_set1_ps(o->sx[j])));
    }
}

/* abits 8 takes the int16 path's products on its int8 values (exact either way), then each block's scale */
INLINE void groups256(const int bits, const int fmt, const int ab, const int8_t* w, operands o, int64_t M, int64_t g) {
    const int64_t NB = o.Kp / SUBBLOCK(fmt), B = o.Kp / BLOCK;
    for (; M > 0; M -= 2, o.q += 2 * o.Kp, o.t += 2 * NB, o.sx += 2, o.y += 2 * o.N, o.sa += o.sa ? 2 * B : 0)
        for (int64_t g2 = g; g2 < g + 4; g2++) {
            if (M == 1)
                tile256(1, bits, fmt, ab, w, g2, &o);
            else
                tile256(2, bits, fmt, ab, w, g2, &o);
        }
}

#define BODY256(name, bits, fmt, ab) \
    void name(const int8_t* w, operands o, int64_t M, int64_t g) { groups256(bits, fmt, ab, w, o, M, g); }
FORMATS(BODY256, groups256)
