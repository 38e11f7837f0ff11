/* Matrix product of the lean engine's int8 and q4 precisions: y[M, N] = x[M, K] @ w[N, K]^T, int8 or 4-bit weights,
 * int16 activations.
 *
 * Weights (`int8.py` quantizes and packs them once, at load time): int8 in blocks of 32 along K, each block of each row
 * with its own scale s and offset z (fp16): w = s * q + z, q in [-128, 127]. Asymmetric blocks of 32 represent the
 * 16 levels of a Q4_0 / Q4_1 block exactly when the block uses all of them, and near-exactly otherwise. Packed in groups
 * of 16 rows, element (n, k) at ((n / 16) * Kp / 4 + k / 4) * 64 + (n % 16) * 4 + k % 4: 64 bytes hold 4 consecutive
 * k of 16 rows, one output row per 32-bit lane (no horizontal sums). K is padded with zeros to Kp (a multiple of 64),
 * N to a multiple of 64 rows. Scales, offsets and each block's sum of q (int16, for the correction below)
 * [N / 16, Kp / 32, 16].
 * Activations: quantized here to int16 per row m (per token), never per tensor: sx[m] = amax|x[m]| / 32767,
 * xq = rint(x * (32767 / amax)). At 16 bits the activations' own rounding is ~1/32767 of the row's largest value, so
 * outlier channels cost nothing, unlike 8-bit activations.
 * Per block b: an exact int32 sum d = Σ xq * q over its 32 k (|d| < 32 * 32767 * 128 < 2^31) and the block's
 * activation sum t = Σ xq, then acc = acc + ((float)d * s + (float)t * z) in fp32, blocks in order; y = acc * sx[m].
 * AVX-512 computes d with vpdpbusd (unsigned x signed bytes, 64 products an instruction): xq + 32768 = 256 hi + lo in
 * two unsigned bytes, d = 256 Σ hi q + Σ lo q − 32768 Σ q. AVX2 widens q to int16 and uses vpmaddwd.
 * q4 (`q4.py`: a GGUF file's own Q4_0 / Q4_1 / Q4_K blocks, w = s * q + z, q in [0, 15]): the same function with q
 * held as nibbles, 64 bytes for 8 consecutive k of 16 rows (low nibbles: k..k+3 in the int8 layout above, high
 * nibbles: k+4..k+7), and s, z in fp16 where the file's values are fp16 (Q4_0, Q4_1: 20 bytes a block of 32, the
 * file's own size), or as Q4_K holds them (s = sc * d, z = mn * m: the blocks' 6-bit sc and mn as bytes [G, B, 16], d
 * and m = -dmin in fp32 per super-block of 8 blocks [G, B / 8, 16]; 19 bytes a block, the products exact in fp32),
 * or in fp32 (any other values). Since q is never
 * negative, AVX-512 needs no sums of q: with xq = 256 hs + lo (hs = hi - 128, a signed byte), d = 256 Σ q hs + Σ lo q,
 * q the unsigned operand of the first product and lo of the second. Unpacked to bytes in registers, the sums and
 * every floating-point operation are the int8 path's: the same bits as `int8.reference_linear` on the unpacked
 * weight.
 * Every output is that same sequence of operations whatever M is, so a row's result is bitwise the same in a
 * one-token step and in a (γ+1)-token verify pass, on the AVX-512 path, the AVX2 path and torch's `reference_linear`.
 * (Compiled with -ffp-contract=off: a fused multiply-add would round differently from the reference.)
 *
 * Why draftwise's own kernel: torch's dynamic int8 linear (fbgemm) takes one activation scale per tensor, so a row of a
 * verify pass would round differently from its one-token step; `_weight_int8pack_mm` grows linearly with the rows.
 * Here the weights are read from memory once per pass whatever M is (a tile holds R groups against up to 4 input
 * rows, the next tile prefetched while it computes), which keeps a short verify pass close to one step.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#define BLOCK 32
#define QMAX 32767.0f
#define QMAX8 127.0f
#define PD 4 /* blocks ahead the scales' streams are prefetched */

/* rows m of x quantized to int8 per block of 32 (abits 8): q [M, Kp] holds the values (zero past K), sa [M, B] each
 * block's scale, sx[m] = 1; lo: the values + 128 as unsigned bytes (against signed int8 weights), hi: the values
 * as signed bytes (against unsigned nibbles) */
static void quantize_blocks(const float* x, int64_t M, int64_t K, int64_t Kp, int16_t* q, float* sx, float* sa,
                            int32_t* t, uint8_t* lo, uint8_t* hi) {
    const int64_t B = Kp / BLOCK;
    for (int64_t m = 0; m < M; m++) {
        const float* xm = x + m * K;
        int16_t* qm = q + m * Kp;
        sx[m] = 1.0f;
        for (int64_t b = 0; b < B; b++) {
            const int64_t k0 = b * BLOCK, k1 = k0 + BLOCK < K ? k0 + BLOCK : K;
            float amax = 0.0f;
            for (int64_t k = k0; k < k1; k++) amax = fmaxf(amax, fabsf(xm[k]));
            const float inv = amax > 0.0f ? QMAX8 / amax : 0.0f;
            sa[m * B + b] = amax / QMAX8;
            int32_t sum = 0;
            for (int64_t k = k0; k < k0 + BLOCK; k++) {
                const float v = k < k1 ? rintf(xm[k] * inv) : 0.0f;
                const int16_t v16 = (int16_t)(v > QMAX8 ? QMAX8 : v < -QMAX8 ? -QMAX8 : v);
                qm[k] = v16, sum += v16;
                if (lo) lo[m * Kp + k] = (uint8_t)(v16 + 128), hi[m * Kp + k] = (uint8_t)(int8_t)v16;
            }
            t[m * B + b] = sum;
        }
    }
}

/* rows m of x quantized to int16 into q [M, Kp] (zero past K), with each row's scale sx[m] and block sums t [M, B];
 * lo, hi (when not NULL): the bytes of q + 32768, hi less 128 as a signed byte where `signed_hi` */
static void quantize_rows(const float* x, int64_t M, int64_t K, int64_t Kp, int16_t* q, float* sx, int32_t* t,
                          uint8_t* lo, uint8_t* hi, const int signed_hi) {
    const int64_t B = Kp / BLOCK;
    for (int64_t m = 0; m < M; m++) {
        const float* xm = x + m * K;
        float amax = 0.0f;
        for (int64_t k = 0; k < K; k++) amax = fmaxf(amax, fabsf(xm[k]));
        const float inv = amax > 0.0f ? QMAX / amax : 0.0f;
        sx[m] = amax / QMAX;
        int16_t* qm = q + m * Kp;
        for (int64_t k = 0; k < K; k++) {
            float v = rintf(xm[k] * inv);
            qm[k] = (int16_t)(v > QMAX ? QMAX : v < -QMAX ? -QMAX : v);
        }
        for (int64_t k = K; k < Kp; k++) qm[k] = 0;
        for (int64_t b = 0; b < B; b++) {
            int32_t sum = 0;
            for (int64_t k = b * BLOCK; k < (b + 1) * BLOCK; k++) sum += qm[k];
            t[m * B + b] = sum;
        }
        if (lo)
            for (int64_t k = 0; k < Kp; k++) {
                const uint16_t u = (uint16_t)(qm[k] + 32768);
                lo[m * Kp + k] = (uint8_t)(u & 0xff), hi[m * Kp + k] = (uint8_t)(u >> 8) ^ (signed_hi ? 0x80 : 0);
            }
    }
}

/* what a tile needs besides its weights: activations, block sums, row scales, the block scales and offsets, y */
typedef struct {
    const int16_t* q;      /* this chunk's inputs [M, Kp] */
    const uint8_t* lo;     /* their bytes (AVX-512) */
    const uint8_t* hi;
    const int32_t* t;      /* their block sums [M, B] */
    const float* sx;       /* their scales */
    const float* sa;       /* abits 8: their blocks' scales [M, B] */
    const void* s;         /* block scales [G, B, 16]: fp16 (int8; q4 where exact), fp32, or Q4_K's sc (bytes) */
    const void* z;         /* block offsets, the same (Q4_K's mn) */
    const float* sd;       /* Q4_K: the super-blocks' d [G, B / 8, 16] */
    const float* zd;       /* Q4_K: the super-blocks' -dmin */
    const int16_t* qsum;   /* blocks' sums of q (int8 on AVX-512) */
    float* y;              /* row 0 of this chunk's outputs */
    int64_t N, Kp;
} operands;

/* ---- AVX-512: a tile of R groups (16 rows each, one per lane) against M inputs ---- */
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vnni"), always_inline)) inline

/* formats of the block scales and offsets */
#define F32 0
#define F16 1
#define KQ 2 /* Q4_K's: a byte per block times an fp32 per super-block */

/* a block's scales or offsets of 16 rows (at), as fp32; KQ: times their super-block's (at8) */
static AVX512 __m512 load16(const void* p, const float* per8, int64_t at, int64_t at8, const int fmt) {
    if (fmt == KQ)
        return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)((const uint8_t*)p + at)))),
                             _mm512_loadu_ps(per8 + at8));
    return fmt == F16 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)((const uint16_t*)p + at)))
                      : _mm512_loadu_ps((const float*)p + at);
}

static AVX512 void tile512(const int R, const int M, const int bits, const int fmt, const int ab, const int8_t* w,
                           int64_t g, const operands* o) {
    const int64_t Kp = o->Kp, B = Kp / BLOCK, group = Kp * 2 * bits;  /* bytes of a group of 16 rows */
    const __m512i nibble = _mm512_set1_epi8(0x0F);
    __m512i raw[4];
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < R; i++)
#pragma GCC unroll 6
        for (int j = 0; j < M; j++) acc[i][j] = _mm512_setzero_ps();
    const int8_t* wg = w + g * group;
    const int es = fmt == F32 ? 4 : fmt == F16 ? 2 : 1; /* bytes of a block scale */
    for (int64_t b = 0; b < B; b++) {
        __m512i dl[4][4], dh[4][4];
#pragma GCC unroll 4  /* the scales' streams, PD blocks ahead (the hardware follows few streams at once) */
        for (int i = 0; i < R; i++) {
            const int64_t ahead = ((g + i) * B + b + PD) * 16;
            _mm_prefetch((const char*)o->s + ahead * es, _MM_HINT_T1);
            _mm_prefetch((const char*)o->z + ahead * es, _MM_HINT_T1);
            if (fmt == KQ && (b & 7) == 0) {
                _mm_prefetch((const char*)(o->sd + ((g + i) * (B / 8) + b / 8 + PD / 8) * 16), _MM_HINT_T1);
                _mm_prefetch((const char*)(o->zd + ((g + i) * (B / 8) + b / 8 + PD / 8) * 16), _MM_HINT_T1);
            }
        }
#pragma GCC unroll 4
        for (int i = 0; i < R; i++)
#pragma GCC unroll 6
            for (int j = 0; j < M; j++) dl[i][j] = dh[i][j] = _mm512_setzero_si512();
        const int64_t k0 = b * BLOCK;
#pragma GCC unroll 8
        for (int kk = 0; kk < BLOCK; kk += 4) {
            const int64_t k = k0 + kk;
            __m512i wv[4];
#pragma GCC unroll 4  /* the next tile's lines, into L2 (into L1 they evicted this tile's: 12 % slower) */
            for (int i = 0; i < R; i++)
                _mm_prefetch((const char*)(wg + R * group + k * 2 * bits * R + i * 64), _MM_HINT_T1);
#pragma GCC unroll 4
            for (int i = 0; i < R; i++) {
                if (bits == 8) {
                    wv[i] = _mm512_loadu_si512((const void*)(wg + i * group + k * 16));
                } else if ((kk & 7) == 0) {  /* 8 k of 16 rows: this k's in the low nibbles, k + 4's in the high */
                    raw[i] = _mm512_loadu_si512((const void*)(wg + i * group + k * 8));
                    wv[i] = _mm512_and_si512(raw[i], nibble);
                } else {
                    wv[i] = _mm512_and_si512(_mm512_srli_epi16(raw[i], 4), nibble);
                }
            }
#pragma GCC unroll 6
            for (int j = 0; j < M && ab == 8; j++) {  /* one product an instruction: the other operand's sign */
                const __m512i xv = _mm512_set1_epi32(*(const int32_t*)((bits == 8 ? o->lo : o->hi) + j * Kp + k));
#pragma GCC unroll 4
                for (int i = 0; i < R; i++)
                    dl[i][j] = bits == 8 ? _mm512_dpbusd_epi32(dl[i][j], xv, wv[i]) : _mm512_dpbusd_epi32(dl[i][j], wv[i], xv);
            }
#pragma GCC unroll 6
            for (int j = 0; j < M && ab == 16; j++) {
                const __m512i xl = _mm512_set1_epi32(*(const int32_t*)(o->lo + j * Kp + k));
                const __m512i xh = _mm512_set1_epi32(*(const int32_t*)(o->hi + j * Kp + k));
#pragma GCC unroll 4
                for (int i = 0; i < R; i++) {
                    dl[i][j] = _mm512_dpbusd_epi32(dl[i][j], xl, wv[i]);
                    dh[i][j] = bits == 8 ? _mm512_dpbusd_epi32(dh[i][j], xh, wv[i])   /* hi unsigned: corrected below */
                                         : _mm512_dpbusd_epi32(dh[i][j], wv[i], xh); /* q unsigned, hi signed */
                }
            }
        }
#pragma GCC unroll 4
        for (int i = 0; i < R; i++) {
            const int64_t at = ((g + i) * B + b) * 16, at8 = ((g + i) * (B / 8) + b / 8) * 16;
            const __m512 s = load16(o->s, o->sd, at, at8, fmt), z = load16(o->z, o->zd, at, at8, fmt);
            const __m512i corr = bits == 8 ? _mm512_slli_epi32(_mm512_cvtepi16_epi32(
                                                 _mm256_loadu_si256((const __m256i*)(o->qsum + at))), ab == 8 ? 7 : 15)
                                           : _mm512_setzero_si512();
#pragma GCC unroll 6
            for (int j = 0; j < M; j++) {
                const __m512i d = ab == 8 ? _mm512_sub_epi32(dl[i][j], corr)
                                          : _mm512_sub_epi32(_mm512_add_epi32(_mm512_slli_epi32(dh[i][j], 8), dl[i][j]), corr);
                __m512 term = _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(d), s),
                                            _mm512_mul_ps(_mm512_set1_ps((float)o->t[j * B + b]), z));
                if (ab == 8) term = _mm512_mul_ps(term, _mm512_set1_ps(o->sa[j * B + b]));
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

static AVX512 void groups512(const int bits, const int fmt, const int ab, const int8_t* w, operands o, int64_t M,
                             int64_t g) {
    const int64_t B = o.Kp / BLOCK;
    if (M == 1) {  /* one-token steps: four groups (four weight streams) in flight */
        tile512(4, 1, bits, fmt, ab, w, g, &o);
        return;
    }
    for (; M > 0; M -= 4, o.lo += 4 * o.Kp, o.hi += 4 * o.Kp, o.t += 4 * B, o.sx += 4, o.y += 4 * o.N,
                  o.sa += o.sa ? 4 * B : 0) {
        for (int64_t g2 = g; g2 < g + 4; g2 += 2) {  /* after the first four inputs the groups come from L1/L2 */
            switch (M < 4 ? (int)M : 4) {
                case 1: tile512(2, 1, bits, fmt, ab, w, g2, &o); break;
                case 2: tile512(2, 2, bits, fmt, ab, w, g2, &o); break;
                case 3: tile512(2, 3, bits, fmt, ab, w, g2, &o); break;
                default: tile512(2, 4, bits, fmt, ab, w, g2, &o); break;
            }
        }
    }
}

/* one compiled body per weight format (bits and the scales' width constants in each) */
#define BODY512(name, bits, fmt, ab)                                                                        \
    __attribute__((target("avx512f,avx512bw,avx512vnni"))) static void name(const int8_t* w, operands o, \
                                                                            int64_t M, int64_t g) {       \
        groups512(bits, fmt, ab, w, o, M, g);                                                               \
    }
/* every weight format at both activation precisions: a compiled body each, on each path */
#define FORMATS(BODY, path)              \
    BODY(path##_q8, 8, F16, 16)          \
    BODY(path##_q4, 4, F32, 16)          \
    BODY(path##_q4h, 4, F16, 16)         \
    BODY(path##_q4k, 4, KQ, 16)          \
    BODY(path##_q8_a8, 8, F16, 8)        \
    BODY(path##_q4_a8, 4, F32, 8)        \
    BODY(path##_q4h_a8, 4, F16, 8)       \
    BODY(path##_q4k_a8, 4, KQ, 8)
FORMATS(BODY512, groups512)

/* ---- AVX2: one group (four 4-row quarters, lanes = (row, pair of k)) against M inputs ---- */
#define INLINE static inline __attribute__((always_inline))

INLINE __m256 load8(const void* p, const float* per8, int64_t at, int64_t at8, const int fmt) {
    if (fmt == KQ)
        return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)((const uint8_t*)p + at)))),
                             _mm256_loadu_ps(per8 + at8));
    return fmt == F16 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)((const uint16_t*)p + at)))
                      : _mm256_loadu_ps((const float*)p + at);
}

INLINE void tile256(const int M, const int bits, const int fmt, const int ab, const int8_t* w, int64_t g,
                    const operands* o) {
    const int64_t Kp = o->Kp, B = Kp / BLOCK, group = Kp * 2 * bits;
    const __m128i nibble = _mm_set1_epi8(0x0F);
    __m128i raw[4];
    __m256 acc[2][2];
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < M; j++) acc[h][j] = _mm256_setzero_ps();
    const int8_t* wg = w + g * group;
    const __m256i order = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7);
    for (int64_t b = 0; b < B; b++) {
        __m256i d[4][2];  /* quarter r: rows 4r..4r+3, each lane a row's partial sum over one pair of k */
        for (int r = 0; r < 4; r++)
            for (int j = 0; j < M; j++) d[r][j] = _mm256_setzero_si256();
        for (int kk = 0; kk < BLOCK; kk += 4) {
            const int64_t k = b * BLOCK + kk;
            __m256i wv[4];
            for (int r = 0; r < 4; r++) {
                if (bits == 8) {
                    wv[r] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(wg + k * 16 + r * 16)));
                } else if ((kk & 7) == 0) {
                    raw[r] = _mm_loadu_si128((const __m128i*)(wg + k * 8 + r * 16));
                    wv[r] = _mm256_cvtepu8_epi16(_mm_and_si128(raw[r], nibble));
                } else {
                    wv[r] = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw[r], 4), nibble));
                }
            }
            for (int j = 0; j < M; j++) {
                const __m256i xb = _mm256_set1_epi64x(*(const int64_t*)(o->q + j * Kp + k));
                for (int r = 0; r < 4; r++) d[r][j] = _mm256_add_epi32(d[r][j], _mm256_madd_epi16(xb, wv[r]));
            }
        }
        for (int h = 0; h < 2; h++) {  /* rows 8h..8h+7: the pairs of quarters 2h, 2h+1 summed, in row order */
            const int64_t at = (g * B + b) * 16 + h * 8, at8 = (g * (B / 8) + b / 8) * 16 + h * 8;
            const __m256 s = load8(o->s, o->sd, at, at8, fmt), z = load8(o->z, o->zd, at, at8, fmt);
            for (int j = 0; j < M; j++) {
                const __m256i dd = _mm256_permutevar8x32_epi32(_mm256_hadd_epi32(d[2 * h][j], d[2 * h + 1][j]), order);
                __m256 term = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(dd), s),
                                            _mm256_mul_ps(_mm256_set1_ps((float)o->t[j * B + b]), z));
                if (ab == 8) term = _mm256_mul_ps(term, _mm256_set1_ps(o->sa[j * B + b]));
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
    const int64_t B = o.Kp / BLOCK;
    for (; M > 0; M -= 2, o.q += 2 * o.Kp, o.t += 2 * B, o.sx += 2, o.y += 2 * o.N, o.sa += o.sa ? 2 * B : 0)
        for (int64_t g2 = g; g2 < g + 4; g2++) {
            if (M == 1)
                tile256(1, bits, fmt, ab, w, g2, &o);
            else
                tile256(2, bits, fmt, ab, w, g2, &o);
        }
}

#define BODY256(name, bits, fmt, ab) \
    static void name(const int8_t* w, operands o, int64_t M, int64_t g) { groups256(bits, fmt, ab, w, o, M, g); }
FORMATS(BODY256, groups256)

/* ---- entry points ---- */

/* 2: AVX-512 (F, BW, VNNI for vpdpbusd), 1: AVX2 (both with F16C for the fp16 scales) */
int draftwise_int8_isa(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("f16c"))
        return 2;
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") ? 1 : 0;
}

/* x [M, K] fp32 (contiguous), w packed as above, s and z [N / 16, Kp / 32, 16] as `fmt` says (F32, F16, or KQ with
 * sd and zd [N / 16, Kp / 256, 16]), qsum as s in int16 (read at 8 bits only), y [M, N] fp32. isa: as
 * draftwise_int8_isa() (a smaller one may be asked for: tests hold the paths to the same bits). bits: 8 (int8, F16
 * scales) or 4 (q4). */
void draftwise_int8_gemm(const float* x, const int8_t* w, const void* s, const void* z, const float* sd,
                         const float* zd, const int16_t* qsum, float* y, int64_t M, int64_t N, int64_t K, int64_t Kp,
                         int nthreads, int isa, int bits, int fmt, int abits) {
    const int64_t B = Kp / BLOCK;
    int16_t* q = (int16_t*)aligned_alloc(64, (size_t)(M * Kp * 2 + 63) / 64 * 64);
    uint8_t* bytes = isa == 2 ? (uint8_t*)aligned_alloc(64, (size_t)(2 * M * Kp + 63) / 64 * 64) : NULL;
    float* sx = (float*)malloc(M * sizeof(float));
    float* sa = abits == 8 ? (float*)malloc(M * B * sizeof(float)) : NULL;
    int32_t* t = (int32_t*)malloc(M * B * sizeof(int32_t));
    if (abits == 8)
        quantize_blocks(x, M, K, Kp, q, sx, sa, t, bytes, bytes ? bytes + M * Kp : NULL);
    else
        quantize_rows(x, M, K, Kp, q, sx, t, bytes, bytes ? bytes + M * Kp : NULL, bits == 4);
    const operands o = {q, bytes, bytes ? bytes + M * Kp : NULL, t, sx, sa, s, z, sd, zd, qsum, y, N, Kp};
    const int64_t G = (N + 63) / 64 * 4;  /* groups, as packed: N padded to a multiple of 64 rows */
    typedef void (*body_fn)(const int8_t*, operands, int64_t, int64_t);
    /* [isa 2?][abits 8?][format: q8, q4 fp32, q4 fp16, Q4_K] */
    static const body_fn bodies[2][2][4] = {
        {{groups256_q8, groups256_q4, groups256_q4h, groups256_q4k},
         {groups256_q8_a8, groups256_q4_a8, groups256_q4h_a8, groups256_q4k_a8}},
        {{groups512_q8, groups512_q4, groups512_q4h, groups512_q4k},
         {groups512_q8_a8, groups512_q4_a8, groups512_q4h_a8, groups512_q4k_a8}}};
    const body_fn body = bodies[isa == 2][abits == 8][bits == 8 ? 0 : fmt == KQ ? 3 : fmt == F16 ? 2 : 1];
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int64_t g = 0; g < G; g += 4) body(w, o, M, g);
    free(q);
    free(bytes);
    free(sx);
    free(sa);
    free(t);
}
