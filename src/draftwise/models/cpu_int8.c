/* int8 matrix product of the lean engine's int8 precision (W8A8): y[M, N] = x[M, K] @ w[N, K]^T with both sides int8.
 *
 * Weights: int8 per output row n with a scale sw[n] (symmetric, in [-127, 127]), quantized once at load time
 * (`int8.py`) and packed in groups of 16 rows: element (n, k) sits at ((n / 16) * Kp / 4 + k / 4) * 64 + (n % 16) * 4
 * + k % 4, K padded with zeros to Kp (a multiple of 64), N to a multiple of 64 (zero rows, scale 0). One 64-byte load
 * holds 4 consecutive k of 16 rows, so a group streams as one contiguous block and the sums need no horizontal add.
 * Activations: quantized here, per row m (per token), never per tensor: sx[m] = amax|x[m]| / 127 and
 * xq = rint(x * (127 / amax)) in [-127, 127].
 * Each dot product is an exact int32 sum, so no summation order and no other row of the pass can change it; the
 * epilogue y[m, n] = ((float)acc * sw[n]) * sx[m] is two fp32 products. A row's result is therefore bitwise the same
 * in a one-token step and in a (γ+1)-token verify pass, on the AVX-512 VNNI path, the AVX2 path and torch's fallback.
 *
 * Why draftwise's own kernel: torch's dynamic int8 linear (fbgemm) takes one activation scale per tensor, so a row of a
 * verify pass would round differently from its one-token step; `_weight_int8pack_mm` keeps activations fp32 and grows
 * linearly with the rows. Here the weights are read once per pass whatever M is (a tile holds R groups against up to
 * 8 input rows), which is what keeps the verify pass flat.
 *
 * AVX-512 VNNI: vpdpbusd multiplies unsigned by signed bytes, so xq is stored offset by +128 (u8 in [1, 255]) and
 * 128 * Σ_k w[n, k] (row_sum, precomputed) is taken off the sum. AVX2: _mm256_maddubs_epi16 on |xq| and sign(xq) * w,
 * whose pairs (127 * 127 * 2) cannot saturate int16.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* rows m of x quantized to int8 (see above) into q [M, Kp] (zero past K), offset by `offset` (128 for VNNI's u8) */
static void quantize_rows(const float* x, int64_t M, int64_t K, int64_t Kp, int offset, uint8_t* q, float* sx) {
    for (int64_t m = 0; m < M; m++) {
        const float* xm = x + m * K;
        float amax = 0.0f;
        for (int64_t k = 0; k < K; k++) amax = fmaxf(amax, fabsf(xm[k]));
        const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        sx[m] = amax / 127.0f;
        uint8_t* qm = q + m * Kp;
        for (int64_t k = 0; k < K; k++) {
            float v = rintf(xm[k] * inv);
            v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
            qm[k] = (uint8_t)((int)v + offset);
        }
        for (int64_t k = K; k < Kp; k++) qm[k] = (uint8_t)offset;
    }
}

/* ---- AVX-512 VNNI: a tile of R groups (16 rows each) against M inputs, R*M + R + 1 <= 32 zmm ---- */
#define VNNI __attribute__((target("avx512f,avx512bw,avx512vnni"), always_inline)) inline

/* the tile's epilogue writes y[j, n] for its rows n < N: ((float)(acc - offset * row_sum) * sw) * sx[j] */
typedef struct {
    const float* sw;
    const int32_t* row_sum;
    const float* sx;  /* this chunk's inputs */
    float* y;         /* row 0 of this chunk's inputs */
    int64_t N;
    int offset;
} epilogue;

static VNNI void tile512(const int R, const int M, const uint8_t* q, const int8_t* w, int64_t g, int64_t Kp,
                         const epilogue* e) {
    __m512i acc[4][8];
#pragma GCC unroll 4
    for (int i = 0; i < R; i++)
#pragma GCC unroll 8
        for (int j = 0; j < M; j++) acc[i][j] = _mm512_setzero_si512();
    const int64_t block = Kp * 16;  /* bytes of one group */
    const int8_t* wg = w + g * block;
    for (int64_t k = 0; k < Kp; k += 4) {
        __m512i wv[4];
#pragma GCC unroll 4  /* the next tile's R lines: DRAM keeps streaming while this tile computes */
        for (int i = 0; i < R; i++) _mm_prefetch((const char*)(wg + R * block + k * 16 * R + i * 64), _MM_HINT_T0);
#pragma GCC unroll 4
        for (int i = 0; i < R; i++) wv[i] = _mm512_loadu_si512((const void*)(wg + i * block + k * 16));
#pragma GCC unroll 8
        for (int j = 0; j < M; j++) {
            const __m512i xb = _mm512_set1_epi32(*(const int32_t*)(q + j * Kp + k));
#pragma GCC unroll 4
            for (int i = 0; i < R; i++) acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], xb, wv[i]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < R; i++) {
        const int64_t n0 = (g + i) * 16;
        if (n0 >= e->N) break;
        const __mmask16 rows = e->N - n0 >= 16 ? 0xFFFF : (__mmask16)((1u << (e->N - n0)) - 1);
        const __m512i corr = _mm512_mullo_epi32(_mm512_loadu_si512((const void*)(e->row_sum + n0)),
                                                _mm512_set1_epi32(e->offset));
        const __m512 sw = _mm512_loadu_ps(e->sw + n0);
#pragma GCC unroll 8
        for (int j = 0; j < M; j++) {
            const __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc[i][j], corr)), sw);
            _mm512_mask_storeu_ps(e->y + j * e->N + n0, rows, _mm512_mul_ps(v, _mm512_set1_ps(e->sx[j])));
        }
    }
}

__attribute__((target("avx512f,avx512bw,avx512vnni")))
static void groups512(const uint8_t* q, const int8_t* w, epilogue e, int64_t M, int64_t g, int64_t Kp) {
    /* four groups (four weight streams in flight) against four inputs at a time; after the first four inputs the
     * groups (4 x 16 x Kp bytes) are read again from L1/L2 */
    for (; M > 0; M -= 4, q += 4 * Kp, e.y += 4 * e.N, e.sx += 4) {
        switch (M < 4 ? (int)M : 4) {
            case 1: tile512(4, 1, q, w, g, Kp, &e); break;
            case 2: tile512(4, 2, q, w, g, Kp, &e); break;
            case 3: tile512(4, 3, q, w, g, Kp, &e); break;
            default: tile512(4, 4, q, w, g, Kp, &e); break;
        }
    }
}

/* ---- AVX2: a tile of R groups (each two 8-row halves) against M inputs ---- */
static inline __attribute__((always_inline)) void tile256(const int R, const int M, const uint8_t* q, const int8_t* w,
                                                          int64_t g, int64_t Kp, const epilogue* e) {
    __m256i acc[2][2][4];
    const __m256i ones = _mm256_set1_epi16(1);
#pragma GCC unroll 2
    for (int i = 0; i < R; i++)
#pragma GCC unroll 4
        for (int j = 0; j < M; j++) acc[i][0][j] = acc[i][1][j] = _mm256_setzero_si256();
    const int64_t block = Kp * 16;
    const int8_t* wg = w + g * block;
    for (int64_t k = 0; k < Kp; k += 4) {
        __m256i wv[2][2];
#pragma GCC unroll 2
        for (int i = 0; i < R; i++) {
            wv[i][0] = _mm256_loadu_si256((const __m256i*)(wg + i * block + k * 16));
            wv[i][1] = _mm256_loadu_si256((const __m256i*)(wg + i * block + k * 16 + 32));
        }
#pragma GCC unroll 4
        for (int j = 0; j < M; j++) {
            const __m256i xs = _mm256_set1_epi32(*(const int32_t*)(q + j * Kp + k));
            const __m256i xa = _mm256_abs_epi8(xs);
#pragma GCC unroll 2
            for (int i = 0; i < R; i++)
#pragma GCC unroll 2
                for (int h = 0; h < 2; h++) {
                    const __m256i p = _mm256_maddubs_epi16(xa, _mm256_sign_epi8(wv[i][h], xs));
                    acc[i][h][j] = _mm256_add_epi32(acc[i][h][j], _mm256_madd_epi16(p, ones));
                }
        }
    }
    for (int i = 0; i < R; i++)
        for (int h = 0; h < 2; h++) {
            const int64_t n0 = (g + i) * 16 + h * 8;
            if (n0 >= e->N) break;
            const int64_t rows = e->N - n0 < 8 ? e->N - n0 : 8;
            const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)rows), lanes);
            const __m256i corr = _mm256_mullo_epi32(_mm256_loadu_si256((const __m256i*)(e->row_sum + n0)),
                                                    _mm256_set1_epi32(e->offset));
            const __m256 sw = _mm256_loadu_ps(e->sw + n0);
            for (int j = 0; j < M; j++) {
                const __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(acc[i][h][j], corr)), sw);
                _mm256_maskstore_ps(e->y + j * e->N + n0, mask, _mm256_mul_ps(v, _mm256_set1_ps(e->sx[j])));
            }
        }
}

static void groups256(const int R, const uint8_t* q, const int8_t* w, epilogue e, int64_t M, int64_t g, int64_t Kp) {
    for (; M > 0; M -= 4, q += 4 * Kp, e.y += 4 * e.N, e.sx += 4) {
        const int m = M < 4 ? (int)M : 4;
        if (R == 2) {
            tile256(2, 1, q, w, g, Kp, &e);
            continue;
        }
        switch (m) {
            case 1: tile256(1, 1, q, w, g, Kp, &e); break;
            case 2: tile256(1, 2, q, w, g, Kp, &e); break;
            case 3: tile256(1, 3, q, w, g, Kp, &e); break;
            default: tile256(1, 4, q, w, g, Kp, &e); break;
        }
    }
}

/* ---- entry points ---- */

/* 2: AVX-512 VNNI, 1: AVX2 */
int draftwise_int8_isa(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw")) return 2;
    return __builtin_cpu_supports("avx2") ? 1 : 0;
}

/* x [M, K] fp32 (contiguous), w packed as above (64-byte aligned), sw and row_sum [N rounded up to 64], y [M, N]
 * fp32. isa: as draftwise_int8_isa() (a smaller one may be asked for: tests hold the paths to the same bits). */
void draftwise_int8_gemm(const float* x, const int8_t* w, const float* sw, const int32_t* row_sum, float* y, int64_t M,
                         int64_t N, int64_t K, int64_t Kp, int nthreads, int isa) {
    const int offset = isa == 2 ? 128 : 0;
    uint8_t* q = (uint8_t*)aligned_alloc(64, (size_t)(M * Kp + 64) / 64 * 64);
    float* sx = (float*)malloc(M * sizeof(float));
    quantize_rows(x, M, K, Kp, offset, q, sx);
    const int64_t G = (N + 63) / 64 * 4;  /* groups, as packed: N padded to a multiple of 64 rows */
    const int R = isa == 2 ? 4 : (M == 1 ? 2 : 1);
    const epilogue e = {sw, row_sum, sx, y, N, offset};
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int64_t g = 0; g < G; g += R) {
        if (isa == 2)
            groups512(q, w, e, M, g, Kp);
        else
            groups256(R, q, w, e, M, g, Kp);
    }
    free(q);
    free(sx);
}
