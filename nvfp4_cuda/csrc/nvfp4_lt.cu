// nvfp4_lt.cu -- the emulated NVFP4 GEMM's matrix product: cuBLASLt's BF16 GEMM with FP32 accumulation on
// operands decoded exactly to BF16 (nv_decode_bf16_kernel), the two per-tensor FP32 scales as its alpha.
//
//   out[M, N] = alpha * A[M, K] B[N, K]^T,   alpha = tsa * tsb (one float32 product, on the device)
//
// alpha is read by cuBLASLt from device memory (CUBLASLT_POINTER_MODE_DEVICE), so no host sync; beta = 0.
// The epilogue is then alpha * acc in float32 and one RNE cast to the output type: the reference's
// ``(acc * (S_a * S_b)).to(out_dtype)`` (nvfp4_cuda/reference.py), bit for bit wherever the float32 sums
// are exact.  Each operand is row-major [rows, K] (trans = 0) or the transpose of a row-major [K, rows]
// (trans = 1), so one decoded weight serves the forward GEMM (W^T) and the data-gradient GEMM (W).
//
// cuBLASLt is not linked: it is found at the first call among the libraries already loaded in the
// process (a CUDA build of PyTorch loads its libcublasLt.so.*), else opened by soname, and its entry
// points are taken with dlsym.  The declarations below are the few types and enum values of
// cublasLt.h / cublas_api.h / library_types.h that we use (values from CUDA 12-13; stable ABI).
// One cuBLASLt handle per device, created on first use; one plan (descriptors + algorithm) per GEMM shape,
// built on first use (below).  Caller provides the workspace and the float[2]
// (alpha, beta) scratch in device memory: nothing here allocates device memory.
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "nvfp4_common.cuh"

typedef int nv_lt_status;  // cublasStatus_t, CUBLAS_STATUS_SUCCESS = 0
typedef void *nv_lt_handle;
typedef void *nv_lt_desc;
typedef void *nv_lt_layout;
typedef void *nv_lt_pref;
typedef struct {
  uint64_t data[8];
} nv_lt_algo;  // cublasLtMatmulAlgo_t
typedef struct {
  nv_lt_algo algo;
  size_t workspaceSize;
  nv_lt_status state;
  float wavesCount;
  int reserved[4];
} nv_lt_heuristic;  // cublasLtMatmulHeuristicResult_t

#define NV_CUDA_R_32F 0
#define NV_CUDA_R_16BF 14
#define NV_CUBLAS_COMPUTE_32F 68
#define NV_CUBLAS_OP_N 0
#define NV_CUBLAS_OP_T 1
#define NV_LT_DESC_POINTER_MODE 2
#define NV_LT_DESC_TRANSA 3
#define NV_LT_DESC_TRANSB 4
#define NV_LT_POINTER_MODE_DEVICE 1
#define NV_LT_PREF_MAX_WORKSPACE_BYTES 1
#define NV_LT_PREF_MIN_ALIGNMENT_A_BYTES 5  // B, C, D follow: 6, 7, 8

struct nv_lt_api {
  nv_lt_status (*create)(nv_lt_handle *);
  nv_lt_status (*desc_create)(nv_lt_desc *, int, int);
  nv_lt_status (*desc_destroy)(nv_lt_desc);
  nv_lt_status (*desc_set)(nv_lt_desc, int, const void *, size_t);
  nv_lt_status (*layout_create)(nv_lt_layout *, int, uint64_t, uint64_t, int64_t);
  nv_lt_status (*layout_destroy)(nv_lt_layout);
  nv_lt_status (*pref_create)(nv_lt_pref *);
  nv_lt_status (*pref_destroy)(nv_lt_pref);
  nv_lt_status (*pref_set)(nv_lt_pref, int, const void *, size_t);
  nv_lt_status (*heuristic)(nv_lt_handle, nv_lt_desc, nv_lt_layout, nv_lt_layout, nv_lt_layout, nv_lt_layout,
                            nv_lt_pref, int, nv_lt_heuristic *, int *);
  nv_lt_status (*matmul)(nv_lt_handle, nv_lt_desc, const void *, const void *, nv_lt_layout, const void *,
                         nv_lt_layout, const void *, const void *, nv_lt_layout, void *, nv_lt_layout,
                         const nv_lt_algo *, void *, size_t, cudaStream_t);
};

#define NV_MAX_DEVICES 64
static pthread_mutex_t g_lt_mutex = PTHREAD_MUTEX_INITIALIZER;
static nv_lt_api g_lt;
static int g_lt_state = 0;  // 0 not tried, 1 loaded, -1 not found
static char g_lt_path[512] = "";
static nv_lt_handle g_lt_handles[NV_MAX_DEVICES];

static int nv_find_loaded_lt(struct dl_phdr_info *info, size_t, void *) {
  if (info->dlpi_name && strstr(info->dlpi_name, "libcublasLt.so")) {
    snprintf(g_lt_path, sizeof(g_lt_path), "%s", info->dlpi_name);
    return 1;
  }
  return 0;
}

// Load cuBLASLt once; on failure *why says what was tried.  Called with g_lt_mutex held.
static int nv_lt_load(const char **why) {
  if (g_lt_state != 0) {
    *why = "cuBLASLt not found: no libcublasLt.so* loaded in this process (a CUDA build of PyTorch loads "
           "one) and none opened by soname (libcublasLt.so.13 / .12 / .so)";
    return g_lt_state == 1;
  }
  void *h = nullptr;
  g_lt_path[0] = 0;
  dl_iterate_phdr(nv_find_loaded_lt, nullptr);
  if (g_lt_path[0]) h = dlopen(g_lt_path, RTLD_NOW | RTLD_LOCAL);
  const char *names[] = {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"};
  for (int i = 0; !h && i < 3; ++i) h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  bool ok = h != nullptr;
#define NV_SYM(field, name) \
  if (ok) ok = (*(void **)&g_lt.field = dlsym(h, name)) != nullptr
  NV_SYM(create, "cublasLtCreate");
  NV_SYM(desc_create, "cublasLtMatmulDescCreate");
  NV_SYM(desc_destroy, "cublasLtMatmulDescDestroy");
  NV_SYM(desc_set, "cublasLtMatmulDescSetAttribute");
  NV_SYM(layout_create, "cublasLtMatrixLayoutCreate");
  NV_SYM(layout_destroy, "cublasLtMatrixLayoutDestroy");
  NV_SYM(pref_create, "cublasLtMatmulPreferenceCreate");
  NV_SYM(pref_destroy, "cublasLtMatmulPreferenceDestroy");
  NV_SYM(pref_set, "cublasLtMatmulPreferenceSetAttribute");
  NV_SYM(heuristic, "cublasLtMatmulAlgoGetHeuristic");
  NV_SYM(matmul, "cublasLtMatmul");
#undef NV_SYM
  g_lt_state = ok ? 1 : -1;
  *why = "cuBLASLt not found: no libcublasLt.so* loaded in this process (a CUDA build of PyTorch loads one) "
         "and none opened by soname (libcublasLt.so.13 / .12 / .so), or it lacks a cublasLt entry point";
  return ok;
}

// The loaded library's path ("" when none): reported by nvfp4_cublaslt_info.
const char *nv_lt_library(void) { return g_lt_state == 1 ? g_lt_path : ""; }

__global__ void nv_alpha_kernel(const float *tsa, const float *tsb, float *alpha_beta) {
  alpha_beta[0] = (*tsa) * (*tsb);  // one float32 rounding, as the reference's S_dec_a * S_dec_b
  alpha_beta[1] = 0.0f;
}

// Descriptors and the heuristic's algorithm for one GEMM shape, built once and reused: creating them and
// asking the heuristic costs tens of microseconds of host time per call, as much as a small GEMM.  The
// cache holds NV_LT_PLANS shapes (a training step has a few dozen); when full, the oldest entry is
// replaced.  Plans are immutable once published; the mutex guards the table.
#define NV_LT_PLANS 256
struct nv_lt_plan {
  int dev, a_trans, b_trans, out_dtype;
  int64_t m, n, k;
  size_t ws;
  uint32_t align[4];  // pointer alignment in bytes (<= 256) of cuBLAS's A (our B), B (our A), C, D
  nv_lt_desc desc;
  nv_lt_layout la, lb, lc;
  nv_lt_algo algo;
};
static nv_lt_plan g_lt_plans[NV_LT_PLANS];
static int g_lt_nplans = 0, g_lt_next = 0;

static void nv_lt_plan_free(nv_lt_plan *p) {
  if (p->lc) g_lt.layout_destroy(p->lc);
  if (p->lb) g_lt.layout_destroy(p->lb);
  if (p->la) g_lt.layout_destroy(p->la);
  if (p->desc) g_lt.desc_destroy(p->desc);
  memset(p, 0, sizeof(*p));
}

// Column-major view: out^T [N, M] (ld N) = op(B) [N, K] x op(A) [K, M].
static nv_lt_status nv_lt_plan_build(nv_lt_handle handle, nv_lt_plan *p, char *buf, size_t buf_n) {
  const int opa = p->b_trans ? NV_CUBLAS_OP_N : NV_CUBLAS_OP_T;  // cuBLAS "A" is our B
  const int opb = p->a_trans ? NV_CUBLAS_OP_T : NV_CUBLAS_OP_N;  // cuBLAS "B" is our A
  const int mode = NV_LT_POINTER_MODE_DEVICE;
  const uint64_t ws = p->ws;
  const int dtype_out = p->out_dtype == 0 ? NV_CUDA_R_32F : NV_CUDA_R_16BF;
  const int64_t m = p->m, n = p->n, k = p->k;
  nv_lt_pref pref = nullptr;
  nv_lt_heuristic heur;
  int found = 0;
  const char *step = "cublasLtMatmulDescCreate";
  nv_lt_status s = g_lt.desc_create(&p->desc, NV_CUBLAS_COMPUTE_32F, NV_CUDA_R_32F);
  if (s == 0) step = "cublasLtMatmulDescSetAttribute", s = g_lt.desc_set(p->desc, NV_LT_DESC_TRANSA, &opa, sizeof(opa));
  if (s == 0) s = g_lt.desc_set(p->desc, NV_LT_DESC_TRANSB, &opb, sizeof(opb));
  if (s == 0) s = g_lt.desc_set(p->desc, NV_LT_DESC_POINTER_MODE, &mode, sizeof(mode));
  if (s == 0) {
    step = "cublasLtMatrixLayoutCreate";
    s = p->b_trans ? g_lt.layout_create(&p->la, NV_CUDA_R_16BF, n, k, n)
                   : g_lt.layout_create(&p->la, NV_CUDA_R_16BF, k, n, k);
  }
  if (s == 0)
    s = p->a_trans ? g_lt.layout_create(&p->lb, NV_CUDA_R_16BF, m, k, m)
                   : g_lt.layout_create(&p->lb, NV_CUDA_R_16BF, k, m, k);
  if (s == 0) s = g_lt.layout_create(&p->lc, dtype_out, n, m, n);
  if (s == 0) step = "cublasLtMatmulPreferenceCreate", s = g_lt.pref_create(&pref);
  if (s == 0) s = g_lt.pref_set(pref, NV_LT_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  for (int i = 0; s == 0 && i < 4; ++i)  // the heuristic assumes 256-byte pointers unless told otherwise
    s = g_lt.pref_set(pref, NV_LT_PREF_MIN_ALIGNMENT_A_BYTES + i, &p->align[i], sizeof(p->align[i]));
  if (s == 0)
    step = "cublasLtMatmulAlgoGetHeuristic",
    s = g_lt.heuristic(handle, p->desc, p->la, p->lb, p->lc, p->lc, pref, 1, &heur, &found);
  if (pref) g_lt.pref_destroy(pref);
  if (s == 0 && found < 1) {
    snprintf(buf, buf_n, "cublasLtMatmulAlgoGetHeuristic found no algorithm for M=%lld N=%lld K=%lld", (long long)m,
             (long long)n, (long long)k);
    return -1;
  }
  if (s != 0) {
    snprintf(buf, buf_n, "%s failed with cuBLAS status %d (M=%lld N=%lld K=%lld)", step, s, (long long)m, (long long)n,
             (long long)k);
    return s;
  }
  p->algo = heur.algo;
  return 0;
}

static uint32_t nv_alignment(const void *ptr) {
  const uintptr_t v = (uintptr_t)ptr;
  uint32_t a = 256;
  while (a > 1 && v % a) a >>= 1;
  return a;
}

// The plan for this call's shape and alignments; called with g_lt_mutex held (the plan stays valid while it is).
static nv_lt_status nv_lt_plan_for(nv_lt_handle handle, int dev, int64_t m, int64_t n, int64_t k, int a_trans,
                                   int b_trans, int out_dtype, size_t ws, const uint32_t *align, nv_lt_plan **out,
                                   char *buf, size_t buf_n) {
  for (int i = 0; i < g_lt_nplans; ++i) {
    nv_lt_plan *p = &g_lt_plans[i];
    if (p->dev == dev && p->m == m && p->n == n && p->k == k && p->a_trans == a_trans && p->b_trans == b_trans &&
        p->out_dtype == out_dtype && p->ws == ws && !memcmp(p->align, align, sizeof(p->align))) {
      *out = p;
      return 0;
    }
  }
  int slot = g_lt_nplans < NV_LT_PLANS ? g_lt_nplans++ : (g_lt_next++ % NV_LT_PLANS);
  nv_lt_plan *p = &g_lt_plans[slot];
  nv_lt_plan_free(p);
  p->dev = dev, p->m = m, p->n = n, p->k = k, p->a_trans = a_trans, p->b_trans = b_trans, p->out_dtype = out_dtype;
  p->ws = ws;
  memcpy(p->align, align, sizeof(p->align));
  nv_lt_status s = nv_lt_plan_build(handle, p, buf, buf_n);
  if (s != 0) {
    nv_lt_plan_free(p);
    p->m = -1;  // never matches
  }
  *out = p;
  return s;
}

// Returns 0 on success; otherwise a message in *err (static text, or buf).
int nv_lt_gemm(const __nv_bfloat16 *a, int a_trans, const __nv_bfloat16 *b, int b_trans, const float *tsa,
               const float *tsb, float *alpha_beta, int64_t m, int64_t n, int64_t k, void *out, int out_dtype,
               void *workspace, size_t ws_bytes, cudaStream_t st, char *buf, size_t buf_n, int *cuda_error) {
  *cuda_error = 0;
  const char *why = nullptr;
  int dev = 0;
  cudaError_t ce = cudaGetDevice(&dev);
  if (ce != cudaSuccess) {
    *cuda_error = (int)ce;
    snprintf(buf, buf_n, "cudaGetDevice: %s", cudaGetErrorString(ce));
    return 1;
  }
  if (dev < 0 || dev >= NV_MAX_DEVICES) {
    snprintf(buf, buf_n, "device %d out of range", dev);
    return 1;
  }
  pthread_mutex_lock(&g_lt_mutex);
  int loaded = nv_lt_load(&why);
  nv_lt_status s = 0;
  if (loaded && g_lt_handles[dev] == nullptr) s = g_lt.create(&g_lt_handles[dev]);
  nv_lt_handle handle = g_lt_handles[dev];
  pthread_mutex_unlock(&g_lt_mutex);
  if (!loaded) {
    snprintf(buf, buf_n, "%s", why);
    return 2;
  }
  if (s != 0 || handle == nullptr) {
    snprintf(buf, buf_n, "cublasLtCreate failed with status %d", s);
    return 1;
  }
  nv_alpha_kernel<<<1, 1, 0, st>>>(tsa, tsb, alpha_beta);
  ce = cudaGetLastError();
  if (ce != cudaSuccess) {
    *cuda_error = (int)ce;
    snprintf(buf, buf_n, "nv_alpha_kernel launch: %s", cudaGetErrorString(ce));
    return 1;
  }
  const uint32_t align[4] = {nv_alignment(b), nv_alignment(a), nv_alignment(out), nv_alignment(out)};
  nv_lt_plan *plan = nullptr;
  pthread_mutex_lock(&g_lt_mutex);
  s = nv_lt_plan_for(handle, dev, m, n, k, a_trans, b_trans, out_dtype, ws_bytes, align, &plan, buf, buf_n);
  if (s != 0) {
    pthread_mutex_unlock(&g_lt_mutex);
    return 1;
  }
  s = g_lt.matmul(handle, plan->desc, alpha_beta, b, plan->la, a, plan->lb, alpha_beta + 1, out, plan->lc, out, plan->lc,
                  &plan->algo, workspace, ws_bytes, st);  // enqueues only; under the lock the plan cannot be evicted
  pthread_mutex_unlock(&g_lt_mutex);
  if (s != 0) {
    snprintf(buf, buf_n, "cublasLtMatmul failed with cuBLAS status %d (M=%lld N=%lld K=%lld)", s, (long long)m,
             (long long)n, (long long)k);
    return 1;
  }
  return 0;
}
