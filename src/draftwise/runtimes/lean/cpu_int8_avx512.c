/* The int8 kernel's AVX-512 path (`cpu_int8.c` says what it computes): a tile of R groups (16 rows each, one per
 * lane) against M inputs, vpdpbusd for the exact integer sums. */
#include <stdlib.h>

#include "cpu_int8_avx512.h"

#define PD 4 /* sub-blocks ahead the scales' streams are prefetched */

/* the sums of sub-block k0..k0+SB of R groups (wg) against M inputs into dh (the high activation bytes) and, where
 * `both`, dl (the low bytes; a block at 8 bits has none) */
static AVX512 void slabs512(const int R, const int M, const int bits, const int pre, const int both, const int SB,
                            const int8_t* wg, int64_t group, int64_t k0, const operands* o, __m512i raw[4],
                            __m512i dl[4][4], __m512i dh[4][4]) {
    const int64_t Kp = o->Kp;
#pragma GCC unroll 8
    for (int kk = 0; kk < SB; kk += 4) {
        const int64_t k = k0 + kk;
        __m512i wv[4];
#pragma GCC unroll 4  /* the next tile's lines, into L2 (into L1 they evicted this tile's: 12 % slower) */
        for (int i = 0; i < R && !pre; i++)
            _mm_prefetch((const char*)(wg + R * group + k * 2 * bits * R + i * 64), _MM_HINT_T1);
#pragma GCC unroll 4
        for (int i = 0; i < R; i++) wv[i] = weights512(pre ? 8 : bits, wg + i * group, k, &raw[i]);
#pragma GCC unroll 6
        for (int j = 0; j < M; j++) {
            const __m512i xh = _mm512_set1_epi32(*(const int32_t*)(o->hi + j * Kp + k));
#pragma GCC unroll 4
            for (int i = 0; i < R; i++)
                dh[i][j] = bits == 8 ? _mm512_dpbusd_epi32(dh[i][j], xh, wv[i])   /* hi unsigned: corrected later */
                                     : _mm512_dpbusd_epi32(dh[i][j], wv[i], xh); /* q unsigned, hi signed */
            if (!both) continue;
            const __m512i xl = _mm512_set1_epi32(*(const int32_t*)(o->lo + j * Kp + k));
#pragma GCC unroll 4
            for (int i = 0; i < R; i++) dl[i][j] = _mm512_dpbusd_epi32(dl[i][j], xl, wv[i]);
        }
    }
}

/* R groups from wg (group g's weights; `pre`: unpacked already, a byte a weight, `unpack512`) against M inputs */
static AVX512 void tile512(const int R, const int M, const int bits, const int fmt, const int ab, const int pre,
                           const int8_t* wg, int64_t g, const operands* o) {
    const int SB = SUBBLOCK(fmt);
    const int64_t Kp = o->Kp, NB = Kp / SB, B = Kp / BLOCK;
    const int64_t group = pre ? Kp * 16 : Kp * 2 * bits; /* bytes of a group of 16 rows */
    __m512i raw[4];
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < R; i++)
#pragma GCC unroll 6
        for (int j = 0; j < M; j++) acc[i][j] = _mm512_setzero_ps();
    const int es = fmt == F32 ? 4 : fmt == F16 ? 2 : 1; /* bytes of a scale */
    for (int64_t b = 0; b < NB; b++) {
        __m512i dl[4][4], dh[4][4];
        const int64_t k0 = b * SB;
#pragma GCC unroll 4  /* the scales' streams, PD sub-blocks ahead (the hardware follows few streams at once) */
        for (int i = 0; i < R; i++) {
            const int64_t ahead = ((g + i) * NB + b + PD) * 16;
            _mm_prefetch((const char*)o->s + ahead * es, _MM_HINT_T1);
            if (fmt != KQ6) _mm_prefetch((const char*)o->z + ahead * es, _MM_HINT_T1);
            if ((fmt == KQ || fmt == KQ6) && (k0 & 255) == 0) {
                _mm_prefetch((const char*)(o->sd + ((g + i) * (Kp / 256) + k0 / 256 + 1) * 16), _MM_HINT_T1);
                if (fmt == KQ) _mm_prefetch((const char*)(o->zd + ((g + i) * (Kp / 256) + k0 / 256 + 1) * 16), _MM_HINT_T1);
            }
        }
#pragma GCC unroll 4
        for (int i = 0; i < R; i++)
#pragma GCC unroll 6
            for (int j = 0; j < M; j++) dl[i][j] = dh[i][j] = _mm512_setzero_si512();
        if (any_wide(ab, M, o->wide, B, k0 / BLOCK))
            slabs512(R, M, bits, pre, 1, SB, wg, group, k0, o, raw, dl, dh);
        else
            slabs512(R, M, bits, pre, 0, SB, wg, group, k0, o, raw, dl, dh);
#pragma GCC unroll 4
        for (int i = 0; i < R; i++) {
            const int64_t at = ((g + i) * NB + b) * 16, at8 = ((g + i) * (Kp / 256) + k0 / 256) * 16;
            const __m512 s = load16(o->s, o->sd, at, at8, fmt), z = fmt == KQ6 ? s : load16(o->z, o->zd, at, at8, fmt);
            const __m512i corr = corr512(bits, o->qsum, at);
#pragma GCC unroll 6
            for (int j = 0; j < M; j++) {
                const __m512 term = term512(fmt, ab, dl[i][j], dh[i][j], corr, s, z, o->t[j * NB + b],
                                            ab == 8 ? o->sa[j * B + k0 / BLOCK] : 0.0f);
                acc[i][j] = _mm512_add_ps(acc[i][j], term);
            }
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < R; i++) {
        const int64_t n0 = (g + i) * 16;
        if (n0 >= o->N) break;
        const __mmask16 rows = o->N - n0 >= 16 ? 0xFFFF : (__mmask16)((1u << (o->N - n0)) - 1);
#pragma GCC unroll 6
        for (int j = 0; j < M; j++)
            _mm512_mask_storeu_ps(o->y + j * o->N + n0, rows, _mm512_mul_ps(acc[i][j], _mm512_set1_ps(o->sx[j])));
    }
}

/* Inputs from which a pass over 6-bit weights unpacks its groups once (fewer: unpacked in registers per tile). A
 * 4096 x 1536 matrix at 128 rows: Q6_K 5.36 ms unpacked once, 6.59 per tile; 5 bits 5.23 / 5.26 and 4 bits 4.83 /
 * 4.57 (their unpacking is one or two instructions: reading back the bytes costs as much), so only 6 bits do. From 16
 * rows, not 8: on an AMD EPYC Zen 5 an 8-row pass unpacking once took 1.33x one unpacking per tile (the ladder's). */
#define UNPACK_ROWS 16

/* Four groups (64 rows) against M inputs. Two tilings, the same bits (every output's operations in the same order):
 * `seq` 0 holds four groups in a tile at one row (four weight streams in flight) and two at more rows; `seq` 1 one
 * group at a time at any M (one sequential weight stream a thread: on an AMD EPYC Zen 5 a one-row pass 15-20 %
 * faster), never unpacking 6-bit groups ahead. The ladder times both and takes the faster per band (`ladder.py`). */
static AVX512 void groups512(const int seq, const int bits, const int fmt, const int ab, const int8_t* w, operands o,
                             int64_t M, int64_t g) {
    const int64_t NB = o.Kp / SUBBLOCK(fmt), B = o.Kp / BLOCK, group = o.Kp * 2 * bits;
    if (M == 1 && !seq) {  /* one-token steps: four groups (four weight streams) in flight */
        tile512(4, 1, bits, fmt, ab, 0, w + g * group, g, &o);
        return;
    }
    const int pre = !seq && bits == 6 && M >= UNPACK_ROWS, R = seq ? 1 : 2;
    int8_t* u = pre ? (int8_t*)aligned_alloc(64, (size_t)(4 * o.Kp * 16)) : NULL;
    for (int i = 0; i < 4 && pre; i++) unpack512(bits, w + (g + i) * group, o.Kp, u + i * o.Kp * 16);
    for (; M > 0; M -= 4, o.lo += 4 * o.Kp, o.hi += 4 * o.Kp, o.t += 4 * NB, o.sx += 4, o.y += 4 * o.N,
                  o.sa += o.sa ? 4 * B : 0, o.wide += o.wide ? 4 * B : 0) {
        for (int64_t g2 = g; g2 < g + 4; g2 += R) {  /* after the first four inputs the groups come from L1/L2 */
            const int8_t* wg = pre ? u + (g2 - g) * o.Kp * 16 : w + g2 * group;
            switch ((M < 4 ? (int)M : 4) + 4 * pre + 8 * seq) {
                case 1: tile512(2, 1, bits, fmt, ab, 0, wg, g2, &o); break;
                case 2: tile512(2, 2, bits, fmt, ab, 0, wg, g2, &o); break;
                case 3: tile512(2, 3, bits, fmt, ab, 0, wg, g2, &o); break;
                case 4: tile512(2, 4, bits, fmt, ab, 0, wg, g2, &o); break;
                case 5: tile512(2, 1, bits, fmt, ab, 1, wg, g2, &o); break;
                case 6: tile512(2, 2, bits, fmt, ab, 1, wg, g2, &o); break;
                case 7: tile512(2, 3, bits, fmt, ab, 1, wg, g2, &o); break;
                case 8: tile512(2, 4, bits, fmt, ab, 1, wg, g2, &o); break;
                case 9: tile512(1, 1, bits, fmt, ab, 0, wg, g2, &o); break;
                case 10: tile512(1, 2, bits, fmt, ab, 0, wg, g2, &o); break;
                case 11: tile512(1, 3, bits, fmt, ab, 0, wg, g2, &o); break;
                default: tile512(1, 4, bits, fmt, ab, 0, wg, g2, &o); break;
            }
        }
    }
    free(u);
}

#define BODY512(name, bits, fmt, ab)                                                                  \
    __attribute__((target("avx512f,avx512bw,avx512vnni"))) void name(const int8_t* w, operands o, \
                                                                     int64_t M, int64_t g) {       \
        groups512(0, bits, fmt, ab, w, o, M, g);                                                      \
    }
FORMATS(BODY512, groups512)

#define BODY512SEQ(name, bits, fmt, ab)                                                               \
    __attribute__((target("avx512f,avx512bw,avx512vnni"))) void name(const int8_t* w, operands o, \
                                                                     int64_t M, int64_t g) {       \
        groups512(1, bits, fmt, ab, w, o, M, g);                                                      \
    }
FORMATS(BODY512SEQ, groups512seq)
