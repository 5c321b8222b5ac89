// cuda_emu.h -- run the library's CUDA kernels on the CPU, to check their index arithmetic, shared-memory and
// warp logic bit for bit against the reference on a machine without a GPU (tests/nvfp4_cuda/kernel_emu.py).
//
// How: the kernel sources are compiled by the host C++ compiler (the CUDA headers define __global__ and
// friends away for it, and cuda_bf16.h / cuda_fp8.h carry host implementations).  kernel_emu.py rewrites each
// launch ``k<<<grid, block, shmem, stream>>>(args)`` into ``emu::launch(grid, block, [&] { k(args); })``,
// which runs the CUDA blocks one after another, each as blockDim cooperative threads (ucontext fibers that
// take turns on the calling OS thread, each until it waits at a barrier or returns: no OS threads, no
// futexes): __syncthreads is a barrier of the block, a warp shuffle an exchange through a barrier of its 32
// lanes, __shared__ a function-local static (one CUDA block runs at a time).  A thread that returns drops out
// of both barriers, a shuffle that reads an exited lane is reported (CUDA leaves it undefined), and so is a
// deadlock (threads waiting at a barrier the others never reach: on a GPU, a hang or undefined behaviour).
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
#include <ucontext.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <vector>

#undef __shared__
#define __shared__ static  // one CUDA block at a time: a function-local static is its shared memory

namespace emu {

// A barrier of cooperative threads: the last to arrive releases the others (a new generation).
// arrive_and_drop is std::barrier's: the thread counts as arrived now and is not waited for again.
struct Barrier {
  explicit Barrier(int n) : expected(n) {}
  int expected, arrived = 0;
  unsigned generation = 0;
};

struct Warp {
  explicit Warp(int n) : bar(n) {}
  Barrier bar;
  uint64_t slot[32] = {};
  bool exited[32] = {};
};

struct Ctx {
  uint3 thread, block;
  dim3 bdim, gdim;
  Barrier *cta = nullptr;
  Warp *warp = nullptr;
};

// One CUDA thread: a context with its own stack, run by launch() on the calling OS thread.
struct Fiber {
  static constexpr size_t kStack = 256 * 1024;  // the kernels' locals are a few hundred bytes
  ucontext_t uc{};
  Ctx ctx;
  bool done = false;
  std::unique_ptr<char[]> stack{new char[kStack]};
};

inline thread_local Fiber *cur = nullptr;                      // the CUDA thread running now
inline thread_local ucontext_t *scheduler = nullptr;           // where a waiting thread yields to
inline thread_local const std::function<void()> *body_now = nullptr;
inline thread_local unsigned long long progress = 0;           // releases and exits: a round without any is a deadlock
inline std::atomic<int> errors{0};

inline void report(const char *what) {
  if (errors.fetch_add(1) < 5)
    std::fprintf(stderr, "cuda_emu: %s (block %u,%u thread %u,%u)\n", what, cur->ctx.block.x, cur->ctx.block.y,
                 cur->ctx.thread.x, cur->ctx.thread.y);
}

inline void release(Barrier &b) {
  b.arrived = 0;
  ++b.generation;
  ++progress;
}

inline void arrive_and_wait(Barrier &b) {
  if (++b.arrived == b.expected) return release(b);
  const unsigned g = b.generation;
  while (b.generation == g) swapcontext(&cur->uc, scheduler);  // the others run until the last one arrives
}

inline void arrive_and_drop(Barrier &b) {
  if (--b.expected == b.arrived && b.arrived) release(b);
}

inline int lane() {
  const Ctx &c = cur->ctx;
  return (int)((c.thread.x + c.bdim.x * (c.thread.y + c.bdim.y * c.thread.z)) & 31u);
}

inline void run_thread() {  // a fiber's entry point (makecontext passes no pointers portably)
  (*body_now)();
  cur->ctx.warp->exited[lane()] = true;
  arrive_and_drop(cur->ctx.warp->bar);
  arrive_and_drop(*cur->ctx.cta);
  cur->done = true;
  ++progress;
}  // returns to uc_link: the scheduler

// The CUDA blocks one after another; a block's threads take turns on this OS thread (round robin), each
// running until it waits at a barrier or returns.  A round in which no barrier opened and no thread
// returned means every thread waits at a barrier that will never open: reported, and the launch fails.
inline void launch(dim3 grid, dim3 block, const std::function<void()> &body) {
  const int n = (int)(block.x * block.y * block.z);
  static thread_local std::vector<std::unique_ptr<Fiber>> fibers;  // stacks kept from launch to launch
  while ((int)fibers.size() < n) fibers.push_back(std::make_unique<Fiber>());
  ucontext_t sched;
  body_now = &body;
  scheduler = &sched;
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        Barrier cta(n);
        std::vector<std::unique_ptr<Warp>> warps;
        for (int w = 0; w < (n + 31) / 32; ++w)
          warps.push_back(std::make_unique<Warp>(n - 32 * w < 32 ? n - 32 * w : 32));  // the last warp may be partial
        for (int t = 0; t < n; ++t) {
          Fiber &f = *fibers[t];
          f.ctx = Ctx{make_uint3(t % block.x, (t / block.x) % block.y, t / (block.x * block.y)),
                      make_uint3(bx, by, bz), block, grid, &cta, warps[t / 32].get()};
          f.done = false;
          getcontext(&f.uc);
          f.uc.uc_stack.ss_sp = f.stack.get();
          f.uc.uc_stack.ss_size = Fiber::kStack;
          f.uc.uc_link = &sched;
          makecontext(&f.uc, run_thread, 0);
        }
        for (int live = n; live > 0;) {
          const unsigned long long before = progress;
          for (int t = 0; t < n; ++t) {
            if (fibers[t]->done) continue;
            cur = fibers[t].get();
            swapcontext(&sched, &cur->uc);
            live -= cur->done;
          }
          if (live > 0 && progress == before) {
            report("deadlock: every live thread waits at a barrier that the others do not reach");
            return;
          }
        }
      }
}

template <class T>
T shfl_xor(unsigned mask, T v, int off) {
  static_assert(sizeof(T) <= 8, "shfl of a wide type");
  if (mask != 0xFFFFFFFFu) report("shuffle with a partial mask (not emulated)");
  Warp &w = *cur->ctx.warp;
  const int l = lane(), src = l ^ off;
  uint64_t bits = 0;
  memcpy(&bits, &v, sizeof(T));
  w.slot[l] = bits;
  arrive_and_wait(w.bar);
  if (w.exited[src]) report("shuffle reads a lane that has exited");
  bits = w.slot[src];
  arrive_and_wait(w.bar);
  T r;
  memcpy(&r, &bits, sizeof(T));
  return r;
}

}  // namespace emu

#define threadIdx (emu::cur->ctx.thread)
#define blockIdx (emu::cur->ctx.block)
#define blockDim (emu::cur->ctx.bdim)
#define gridDim (emu::cur->ctx.gdim)

inline void __syncthreads() { emu::arrive_and_wait(*emu::cur->ctx.cta); }
template <class T>
inline T __shfl_xor_sync(unsigned mask, T v, int off) { return emu::shfl_xor(mask, v, off); }
inline unsigned atomicMax(unsigned *p, unsigned v) {  // one thread runs at a time: atomic as it stands
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
