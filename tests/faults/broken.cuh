// A template that does not compile (tunefw compiler tests: COMPILE_ERROR keeps the log).
#pragma once

template <int X>
__global__ void broken_kernel(float* out) {
  out[threadIdx.x] = undeclared_identifier * X;
}
