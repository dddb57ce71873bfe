// 16-bit element <-> float conversions for the fault kernels (self-contained: no CUDA headers).
// DT selects the element type: 0 = bf16, 1 = fp16.
#pragma once

namespace faults {

template <int DT>
__device__ __forceinline__ float to_float(unsigned short x) {
  float f;
  if (DT == 0) {
    asm("mov.b32 %0, %1;" : "=f"(f) : "r"((unsigned)x << 16));  // bf16: the high half of an fp32
  } else {
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x));
  }
  return f;
}

template <int DT>
__device__ __forceinline__ unsigned short from_float(float f) {
  unsigned short r;
  if (DT == 0) {
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
  } else {
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(f));
  }
  return r;
}

}  // namespace faults
