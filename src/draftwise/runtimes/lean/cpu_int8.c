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
 * outlier channels cost nothing, unlike 8-bit activations. Or (abits 8, `quantize_blocks`) per block of 32 with the
 * block's own scale sa: at 8 bits (held as 256 v) where the block's largest value is near the row's typical size, at
 * 16 where it is not (an outlier channel: WIDE_C2), and acc = acc + (d·s + t·z)·sa, no sx. A block at 8 bits has a
 * low byte of 0, so the AVX-512 and AMX paths skip its second product wherever every row of a tile has it at 8 bits:
 * one vpdpbusd per 4 products there, two in the 16-bit blocks.
 * Per block b: an exact int32 sum d = Σ xq * q over its 32 k (|d| < 32 * 32767 * 128 < 2^31) and the block's
 * activation sum t = Σ xq, then acc = acc + ((float)d * s + (float)t * z) in fp32, blocks in order; y = acc * sx[m].
 * AVX-512 computes d with vpdpbusd (unsigned x signed bytes, 64 products an instruction): xq + 32768 = 256 hi + lo in
 * two unsigned bytes, d = 256 Σ hi q + Σ lo q − 32768 Σ q. AVX2 widens q to int16 and uses vpmaddwd, or, on 4-6-bit
 * weights where every row of a tile holds a block at 8 bits, vpmaddubsw on q's bytes and the activations' high ones.
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
 * 5 and 6 bits (`q56.py`: a file's Q5_0 / Q5_1 and Q6_K blocks): q unsigned as at 4 bits, its bit 4 (and 5) in masks
 * of 64 bits after each block's nibbles (`cpu_int8.h`), added to the unpacked bytes; Q6_K's scale per 16 inputs makes
 * the sums d and t per sub-block of 16, in order (KQ6: a signed byte per sub-block, an fp32 per super-block of 256).
 * Every output is that same sequence of operations whatever M is, so a row's result is bitwise the same in a
 * one-token step and in a (γ+1)-token verify pass, on the AVX-512 path, the AVX2 path and torch's `reference_linear`.
 * (Compiled with -ffp-contract=off: a fused multiply-add would round differently from the reference.)
 *
 * Why draftwise's own kernel: torch's dynamic int8 linear (fbgemm) takes one activation scale per tensor, so a row of a
 * verify pass would round differently from its one-token step; `_weight_int8pack_mm` grows linearly with the rows.
 * Here the weights are read from memory once per pass whatever M is (a tile holds R groups against up to 4 input
 * rows, the next tile prefetched while it computes), which keeps a short verify pass close to one step.
 */
#include <stdlib.h>

#include "cpu_int8.h"

void draftwise_int8_activations(const float* x, int64_t M, int64_t K, int64_t Kp, int abits, int signed_hi, int sb,
                                int16_t* q, float* sx, float* sa, uint8_t* wide, uint8_t* lo, uint8_t* hi, int32_t* t,
                                int nthreads); /* cpu_int8_quant.c */
void draftwise_q8k_gemm(const float* x, const int8_t* w, const void* s, const void* z, const float* sd,
                        const float* zd, float* y, int64_t M, int64_t N, int64_t K, int64_t Kp, int nthreads,
                        int bits); /* cpu_int8_q8k.c */

/* ---- entry points ---- */

int draftwise_amx_granted(void);

/* 3: AMX (tiles the OS grants), 2: AVX-512 (F, BW, VNNI for vpdpbusd), 1: AVX2 (both with F16C for the fp16 scales):
 * the best path the CPU reports (4, AVX-512 tiled one group at a time, runs wherever 2 does). Which path serves which pass is the ladder's (`ladder.py`: each proven in a child and
 * timed there), given to every call as a route. The AMX emulation (tests) is never the best path. */
int draftwise_int8_isa(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("f16c")) {
#ifndef DRAFTWISE_AMX_EMULATE
        if (draftwise_amx_granted()) return 3;
#endif
        return 2;
    }
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") ? 1 : 0;
}

/* The band of a pass of M rows (`ladder.BANDS`): 0 a step, 1 a short verify pass (2-3 rows), 2 a longer one (4-15),
 * 3 a prompt's chunk (16-63), 4 a long prefill. The route gives each band, activation bits and weight format its own
 * path: where two paths cross (one group a tile is the faster at 2-3 rows, two at 4 and more, on an AMD EPYC Zen 5)
 * a band each. */
int draftwise_int8_band(int64_t M) { return M == 1 ? 0 : M < 4 ? 1 : M < 16 ? 2 : M < 64 ? 3 : 4; }

/* x [M, K] fp32 (contiguous), w packed as above, s and z [N / 16, Kp / SUBBLOCK(fmt), 16] as `fmt` says (F32, F16,
 * KQ or KQ6 with sd and zd [N / 16, Kp / 256, 16]), qsum as s in int16 (read at 8 bits only), y [M, N] fp32. bits: 8
 * (int8, F16 scales), 4 (F32, F16 or KQ), 5 (F16) or 6 (KQ6). route [band][abits 8?][format]: the path (isa code) of each
 * band of rows (`draftwise_int8_band`), activation bits and weight format (`bodies` below), the ladder's verdict or one
 * path in every entry (tests hold the paths to the same bits); a prompt pass's route may name 5, Q8_K activations on
 * K-quant weights (`cpu_int8_q8k.c`: lossy, prompts only). */
void draftwise_int8_gemm(const float* x, const int8_t* w, const void* s, const void* z, const float* sd,
                         const float* zd, const int16_t* qsum, float* y, int64_t M, int64_t N, int64_t K, int64_t Kp,
                         int nthreads, const uint8_t* route, int bits, int fmt, int abits) {
    const int64_t B = Kp / BLOCK, NB = Kp / SUBBLOCK(fmt);
    const int format = bits == 8 ? 0 : bits == 5 ? 4 : bits == 6 ? 5 : fmt == KQ ? 3 : fmt == F16 ? 2 : 1;
    int isa = route[(draftwise_int8_band(M) * 2 + (abits == 8)) * 6 + format];
    if (isa == 5 && (fmt == KQ || fmt == KQ6)) {
        draftwise_q8k_gemm(x, w, s, z, sd, zd, y, M, N, K, Kp, nthreads, bits);
        return;
    }
    if (isa == 5) isa = 2; /* no other format has integer block scales: the exact path */
    if (isa == 3 && (M == 1 || !draftwise_amx_granted())) isa = 2; /* a step streams: AVX-512 keeps up with memory */
    int16_t* q = (int16_t*)aligned_alloc(64, (size_t)(M * Kp * 2 + 63) / 64 * 64);
    /* the activations' bytes: AVX-512's and AMX's operands; AVX2 reads the high ones of 8-bit blocks on 4-6-bit weights */
    const int need_bytes = isa >= 2 || (abits == 8 && bits != 8);
    uint8_t* bytes = need_bytes ? (uint8_t*)aligned_alloc(64, (size_t)(2 * M * Kp + 63) / 64 * 64) : NULL;
    float* sx = (float*)malloc(M * sizeof(float));
    float* sa = abits == 8 ? (float*)malloc(M * B * sizeof(float)) : NULL;
    uint8_t* wide = abits == 8 ? (uint8_t*)malloc(M * B) : NULL;
    int32_t* t = (int32_t*)malloc(M * NB * sizeof(int32_t));
    draftwise_int8_activations(x, M, K, Kp, abits, bits != 8, SUBBLOCK(fmt), q, sx, sa, wide, bytes,
                               bytes ? bytes + M * Kp : NULL, t, nthreads);
    const operands o = {q, bytes, bytes ? bytes + M * Kp : NULL, t, sx, sa, wide, s, z, sd, zd, qsum, y, N, Kp};
    const int64_t G = (N + 63) / 64 * 4;  /* groups, as packed: N padded to a multiple of 64 rows */
    /* [path: AVX2, AVX-512, AMX, AVX-512 one group a tile][abits 8?][format: q8, q4 fp32, q4 fp16, Q4_K, 5-bit
     * fp16, Q6_K] */
    static const body_fn bodies[4][2][6] = {
        {{groups256_q8, groups256_q4, groups256_q4h, groups256_q4k, groups256_q5h, groups256_q6k},
         {groups256_q8_a8, groups256_q4_a8, groups256_q4h_a8, groups256_q4k_a8, groups256_q5h_a8, groups256_q6k_a8}},
        {{groups512_q8, groups512_q4, groups512_q4h, groups512_q4k, groups512_q5h, groups512_q6k},
         {groups512_q8_a8, groups512_q4_a8, groups512_q4h_a8, groups512_q4k_a8, groups512_q5h_a8, groups512_q6k_a8}},
        {{groupsamx_q8, groupsamx_q4, groupsamx_q4h, groupsamx_q4k, groupsamx_q5h, groupsamx_q6k},
         {groupsamx_q8_a8, groupsamx_q4_a8, groupsamx_q4h_a8, groupsamx_q4k_a8, groupsamx_q5h_a8, groupsamx_q6k_a8}},
        {{groups512seq_q8, groups512seq_q4, groups512seq_q4h, groups512seq_q4k, groups512seq_q5h, groups512seq_q6k},
         {groups512seq_q8_a8, groups512seq_q4_a8, groups512seq_q4h_a8, groups512seq_q4k_a8, groups512seq_q5h_a8,
          groups512seq_q6k_a8}}};
    const body_fn body = bodies[isa - 1][abits == 8][format];
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int64_t g = 0; g < G; g += 4) body(w, o, M, g);
    free(q);
    free(bytes);
    free(sx);
    free(sa);
    free(wide);
    free(t);
}
