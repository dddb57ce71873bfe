// tunefw/swapab_reduce.cuh: the deterministic epilogue of the swap-AB decode kernels
// (skinny_sm90, stream_sm90), which compute C^T = B A^T with mma.sync m16n8k16 and split K over
// warps and over the CTAs of a thread-block cluster.
//
// Each of PW warps holds acc[RT][MT][4] for a BN/WN x 8*MT slice of a BN x 8*MT tile of C^T in
// the m16n8k16 accumulator layout: acc[i][t][j] is C^T(n = i*16 + g + 8*(j >= 2), m = t*8 + 2c +
// (j&1)) of the slice, warp w's slice being columns (w % WN) * BN/WN on (WN warps split the
// tile's rows of B, PW/WN split K). The partials go to shared memory (PW/WN full tiles), are
// summed in slot order, then (CK > 1) rank r sums its share of the tile
// over the cluster's CTAs through DSMEM in rank order, adds the bias and writes C with 16-byte
// stores. No global workspace, nothing persists between launches, the same bits every launch.
// GATED (tunefw/gate.cuh): tile columns n < BN/2 are the gate's and n + BN/2 the same output
// column's up projection; each output is silu_mul of the two sums (biases [bg; bu], 2N long).
#pragma once

#include "tunefw/gate.cuh"
#include "tunefw/sm80.cuh"
#include "tunefw/sm90.cuh"

namespace tunefw {
namespace swapab {

__device__ __forceinline__ void ld_cluster_v4_f32(u32 addr, float (&f)[4]) {
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(f[0]), "=f"(f[1]), "=f"(f[2]), "=f"(f[3])
               : "r"(addr)
               : "memory");
}

// bf16 / fp16 bits -> float.
template <int DTYPE>
__device__ __forceinline__ float to_f32(u16 h) {
  if (DTYPE == 0) return __uint_as_float((u32)h << 16);
  float f;
  asm("cvt.f32.f16 %0, %1;\n" : "=f"(f) : "h"(h));
  return f;
}

// The finished sums of 8 consecutive columns n..n+7 of row m (GATED: s the gate's, u the up
// projection's): bias added, gated, rounded, one 16-byte store.
template <int DTYPE, int GATED>
__device__ __forceinline__ void store_group(u16* C, const u16* bias, int m, int n, int N,
                                            const float (&s)[8], const float (&u)[8]) {
  u32 out[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    float x[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int col = n + 2 * e + h;
      x[h] = s[2 * e + h];
      if (bias) x[h] += to_f32<DTYPE>(bias[col]);
      if (GATED) x[h] = silu_mul(x[h], u[2 * e + h] + (bias ? to_f32<DTYPE>(bias[N + col]) : 0.f));
    }
    out[e] = pack_x2<DTYPE>(x[0], x[1]);
  }
  st_global_v4_u32(C + (long long)m * N + n, out[0], out[1], out[2], out[3]);
}

// Shared memory: one partial tile of MT*8 rows (m) x BN columns (n) per K slot (SLOTS = the
// warps that split K), rows padded by 4 floats so that the accumulator stores of a warp hit 32
// different banks.
template <int BN, int MT, int SLOTS>
struct Partials {
  static constexpr int ROW = BN + 4;
  static constexpr int TILE = MT * 8 * ROW;
  static constexpr int bytes = SLOTS * TILE * 4;
};

// The epilogue, called by all THREADS threads of the CTA (and, CK > 1, of every CTA of the
// cluster); warps below PW hand in their accumulators, the others only help reduce and store.
// n0: the tile's first column of C (BN/2 wide under GATED, else BN).
template <int DTYPE, int BN, int MT, int PW, int CK, int THREADS, int GATED = 0, int WN = 1>
__device__ __forceinline__ void reduce_store(float* smem, const float (&acc)[BN / WN / 16][MT][4],
                                             int tid, int rank, int n0, u16* C, const u16* bias,
                                             int M, int N) {
  static_assert(PW % WN == 0 && BN % (16 * WN) == 0, "WN warps split BN in 16-row tiles");
  constexpr int SLOTS = PW / WN;
  using P = Partials<BN, MT, SLOTS>;
  constexpr int RT = BN / WN / 16;
  const int warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, c = lane & 3;
  if (PW * 32 == THREADS || warp < PW) {  // every warp holds partials unless some only help
    float* mine = smem + (warp / WN) * P::TILE + (warp % WN) * (BN / WN);
#pragma unroll
    for (int i = 0; i < RT; ++i)
#pragma unroll
      for (int t = 0; t < MT; ++t)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int n = i * 16 + g + ((j >> 1) << 3);
          const int m = t * 8 + 2 * c + (j & 1);
          mine[m * P::ROW + n] = acc[i][t][j];
        }
  }
  __syncthreads();

  // Groups of 8 consecutive n of one m: 16-byte stores of C (N % 8 == 0, so wholly in or out).
  constexpr int OBN = GATED ? BN / 2 : BN;  // columns of C in the tile
  constexpr int NG = OBN / 8;
  constexpr int GROUPS = MT * 8 * NG;
  const int m_rows = imin(M, MT * 8);
  if (CK > 1) {
    // Sum this CTA's slots into tile 0; rank r then finishes groups r, r + CK, ... over the
    // cluster's tiles (DSMEM, rank order: deterministic).
    constexpr int QUADS = MT * 8 * (BN / 4);
    for (int q = tid; q < QUADS; q += THREADS) {
      const int m = q / (BN / 4), n = (q % (BN / 4)) * 4;
      if (m >= m_rows) continue;
      float4 s = *reinterpret_cast<const float4*>(smem + m * P::ROW + n);
      for (int w = 1; w < SLOTS; ++w) {
        const float4 x = *reinterpret_cast<const float4*>(smem + w * P::TILE + m * P::ROW + n);
        s.x += x.x; s.y += x.y; s.z += x.z; s.w += x.w;
      }
      *reinterpret_cast<float4*>(smem + m * P::ROW + n) = s;
    }
    sm90::cluster_sync();
  }
  const u32 base = sm90::smem_u32(smem);
  // The finished sums of tile columns n..n+7 of row m: the slots' partials in slot order
  // (CK 1), or the cluster's tiles in rank order (CK > 1).
  auto sum8 = [&](int m, int n, float (&s)[8]) {
#pragma unroll
    for (int e = 0; e < 8; ++e) s[e] = 0.f;
    if (CK == 1) {
      for (int w = 0; w < SLOTS; ++w) {
        const float4* src = reinterpret_cast<const float4*>(smem + w * P::TILE + m * P::ROW + n);
        const float4 lo = src[0], hi = src[1];
        s[0] += lo.x; s[1] += lo.y; s[2] += lo.z; s[3] += lo.w;
        s[4] += hi.x; s[5] += hi.y; s[6] += hi.z; s[7] += hi.w;
      }
      return;
    }
    const u32 off = base + (u32)((m * P::ROW + n) * 4);
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
  };
  // This CTA's groups (CK > 1: every CK-th of the cluster's, from its rank): summed, gated
  // (the up projection's sums OBN columns on), bias added, stored.
  for (int q = rank * THREADS + tid; q < GROUPS; q += CK * THREADS) {
    const int m = q / NG, n = (q % NG) * 8;
    if (m >= m_rows || n0 + n >= N) continue;
    float s[8], u[8];
    sum8(m, n, s);
    if (GATED) sum8(m, n + OBN, u);
    store_group<DTYPE, GATED>(C, bias, m, n0 + n, N, s, u);
  }
  if (CK > 1) sm90::cluster_sync();  // no CTA leaves while another still reads its smem
}

}  // namespace swapab
}  // namespace tunefw
