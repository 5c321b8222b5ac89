// nvfp4_api.cu -- the extern "C" entry points declared in nvfp4.h: argument checks, backend choice,
// launches on the caller's stream, status codes and a thread-local last-error message.
// Nothing here allocates device memory or synchronises the host.
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "nvfp4_common.cuh"

cudaError_t nv_launch_amax(const void *, int, const uint8_t *, int64_t, int64_t, int64_t, int, int, float *,
                           cudaStream_t);
cudaError_t nv_launch_quantize(const void *, int, const uint8_t *, int64_t, int64_t, int64_t, int, int, int, int, uint32_t,
                               uint32_t, const float *, uint8_t *, uint8_t *, float *, __nv_bfloat16 *, cudaStream_t);
cudaError_t nv_launch_dequantize(const uint8_t *, const uint8_t *, const float *, int64_t, int64_t, void *, int,
                                 cudaStream_t);
cudaError_t nv_launch_hadamard(const void *, int, int64_t, int64_t, float *, cudaStream_t);
cudaError_t nv_launch_decode_bf16(const uint8_t *, const uint8_t *, int64_t, int64_t, __nv_bfloat16 *, cudaStream_t);
cudaError_t nv_launch_gemm_native(const uint8_t *, const uint8_t *, const float *, const uint8_t *, const uint8_t *,
                                  const float *, int64_t, int64_t, int64_t, void *, int, int, cudaStream_t);
int nv_lt_gemm(const __nv_bfloat16 *, int, const __nv_bfloat16 *, int, const float *, const float *, float *, int64_t,
               int64_t, int64_t, void *, int, void *, size_t, cudaStream_t, char *, size_t, int *);
const char *nv_lt_library(void);
cudaError_t nv_launch_mxfp8_encode(const void *, int, int64_t, int64_t, int, uint32_t, uint32_t, uint8_t *, uint8_t *,
                                   cudaStream_t);
cudaError_t nv_launch_mxfp8_decode(const uint8_t *, const uint8_t *, int64_t, int64_t, void *, int, cudaStream_t);
cudaError_t nv_launch_lion(uint8_t *, uint8_t *, const void *, int, __nv_bfloat16 *, float *, int64_t, int64_t, float,
                           float, float, float, float, float, int, uint32_t, uint32_t, cudaStream_t);
cudaError_t nv_launch_sr_bf16(__nv_bfloat16 *, const float *, int64_t, uint32_t, uint32_t, cudaStream_t);
cudaError_t nv_launch_lion_bf16(__nv_bfloat16 *, const void *, int, __nv_bfloat16 *, int64_t, float, float, float, float,
                                float, float, int, uint32_t, uint32_t, cudaStream_t);

#define NVFP4_OK 0
#define NVFP4_ERR_INVALID 1
#define NVFP4_ERR_CUDA 2
#define NVFP4_ERR_UNSUPPORTED 3
#define NVFP4_ABI_VERSION 3

static thread_local char g_last_error[512] = "";

static int nv_fail(int status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_last_error, sizeof(g_last_error), fmt, ap);
  va_end(ap);
  return status;
}

static int nv_cuda_status(cudaError_t e, const char *what) {
  if (e == cudaSuccess) return NVFP4_OK;
  return nv_fail(NVFP4_ERR_CUDA, "%s: CUDA error %d (%s): %s", what, (int)e, cudaGetErrorName(e),
                 cudaGetErrorString(e));
}

#define NV_REQUIRE(cond, ...)                                  \
  do {                                                         \
    if (!(cond)) return nv_fail(NVFP4_ERR_INVALID, __VA_ARGS__); \
  } while (0)

#define PTR(p) ((void *)(p))
#define STREAM(s) ((cudaStream_t)(s))

extern "C" {

int nvfp4_abi_version(void) { return NVFP4_ABI_VERSION; }

int nvfp4_last_error(char *buf, size_t n) {
  if (buf == nullptr || n == 0) return NVFP4_ERR_INVALID;
  snprintf(buf, n, "%s", g_last_error);
  return NVFP4_OK;
}

const char *nvfp4_status_string(int status) {
  switch (status) {
    case NVFP4_OK: return "ok";
    case NVFP4_ERR_INVALID: return "invalid argument";
    case NVFP4_ERR_CUDA: return "CUDA error";
    case NVFP4_ERR_UNSUPPORTED: return "unsupported on this device";
    default: return "unknown status";
  }
}

int nvfp4_query(int *device_count, int *cc_major, int *cc_minor, int *native_fp4_compiled) {
  NV_REQUIRE(device_count && cc_major && cc_minor && native_fp4_compiled, "nvfp4_query: null output pointer");
  *device_count = 0;
  *cc_major = *cc_minor = 0;
  *native_fp4_compiled = 1;  // the library always carries an sm_120a image
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) return nv_cuda_status(e, "nvfp4_query: cudaGetDeviceCount");
  *device_count = count;
  if (count == 0) return NVFP4_OK;
  int dev = 0;
  e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return nv_cuda_status(e, "nvfp4_query: cudaGetDevice");
  e = cudaDeviceGetAttribute(cc_major, cudaDevAttrComputeCapabilityMajor, dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(cc_minor, cudaDevAttrComputeCapabilityMinor, dev);
  return nv_cuda_status(e, "nvfp4_query: cudaDeviceGetAttribute");
}

// valid_cols: see nvfp4.h (only a transposed input may be padded, by fewer than 16 columns).
static bool nv_valid_cols_ok(int64_t cols, int64_t valid_cols, int transpose) {
  return valid_cols == cols || (transpose && valid_cols >= 0 && valid_cols < cols && cols - valid_cols < 16);
}

int nvfp4_amax(uintptr_t x, int dtype, uintptr_t x_scales, int64_t rows, int64_t cols, int64_t valid_cols,
               int transpose, int hadamard, uintptr_t amax_out, uintptr_t stream) {
  const bool empty = rows == 0 || cols == 0;  // an empty tensor's data pointer may be null
  NV_REQUIRE((x || empty) && amax_out, "nvfp4_amax: null pointer");
  NV_REQUIRE(dtype >= 0 && dtype <= 2 && (dtype != 2 || x_scales || empty), "nvfp4_amax: bad dtype %d", dtype);
  NV_REQUIRE(rows >= 0 && cols >= 0 && cols % 16 == 0, "nvfp4_amax: cols %lld not a multiple of 16", (long long)cols);
  NV_REQUIRE(nv_valid_cols_ok(cols, valid_cols, transpose), "nvfp4_amax: valid_cols %lld with cols %lld, transpose %d",
             (long long)valid_cols, (long long)cols, transpose);
  return nv_cuda_status(nv_launch_amax(PTR(x), dtype, (const uint8_t *)x_scales, rows, cols, valid_cols, transpose,
                                       hadamard,
                                       (float *)amax_out, STREAM(stream)),
                        "nvfp4_amax");
}

int nvfp4_quantize(uintptr_t x, int dtype, uintptr_t x_scales, int64_t rows, int64_t cols, int64_t valid_cols,
                   int transpose, int hadamard, int block_2d, int rounding, uint32_t key2, uint32_t key3, uintptr_t amax,
                   uintptr_t codes, uintptr_t block_scales, uintptr_t tensor_scale, uintptr_t decoded,
                   uintptr_t stream) {
  const bool empty = rows == 0 || cols == 0;  // an empty tensor's data pointer may be null
  NV_REQUIRE((x || empty) && (decoded || (codes && block_scales) || empty) && amax && tensor_scale,
             "nvfp4_quantize: null pointer");
  NV_REQUIRE(decoded % 16 == 0, "nvfp4_quantize: decoded output not 16-byte aligned");
  NV_REQUIRE(dtype >= 0 && dtype <= 2 && (dtype != 2 || x_scales || empty), "nvfp4_quantize: bad dtype %d", dtype);
  NV_REQUIRE(rows >= 0 && cols >= 0 && cols % 16 == 0, "nvfp4_quantize: cols %lld not a multiple of 16",
             (long long)cols);
  NV_REQUIRE(rounding == 0 || rounding == 1, "nvfp4_quantize: bad rounding %d", rounding);
  NV_REQUIRE(codes % 8 == 0, "nvfp4_quantize: codes pointer not 8-byte aligned");
  NV_REQUIRE(nv_valid_cols_ok(cols, valid_cols, transpose),
             "nvfp4_quantize: valid_cols %lld with cols %lld, transpose %d", (long long)valid_cols, (long long)cols,
             transpose);
  NV_REQUIRE(transpose ? (cols / 16 + 7) / 8 <= 65535 : rows / 16 < 65535, "nvfp4_quantize: [%lld, %lld] too large for "
             "the grid", (long long)rows, (long long)cols);
  return nv_cuda_status(nv_launch_quantize(PTR(x), dtype, (const uint8_t *)x_scales, rows, cols, valid_cols, transpose,
                                           hadamard,
                                           block_2d, rounding, key2, key3, (const float *)amax, (uint8_t *)codes,
                                           (uint8_t *)block_scales, (float *)tensor_scale, (__nv_bfloat16 *)decoded,
                                           STREAM(stream)),
                        "nvfp4_quantize");
}

int nvfp4_dequantize(uintptr_t codes, uintptr_t block_scales, uintptr_t tensor_scale, int64_t rows, int64_t cols,
                     uintptr_t out, int out_dtype, uintptr_t stream) {
  const bool empty = rows == 0 || cols == 0;  // an empty tensor's data pointer may be null
  NV_REQUIRE(((codes && block_scales && out) || empty) && tensor_scale, "nvfp4_dequantize: null pointer");
  NV_REQUIRE(cols % 16 == 0 && (out_dtype == 0 || out_dtype == 1), "nvfp4_dequantize: bad shape or dtype");
  return nv_cuda_status(nv_launch_dequantize((const uint8_t *)codes, (const uint8_t *)block_scales,
                                             (const float *)tensor_scale, rows, cols, PTR(out), out_dtype,
                                             STREAM(stream)),
                        "nvfp4_dequantize");
}

int nvfp4_hadamard16(uintptr_t x, int dtype, int64_t rows, int64_t cols, uintptr_t out_f32, uintptr_t stream) {
  NV_REQUIRE(((x && out_f32) || rows == 0 || cols == 0) && (dtype == 0 || dtype == 1), "nvfp4_hadamard16: bad arguments");
  NV_REQUIRE(cols % 16 == 0, "nvfp4_hadamard16: cols %lld not a multiple of 16", (long long)cols);
  return nv_cuda_status(nv_launch_hadamard(PTR(x), dtype, rows, cols, (float *)out_f32, STREAM(stream)),
                        "nvfp4_hadamard16");
}

int nvfp4_decode_bf16(uintptr_t codes, uintptr_t block_scales, int64_t rows, int64_t cols, uintptr_t out,
                      uintptr_t stream) {
  const bool empty = rows == 0 || cols == 0;  // an empty tensor's data pointer may be null
  NV_REQUIRE((codes && block_scales && out) || empty, "nvfp4_decode_bf16: null pointer");
  NV_REQUIRE(rows >= 0 && cols >= 0 && cols % 16 == 0, "nvfp4_decode_bf16: [%lld, %lld]: cols not a multiple of 16",
             (long long)rows, (long long)cols);
  NV_REQUIRE(codes % 8 == 0 && out % 16 == 0, "nvfp4_decode_bf16: codes must be 8-byte and out 16-byte aligned");
  return nv_cuda_status(nv_launch_decode_bf16((const uint8_t *)codes, (const uint8_t *)block_scales, rows, cols,
                                              (__nv_bfloat16 *)out, STREAM(stream)),
                        "nvfp4_decode_bf16");
}

int nvfp4_gemm_bf16(uintptr_t a, int a_trans, uintptr_t b, int b_trans, uintptr_t a_ts, uintptr_t b_ts,
                    uintptr_t alpha_beta, int64_t m, int64_t n, int64_t k, uintptr_t out, int out_dtype,
                    uintptr_t workspace, uint64_t workspace_bytes, uintptr_t stream) {
  NV_REQUIRE((a || m * k == 0) && (b || n * k == 0) && (out || m * n == 0) && a_ts && b_ts && alpha_beta,
             "nvfp4_gemm_bf16: null pointer");
  NV_REQUIRE(m >= 0 && n >= 0 && k >= 0, "nvfp4_gemm_bf16: negative size");
  NV_REQUIRE(out_dtype == 0 || out_dtype == 1, "nvfp4_gemm_bf16: bad out dtype %d", out_dtype);
  NV_REQUIRE(workspace || workspace_bytes == 0, "nvfp4_gemm_bf16: workspace_bytes without a workspace");
  if (m == 0 || n == 0) return NVFP4_OK;  // empty output
  if (k == 0)  // an empty sum: zeros (alpha * 0 = +0)
    return nv_cuda_status(cudaMemsetAsync(PTR(out), 0, (size_t)(m * n) * (out_dtype == 0 ? 4 : 2), STREAM(stream)),
                          "nvfp4_gemm_bf16: cudaMemsetAsync");
  char msg[400];
  int cuda_error = 0;
  int rc = nv_lt_gemm((const __nv_bfloat16 *)a, a_trans, (const __nv_bfloat16 *)b, b_trans, (const float *)a_ts,
                      (const float *)b_ts, (float *)alpha_beta, m, n, k, PTR(out), out_dtype, PTR(workspace),
                      (size_t)workspace_bytes, STREAM(stream), msg, sizeof(msg), &cuda_error);
  if (rc == 0) return NVFP4_OK;
  return nv_fail(rc == 2 ? NVFP4_ERR_UNSUPPORTED : (cuda_error ? NVFP4_ERR_CUDA : NVFP4_ERR_INVALID),
                 "nvfp4_gemm_bf16: %s", msg);
}

int nvfp4_cublaslt_library(char *buf, size_t n) {
  NV_REQUIRE(buf && n, "nvfp4_cublaslt_library: null buffer");
  snprintf(buf, n, "%s", nv_lt_library());
  return NVFP4_OK;
}

int nvfp4_gemm_native(uintptr_t a_codes, uintptr_t a_scales, uintptr_t a_ts, uintptr_t b_codes, uintptr_t b_scales,
                      uintptr_t b_ts, int64_t m, int64_t n, int64_t k, uintptr_t out, int out_dtype, int accumulate,
                      uintptr_t stream) {
  // an empty operand's data pointers may be null
  NV_REQUIRE(((a_codes && a_scales) || m * k == 0) && ((b_codes && b_scales) || n * k == 0) && (out || m * n == 0) &&
                 a_ts && b_ts,
             "nvfp4_gemm_native: null pointer");
  NV_REQUIRE(k % 16 == 0 && m >= 0 && n >= 0, "nvfp4_gemm_native: K=%lld not a multiple of 16", (long long)k);
  NV_REQUIRE(a_codes % 8 == 0 && b_codes % 8 == 0, "nvfp4_gemm_native: code pointers must be 8-byte aligned");
  NV_REQUIRE(out_dtype == 0 || out_dtype == 1, "nvfp4_gemm_native: bad out dtype %d", out_dtype);
  NV_REQUIRE((m + 127) / 128 < 65535, "nvfp4_gemm_native: M=%lld too large", (long long)m);
  int dev = 0, major = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  if (e != cudaSuccess) return nv_cuda_status(e, "nvfp4_gemm_native: device query");
  if (major != 12)
    return nv_fail(NVFP4_ERR_UNSUPPORTED, "nvfp4_gemm_native: native FP4 mma.sync needs compute capability 12.x, "
                   "device has %d.x (use the emulated backend)", major);
  return nv_cuda_status(nv_launch_gemm_native((const uint8_t *)a_codes, (const uint8_t *)a_scales, (const float *)a_ts,
                                              (const uint8_t *)b_codes, (const uint8_t *)b_scales, (const float *)b_ts,
                                              m, n, k, PTR(out), out_dtype, accumulate, STREAM(stream)),
                        "nvfp4_gemm_native");
}

int nvfp4_mxfp8_encode(uintptr_t x, int dtype, int64_t rows, int64_t cols, int rounding, uint32_t key2, uint32_t key3,
                       uintptr_t payload, uintptr_t scales, uintptr_t stream) {
  NV_REQUIRE(x && payload && scales && (dtype == 0 || dtype == 1), "nvfp4_mxfp8_encode: bad arguments");
  NV_REQUIRE(rounding == 0 || rounding == 1, "nvfp4_mxfp8_encode: bad rounding %d", rounding);
  return nv_cuda_status(nv_launch_mxfp8_encode(PTR(x), dtype, rows, cols, rounding, key2, key3, (uint8_t *)payload,
                                               (uint8_t *)scales, STREAM(stream)),
                        "nvfp4_mxfp8_encode");
}

int nvfp4_mxfp8_decode(uintptr_t payload, uintptr_t scales, int64_t rows, int64_t cols, uintptr_t out, int out_dtype,
                       uintptr_t stream) {
  NV_REQUIRE(payload && scales && out && (out_dtype == 0 || out_dtype == 1), "nvfp4_mxfp8_decode: bad arguments");
  return nv_cuda_status(nv_launch_mxfp8_decode((const uint8_t *)payload, (const uint8_t *)scales, rows, cols, PTR(out),
                                               out_dtype, STREAM(stream)),
                        "nvfp4_mxfp8_decode");
}

int nvfp4_lion_step_mxfp8(uintptr_t payload, uintptr_t scales, uintptr_t grad, int grad_dtype, uintptr_t momentum,
                          uintptr_t compensation, int64_t rows, int64_t cols, float neg_lr, float decay, float beta1,
                          float one_minus_beta1, float beta2, float one_minus_beta2, int writeback, uint32_t key2,
                          uint32_t key3, uintptr_t stream) {
  NV_REQUIRE(payload && scales && grad && momentum && (grad_dtype == 0 || grad_dtype == 1),
             "nvfp4_lion_step_mxfp8: bad arguments");
  NV_REQUIRE(writeback >= 0 && writeback <= 2, "nvfp4_lion_step_mxfp8: bad writeback %d", writeback);
  NV_REQUIRE(writeback != 2 || compensation, "nvfp4_lion_step_mxfp8: compensated write-back needs a buffer");
  return nv_cuda_status(nv_launch_lion((uint8_t *)payload, (uint8_t *)scales, PTR(grad), grad_dtype,
                                       (__nv_bfloat16 *)momentum, (float *)compensation, rows, cols, neg_lr, decay,
                                       beta1, one_minus_beta1, beta2, one_minus_beta2, writeback, key2, key3,
                                       STREAM(stream)),
                        "nvfp4_lion_step_mxfp8");
}

int nvfp4_lion_step_bf16(uintptr_t param, uintptr_t grad, int grad_dtype, uintptr_t momentum, int64_t n, float lr,
                         float decay, float beta1, float one_minus_beta1, float beta2, float one_minus_beta2,
                         int writeback, uint32_t key2, uint32_t key3, uintptr_t stream) {
  NV_REQUIRE(((param && grad && momentum) || n == 0) && n >= 0 && (grad_dtype == 0 || grad_dtype == 1),
             "nvfp4_lion_step_bf16: bad arguments");
  NV_REQUIRE(writeback >= 0 && writeback <= 2, "nvfp4_lion_step_bf16: bad writeback %d", writeback);
  return nv_cuda_status(nv_launch_lion_bf16((__nv_bfloat16 *)param, PTR(grad), grad_dtype, (__nv_bfloat16 *)momentum, n,
                                            lr, decay, beta1, one_minus_beta1, beta2, one_minus_beta2, writeback, key2,
                                            key3, STREAM(stream)),
                        "nvfp4_lion_step_bf16");
}

int nvfp4_sr_bf16(uintptr_t dst_bf16, uintptr_t src_f32, int64_t n, uint32_t key2, uint32_t key3, uintptr_t stream) {
  NV_REQUIRE(dst_bf16 && src_f32 && n >= 0, "nvfp4_sr_bf16: bad arguments");
  return nv_cuda_status(nv_launch_sr_bf16((__nv_bfloat16 *)dst_bf16, (const float *)src_f32, n, key2, key3,
                                          STREAM(stream)),
                        "nvfp4_sr_bf16");
}

}  // extern "C"
