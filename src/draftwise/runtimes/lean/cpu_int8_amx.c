/* The int8 kernel's AMX path (`cpu_int8.c` says what it computes), for passes of two rows or more: the exact integer
 * sums of a block by tile instructions (TDPB*D: 16 input rows x 16 output rows x 64 products an instruction), the
 * floating-point work per block by the AVX-512 path's own function (`term512`), so both give the same bits.
 *
 * Tiles, per block of SUBBLOCK k (32, or 16 for Q6_K): A0 / A1 the inputs' low / high activation bytes (up to 16
 * rows, SUBBLOCK bytes each, read in place at stride Kp), B2 / B3 two groups' weights (SUBBLOCK/4 rows of 64 bytes:
 * exactly the int8 layout's slabs of 4 k x 16 rows, so 4- to 6-bit weights are unpacked to it once per pass), C4..C7
 * each group's sums against A0 and A1. The signs: int8 weights are signed and every activation byte unsigned
 * (TDPBUSD; corrected as the AVX-512 path corrects them), 4- to 6-bit q unsigned against unsigned low bytes (TDPBUUD)
 * and signed high bytes (TDPBSUD).
 *
 * The OS must grant the tile state (Linux: arch_prctl(ARCH_REQ_XCOMP_PERM), `draftwise_amx_granted`), and the
 * ladder proves the path in a child before it is used (`ladder.py`). DRAFTWISE_AMX_EMULATE builds the tile
 * instructions in plain C from their definition, so tests check this file's tiling on any CPU.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "cpu_int8_avx512.h"

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed, aligned(64))) tile_config;

#ifdef DRAFTWISE_AMX_EMULATE
#define AMX AVX512
static __thread uint8_t tile[8][16][64];
static __thread tile_config cfg_now;
static void tile_configure(const tile_config* c) { cfg_now = *c; }
static void tile_release(void) {}
static void TLOAD(int t, const void* p, int64_t stride) {
    for (int r = 0; r < cfg_now.rows[t]; r++) memcpy(tile[t][r], (const uint8_t*)p + r * stride, cfg_now.colsb[t]);
}
static void TSTORE(int t, void* p, int64_t stride) {
    for (int r = 0; r < cfg_now.rows[t]; r++) memcpy((uint8_t*)p + r * stride, tile[t][r], cfg_now.colsb[t]);
}
static void TZERO(int t) { memset(tile[t], 0, sizeof tile[t]); }
/* C[m][n] += sum over k, i of A[m][4k + i] * B[k][4n + i], each byte signed or not as the instruction says */
static void tile_dp(int c, int a, int b, int a_signed, int b_signed) {
    for (int m = 0; m < cfg_now.rows[a]; m++)
        for (int n = 0; n < cfg_now.colsb[b] / 4; n++) {
            int32_t sum;
            memcpy(&sum, &tile[c][m][4 * n], 4);
            for (int k = 0; k < cfg_now.rows[b]; k++)
                for (int i = 0; i < 4; i++) {
                    const int av = a_signed ? (int8_t)tile[a][m][4 * k + i] : tile[a][m][4 * k + i];
                    const int bv = b_signed ? (int8_t)tile[b][k][4 * n + i] : tile[b][k][4 * n + i];
                    sum += av * bv;
                }
            memcpy(&tile[c][m][4 * n], &sum, 4);
        }
}
#define TDP_US(c, a, b) tile_dp(c, a, b, 0, 1)
#define TDP_UU(c, a, b) tile_dp(c, a, b, 0, 0)
#define TDP_SU(c, a, b) tile_dp(c, a, b, 1, 0)
#else
#define AMX __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vnni"), always_inline)) inline
#define tile_configure(c) _tile_loadconfig(c)
#define tile_release() _tile_release()
#define TLOAD(t, p, s) _tile_loadd(t, p, s)
#define TSTORE(t, p, s) _tile_stored(t, p, s)
#define TZERO(t) _tile_zero(t)
#define TDP_US(c, a, b) _tile_dpbusd(c, a, b)
#define TDP_UU(c, a, b) _tile_dpbuud(c, a, b)
#define TDP_SU(c, a, b) _tile_dpbsud(c, a, b)
#endif

/* tiles for mr input rows and blocks of sb k */
static AMX void configure(int mr, int sb) {
    tile_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 2; t++) c.rows[t] = (uint8_t)mr, c.colsb[t] = (uint16_t)sb;
    for (int t = 2; t < 4; t++) c.rows[t] = (uint8_t)(sb / 4), c.colsb[t] = 64;
    for (int t = 4; t < 8; t++) c.rows[t] = (uint8_t)mr, c.colsb[t] = 64;
    tile_configure(&c);
}

/* the sums of one block: groups p, p + 1 (wq: their weights as bytes, int8 layout) against rows m0..m0+mr, of their
 * high activation bytes and, where `both` (a row holds the block at 16 bits), their low ones (else 0) */
static AMX void block_sums(const int bits, const int both, const int8_t* w0, const int8_t* w1, const uint8_t* lo,
                           const uint8_t* hi, int64_t Kp, int32_t sums[2][2][16][16]) {
    TZERO(4);
    TZERO(5);
    TZERO(6);
    TZERO(7);
    TLOAD(2, w0, 64);
    TLOAD(3, w1, 64);
    TLOAD(1, hi, Kp);
    if (bits == 8) { /* int8 q signed, every activation byte unsigned (corrected as term512 says) */
        TDP_US(5, 1, 2);
        TDP_US(7, 1, 3);
    } else { /* q unsigned, the high byte signed */
        TDP_SU(5, 1, 2);
        TDP_SU(7, 1, 3);
    }
    if (both) {
        TLOAD(0, lo, Kp);
        if (bits == 8) {
            TDP_US(4, 0, 2);
            TDP_US(6, 0, 3);
        } else {
            TDP_UU(4, 0, 2);
            TDP_UU(6, 0, 3);
        }
    }
    TSTORE(4, sums[0][0], 64);
    TSTORE(5, sums[0][1], 64);
    TSTORE(6, sums[1][0], 64);
    TSTORE(7, sums[1][1], 64);
}

static AMX void groups_amx(const int bits, const int fmt, const int ab, const int8_t* w, operands o, int64_t M,
                           int64_t g) {
    const int SB = SUBBLOCK(fmt);
    const int64_t Kp = o.Kp, NB = Kp / SB, B = Kp / BLOCK, group = Kp * 2 * bits;
    int8_t* u = bits == 8 ? NULL : (int8_t*)aligned_alloc(64, (size_t)(4 * Kp * 16));
    for (int i = 0; i < 4 && u; i++) unpack512(bits, w + (g + i) * group, Kp, u + i * Kp * 16);
    const int8_t* wq = u ? u : w + g * group; /* group g + i at wq + i * Kp * 16 */
    int32_t sums[2][2][16][16] __attribute__((aligned(64)));
    __m512 acc[4][16];
    for (int64_t m0 = 0; m0 < M; m0 += 16) {
        const int mr = M - m0 < 16 ? (int)(M - m0) : 16;
        configure(mr, SB);
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < mr; j++) acc[i][j] = _mm512_setzero_ps();
        for (int64_t b = 0; b < NB; b++) {
            const int64_t k0 = b * SB;
            const int both = any_wide(ab, mr, o.wide + (o.wide ? m0 * B : 0), B, k0 / BLOCK);
            for (int p = 0; p < 4; p += 2) {
                block_sums(bits, both, wq + p * Kp * 16 + k0 * 16, wq + (p + 1) * Kp * 16 + k0 * 16, o.lo + m0 * Kp + k0,
                           o.hi + m0 * Kp + k0, Kp, sums);
                for (int q = 0; q < 2; q++) {
                    const int64_t gi = g + p + q, at = (gi * NB + b) * 16, at8 = (gi * (Kp / 256) + k0 / 256) * 16;
                    const __m512 s = load16(o.s, o.sd, at, at8, fmt), z = fmt == KQ6 ? s : load16(o.z, o.zd, at, at8, fmt);
                    const __m512i corr = corr512(bits, o.qsum, at);
                    for (int j = 0; j < mr; j++) {
                        const __m512i dl = _mm512_load_si512(sums[q][0][j]);
                        const __m512i dh = _mm512_load_si512(sums[q][1][j]);
                        const int64_t r = m0 + j;
                        acc[p + q][j] = _mm512_add_ps(acc[p + q][j], term512(fmt, ab, dl, dh, corr, s, z, o.t[r * NB + b],
                                                                              ab == 8 ? o.sa[r * B + k0 / BLOCK] : 0.0f));
                    }
                }
            }
        }
        for (int i = 0; i < 4; i++) {
            const int64_t n0 = (g + i) * 16;
            if (n0 >= o.N) break;
            const __mmask16 rows = o.N - n0 >= 16 ? 0xFFFF : (__mmask16)((1u << (o.N - n0)) - 1);
            for (int j = 0; j < mr; j++)
                _mm512_mask_storeu_ps(o.y + (m0 + j) * o.N + n0, rows, _mm512_mul_ps(acc[i][j], _mm512_set1_ps(o.sx[m0 + j])));
        }
    }
    tile_release();
    free(u);
}

#define BODYAMX(name, bits, fmt, ab)                                                               \
    __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vnni"))) void name(            \
        const int8_t* w, operands o, int64_t M, int64_t g) {                                        \
        groups_amx(bits, fmt, ab, w, o, M, g);                                                      \
    }
FORMATS(BODYAMX, groupsamx)

/* Whether the OS grants this process the tile state (Linux asks to be asked: ARCH_REQ_XCOMP_PERM for XTILEDATA),
 * asked once; the emulation needs none */
int draftwise_amx_granted(void) {
#ifdef DRAFTWISE_AMX_EMULATE
    return 1;
#else
    static int granted = -1;
    if (granted < 0) {
        __builtin_cpu_init();
        granted = __builtin_cpu_supports("amx-tile") && __builtin_cpu_supports("amx-int8") &&
                  syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
    }
    return granted;
#endif
}
