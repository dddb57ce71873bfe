// stream_sm90: a bandwidth-bound GEMM for small M (decode), C[M,N] = A[M,K] * B[N,K]^T, that
// streams the weight B through a deep shared-memory ring filled by TMA.
//
// Decode GEMMs read the weight B once and little else, so the limit is HBM bandwidth, and what
// sets it per SM is the bytes in flight (Little's law: ~32-64 KB per SM at HBM latency). Here one
// producer thread keeps STAGES chunks of BN rows x BK k of B (and the M rows of A beside them)
// in flight with 2D TMA loads of 64-k boxes (128-byte swizzle, mbarrier-completed): the bytes in
// flight cost no registers and 2*BK/64 instructions per chunk (one bulk copy per row, tried
// first, was bound by the copy rate: twice as slow at M=16 as at M=1). TMA zero-fills rows past
// N or M and k past K, so edges need no code. WARPS consumer warps in WN groups split a stage's
// BN rows (WN slices of BN/WN rows) and, within a slice, take its k16 steps in turn: ldmatrix
// through the swizzle (conflict-free), swap-AB mma.sync m16n8k16 (B's rows are the MMA's 16-row
// side, the few rows of A its 8-wide side), then release the stage. WN > 1 lets a tile be wide
// (BN 96-128 at M = 33-64, each warp holding its slice's accumulators only) to read A once per
// more weight rows; measured, it did not pay: the wide tiles need CK > 1 to fill the SMs and ran
// slower than BN 32-48 at WN 1 (stream_wn_probe_h100.json), and A's traffic is not what holds
// M = 64 (timeline_stream_a_h100.json, the TUNEFW_DIAG_A_ONCE build below).
//
// Work: a CTA owns BN rows of B; a cluster of CK CTAs splits K (rank r takes chunks r*P..); the
// epilogue (tunefw/swapab_reduce.cuh) sums the warps in shared memory and the cluster's CTAs
// through DSMEM in a fixed order: deterministic, no workspace, nothing kept between launches.
// GATED 1 (a problem with gate "silu", tunefw/gate.cuh): B has 2N rows [Bg; Bu] and a CTA owns
// BN/2 columns of C, so its BN rows of a stage are BN/2 rows of Bg and the same BN/2 rows of Bu
// (two TMA boxes of BN/2 rows, one under the other); the epilogue pairs tile column n with
// n + BN/2. Gate rows past N read Bu's first rows: their columns are never stored.
#pragma once

#include "tunefw/sm80.cuh"
#include "tunefw/sm90.cuh"
#include "tunefw/swapab_reduce.cuh"

namespace tunefw {
namespace stream {

// The driver's opaque tensor map (cuTensorMapEncodeTiled), 128 bytes, 64-byte aligned.
struct alignas(64) TensorMap {
  unsigned long long opaque[16];
};

__device__ __forceinline__ void ldmatrix_x2(u32 (&r)[2], u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(addr));
}

// Shared memory (from a 1024-byte aligned base, as the 128-byte swizzle needs): the ring of
// STAGES stages, each BK/64 boxes of B (BN rows x 128 bytes) then BK/64 boxes of A (MT*8 rows),
// then the epilogue's partial tiles, then 2*STAGES mbarriers (full, empty).
template <int BN, int MT, int BK, int STAGES, int WARPS, int WN>
struct Layout {
  static constexpr int BOXES = BK / 64;
  static constexpr int B_BOX = BN * 128, A_BOX = MT * 8 * 128;
  static constexpr int A_OFF = BOXES * B_BOX;
  static constexpr int STAGE = BOXES * (B_BOX + A_BOX);
  static constexpr int RING = STAGES * STAGE;
  static constexpr int PARTIALS = swapab::Partials<BN, MT, WARPS / WN>::bytes;
  static constexpr int BARS = RING + PARTIALS;
  static constexpr int bytes = BARS + 2 * STAGES * 8 + 1024;  // + the alignment slack
};

// Address of 16-byte chunk (k / 8) of `row` in a stage whose boxes of `box` bytes hold 64 k of
// every row, 128 bytes per row, chunks XOR-swizzled by row % 8 (CU_TENSOR_MAP_SWIZZLE_128B).
__device__ __forceinline__ u32 swizzled(u32 base, int box, int row, int k) {
  return base + (u32)((k >> 6) * box + row * 128 + ((((k >> 3) & 7) ^ (row & 7)) << 4));
}

// Consumer: warp `warp` multiplies rows (warp % WN) * BN/WN .. + BN/WN of k16 steps warp / WN,
// + WARPS/WN, ... of one resident chunk of `steps` k16 steps (TMA zero-filled what lies past K).
template <int DTYPE, int BN, int MT, int BK, int WARPS, int WN>
__device__ __forceinline__ void mma_chunk(u32 stage, int steps, int warp, int lane,
                                          float (&acc)[BN / WN / 16][MT][4]) {
  constexpr int RT = BN / WN / 16, WK = WARPS / WN;
  using L = Layout<BN, MT, BK, 1, WARPS, WN>;
  // ldmatrix rows: x4 over a 16x16 B tile (lanes 0-15 k 0-7, 16-31 k 8-15), x2 over an 8x16
  // A tile (lanes 0-7 k 0-7, 8-15 k 8-15).
  const int b_row = (warp % WN) * (BN / WN) + (lane & 15), b_k = (lane >> 4) * 8;
  const int a_row = lane & 7, a_k = ((lane >> 3) & 1) * 8;
#pragma unroll 2
  for (int t = warp / WN; t < steps; t += WK) {
    u32 a[RT][4], b[MT][2];
#pragma unroll
    for (int i = 0; i < RT; ++i)
      ldmatrix_x4(a[i], swizzled(stage, L::B_BOX, i * 16 + b_row, t * 16 + b_k));
#pragma unroll
    for (int m = 0; m < MT; ++m)
      ldmatrix_x2(b[m], swizzled(stage + L::A_OFF, L::A_BOX, m * 8 + a_row, t * 16 + a_k));
#pragma unroll
    for (int i = 0; i < RT; ++i)
#pragma unroll
      for (int m = 0; m < MT; ++m) mma_16816<DTYPE>(acc[i][m], a[i], b[m][0], b[m][1]);
  }
}

}  // namespace stream
}  // namespace tunefw

template <int DTYPE, int BN, int MT, int BK, int STAGES, int WARPS, int CK, int GATED = 0,
          int WN = 1>
__global__ void __launch_bounds__((WARPS + 1) * 32, 1)
    gemm_stream_sm90(const __grid_constant__ tunefw::stream::TensorMap tmap_a,
                     const __grid_constant__ tunefw::stream::TensorMap tmap_b,
                     tunefw::u16* __restrict__ C, const tunefw::u16* __restrict__ bias, int M, int N,
                     int K) {
  using namespace tunefw;
  using namespace tunefw::stream;
  using L = Layout<BN, MT, BK, STAGES, WARPS, WN>;
  static_assert(WARPS % WN == 0 && BN % (16 * WN) == 0, "WN slices of whole 16-row tiles");
  constexpr int RT = BN / WN / 16;
  constexpr int THREADS = (WARPS + 1) * 32;
  extern __shared__ __align__(1024) unsigned char smem_raw[];

  const int tid = threadIdx.x;
  const int warp = tid >> 5, lane = tid & 31;
  const int rank = CK > 1 ? (int)sm90::cluster_ctarank() : 0;
  static_assert(!GATED || BN % 16 == 0, "GATED: two boxes of BN/2 rows, 8-row swizzle atoms");
  constexpr int OBN = GATED ? BN / 2 : BN;  // columns of C per CTA
  const int n0 = (blockIdx.x / CK) * OBN;
  unsigned char* smem = smem_raw + ((1024 - (sm90::smem_u32(smem_raw) & 1023)) & 1023);
  const u32 ring = sm90::smem_u32(smem);
  const u32 full = ring + L::BARS, empty = full + STAGES * 8;

  // This rank's chunks [c_begin, c_end) of BK k each.
  const int chunks = (K + BK - 1) / BK;
  const int per_rank = (chunks + CK - 1) / CK;
  const int c_begin = rank * per_rank;
  const int c_end = imin(chunks, c_begin + per_rank);

  if (tid == 0) {
    sm90::tma_prefetch_desc(&tmap_a);
    sm90::tma_prefetch_desc(&tmap_b);
    sm90::init_ring_barriers(full, empty, STAGES, WARPS);
  }
  __syncthreads();

  float acc[RT][MT][4];
#pragma unroll
  for (int i = 0; i < RT; ++i)
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[i][m][j] = 0.f;

  sm90::pdl_launch_dependents();
  // No L2 prefetch of the first ring before the wait: its boxes queue ahead of the ring's own
  // loads of the same lines (timeline_stream_pf_h200.json: 2.4-9.4% faster without, plainly).
  // Nor the weight's first ring loaded before the wait (B never depends on the kernel before):
  // A's first boxes queue behind it (commit 1f937a3's TUNEFW_EXP_EARLY_B, device_batch.sh
  // earlyb; measured not to pay on an H100 in session 31, whose result file was lost): not kept.
  sm90::pdl_wait();  // every global access below after the kernel before this one
  if (warp == WARPS) {  // producer: one thread issues each chunk's boxes
    if (lane == 0) {
      for (int ch = c_begin; ch < c_end; ++ch) {
        const int j = ch - c_begin, s = j % STAGES;
        const u32 stage = ring + (u32)(s * L::STAGE), bar = full + s * 8;
        if (j >= STAGES) sm90::mbar_wait(empty + s * 8, ((j / STAGES) + 1) & 1);
#ifdef TUNEFW_DIAG_A_ONCE  // diagnostic build (benchmarks/timeline_h200.py --variant), WRONG
        const bool load_a = j < STAGES;  // answers: A's boxes on the ring's first pass only,
#else                                    // timing the weight's stream without A's traffic
        constexpr bool load_a = true;
#endif
        // full boxes: TMA zero-fills edges
        sm90::mbar_arrive_expect_tx(bar, (u32)(load_a ? L::STAGE : L::BOXES * L::B_BOX));
#pragma unroll
        for (int x = 0; x < L::BOXES; ++x) {
          const int k = ch * BK + x * 64;
          sm90::tma_load_2d(stage + (u32)(x * L::B_BOX), &tmap_b, k, n0, bar);
          if (GATED)  // Bu's rows under Bg's: box rows are BN/2 (a multiple of 8: same swizzle)
            sm90::tma_load_2d(stage + (u32)(x * L::B_BOX + OBN * 128), &tmap_b, k, N + n0, bar);
          if (load_a)
            sm90::tma_load_2d(stage + (u32)(L::A_OFF + x * L::A_BOX), &tmap_a, k, 0, bar);
        }
      }
    }
  } else {  // consumers
    for (int ch = c_begin; ch < c_end; ++ch) {
      const int j = ch - c_begin, s = j % STAGES;
      sm90::mbar_wait(full + s * 8, (j / STAGES) & 1);
      mma_chunk<DTYPE, BN, MT, BK, WARPS, WN>(ring + (u32)(s * L::STAGE),
                                              (imin(BK, K - ch * BK) + 15) >> 4, warp, lane, acc);
      __syncwarp();
      if (lane == 0) sm90::mbar_arrive(empty + s * 8);
    }
  }

  swapab::reduce_store<DTYPE, BN, MT, WARPS, CK, THREADS, GATED, WN>(
      reinterpret_cast<float*>(smem + L::RING), acc, tid, rank, n0, C, bias, M, N);
}
