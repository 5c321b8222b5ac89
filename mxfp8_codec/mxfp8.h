/*
 * mxfp8.h -- the MXFP8 format's constants, scale rule, counter RNG and grid-rounding block encoder,
 * once for every native backend: included by mxfp8_codec/_kernel.c (the codec's C kernel), by
 * nvfp4_cuda/cpu/nvfp4_cpu.c (the fused Lion step on an MXFP8 master) and by
 * nvfp4_cuda/csrc/nvfp4_common.cuh (the CUDA kernels; nvcc compiles the functions __host__ __device__).
 *
 * The Python spelling of every value is in mxfp8_codec/constants.py (format) and mxfp8_codec/rng.py
 * (RNG); tests/mxfp8_codec/test_native_header.py parses this file and checks each #define against
 * them, so the three languages cannot drift apart.  Numerics: mxfp8_codec/numerics.py's docstring.
 *
 * Grid rounding (mx_e4m3_grid_code): |v| is rounded on the E4M3 grid of its binade,
 * u = 2^(floor(log2 |v|) - 3) for normal values, 2^-9 below 2^-6; t = |v| / u is exact; RNE is
 * rintf(t), stochastic rounding is floor(t) + (r24 < (t - floor(t)) * 2^24) with 24 random bits
 * from the counter RNG (unbiased to 2^-24 of a step); the result saturates at 448; the sign comes
 * from the sign bit (-0 stays 0x80).  Every float32 operation here is exact or rounds once, so the
 * C (-ffp-contract=off), CUDA (-fmad=false), numpy and torch spellings give the same bits.
 */
#ifndef MXFP8_H
#define MXFP8_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define MX_HD __host__ __device__ __forceinline__
#else
#define MX_HD static inline
#endif

/* ---- format (mxfp8_codec/constants.py) ---------------------------------------------------------- */
#define MX_BLOCK_SIZE 32             /* BLOCK_SIZE: elements per shared scale, along the last axis */
#define MX_E4M3_BIAS 7               /* E4M3_BIAS */
#define MX_E4M3_MANTISSA_BITS 3      /* E4M3_MANTISSA_BITS */
#define MX_E4M3_MAX 448.0f           /* E4M3_MAX: 1.75 * 2^8, code 0x7E */
#define MX_E4M3_MAX_CODE 0x7E        /* E4M3_MAX_CODE */
#define MX_E4M3_MAX_POW2 8           /* E4M3_MAX_POW2: floor(log2 448) */
#define MX_E4M3_MIN_NORMAL 0.015625f /* E4M3_MIN_NORMAL: 2^-6, code 0x08 */
#define MX_E4M3_MIN_SUBNORMAL 0.001953125f /* E4M3_MIN_SUBNORMAL: 2^-9, code 0x01 */
#define MX_E4M3_NAN_MAG 0x7F         /* E4M3_NAN_MAG: 0x7F and 0xFF are NaN */
#define MX_E4M3_SIGN 0x80            /* E4M3_SIGN */
#define MX_E8M0_BIAS 127             /* E8M0_BIAS: byte s means 2^(s - 127) */
#define MX_E8M0_NAN 0xFF             /* E8M0_NAN: the whole block is NaN */
#define MX_SCALE_EXP_MIN (-127)      /* SCALE_EXP_MIN: byte 0 = 2^-127, also an all-zero block */
#define MX_SCALE_EXP_MAX 127         /* SCALE_EXP_MAX */
#define MX_TOP_CLAMP_SCALE_BYTE 247  /* TOP_CLAMP_SCALE_BYTE: blocks whose elements saturate at 240 */
#define MX_TOP_CLAMP_CODE 0x77       /* TOP_CLAMP_CODE: 240 = 1.875 * 2^7 */
#define MX_TOP_CLAMP_VALUE 240.0f    /* TOP_CLAMP_VALUE */
#define MX_F32_MANT_175 0x600000u    /* F32_MANT_175: float32 mantissa field of 1.75 (RCEIL threshold) */
#define MX_F32_CANONICAL_NAN 0x7FC00000u /* F32_CANONICAL_NAN */
#define MX_BF16_CANONICAL_NAN 0x7FC0u    /* BF16_CANONICAL_NAN */

/* ---- counter RNG (mxfp8_codec/rng.py) ------------------------------------------------------------- */
#define MX_RNG_MIX_MULT 0x045D9F3Bu  /* MIX_MULT */
#define MX_SR_BITS 24                /* SR_BITS: random bits per stochastic rounding */
#define MX_SR_SCALE 16777216.0f      /* SR_SCALE: 2^24 */

MX_HD uint32_t mx_f32_bits(float f) { uint32_t u; memcpy(&u, &f, sizeof u); return u; }
MX_HD float mx_bits_f32(uint32_t u) { float f; memcpy(&f, &u, sizeof f); return f; }

/* The scale rule: shared exponent e (scale byte e + 127) from the float32 bits of a block's amax
 * (finite, sign clear).  RCEIL (rceil != 0): e = E - 8 + (mantissa > 1.75); FLOOR: e = E - 8;
 * clamped to [-127, 127]; a zero or float32-subnormal amax gives -127. */
MX_HD int32_t mx_scale_exp(uint32_t amax_bits, int rceil) {
    const int32_t biased = (int32_t)(amax_bits >> 23);
    if (biased == 0) return MX_SCALE_EXP_MIN;
    int32_t e = biased - (127 + MX_E4M3_MAX_POW2) + ((rceil && (amax_bits & 0x7FFFFFu) > MX_F32_MANT_175) ? 1 : 0);
    return e < MX_SCALE_EXP_MIN ? MX_SCALE_EXP_MIN : (e > MX_SCALE_EXP_MAX ? MX_SCALE_EXP_MAX : e);
}

/* float32 value of a UE8M0 scale byte: 2^(s - 127); 0 is 2^-127 (a float32 subnormal); 0xFF is NaN */
MX_HD float mx_e8m0_value(uint32_t s) {
    if (s == MX_E8M0_NAN) return mx_bits_f32(MX_F32_CANONICAL_NAN);
    return s == 0 ? mx_bits_f32(0x00400000u) : mx_bits_f32(s << 23);
}

/* exact float32 2^e for e in [-149, 127] */
MX_HD float mx_pow2f(int e) {
    return e >= -126 ? mx_bits_f32((uint32_t)(e + 127) << 23) : mx_bits_f32(1u << (e + 149));
}

/* float32 value of an E4M3 byte (exact); NaN codes give the canonical NaN */
MX_HD float mx_e4m3_value(uint32_t q) {
    const uint32_t mag = q & 0x7Fu;
    if (mag == MX_E4M3_NAN_MAG) return mx_bits_f32(MX_F32_CANONICAL_NAN);
    const uint32_t ex = mag >> 3, man = mag & 7u;
    const float v = ex == 0 ? (float)man * MX_E4M3_MIN_SUBNORMAL : (float)(8u + man) * mx_pow2f((int)ex - 10);
    return (q & MX_E4M3_SIGN) ? -v : v;
}

/* mix32: ((x >> 16) ^ x) * MIX_MULT twice, then (x >> 16) ^ x -- a bijection on 32-bit words */
MX_HD uint32_t mx_rng_mix32(uint32_t x) {
    x = ((x >> 16) ^ x) * MX_RNG_MIX_MULT;
    x = ((x >> 16) ^ x) * MX_RNG_MIX_MULT;
    return (x >> 16) ^ x;
}

/* the random word of flat element index i under round keys (k2, k3) (mxfp8_codec.rng.stream_keys) */
MX_HD uint32_t mx_rng_word(uint64_t i, uint32_t k2, uint32_t k3) {
    return mx_rng_mix32(mx_rng_mix32((uint32_t)i ^ k2) ^ (uint32_t)(i >> 32) ^ k3);
}

/* round a non-negative exact grid coordinate t: RNE, or stochastic with 24 random bits r24 */
MX_HD float mx_round_grid(float t, int sr, uint32_t r24) {
    if (!sr) return rintf(t); /* half to even (default rounding mode) */
    const float fl = floorf(t);
    const float frac = (t - fl) * MX_SR_SCALE; /* exact */
    return fl + (((float)r24 < frac) ? 1.0f : 0.0f);
}

/* E4M3 byte of a float32 v (already scaled by 2^-e): grid rounding as described above, computed on the
 * bits.  For |v| >= 2^-6 the grid coordinate t = |v| / u is the float32 significand read with 3
 * fraction bits, so rounding t drops the low 20 mantissa bits f20: RNE adds 0x7FFFF plus the kept
 * bit's parity, stochastic rounding adds 0xFFFFF - (r24 >> 4) (a carry, i.e. rounding up, exactly when
 * (r24 >> 4) < f20, which is r24 < frac(t) * 2^24 since frac(t) * 2^24 = 16 * f20); a carry into the
 * exponent is the next binade.  Below 2^-6 (step 2^-9) t = |v| * 512 is rounded with mx_round_grid.
 * Saturates at 448 (0x7E), also for inf and NaN.  tests/mxfp8_codec/test_native_header.py checks it
 * against the float-grid formula over every exponent, 2^16 high mantissa patterns each, both modes. */
MX_HD uint32_t mx_e4m3_grid_code(float v, int sr, uint32_t r24) {
    const uint32_t bits = mx_f32_bits(v) & 0x7FFFFFFFu; /* |v| */
    uint32_t code;
    if (bits >= 0x3C800000u) { /* |v| >= 2^-6 = MX_E4M3_MIN_NORMAL */
        const uint32_t add = sr ? 0xFFFFFu - (r24 >> 4) : 0x7FFFFu + ((bits >> 20) & 1u);
        code = ((bits + add) >> 20) - ((127u - MX_E4M3_BIAS) << MX_E4M3_MANTISSA_BITS);
        code = code < MX_E4M3_MAX_CODE ? code : MX_E4M3_MAX_CODE;
    } else { /* n in 0..8; 8 * 2^-9 = 2^-6 is code 0x08 */
        code = (uint32_t)mx_round_grid(mx_bits_f32(bits) * 512.0f, sr, r24);
    }
    return code | ((mx_f32_bits(v) >> 24) & MX_E4M3_SIGN);
}

/* Encode one block v[0..len) (len <= 32, finite) with grid rounding; element i uses the random word
 * of flat index base + i.  Writes len codes and one scale byte. */
MX_HD void mx_encode_block_grid(const float *v, int len, uint64_t base, int sr, int rceil, uint32_t k2,
                                uint32_t k3, uint8_t *q, uint8_t *scale) {
    uint32_t amax = 0;
    for (int i = 0; i < len; ++i) {
        const uint32_t a = mx_f32_bits(v[i]) & 0x7FFFFFFFu;
        amax = a > amax ? a : amax;
    }
    const int32_t e = mx_scale_exp(amax, rceil);
    const float mul = mx_pow2f(-e);
    const float lim = e + MX_E8M0_BIAS == MX_TOP_CLAMP_SCALE_BYTE ? MX_TOP_CLAMP_VALUE : MX_E4M3_MAX;
    for (int i = 0; i < len; ++i) {
        float s = v[i] * mul; /* exact power-of-two scaling */
        s = s > lim ? lim : (s < -lim ? -lim : s);
        const uint32_t r24 = sr ? mx_rng_word(base + (uint64_t)i, k2, k3) >> (32 - MX_SR_BITS) : 0u;
        q[i] = (uint8_t)mx_e4m3_grid_code(s, sr, r24);
    }
    *scale = (uint8_t)(e + MX_E8M0_BIAS);
}

#endif /* MXFP8_H */
