// cuda_emu.h -- run the library's CUDA kernels on the CPU, to check their index arithmetic, shared-memory and
// warp logic bit for bit against the reference on a machine without a GPU (tests/nvfp4_cuda/kernel_emu.py).
//
// How: the kernel sources are compiled by the host C++ compiler (the CUDA headers define __global__ and
// friends away for it, and cuda_bf16.h / cuda_fp8.h carry host implementations).  kernel_emu.py rewrites each
// launch ``k<<<grid, block, shmem, stream>>>(args)`` into ``emu::launch(grid, block, [&] { k(args); })``,
// which runs the CUDA blocks one after another, each as blockDim OS threads: __syncthreads is a barrier of
// the block, a warp shuffle an exchange through a barrier of its 32 lanes, __shared__ a function-local static
// (one CUDA block runs at a time), atomics take a mutex.  A thread that returns drops out of both barriers,
// and a shuffle that reads an exited lane is reported (CUDA leaves it undefined).
//
// What it does not check: the hardware's own conversions (the host spellings under #ifdef __CUDA_ARCH__ and
// cuda_fp8.h's software path run instead; tests/nvfp4_cuda/test_device_math.py compares those), races
// between threads outside barriers, the memory model, and timing.  Float32 arithmetic is IEEE on both sides;
// the host compiler gets -ffp-contract=off as nvcc gets -fmad=false.
#pragma once

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <atomic>
#include <barrier>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#undef __shared__
#define __shared__ static  // one CUDA block at a time: a function-local static is its shared memory

namespace emu {

struct Warp {
  explicit Warp(int n) : bar(n) {}
  std::barrier<> bar;
  uint64_t slot[32] = {};
  bool exited[32] = {};
};

struct Ctx {
  uint3 thread, block;
  dim3 bdim, gdim;
  std::barrier<> *cta = nullptr;
  Warp *warp = nullptr;
};

inline thread_local Ctx ctx;
inline std::mutex atomic_mutex;
inline std::atomic<int> errors{0};

inline void report(const char *what) {
  if (errors.fetch_add(1) < 5)
    std::fprintf(stderr, "cuda_emu: %s (block %u,%u thread %u,%u)\n", what, ctx.block.x, ctx.block.y, ctx.thread.x,
                 ctx.thread.y);
}

inline void launch(dim3 grid, dim3 block, const std::function<void()> &body) {
  const int n = (int)(block.x * block.y * block.z);
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        std::barrier<> cta(n);
        std::vector<std::unique_ptr<Warp>> warps;
        for (int w = 0; w < (n + 31) / 32; ++w)
          warps.push_back(std::make_unique<Warp>(n - 32 * w < 32 ? n - 32 * w : 32));  // the last warp may be partial
        std::vector<std::thread> threads;
        threads.reserve(n);
        for (int t = 0; t < n; ++t)
          threads.emplace_back([&, t] {
            ctx.thread = make_uint3(t % block.x, (t / block.x) % block.y, t / (block.x * block.y));
            ctx.block = make_uint3(bx, by, bz);
            ctx.bdim = block;
            ctx.gdim = grid;
            ctx.cta = &cta;
            ctx.warp = warps[t / 32].get();
            body();
            ctx.warp->exited[t % 32] = true;
            ctx.warp->bar.arrive_and_drop();
            cta.arrive_and_drop();
          });
        for (auto &th : threads) th.join();
      }
}

inline int lane() {
  return (int)((ctx.thread.x + ctx.bdim.x * (ctx.thread.y + ctx.bdim.y * ctx.thread.z)) & 31u);
}

template <class T>
T shfl_xor(unsigned mask, T v, int off) {
  static_assert(sizeof(T) <= 8, "shfl of a wide type");
  if (mask != 0xFFFFFFFFu) report("shuffle with a partial mask (not emulated)");
  Warp &w = *ctx.warp;
  const int l = lane(), src = l ^ off;
  uint64_t bits = 0;
  memcpy(&bits, &v, sizeof(T));
  w.slot[l] = bits;
  w.bar.arrive_and_wait();
  if (w.exited[src]) report("shuffle reads a lane that has exited");
  bits = w.slot[src];
  w.bar.arrive_and_wait();
  T r;
  memcpy(&r, &bits, sizeof(T));
  return r;
}

}  // namespace emu

#define threadIdx (emu::ctx.thread)
#define blockIdx (emu::ctx.block)
#define blockDim (emu::ctx.bdim)
#define gridDim (emu::ctx.gdim)

inline void __syncthreads() { emu::ctx.cta->arrive_and_wait(); }
template <class T>
inline T __shfl_xor_sync(unsigned mask, T v, int off) { return emu::shfl_xor(mask, v, off); }
inline unsigned atomicMax(unsigned *p, unsigned v) {
  std::lock_guard<std::mutex> g(emu::atomic_mutex);
  const unsigned old = *p;
  if (v > old) *p = v;
  return old;
}
inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }

// The runtime calls the launchers make: a pretend device with 2 multiprocessors holding 2 CUDA blocks each
// (small grids, so the grid-stride loops run several rounds on test-sized tensors).
inline cudaError_t emu_get_device(int *d) { *d = 0; return cudaSuccess; }
inline cudaError_t emu_attribute(int *v, cudaDeviceAttr a, int) {
  *v = a == cudaDevAttrMultiProcessorCount ? 2 : (a == cudaDevAttrComputeCapabilityMajor ? 9 : 0);
  return cudaSuccess;
}
template <class K>
inline cudaError_t emu_occupancy(int *blocks, K, int, size_t) { *blocks = 2; return cudaSuccess; }
inline cudaError_t emu_last_error() { return emu::errors.load() ? cudaErrorLaunchFailure : cudaSuccess; }
inline cudaError_t emu_device_count(int *n) { *n = 1; return cudaSuccess; }
inline cudaError_t emu_memset_async(void *p, int v, size_t n, cudaStream_t) { memset(p, v, n); return cudaSuccess; }
inline const char *emu_error_name(cudaError_t) { return "cudaErrorLaunchFailure"; }
inline const char *emu_error_string(cudaError_t) { return "emulated kernel failed a check (see stderr)"; }
#define cudaGetDevice emu_get_device
#define cudaDeviceGetAttribute emu_attribute
#define cudaOccupancyMaxActiveBlocksPerMultiprocessor emu_occupancy
#define cudaGetLastError emu_last_error
#define cudaGetDeviceCount emu_device_count
#define cudaMemsetAsync emu_memset_async
#define cudaGetErrorName emu_error_name
#define cudaGetErrorString emu_error_string
