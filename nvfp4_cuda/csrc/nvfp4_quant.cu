// nvfp4_quant.cu -- amax, NVFP4 quantize (1x16 / 16x16, RNE / SR, optional Hadamard, transposed input),
// dequantize and the standalone Hadamard transform.  Semantics: nvfp4_cuda/reference.py.
//
// Thread layout of the quantizer: a CUDA block is 16 x 16 threads; threadIdx.y is the row inside a
// 16-row tile, threadIdx.x indexes 16 consecutive 16-element column blocks.  Each thread owns one
// 1x16 block (its 16 values live in registers), so the 16x16 tile amax is a shared-memory max over
// threadIdx.y.  Scales follow Transformer Engine's float32 op order exactly (see reference.py).
#include "nvfp4_common.cuh"

__global__ void nv_zero_f32(float *p) { *p = 0.0f; }

// Per-tensor amax of |x| (after the optional Hadamard transform): atomicMax on the bit pattern,
// valid because non-negative floats order like their unsigned bits.
__global__ void nv_amax_kernel(const void *x, int dtype, const uint8_t *x_scales, int64_t rows, int64_t cols,
                               int transpose, int hadamard, float *amax_out) {
  const int64_t nblk = rows * (cols / 16);
  float m = 0.0f;
  for (int64_t b = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; b < nblk; b += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = b / (cols / 16), c0 = (b % (cols / 16)) * 16;
    float y[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) y[i] = nv_load_logical(x, dtype, x_scales, rows, cols, transpose, r, c0 + i);
    if (hadamard) nv_hadamard16(y);
#pragma unroll
    for (int i = 0; i < 16; ++i) m = fmaxf(m, fabsf(y[i]));
  }
  for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, off));
  if ((threadIdx.x & 31) == 0) atomicMax((unsigned int *)amax_out, __float_as_uint(m));
}

__device__ __forceinline__ void nv_tensor_scales(float amax, float *s_enc, float *s_dec) {
  float se = 2688.0f / amax;
  se = fminf(se, NVFP4_FLT_MAX);
  if (amax == 0.0f || se == 0.0f) se = 1.0f;
  *s_enc = se;
  *s_dec = 1.0f / se;
}

__global__ void nv_quantize_kernel(const void *x, int dtype, const uint8_t *x_scales, int64_t rows, int64_t cols,
                                   int transpose, int hadamard, int block_2d, int rounding, uint32_t key2,
                                   uint32_t key3, const float *amax_p, uint8_t *codes, uint8_t *block_scales,
                                   float *tensor_scale) {
  __shared__ float tile_amax[16][16];
  const int64_t ncb = cols / 16;
  const int64_t r = (int64_t)blockIdx.y * 16 + threadIdx.y;
  const int64_t cb = (int64_t)blockIdx.x * 16 + threadIdx.x;
  const bool active = r < rows && cb < ncb;
  float y[16];
  float bam = 0.0f;
  if (active) {
#pragma unroll
    for (int i = 0; i < 16; ++i) y[i] = nv_load_logical(x, dtype, x_scales, rows, cols, transpose, r, cb * 16 + i);
    if (hadamard) nv_hadamard16(y);
#pragma unroll
    for (int i = 0; i < 16; ++i) bam = fmaxf(bam, fabsf(y[i]));
  }
  if (block_2d) {
    tile_amax[threadIdx.y][threadIdx.x] = bam;
    __syncthreads();
    float t = 0.0f;
    for (int i = 0; i < 16; ++i) t = fmaxf(t, tile_amax[i][threadIdx.x]);
    bam = t;
  }
  if (!active) return;
  float s_enc, s_dec;
  nv_tensor_scales(*amax_p, &s_enc, &s_dec);
  if (r == 0 && cb == 0) *tensor_scale = s_dec;
  float sf_f = fminf(bam * (s_enc * NVFP4_ONE_SIXTH), 448.0f);
  float sf = nv_e4m3_round(sf_f, false, 0);
  float enc = fminf(1.0f / (sf * s_dec), NVFP4_FLT_MAX);
  block_scales[r * ncb + cb] = (uint8_t)nv_e4m3_bits_from_grid(sf);
  const bool sr = rounding == 1;
  uint32_t lo = 0, hi = 0;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    uint64_t idx = (uint64_t)(r * cols + cb * 16 + i);
    uint32_t rnd = sr ? nv_rand24(idx, key2, key3) : 0u;
    uint32_t code = nv_e2m1_encode(y[i] * enc, sr, rnd);
    if (i < 8)
      lo |= code << (4 * i);
    else
      hi |= code << (4 * (i - 8));
  }
  uint2 packed = make_uint2(lo, hi);  // bytes little-endian: element 2j in the low nibble of byte j
  *reinterpret_cast<uint2 *>(codes + r * (cols / 2) + cb * 8) = packed;
}

__global__ void nv_dequantize_kernel(const uint8_t *codes, const uint8_t *block_scales, const float *tensor_scale,
                                     int64_t rows, int64_t cols, void *out, int out_dtype) {
  const int64_t n = rows * cols;
  const float ts = *tensor_scale;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = i / cols, c = i % cols;
    uint32_t byte = codes[r * (cols / 2) + c / 2];
    uint32_t code = (c & 1) ? (byte >> 4) : (byte & 0xF);
    float v = kE2M1Values[code] * nv_e4m3_decode(block_scales[r * (cols / 16) + c / 16]);
    nv_store(out, out_dtype, i, v * ts);
  }
}

__global__ void nv_hadamard_kernel(const void *x, int dtype, int64_t rows, int64_t cols, float *out) {
  const int64_t nblk = rows * (cols / 16);
  for (int64_t b = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; b < nblk; b += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = b / (cols / 16), c0 = (b % (cols / 16)) * 16;
    float y[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) y[i] = nv_load(x, dtype, nullptr, cols, r, c0 + i);
    nv_hadamard16(y);
#pragma unroll
    for (int i = 0; i < 16; ++i) out[r * cols + c0 + i] = y[i];
  }
}

static unsigned int nv_grid_1d(int64_t work, int threads) {
  int64_t g = (work + threads - 1) / threads;
  if (g < 1) g = 1;
  if (g > 65535 * 8) g = 65535 * 8;
  return (unsigned int)g;
}

cudaError_t nv_launch_amax(const void *x, int dtype, const uint8_t *xs, int64_t rows, int64_t cols, int transpose,
                           int hadamard, float *amax, cudaStream_t st) {
  nv_zero_f32<<<1, 1, 0, st>>>(amax);
  int64_t nblk = rows * (cols / 16);
  nv_amax_kernel<<<nv_grid_1d(nblk, 256), 256, 0, st>>>(x, dtype, xs, rows, cols, transpose, hadamard, amax);
  return cudaGetLastError();
}

cudaError_t nv_launch_quantize(const void *x, int dtype, const uint8_t *xs, int64_t rows, int64_t cols, int transpose,
                               int hadamard, int block_2d, int rounding, uint32_t key2, uint32_t key3,
                               const float *amax, uint8_t *codes, uint8_t *scales, float *ts, cudaStream_t st) {
  if (rows == 0 || cols == 0) return cudaSuccess;  // nothing to launch (a 0-sized grid is a launch error)
  dim3 block(16, 16);
  dim3 grid((unsigned int)((cols / 16 + 15) / 16), (unsigned int)((rows + 15) / 16));
  nv_quantize_kernel<<<grid, block, 0, st>>>(x, dtype, xs, rows, cols, transpose, hadamard, block_2d, rounding, key2,
                                             key3, amax, codes, scales, ts);
  return cudaGetLastError();
}

cudaError_t nv_launch_dequantize(const uint8_t *codes, const uint8_t *scales, const float *ts, int64_t rows,
                                 int64_t cols, void *out, int out_dtype, cudaStream_t st) {
  nv_dequantize_kernel<<<nv_grid_1d(rows * cols, 256), 256, 0, st>>>(codes, scales, ts, rows, cols, out, out_dtype);
  return cudaGetLastError();
}

cudaError_t nv_launch_hadamard(const void *x, int dtype, int64_t rows, int64_t cols, float *out, cudaStream_t st) {
  nv_hadamard_kernel<<<nv_grid_1d(rows * (cols / 16), 256), 256, 0, st>>>(x, dtype, rows, cols, out);
  return cudaGetLastError();
}
