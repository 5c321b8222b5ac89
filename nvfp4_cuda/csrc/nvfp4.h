/* nvfp4.h -- plain C ABI of libnvfp4_cuda (declarations only; parsed by cffi's cdef).
 *
 * Conventions: every function returns an int status (NVFP4_OK = 0) and never allocates memory or
 * synchronises the host; on failure nvfp4_last_error() copies a message.  Device pointers and the
 * CUDA stream are passed as uintptr_t (tensor.data_ptr(), torch.cuda.current_stream().cuda_stream).
 * Matrices are row-major and contiguous.  "Logical" shape [rows, cols]: with transpose = 1 the
 * input is stored as [valid_cols, rows] and its transpose is processed, the logical columns from valid_cols
 * on (fewer than 16: a token axis padded to a block) reading as zeros; valid_cols = cols otherwise.  The emulated GEMM is two calls:
 * nvfp4_decode_bf16 per operand (exact e2m1 * e4m3 values in BF16), then nvfp4_gemm_bf16 (cuBLASLt, FP32
 * accumulation, alpha = the product of the two tensor scales read on the device); a_trans / b_trans = 1
 * take an operand stored as the transpose ([K, rows]).  nvfp4_gemm_native is the sm_120a FP4 MMA.
 * nvfp4_quantize with decoded != 0 writes the BF16 values e2m1 * e4m3 [rows, cols] (16-byte aligned)
 * instead of codes and block scales (which may then be 0): a GEMM operand in one pass.  Stochastic rounding uses the
 * counter RNG of nvfp4_cuda/rng.py; the two round keys (key2, key3) are computed on the host.
 * Semantics are specified in docs/nvfp4.md and implemented bit-for-bit by nvfp4_cuda/reference.py.
 */
#define NVFP4_OK 0
#define NVFP4_ERR_INVALID 1
#define NVFP4_ERR_CUDA 2
#define NVFP4_ERR_UNSUPPORTED 3

#define NVFP4_DTYPE_F32 0
#define NVFP4_DTYPE_BF16 1
#define NVFP4_DTYPE_MXFP8 2

#define NVFP4_ROUND_RNE 0
#define NVFP4_ROUND_STOCHASTIC 1

#define NVFP4_WRITEBACK_STOCHASTIC 0
#define NVFP4_WRITEBACK_RNE 1
#define NVFP4_WRITEBACK_COMPENSATED 2

int nvfp4_abi_version(void);
int nvfp4_last_error(char *buf, size_t n);
const char *nvfp4_status_string(int status);
int nvfp4_query(int *device_count, int *cc_major, int *cc_minor, int *native_fp4_compiled);

int nvfp4_amax(uintptr_t x, int dtype, uintptr_t x_scales, int64_t rows, int64_t cols, int64_t valid_cols,
               int transpose, int hadamard, uintptr_t amax_out, uintptr_t stream);
int nvfp4_quantize(uintptr_t x, int dtype, uintptr_t x_scales, int64_t rows, int64_t cols, int64_t valid_cols,
                   int transpose, int hadamard, int block_2d, int rounding, uint32_t key2, uint32_t key3, uintptr_t amax,
                   uintptr_t codes, uintptr_t block_scales, uintptr_t tensor_scale, uintptr_t decoded,
                   uintptr_t stream);
int nvfp4_dequantize(uintptr_t codes, uintptr_t block_scales, uintptr_t tensor_scale, int64_t rows, int64_t cols,
                     uintptr_t out, int out_dtype, uintptr_t stream);
int nvfp4_hadamard16(uintptr_t x, int dtype, int64_t rows, int64_t cols, uintptr_t out_f32, uintptr_t stream);
int nvfp4_decode_bf16(uintptr_t codes, uintptr_t block_scales, int64_t rows, int64_t cols, uintptr_t out,
                      uintptr_t stream);
int nvfp4_gemm_bf16(uintptr_t a, int a_trans, uintptr_t b, int b_trans, uintptr_t a_tensor_scale,
                    uintptr_t b_tensor_scale, uintptr_t alpha_beta, int64_t m, int64_t n, int64_t k, uintptr_t out,
                    int out_dtype, uintptr_t workspace, uint64_t workspace_bytes, uintptr_t stream);
int nvfp4_cublaslt_library(char *buf, size_t n);
int nvfp4_gemm_native(uintptr_t a_codes, uintptr_t a_scales, uintptr_t a_tensor_scale, uintptr_t b_codes,
                      uintptr_t b_scales, uintptr_t b_tensor_scale, int64_t m, int64_t n, int64_t k, uintptr_t out,
                      int out_dtype, int accumulate, uintptr_t stream);

int nvfp4_mxfp8_encode(uintptr_t x, int dtype, int64_t rows, int64_t cols, int rounding, uint32_t key2,
                       uint32_t key3, uintptr_t payload, uintptr_t scales, uintptr_t stream);
int nvfp4_mxfp8_decode(uintptr_t payload, uintptr_t scales, int64_t rows, int64_t cols, uintptr_t out,
                       int out_dtype, uintptr_t stream);
int nvfp4_lion_step_mxfp8(uintptr_t payload, uintptr_t scales, uintptr_t grad, int grad_dtype, uintptr_t momentum,
                          uintptr_t compensation, int64_t rows, int64_t cols, float neg_lr, float decay, float beta1,
                          float one_minus_beta1, float beta2, float one_minus_beta2, int writeback, uint32_t key2,
                          uint32_t key3, uintptr_t stream);
int nvfp4_lion_step_bf16(uintptr_t param, uintptr_t grad, int grad_dtype, uintptr_t momentum, int64_t n, float lr,
                         float decay, float beta1, float one_minus_beta1, float beta2, float one_minus_beta2,
                         int writeback, uint32_t key2, uint32_t key3, uintptr_t stream);
int nvfp4_sr_bf16(uintptr_t dst_bf16, uintptr_t src_f32, int64_t n, uint32_t key2, uint32_t key3, uintptr_t stream);
