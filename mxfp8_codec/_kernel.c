/*
 * Native MXFP8 (E4M3 element, UE8M0 scale, 32-element blocks) encode/decode kernels.
 *
 * Built lazily by mxfp8_codec/_native.py with the machine's C compiler and loaded with cffi
 * (ABI mode). Single-threaded, streaming, no allocation. The numerics are exactly those of the
 * pure-numpy path in mxfp8_codec/numerics.py (read its module docstring); the tests compare the
 * two bit for bit.
 *
 * Decode, full blocks with scale byte s in [10, 246] (every realistic weight): a normal E4M3 code
 * decodes to the exact normal bfloat16 (mag << 4) + ((s - 7) << 7), with zero / NaN selected in;
 * float32 output is the same value, (mag << 20) + ((s - 7) << 23). Blocks holding an E4M3
 * subnormal code, other scale bytes (s < 10: subnormal results; s > 246: overflow; 255: NaN) and
 * partial blocks gather from the exact 65 536-entry table built in Python.
 *
 * Encode: amax from the magnitude bits (an integer max; a value >= 0x7F800000 means Inf/NaN in
 * the block, reported to the caller), the scale rule in integer arithmetic, then
 *  - fast path (full blocks, e >= -120, every nonzero |x| >= 2^(e-6) so every code is a normal
 *    E4M3): the 2^-e scaling is folded into the exponent and rounding to nearest even is done on
 *    the bit pattern: code = ((a + half - 1 + lsb) >> shift) - ((120 + e) << 3), saturated;
 *  - exact path (everything else): y = x * 2^-e in float32 (exact except in float32 subnormals,
 *    which round to E4M3 zero anyway), normal results rounded on the bit pattern as above,
 *    subnormal results (|y| < 2^-6) with the 2^23 "magic number" add.
 * Both saturate at 448 (code 0x7E), or at 240 (0x77) in blocks with scale byte 247 so that no
 * finite input decodes to 2^128 = inf.
 *
 * SIMD: with AVX-512 (F + BW, i.e. -march=native on such a CPU) the fast paths use intrinsics; with
 * AVX2 only, the decode fast paths do (the subnormal table through vpshufb); otherwise portable C
 * written with selects only, which compilers auto-vectorize where they can (not the table lookup).
 *
 * Transposed decode (mx_decode_*_t): payload [rows, k] -> out[c * ld + r], i.e. the [k, rows]
 * transpose written directly (the trainer stores projections [in, out], nn.Linear wants
 * [out, in]). Each 32-row x 32-column tile (one scale block per row) is decoded into a small
 * buffer with the same block routines as above -- hence the same bits -- then written out
 * column by column; the buffer stays in L1 and each output row gets 32 contiguous values. With
 * AVX-512 or AVX2 the tile is transposed in registers (8 x 8 / 16 x 16 blocks) and each output row's
 * 32 values are stored back to back.
 * Row strides ldq / lds / ld let a caller decode a column range of the payload (a multiple of 32
 * wide) into a row range of the output, or a row range into a column range (splitting work over
 * threads without copies).
 *
 * Floating-point environment: the subnormal arithmetic above must not be flushed, so on x86 each
 * entry point clears FTZ/DAZ and selects round-to-nearest in MXCSR and restores it on exit
 * (torch.set_flush_denormal(True) sets them process-wide).
 */
#include <stdint.h>
#include <string.h>

#include "mxfp8.h" /* constants, the scale rule, the counter RNG and the grid-rounding block encoder */

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define MX_FP_ENTER() unsigned mx_saved_csr = _mm_getcsr(); _mm_setcsr(mx_saved_csr & ~0xE040u)
#define MX_FP_EXIT() _mm_setcsr(mx_saved_csr)
#else
#define MX_FP_ENTER() do { } while (0)
#define MX_FP_EXIT() do { } while (0)
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__)
#define MX_AVX512 1
#else
#define MX_AVX512 0
#endif
#if !MX_AVX512 && defined(__AVX2__)
#define MX_AVX2 1 /* the decode fast paths with AVX2 intrinsics (e.g. AMD Zen 2/3, Intel before Skylake-X) */
#else
#define MX_AVX2 0
#endif

#define MX_KERNEL_VERSION 9
#define MX_TILE 32 /* transposed decode: 32 x 32 tiles (2 KiB bf16, 4 KiB f32: stay in L1) */
#define MX_GROUP 8 /* transposed decode: tiles per group side (256 x 256 values) */


int mx_kernel_version(void) { return MX_KERNEL_VERSION; }

/* which intrinsics the fast paths below were compiled with: 1 AVX-512 (decode and encode), 2 AVX2
 * (decode; encode in portable C), 0 none (portable C, which compilers auto-vectorize where they can) */
int mx_kernel_simd(void) { return MX_AVX512 ? 1 : MX_AVX2 ? 2 : 0; }

/* ========================================================================================== */
/* decode                                                                                     */
/* ========================================================================================== */

/* Fast decode of one full block with scale byte s in [10, 246], every code, branch-free.
 * A nonzero finite code of magnitude bits mag has the value v(mag) * 2^(s - 127); for this s range
 * the product is a finite normal bfloat16 / float32, so its bits are those of v(mag) with s - 127
 * added to the exponent field: bits(v(mag)) - (127 << 7) + (s << 7) for bfloat16 (<< 23: float32),
 * exact, no multiply. A normal code (E >= 1) has bits(v(mag)) = (mag << 4) + (120 << 7), i.e.
 * (mag << 4) + ((s - 7) << 7); an E4M3-subnormal code (mag 1..7, m * 2^-9, normalised in the
 * output) takes its offset from an 8-entry table (AVX-512: an in-register permute). Zero and NaN
 * codes are selected in, the sign bit is or-ed in.
 * float32 output: bits (mag << 20) + ((s - 7) << 23) for normal codes, likewise. */
#define MX_SUB_BF16(m) ((uint16_t)(((uint32_t)(m) == 1u ? 0x3B00u : (uint32_t)(m) == 2u ? 0x3B80u :      \
    (uint32_t)(m) == 3u ? 0x3BC0u : (uint32_t)(m) == 4u ? 0x3C00u : (uint32_t)(m) == 5u ? 0x3C20u :        \
    (uint32_t)(m) == 6u ? 0x3C40u : 0x3C60u) - (127u << 7)))
/* bits of m * 2^-9 (m = 1..7) as bfloat16, minus the exponent bias: 2^-9 = 0x3B00, 2^-8 = 0x3B80, ... */
static const uint16_t mx_sub_bf16[8] = {0, MX_SUB_BF16(1), MX_SUB_BF16(2), MX_SUB_BF16(3), MX_SUB_BF16(4),
                                        MX_SUB_BF16(5), MX_SUB_BF16(6), MX_SUB_BF16(7)};
#if MX_AVX512
static inline void mx_decode_block_bf16_fast(const uint8_t *restrict q, uint32_t s,
                                             uint16_t *restrict o) {
    const __m512i c = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)q));
    const __m512i mag = _mm512_and_si512(c, _mm512_set1_epi16(0x7F));
    const __m512i off = _mm512_set1_epi16((short)(s << 7));
    const __m512i sub_tab = _mm512_maskz_loadu_epi16(0xFFu, (const void *)mx_sub_bf16);
    __m512i v = _mm512_add_epi16(_mm512_slli_epi16(mag, 4), _mm512_set1_epi16((short)((s - 7u) << 7)));
    const __m512i sign = _mm512_and_si512(_mm512_slli_epi16(c, 8), _mm512_set1_epi16((short)0x8000));
    const __mmask32 zero = _mm512_cmpeq_epi16_mask(mag, _mm512_setzero_si512());
    const __mmask32 nan = _mm512_cmpeq_epi16_mask(mag, _mm512_set1_epi16(0x7F));
    const __mmask32 sub = _mm512_cmplt_epu16_mask(mag, _mm512_set1_epi16(8));
    v = _mm512_mask_add_epi16(v, sub, _mm512_permutexvar_epi16(mag, sub_tab), off);
    v = _mm512_or_si512(_mm512_maskz_mov_epi16(~zero, v), sign);
    v = _mm512_mask_mov_epi16(v, nan, _mm512_set1_epi16(0x7FC0));
    _mm512_storeu_si512((void *)o, v);
}

static inline void mx_decode_block_f32_fast(const uint8_t *restrict q, uint32_t s,
                                            uint32_t *restrict o) {
    const __m512i sub_tab = _mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)mx_sub_bf16))), 16);
    const __m512i off = _mm512_set1_epi32((int)(s << 23));
    for (int h = 0; h < 2; h++) {
        const __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(q + 16 * h)));
        const __m512i mag = _mm512_and_si512(c, _mm512_set1_epi32(0x7F));
        __m512i v = _mm512_add_epi32(_mm512_slli_epi32(mag, 20), _mm512_set1_epi32((int)((s - 7u) << 23)));
        const __m512i sign = _mm512_and_si512(_mm512_slli_epi32(c, 24), _mm512_set1_epi32((int)0x80000000u));
        const __mmask16 zero = _mm512_cmpeq_epi32_mask(mag, _mm512_setzero_si512());
        const __mmask16 nan = _mm512_cmpeq_epi32_mask(mag, _mm512_set1_epi32(0x7F));
        const __mmask16 sub = _mm512_cmplt_epu32_mask(mag, _mm512_set1_epi32(8));
        v = _mm512_mask_add_epi32(v, sub, _mm512_permutexvar_epi32(mag, sub_tab), off);
        v = _mm512_or_si512(_mm512_maskz_mov_epi32(~zero, v), sign);
        v = _mm512_mask_mov_epi32(v, nan, _mm512_set1_epi32(0x7FC00000));
        _mm512_storeu_si512((void *)(o + 16 * h), v);
    }
}
#elif MX_AVX2
/* The same steps on 16 (bfloat16) or 8 (float32) lanes. AVX2 has no 16-bit permute: the subnormal
 * table is looked up with vpshufb as two byte tables (each entry's low and high byte; a 128-bit lane's
 * 16 bytes hold the 8 entries, the index is mag's low byte), and selects are blends of compare masks. */
#define MX_LO(m) ((uint8_t)(MX_SUB_BF16(m) & 0xFFu))
#define MX_HI(m) ((uint8_t)(MX_SUB_BF16(m) >> 8))
static const uint8_t mx_sub_bf16_lo[16] = {0, MX_LO(1), MX_LO(2), MX_LO(3), MX_LO(4), MX_LO(5), MX_LO(6), MX_LO(7)};
static const uint8_t mx_sub_bf16_hi[16] = {0, MX_HI(1), MX_HI(2), MX_HI(3), MX_HI(4), MX_HI(5), MX_HI(6), MX_HI(7)};
static inline void mx_decode_block_bf16_fast(const uint8_t *restrict q, uint32_t s,
                                             uint16_t *restrict o) {
    const __m256i tab_lo = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)mx_sub_bf16_lo));
    const __m256i tab_hi = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)mx_sub_bf16_hi));
    const __m256i off = _mm256_set1_epi16((short)((s - 7u) << 7));
    const __m256i soff = _mm256_set1_epi16((short)(s << 7));
    for (int h = 0; h < 2; h++) {
        const __m256i c = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(q + 16 * h)));
        const __m256i mag = _mm256_and_si256(c, _mm256_set1_epi16(0x7F));
        __m256i v = _mm256_add_epi16(_mm256_slli_epi16(mag, 4), off);
        /* a lane's low byte looks up mag (bit 7 clear), its high byte index 0: keep the low byte's result */
        const __m256i lo = _mm256_and_si256(_mm256_shuffle_epi8(tab_lo, mag), _mm256_set1_epi16(0xFF));
        const __m256i hi = _mm256_slli_epi16(_mm256_shuffle_epi8(tab_hi, mag), 8);
        const __m256i sub = _mm256_add_epi16(_mm256_or_si256(lo, hi), soff);
        v = _mm256_blendv_epi8(v, sub, _mm256_cmpgt_epi16(_mm256_set1_epi16(8), mag));
        const __m256i zero = _mm256_cmpeq_epi16(mag, _mm256_setzero_si256());
        const __m256i nan = _mm256_cmpeq_epi16(mag, _mm256_set1_epi16(0x7F));
        const __m256i sign = _mm256_and_si256(_mm256_slli_epi16(c, 8), _mm256_set1_epi16((short)0x8000));
        v = _mm256_or_si256(_mm256_andnot_si256(zero, v), sign);
        v = _mm256_blendv_epi8(v, _mm256_set1_epi16(0x7FC0), nan);
        _mm256_storeu_si256((__m256i *)(o + 16 * h), v);
    }
}

static inline void mx_decode_block_f32_fast(const uint8_t *restrict q, uint32_t s,
                                            uint32_t *restrict o) {
    const __m256i sub_tab =
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)mx_sub_bf16)), 16);
    const __m256i off = _mm256_set1_epi32((int)((s - 7u) << 23));
    const __m256i soff = _mm256_set1_epi32((int)(s << 23));
    for (int h = 0; h < 4; h++) {
        const __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + 8 * h)));
        const __m256i mag = _mm256_and_si256(c, _mm256_set1_epi32(0x7F));
        __m256i v = _mm256_add_epi32(_mm256_slli_epi32(mag, 20), off);
        const __m256i sub = _mm256_add_epi32(_mm256_permutevar8x32_epi32(sub_tab, mag), soff); /* mag & 7 */
        v = _mm256_blendv_epi8(v, sub, _mm256_cmpgt_epi32(_mm256_set1_epi32(8), mag));
        const __m256i zero = _mm256_cmpeq_epi32(mag, _mm256_setzero_si256());
        const __m256i nan = _mm256_cmpeq_epi32(mag, _mm256_set1_epi32(0x7F));
        const __m256i sign = _mm256_and_si256(_mm256_slli_epi32(c, 24), _mm256_set1_epi32((int)0x80000000u));
        v = _mm256_or_si256(_mm256_andnot_si256(zero, v), sign);
        v = _mm256_blendv_epi8(v, _mm256_set1_epi32(0x7FC00000), nan);
        _mm256_storeu_si256((__m256i *)(o + 8 * h), v);
    }
}
#else
static inline void mx_decode_block_bf16_fast(const uint8_t *restrict q, uint32_t s,
                                             uint16_t *restrict o) {
    const uint16_t off = (uint16_t)((s - 7u) << 7), soff = (uint16_t)(s << 7);
    for (int i = 0; i < MX_BLOCK_SIZE; i++) {
        uint16_t c = q[i];
        uint16_t mag = c & 0x7Fu;
        uint16_t v = (uint16_t)((uint16_t)(mag << 4) + off);
        v = mag < 8u ? (uint16_t)(mx_sub_bf16[mag & 7u] + soff) : v;
        v = mag == 0 ? 0 : v;
        v = mag == 0x7Fu ? (uint16_t)0x7FC0u : (uint16_t)(v | ((c << 8) & 0x8000u));
        o[i] = v;
    }
}

static inline void mx_decode_block_f32_fast(const uint8_t *restrict q, uint32_t s,
                                            uint32_t *restrict o) {
    const uint32_t off = (s - 7u) << 23, soff = s << 23;
    for (int i = 0; i < MX_BLOCK_SIZE; i++) {
        uint32_t c = q[i];
        uint32_t mag = c & 0x7Fu;
        uint32_t v = (mag << 20) + off;
        v = mag < 8u ? ((uint32_t)mx_sub_bf16[mag & 7u] << 16) + soff : v;
        v = mag == 0 ? 0 : v;
        v = mag == 0x7Fu ? 0x7FC00000u : (v | ((c << 24) & 0x80000000u));
        o[i] = v;
    }
}
#endif

/* Row decode, one output type: each block through the fast path when its scale is in range,
 * else (and for partial blocks) through the per-scale 256-entry table. */
#define MX_DEFINE_DECODE(NAME, T, FAST)                                                         \
void NAME(const uint8_t *q, const uint8_t *s, int64_t rows, int64_t k, T *out, const T *lut) {  \
    MX_FP_ENTER();                                                                              \
    const int64_t nb = (k + MX_BLOCK_SIZE - 1) / MX_BLOCK_SIZE;                                           \
    for (int64_t r = 0; r < rows; r++) {                                                        \
        const uint8_t *qr = q + r * k;                                                          \
        const uint8_t *sr = s + r * nb;                                                         \
        T *orow = out + r * k;                                                                  \
        for (int64_t b = 0; b < nb; b++) {                                                      \
            const int64_t c0 = b * MX_BLOCK_SIZE;                                                    \
            const int64_t n = (k - c0) < MX_BLOCK_SIZE ? (k - c0) : MX_BLOCK_SIZE;                        \
            const uint32_t sb = sr[b];                                                          \
            if (n == MX_BLOCK_SIZE && sb >= 10u && sb <= 246u) {                                     \
                FAST(qr + c0, sb, orow + c0);                                                   \
                continue;                                                                       \
            }                                                                                   \
            const T *row = lut + ((size_t)sb << 8);                                             \
            for (int64_t i = 0; i < n; i++) orow[c0 + i] = row[qr[c0 + i]];                     \
        }                                                                                       \
    }                                                                                           \
    MX_FP_EXIT();                                                                               \
}

/* payload q [rows, k], scales s [rows, ceil(k/32)] -> out [rows, k] bfloat16 bits */
MX_DEFINE_DECODE(mx_decode_bf16, uint16_t, mx_decode_block_bf16_fast)

/* the same, float32 bits */
MX_DEFINE_DECODE(mx_decode_f32, uint32_t, mx_decode_block_f32_fast)

/* Row decode on an OpenMP team: the body that GOMP_parallel(body, args, threads, 0) runs on every
 * thread of the team. The kernel does not link an OpenMP runtime: the caller passes the running
 * runtime's omp_get_thread_num / omp_get_num_threads, so the work lands on that runtime's threads
 * (torch's intra-op threads) instead of new ones competing with them. Each thread decodes one
 * contiguous row range of the team's actual size (1 when nested): the rows of one call, the same
 * bits. */
typedef struct {
    const uint8_t *q;
    const uint8_t *s;
    int64_t rows, k;
    void *out;
    const void *lut;
    int (*thread_num)(void);
    int (*num_threads)(void);
} mx_team_args;

#define MX_DEFINE_TEAM(NAME, ROWS_FN, T)                                                        \
void NAME(void *arg) {                                                                          \
    const mx_team_args *a = (const mx_team_args *)arg;                                          \
    const int64_t t = a->thread_num(), n = a->num_threads();                                    \
    const int64_t r0 = a->rows * t / n, r1 = a->rows * (t + 1) / n;                             \
    const int64_t nb = (a->k + MX_BLOCK_SIZE - 1) / MX_BLOCK_SIZE;                              \
    if (r1 > r0)                                                                                \
        ROWS_FN(a->q + r0 * a->k, a->s + r0 * nb, r1 - r0, a->k, (T *)a->out + r0 * a->k,       \
                (const T *)a->lut);                                                             \
}

MX_DEFINE_TEAM(mx_decode_bf16_team, mx_decode_bf16, uint16_t)
MX_DEFINE_TEAM(mx_decode_f32_team, mx_decode_f32, uint32_t)

/* Full 32 x 32 tile transpose: row c of the result (column c of buf) goes to out + c * ld, for
 * c < n. */
#if MX_AVX512 || MX_AVX2
/* 16 transposes of 8 x 8 values, three unpack stages each (pairs, quads, halves): column j of a
 * sub-tile becomes 8 contiguous output values; the four sub-tiles of a column band are transposed
 * first, so that each output row's 32 values (one cache line) are stored back to back. Measured on AMD
 * EPYCs: streaming stores took 21 ms instead of 16 for a [4096, 8192] output (AVX2); with AVX-512, the
 * tile in 32 zmm registers transposed in 5 butterfly stages of vpermt2w and streamed out took 1.2-1.4x
 * this store's time (load_model 0.63-0.67 s against 0.59-0.61 s). */
static inline void mx_transpose8_epi16(const uint16_t *restrict src, __m128i *restrict dst) {
    __m128i a[8], t[8];
    for (int i = 0; i < 8; i++) a[i] = _mm_load_si128((const __m128i *)(src + i * MX_TILE));
    for (int i = 0; i < 8; i += 2) {
        t[i / 2] = _mm_unpacklo_epi16(a[i], a[i + 1]);
        t[4 + i / 2] = _mm_unpackhi_epi16(a[i], a[i + 1]);
    }
    a[0] = _mm_unpacklo_epi32(t[0], t[1]), a[1] = _mm_unpackhi_epi32(t[0], t[1]);
    a[2] = _mm_unpacklo_epi32(t[4], t[5]), a[3] = _mm_unpackhi_epi32(t[4], t[5]);
    a[4] = _mm_unpacklo_epi32(t[2], t[3]), a[5] = _mm_unpackhi_epi32(t[2], t[3]);
    a[6] = _mm_unpacklo_epi32(t[6], t[7]), a[7] = _mm_unpackhi_epi32(t[6], t[7]);
    dst[0] = _mm_unpacklo_epi64(a[0], a[4]), dst[1] = _mm_unpackhi_epi64(a[0], a[4]);
    dst[2] = _mm_unpacklo_epi64(a[1], a[5]), dst[3] = _mm_unpackhi_epi64(a[1], a[5]);
    dst[4] = _mm_unpacklo_epi64(a[2], a[6]), dst[5] = _mm_unpackhi_epi64(a[2], a[6]);
    dst[6] = _mm_unpacklo_epi64(a[3], a[7]), dst[7] = _mm_unpackhi_epi64(a[3], a[7]);
}

static inline void mx_tile_store_t_bf16(const uint16_t *restrict buf, uint16_t *restrict out,
                                        int64_t ld, int64_t n) {
    for (int cb = 0; cb < n; cb += 8) {
        __m128i col[4][8]; /* [row band][column]: 8 values of output row cb + j */
        for (int rb = 0; rb < 4; rb++) mx_transpose8_epi16(buf + rb * 8 * MX_TILE + cb, col[rb]);
        for (int j = 0; j < 8 && cb + j < n; j++) {
            __m128i *o = (__m128i *)(out + (cb + j) * ld);
            for (int rb = 0; rb < 4; rb++) _mm_storeu_si128(o + rb, col[rb][j]);
        }
    }
}
#else
static inline void mx_tile_store_t_bf16(const uint16_t *restrict buf, uint16_t *restrict out,
                                        int64_t ld, int64_t n) {
    for (int64_t c = 0; c < n; c++)
        for (int r = 0; r < MX_TILE; r++) out[c * ld + r] = buf[r * MX_TILE + c];
}
#endif

#if MX_AVX512
/* Four 16 x 16 sub-tiles, each in 16 registers: 4 x 4 transposes within 128-bit lanes (unpack of
 * pairs, then of halves), then the 4 x 4 grid of lanes transposed (two lane shuffles), stored as whole
 * 64-byte lines: half an output row's 32 values each. On an AMD EPYC with AVX-512: 0.8-0.9x the time of
 * the SSE 4 x 4 transposes below (16-byte stores); a butterfly of vpermt2d over 16 registers took 1.2-2x. */
static inline void mx_tile_store_t_f32(const uint32_t *restrict buf, uint32_t *restrict out,
                                       int64_t ld, int64_t n) {
    for (int cb = 0; cb < n; cb += 16) {
        for (int rb = 0; rb < MX_TILE; rb += 16) {
            __m512i a[16], t[16];
            for (int i = 0; i < 16; i++) a[i] = _mm512_load_si512((const void *)(buf + (rb + i) * MX_TILE + cb));
            for (int i = 0; i < 16; i += 4) { /* rows i..i+3: 4 x 4 transposes in each lane */
                const __m512i p0 = _mm512_unpacklo_epi32(a[i], a[i + 1]), p1 = _mm512_unpackhi_epi32(a[i], a[i + 1]);
                const __m512i p2 = _mm512_unpacklo_epi32(a[i + 2], a[i + 3]);
                const __m512i p3 = _mm512_unpackhi_epi32(a[i + 2], a[i + 3]);
                t[i] = _mm512_unpacklo_epi64(p0, p2), t[i + 1] = _mm512_unpackhi_epi64(p0, p2);
                t[i + 2] = _mm512_unpacklo_epi64(p1, p3), t[i + 3] = _mm512_unpackhi_epi64(p1, p3);
            }
            /* t[4g + j], lane L: column 4L + j of rows 4g..4g+3; output row 4L + j takes lane L of
             * t[j], t[4 + j], t[8 + j], t[12 + j] */
            for (int j = 0; j < 4; j++) {
                const __m512i u0 = _mm512_shuffle_i32x4(t[j], t[4 + j], 0x44); /* lanes 0 1 of each */
                const __m512i u1 = _mm512_shuffle_i32x4(t[j], t[4 + j], 0xEE); /* lanes 2 3 */
                const __m512i u2 = _mm512_shuffle_i32x4(t[8 + j], t[12 + j], 0x44);
                const __m512i u3 = _mm512_shuffle_i32x4(t[8 + j], t[12 + j], 0xEE);
                a[j] = _mm512_shuffle_i32x4(u0, u2, 0x88);      /* lane 0: output row j */
                a[4 + j] = _mm512_shuffle_i32x4(u0, u2, 0xDD);  /* lane 1: row 4 + j */
                a[8 + j] = _mm512_shuffle_i32x4(u1, u3, 0x88);  /* lane 2 */
                a[12 + j] = _mm512_shuffle_i32x4(u1, u3, 0xDD); /* lane 3 */
            }
            for (int j = 0; j < 16 && cb + j < n; j++) _mm512_storeu_si512((void *)(out + (cb + j) * ld + rb), a[j]);
        }
    }
}
#elif MX_AVX2
/* 64 transposes of 4 x 4 values (pairs, then halves) */
static inline void mx_tile_store_t_f32(const uint32_t *restrict buf, uint32_t *restrict out,
                                       int64_t ld, int64_t n) {
    for (int cb = 0; cb < n; cb += 4) {
        for (int rb = 0; rb < MX_TILE; rb += 4) {
            __m128i a[4], t[4];
            for (int i = 0; i < 4; i++) a[i] = _mm_load_si128((const __m128i *)(buf + (rb + i) * MX_TILE + cb));
            t[0] = _mm_unpacklo_epi32(a[0], a[1]), t[1] = _mm_unpackhi_epi32(a[0], a[1]);
            t[2] = _mm_unpacklo_epi32(a[2], a[3]), t[3] = _mm_unpackhi_epi32(a[2], a[3]);
            a[0] = _mm_unpacklo_epi64(t[0], t[2]), a[1] = _mm_unpackhi_epi64(t[0], t[2]);
            a[2] = _mm_unpacklo_epi64(t[1], t[3]), a[3] = _mm_unpackhi_epi64(t[1], t[3]);
            for (int j = 0; j < 4 && cb + j < n; j++) _mm_storeu_si128((__m128i *)(out + (cb + j) * ld + rb), a[j]);
        }
    }
}
#else
static inline void mx_tile_store_t_f32(const uint32_t *restrict buf, uint32_t *restrict out,
                                       int64_t ld, int64_t n) {
    for (int64_t c = 0; c < n; c++)
        for (int r = 0; r < MX_TILE; r++) out[c * ld + r] = buf[r * MX_TILE + c];
}
#endif

/* Transposed decode, one output type: decode a 32-row x 32-col tile (one scale block per row)
 * into buf with the row kernels' exact rules, then scatter it column-wise to out[c * ld + r].
 * Tiles are visited in groups of MX_GROUP x MX_GROUP: within a group, for each block column the
 * tiles go down the rows, so each of the 32 output rows being written grows contiguously and the
 * pages of one group (MX_GROUP * 32 payload rows, 32 * MX_GROUP output rows) stay in the TLB.
 * (Sweeping a whole row band first wrote 64 bytes per output row per tile across the entire
 * output: a TLB miss per store on large matrices.) */
#define MX_DEFINE_DECODE_T(NAME, T, FAST, STORE_T)                                                          \
void NAME(const uint8_t *q, int64_t ldq, const uint8_t *s, int64_t lds, int64_t rows, int64_t k, \
          T *out, int64_t ld, const T *lut) {                                                   \
    MX_FP_ENTER();                                                                              \
    const int64_t nb = (k + MX_BLOCK_SIZE - 1) / MX_BLOCK_SIZE;                                           \
    T buf[MX_TILE * MX_TILE] __attribute__((aligned(64)));                                      \
    for (int64_t g0 = 0; g0 < rows; g0 += MX_GROUP * MX_TILE) {                                 \
      const int64_t g1 = (rows - g0) < MX_GROUP * MX_TILE ? rows : g0 + MX_GROUP * MX_TILE;     \
      for (int64_t bg = 0; bg < nb; bg += MX_GROUP) {                                           \
        const int64_t bend = (nb - bg) < MX_GROUP ? nb : bg + MX_GROUP;                         \
        for (int64_t b = bg; b < bend; b++) {                                                   \
          const int64_t c0 = b * MX_BLOCK_SIZE;                                                      \
          const int64_t n = (k - c0) < MX_BLOCK_SIZE ? (k - c0) : MX_BLOCK_SIZE;                          \
          for (int64_t r0 = g0; r0 < g1; r0 += MX_TILE) {                                       \
            const int64_t tr = (rows - r0) < MX_TILE ? (rows - r0) : MX_TILE;                   \
            for (int64_t r = 0; r < tr; r++) {                                                  \
                const uint8_t *qr = q + (r0 + r) * ldq + c0;                                    \
                const uint32_t sb = s[(r0 + r) * lds + b];                                      \
                T *o = buf + r * MX_TILE;                                                       \
                __builtin_prefetch(qr + 64); /* this row's next line: a stride no prefetcher follows */ \
                if (n == MX_BLOCK_SIZE && sb >= 10u && sb <= 246u) { FAST(qr, sb, o); continue; }     \
                const T *row = lut + ((size_t)sb << 8);                                         \
                for (int64_t i = 0; i < n; i++) o[i] = row[qr[i]];                              \
            }                                                                                   \
            if (tr == MX_TILE) {                                                                \
                STORE_T(buf, out + c0 * ld + r0, ld, n);                                        \
            } else {                                                                            \
                for (int64_t c = 0; c < n; c++) {                                               \
                    T *restrict dst = out + (c0 + c) * ld + r0;                                 \
                    for (int64_t r = 0; r < tr; r++) dst[r] = buf[r * MX_TILE + c];             \
                }                                                                               \
            }                                                                                   \
          }                                                                                     \
        }                                                                                       \
      }                                                                                         \
    }                                                                                           \
    MX_FP_EXIT();                                                                               \
}

/* payload q [rows, k] (row stride ldq), scales s [rows, ceil(k/32)] (row stride lds)
 * -> out[c * ld + r] bfloat16 bits ([k, rows]) */
MX_DEFINE_DECODE_T(mx_decode_bf16_t, uint16_t, mx_decode_block_bf16_fast, mx_tile_store_t_bf16)

/* the same, float32 bits */
MX_DEFINE_DECODE_T(mx_decode_f32_t, uint32_t, mx_decode_block_f32_fast, mx_tile_store_t_f32)

/* Transposed decode on an OpenMP team (see mx_team_args): each thread decodes one range of whole block
 * columns of the payload into the same rows of out (q [rows, k], s and out [k, rows] contiguous). */
#define MX_DEFINE_TEAM_T(NAME, T_FN, T)                                                         \
void NAME(void *arg) {                                                                          \
    const mx_team_args *a = (const mx_team_args *)arg;                                          \
    const int64_t t = a->thread_num(), n = a->num_threads();                                    \
    const int64_t nb = (a->k + MX_BLOCK_SIZE - 1) / MX_BLOCK_SIZE;                              \
    const int64_t b0 = nb * t / n, b1 = nb * (t + 1) / n;                                       \
    if (b1 <= b0) return;                                                                       \
    const int64_t c0 = b0 * MX_BLOCK_SIZE;                                                      \
    const int64_t c1 = b1 * MX_BLOCK_SIZE < a->k ? b1 * MX_BLOCK_SIZE : a->k;                   \
    T_FN(a->q + c0, a->k, a->s + b0, nb, a->rows, c1 - c0, (T *)a->out + c0 * a->rows, a->rows, \
         (const T *)a->lut);                                                                    \
}

MX_DEFINE_TEAM_T(mx_decode_bf16_t_team, mx_decode_bf16_t, uint16_t)
MX_DEFINE_TEAM_T(mx_decode_f32_t_team, mx_decode_f32_t, uint32_t)

/* ========================================================================================== */
/* encode                                                                                     */
/* ========================================================================================== */

/* exact path: round |y| (float32 bits) to an E4M3 magnitude code, nearest-even, saturating */
static inline uint32_t mx_e4m3_mag(uint32_t a) {
    /* normal E4M3 (|y| >= 2^-6 = 0x3C800000): keep 3 mantissa bits, rebias 127 -> 7 */
    uint32_t rn = ((a + 0x7FFFFu + ((a >> 20) & 1u)) >> 20) - (120u << 3);
    /* subnormal E4M3: n = rne(|y| * 2^9) in 0..8 (8 is the min normal 0x08, continuous) */
    float t = mx_bits_f32(a) * 512.0f + 8388608.0f;
    uint32_t sn = mx_f32_bits(t) - 0x4B000000u;
    uint32_t mag = a >= 0x3C800000u ? rn : sn;
    return a >= 0x43E00000u ? 0x7Eu : mag; /* >= 448: saturate (RNE keeps (448, 464] at 448) */
}

/* exact path for any block of n <= 32 float32 values: y = x * 2^-e in float32 (exact but for
 * float32 subnormals, which round to E4M3 zero anyway), then mx_e4m3_mag; returns 1 on Inf/NaN */
static int mx_encode_block_exact(const float *restrict x, int64_t n, int rceil,
                                 uint8_t *restrict q, uint8_t *restrict sout) {
    uint32_t amax = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t a = mx_f32_bits(x[i]) & 0x7FFFFFFFu;
        amax = a > amax ? a : amax;
    }
    if (amax >= 0x7F800000u) return 1;
    const int32_t e = mx_scale_exp(amax, rceil);
    const uint32_t sbyte = (uint32_t)(e + 127);
    *sout = (uint8_t)sbyte;
    const float factor = mx_bits_f32((uint32_t)(127 - e) << 23); /* 2^-e, e <= 120 for finite x */
    const uint32_t sat = sbyte == MX_TOP_CLAMP_SCALE_BYTE ? MX_TOP_CLAMP_CODE : MX_E4M3_MAX_CODE; /* never decode a finite value to 2^128 */
    for (int64_t i = 0; i < n; i++) {
        uint32_t b = mx_f32_bits(x[i] * factor);
        uint32_t mag = mx_e4m3_mag(b & 0x7FFFFFFFu);
        mag = mag > sat ? sat : mag;
        q[i] = (uint8_t)(((b >> 24) & 0x80u) | mag);
    }
    return 0;
}

/* Fast path for a full block whose elements all land in E4M3's normal range (or are zero):
 * scaling by 2^-e is folded into the exponent, so the code is
 *     ((a + half-ulp - 1 + lsb) >> (mantissa bits - 3)) - ((120 + e) << 3)
 * on the magnitude bits a (round to nearest even on the bit pattern), saturated at `sat`.
 * Needs e >= -120 (else the block is tiny: exact path). Returns 0 on success, 1 for Inf/NaN in
 * the block, 2 when some element would be E4M3-subnormal (|x| < 2^(e-6)): use the exact path. */
#if MX_AVX512
static inline int mx_encode_block_bf16_fast(const uint16_t *restrict x, int rceil,
                                            uint8_t *restrict q, uint8_t *restrict sout) {
    const __m512i b = _mm512_loadu_si512((const void *)x);
    const __m512i a = _mm512_and_si512(b, _mm512_set1_epi16(0x7FFF));
    __m256i m256 = _mm256_max_epu16(_mm512_castsi512_si256(a), _mm512_extracti64x4_epi64(a, 1));
    __m128i m128 = _mm_max_epu16(_mm256_castsi256_si128(m256), _mm256_extracti128_si256(m256, 1));
    const uint32_t amax = 0xFFFFu & ~(uint32_t)_mm_cvtsi128_si32(
        _mm_minpos_epu16(_mm_xor_si128(m128, _mm_set1_epi16(-1))));
    if (amax >= 0x7F80u) return 1;
    const int32_t e = mx_scale_exp(amax << 16, rceil);
    *sout = (uint8_t)(e + 127);
    if (e < -120) return 2;
    const __m512i sat = _mm512_set1_epi16(e + MX_E8M0_BIAS == MX_TOP_CLAMP_SCALE_BYTE ? MX_TOP_CLAMP_CODE : MX_E4M3_MAX_CODE);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi16(a, 4), _mm512_set1_epi16(1));
    __m512i rn = _mm512_srli_epi16(_mm512_add_epi16(_mm512_add_epi16(a, _mm512_set1_epi16(7)), lsb), 4);
    rn = _mm512_min_epu16(_mm512_sub_epi16(rn, _mm512_set1_epi16((short)((120 + e) << 3))), sat);
    const __mmask32 nz = _mm512_test_epi16_mask(a, a);
    const __mmask32 small = _mm512_mask_cmplt_epu16_mask(nz, a, _mm512_set1_epi16((short)((121 + e) << 7)));
    if (small) return 2;
    rn = _mm512_maskz_mov_epi16(nz, rn);
    rn = _mm512_or_si512(rn, _mm512_and_si512(_mm512_srli_epi16(b, 8), _mm512_set1_epi16(0x80)));
    _mm256_storeu_si256((__m256i *)q, _mm512_cvtepi16_epi8(rn));
    return 0;
}

static inline int mx_encode_block_f32_fast(const float *restrict xf, int rceil,
                                           uint8_t *restrict q, uint8_t *restrict sout) {
    const __m512i b0 = _mm512_loadu_si512((const void *)xf);
    const __m512i b1 = _mm512_loadu_si512((const void *)(xf + 16));
    const __m512i mask = _mm512_set1_epi32(0x7FFFFFFF);
    const __m512i a0 = _mm512_and_si512(b0, mask), a1 = _mm512_and_si512(b1, mask);
    const uint32_t amax = (uint32_t)_mm512_reduce_max_epu32(_mm512_max_epu32(a0, a1));
    if (amax >= 0x7F800000u) return 1;
    const int32_t e = mx_scale_exp(amax, rceil);
    *sout = (uint8_t)(e + 127);
    if (e < -120) return 2;
    const __m512i sat = _mm512_set1_epi32(e + MX_E8M0_BIAS == MX_TOP_CLAMP_SCALE_BYTE ? MX_TOP_CLAMP_CODE : MX_E4M3_MAX_CODE);
    const __m512i bias = _mm512_set1_epi32((120 + e) << 3);
    const __m512i lo = _mm512_set1_epi32((121 + e) << 23);
    const __m512i half = _mm512_set1_epi32(0x7FFFF), one = _mm512_set1_epi32(1);
    const __m512i a[2] = {a0, a1}, bb[2] = {b0, b1};
    __m128i out[2];
    for (int h = 0; h < 2; h++) {
        const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(a[h], 20), one);
        __m512i rn = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(a[h], half), lsb), 20);
        rn = _mm512_min_epu32(_mm512_sub_epi32(rn, bias), sat);
        const __mmask16 nz = _mm512_test_epi32_mask(a[h], a[h]);
        if (_mm512_mask_cmplt_epu32_mask(nz, a[h], lo)) return 2;
        rn = _mm512_maskz_mov_epi32(nz, rn);
        rn = _mm512_or_si512(rn, _mm512_and_si512(_mm512_srli_epi32(bb[h], 24), _mm512_set1_epi32(0x80)));
        out[h] = _mm512_cvtepi32_epi8(rn);
    }
    _mm_storeu_si128((__m128i *)q, out[0]);
    _mm_storeu_si128((__m128i *)(q + 16), out[1]);
    return 0;
}
#else
static inline int mx_encode_block_bf16_fast(const uint16_t *restrict x, int rceil,
                                            uint8_t *restrict q, uint8_t *restrict sout) {
    uint16_t amax = 0;
    for (int i = 0; i < MX_BLOCK_SIZE; i++) {
        uint16_t a = x[i] & 0x7FFFu;
        amax = a > amax ? a : amax;
    }
    if (amax >= 0x7F80u) return 1;
    const int32_t e = mx_scale_exp((uint32_t)amax << 16, rceil);
    *sout = (uint8_t)(e + 127);
    if (e < -120) return 2;
    const uint16_t sat = e + MX_E8M0_BIAS == MX_TOP_CLAMP_SCALE_BYTE ? MX_TOP_CLAMP_CODE : MX_E4M3_MAX_CODE;
    const uint16_t bias = (uint16_t)((120 + e) << 3), lo = (uint16_t)((121 + e) << 7);
    uint16_t small = 0;
    for (int i = 0; i < MX_BLOCK_SIZE; i++) {
        uint16_t a = x[i] & 0x7FFFu;
        uint16_t rn = (uint16_t)(((uint16_t)(a + 7u + ((a >> 4) & 1u)) >> 4) - bias);
        rn = rn > sat ? sat : rn;
        rn = a == 0 ? 0 : rn;
        small |= (uint16_t)((a != 0) & (a < lo));
        q[i] = (uint8_t)(rn | ((x[i] >> 8) & 0x80u));
    }
    return small ? 2 : 0;
}

static inline int mx_encode_block_f32_fast(const float *restrict xf, int rceil,
                                           uint8_t *restrict q, uint8_t *restrict sout) {
    uint32_t amax = 0;
    for (int i = 0; i < MX_BLOCK_SIZE; i++) {
        uint32_t a = mx_f32_bits(xf[i]) & 0x7FFFFFFFu;
        amax = a > amax ? a : amax;
    }
    if (amax >= 0x7F800000u) return 1;
    const int32_t e = mx_scale_exp(amax, rceil);
    *sout = (uint8_t)(e + 127);
    if (e < -120) return 2;
    const uint32_t sat = e + MX_E8M0_BIAS == MX_TOP_CLAMP_SCALE_BYTE ? MX_TOP_CLAMP_CODE : MX_E4M3_MAX_CODE;
    const uint32_t bias = (uint32_t)(120 + e) << 3, lo = (uint32_t)(121 + e) << 23;
    uint32_t small = 0;
    for (int i = 0; i < MX_BLOCK_SIZE; i++) {
        uint32_t bits = mx_f32_bits(xf[i]);
        uint32_t a = bits & 0x7FFFFFFFu;
        uint32_t rn = ((a + 0x7FFFFu + ((a >> 20) & 1u)) >> 20) - bias;
        rn = rn > sat ? sat : rn;
        rn = a == 0 ? 0 : rn;
        small |= (uint32_t)((a != 0) & (a < lo));
        q[i] = (uint8_t)(rn | ((bits >> 24) & 0x80u));
    }
    return small ? 2 : 0;
}
#endif

/* x [rows, k] float32 -> q [rows, k], s [rows, ceil(k/32)]; returns -1 or the first bad block */
int64_t mx_encode_f32(const float *x, int64_t rows, int64_t k, uint8_t *q, uint8_t *s, int rceil) {
    MX_FP_ENTER();
    int64_t bad = -1;
    const int64_t nb = (k + MX_BLOCK_SIZE - 1) / MX_BLOCK_SIZE;
    for (int64_t r = 0; r < rows && bad < 0; r++) {
        for (int64_t b = 0; b < nb; b++) {
            const int64_t c0 = b * MX_BLOCK_SIZE;
            const int64_t n = (k - c0) < MX_BLOCK_SIZE ? (k - c0) : MX_BLOCK_SIZE;
            const float *src = x + r * k + c0;
            uint8_t *qd = q + r * k + c0, *sd = s + r * nb + b;
            int rc = n == MX_BLOCK_SIZE ? mx_encode_block_f32_fast(src, rceil, qd, sd) : 2;
            if (rc == 2) rc = mx_encode_block_exact(src, n, rceil, qd, sd);
            if (rc) { bad = r * nb + b; break; }
        }
    }
    MX_FP_EXIT();
    return bad;
}

/* x [rows, k] bfloat16 bits -> q, s; returns -1 or the first bad block */
int64_t mx_encode_bf16(const uint16_t *x, int64_t rows, int64_t k, uint8_t *q, uint8_t *s, int rceil) {
    MX_FP_ENTER();
    int64_t bad = -1;
    const int64_t nb = (k + MX_BLOCK_SIZE - 1) / MX_BLOCK_SIZE;
    float buf[MX_BLOCK_SIZE];
    for (int64_t r = 0; r < rows && bad < 0; r++) {
        for (int64_t b = 0; b < nb; b++) {
            const int64_t c0 = b * MX_BLOCK_SIZE;
            const int64_t n = (k - c0) < MX_BLOCK_SIZE ? (k - c0) : MX_BLOCK_SIZE;
            const uint16_t *src = x + r * k + c0;
            uint8_t *qd = q + r * k + c0, *sd = s + r * nb + b;
            int rc = n == MX_BLOCK_SIZE ? mx_encode_block_bf16_fast(src, rceil, qd, sd) : 2;
            if (rc == 2) {
                for (int64_t i = 0; i < n; i++) buf[i] = mx_bits_f32((uint32_t)src[i] << 16);
                rc = mx_encode_block_exact(buf, n, rceil, qd, sd);
            }
            if (rc) { bad = r * nb + b; break; }
        }
    }
    MX_FP_EXIT();
    return bad;
}

/* Grid-rounding encode (rounding="stochastic", the counter RNG): x [rows, k] float32 (bf16 == 0) or
 * bfloat16 bits (bf16 == 1) -> q, s through mxfp8.h's mx_encode_block_grid, element (r, c) drawing the
 * random word of flat index index0 + r * k + c under the round keys (k2, k3). Scalar: stochastic
 * rounding is for optimizer write-back, not bulk conversion. Returns -1 or the first bad block. */
int64_t mx_encode_grid(const void *x, int bf16, int64_t rows, int64_t k, uint8_t *q, uint8_t *s, int rceil,
                       int sr, uint64_t index0, uint32_t k2, uint32_t k3) {
    MX_FP_ENTER();
    int64_t bad = -1;
    const int64_t nb = (k + MX_BLOCK_SIZE - 1) / MX_BLOCK_SIZE;
    float buf[MX_BLOCK_SIZE];
    for (int64_t r = 0; r < rows && bad < 0; r++) {
        for (int64_t b = 0; b < nb; b++) {
            const int64_t c0 = b * MX_BLOCK_SIZE;
            const int n = (int)((k - c0) < MX_BLOCK_SIZE ? (k - c0) : MX_BLOCK_SIZE);
            uint32_t amax = 0;
            for (int i = 0; i < n; i++) {
                buf[i] = bf16 ? mx_bits_f32((uint32_t)((const uint16_t *)x)[r * k + c0 + i] << 16)
                              : ((const float *)x)[r * k + c0 + i];
                const uint32_t a = mx_f32_bits(buf[i]) & 0x7FFFFFFFu;
                amax = a > amax ? a : amax;
            }
            if (amax >= 0x7F800000u) { bad = r * nb + b; break; }
            mx_encode_block_grid(buf, n, index0 + (uint64_t)(r * k + c0), sr, rceil, k2, k3, q + r * k + c0,
                                 s + r * nb + b);
        }
    }
    MX_FP_EXIT();
    return bad;
}
