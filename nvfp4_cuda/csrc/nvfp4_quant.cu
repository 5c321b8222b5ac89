// nvfp4_quant.cu -- amax, NVFP4 quantize (1x16 / 16x16, RNE / SR, optional Hadamard, transposed input),
// dequantize and the standalone Hadamard transform.  Semantics: nvfp4_cuda/reference.py.
//
// Thread layout of the quantizer: a CUDA block is 16 x 16 threads; threadIdx.y is the row inside a
// 16-row tile, threadIdx.x indexes 16 consecutive 16-element column blocks, and each thread owns the
// 1x16 blocks threadIdx.x and threadIdx.x + 16 of its row (NV_QUANT_NB = 2; their 32 values live in
// registers), so a CUDA block covers 16 rows x 512 columns and the 16x16 tile amax is a shared-memory
// max over threadIdx.y.  Scales follow Transformer Engine's float32 op order exactly (see reference.py).
//
// A transposed input (transpose = 1: stored [valid_cols, rows], e.g. the activations [tokens, features] of a
// weight-gradient operand whose 1x16 blocks run along the tokens) maps a warp's lanes to 32 consecutive
// logical rows, i.e. 32 neighbouring elements of one stored row: every load instruction of the warp reads
// one contiguous 64-byte span (tokens 16*cb .. 16*cb+15 come from 16 stored rows), no shared-memory
// transpose needed.  Logical columns at and past valid_cols (the token axis padded to a multiple of 16)
// read as zeros, as the reference's zero-padded transpose (reference.transpose_padded).
//
// Speed: both passes are bound by memory bandwidth.  A row-major input whose pointer is 16-byte aligned
// is read with 16-byte loads (``vec``; nv_load16_vec), anything else (a transposed input, an odd view)
// element by element; the amax pass reduces each CUDA block in shared memory and issues one atomicMax
// per block, on a grid of a few blocks per multiprocessor (one atomic per warp on one address
// serialised in L2 and cost more than the pass itself).
#include "nvfp4_common.cuh"

// 1x16 blocks per quantizer thread (nv_quantize_kernel): 2, or 1 built for comparison with
// NVFP4_CUDA_NVCC_FLAGS=-DNV_QUANT_NB=1 (nvfp4_cuda/build.py; step 5 of scripts/device_check.sh measures both)
#ifndef NV_QUANT_NB
#define NV_QUANT_NB 2
#endif

__global__ void nv_zero_f32(float *p) { *p = 0.0f; }

// Per-tensor amax of |x| (after the optional Hadamard transform): a block-wide max, then one atomicMax on
// the bit pattern per block, valid because non-negative floats order like their unsigned bits.
__global__ void nv_amax_kernel(const void *x, int dtype, const uint8_t *x_scales, int64_t rows, int64_t cols,
                               int64_t valid_cols, int transpose, int hadamard, int vec, float *amax_out) {
  __shared__ float warp_max[32];
  const int64_t nbc = cols / 16, nblk = rows * nbc;
  float m = 0.0f;
  if (transpose) {  // a 2-D grid stride, consecutive threads on consecutive logical rows (see the top)
    for (int64_t cb = blockIdx.y; cb < nbc; cb += gridDim.y)
      for (int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; r < rows;
           r += (int64_t)gridDim.x * blockDim.x) {
        float y[16];
        nv_load16_transposed(x, dtype, x_scales, rows, valid_cols, r, cb, y);
        if (hadamard) nv_hadamard16(y);
#pragma unroll
        for (int i = 0; i < 16; ++i) m = fmaxf(m, fabsf(y[i]));
      }
  }
  for (int64_t b = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; b < nblk && !transpose;
       b += (int64_t)gridDim.x * blockDim.x) {
    float y[16];
    if (vec && (dtype != 2 || cols % 32 == 0)) {  // block b is elements 16b .. 16b+15: no 64-bit division
      // (read as row b >> 1, columns 16 (b & 1) .. of a 32-column view: an MXFP8 block's scale is then b >> 1)
      nv_load16_vec(x, dtype, x_scales, 32, b >> 1, (b & 1) * 16, y);
    } else if (vec) {
      nv_load16_vec(x, dtype, x_scales, cols, b / nbc, (b % nbc) * 16, y);
    } else {
      const int64_t r = b / nbc, c0 = (b % nbc) * 16;
#pragma unroll
      for (int i = 0; i < 16; ++i) y[i] = nv_load(x, dtype, x_scales, cols, r, c0 + i);
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

// One 1x16 block after its amax is known: the block scale, the codes (RNE or SR), then either codes and
// scale byte or (DECODED) the block's exact BF16 values.  r, cb: the block's logical row and column block.
template <bool SR, bool DECODED>
__device__ __forceinline__ void nv_quantize_block(const float (&y)[16], float bam, float s_enc, float s_dec,
                                                  int64_t r, int64_t cb, int64_t cols, uint32_t key2, uint32_t key3,
                                                  const uint32_t *tab, uint8_t *codes, uint8_t *block_scales,
                                                  __nv_bfloat16 *decoded) {
  // the block scale: E4M3 RNE of a finite sf_f in [0, 448] (bam is never NaN: fmaxf drops NaNs), one cvt each way
  const float sf_f = fminf(bam * (s_enc * NVFP4_ONE_SIXTH), 448.0f);
  const uint32_t sf_code = nv_e4m3x2_encode_rne(sf_f, 0.0f) & 0xFFu;
  const float sf = nv_e4m3x2_value(sf_code).x;
  const float enc = fminf(1.0f / (sf * s_dec), NVFP4_FLT_MAX);
  const int64_t base = r * cols + cb * 16;  // flat index of the block's first element
  uint32_t code[16];
  if (SR) {
#pragma unroll
    for (int i = 0; i < 16; ++i)
      code[i] = nv_e2m1_encode_sr(y[i] * enc, nv_rand24((uint64_t)(base + i), key2, key3));
  } else {
#pragma unroll
    for (int i = 0; i < 16; ++i) code[i] = nv_e2m1_encode_rne(y[i] * enc);
  }
  if (DECODED) {
    const __nv_bfloat162 sf2 = __float2bfloat162_rn(sf);  // sf is on the E4M3 grid: exact in BF16
    uint32_t w[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = nv_scaled_pair(tab[code[2 * i] | (code[2 * i + 1] << 4)], sf2);
    uint4 *dst = reinterpret_cast<uint4 *>(decoded + base);
    dst[0] = make_uint4(w[0], w[1], w[2], w[3]);
    dst[1] = make_uint4(w[4], w[5], w[6], w[7]);
    return;
  }
  block_scales[r * (cols / 16) + cb] = (uint8_t)sf_code;
  uint32_t lo = 0, hi = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    lo |= code[i] << (4 * i);
    hi |= code[i + 8] << (4 * i);
  }
  uint2 packed = make_uint2(lo, hi);  // bytes little-endian: element 2j in the low nibble of byte j
  *reinterpret_cast<uint2 *>(codes + r * (cols / 2) + cb * 8) = packed;
}

// DECODED: instead of codes and block scales, write each element's exact value e2m1 * e4m3(scale)
// as BF16 (what nv_decode_bf16_kernel would make of them), for a GEMM operand whose codes nobody needs.
// The rounding mode, the Hadamard rotation and the output form are template parameters: each launched kernel is
// straight-line code for its path (fewer instructions and registers than one kernel branching on all of them).
// Each thread owns NV_QUANT_NB blocks of its row (column blocks cb0 and cb0 + 16, or cb0 + 8 transposed), so
// its indices, the barrier and the tensor scales are paid once per 32 elements instead of 16.
template <bool SR, bool HADAMARD, bool DECODED>
__global__ void nv_quantize_kernel(const void *x, int dtype, const uint8_t *x_scales, int64_t rows, int64_t cols,
                                   int64_t valid_cols, int transpose, int vec, int block_2d, uint32_t key2,
                                   uint32_t key3, const float *amax_p, uint8_t *codes, uint8_t *block_scales,
                                   float *tensor_scale, __nv_bfloat16 *decoded) {
  constexpr int NB = NV_QUANT_NB;
  __shared__ float tile_amax[16][16 * NB];
  __shared__ uint32_t tab[256];
  __shared__ float tscale[2];  // the per-tensor s_enc, s_dec: two IEEE divisions once per CUDA block, not per thread
  const int tid = threadIdx.y * 16 + threadIdx.x;  // 16 x 16 threads
  if (DECODED) nv_e2m1_pair_table(tab, tid);
  if (tid == 0) nv_tensor_scales(*amax_p, &tscale[0], &tscale[1]);
  const int64_t ncb = cols / 16;
  int64_t r, cb0;  // this thread's blocks: logical row r, column blocks cb0 + h * cstep (16 columns each)
  int cstep;
  if (transpose) {  // a CUDA block takes 32 logical rows (a warp's lanes) x 8 NB column blocks (its warps)
    r = (int64_t)blockIdx.x * 32 + (tid & 31);
    cb0 = (int64_t)blockIdx.y * (8 * NB) + (tid >> 5);
    cstep = 8;
  } else {  // 16 rows (threadIdx.y) x 16 NB column blocks (threadIdx.x)
    r = (int64_t)blockIdx.y * 16 + threadIdx.y;
    cb0 = (int64_t)blockIdx.x * (16 * NB) + threadIdx.x;
    cstep = 16;
  }
  float y[NB][16];
  float bam[NB];
  bool active[NB];
#pragma unroll
  for (int h = 0; h < NB; ++h) {
    const int64_t cb = cb0 + h * cstep;
    active[h] = r < rows && cb < ncb;
    bam[h] = 0.0f;
    if (active[h]) {
      if (vec) {
        nv_load16_vec(x, dtype, x_scales, cols, r, cb * 16, y[h]);
      } else if (transpose) {
        nv_load16_transposed(x, dtype, x_scales, rows, valid_cols, r, cb, y[h]);
      } else {
#pragma unroll
        for (int i = 0; i < 16; ++i) y[h][i] = nv_load(x, dtype, x_scales, cols, r, cb * 16 + i);
      }
      if (HADAMARD) nv_hadamard16(y[h]);
#pragma unroll
      for (int i = 0; i < 16; ++i) bam[h] = fmaxf(bam[h], fabsf(y[h][i]));
    }
    if (block_2d && !transpose) tile_amax[threadIdx.y][threadIdx.x + 16 * h] = bam[h];
  }
  __syncthreads();  // after the loads are issued: the table, the tensor scales and the tile amaxes are ready
#pragma unroll
  for (int h = 0; h < NB; ++h) {
    if (block_2d && transpose) {  // a 16x16 tile is 16 neighbouring lanes (rows) of one warp (one column block)
      for (int off = 8; off > 0; off >>= 1) bam[h] = fmaxf(bam[h], __shfl_xor_sync(0xFFFFFFFFu, bam[h], off));
    } else if (block_2d) {
      float t = 0.0f;
      for (int i = 0; i < 16; ++i) t = fmaxf(t, tile_amax[i][threadIdx.x + 16 * h]);
      bam[h] = t;
    }
  }
  const float s_enc = tscale[0], s_dec = tscale[1];
  if (r == 0 && cb0 == 0) *tensor_scale = s_dec;
#pragma unroll
  for (int h = 0; h < NB; ++h)
    if (active[h])
      nv_quantize_block<SR, DECODED>(y[h], bam[h], s_enc, s_dec, r, cb0 + h * cstep, cols, key2, key3, tab, codes,
                                     block_scales, decoded);
}

__global__ void nv_dequantize_kernel(const uint8_t *codes, const uint8_t *block_scales, const float *tensor_scale,
                                     int64_t rows, int64_t cols, void *out, int out_dtype) {
  const int64_t n = rows * cols;
  const float ts = *tensor_scale;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = i / cols, c = i % cols;
    uint32_t byte = codes[r * (cols / 2) + c / 2];
    uint32_t code = (c & 1) ? (byte >> 4) : (byte & 0xF);
    const float e2m1 = __uint_as_float(nv_e2m1_bf16_bits(code) << 16);  // exact: a BF16 value
    float v = e2m1 * nv_e4m3_decode(block_scales[r * (cols / 16) + c / 16]);
    nv_store(out, out_dtype, i, v * ts);
  }
}

// NVFP4 -> BF16 ``e2m1 * e4m3(block scale)`` WITHOUT the tensor scale: every such product has at most 6
// significant bits, so the BF16 value is exact.  The GEMM operand of the emulated backend.  Flat indexing:
// with cols % 16 == 0 the 16-element block b is code bytes 8b .. 8b+7 and block scale b of the contiguous
// arrays.  The unit of work is half a block, 8 elements: one 4-byte code load, the scale byte, four table
// look-ups and bf16x2 multiplies (nv_scaled_pair), one 16-byte store.  A warp takes NV_DEC_UNROLL x 32
// consecutive half blocks per step, lane l the half blocks l, l + 32, ...: every load and store instruction
// of the warp covers one contiguous span, and each thread has NV_DEC_UNROLL code loads in flight before it
// uses any.  (The layout before, a whole block per thread, stored 2 x 16 bytes with a 32-byte stride between
// lanes and had one 8-byte load in flight: 0.67x of a copy on an H200, with DRAM 86 % busy.)
#define NV_DEC_UNROLL 4
__global__ void nv_decode_bf16_kernel(const uint32_t *codes, const uint8_t *block_scales, int64_t nhalf, uint4 *out) {
  __shared__ uint32_t tab[256];
  nv_e2m1_pair_table(tab, threadIdx.x);  // launched with 256 threads
  __syncthreads();
  const int lane = threadIdx.x & 31;
  const int64_t warp = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5;
  const int64_t nwarps = ((int64_t)gridDim.x * blockDim.x) >> 5;
  for (int64_t h0 = warp * (NV_DEC_UNROLL * 32) + lane; h0 < nhalf; h0 += nwarps * (NV_DEC_UNROLL * 32)) {
    uint32_t cw[NV_DEC_UNROLL], sb[NV_DEC_UNROLL];
#pragma unroll
    for (int k = 0; k < NV_DEC_UNROLL; ++k) {
      const int64_t h = h0 + 32 * k;
      cw[k] = h < nhalf ? codes[h] : 0u;
      sb[k] = h < nhalf ? block_scales[h >> 1] : 0u;
    }
#pragma unroll
    for (int k = 0; k < NV_DEC_UNROLL; ++k) {
      const int64_t h = h0 + 32 * k;
      if (h >= nhalf) break;
      const __nv_bfloat162 sf2 = __float2bfloat162_rn(nv_e4m3_decode(sb[k]));  // exact in BF16
      uint32_t o[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) o[j] = nv_scaled_pair(tab[(cw[k] >> (8 * j)) & 0xFFu], sf2);
      out[h] = make_uint4(o[0], o[1], o[2], o[3]);
    }
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

// 16-byte loads when the input is row-major and its pointer 16-byte aligned (cols % 16 == 0 is checked by
// the caller, so every 16-element block then starts on a 16-byte boundary).
static int nv_vec_input(const void *x, int transpose) { return !transpose && ((uintptr_t)x % 16 == 0); }

cudaError_t nv_launch_amax(const void *x, int dtype, const uint8_t *xs, int64_t rows, int64_t cols, int64_t valid_cols,
                           int transpose, int hadamard, float *amax, cudaStream_t st) {
  nv_zero_f32<<<1, 1, 0, st>>>(amax);
  int64_t nblk = rows * (cols / 16);
  if (nblk == 0) return cudaGetLastError();
  int dev = 0, sms = 132;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
    return cudaGetLastError();
  const int64_t most = 8 * (int64_t)sms;  // grid-stride: one atomic per block, few blocks
  int64_t gx = ((transpose ? rows : nblk) + 255) / 256, gy = 1;
  if (gx > most) gx = most;
  if (transpose) {  // x over the logical rows, y over the column blocks
    gy = most / gx < cols / 16 ? most / gx : cols / 16;
    if (gy < 1) gy = 1;
  }
  const dim3 grid((unsigned int)gx, (unsigned int)gy);
  nv_amax_kernel<<<grid, 256, 0, st>>>(x, dtype, xs, rows, cols, valid_cols, transpose, hadamard,
                                       nv_vec_input(x, transpose), amax);
  return cudaGetLastError();
}

cudaError_t nv_launch_quantize(const void *x, int dtype, const uint8_t *xs, int64_t rows, int64_t cols,
                               int64_t valid_cols, int transpose, int hadamard, int block_2d, int rounding,
                               uint32_t key2, uint32_t key3, const float *amax, uint8_t *codes, uint8_t *scales, float *ts, __nv_bfloat16 *decoded,
                               cudaStream_t st) {
  if (rows == 0 || cols == 0) return cudaSuccess;  // nothing to launch (a 0-sized grid is a launch error)
  const dim3 block(16, 16);
  const int64_t ncb = cols / 16;  // a CUDA block: 32 rows x 8 NB column blocks transposed, else 16 x 16 NB
  const int64_t cbt = 8 * NV_QUANT_NB, cbr = 16 * NV_QUANT_NB;  // column blocks per CUDA block
  const dim3 grid = transpose ? dim3((unsigned int)((rows + 31) / 32), (unsigned int)((ncb + cbt - 1) / cbt))
                              : dim3((unsigned int)((ncb + cbr - 1) / cbr), (unsigned int)((rows + 15) / 16));
  const int vec = nv_vec_input(x, transpose);
#define NV_QUANTIZE(SR, HAD, DEC)                                                                                \
  nv_quantize_kernel<SR, HAD, DEC><<<grid, block, 0, st>>>(x, dtype, xs, rows, cols, valid_cols, transpose, vec,   \
                                                           block_2d, key2, key3, amax, codes, scales, ts, decoded)
  const int path = (rounding == 1) * 4 + (hadamard != 0) * 2 + (decoded != nullptr);
  switch (path) {
    case 0: NV_QUANTIZE(false, false, false); break;
    case 1: NV_QUANTIZE(false, false, true); break;
    case 2: NV_QUANTIZE(false, true, false); break;
    case 3: NV_QUANTIZE(false, true, true); break;
    case 4: NV_QUANTIZE(true, false, false); break;
    case 5: NV_QUANTIZE(true, false, true); break;
    case 6: NV_QUANTIZE(true, true, false); break;
    default: NV_QUANTIZE(true, true, true); break;
  }
#undef NV_QUANTIZE
  return cudaGetLastError();
}

cudaError_t nv_launch_dequantize(const uint8_t *codes, const uint8_t *scales, const float *ts, int64_t rows,
                                 int64_t cols, void *out, int out_dtype, cudaStream_t st) {
  nv_dequantize_kernel<<<nv_grid(rows * cols, 256), 256, 0, st>>>(codes, scales, ts, rows, cols, out, out_dtype);
  return cudaGetLastError();
}

cudaError_t nv_launch_decode_bf16(const uint8_t *codes, const uint8_t *scales, int64_t rows, int64_t cols,
                                  __nv_bfloat16 *out, cudaStream_t st) {
  const int64_t nhalf = rows * cols / 8;  // half blocks of 8 elements
  if (nhalf == 0) return cudaSuccess;
  nv_decode_bf16_kernel<<<nv_grid((nhalf + NV_DEC_UNROLL - 1) / NV_DEC_UNROLL, 256), 256, 0, st>>>(
      (const uint32_t *)codes, scales, nhalf, (uint4 *)out);
  return cudaGetLastError();
}

cudaError_t nv_launch_hadamard(const void *x, int dtype, int64_t rows, int64_t cols, float *out, cudaStream_t st) {
  nv_hadamard_kernel<<<nv_grid(rows * (cols / 16), 256), 256, 0, st>>>(x, dtype, rows, cols, out);
  return cudaGetLastError();
}
