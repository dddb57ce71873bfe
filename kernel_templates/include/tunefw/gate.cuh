// tunefw/gate.cuh: the gated epilogue of a problem with gate "silu" (SwiGLU, as Llama's MLP runs
// it): the weight B is [Bg; Bu], 2N rows, and C[m, n] = silu(A Bg^T)[m, n] * (A Bu^T)[m, n].
// Both products of one output element are summed in fp32 and combined before the one rounding,
// so the gate and the up projection never round-trip memory (nor bf16).
#pragma once

namespace tunefw {

// silu(g) * u = g * u / (1 + e^-g). __expf's overflow to inf for g < -88 gives -0: the limit.
__device__ __forceinline__ float silu_mul(float g, float u) {
  return g * u * __frcp_rn(1.f + __expf(-g));
}

}  // namespace tunefw
