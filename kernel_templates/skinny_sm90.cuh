// skinny_sm90: a bandwidth-bound GEMM for small M (decode), C[M,N] = A[M,K] * B[N,K]^T.
//
// Decode GEMMs read the weight B once and little else, so the limit is HBM bandwidth: the
// kernel streams B straight into registers with 16-byte non-caching loads (no shared-memory
// round trip), keeps PF steps of loads in flight per warp, and computes C^T = B * A^T with
// mma.sync m16n8k16 (swap-AB: B's rows are the MMA's 16-row side, the few rows of A its 8-wide
// side, so M = 1 wastes 7/8 of a tensor op that costs nothing here, instead of 15/16 of a
// 16-row tile's memory traffic).
//
// K order inside a dot product is free, so each thread loads 8 consecutive k of a row (one
// 16-byte load) and feeds them to two k16 MMA steps in a fixed permutation used for both
// operands (see load_step / mma_step): every k is multiplied with its own partner exactly once.
//
// Work: CTA = WARPS warps over BN rows of B (at least OCC CTAs per SM: __launch_bounds__); a cluster of CK CTAs splits K; inside a CTA the
// warps take the cluster rank's k-steps in turn. Reduction is deterministic and costs no global
// traffic: warps' partials are summed in shared memory in warp order, then (CK > 1) rank r sums
// its share of the tile over the cluster's CTAs through DSMEM in rank order, adds the bias and
// writes C with 16-byte stores (tunefw/swapab_reduce.cuh). Nothing persists between launches.
#pragma once

#include "tunefw/sm80.cuh"
#include "tunefw/sm90.cuh"
#include "tunefw/swapab_reduce.cuh"

namespace tunefw {
namespace skinny {

struct V4 {
  u32 x, y, z, w;
};

// 16-byte read-only load that does not allocate in L1 (B is read once); zeros when !pred.
// L2PF: 0 none, 1 .L2::128B, 2 .L2::256B prefetch-size hint.
template <int L2PF>
__device__ __forceinline__ V4 ld_stream(const void* p, bool pred) {
  V4 v;
  if (L2PF == 2) {
    asm volatile(
        "{\n\t.reg .pred q;\n\tsetp.ne.b32 q, %5, 0;\n\tmov.b32 %0, 0;\n\tmov.b32 %1, 0;\n\t"
        "mov.b32 %2, 0;\n\tmov.b32 %3, 0;\n\t"
        "@q ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n\t}\n"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p), "r"((int)pred));
  } else if (L2PF == 1) {
    asm volatile(
        "{\n\t.reg .pred q;\n\tsetp.ne.b32 q, %5, 0;\n\tmov.b32 %0, 0;\n\tmov.b32 %1, 0;\n\t"
        "mov.b32 %2, 0;\n\tmov.b32 %3, 0;\n\t"
        "@q ld.global.nc.L1::no_allocate.L2::128B.v4.u32 {%0, %1, %2, %3}, [%4];\n\t}\n"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p), "r"((int)pred));
  } else {
    asm volatile(
        "{\n\t.reg .pred q;\n\tsetp.ne.b32 q, %5, 0;\n\tmov.b32 %0, 0;\n\tmov.b32 %1, 0;\n\t"
        "mov.b32 %2, 0;\n\tmov.b32 %3, 0;\n\t"
        "@q ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n\t}\n"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p), "r"((int)pred));
  }
  return v;
}

// 16-byte read-only load through L1 (A: the same few rows are read by every CTA of a column).
__device__ __forceinline__ V4 ld_act(const void* p, bool pred) {
  V4 v;
  asm volatile(
      "{\n\t.reg .pred q;\n\tsetp.ne.b32 q, %5, 0;\n\tmov.b32 %0, 0;\n\tmov.b32 %1, 0;\n\t"
      "mov.b32 %2, 0;\n\tmov.b32 %3, 0;\n\t"
      "@q ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n\t}\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p), "r"((int)pred));
  return v;
}

// One step's operands for one thread: RT row tiles x {row g, row g+8} x KV vectors of B, and
// MT n8-tiles x KV vectors of A (row t*8+g).
template <int RT, int MT, int KV>
struct Step {
  V4 b[RT][2][KV];
  V4 a[MT][KV];
};

// The rows a thread reads, fixed for the whole kernel: a pointer to the start of each row of B
// (rows g and g+8 of each 16-row tile) and of A (row t*8+g of each n8 tile), and whether the row
// exists. Rows past N or M point at row 0 and are never read (their loads are predicated off).
template <int RT, int MT>
struct Rows {
  const u16* b[RT][2];
  const u16* a[MT];
  unsigned b_ok, a_ok;  // bit i*2+h, bit t
};

template <int RT, int MT>
__device__ __forceinline__ Rows<RT, MT> rows_of(const u16* A, const u16* B, int M, int N, int K,
                                                int n0, int g) {
  Rows<RT, MT> r;
  r.b_ok = r.a_ok = 0;
#pragma unroll
  for (int i = 0; i < RT; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = n0 + i * 16 + h * 8 + g;
      const bool ok = row < N;
      r.b[i][h] = B + (ok ? (long long)row * K : 0);
      r.b_ok |= (unsigned)ok << (i * 2 + h);
    }
#pragma unroll
  for (int t = 0; t < MT; ++t) {
    const int m = t * 8 + g;
    const bool ok = m < M;
    r.a[t] = A + (ok ? (long long)m * K : 0);
    r.a_ok |= (unsigned)ok << t;
  }
  return r;
}

// Step s covers k in [s*32*KV, (s+1)*32*KV); vector v of lane (g, c) holds k = base+v*32+c*8..+7.
template <int RT, int MT, int KV, int L2PF>
__device__ __forceinline__ void load_step(Step<RT, MT, KV>& st, const Rows<RT, MT>& r, int K,
                                          int step, bool live, int c) {
#pragma unroll
  for (int v = 0; v < KV; ++v) {
    const int k = step * 32 * KV + v * 32 + c * 8;
    const bool kin = live && k < K;  // K % 8 == 0: a vector is wholly inside or outside
#pragma unroll
    for (int i = 0; i < RT; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const bool p = kin && ((r.b_ok >> (i * 2 + h)) & 1u);
        st.b[i][h][v] = ld_stream<L2PF>(r.b[i][h] + (p ? k : 0), p);
      }
#pragma unroll
    for (int t = 0; t < MT; ++t) {
      const bool p = kin && ((r.a_ok >> t) & 1u);
      st.a[t][v] = ld_act(r.a[t] + (p ? k : 0), p);
    }
  }
}

// Vector word j of half `hf`: half 0 uses words x, y; half 1 uses z, w.
__device__ __forceinline__ u32 word(const V4& v, int hf, int j) {
  return hf == 0 ? (j == 0 ? v.x : v.y) : (j == 0 ? v.z : v.w);
}

template <int DTYPE, int RT, int MT, int KV>
__device__ __forceinline__ void mma_step(const Step<RT, MT, KV>& st, float (&acc)[RT][MT][4]) {
#pragma unroll
  for (int v = 0; v < KV; ++v) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
#pragma unroll
      for (int i = 0; i < RT; ++i) {
        // A operand of m16n8k16 (row-major 16x16): {row g k0, row g+8 k0, row g k8, row g+8 k8}
        const u32 a[4] = {word(st.b[i][0][v], hf, 0), word(st.b[i][1][v], hf, 0),
                          word(st.b[i][0][v], hf, 1), word(st.b[i][1][v], hf, 1)};
#pragma unroll
        for (int t = 0; t < MT; ++t) {
          mma_16816<DTYPE>(acc[i][t], a, word(st.a[t][v], hf, 0), word(st.a[t][v], hf, 1));
        }
      }
    }
  }
}

}  // namespace skinny
}  // namespace tunefw

template <int DTYPE, int BN, int MT, int KV, int PF, int WARPS, int CK, int L2PF, int OCC>
__global__ void __launch_bounds__(WARPS * 32, OCC)
    gemm_skinny_sm90(const tunefw::u16* __restrict__ A, const tunefw::u16* __restrict__ B,
                     tunefw::u16* __restrict__ C, const tunefw::u16* __restrict__ bias, int M, int N,
                     int K) {
  using namespace tunefw;
  using namespace tunefw::skinny;
  constexpr int RT = BN / 16;
  constexpr int THREADS = WARPS * 32;
  extern __shared__ __align__(16) float smem[];

  const int tid = threadIdx.x;
  const int warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, c = lane & 3;
  const int rank = CK > 1 ? (int)sm90::cluster_ctarank() : 0;
  const int n0 = (blockIdx.x / CK) * BN;

  // This rank's k-steps [s_begin, s_end); warp w takes s_begin + w, + WARPS, ...
  const int steps = (K + 32 * KV - 1) / (32 * KV);
  const int per_rank = (steps + CK - 1) / CK;
  const int s_begin = rank * per_rank;
  const int s_end = imin(steps, s_begin + per_rank);
  const int first = s_begin + warp;
  const int iters = first < s_end ? (s_end - first + WARPS - 1) / WARPS : 0;

  float acc[RT][MT][4];
#pragma unroll
  for (int i = 0; i < RT; ++i)
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[i][t][j] = 0.f;

  sm90::pdl_launch_dependents();
  sm90::pdl_wait();  // every global access below after the kernel before this one
  const Rows<RT, MT> rows = rows_of<RT, MT>(A, B, M, N, K, n0, g);
  Step<RT, MT, KV> ring[PF];
#pragma unroll
  for (int p = 0; p < PF; ++p) {
    load_step<RT, MT, KV, L2PF>(ring[p], rows, K, first + p * WARPS, p < iters, c);
  }
  for (int it = 0; it < iters; it += PF) {
#pragma unroll
    for (int p = 0; p < PF; ++p) {
      if (it + p < iters) {
        mma_step<DTYPE>(ring[p], acc);
        const int next = it + p + PF;
        load_step<RT, MT, KV, L2PF>(ring[p], rows, K, first + next * WARPS, next < iters, c);
      }
    }
  }

  swapab::reduce_store<DTYPE, BN, MT, WARPS, CK, THREADS>(smem, acc, tid, rank, n0, C, bias, M, N);
}
