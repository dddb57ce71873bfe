// stream_sm90: a bandwidth-bound GEMM for small M (decode), C[M,N] = A[M,K] * B[N,K]^T, that
// streams the weight B through a deep shared-memory ring filled by bulk asynchronous copies.
//
// Decode GEMMs read the weight B once and little else, so the limit is HBM bandwidth, and what
// sets it per SM is the bytes in flight (Little's law: ~32-64 KB per SM at HBM latency). Here one
// producer warp keeps STAGES chunks of BN rows x BK k in flight with 1D cp.async.bulk copies (one
// contiguous BK*2-byte run of a row each, completing an mbarrier), so the bytes in flight cost
// no registers and a few instructions per chunk, and every row is read as long sequential runs.
// WARPS consumer warps take the chunk's k16 steps in turn: ldmatrix from the padded ring (rows
// BK*2+16 bytes apart: conflict-free), swap-AB mma.sync m16n8k16 (B's rows are the MMA's 16-row
// side, the few rows of A its 8-wide side), then release the stage.
//
// Work: a CTA owns BN rows of B; a cluster of CK CTAs splits K (rank r takes chunks r*P..); the
// epilogue (tunefw/swapab_reduce.cuh) sums the warps in shared memory and the cluster's CTAs
// through DSMEM in a fixed order: deterministic, no workspace, nothing kept between launches.
// Rows past N or M are never copied (their garbage only reaches outputs that are not stored);
// a chunk's k past K are never multiplied (K % 8 == 0: the half k16 step is zeroed in registers).
#pragma once

#include "tunefw/sm80.cuh"
#include "tunefw/sm90.cuh"
#include "tunefw/swapab_reduce.cuh"

namespace tunefw {
namespace stream {

// B is read once: evict it first from L2; A (a few rows, read by every CTA) is kept.
__device__ __forceinline__ unsigned long long policy_evict_first() {
  unsigned long long p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(p));
  return p;
}
__device__ __forceinline__ unsigned long long policy_evict_last() {
  unsigned long long p;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(p));
  return p;
}

// `bytes` (a multiple of 16) from global `src` to this CTA's shared `dst`, completing `bar`.
__device__ __forceinline__ void bulk_load(u32 dst, const void* src, u32 bytes, u32 bar,
                                          unsigned long long policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1], %2, [%3], %4;\n" ::"r"(dst),
      "l"(src), "r"(bytes), "r"(bar), "l"(policy)
      : "memory");
}

__device__ __forceinline__ void ldmatrix_x2(u32 (&r)[2], u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(addr));
}

// Shared memory: the ring (STAGES x (BN rows of B, then MT*8 rows of A), rows PITCH bytes
// apart), then the epilogue's partial tiles, then 2*STAGES mbarriers (full, empty).
template <int BN, int MT, int BK, int STAGES, int WARPS>
struct Layout {
  static constexpr int PITCH = BK * 2 + 16;
  static constexpr int STAGE = (BN + MT * 8) * PITCH;
  static constexpr int RING = STAGES * STAGE;
  static constexpr int PARTIALS = swapab::Partials<BN, MT, WARPS>::bytes;
  static constexpr int BARS = RING + PARTIALS;
  static constexpr int bytes = BARS + 2 * STAGES * 8;
};

// Consumer: warp `warp` multiplies k16 steps warp, warp + WARPS, ... of one resident chunk
// holding `kv` valid k (a multiple of 8).
template <int DTYPE, int BN, int MT, int BK, int WARPS>
__device__ __forceinline__ void mma_chunk(u32 stage, int kv, int warp, int lane,
                                          float (&acc)[BN / 16][MT][4]) {
  constexpr int RT = BN / 16;
  constexpr int PITCH = BK * 2 + 16;
  const int steps = (kv + 15) >> 4;
  const bool half = (kv & 15) != 0;  // the last step has 8 valid k
  // ldmatrix row addresses: x4 over a 16x16 B tile (lanes 0-15 k 0-7, 16-31 k 8-15), x2 over
  // an 8x16 A tile (lanes 0-7 k 0-7, 8-15 k 8-15).
  const u32 b_lane = stage + (u32)((lane & 15) * PITCH + (lane >> 4) * 16);
  const u32 a_lane = stage + (u32)((BN + (lane & 7)) * PITCH + ((lane >> 3) & 1) * 16);
#pragma unroll 2
  for (int t = warp; t < steps; t += WARPS) {
    u32 a[RT][4], b[MT][2];
#pragma unroll
    for (int i = 0; i < RT; ++i) ldmatrix_x4(a[i], b_lane + (u32)(i * 16 * PITCH + t * 32));
#pragma unroll
    for (int m = 0; m < MT; ++m) ldmatrix_x2(b[m], a_lane + (u32)(m * 8 * PITCH + t * 32));
    if (half && t == steps - 1) {  // k past K: whatever the ring holds there is not multiplied
#pragma unroll
      for (int i = 0; i < RT; ++i) a[i][2] = a[i][3] = 0u;
#pragma unroll
      for (int m = 0; m < MT; ++m) b[m][1] = 0u;
    }
#pragma unroll
    for (int i = 0; i < RT; ++i)
#pragma unroll
      for (int m = 0; m < MT; ++m) mma_16816<DTYPE>(acc[i][m], a[i], b[m][0], b[m][1]);
  }
}

}  // namespace stream
}  // namespace tunefw

template <int DTYPE, int BN, int MT, int BK, int STAGES, int WARPS, int CK>
__global__ void __launch_bounds__((WARPS + 1) * 32, 1)
    gemm_stream_sm90(const tunefw::u16* __restrict__ A, const tunefw::u16* __restrict__ B,
                     tunefw::u16* __restrict__ C, const tunefw::u16* __restrict__ bias, int M, int N,
                     int K) {
  using namespace tunefw;
  using namespace tunefw::stream;
  using L = Layout<BN, MT, BK, STAGES, WARPS>;
  constexpr int RT = BN / 16;
  constexpr int THREADS = (WARPS + 1) * 32;
  extern __shared__ __align__(128) unsigned char smem[];

  const int tid = threadIdx.x;
  const int warp = tid >> 5, lane = tid & 31;
  const int rank = CK > 1 ? (int)sm90::cluster_ctarank() : 0;
  const int n0 = (blockIdx.x / CK) * BN;
  const u32 ring = sm90::smem_u32(smem);
  const u32 full = ring + L::BARS, empty = full + STAGES * 8;

  // This rank's chunks [c_begin, c_end) of BK k each.
  const int chunks = (K + BK - 1) / BK;
  const int per_rank = (chunks + CK - 1) / CK;
  const int c_begin = rank * per_rank;
  const int c_end = imin(chunks, c_begin + per_rank);

  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
      sm90::mbar_init(full + s * 8, 1);
      sm90::mbar_init(empty + s * 8, WARPS);
    }
    sm90::fence_mbar_init();
  }
  __syncthreads();

  float acc[RT][MT][4];
#pragma unroll
  for (int i = 0; i < RT; ++i)
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[i][m][j] = 0.f;

  if (warp == WARPS) {  // producer: lane l copies rows l, l + 32, ... of each chunk
    const int b_rows = imin(BN, N - n0), a_rows = imin(MT * 8, M);
    const unsigned long long keep = policy_evict_last(), stream_once = policy_evict_first();
    for (int ch = c_begin; ch < c_end; ++ch) {
      const int j = ch - c_begin, s = j % STAGES;
      const int k0 = ch * BK, kv = imin(BK, K - k0);
      const u32 stage = ring + (u32)(s * L::STAGE), bar = full + s * 8;
      if (j >= STAGES) sm90::mbar_wait(empty + s * 8, ((j / STAGES) + 1) & 1);
      if (lane == 0) sm90::mbar_arrive_expect_tx(bar, (u32)((b_rows + a_rows) * kv * 2));
      __syncwarp();
      for (int r = lane; r < b_rows + a_rows; r += 32) {
        const bool is_b = r < b_rows;
        const u16* src = is_b ? B + (long long)(n0 + r) * K + k0 : A + (long long)(r - b_rows) * K + k0;
        const int row = is_b ? r : BN + (r - b_rows);
        bulk_load(stage + (u32)(row * L::PITCH), src, (u32)(kv * 2), bar, is_b ? stream_once : keep);
      }
    }
  } else {  // consumers
    for (int ch = c_begin; ch < c_end; ++ch) {
      const int j = ch - c_begin, s = j % STAGES;
      sm90::mbar_wait(full + s * 8, (j / STAGES) & 1);
      mma_chunk<DTYPE, BN, MT, BK, WARPS>(ring + (u32)(s * L::STAGE), imin(BK, K - ch * BK), warp,
                                          lane, acc);
      __syncwarp();
      if (lane == 0) sm90::mbar_arrive(empty + s * 8);
    }
  }

  swapab::reduce_store<DTYPE, BN, MT, WARPS, CK, THREADS>(
      reinterpret_cast<float*>(smem + L::RING), acc, tid, rank, n0, C, bias, M, N);
}
