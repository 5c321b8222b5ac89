/*
 * Native MXFP8 (E4M3 element, UE8M0 scale, 32-element blocks) encode/decode kernels.
 *
 * Built lazily by mxfp8_codec/_native.py with the machine's C compiler and loaded with cffi
 * (ABI mode). Single-threaded, streaming, no allocation. The numerics are exactly those of the
 * pure-numpy path in mxfp8_codec/numerics.py (read its module docstring); the tests compare the
 * two bit for bit.
 *
 * Decode, blocks with scale byte s in [10, 246] (every realistic weight): an E4M3 code with
 * exponent field E and mantissa M has the value  mi * 2^(max(E,1) - 10)  with the integer
 * significand mi = E ? 8 + M : M (<= 15). Times 2^(s - 127) this is  mi * 2^(E' + s - 137), a
 * float32 product of a small integer and a normal power of two: exact, normal, finite in that s
 * range, and with <= 4 significant bits, so its bfloat16 value is its top 16 bits (exact, no
 * rounding needed). Other blocks (s < 10: float32/bfloat16 subnormal results; s > 246: overflow;
 * s = 255: NaN) and partial blocks gather from the exact 65 536-entry table built in Python.
 *
 * Encode: amax from the magnitude bits (an integer max; a value >= 0x7F800000 means Inf/NaN in
 * the block, reported to the caller), scale rule in integer arithmetic, y = x * 2^-e in float32
 * (exact except in float32 subnormals, which round to E4M3 zero anyway), then round-to-nearest-even
 * into E4M3 with saturation: normal results by adding half an ulp (plus the lsb for ties) to the
 * bit pattern and shifting, subnormal results (|y| < 2^-6) with the 2^23 "magic number" add.
 *
 * Floating-point environment: the subnormal arithmetic above must not be flushed, so on x86 each
 * entry point clears FTZ/DAZ and selects round-to-nearest in MXCSR and restores it on exit
 * (torch.set_flush_denormal(True) sets them process-wide).
 */
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define MX_FP_ENTER() unsigned mx_saved_csr = _mm_getcsr(); _mm_setcsr(mx_saved_csr & ~0xE040u)
#define MX_FP_EXIT() _mm_setcsr(mx_saved_csr)
#else
#define MX_FP_ENTER() do { } while (0)
#define MX_FP_EXIT() do { } while (0)
#endif

#define MX_BLOCK 32
#define MX_KERNEL_VERSION 1

static inline float mx_as_float(uint32_t u) { float f; memcpy(&f, &u, sizeof f); return f; }
static inline uint32_t mx_as_u32(float f) { uint32_t u; memcpy(&u, &f, sizeof u); return u; }

int mx_kernel_version(void) { return MX_KERNEL_VERSION; }

/* ------------------------------------------------------------------------------------------ */
/* decode                                                                                     */
/* ------------------------------------------------------------------------------------------ */

/* value of code c times 2^(s-127) as float32, for s in [10, 246]; sign and NaN handled by caller.
 * Written without branches or selects so the compiler vectorizes the block loops. */
static inline float mx_fast_value(uint32_t c, uint32_t s) {
    uint32_t mag = c & 0x7Fu;
    uint32_t e = mag >> 3;
    uint32_t normal = (uint32_t)(e != 0u);        /* 1 for normal codes, 0 for subnormal/zero */
    uint32_t mi = (mag & 7u) | (normal << 3);      /* integer significand, <= 15 */
    uint32_t ee = e | (normal ^ 1u);               /* max(e, 1) */
    float p = mx_as_float((ee + s - 10u) << 23);   /* 2^(ee + s - 137), a normal float */
    return (float)(int32_t)mi * p;
}

static void mx_decode_block_bf16_fast(const uint8_t *restrict q, uint32_t s, uint16_t *restrict o) {
    for (int i = 0; i < MX_BLOCK; i++) {
        uint32_t c = q[i];
        uint32_t bits = (mx_as_u32(mx_fast_value(c, s)) >> 16) | ((c & 0x80u) << 8);
        uint32_t nan = 0u - (uint32_t)((c & 0x7Fu) == 0x7Fu);
        o[i] = (uint16_t)((bits & ~nan) | (0x7FC0u & nan));
    }
}

static void mx_decode_block_f32_fast(const uint8_t *restrict q, uint32_t s, uint32_t *restrict o) {
    for (int i = 0; i < MX_BLOCK; i++) {
        uint32_t c = q[i];
        uint32_t bits = mx_as_u32(mx_fast_value(c, s)) | ((c & 0x80u) << 24);
        uint32_t nan = 0u - (uint32_t)((c & 0x7Fu) == 0x7Fu);
        o[i] = (bits & ~nan) | (0x7FC00000u & nan);
    }
}

/* payload q [rows, k], scales s [rows, ceil(k/32)] -> out [rows, k] bfloat16 bits */
void mx_decode_bf16(const uint8_t *q, const uint8_t *s, int64_t rows, int64_t k,
                    uint16_t *out, const uint16_t *lut) {
    MX_FP_ENTER();
    const int64_t nb = (k + MX_BLOCK - 1) / MX_BLOCK;
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *qr = q + r * k;
        const uint8_t *sr = s + r * nb;
        uint16_t *orow = out + r * k;
        for (int64_t b = 0; b < nb; b++) {
            const int64_t c0 = b * MX_BLOCK;
            const int64_t n = (k - c0) < MX_BLOCK ? (k - c0) : MX_BLOCK;
            const uint32_t sb = sr[b];
            if (n == MX_BLOCK && sb >= 10u && sb <= 246u) {
                mx_decode_block_bf16_fast(qr + c0, sb, orow + c0);
            } else {
                const uint16_t *row = lut + ((size_t)sb << 8);
                for (int64_t i = 0; i < n; i++) orow[c0 + i] = row[qr[c0 + i]];
            }
        }
    }
    MX_FP_EXIT();
}

/* payload q [rows, k], scales s [rows, ceil(k/32)] -> out [rows, k] float32 bits */
void mx_decode_f32(const uint8_t *q, const uint8_t *s, int64_t rows, int64_t k,
                   uint32_t *out, const uint32_t *lut) {
    MX_FP_ENTER();
    const int64_t nb = (k + MX_BLOCK - 1) / MX_BLOCK;
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *qr = q + r * k;
        const uint8_t *sr = s + r * nb;
        uint32_t *orow = out + r * k;
        for (int64_t b = 0; b < nb; b++) {
            const int64_t c0 = b * MX_BLOCK;
            const int64_t n = (k - c0) < MX_BLOCK ? (k - c0) : MX_BLOCK;
            const uint32_t sb = sr[b];
            if (n == MX_BLOCK && sb >= 10u && sb <= 246u) {
                mx_decode_block_f32_fast(qr + c0, sb, orow + c0);
            } else {
                const uint32_t *row = lut + ((size_t)sb << 8);
                for (int64_t i = 0; i < n; i++) orow[c0 + i] = row[qr[c0 + i]];
            }
        }
    }
    MX_FP_EXIT();
}

/* ------------------------------------------------------------------------------------------ */
/* encode                                                                                     */
/* ------------------------------------------------------------------------------------------ */

/* round |y| (float32) to an E4M3 magnitude code, nearest-even, saturating at 0x7E */
static inline uint32_t mx_e4m3_mag(uint32_t a) {
    /* normal E4M3 (|y| >= 2^-6 = 0x3C800000): keep 3 mantissa bits, rebias 127 -> 7 */
    uint32_t rn = ((a + 0x7FFFFu + ((a >> 20) & 1u)) >> 20) - (120u << 3);
    /* subnormal E4M3: n = rne(|y| * 2^9) in 0..8 (8 is the min normal 0x08, continuous) */
    float t = mx_as_float(a) * 512.0f + 8388608.0f;
    uint32_t sn = mx_as_u32(t) - 0x4B000000u;
    uint32_t mag = a >= 0x3C800000u ? rn : sn;
    return a >= 0x43E00000u ? 0x7Eu : mag; /* >= 448: saturate (RNE keeps (448, 464] at 448) */
}

/* encode one block of n <= 32 float32 values; returns 0, or 1 if it holds Inf/NaN */
static inline int mx_encode_block(const float *restrict x, int64_t n, int rceil,
                                  uint8_t *restrict q, uint8_t *restrict sout) {
    uint32_t amax = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t a = mx_as_u32(x[i]) & 0x7FFFFFFFu;
        amax = a > amax ? a : amax;
    }
    if (amax >= 0x7F800000u) return 1;
    const int32_t biased = (int32_t)(amax >> 23);
    int32_t e;
    if (biased == 0) {
        e = -127; /* zero or float32-subnormal amax */
    } else {
        e = biased - 135 + ((rceil && (amax & 0x7FFFFFu) > 0x600000u) ? 1 : 0);
        e = e < -127 ? -127 : (e > 127 ? 127 : e);
    }
    const uint32_t sbyte = (uint32_t)(e + 127);
    *sout = (uint8_t)sbyte;
    const float factor = mx_as_float((uint32_t)(127 - e) << 23); /* 2^-e, e <= 120 for finite x */
    const uint32_t sat = sbyte == 247u ? 0x77u : 0x7Eu; /* never decode a finite value to 2^128 */
    for (int64_t i = 0; i < n; i++) {
        uint32_t b = mx_as_u32(x[i] * factor);
        uint32_t mag = mx_e4m3_mag(b & 0x7FFFFFFFu);
        mag = mag > sat ? sat : mag;
        q[i] = (uint8_t)(((b >> 24) & 0x80u) | mag);
    }
    return 0;
}

/* x [rows, k] float32 -> q [rows, k], s [rows, ceil(k/32)]; returns -1 or the first bad block */
int64_t mx_encode_f32(const float *x, int64_t rows, int64_t k, uint8_t *q, uint8_t *s, int rceil) {
    MX_FP_ENTER();
    int64_t bad = -1;
    const int64_t nb = (k + MX_BLOCK - 1) / MX_BLOCK;
    float buf[MX_BLOCK];
    for (int64_t r = 0; r < rows && bad < 0; r++) {
        for (int64_t b = 0; b < nb; b++) {
            const int64_t c0 = b * MX_BLOCK;
            const int64_t n = (k - c0) < MX_BLOCK ? (k - c0) : MX_BLOCK;
            const float *src = x + r * k + c0;
            int rc;
            if (n == MX_BLOCK) {
                rc = mx_encode_block(src, MX_BLOCK, rceil, q + r * k + c0, s + r * nb + b);
            } else {
                memcpy(buf, src, (size_t)n * sizeof(float));
                rc = mx_encode_block(buf, n, rceil, q + r * k + c0, s + r * nb + b);
            }
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
    const int64_t nb = (k + MX_BLOCK - 1) / MX_BLOCK;
    float buf[MX_BLOCK];
    for (int64_t r = 0; r < rows && bad < 0; r++) {
        for (int64_t b = 0; b < nb; b++) {
            const int64_t c0 = b * MX_BLOCK;
            const int64_t n = (k - c0) < MX_BLOCK ? (k - c0) : MX_BLOCK;
            const uint16_t *src = x + r * k + c0;
            int rc;
            if (n == MX_BLOCK) {
                for (int i = 0; i < MX_BLOCK; i++) buf[i] = mx_as_float((uint32_t)src[i] << 16);
                rc = mx_encode_block(buf, MX_BLOCK, rceil, q + r * k + c0, s + r * nb + b);
            } else {
                for (int64_t i = 0; i < n; i++) buf[i] = mx_as_float((uint32_t)src[i] << 16);
                rc = mx_encode_block(buf, n, rceil, q + r * k + c0, s + r * nb + b);
            }
            if (rc) { bad = r * nb + b; break; }
        }
    }
    MX_FP_EXIT();
    return bad;
}
