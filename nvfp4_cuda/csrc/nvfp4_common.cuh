// nvfp4_common.cuh -- device helpers shared by all kernels: RNG, grid rounding, E2M1/E4M3/UE8M0, loaders.
//
// Every helper mirrors a function of nvfp4_cuda/formats.py or mxfp8_codec operation for operation, so
// the kernels produce the reference's bits.  MXFP8's constants, scale rule and counter RNG are not
// written here: they come from mxfp8_codec/mxfp8.h (one C/CUDA spelling, checked against the Python
// constants by tests/mxfp8_codec/test_native_header.py; build.py passes -I to its directory).  The library is compiled with -fmad=false: no multiply-add
// is ever fused, and each float32 operation below rounds exactly once, like the PyTorch reference.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "mxfp8.h"

#define NVFP4_FLT_MAX 3.402823466e+38f
#define NVFP4_ONE_SIXTH 0.16666667163372040f  // fp32(1/6)
#define NVFP4_SR_SCALE MX_SR_SCALE            // 2**24

// ---- counter RNG (mxfp8_codec/rng.py; mx_rng_word in mxfp8.h) -------------------------------------------
__device__ __forceinline__ uint32_t nv_word(uint64_t index, uint32_t key2, uint32_t key3) {
  return mx_rng_word(index, key2, key3);
}

__device__ __forceinline__ uint32_t nv_rand24(uint64_t index, uint32_t key2, uint32_t key3) {
  return mx_rng_word(index, key2, key3) >> (32 - MX_SR_BITS);
}

// ---- grid rounding (formats.round_to_grid) -------------------------------------------------------------
__device__ __forceinline__ float nv_round_grid(float t, bool stochastic, uint32_t r24) {
  if (!stochastic) return rintf(t);  // half to even
  float fl = floorf(t);
  float frac = (t - fl) * NVFP4_SR_SCALE;
  return fl + (((float)r24 < frac) ? 1.0f : 0.0f);
}

__device__ __forceinline__ float nv_pow2(int e) {  // exact 2**e for e in [-149, 127]
  if (e >= -126) return __uint_as_float((uint32_t)(e + 127) << 23);
  return __uint_as_float(1u << (e + 149));
}

// ---- E2M1 (formats.e2m1_encode_grid) ---------------------------------------------------------------------
__device__ __forceinline__ uint32_t nv_e2m1_encode(float v, bool stochastic, uint32_t r24) {
  float a = fabsf(v);
  int region = (a >= 2.0f ? 1 : 0) + (a >= 4.0f ? 1 : 0);
  float inv_u = a < 2.0f ? 2.0f : (a < 4.0f ? 1.0f : 0.5f);
  float n = fminf(nv_round_grid(a * inv_u, stochastic, r24), 8.0f);
  int code = (int)n + 2 * region;
  code = code > 7 ? 7 : code;
  return (uint32_t)code | (signbit(v) ? 8u : 0u);
}

__constant__ float kE2M1Values[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                      -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// ---- E4M3 (formats.e4m3_round / e4m3_bits_from_grid / e4m3_decode) ---------------------------------------
__device__ __forceinline__ float nv_e4m3_round(float a, bool stochastic, uint32_t r24) {  // a >= 0
  int e = (int)((__float_as_uint(a) >> 23) & 0xFF) - 127;
  int ue = (a >= 0.015625f) ? e - 3 : -9;
  float t = a * nv_pow2(-ue);
  float n = nv_round_grid(t, stochastic, r24);
  return fminf(n * nv_pow2(ue), 448.0f);
}

__device__ __forceinline__ uint32_t nv_e4m3_bits_from_grid(float q) {  // q >= 0 on the E4M3 grid
  uint32_t b = __float_as_uint(q);
  if (q >= 0.015625f) {
    int e = (int)((b >> 23) & 0xFF) - 127;
    return ((uint32_t)(e + 7) << 3) | ((b >> 20) & 0x7);
  }
  return (uint32_t)(q * 512.0f);
}

__device__ __forceinline__ uint32_t nv_e4m3_encode(float v, bool stochastic, uint32_t r24) {
  float q = nv_e4m3_round(fabsf(v), stochastic, r24);
  return nv_e4m3_bits_from_grid(q) | (signbit(v) ? 0x80u : 0u);
}

__device__ __forceinline__ float nv_e4m3_decode(uint32_t b) { return mx_e4m3_value(b); }

// ---- UE8M0 and the MXFP8 RCEIL rule: mxfp8.h's mx_e8m0_value / mx_scale_exp ---------------------------------
__device__ __forceinline__ float nv_e8m0_decode(uint32_t s) { return mx_e8m0_value(s); }

__device__ __forceinline__ int nv_rceil_exponent(float amax) {  // amax >= 0, finite
  return mx_scale_exp(__float_as_uint(amax), 1);
}

// ---- loaders -----------------------------------------------------------------------------------------------
__device__ __forceinline__ float nv_load(const void *x, int dtype, const uint8_t *x_scales, int64_t stored_cols,
                                         int64_t srow, int64_t scol) {
  int64_t idx = srow * stored_cols + scol;
  if (dtype == 0) return ((const float *)x)[idx];
  if (dtype == 1) return __bfloat162float(((const __nv_bfloat16 *)x)[idx]);
  int64_t nb = (stored_cols + 31) / 32;
  float v = nv_e4m3_decode(((const uint8_t *)x)[idx]);
  return v * nv_e8m0_decode(x_scales[srow * nb + scol / 32]);
}

// Element (r, c) of the logical [rows, cols] matrix (transpose: stored as [cols, rows]).
__device__ __forceinline__ float nv_load_logical(const void *x, int dtype, const uint8_t *x_scales, int64_t rows,
                                                 int64_t cols, int transpose, int64_t r, int64_t c) {
  return transpose ? nv_load(x, dtype, x_scales, rows, c, r) : nv_load(x, dtype, x_scales, cols, r, c);
}

// 16-point random Hadamard transform in registers, fixed butterfly order (reference.hadamard16).
__device__ __forceinline__ void nv_hadamard16(float *y) {
  const float s[16] = {1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1};
#pragma unroll
  for (int i = 0; i < 16; ++i) y[i] = y[i] * s[i];
#pragma unroll
  for (int h = 1; h < 16; h *= 2) {
#pragma unroll
    for (int g = 0; g < 16; g += 2 * h) {
#pragma unroll
      for (int j = g; j < g + h; ++j) {
        float a = y[j], b = y[j + h];
        y[j] = a + b;
        y[j + h] = a - b;
      }
    }
  }
#pragma unroll
  for (int i = 0; i < 16; ++i) y[i] = y[i] * 0.25f;
}

__device__ __forceinline__ void nv_store(void *out, int out_dtype, int64_t idx, float v) {
  if (out_dtype == 0)
    ((float *)out)[idx] = v;
  else
    ((__nv_bfloat16 *)out)[idx] = __float2bfloat16_rn(v);
}
