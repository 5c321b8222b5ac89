// nvfp4_master.cu -- MXFP8 encode/decode (RCEIL, RNE or stochastic), the fused Lion step on an MXFP8
// master, and float32 -> bfloat16 stochastic rounding.  Semantics: nvfp4_cuda/reference_master.py.
//
// One thread owns one 32-element MXFP8 block (values in registers), so the block scale can be
// recomputed after the update without a second pass.  Difference from the reference, by design: the
// reference raises on non-finite values; a kernel cannot raise without a host sync, so it writes the
// block as NaN (scale byte 0xFF, codes 0x7F), which decodes to NaN and is visible to the caller.
#include "nvfp4_common.cuh"

#define NV_MX MX_BLOCK_SIZE

// Encode v[0..len) (block j of row r) into payload / scales with the codec's rules.
__device__ __forceinline__ void nv_mx_encode_block(const float *v, int len, bool bad, int64_t r, int64_t j,
                                                   int64_t cols, bool sr, uint32_t key2, uint32_t key3,
                                                   uint8_t *payload, uint8_t *scales) {
  const int64_t nb = (cols + NV_MX - 1) / NV_MX, base = r * cols + j * NV_MX;
  if (bad) {
    for (int i = 0; i < len; ++i) payload[base + i] = MX_E4M3_NAN_MAG;
    scales[r * nb + j] = MX_E8M0_NAN;
    return;
  }
  float amax = 0.0f;
  for (int i = 0; i < len; ++i) amax = fmaxf(amax, fabsf(v[i]));
  const int e = nv_rceil_exponent(amax);
  const float mul = nv_pow2(-e);
  const bool top = e + MX_E8M0_BIAS == MX_TOP_CLAMP_SCALE_BYTE;  // codec's top-of-range rule: saturate at 240
  for (int i = 0; i < len; ++i) {
    float s = v[i] * mul;
    if (top) s = fmaxf(fminf(s, MX_TOP_CLAMP_VALUE), -MX_TOP_CLAMP_VALUE);
    uint64_t idx = (uint64_t)(base + i);
    payload[idx] = (uint8_t)nv_e4m3_encode(s, sr, sr ? nv_rand24(idx, key2, key3) : 0u);
  }
  scales[r * nb + j] = (uint8_t)(e + MX_E8M0_BIAS);
}

__global__ void nv_mxfp8_encode_kernel(const void *x, int dtype, int64_t rows, int64_t cols, int rounding,
                                       uint32_t key2, uint32_t key3, uint8_t *payload, uint8_t *scales) {
  const int64_t nb = (cols + NV_MX - 1) / NV_MX, total = rows * nb;
  for (int64_t b = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; b < total; b += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = b / nb, j = b % nb;
    const int len = (int)((cols - j * NV_MX) < NV_MX ? (cols - j * NV_MX) : NV_MX);
    float v[NV_MX];
    bool bad = false;
    for (int i = 0; i < len; ++i) {
      v[i] = nv_load(x, dtype, nullptr, cols, r, j * NV_MX + i);
      bad |= !isfinite(v[i]);
    }
    nv_mx_encode_block(v, len, bad, r, j, cols, rounding == 1, key2, key3, payload, scales);
  }
}

__global__ void nv_mxfp8_decode_kernel(const uint8_t *payload, const uint8_t *scales, int64_t rows, int64_t cols,
                                       void *out, int out_dtype) {
  const int64_t n = rows * cols, nb = (cols + NV_MX - 1) / NV_MX;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    float v = nv_e4m3_decode(payload[i]) * nv_e8m0_decode(scales[r * nb + c / NV_MX]);
    nv_store(out, out_dtype, i, v);
  }
}

__global__ void nv_lion_kernel(uint8_t *payload, uint8_t *scales, const void *grad, int grad_dtype,
                               __nv_bfloat16 *momentum, float *comp, int64_t rows, int64_t cols, float neg_lr,
                               float decay, float b1, float omb1, float b2, float omb2, int writeback, uint32_t key2,
                               uint32_t key3) {
  const int64_t nb = (cols + NV_MX - 1) / NV_MX, total = rows * nb;
  for (int64_t b = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; b < total; b += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = b / nb, j = b % nb, base = r * cols + j * NV_MX;
    const int len = (int)((cols - j * NV_MX) < NV_MX ? (cols - j * NV_MX) : NV_MX);
    const float sdec = nv_e8m0_decode(scales[r * nb + j]);
    float v[NV_MX];
    bool bad = false;
    for (int i = 0; i < len; ++i) {
      const int64_t idx = base + i;
      float w = nv_e4m3_decode(payload[idx]) * sdec;
      const float g = nv_load(grad, grad_dtype, nullptr, cols, r, j * NV_MX + i);
      const float m = __bfloat162float(momentum[idx]);
      const float c = (m * b1) + (g * omb1);
      const float upd = c > 0.0f ? neg_lr : (c < 0.0f ? -neg_lr : 0.0f);
      if (writeback == 2) w = w + comp[idx];
      v[i] = (w * decay) + upd;
      bad |= !isfinite(v[i]);
      momentum[idx] = __float2bfloat16_rn((m * b2) + (g * omb2));
    }
    nv_mx_encode_block(v, len, bad, r, j, cols, writeback == 0, key2, key3, payload, scales);
    if (writeback == 2) {
      const float snew = nv_e8m0_decode(scales[r * nb + j]);
      for (int i = 0; i < len; ++i) comp[base + i] = v[i] - nv_e4m3_decode(payload[base + i]) * snew;
    }
  }
}

__global__ void nv_sr_bf16_kernel(__nv_bfloat16 *dst, const float *src, int64_t n, uint32_t key2, uint32_t key3) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const float x = src[i];
    const uint32_t bits = __float_as_uint(x);
    uint32_t hi;
    if (isfinite(x))
      hi = (bits + (nv_word((uint64_t)i, key2, key3) >> 16)) >> 16;
    else
      hi = (bits >> 16) | (isnan(x) ? 0x40u : 0u);
    dst[i] = __ushort_as_bfloat16((unsigned short)(hi & 0xFFFF));
  }
}

static unsigned int nv_grid(int64_t work, int threads) {
  int64_t g = (work + threads - 1) / threads;
  if (g < 1) g = 1;
  if (g > 65535 * 8) g = 65535 * 8;
  return (unsigned int)g;
}

cudaError_t nv_launch_mxfp8_encode(const void *x, int dtype, int64_t rows, int64_t cols, int rounding, uint32_t k2,
                                   uint32_t k3, uint8_t *payload, uint8_t *scales, cudaStream_t st) {
  int64_t blocks = rows * ((cols + NV_MX - 1) / NV_MX);
  nv_mxfp8_encode_kernel<<<nv_grid(blocks, 128), 128, 0, st>>>(x, dtype, rows, cols, rounding, k2, k3, payload, scales);
  return cudaGetLastError();
}

cudaError_t nv_launch_mxfp8_decode(const uint8_t *payload, const uint8_t *scales, int64_t rows, int64_t cols,
                                   void *out, int out_dtype, cudaStream_t st) {
  nv_mxfp8_decode_kernel<<<nv_grid(rows * cols, 256), 256, 0, st>>>(payload, scales, rows, cols, out, out_dtype);
  return cudaGetLastError();
}

cudaError_t nv_launch_lion(uint8_t *payload, uint8_t *scales, const void *grad, int grad_dtype, __nv_bfloat16 *mom,
                           float *comp, int64_t rows, int64_t cols, float neg_lr, float decay, float b1, float omb1,
                           float b2, float omb2, int writeback, uint32_t k2, uint32_t k3, cudaStream_t st) {
  int64_t blocks = rows * ((cols + NV_MX - 1) / NV_MX);
  nv_lion_kernel<<<nv_grid(blocks, 128), 128, 0, st>>>(payload, scales, grad, grad_dtype, mom, comp, rows, cols,
                                                       neg_lr, decay, b1, omb1, b2, omb2, writeback, k2, k3);
  return cudaGetLastError();
}

cudaError_t nv_launch_sr_bf16(__nv_bfloat16 *dst, const float *src, int64_t n, uint32_t k2, uint32_t k3,
                              cudaStream_t st) {
  nv_sr_bf16_kernel<<<nv_grid(n, 256), 256, 0, st>>>(dst, src, n, k2, k3);
  return cudaGetLastError();
}
