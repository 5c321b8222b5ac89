// nvfp4_gemm.cu -- the native FP4 GEMM: C[M,N] = alpha * A[M,K] B[N,K]^T, FP32 accumulation (sm_120a only).
//
// A 128 x 128 output tile per CTA, 256 threads = 8 warps as 2 (M) x 4 (N), each warp owning 64 x 32
// outputs, K stepped by 64 (four NVFP4 16-blocks).  Codes and scales are copied to shared memory as
// bytes and fed to mma.sync m16n8k64 kind::mxf4nvf4 block_scale scale_vec::4X ue4m3 using the fragment
// layout of nvfp4_cuda/fragments.py (verified there by a CPU simulation; NOT yet run on hardware).
// Blocks past K and rows past M/N are zero-filled (zero codes and zero scales contribute 0).
//
// Every other GPU takes the emulated backend (nvfp4_lt.cu): exact decode to BF16, then cuBLASLt.
//
// Epilogue: v = acc * (S_dec_a * S_dec_b) [+ float(out)], stored as bf16 (RNE) or f32.  Accumulation
// order inside the MMA is unspecified by PTX, so results equal the reference bit-for-bit whenever
// all partial sums are exact, and to float32 accumulation error otherwise.
#include "nvfp4_common.cuh"

#define NV_BM 128
#define NV_BN 128
#define NV_BK 64
#define NV_CPAD 16   // byte padding per smem code row (native)

#if defined(__CUDA_ARCH_FEAT_SM120_ALL) || (defined(__CUDA_ARCH_FAMILY_SPECIFIC__) && __CUDA_ARCH_FAMILY_SPECIFIC__ == 1200)
#define NV_HAS_FP4_MMA 1
#else
#define NV_HAS_FP4_MMA 0
#endif

__device__ __forceinline__ void nv_epilogue(float (*acc)[4][4], int64_t m, int64_t n, int64_t m0, int64_t n0, int wm,
                                            int wn, int g, int t, float alpha, void *out, int out_dtype,
                                            int accumulate) {
#pragma unroll
  for (int mi = 0; mi < 4; ++mi) {
#pragma unroll
    for (int ni = 0; ni < 4; ++ni) {
#pragma unroll
      for (int h = 0; h < 4; ++h) {
        int64_t row = m0 + wm * 64 + mi * 16 + g + (h >= 2 ? 8 : 0);
        int64_t col = n0 + wn * 32 + ni * 8 + 2 * t + (h & 1);
        if (row < m && col < n) {
          float v = acc[mi][ni][h] * alpha;
          int64_t idx = row * n + col;
          if (accumulate) {
            float old = out_dtype == 0 ? ((const float *)out)[idx] : __bfloat162float(((const __nv_bfloat16 *)out)[idx]);
            v = v + old;
          }
          nv_store(out, out_dtype, idx, v);
        }
      }
    }
  }
}

// Copy rows [r0, r0+128) x K-slice [k0, k0+64) of codes (32 bytes/row) and scales (4 bytes/row) to smem.
__device__ __forceinline__ void nv_copy_tile(const uint8_t *codes, const uint8_t *scales, int64_t rows, int64_t k,
                                             int64_t r0, int64_t k0, uint8_t (*cs)[NV_BK / 2 + NV_CPAD],
                                             uint8_t (*ss)[4], int tid) {
  const int row = tid >> 1, half = tid & 1;
  const int64_t gr = r0 + row;
#pragma unroll
  for (int blk = 0; blk < 2; ++blk) {
    const int kcol = 32 * half + 16 * blk;  // element offset inside the 64-slice
    const int64_t kb = k0 + kcol;
    uint2 w = make_uint2(0u, 0u);
    uint8_t sc = 0;
    if (gr < rows && kb < k) {
      w = *reinterpret_cast<const uint2 *>(codes + gr * (k / 2) + kb / 2);
      sc = scales[gr * (k / 16) + kb / 16];
    }
    *reinterpret_cast<uint2 *>(&cs[row][kcol / 2]) = w;
    ss[row][kcol / 16] = sc;
  }
}

__global__ void __launch_bounds__(256) nv_gemm_native(const uint8_t *a, const uint8_t *sa, const float *tsa,
                                                      const uint8_t *b, const uint8_t *sb, const float *tsb,
                                                      int64_t m, int64_t n, int64_t k, void *out, int out_dtype,
                                                      int accumulate) {
#if NV_HAS_FP4_MMA
  __shared__ __align__(16) uint8_t as[NV_BM][NV_BK / 2 + NV_CPAD];
  __shared__ __align__(16) uint8_t bs[NV_BN][NV_BK / 2 + NV_CPAD];
  __shared__ __align__(16) uint8_t sas[NV_BM][4];
  __shared__ __align__(16) uint8_t sbs[NV_BN][4];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int wm = warp >> 2, wn = warp & 3;
  const int64_t m0 = (int64_t)blockIdx.y * NV_BM, n0 = (int64_t)blockIdx.x * NV_BN;
  const uint16_t sel = 0;  // byte-id and thread-id selectors (scale_vec::4X: byte-id 0, thread-id 0)
  float acc[4][4][4];
#pragma unroll
  for (int i = 0; i < 64; ++i) (&acc[0][0][0])[i] = 0.0f;
  for (int64_t k0 = 0; k0 < k; k0 += NV_BK) {
    nv_copy_tile(a, sa, m, k, m0, k0, as, sas, tid);
    nv_copy_tile(b, sb, n, k, n0, k0, bs, sbs, tid);
    __syncthreads();
    uint32_t af[4][4], bf[4][2], sfa[4], sfb[4];
#pragma unroll
    for (int mi = 0; mi < 4; ++mi) {
      const int r = wm * 64 + mi * 16;
      af[mi][0] = *reinterpret_cast<const uint32_t *>(&as[r + g][4 * t]);
      af[mi][1] = *reinterpret_cast<const uint32_t *>(&as[r + g + 8][4 * t]);
      af[mi][2] = *reinterpret_cast<const uint32_t *>(&as[r + g][16 + 4 * t]);
      af[mi][3] = *reinterpret_cast<const uint32_t *>(&as[r + g + 8][16 + 4 * t]);
      sfa[mi] = *reinterpret_cast<const uint32_t *>(&sas[r + (lane >> 2) + 8 * (lane & 1)][0]);
    }
#pragma unroll
    for (int ni = 0; ni < 4; ++ni) {
      const int c = wn * 32 + ni * 8;
      bf[ni][0] = *reinterpret_cast<const uint32_t *>(&bs[c + g][4 * t]);
      bf[ni][1] = *reinterpret_cast<const uint32_t *>(&bs[c + g][16 + 4 * t]);
      sfb[ni] = *reinterpret_cast<const uint32_t *>(&sbs[c + (lane >> 2)][0]);
    }
#pragma unroll
    for (int mi = 0; mi < 4; ++mi) {
#pragma unroll
      for (int ni = 0; ni < 4; ++ni) {
        float *c = acc[mi][ni];
        asm volatile(
            "mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.scale_vec::4X.f32.e2m1.e2m1.f32.ue4m3 "
            "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3}, %10, {%11,%12}, %13, {%14,%15};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(af[mi][0]), "r"(af[mi][1]), "r"(af[mi][2]), "r"(af[mi][3]), "r"(bf[ni][0]), "r"(bf[ni][1]),
              "r"(sfa[mi]), "h"(sel), "h"(sel), "r"(sfb[ni]), "h"(sel), "h"(sel));
      }
    }
    __syncthreads();
  }
  const float alpha = (*tsa) * (*tsb);
  nv_epilogue(acc, m, n, m0, n0, wm, wn, g, t, alpha, out, out_dtype, accumulate);
#else
  __trap();  // host dispatch never selects this kernel on a GPU without FP4 mma.sync
#endif
}

cudaError_t nv_launch_gemm_native(const uint8_t *a, const uint8_t *sa, const float *tsa, const uint8_t *b,
                                  const uint8_t *sb, const float *tsb, int64_t m, int64_t n, int64_t k, void *out,
                                  int out_dtype, int accumulate, cudaStream_t st) {
  if (m == 0 || n == 0) return cudaSuccess;  // empty output: nothing to launch
  dim3 grid((unsigned int)((n + NV_BN - 1) / NV_BN), (unsigned int)((m + NV_BM - 1) / NV_BM));
  nv_gemm_native<<<grid, 256, 0, st>>>(a, sa, tsa, b, sb, tsb, m, n, k, out, out_dtype, accumulate);
  return cudaGetLastError();
}
