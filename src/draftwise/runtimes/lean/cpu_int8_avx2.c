/* The int8 kernel's AVX2 path (`cpu_int8.c` says what it computes): one group (four 4-row quarters, lanes =
 * (row, pair of k)) against M inputs, vpmaddwd on int16 for the exact integer sums.
 * A block every input row of the tile holds at 8 bits (abits 8: xq = 256 v, v its high byte) on unsigned 4-6-bit
 * weights takes vpmaddubsw instead: 32 products of q by v an instruction where vpmaddwd makes 16, on the weights'
 * bytes as packed (two halves of 8 rows, lanes = rows, no widening to int16), summed in int16 for as many steps as
 * cannot saturate, then d = 256 Σ q·v: the same integer, so the same bits. */
#include "cpu_int8_avx2.h"

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

/* whether a block's activations are at 8 bits in every one of the M rows (wide: row 0's flag for it, B flags a row) */
INLINE int all_at_8(const int M, const uint8_t* wide, int64_t B) {
    int any = 0;
    for (int j = 0; j < M; j++) any |= wide[j * B];
    return !any;
}

/* the sums d of one block (inputs k0..k0+SB) whose activations are at 8 bits in all M rows (hi: their high bytes v,
 * xq = 256 v), rows 8h..8h+7 in dd[h][j]; the group's weights from u where it is unpacked to bytes, else from wg */
INLINE void sums8(const int M, const int bits, const int8_t* wg, const int8_t* u, int64_t k0, const int SB,
                  const uint8_t* hi, int64_t Kp, __m256i dd[2][2]) {
    /* steps of 4 k whose int16 lane sums stay within int16: a lane is at most 2·(2^bits - 1)·128 a step */
    const int flush = bits == 4 ? 8 : bits == 5 ? 4 : 2;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i raw[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < M; j++) dd[h][j] = _mm256_setzero_si256();
    for (int kf = 0; kf < SB; kf += 4 * flush) {
        __m256i p[2][2];
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < M; j++) p[h][j] = _mm256_setzero_si256();
        for (int kk = kf; kk < kf + 4 * flush && kk < SB; kk += 4) {
            const int64_t k = k0 + kk;
            __m256i xv[2];
            for (int j = 0; j < M; j++) xv[j] = _mm256_set1_epi32(*(const int32_t*)(hi + j * Kp + k));
            for (int h = 0; h < 2; h++) {
                const __m256i wv = u ? _mm256_load_si256((const __m256i*)(u + k * 16 + 32 * h))
                                     : half_bytes(bits, wg, k, h, &raw[h]);
                for (int j = 0; j < M; j++) p[h][j] = _mm256_add_epi16(p[h][j], _mm256_maddubs_epi16(wv, xv[j]));
            }
        }
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < M; j++) dd[h][j] = _mm256_add_epi32(dd[h][j], _mm256_madd_epi16(p[h][j], ones));
    }
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < M; j++) dd[h][j] = _mm256_slli_epi32(dd[h][j], 8);
}

/* the sums d of one block (inputs k0..k0+SB) on int16 activations q: a group's four 4-row quarters (lanes = (row,
 * pair of k)) widened to int16 for vpmaddwd, then rows 8h..8h+7 of each input row in dd[h][j], in row order */
INLINE void sums16(const int M, const int bits, const int8_t* wg, int64_t k0, const int SB, const int16_t* q,
                      int64_t Kp, __m256i dd[2][2]) {
    const __m128i nibble = _mm_set1_epi8(0x0F);
    const __m256i select = _mm256_setr_epi16(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384,
                                             (int16_t)0x8000);
    const __m256i bit4 = _mm256_set1_epi16(16), bit5 = _mm256_set1_epi16(32);
    const __m256i order = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7);
    __m128i raw[4];
    __m256i d[4][2]; /* quarter r: rows 4r..4r+3, each lane a row's partial sum over one pair of k */
    for (int r = 0; r < 4; r++)
        for (int j = 0; j < M; j++) d[r][j] = _mm256_setzero_si256();
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
            if (bits == 5 || bits == 6) { /* quarter r's 16 bits of each mask: q's bit 4 (and 5) */
                const uint16_t* m = (const uint16_t*)(wg + mask_at(k, bits));
                wv[r] = _mm256_add_epi16(wv[r], expand(m[r], select, bit4));
                if (bits == 6) wv[r] = _mm256_add_epi16(wv[r], expand(m[4 + r], select, bit5));
            }
        }
        for (int j = 0; j < M; j++) {
            const __m256i xb = _mm256_set1_epi64x(*(const int64_t*)(q + j * Kp + k));
            for (int r = 0; r < 4; r++) d[r][j] = _mm256_add_epi32(d[r][j], _mm256_madd_epi16(xb, wv[r]));
        }
    }
    for (int h = 0; h < 2; h++) /* rows 8h..8h+7: the pairs of quarters 2h, 2h+1 summed, in row order */
        for (int j = 0; j < M; j++)
            dd[h][j] = _mm256_permutevar8x32_epi32(_mm256_hadd_epi32(d[2 * h][j], d[2 * h + 1][j]), order);
}

/* one group (16 output rows) against M <= 2 input rows: each block's exact sums (sums8 where every row holds
 * it at 8 bits on 4-6-bit weights, else sums16), then its floating-point term, blocks in order */
INLINE void tile256(const int M, const int bits, const int fmt, const int ab, const int8_t* w, int64_t g,
                    const operands* o, const int8_t* u) {
    const int SB = SUBBLOCK(fmt);
    const int64_t Kp = o->Kp, NB = Kp / SB, B = Kp / BLOCK, group = Kp * 2 * bits;
    __m256 acc[2][2];
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < M; j++) acc[h][j] = _mm256_setzero_ps();
    const int8_t* wg = w + g * group;
    for (int64_t b = 0; b < NB; b++) {
        const int64_t k0 = b * SB;
        __m256i dd[2][2]; /* rows 8h..8h+7 of each input row: the block's exact sums d, in row order */
        if (ab == 8 && bits != 8 && all_at_8(M, o->wide + k0 / BLOCK, Kp / BLOCK))
            sums8(M, bits, wg, u, k0, SB, o->hi, Kp, dd);
        else
            sums16(M, bits, wg, k0, SB, o->q, Kp, dd);
        for (int h = 0; h < 2; h++) {
            const int64_t at = (g * NB + b) * 16 + h * 8, at8 = (g * (Kp / 256) + k0 / 256) * 16 + h * 8;
            const __m256 s = load8(o->s, o->sd, at, at8, fmt), z = fmt == KQ6 ? s : load8(o->z, o->zd, at, at8, fmt);
            for (int j = 0; j < M; j++) {
                __m256 term = fmt == KQ6 ? _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(dd[h][j], _mm256_set1_epi32(32 * o->t[j * NB + b]))), s)
                                         : _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(dd[h][j]), s),
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

/* abits 8 takes the int16 path's products on its int8 values (exact either way), then each block's scale; a pass of
 * UNPACK_ROWS(bits) rows or more unpacks each group's 4-6-bit weights to bytes once for its 8-bit blocks (timed on an
 * AMD EPYC Zen 3: 5-6 bits pay from 4 rows, where the masks cost most to expand; 4 bits from 16) */
#define UNPACK_ROWS(bits) ((bits) == 4 ? 16 : 4)
INLINE void groups256(const int bits, const int fmt, const int ab, const int8_t* w, const operands o, int64_t M,
                      int64_t g) {
    const int64_t NB = o.Kp / SUBBLOCK(fmt), B = o.Kp / BLOCK, group = o.Kp * 2 * bits;
    const int pre = ab == 8 && bits != 8 && M >= UNPACK_ROWS(bits);
    int8_t* u = pre ? (int8_t*)aligned_alloc(32, (size_t)(o.Kp * 16)) : NULL;
    for (int64_t g2 = g; g2 < g + 4; g2++) {
        if (pre) unpack_group(bits, w + g2 * group, o.Kp, u);
        operands r = o;
        for (int64_t m = M; m > 0; m -= 2, r.q += 2 * r.Kp, r.t += 2 * NB, r.sx += 2, r.y += 2 * r.N,
                     r.sa += r.sa ? 2 * B : 0, r.wide += r.wide ? 2 * B : 0, r.hi += r.hi ? 2 * r.Kp : 0) {
            if (m == 1)
                tile256(1, bits, fmt, ab, w, g2, &r, u);
            else
                tile256(2, bits, fmt, ab, w, g2, &r, u);
        }
    }
    free(u);
}

#define BODY256(name, bits, fmt, ab) \
    void name(const int8_t* w, operands o, int64_t M, int64_t g) { groups256(bits, fmt, ab, w, o, M, g); }
FORMATS(BODY256, groups256)
