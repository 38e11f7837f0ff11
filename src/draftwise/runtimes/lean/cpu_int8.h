/* What the int8 kernel's files share (`cpu_int8.c` the entry point and the activations' quantization,
 * `cpu_int8_avx512.c` and `cpu_int8_avx2.c` a path each): the tile operands, the weight formats, the bodies. */
#include <immintrin.h>
#include <stdint.h>

#define BLOCK 32  /* activations per block (abits 8): a scale per block of 32; weights: bits 4, 5, 8 a scale per block */
#define SUB16 16  /* Q6_K's: a scale per sub-block of 16 */
#define SUPER 256 /* K-quants' super-block: Q8_K's activations a scale each (`cpu_int8_q8k.c`) */
#define Q8K_E 3   /* Q8_K's E: a block's scale at most 2^E times finer than its super-block's (`prompt.Q8K_E`) */

/* formats of the block scales and offsets */
#define F32 0
#define F16 1
#define KQ 2  /* Q4_K's: an unsigned byte per block of 32 times an fp32 per super-block of 256 (s: sd, z: zd) */
#define KQ6 3 /* Q6_K's: a signed byte per sub-block of 16 times an fp32 per super-block of 256; z from the same
                 byte (s = sc·d, z = sc·(-32 d)) */

/* Activations per block (abits 8, `cpu_int8.c`): a block of 32 is held at 16 bits, not 8, where its largest |x|^2
 * exceeds WIDE_C2 times the row's mean x^2 (on the row's int16 values, in integers: every path decides alike) */
#define WIDE_C2 64

/* how many k one scale covers */
#define SUBBLOCK(fmt) ((fmt) == KQ6 ? SUB16 : BLOCK)

/* what a tile needs besides its weights: activations, sub-block sums, row scales, the scales and offsets, y */
typedef struct {
    const int16_t* q;      /* this chunk's inputs [M, Kp] */
    const uint8_t* lo;     /* their bytes (AVX-512) */
    const uint8_t* hi;
    const int32_t* t;      /* their sums per sub-block [M, Kp / SUBBLOCK] */
    const float* sx;       /* their scales */
    const float* sa;       /* abits 8: their blocks' scales [M, Kp / 32] */
    const uint8_t* wide;   /* abits 8: whether each of their blocks is held at 16 bits [M, Kp / 32] */
    const void* s;         /* scales [G, Kp / SUBBLOCK, 16]: fp16, fp32, or bytes (KQ, KQ6) */
    const void* z;         /* offsets, the same (KQ6: unused) */
    const float* sd;       /* KQ, KQ6: the super-blocks' factor of s [G, Kp / 256, 16] */
    const float* zd;       /* KQ, KQ6: of z */
    const int16_t* qsum;   /* blocks' sums of q (int8 on AVX-512) */
    float* y;              /* row 0 of this chunk's outputs */
    int64_t N, Kp;
} operands;

/* Weights q of `bits` 4, 5 or 6 are unsigned; a group of 16 rows holds, per block of 32 k, 256 bytes of nibbles
 * (64 bytes per 8 k: k..k+3 in the low nibbles, k+4..k+7 in the high ones, byte (n % 16) * 4 + k % 4) and after them
 * (bits - 4) masks of 64 bits per 4 k (bit (n % 16) * 4 + k % 4: bit 4 of q, then bit 5); 64·bits bytes a block */
static inline int64_t nibble_at(int64_t k, int bits) { return (k / BLOCK) * 64 * bits + (k % BLOCK) * 8; }
static inline int64_t mask_at(int64_t k, int bits) {
    return (k / BLOCK) * 64 * bits + 256 + ((k % BLOCK) / 4) * 8 * (bits - 4);
}

typedef void (*body_fn)(const int8_t*, operands, int64_t, int64_t);

/* every weight format at both activation precisions (name, bits, scales' format, activation bits): a compiled body
 * each, on each path */
#define FORMATS(BODY, path)              \
    BODY(path##_q8, 8, F16, 16)          \
    BODY(path##_q4, 4, F32, 16)          \
    BODY(path##_q4h, 4, F16, 16)         \
    BODY(path##_q4k, 4, KQ, 16)          \
    BODY(path##_q5h, 5, F16, 16)         \
    BODY(path##_q6k, 6, KQ6, 16)         \
    BODY(path##_q8_a8, 8, F16, 8)        \
    BODY(path##_q4_a8, 4, F32, 8)        \
    BODY(path##_q4h_a8, 4, F16, 8)       \
    BODY(path##_q4k_a8, 4, KQ, 8)        \
    BODY(path##_q5h_a8, 5, F16, 8)       \
    BODY(path##_q6k_a8, 6, KQ6, 8)

#define DECLARE(name, bits, fmt, ab) void name(const int8_t* w, operands o, int64_t M, int64_t g);
FORMATS(DECLARE, groups512)
FORMATS(DECLARE, groups512seq)
FORMATS(DECLARE, groups256)
FORMATS(DECLARE, groupsamx)
#undef DECLARE
