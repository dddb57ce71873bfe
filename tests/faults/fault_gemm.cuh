// Fault kernels for tunefw's tests (not shipped): a naive, correct GEMM (FAULT = 0) and variants
// broken on purpose. C[M,N] = A[M,K] * B[N,K]^T, row-major, 16-bit elements (DT 0 bf16, 1 fp16).
// One thread per output element; blocks of 16 x 16 threads.
#pragma once
#include "faults/convert.cuh"

namespace faults {

enum : int {
  NONE = 0, OOB_WRITE = 1, ENDLESS_LOOP = 2, WRONG_RESULT = 3, UNWRITTEN = 4,
  TOO_MUCH_SMEM = 5, SPILL = 6, OUTSIDE_C = 7, WRITES_INPUT = 8, FIRST_LAUNCH_ONLY = 9,
  NONDETERMINISTIC = 10, SPLITK_DIRTY = 11, READS_PAST_B = 12,
};

__device__ __forceinline__ long long clock_now() {
  long long t;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(t));
  return t;
}

// Dot product that holds 64 loaded values at once: volatile loads keep their order, so all of a's
// 64 values are live before b's first load; under SPILL's 32-register cap this must spill.
// Needs K % 64 == 0.
template <int DT>
__device__ float dot_spilling(const volatile unsigned short* a, const volatile unsigned short* b,
                              int K) {
  float acc = 0.f;
  for (int k0 = 0; k0 < K; k0 += 64) {
    float av[64];
#pragma unroll
    for (int j = 0; j < 64; ++j) av[j] = to_float<DT>(a[k0 + j]);
#pragma unroll
    for (int j = 0; j < 64; ++j) acc += av[j] * to_float<DT>(b[k0 + j]);
  }
  return acc;
}

// Serial split-K: the gridDim.z CTAs of a 16 x 16 tile of C each store their partial sums in the
// workspace (after a counter per tile, padded to 256 bytes) and bump the tile's counter; the one
// that finds gridDim.z - 1 sums the partials into C. The bug: the counter is never set back to 0,
// so on every launch after the first no CTA is last and C is left unwritten (a split-K counter
// left dirty).
template <int DT>
__device__ void splitk_dirty(const unsigned short* a, const unsigned short* b, unsigned short* c,
                             int* counters, int M, int N, int K) {
  __shared__ bool last;
  const int n = blockIdx.x * 16 + threadIdx.x;
  const int m = blockIdx.y * 16 + threadIdx.y;
  const int tiles = gridDim.x * gridDim.y;
  float* partial = reinterpret_cast<float*>(counters + (tiles + 63) / 64 * 64);
  const bool inside = m < M && n < N;
  const int chunk = (K + gridDim.z - 1) / gridDim.z;
  const int k0 = blockIdx.z * chunk, k1 = min(K, k0 + chunk);
  if (inside) {
    float acc = 0.f;
    for (int k = k0; k < k1; ++k)
      acc += to_float<DT>(a[(size_t)m * K + k]) * to_float<DT>(b[(size_t)n * K + k]);
    partial[((size_t)blockIdx.z * M + m) * N + n] = acc;
  }
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0)
    last = atomicAdd(counters + blockIdx.y * gridDim.x + blockIdx.x, 1) == (int)gridDim.z - 1;
  __syncthreads();
  if (!last || !inside) return;  // a correct kernel sets the tile's counter back to 0 here
  __threadfence();
  float acc = 0.f;
  for (int s = 0; s < (int)gridDim.z; ++s) acc += __ldcg(partial + ((size_t)s * M + m) * N + n);
  c[(size_t)m * N + n] = from_float<DT>(acc);
}

}  // namespace faults

template <int FAULT, int DT>
__global__ void __launch_bounds__(256, FAULT == faults::SPILL ? 8 : 1)
fault_gemm(const unsigned short* __restrict__ a, const unsigned short* __restrict__ b,
           unsigned short* __restrict__ c, int* __restrict__ counter, int M, int N, int K) {
  using namespace faults;
  extern __shared__ float dyn_smem[];
  const int n = blockIdx.x * 16 + threadIdx.x;
  const int m = blockIdx.y * 16 + threadIdx.y;
  if (FAULT == SPLITK_DIRTY) {
    splitk_dirty<DT>(a, b, c, counter, M, N, K);
    return;
  }
  if (FAULT == ENDLESS_LOOP) {
    while (clock_now() >= 0) {
    }
  }
  if (m >= M || n >= N) return;
  const unsigned short* arow = a + (size_t)m * K;
  const unsigned short* brow = b + (size_t)n * K;
  float acc = 0.f;
  if (FAULT == SPILL) {
    acc = dot_spilling<DT>(arow, brow, K);
  } else {
    for (int k = 0; k < K; ++k) acc += to_float<DT>(arow[k]) * to_float<DT>(brow[k]);
  }
  if (FAULT == TOO_MUCH_SMEM) {
    volatile float* slot = dyn_smem + threadIdx.y * 16 + threadIdx.x;
    *slot = acc;
    acc = *slot;
  }
  // A masked load one element past B's end, times a zero mask: right while the memory after B
  // holds finite values, NaN where it holds a NaN (strict verification's guard band).
  if (FAULT == READS_PAST_B && n == N - 1) acc += 0.f * to_float<DT>(b[(size_t)N * K]);
  if (FAULT == WRONG_RESULT && m == 7) acc *= 1.1f;  // one row off by 10%: the per-row check
  if (FAULT == UNWRITTEN && n >= N - 8) return;        // last 8 columns keep their NaN
  // Right on the first launch after the workspace is zeroed, wrong on every later one: the
  // launch count is never reset (a split-K counter left dirty).
  if (FAULT == FIRST_LAUNCH_ONLY) {
    __shared__ int launches;
    if (threadIdx.x == 0 && threadIdx.y == 0) {
      launches = blockIdx.x == 0 && blockIdx.y == 0 ? atomicAdd(counter, 1) : *(volatile int*)counter;
    }
    __syncthreads();
    if (launches > 1) acc = -acc;
  }
  // Values within the tolerance that change from launch to launch (a race in a reduction).
  if (FAULT == NONDETERMINISTIC && ((clock_now() >> 3) & 1)) acc += 1e-3f * fabsf(acc) + 1e-3f;
  size_t idx = (size_t)m * N + n;
  if (FAULT == OUTSIDE_C && m == M - 1 && n == N - 1) c[idx + 1] = from_float<DT>(acc);  // 1 past C
  if (FAULT == WRITES_INPUT && m == 0 && n == 0) const_cast<unsigned short*>(a)[0] = 0;
  if (FAULT == OOB_WRITE) idx += (size_t)1 << 42;      // 8 TB past C: an illegal address
  c[idx] = from_float<DT>(acc);
}
