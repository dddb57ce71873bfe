// rows_sm90: a bandwidth-bound GEMM for small M (decode), C[M,N] = A[M,K] * B[N,K]^T, that
// streams whole rows of the weight B with 1D bulk copies.
//
// Why whole rows: B is row-major, so a run of consecutive rows is one contiguous block of
// memory. On the H200 (benchmarks/results/stream_micro_h200.json) 32 KB contiguous bulk copies
// over an equal byte share per SM read 9-18% faster than 2D TMA boxes of 128- or 512-byte row
// runs (3.6 vs 3.05 TB/s for a 32 MB weight, 4.38 vs 4.01 for 224 MB). So each CTA of a
// persistent grid owns a contiguous range of rows (equal to within one row), and one producer
// thread copies RS whole rows per ring stage (RS * K * 2 bytes, in COPY-byte pieces).
//
// Math: mma.sync m16n8k16 with the tokens (M <= 16) as the MMA's 16-row side and 8 rows of B as
// its 8-column side. A dot product may take k in any order if A and B take the same one, so each
// lane loads 16 contiguous bytes (8 k) of its row of B and of A and feeds them to two MMAs (k
// 8q..8q+3 to the first, 8q+4..8q+7 to the second): one 16-byte shared load per lane per 32 k,
// no ldmatrix. Rows of B sit K*2 bytes apart (a multiple of 128 when K % 64 == 0), so the two
// rows of an 8-lane load phase would hit the same banks; odd rows load the two 32-k blocks of a
// pair in the opposite order and swap them back in registers, and every phase covers 32 banks.
// Consumer warps split K (KP pairs of 32-k blocks each, their A kept in registers); each step
// (a stage, or the two 4-row stages of one 8-row group) ends with a fixed-order sum of the
// warps' partial tiles in shared memory (double-buffered: one barrier per step) and a store of
// its rows of C: deterministic, no workspace, no cross-CTA reduction, nothing kept between
// launches.
#pragma once

#include "tunefw/sm80.cuh"
#include "tunefw/sm90.cuh"
#include "tunefw/swapab_reduce.cuh"

namespace tunefw {
namespace rows {

// 1D bulk copy global -> shared, completing `bar` with its bytes (size % 16 == 0).
__device__ __forceinline__ void bulk_load(u32 dst, const void* src, u32 bytes, u32 bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(dst),
      "l"(reinterpret_cast<unsigned long long>(src)), "r"(bytes), "r"(bar)
      : "memory");
}

__device__ __forceinline__ uint4 ld_global_nc_v4(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ uint4 lds_v4(u32 addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr));
  return v;
}

__device__ __forceinline__ uint4 pick(bool swap, uint4 x, uint4 y) { return swap ? y : x; }

// A step of the consumers is one stage of RS >= 8 rows (RS/8 groups), or the 8/RS stages of
// fewer rows that make one 8-row group.
template <int RS>
struct Step {
  static constexpr int groups = RS >= 8 ? RS / 8 : 1, stages = RS >= 8 ? 1 : 8 / RS;
};

// Partial tiles, two buffers (steps alternate): [2][WARPS][groups][32 lanes][2*MT floats]
// (c0, c1 and, for 16 rows of A, c2, c3).
template <int RS, int WARPS, int MROWS>
struct Partials {
  static constexpr int buffer = WARPS * Step<RS>::groups * 32 * 2 * (MROWS / 8);
  static constexpr int floats = 2 * buffer;
};

// Two MMAs over one 32-k block: 8 k per lane of A (rows g and, for MT = 2, g + 8) and of B.
template <int DTYPE, int MT>
__device__ __forceinline__ void mma_block(float (&acc)[4], const uint4& a0, const uint4& a8,
                                          const uint4& b) {
  const u32 lo[4] = {a0.x, MT > 1 ? a8.x : 0u, a0.y, MT > 1 ? a8.y : 0u};
  const u32 hi[4] = {a0.z, MT > 1 ? a8.z : 0u, a0.w, MT > 1 ? a8.w : 0u};
  mma_16816<DTYPE>(acc, lo, b.x, b.y);
  mma_16816<DTYPE>(acc, hi, b.z, b.w);
}

}  // namespace rows
}  // namespace tunefw

template <int DTYPE, int RS, int STAGES, int WARPS, int KP, int MROWS, int OCC, int COPY>
__global__ void __launch_bounds__((WARPS + 1) * 32, OCC)
    gemm_rows_sm90(const tunefw::u16* __restrict__ A, const tunefw::u16* __restrict__ B,
                   tunefw::u16* __restrict__ C, const tunefw::u16* __restrict__ bias, int M, int N,
                   int K) {
  using namespace tunefw;
  using namespace tunefw::rows;
  constexpr int MT = MROWS / 8, CONSUMERS = WARPS * 32;
  extern __shared__ __align__(128) unsigned char smem[];

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int row_bytes = K * 2, stage_bytes = RS * row_bytes;
  const u32 ring = sm90::smem_u32(smem);
  float* part = reinterpret_cast<float*>(smem + STAGES * stage_bytes);
  const u32 full = sm90::smem_u32(part + Partials<RS, WARPS, MROWS>::floats);
  const u32 empty = full + STAGES * 8;

  // This CTA's rows [r0, r1): an equal share of B's rows (to within one), contiguous in B. Whole
  // rows, not 8-row groups: gate_up's 3584 groups over 132 CTAs are 27 or 28 (the kernel runs
  // as long as the CTAs of 28: 3% past the mean), its 28672 rows 217 or 218 (0.4%). A CTA's
  // groups start at r0; its last may hold fewer than 8 rows (their columns are not stored).
  const int r0 = (int)((long long)blockIdx.x * N / gridDim.x);
  const int r1 = (int)((long long)(blockIdx.x + 1) * N / gridDim.x);
  const int stages = (r1 - r0 + RS - 1) / RS;

  if (tid == 0) sm90::init_ring_barriers(full, empty, STAGES, WARPS);
  __syncthreads();
  sm90::pdl_launch_dependents();
  // No L2 prefetch of the first ring before the wait: it delays the ring's own loads of the same
  // lines (timeline_rows_pf_h200.json: 0.8-2.5% faster without, plainly).
  sm90::pdl_wait();  // every global access below after the kernel before this one

  if (warp == WARPS) {  // producer: one thread copies each stage's rows
    if (lane == 0) {
      for (int j = 0; j < stages; ++j) {
        const int s = j % STAGES, r = r0 + j * RS;
        if (j >= STAGES) sm90::mbar_wait(empty + s * 8, ((j / STAGES) + 1) & 1);
        const int bytes = imin(RS, r1 - r) * row_bytes;
        const unsigned char* src = reinterpret_cast<const unsigned char*>(B) + (size_t)r * row_bytes;
        const u32 dst = ring + (u32)(s * stage_bytes);
        sm90::mbar_arrive_expect_tx(full + s * 8, (u32)bytes);
        for (int off = 0; off < bytes; off += COPY)
          bulk_load(dst + off, src + off, (u32)imin(COPY, bytes - off), full + s * 8);
      }
    }
    return;
  }

  // Consumers. Lane (g, q): row g of an 8-row group of B, row g (and g + 8) of A, 8 k at 8q.
  // Warp w takes 64-k pairs w, w + WARPS, ... (KP of them); its A is the same for every stage,
  // so it is loaded once, into registers.
  const int g = lane >> 2, q = lane & 3;
  const bool odd = g & 1;
  const int pairs = (K + 63) >> 6;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  uint4 a_lo[KP][2], a_hi[KP][2];  // rows g and g + 8 of A; blocks 0 and 1 of each pair
#pragma unroll
  for (int kp = 0; kp < KP; ++kp) {
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      const int k = (warp + kp * WARPS) * 64 + b * 32 + 8 * q;  // K % 8 == 0: wholly in or out
      a_lo[kp][b] = g < M && k < K ? ld_global_nc_v4(A + (size_t)g * K + k) : zero;
      a_hi[kp][b] = MT > 1 && g + 8 < M && k < K ? ld_global_nc_v4(A + (size_t)(g + 8) * K + k) : zero;
    }
  }

  constexpr int G = Step<RS>::groups, SPS = Step<RS>::stages;
  const int steps = (stages + SPS - 1) / SPS;
  for (int t = 0; t < steps; ++t) {
    const int j0 = t * SPS, r = r0 + t * 8 * G;
#pragma unroll
    for (int u = 0; u < SPS; ++u)
      if (j0 + u < stages) sm90::mbar_wait(full + ((j0 + u) % STAGES) * 8, ((j0 + u) / STAGES) & 1);
    float acc[G][4];
#pragma unroll
    for (int i = 0; i < G; ++i)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[i][c] = 0.f;
    u32 rows[G];  // this lane's row of each group: stage j0 + row / RS, row % RS within it
    bool live[G];  // the row is this CTA's (a last group's missing rows read zeros, not a stage
                   // the producer may be filling)
#pragma unroll
    for (int i = 0; i < G; ++i) {
      const int row = i * 8 + g;
      rows[i] = ring + (u32)(((j0 + row / RS) % STAGES) * stage_bytes + (row % RS) * row_bytes);
      live[i] = r + row < r1;
    }

#pragma unroll
    for (int kp = 0; kp < KP; ++kp) {
      const int p = warp + kp * WARPS;
      if (p >= pairs) break;
      const int k0 = p * 64 + 8 * q, k1 = k0 + 32;  // this lane's 8 k in each block of the pair
      const bool v0 = k0 < K, v1 = k1 < K;
      // Odd rows read block 1 first: the phase's two rows then cover all 32 banks.
      const bool f0 = odd ? v1 : v0, f1 = odd ? v0 : v1;
      const int first = (odd ? k1 : k0) * 2, second = (odd ? k0 : k1) * 2;
#pragma unroll
      for (int i = 0; i < G; ++i) {
        const uint4 x = f0 && live[i] ? lds_v4(rows[i] + first) : zero;
        const uint4 y = f1 && live[i] ? lds_v4(rows[i] + second) : zero;
        mma_block<DTYPE, MT>(acc[i], a_lo[kp][0], a_hi[kp][0], pick(odd, x, y));
        mma_block<DTYPE, MT>(acc[i], a_lo[kp][1], a_hi[kp][1], pick(odd, y, x));
      }
    }
    __syncwarp();
    if (lane == 0) {
#pragma unroll
      for (int u = 0; u < SPS; ++u)
        if (j0 + u < stages) sm90::mbar_arrive(empty + ((j0 + u) % STAGES) * 8);
    }

    // Fixed-order sum of the warps' tiles, then this step's rows of C. The buffers alternate:
    // a warp writes buffer t & 1 again only past step t + 1's barrier, which every thread
    // reaches after its share of step t's sum, so one barrier per step is enough.
    float* buf = part + (t & 1) * Partials<RS, WARPS, MROWS>::buffer;
#pragma unroll
    for (int i = 0; i < G; ++i)
#pragma unroll
      for (int c = 0; c < 2 * MT; ++c) buf[((warp * G + i) * 32 + lane) * (2 * MT) + c] = acc[i][c];
    sm90::named_bar_sync(1, CONSUMERS);
    const int rows_here = imin(8 * G, r1 - r);
    for (int idx = tid; idx < G * 8 * M; idx += CONSUMERS) {
      const int i = idx / (8 * M), rem = idx - i * 8 * M, m = rem >> 3, n = rem & 7;
      if (i * 8 + n >= rows_here) continue;
      const int src = ((m & 7) * 4 + (n >> 1)) * (2 * MT) + (m >> 3) * 2 + (n & 1);
      float sum = 0.f;
#pragma unroll 4
      for (int w = 0; w < WARPS; ++w) sum += buf[(w * G + i) * 32 * (2 * MT) + src];
      const int col = r + i * 8 + n;
      if (bias) sum += swapab::to_f32<DTYPE>(bias[col]);
      C[(size_t)m * N + col] = (u16)(pack_x2<DTYPE>(sum, 0.f) & 0xffffu);
    }
  }
}
