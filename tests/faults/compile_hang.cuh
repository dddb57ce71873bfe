// A template whose compile practically never ends: Tree<D> instantiates 2^D distinct types
// (D = 16 already takes ~45 s in NVRTC). Used with a short timeout to test COMPILE_TIMEOUT.
#pragma once

template <int D, unsigned long long X>
struct Tree {
  static constexpr unsigned long long value =
      Tree<D - 1, 2 * X>::value ^ Tree<D - 1, 2 * X + 1>::value;
};

template <unsigned long long X>
struct Tree<0, X> {
  static constexpr unsigned long long value = X;
};

template <int D>
__global__ void compile_hang(unsigned long long* out) {
  out[0] = Tree<D, 1>::value;
}
