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
// writes C with 16-byte stores. Nothing persists between launches (no counters, no workspace).
#pragma once

#include "tunefw/sm80.cuh"
#include "tunefw/sm90.cuh"

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

__device__ __forceinline__ void ld_cluster_v4_f32(u32 addr, float (&f)[4]) {
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(f[0]), "=f"(f[1]), "=f"(f[2]), "=f"(f[3])
               : "r"(addr)
               : "memory");
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

// bf16 / fp16 bits -> float.
template <int DTYPE>
__device__ __forceinline__ float to_f32(u16 h) {
  if (DTYPE == 0) return __uint_as_float((u32)h << 16);
  float f;
  asm("cvt.f32.f16 %0, %1;\n" : "=f"(f) : "h"(h));
  return f;
}

// The finished sums of 8 consecutive columns n..n+7 of row m: bias added, rounded, one
// 16-byte store.
template <int DTYPE>
__device__ __forceinline__ void store_group(u16* C, const u16* bias, int m, int n, int N,
                                            const float (&s)[8]) {
  u32 out[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    float x0 = s[2 * e], x1 = s[2 * e + 1];
    if (bias) {
      x0 += to_f32<DTYPE>(bias[n + 2 * e]);
      x1 += to_f32<DTYPE>(bias[n + 2 * e + 1]);
    }
    out[e] = pack_x2<DTYPE>(x0, x1);
  }
  st_global_v4_u32(C + (long long)m * N + n, out[0], out[1], out[2], out[3]);
}

// Shared memory: WARPS partial tiles of MT*8 rows (m) x BN columns (n), rows padded by 4 floats
// so that the accumulator stores of a warp hit 32 different banks.
template <int BN, int MT, int WARPS>
struct Smem {
  static constexpr int ROW = BN + 4;
  static constexpr int TILE = MT * 8 * ROW;
  static constexpr int bytes = WARPS * TILE * 4;
};

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
  using S = Smem<BN, MT, WARPS>;
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

  // Partials to shared memory: acc[i][t][j] is C^T(n = i*16 + g + 8*(j >= 2), m = t*8 + 2c + (j&1)).
  float* mine = smem + warp * S::TILE;
#pragma unroll
  for (int i = 0; i < RT; ++i)
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int n = i * 16 + g + ((j >> 1) << 3);
        const int m = t * 8 + 2 * c + (j & 1);
        mine[m * S::ROW + n] = acc[i][t][j];
      }
  __syncthreads();

  // Groups of 8 consecutive n of one m: 16-byte stores of C (N % 8 == 0, so wholly in or out).
  constexpr int NG = BN / 8;
  constexpr int GROUPS = MT * 8 * NG;
  const int m_rows = imin(M, MT * 8);
  if (CK == 1) {
    for (int q = tid; q < GROUPS; q += THREADS) {
      const int m = q / NG, n = (q % NG) * 8;
      if (m >= m_rows || n0 + n >= N) continue;
      float s[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) s[e] = 0.f;
      for (int w = 0; w < WARPS; ++w) {  // warp order: deterministic
        const float4* src = reinterpret_cast<const float4*>(smem + w * S::TILE + m * S::ROW + n);
        const float4 lo = src[0], hi = src[1];
        s[0] += lo.x; s[1] += lo.y; s[2] += lo.z; s[3] += lo.w;
        s[4] += hi.x; s[5] += hi.y; s[6] += hi.z; s[7] += hi.w;
      }
      store_group<DTYPE>(C, bias, m, n0 + n, N, s);
    }
    return;
  }

  // CK > 1: sum this CTA's warps into tile 0, then rank r finishes groups r, r + CK, ... over
  // the cluster's tiles (DSMEM, rank order: deterministic).
  constexpr int QUADS = MT * 8 * (BN / 4);
  for (int q = tid; q < QUADS; q += THREADS) {
    const int m = q / (BN / 4), n = (q % (BN / 4)) * 4;
    if (m >= m_rows) continue;
    float4 s = *reinterpret_cast<const float4*>(smem + m * S::ROW + n);
    for (int w = 1; w < WARPS; ++w) {
      const float4 x = *reinterpret_cast<const float4*>(smem + w * S::TILE + m * S::ROW + n);
      s.x += x.x; s.y += x.y; s.z += x.z; s.w += x.w;
    }
    *reinterpret_cast<float4*>(smem + m * S::ROW + n) = s;
  }
  sm90::cluster_sync();
  const u32 base = sm90::smem_u32(smem);
  for (int q = rank * THREADS + tid; q < GROUPS; q += CK * THREADS) {
    const int m = q / NG, n = (q % NG) * 8;
    if (m >= m_rows || n0 + n >= N) continue;
    float s[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) s[e] = 0.f;
    const u32 off = base + (u32)((m * S::ROW + n) * 4);
#pragma unroll 2  // registers: every rank's 8 floats in flight at once cost 8*CK
    for (int r = 0; r < CK; ++r) {
      float lo[4], hi[4];
      const u32 remote = sm90::mapa(off, (u32)r);
      ld_cluster_v4_f32(remote, lo);
      ld_cluster_v4_f32(remote + 16, hi);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[e] += lo[e];
        s[4 + e] += hi[e];
      }
    }
    store_group<DTYPE>(C, bias, m, n0 + n, N, s);
  }
  sm90::cluster_sync();  // no CTA leaves while another still reads its shared memory
}
