// nvfp4_common.cuh -- device helpers shared by all kernels: RNG, grid rounding, E2M1/E4M3/UE8M0, loaders.
//
// Every helper mirrors a function of nvfp4_cuda/formats.py or mxfp8_codec operation for operation, so
// the kernels produce the reference's bits.  MXFP8's constants, scale rule and counter RNG are not
// written here: they come from mxfp8_codec/mxfp8.h (one C/CUDA spelling, checked against the Python
// constants by tests/mxfp8_codec/test_native_header.py; build.py passes -I to its directory).  The library is compiled with -fmad=false: no multiply-add
// is ever fused, and each float32 operation below rounds exactly once, like the PyTorch reference.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>
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
// NV_HD: also compiled for the host, where tests/nvfp4_cuda/test_device_math.py checks the fast spellings
// below against these reference spellings over every float32 bit pattern.
#define NV_HD __host__ __device__ __forceinline__

NV_HD float nv_round_grid(float t, bool stochastic, uint32_t r24) {
  if (!stochastic) return rintf(t);  // half to even
  float fl = floorf(t);
  float frac = (t - fl) * NVFP4_SR_SCALE;
  return fl + (((float)r24 < frac) ? 1.0f : 0.0f);
}

NV_HD float nv_pow2(int e) { return mx_pow2f(e); }  // exact 2**e for e in [-149, 127]

// ---- E2M1 (formats.e2m1_encode_grid) ---------------------------------------------------------------------
NV_HD uint32_t nv_e2m1_encode(float v, bool stochastic, uint32_t r24) {
  float a = fabsf(v);
  int region = (a >= 2.0f ? 1 : 0) + (a >= 4.0f ? 1 : 0);
  float inv_u = a < 2.0f ? 2.0f : (a < 4.0f ? 1.0f : 0.5f);
  float n = fminf(nv_round_grid(a * inv_u, stochastic, r24), 8.0f);
  int code = (int)n + 2 * region;
  code = code > 7 ? 7 : code;
  return (uint32_t)code | (signbit(v) ? 8u : 0u);
}

// The same code for RNE in about ten instructions (the kernels' hot path; nv_e2m1_encode, or seven
// compares against the grid's midpoints, cost about twice that).  With E = floor(log2 a) clamped to 0..3
// (a = |v|), the code is a / 2^(E - 1) rounded to an integer, plus 2E: E = 0, a < 2: round(2a), codes 0..4;
// E = 1: round(a) + 2, codes 4..6; E = 2: round(a / 2) + 4, codes 6, 7 (8 saturates); E = 3: 8 or more.
// The division by 2^(E - 1) is exact, and adding 2^23 rounds to an integer half to even in one FADD (the
// sum's bits minus 2^23's are the integer).  Inf and NaN (fmaxf gives 1.0 for it: E = 0) sum to bits far
// above 2^23's and saturate at 7, as in nv_e2m1_encode.
NV_HD uint32_t nv_e2m1_binade(float a) {  // float32 bits of 2^E, E = floor(log2 a) clamped to 0..3 (NaN: 0)
  return mx_f32_bits(fminf(fmaxf(a, 1.0f), 8.0f)) & 0x7F800000u;
}

// The code of v from n_bits = the float32 bits of n + 2^23 (n: the rounded grid coordinate) and its binade:
// n + 2E, saturated at 7, with v's sign.
NV_HD uint32_t nv_e2m1_code(uint32_t n_bits, uint32_t binade, float v) {
  const uint32_t code = n_bits + (binade >> 22) - (0x4B000000u + 254u);  // (binade >> 22) - 254 = 2E
  return (code < 7u ? code : 7u) | ((mx_f32_bits(v) >> 28) & 8u);
}

NV_HD uint32_t nv_e2m1_encode_rne(float v) {
  const float a = fabsf(v);
  const uint32_t p = nv_e2m1_binade(a);
  return nv_e2m1_code(mx_f32_bits(a * mx_bits_f32(0x7F800000u - p) + 8388608.0f), p, v);  // a * 2^(1-E) + 2^23
}

// The same code for stochastic rounding, with nv_e2m1_encode_rne's scaling: x = a / 2^(E - 1) is the grid
// coordinate of the binade (exact); floor(x) + 2^23 is one add of 2^23 rounding toward zero on the device
// (floorf + the add on the host: the same value for 0 <= x < 2^23, and anything larger saturates either
// way); x rounds up when r24 < frac(x) * 2^24, as in nv_round_grid; the code comes from the float's bits.
// Conversions (F2I, I2F, FRND) issue at 1/8 of the float32 rate on sm_90: nv_e2m1_encode has three per
// element, this one the random word's.
NV_HD uint32_t nv_e2m1_encode_sr(float v, uint32_t r24) {
  const float a = fabsf(v);
  const uint32_t p = nv_e2m1_binade(a);
  const float x = a * mx_bits_f32(0x7F800000u - p);  // a * 2^(1 - E)
#ifdef __CUDA_ARCH__
  const float fl = __fadd_rz(x, 8388608.0f);  // floor(x) + 2^23
#else
  const float fl = floorf(x) + 8388608.0f;
#endif
  const uint32_t up = (float)r24 < (x - (fl - 8388608.0f)) * NVFP4_SR_SCALE;
  return nv_e2m1_code(mx_f32_bits(fl) + up, p, v);
}

// ---- E4M3 (formats.e4m3_round / e4m3_decode; the block scale of NVFP4 uses nv_e4m3x2_* below) ------------
__device__ __forceinline__ uint32_t nv_e4m3_encode(float v, bool stochastic, uint32_t r24) {
  return mx_e4m3_grid_code(v, stochastic, r24);  // the same rounding on the float32 bits (mxfp8.h)
}

__device__ __forceinline__ float nv_e4m3_decode(uint32_t b) { return mx_e4m3_value(b); }

// Two E4M3 bytes (bits 0-7: the first element, 8-15: the second) -> their float32 values, exact: on sm_89 and
// later one cvt.rn.f16x2.e4m3x2 and two f16 -> f32 conversions (cuda_fp8.h's software path elsewhere and on
// the host), where nv_e4m3_decode costs about a dozen instructions and two branches per element.  Every
// E4M3 value is a float16.  A NaN code gives a NaN of unspecified sign and payload (nv_e4m3_decode: the
// canonical one). Used where that cannot matter: the Lion step (any NaN marks the whole block non-finite),
// the NVFP4 block scale (never a NaN code) and the MXFP8-input quantize (a NaN master element -- a block a
// failed Lion step marked -- has no reference value: the reference raises, the kernel cannot).
NV_HD float2 nv_e4m3x2_value(uint32_t two) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(two & 0xFFFFu), __NV_E4M3);
  return __half22float2(__half2(h));
}

// E4M3 codes (bits 0-7 and 8-15) of two float32 values, RNE, saturating at +-448: one
// cvt.rn.satfinite.e4m3x2.f32 on sm_89 and later.  Equal to nv_e4m3_encode(v, false, 0) for every float32
// but NaN (which gives 0x7F here, 0x7E there; the kernels never encode a NaN: a non-finite block is written
// as NaN separately).  tests/nvfp4_cuda/test_device_math.py checks both helpers over every input on the host.
NV_HD uint32_t nv_e4m3x2_encode_rne(float first, float second) {
  return __nv_cvt_float2_to_fp8x2(make_float2(first, second), __NV_SATFINITE, __NV_E4M3);
}

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

// 16 consecutive elements (r, c0 .. c0+15) of a row-major [rows, cols] input with 16-byte loads (cols % 16
// == 0, c0 % 16 == 0, x 16-byte aligned): bf16 two uint4, f32 four float4, MXFP8 one uint4 of payload.
__device__ __forceinline__ void nv_load16_vec(const void *x, int dtype, const uint8_t *x_scales, int64_t cols,
                                              int64_t r, int64_t c0, float *y) {
  const int64_t idx = r * cols + c0;
  if (dtype == 1) {
    const uint4 *p = reinterpret_cast<const uint4 *>(static_cast<const __nv_bfloat16 *>(x) + idx);
    const uint4 a = p[0], b = p[1];
    const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      y[2 * i] = __uint_as_float(w[i] << 16);
      y[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
    }
  } else if (dtype == 0) {
    const float4 *p = reinterpret_cast<const float4 *>(static_cast<const float *>(x) + idx);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float4 v = p[i];
      y[4 * i] = v.x;
      y[4 * i + 1] = v.y;
      y[4 * i + 2] = v.z;
      y[4 * i + 3] = v.w;
    }
  } else {  // MXFP8 (the trainer's weights): E4M3 pairs through one hardware conversion each (sm_89+)
    const uint4 q = *reinterpret_cast<const uint4 *>(static_cast<const uint8_t *>(x) + idx);
    const uint32_t w[4] = {q.x, q.y, q.z, q.w};
    const int64_t sidx = cols % 32 == 0 ? idx >> 5 : r * ((cols + 31) / 32) + c0 / 32;  // the block's scale
    const float sdec = nv_e8m0_decode(x_scales[sidx]);
#pragma unroll
    for (int i = 0; i < 16; i += 2) {
      const float2 d = nv_e4m3x2_value((w[i / 4] >> (8 * (i % 4))) & 0xFFFFu);
      y[i] = d.x * sdec;
      y[i + 1] = d.y * sdec;
    }
  }
}

// BF16 bits of an E2M1 code's value (bit 3 = sign): magnitude code 1 is 0.5 (0x3F00), and from code 2 on
// (1, 1.5, 2, 3, 4, 6) each code adds one BF16 step of a 1-bit mantissa, 0x40: 0x3F00 + 0x40 * code.
NV_HD uint32_t nv_e2m1_bf16_bits(uint32_t code) {
  const uint32_t mag = code & 7u;
  return (mag < 2u ? (mag ? 0x3F00u : 0u) : 0x3F00u + 0x40u * mag) | ((code & 8u) << 12);
}

// Decoding to BF16 two elements at a time: tab[byte] holds the BF16 values of the byte's two E2M1 codes
// (low nibble in the low half), built once per CUDA block in shared memory; one bf16x2 multiply by the
// block scale then gives both exact products e2m1 * e4m3 (at most 6 significant bits: any correctly
// rounded multiply returns them exactly), about a third of the instructions of building each value.
// One entry per thread: the kernels that use it (quantize with DECODED, nv_decode_bf16_kernel) run exactly
// 256 threads per CUDA block.
__device__ __forceinline__ void nv_e2m1_pair_table(uint32_t *tab, int tid) {
  tab[tid] = nv_e2m1_bf16_bits((uint32_t)tid & 15u) | (nv_e2m1_bf16_bits((uint32_t)tid >> 4) << 16);
}

__device__ __forceinline__ uint32_t nv_scaled_pair(uint32_t pair_bits, __nv_bfloat162 sf2) {
  __nv_bfloat162 v = __hmul2(*reinterpret_cast<const __nv_bfloat162 *>(&pair_bits), sf2);
  return *reinterpret_cast<const uint32_t *>(&v);
}

// The 16 elements (r, 16 cb .. 16 cb + 15) of the logical matrix of a transposed input stored [valid_cols, rows]:
// stored elements (16 cb + i, r), one stride of ``rows`` apart, zeros from valid_cols on.  BF16 (the trainer's
// activations and gradients) with one pointer stepped by the stride; other dtypes through nv_load.
__device__ __forceinline__ void nv_load16_transposed(const void *x, int dtype, const uint8_t *x_scales, int64_t rows,
                                                     int64_t valid_cols, int64_t r, int64_t cb, float *y) {
  const int64_t left = valid_cols - cb * 16;
  const int n = left < 16 ? (int)left : 16;  // valid elements of this block (16 but in the last)
  if (dtype == 1) {
    const unsigned short *p = static_cast<const unsigned short *>(x) + cb * 16 * rows + r;
#pragma unroll
    for (int i = 0; i < 16; ++i, p += rows) y[i] = i < n ? __uint_as_float((uint32_t)*p << 16) : 0.0f;
  } else {
#pragma unroll
    for (int i = 0; i < 16; ++i) y[i] = i < n ? nv_load(x, dtype, x_scales, rows, cb * 16 + i, r) : 0.0f;
  }
}

// 16-point random Hadamard transform in registers, fixed butterfly order (reference.hadamard16).
// The signs are bits of a constant (bit i set: element i is multiplied by -1), not an array: in a
// grid-stride loop the compiler hoisted an array of 16 floats to the stack and re-read it every iteration.
#define NV_HADAMARD_NEG 0xD7E8u  // TE's sign vector {1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1}
__device__ __forceinline__ void nv_hadamard16(float *y) {
#pragma unroll
  for (int i = 0; i < 16; ++i) y[i] = y[i] * (((NV_HADAMARD_NEG >> i) & 1u) ? -1.0f : 1.0f);
#pragma unroll
  for (int s = 0; s < 4; ++s) {  // stride h = 2^s; the 8 pairs (j, j + h) of a stage are independent
    const int h = 1 << s;
#pragma unroll
    for (int p = 0; p < 8; ++p) {
      const int j = ((p >> s) << (s + 1)) | (p & (h - 1));
      const float a = y[j], b = y[j + h];
      y[j] = a + b;
      y[j + h] = a - b;
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

// ---- launch helpers (host) -------------------------------------------------------------------------
// A grid-stride kernel's 1-D grid: ceil(work / threads) CUDA blocks, at least 1, at most 65535 * 8.
static inline unsigned int nv_grid(int64_t work, int threads) {
  int64_t g = (work + threads - 1) / threads;
  if (g < 1) g = 1;
  if (g > 65535 * 8) g = 65535 * 8;
  return (unsigned int)g;
}

// A grid-stride kernel's grid: at most the CUDA blocks the device holds at once (one wave, no partly filled
// last wave), never more than ``grid``. The occupancy query runs once per kernel (the first device's answer).
template <auto KERNEL>
static inline unsigned int nv_one_wave(unsigned int grid, int threads) {
  static int resident = 0;  // CUDA blocks of KERNEL in one wave (0: not asked yet)
  if (resident == 0) {
    int dev = 0, sms = 0, per_sm = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, KERNEL, threads, 0) != cudaSuccess || sms * per_sm < 1) {
      (void)cudaGetLastError();  // (a failed query leaves the grid as it was)
      return grid;
    }
    resident = sms * per_sm;
  }
  return grid < (unsigned int)resident ? grid : (unsigned int)resident;
}
