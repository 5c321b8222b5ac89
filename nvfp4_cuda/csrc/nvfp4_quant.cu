// nvfp4_quant.cu -- amax, NVFP4 quantize (1x16 / 16x16, RNE / SR, optional Hadamard, transposed input),
// dequantize and the standalone Hadamard transform.  Semantics: nvfp4_cuda/reference.py.
//
// Thread layout of the quantizer: a CUDA block is 16 x 16 threads; threadIdx.y is the row inside a
// 16-row tile, threadIdx.x indexes 16 consecutive 16-element column blocks.  Each thread owns one
// 1x16 block (its 16 values live in registers), so the 16x16 tile amax is a shared-memory max over
// threadIdx.y.  Scales follow Transformer Engine's float32 op order exactly (see reference.py).
//
// Speed: both passes are bound by memory bandwidth.  A row-major input whose pointer is 16-byte aligned
// is read with 16-byte loads (``vec``; nv_load16_vec), anything else (a transposed input, an odd view)
// element by element; the amax pass reduces each CUDA block in shared memory and issues one atomicMax
// per block, on a grid of a few blocks per multiprocessor (one atomic per warp on one address
// serialised in L2 and cost more than the pass itself).
#include "nvfp4_common.cuh"

__global__ void nv_zero_f32(float *p) { *p = 0.0f; }

// Per-tensor amax of |x| (after the optional Hadamard transform): a block-wide max, then one atomicMax on
// the bit pattern per block, valid because non-negative floats order like their unsigned bits.
__global__ void nv_amax_kernel(const void *x, int dtype, const uint8_t *x_scales, int64_t rows, int64_t cols,
                               int transpose, int hadamard, int vec, float *amax_out) {
  __shared__ float warp_max[32];
  const int64_t nbc = cols / 16, nblk = rows * nbc;
  float m = 0.0f;
  for (int64_t b = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; b < nblk; b += (int64_t)gridDim.x * blockDim.x) {
    float y[16];
    if (vec && dtype != 2) {  // row-major float input: block b is elements 16b .. 16b+15, no division
      nv_load16_vec(x, dtype, x_scales, 16, b, 0, y);
    } else if (vec) {
      nv_load16_vec(x, dtype, x_scales, cols, b / nbc, (b % nbc) * 16, y);
    } else {
      const int64_t r = b / nbc, c0 = (b % nbc) * 16;
#pragma unroll
      for (int i = 0; i < 16; ++i) y[i] = nv_load_logical(x, dtype, x_scales, rows, cols, transpose, r, c0 + i);
    }
    if (hadamard) nv_hadamard16(y);
#pragma unroll
    for (int i = 0; i < 16; ++i) m = fmaxf(m, fabsf(y[i]));
  }
  for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, off));
  const int warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  if ((threadIdx.x & 31) == 0) warp_max[warp] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < nwarps; ++w) m = fmaxf(m, warp_max[w]);
    atomicMax((unsigned int *)amax_out, __float_as_uint(m));
  }
}

__device__ __forceinline__ void nv_tensor_scales(float amax, float *s_enc, float *s_dec) {
  float se = 2688.0f / amax;
  se = fminf(se, NVFP4_FLT_MAX);
  if (amax == 0.0f || se == 0.0f) se = 1.0f;
  *s_enc = se;
  *s_dec = 1.0f / se;
}

// decoded != nullptr: instead of codes and block scales, write each element's exact value e2m1 * e4m3(scale)
// as BF16 (what nv_decode_bf16_kernel would make of them), for a GEMM operand whose codes nobody needs.
__global__ void nv_quantize_kernel(const void *x, int dtype, const uint8_t *x_scales, int64_t rows, int64_t cols,
                                   int transpose, int hadamard, int vec, int block_2d, int rounding,
                                   uint32_t key2, uint32_t key3, const float *amax_p, uint8_t *codes,
                                   uint8_t *block_scales, float *tensor_scale, __nv_bfloat16 *decoded) {
  __shared__ float tile_amax[16][16];
  __shared__ uint32_t tab[256];
  if (decoded != nullptr) {  // uniform across the CUDA block
    nv_e2m1_pair_table(tab, threadIdx.y * 16 + threadIdx.x, 256);
    __syncthreads();
  }
  const int64_t ncb = cols / 16;
  const int64_t r = (int64_t)blockIdx.y * 16 + threadIdx.y;
  const int64_t cb = (int64_t)blockIdx.x * 16 + threadIdx.x;
  const bool active = r < rows && cb < ncb;
  float y[16];
  float bam = 0.0f;
  if (active) {
    if (vec) {
      nv_load16_vec(x, dtype, x_scales, cols, r, cb * 16, y);
    } else {
#pragma unroll
      for (int i = 0; i < 16; ++i) y[i] = nv_load_logical(x, dtype, x_scales, rows, cols, transpose, r, cb * 16 + i);
    }
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
  const int64_t base = r * cols + cb * 16;  // flat index of the block's first element
  uint32_t code[16];
  if (rounding == 1) {
#pragma unroll
    for (int i = 0; i < 16; ++i)
      code[i] = nv_e2m1_encode(y[i] * enc, true, nv_rand24((uint64_t)(base + i), key2, key3));
  } else {
#pragma unroll
    for (int i = 0; i < 16; ++i) code[i] = nv_e2m1_encode_rne(y[i] * enc);
  }
  if (decoded != nullptr) {
    const __nv_bfloat162 sf2 = __float2bfloat162_rn(sf);  // sf is on the E4M3 grid: exact in BF16
    uint32_t w[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = nv_scaled_pair(tab[code[2 * i] | (code[2 * i + 1] << 4)], sf2);
    uint4 *dst = reinterpret_cast<uint4 *>(decoded + base);
    dst[0] = make_uint4(w[0], w[1], w[2], w[3]);
    dst[1] = make_uint4(w[4], w[5], w[6], w[7]);
    return;
  }
  block_scales[r * ncb + cb] = (uint8_t)nv_e4m3_bits_from_grid(sf);
  uint32_t lo = 0, hi = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    lo |= code[i] << (4 * i);
    hi |= code[i + 8] << (4 * i);
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
    float v = nv_e2m1_value(code) * nv_e4m3_decode(block_scales[r * (cols / 16) + c / 16]);
    nv_store(out, out_dtype, i, v * ts);
  }
}

// NVFP4 -> BF16 ``e2m1 * e4m3(block scale)`` WITHOUT the tensor scale: every such product has at most 6
// significant bits, so the BF16 value is exact.  The GEMM operand of the emulated backend.  Flat indexing:
// with cols % 16 == 0 the 16-element block b is code bytes 8b .. 8b+7 and block scale b of the contiguous
// arrays.  Each thread decodes one block: one 8-byte load, one scale byte, eight table look-ups and bf16x2
// multiplies (nv_scaled_pair), two 16-byte stores.
__global__ void nv_decode_bf16_kernel(const uint2 *codes, const uint8_t *block_scales, int64_t nblk, uint4 *out) {
  __shared__ uint32_t tab[256];
  nv_e2m1_pair_table(tab, threadIdx.x, blockDim.x);
  __syncthreads();
  for (int64_t b = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; b < nblk; b += (int64_t)gridDim.x * blockDim.x) {
    const uint2 cw = codes[b];
    const __nv_bfloat162 sf2 = __float2bfloat162_rn(nv_e4m3_decode(block_scales[b]));  // exact in BF16
    uint32_t o[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) o[j] = nv_scaled_pair(tab[((j < 4 ? cw.x : cw.y) >> (8 * (j & 3))) & 0xFFu], sf2);
    out[2 * b] = make_uint4(o[0], o[1], o[2], o[3]);
    out[2 * b + 1] = make_uint4(o[4], o[5], o[6], o[7]);
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

// 16-byte loads when the input is row-major and its pointer 16-byte aligned (cols % 16 == 0 is checked by
// the caller, so every 16-element block then starts on a 16-byte boundary).
static int nv_vec_input(const void *x, int transpose) { return !transpose && ((uintptr_t)x % 16 == 0); }

cudaError_t nv_launch_amax(const void *x, int dtype, const uint8_t *xs, int64_t rows, int64_t cols, int transpose,
                           int hadamard, float *amax, cudaStream_t st) {
  nv_zero_f32<<<1, 1, 0, st>>>(amax);
  int64_t nblk = rows * (cols / 16);
  if (nblk == 0) return cudaGetLastError();
  int dev = 0, sms = 132;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
    return cudaGetLastError();
  int64_t grid = (nblk + 255) / 256;
  if (grid > 8 * (int64_t)sms) grid = 8 * (int64_t)sms;  // grid-stride: one atomic per block, few blocks
  nv_amax_kernel<<<(unsigned int)grid, 256, 0, st>>>(x, dtype, xs, rows, cols, transpose, hadamard,
                                                     nv_vec_input(x, transpose), amax);
  return cudaGetLastError();
}

cudaError_t nv_launch_quantize(const void *x, int dtype, const uint8_t *xs, int64_t rows, int64_t cols, int transpose,
                               int hadamard, int block_2d, int rounding, uint32_t key2, uint32_t key3,
                               const float *amax, uint8_t *codes, uint8_t *scales, float *ts, __nv_bfloat16 *decoded,
                               cudaStream_t st) {
  if (rows == 0 || cols == 0) return cudaSuccess;  // nothing to launch (a 0-sized grid is a launch error)
  dim3 block(16, 16);
  dim3 grid((unsigned int)((cols / 16 + 15) / 16), (unsigned int)((rows + 15) / 16));
  nv_quantize_kernel<<<grid, block, 0, st>>>(x, dtype, xs, rows, cols, transpose, hadamard, nv_vec_input(x, transpose),
                                             block_2d, rounding, key2, key3, amax, codes, scales, ts, decoded);
  return cudaGetLastError();
}

cudaError_t nv_launch_dequantize(const uint8_t *codes, const uint8_t *scales, const float *ts, int64_t rows,
                                 int64_t cols, void *out, int out_dtype, cudaStream_t st) {
  nv_dequantize_kernel<<<nv_grid_1d(rows * cols, 256), 256, 0, st>>>(codes, scales, ts, rows, cols, out, out_dtype);
  return cudaGetLastError();
}

cudaError_t nv_launch_decode_bf16(const uint8_t *codes, const uint8_t *scales, int64_t rows, int64_t cols,
                                  __nv_bfloat16 *out, cudaStream_t st) {
  const int64_t nblk = rows * cols / 16;
  if (nblk == 0) return cudaSuccess;
  nv_decode_bf16_kernel<<<nv_grid_1d(nblk, 256), 256, 0, st>>>((const uint2 *)codes, scales, nblk, (uint4 *)out);
  return cudaGetLastError();
}

cudaError_t nv_launch_hadamard(const void *x, int dtype, int64_t rows, int64_t cols, float *out, cudaStream_t st) {
  nv_hadamard_kernel<<<nv_grid_1d(rows * (cols / 16), 256), 256, 0, st>>>(x, dtype, rows, cols, out);
  return cudaGetLastError();
}
