// Register-only mma.sync m16n8k16 throughput (benchmarks/mma_sm80_gpu_check.py): CHAINS
// independent accumulators per warp, no memory traffic in the loop. Operands are non-zero
// bf16/fp16 patterns (DTYPE 0 bf16, 1 fp16). Compiled from the repository root, which is on the
// include path.
#pragma once
#include "kernel_templates/include/tunefw/sm80.cuh"

template <int DTYPE, int CHAINS>
__global__ void __launch_bounds__(256) mma_peak(float* out, int iters) {
  using namespace tunefw;
  const u32 base = DTYPE == 0 ? 0x3c003c00u : 0x24002400u;  // small normal values
  u32 a[4] = {base ^ (threadIdx.x & 7u), base, base ^ 1u, base};
  const u32 b0 = base ^ 2u, b1 = base;
  float acc[CHAINS][4];
#pragma unroll
  for (int c = 0; c < CHAINS; ++c) acc[c][0] = acc[c][1] = acc[c][2] = acc[c][3] = 0.0f;
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int c = 0; c < CHAINS; ++c) mma_16816<DTYPE>(acc[c], a, b0, b1);
  }
  float s = 0.0f;
#pragma unroll
  for (int c = 0; c < CHAINS; ++c) s += acc[c][0] + acc[c][1] + acc[c][2] + acc[c][3];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
