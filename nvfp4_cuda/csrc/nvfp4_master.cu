// nvfp4_master.cu -- MXFP8 encode/decode (RCEIL, RNE or stochastic), the fused Lion step on an MXFP8
// master, and float32 -> bfloat16 stochastic rounding.  Semantics: nvfp4_cuda/reference_master.py.
//
// Encode/decode: one thread owns one 32-element MXFP8 block (values in registers).  Lion: four threads own
// one block (below), so the block scale is recomputed after the update without a second pass.  Difference from the reference, by design: the
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

// ---- the fused Lion step ------------------------------------------------------------------------------
// Four threads share one 32-element block, 8 consecutive elements each, so a warp covers 8 blocks = 256
// contiguous elements and every load and store of payload (8 B), gradient, momentum (16 B) and
// compensation (32 B) is one coalesced vector access (``vec``: cols % 8 == 0 and aligned pointers; any
// other shape goes element by element).  The block amax and the non-finite flag are combined across the
// four threads with shuffles.  Lanes stay together for the whole loop (the block index advances by warp),
// so the shuffles always see all 32 lanes; lanes past the end do no memory access.
#define NV_LION_T 4                 // threads per MXFP8 block
#define NV_LION_E (NV_MX / NV_LION_T)  // elements per thread

__device__ __forceinline__ void nv_load8_f32(const void *p, int dtype, int64_t idx, int len, bool vec, float *v) {
  if (vec && dtype == 1) {
    const uint4 q = *reinterpret_cast<const uint4 *>(static_cast<const __nv_bfloat16 *>(p) + idx);
    const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[2 * i] = __uint_as_float(w[i] << 16);
      v[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
    }
  } else if (vec) {
    const float4 a = *reinterpret_cast<const float4 *>(static_cast<const float *>(p) + idx);
    const float4 b = *reinterpret_cast<const float4 *>(static_cast<const float *>(p) + idx + 4);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else {
#pragma unroll
    for (int i = 0; i < NV_LION_E; ++i)
      v[i] = i < len ? (dtype == 1 ? __bfloat162float(static_cast<const __nv_bfloat16 *>(p)[idx + i])
                                   : static_cast<const float *>(p)[idx + i])
                     : 0.0f;
  }
}

// The write-back (0 stochastic, 1 RNE, 2 RNE + compensation) is a template parameter: straight-line code per mode.
template <int WRITEBACK>
__global__ void nv_lion_kernel(uint8_t *payload, uint8_t *scales, const void *grad, int grad_dtype,
                               __nv_bfloat16 *momentum, float *comp, int64_t rows, int64_t cols, float neg_lr,
                               float decay, float b1, float omb1, float b2, float omb2, uint32_t key2, uint32_t key3,
                               int vec, int full) {
  constexpr int writeback = WRITEBACK;
  const int64_t nb = (cols + NV_MX - 1) / NV_MX, total = rows * nb;
  const int lane = threadIdx.x & 31, q = lane & (NV_LION_T - 1);
  const int64_t warp = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5;
  const int64_t nwarps = ((int64_t)gridDim.x * blockDim.x) >> 5;
  const int per_warp = 32 / NV_LION_T;
  for (int64_t b0 = warp * per_warp; b0 < total; b0 += nwarps * per_warp) {  // uniform across the warp
    const int64_t b = b0 + lane / NV_LION_T;  // flat block index = scale index (blocks are row-major)
    int64_t base;  // flat index of this thread's first element
    int len;
    if (full) {  // cols % 32 == 0: block b is elements 32b .. 32b+31 (no 64-bit division per block)
      base = b * NV_MX + q * NV_LION_E;
      len = b < total ? NV_LION_E : 0;
    } else {
      const int64_t r = b < total ? b / nb : 0, j = b < total ? b % nb : 0;
      const int64_t c0 = j * NV_MX + q * NV_LION_E;
      base = r * cols + c0;
      len = b < total ? (int)(cols - c0 < NV_LION_E ? cols - c0 : NV_LION_E) : 0;
      len = len < 0 ? 0 : len;
    }
    float g[NV_LION_E], m[NV_LION_E], cp[NV_LION_E], v[NV_LION_E];
    uint32_t code[NV_LION_E];
    float amax = 0.0f;
    int bad = 0;
    if (len > 0) {
      const float sdec = nv_e8m0_decode(scales[b]);
      if (vec) {
        const uint2 pw = *reinterpret_cast<const uint2 *>(payload + base);
#pragma unroll
        for (int i = 0; i < NV_LION_E; ++i) code[i] = ((i < 4 ? pw.x : pw.y) >> (8 * (i & 3))) & 0xFFu;
      } else {
#pragma unroll
        for (int i = 0; i < NV_LION_E; ++i) code[i] = i < len ? payload[base + i] : 0u;
      }
      nv_load8_f32(grad, grad_dtype, base, len, vec, g);
      nv_load8_f32(momentum, 1, base, len, vec, m);
      if (writeback == 2) nv_load8_f32(comp, 0, base, len, vec, cp);
      float w[NV_LION_E];
#pragma unroll
      for (int i = 0; i < NV_LION_E; i += 2) {  // E4M3 pairs: one hardware conversion each on sm_89+
        const float2 d = nv_e4m3x2_value(code[i] | (code[i + 1] << 8));
        w[i] = d.x * sdec;
        w[i + 1] = d.y * sdec;
      }
#pragma unroll
      for (int i = 0; i < NV_LION_E; ++i) {
        float wi = w[i];  // the master's value
        const float c = (m[i] * b1) + (g[i] * omb1);
        const float upd = c > 0.0f ? neg_lr : (c < 0.0f ? -neg_lr : 0.0f);
        if (writeback == 2) wi = wi + cp[i];
        v[i] = (wi * decay) + upd;
        m[i] = (m[i] * b2) + (g[i] * omb2);
        if (i < len) {
          bad |= !isfinite(v[i]);
          amax = fmaxf(amax, fabsf(v[i]));
        }
      }
      if (vec) {
        uint32_t mw[4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
          mw[i] = (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(m[2 * i])) |
                  ((uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(m[2 * i + 1])) << 16);
        *reinterpret_cast<uint4 *>(momentum + base) = make_uint4(mw[0], mw[1], mw[2], mw[3]);
      } else {
#pragma unroll
        for (int i = 0; i < NV_LION_E; ++i)
          if (i < len) momentum[base + i] = __float2bfloat16_rn(m[i]);
      }
    }
#pragma unroll
    for (int off = 1; off < NV_LION_T; off <<= 1) {  // the block's four threads are lanes 4k .. 4k+3
      amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, off));
      bad |= __shfl_xor_sync(0xFFFFFFFFu, bad, off);
    }
    if (len == 0) continue;
    // Re-encode (nv_mx_encode_block's rules, spread over the four threads).
    const int e = bad ? 0 : nv_rceil_exponent(amax);
    const float mul = nv_pow2(-e);
    const bool top = e + MX_E8M0_BIAS == MX_TOP_CLAMP_SCALE_BYTE;
    const bool sr = writeback == 0;
    float sv[NV_LION_E];
#pragma unroll
    for (int i = 0; i < NV_LION_E; ++i) sv[i] = v[i] * mul;
    if (__builtin_expect(top, 0)) {  // a block at the top of float32's range: never in practice, so a branch
#pragma unroll
      for (int i = 0; i < NV_LION_E; ++i) sv[i] = fmaxf(fminf(sv[i], MX_TOP_CLAMP_VALUE), -MX_TOP_CLAMP_VALUE);
    }
    if (bad) {
#pragma unroll
      for (int i = 0; i < NV_LION_E; ++i) code[i] = MX_E4M3_NAN_MAG;
    } else if (sr) {
#pragma unroll
      for (int i = 0; i < NV_LION_E; ++i)
        code[i] = nv_e4m3_encode(sv[i], true, nv_rand24((uint64_t)(base + i), key2, key3));
    } else {  // RNE: the hardware conversion, two at a time (sv is finite here)
#pragma unroll
      for (int i = 0; i < NV_LION_E; i += 2) {
        const uint32_t c2 = nv_e4m3x2_encode_rne(sv[i], sv[i + 1]);
        code[i] = c2 & 0xFFu;
        code[i + 1] = c2 >> 8;
      }
    }
    const uint32_t sbyte = bad ? (uint32_t)MX_E8M0_NAN : (uint32_t)(e + MX_E8M0_BIAS);
    if (q == 0) scales[b] = (uint8_t)sbyte;
    if (vec) {
      uint2 pw = make_uint2(0u, 0u);
#pragma unroll
      for (int i = 0; i < NV_LION_E; ++i) (i < 4 ? pw.x : pw.y) |= (code[i] & 0xFFu) << (8 * (i & 3));
      *reinterpret_cast<uint2 *>(payload + base) = pw;
    } else {
#pragma unroll
      for (int i = 0; i < NV_LION_E; ++i)
        if (i < len) payload[base + i] = (uint8_t)code[i];
    }
    if (writeback == 2) {
      const float snew = nv_e8m0_decode(sbyte);
#pragma unroll
      for (int i = 0; i < NV_LION_E; i += 2) {
        const float2 d = nv_e4m3x2_value(code[i] | (code[i + 1] << 8));
        cp[i] = v[i] - d.x * snew;
        cp[i + 1] = v[i + 1] - d.y * snew;
      }
      if (vec) {
        *reinterpret_cast<float4 *>(comp + base) = make_float4(cp[0], cp[1], cp[2], cp[3]);
        *reinterpret_cast<float4 *>(comp + base + 4) = make_float4(cp[4], cp[5], cp[6], cp[7]);
      } else {
#pragma unroll
        for (int i = 0; i < NV_LION_E; ++i)
          if (i < len) comp[base + i] = cp[i];
      }
    }
  }
}

// BF16 bits of float32 x rounded stochastically with the random word of flat index i (reference_master's
// stochastic_round_to_bf16_): 16 random bits added below the kept 16; non-finite values truncate, NaN quiet.
__device__ __forceinline__ uint32_t nv_sr_bf16_bits(float x, uint64_t i, uint32_t key2, uint32_t key3) {
  const uint32_t bits = __float_as_uint(x);
  const uint32_t hi = isfinite(x) ? (bits + (nv_word(i, key2, key3) >> 16)) >> 16 : (bits >> 16) | (isnan(x) ? 0x40u : 0u);
  return hi & 0xFFFFu;
}

__global__ void nv_sr_bf16_kernel(__nv_bfloat16 *dst, const float *src, int64_t n, uint32_t key2, uint32_t key3) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    dst[i] = __ushort_as_bfloat16((unsigned short)nv_sr_bf16_bits(src[i], (uint64_t)i, key2, key3));
}

// Lion on a plain BF16 parameter (reference_master.lion_step_bf16_), 8 elements per thread: one 16-byte
// load each of parameter, momentum and (BF16) gradient, no float32 copies in memory (the PyTorch spelling
// materialises five float32 temporaries of the parameter's size: 15 GB for a 256k x 3072 embedding).
__global__ void nv_lion_bf16_kernel(__nv_bfloat16 *param, const void *grad, int grad_dtype, __nv_bfloat16 *momentum,
                                    int64_t n, float lr, float decay, float b1, float omb1, float b2, float omb2,
                                    int writeback, uint32_t key2, uint32_t key3, int vec) {
  const int64_t n8 = (n + 7) / 8;
  for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < n8; t += (int64_t)gridDim.x * blockDim.x) {
    const int64_t base = t * 8;
    const int len = (int)(n - base < 8 ? n - base : 8);
    const bool v8 = vec && len == 8;
    float w[8], g[8], m[8];
    nv_load8_f32(param, 1, base, len, v8, w);
    nv_load8_f32(grad, grad_dtype, base, len, v8, g);
    nv_load8_f32(momentum, 1, base, len, v8, m);
    uint32_t wb[8], mb[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float c = (m[i] * b1) + (g[i] * omb1);
      const float step = c > 0.0f ? lr : (c < 0.0f ? -lr : 0.0f);  // lr * torch.sign(c)
      const float x = (w[i] * decay) - step;
      mb[i] = __bfloat16_as_ushort(__float2bfloat16_rn((m[i] * b2) + (g[i] * omb2)));
      wb[i] = writeback == 1 ? __bfloat16_as_ushort(__float2bfloat16_rn(x))
                             : nv_sr_bf16_bits(x, (uint64_t)(base + i), key2, key3);
    }
    if (v8) {
      *reinterpret_cast<uint4 *>(param + base) =
          make_uint4(wb[0] | (wb[1] << 16), wb[2] | (wb[3] << 16), wb[4] | (wb[5] << 16), wb[6] | (wb[7] << 16));
      *reinterpret_cast<uint4 *>(momentum + base) =
          make_uint4(mb[0] | (mb[1] << 16), mb[2] | (mb[3] << 16), mb[4] | (mb[5] << 16), mb[6] | (mb[7] << 16));
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i)
        if (i < len) {
          param[base + i] = __ushort_as_bfloat16((unsigned short)wb[i]);
          momentum[base + i] = __ushort_as_bfloat16((unsigned short)mb[i]);
        }
    }
  }
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
  const int64_t blocks = rows * ((cols + NV_MX - 1) / NV_MX);
  if (blocks == 0) return cudaSuccess;
  const int vec = cols % 8 == 0 && (uintptr_t)payload % 8 == 0 && (uintptr_t)grad % 16 == 0 &&
                  (uintptr_t)mom % 16 == 0 && (writeback != 2 || (uintptr_t)comp % 16 == 0);
  const int full = cols % NV_MX == 0;
  // One wave of CUDA blocks, each thread looping over several MXFP8 blocks: a thread's set-up (bounds, indices,
  // the kernel arguments) is paid once instead of once per 8 elements.
#define NV_LION(WB)                                                                                               \
  nv_lion_kernel<WB><<<nv_one_wave<nv_lion_kernel<WB>>(nv_grid(blocks * NV_LION_T, 256), 256), 256, 0, st>>>(     \
      payload, scales, grad, grad_dtype, mom, comp, rows, cols, neg_lr, decay, b1, omb1, b2, omb2, k2, k3, vec, full)
  if (writeback == 0)
    NV_LION(0);
  else if (writeback == 1)
    NV_LION(1);
  else
    NV_LION(2);
#undef NV_LION
  return cudaGetLastError();
}

cudaError_t nv_launch_lion_bf16(__nv_bfloat16 *param, const void *grad, int grad_dtype, __nv_bfloat16 *mom, int64_t n,
                                float lr, float decay, float b1, float omb1, float b2, float omb2, int writeback,
                                uint32_t k2, uint32_t k3, cudaStream_t st) {
  if (n == 0) return cudaSuccess;
  const int vec = (uintptr_t)param % 16 == 0 && (uintptr_t)grad % 16 == 0 && (uintptr_t)mom % 16 == 0;
  nv_lion_bf16_kernel<<<nv_one_wave<nv_lion_bf16_kernel>(nv_grid((n + 7) / 8, 256), 256), 256, 0, st>>>(
      param, grad, grad_dtype, mom, n, lr, decay, b1, omb1, b2, omb2, writeback, k2, k3, vec);
  return cudaGetLastError();
}

cudaError_t nv_launch_sr_bf16(__nv_bfloat16 *dst, const float *src, int64_t n, uint32_t k2, uint32_t k3,
                              cudaStream_t st) {
  nv_sr_bf16_kernel<<<nv_grid(n, 256), 256, 0, st>>>(dst, src, n, k2, k3);
  return cudaGetLastError();
}
