// wgmma_sm90: warp-specialized TMA + wgmma GEMM for Hopper (compile for sm_90a).
//
//   C[M,N] = A[M,K] @ B[N,K]^T   (TN: A and B K-major, C row-major), fp32 accumulation,
//   inputs and output bf16 (DTYPE 0) or fp16 (DTYPE 1), any M >= 1, N and K multiples of 8.
//
// Block = 3 warpgroups (384 threads):
//   WG0  producer: setmaxnreg.dec; one thread issues the TMA loads of a STAGES-deep ring
//        (full/empty mbarriers, expect_tx), multicasting the operand its cluster shares.
//   WG1, WG2 consumers: setmaxnreg.inc; wgmma m64nBNk16 from swizzled shared memory, one
//        wgmma group kept in flight, the previous stage released after wait_group 1.
//        SCHEDULE 0 cooperative: both consumers work on one BMxBN tile, BM/2 rows each.
//        SCHEDULE 1 ping-pong: each consumer owns whole tiles (alternating), so one's epilogue
//        overlaps the other's main loop. The main loops take turns in tile order (a hand-off on
//        named barriers): a consumer waits on the ring only after the previous tile's consumer
//        has passed all of its waits, so the full-barrier parities it waits for cannot alias a
//        phase STAGES*2 k-blocks away (the bug that crashed persistent ping-pong).
// Clusters CLUSTER_M x CLUSTER_N: CTAs of a cluster that share a tile row (same M range) share
// the A tile, those that share a tile column share the B tile; each loads its slice of the shared
// operand and multicasts it. A consumer releases a stage to every CTA that writes into it.
// Tiles come from a scheduler over "cluster tiles" (raster along M or N in bands of GROUP);
// PERSISTENT grids loop over them (stride = clusters); non-persistent grids take one each
// (ping-pong: two consecutive ones, one per consumer).
// SPLIT_K > 1: each split writes an fp32 partial to the workspace; the last split to arrive at
// the per-tile counter sums splits 0..S-1 in index order (deterministic; with two splits it adds
// the other's partial to its own accumulators, as exact), writes C and resets the counter. EPILOGUE 0: guarded direct stores; 1: registers -> swizzled smem -> TMA store;
// 2: like 1, but the finished tile is packed to 16 bits in registers and stored while the next
// tile's first wgmma group runs (hides the cooperative epilogue; SPLIT_K == 1).
// SWAP_AB 1: the host passes B's tensor map as tmap_a, A's as tmap_b and (N, M) as (M, N), so
// the kernel computes C^T = B A^T: the weight's rows take wgmma's 64-row side and the tokens its
// N side (BN, any multiple of 8: 136 covers M = 129), so a small or odd M is one narrow tile,
// not a mostly empty 64-row one; the direct epilogue writes each element to C's own row-major
// place. Widths off a multiple of 32 need the direct epilogue (EPILOGUE 0) in either layout.
// GATED 1 (a problem with gate "silu", tunefw/gate.cuh): B has 2N rows [Bg; Bu] and a tile
// owns OBN = BN/2 columns of C: its BN rows of B are OBN rows of Bg over the same OBN rows of Bu
// (two TMA boxes), so wgmma's column j and j + OBN are the gate and up products of one output,
// held by the same thread (accumulator j/8*4.. and that + OBN/2). Every epilogue (split-K sums,
// deferred or not) combines them before rounding. No B multicast (CLUSTER_M 1), no swap-AB.
#include "tunefw/gate.cuh"
#include "tunefw/sm90.cuh"
#include "tunefw/wgmma_ops.cuh"  // Wgmma<BN, DT>: generated from the declared BN values

// TUNEFW_TIMELINE (defined by benchmarks/timeline_h200.py only, never in a tuned build): each CTA
// records when it reaches each phase (globaltimer ns and clock64): 0 entry, 1 set up, 2 first TMA
// issued, 3 last TMA issued (thread 0), 4 first stage consumed, 5 last main loop done, 6 epilogue
// done, 7 exit (consumer 0's thread 0); word 16 is smid << 32 | linear block index, word 17 the
// work units of consumer 0. The record is composed in shared memory and written at exit to a
// slot taken after the last TMA issue: nothing on the kernel's own path touches global memory.
#ifdef TUNEFW_TIMELINE
#ifndef TUNEFW_TIMELINE_CTAS
#define TUNEFW_TIMELINE_CTAS 8192
#endif
#define TUNEFW_TIMELINE_WORDS 18
extern "C" {
__device__ unsigned long long tunefw_timeline[TUNEFW_TIMELINE_CTAS * TUNEFW_TIMELINE_WORDS];
__device__ unsigned int tunefw_timeline_next;
}
struct TimelineRecord {
  unsigned long long w[TUNEFW_TIMELINE_WORDS];
  int slot;
};
__device__ __forceinline__ void timeline_mark(TimelineRecord& r, int event) {
  unsigned long long g;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g));
  r.w[2 * event] = g;
  r.w[2 * event + 1] = (unsigned long long)clock64();
}
constexpr int kTimelineBar = 6;  // named barrier: the producer's warp 0 hands the record over
#define TL_MARK(event) timeline_mark(tl_rec, event)
#else
#define TL_MARK(event) ((void)0)
#endif

// The driver's opaque tensor map (cuTensorMapEncodeTiled), 128 bytes, 64-byte aligned.
struct alignas(64) CUtensorMap {
  unsigned long long opaque[16];
};

namespace tunefw {
namespace wgmma_sm90_detail {

using namespace tunefw::sm90;

constexpr int kProducerRegs = 40;
constexpr int kConsumerRegs = 232;
constexpr int kOrderBar = 4;  // named barriers 4, 5: ping-pong main-loop turns (2, 3: epilogue)

// Maps cluster tile t (raster order) to this CTA's tile (tm, tn).
template <int CLUSTER_M, int CLUSTER_N, int RASTER, int GROUP>
__host__ __device__ __forceinline__ void cluster_tile(int t, int cm_tiles, int cn_tiles, int rx,
                                                      int ry, int& tm, int& tn) {
  int cm, cn;
  if (RASTER == 0) {  // bands of GROUP cluster-rows, M fastest inside a band
    const int band = GROUP * cn_tiles;
    const int g = t / band;
    const int first = g * GROUP;
    const int rem = cm_tiles - first;
    const int gs = rem < GROUP ? rem : GROUP;
    const int r = t - g * band;
    cm = first + r % gs;
    cn = r / gs;
  } else {  // bands of GROUP cluster-columns, N fastest inside a band
    const int band = GROUP * cm_tiles;
    const int g = t / band;
    const int first = g * GROUP;
    const int rem = cn_tiles - first;
    const int gs = rem < GROUP ? rem : GROUP;
    const int r = t - g * band;
    cn = first + r % gs;
    cm = r / gs;
  }
  tm = cm * CLUSTER_M + rx;
  tn = cn * CLUSTER_N + ry;
}

// One unit of work: cluster tile t over k-blocks [kb0, kb1); split >= 0 (split-K only): the
// index of the split, whose fp32 partial the last split to arrive sums with the others.
struct Unit {
  int t, kb0, kb1, split;
};

// The units of cluster `cid` (work items w = tile * SPLIT_K + split), in the same order in every
// role and every CTA of the cluster: a persistent grid strides by the cluster count, a
// non-persistent one takes PER_CLUSTER consecutive items. Host code too, so that a test can
// check on a CPU that every k-block of every tile is done once (tests/test_wgmma_schedule.py).
template <int PERSISTENT, int PER_CLUSTER, int SPLIT_K>
struct WorkList {
  int k_iters, count;
  int w, w_end, w_step;

  __host__ __device__ __forceinline__ WorkList(int cid, int ncl, int tiles, int k_iters_)
      : k_iters(k_iters_) {
    const int total = tiles * SPLIT_K;
    if (PERSISTENT) {
      w = cid;
      w_end = total;
      w_step = ncl;
    } else {
      w = cid * PER_CLUSTER;
      w_end = w + PER_CLUSTER < total ? w + PER_CLUSTER : total;
      w_step = 1;
    }
    count = w < w_end ? (w_end - w + w_step - 1) / w_step : 0;
  }

  __host__ __device__ __forceinline__ bool next(Unit& u) {
    if (w >= w_end) return false;
    u.split = SPLIT_K == 1 ? -1 : w % SPLIT_K;
    u.t = SPLIT_K == 1 ? w : w / SPLIT_K;
    u.kb0 = SPLIT_K == 1 ? 0 : u.split * k_iters / SPLIT_K;
    u.kb1 = SPLIT_K == 1 ? k_iters : (u.split + 1) * k_iters / SPLIT_K;
    w += w_step;
    return true;
  }
};

// Guarded direct stores of a consumer's WG_M x BN block: value group (mi, j) is rows r, r+8 and
// columns c, c+1 of the wgmma accumulator layout; src(mi, j, lo, hi) gives them as two packed
// 16-bit pairs (lo: row r, hi: row r + 8). UNR: unroll of the column loop.
// SWAP (swap-AB): the kernel's M x N is C transposed (its rows are C's columns, its columns C's
// rows, any count), so element (r, c) goes to C[c * M + r], one 16-bit store each.
template <int BN, int MI, int UNR, int SWAP, class Src>
__device__ __forceinline__ void epilogue_direct(Src&& src, unsigned short* C, int M, int N,
                                                int tile_row, int tile_col, int t) {
  const int warp = t / 32, lane = t % 32;
  const int c_first = tile_col + (lane % 4) * 2;
#pragma unroll
  for (int mi = 0; mi < MI; ++mi) {
    const int r = tile_row + mi * 64 + warp * 16 + lane / 4;
    const bool ok0 = r < M, ok1 = r + 8 < M;
    if (SWAP) {
#pragma unroll UNR
      for (int j = 0; j < BN / 8; ++j) {
        const int c = c_first + j * 8;
        u32 lo, hi;
        src(mi, j, lo, hi);
        unsigned short* p = C + (size_t)c * M + r;
        if (c < N) {
          if (ok0) p[0] = (unsigned short)(lo & 0xffffu);
          if (ok1) p[8] = (unsigned short)(hi & 0xffffu);
        }
        if (c + 1 < N) {
          if (ok0) p[M] = (unsigned short)(lo >> 16);
          if (ok1) p[M + 8] = (unsigned short)(hi >> 16);
        }
      }
      continue;
    }
    unsigned short* p0 = C + (size_t)r * N + c_first;  // constant offsets below
    unsigned short* p1 = p0 + (size_t)8 * N;
#pragma unroll UNR
    for (int j = 0; j < BN / 8; ++j) {
      if (c_first + j * 8 < N) {
        u32 lo, hi;
        src(mi, j, lo, hi);
        if (ok0) st_global_u32(p0 + j * 8, lo);
        if (ok1) st_global_u32(p1 + j * 8, hi);
      }
    }
  }
}

// Registers -> swizzled shared memory (64 x EPI_N chunks, double-buffered per consumer; stmatrix)
// -> TMA store, which clips at the tensor bounds. Called by all 128 threads of one consumer.
// Branch-free (chunks outside C are staged but not stored; thread 0's store is a predicated
// instruction), so it can run while this warpgroup's wgmmas are in flight (EPILOGUE 2).
// UNR: unroll of the column-pair loop (full where src reads register arrays).
template <int BN, int MI, int EPI_N, int UNR, class Src>
__device__ __forceinline__ void epilogue_tma(Src&& src, const void* tmap_c, u32 my_buf,
                                             int& epi_chunk, int M, int N, int tile_row,
                                             int tile_col, int t, int cw) {
  constexpr int EPI_ROW = EPI_N * 2;
  constexpr int EPI_BUF = 64 * EPI_ROW;
  constexpr int CHUNKS = MI * (BN / EPI_N);
  // stmatrix: lane L addresses row (L % 8) + 8 * ((L / 8) % 2) of its warp's 16 rows, in the
  // 16-byte column block 2 * jp + L / 16 of a column pair jp; offsets swizzled as the C map.
  const int lane = t % 32;
  const u32 row = (t / 32) * 16 + (lane % 8) + ((lane / 8) % 2) * 8;
  const u32 row_off = row * EPI_ROW;
  const u32 half = lane / 16;
#pragma unroll
  for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
    for (int nc = 0; nc < BN / EPI_N; ++nc) {
      const int c0 = tile_col + nc * EPI_N;
      const int r0 = tile_row + mi * 64;
      // An even chunk count per tile keeps the buffer parity a compile-time constant.
      const int parity = CHUNKS % 2 == 0 ? (mi * (BN / EPI_N) + nc) & 1 : epi_chunk & 1;
      const u32 buf = my_buf + parity * EPI_BUF;
      // The store that last used this buffer has read it (only thread 0 has bulk groups; for
      // the others this returns at once).
      bulk_wait_group_read<1>();
      named_bar_sync(2 + cw, 128);
#pragma unroll UNR
      for (int jp = 0; jp < EPI_N / 16; ++jp) {
        u32 lo0, hi0, lo1, hi1;
        src(mi, nc * (EPI_N / 8) + 2 * jp, lo0, hi0);
        src(mi, nc * (EPI_N / 8) + 2 * jp + 1, lo1, hi1);
        u32 o = row_off + (2 * jp + half) * 16;
        o ^= ((o >> 7) & (EPI_ROW / 16 - 1)) << 4;  // the TMA swizzle of the C tensor map
        stmatrix_x4(buf + o, lo0, hi0, lo1, hi1);
      }
      fence_proxy_async_smem();
      named_bar_sync(2 + cw, 128);
      // Thread 0 commits a group per chunk, empty where the chunk lies outside C, so that
      // "at most one group still reading" always means the chunk before this one.
      tma_store_2d_if(t == 0 && c0 < N && r0 < M, t == 0, tmap_c, buf, c0, r0);
      if (CHUNKS % 2) ++epi_chunk;
    }
  }
}

}  // namespace wgmma_sm90_detail
}  // namespace tunefw

template <int DTYPE, int BM, int BN, int BK, int STAGES, int SWIZZLE, int CLUSTER_M, int CLUSTER_N,
          int SCHEDULE, int PERSISTENT, int RASTER, int GROUP, int SPLIT_K, int EPILOGUE,
          int SWAP_AB, int GATED = 0>
__global__ void __launch_bounds__(384, 1)
    gemm_wgmma_sm90(const __grid_constant__ CUtensorMap tmap_a,
                    const __grid_constant__ CUtensorMap tmap_b,
                    const __grid_constant__ CUtensorMap tmap_c, unsigned short* C,
                    float* workspace, int M, int N, int K) {
  using namespace tunefw::sm90;
  using namespace tunefw::wgmma_sm90_detail;

  // ---- compile-time shape of the kernel --------------------------------------------------------
  constexpr int SW = SWIZZLE;                   // bytes per swizzled row of a k-chunk
  constexpr int KCH = BK * 2 / SW;              // k-chunks (TMA boxes) per operand per stage
  constexpr int CS = CLUSTER_M * CLUSTER_N;
  constexpr int WG_M = SCHEDULE == 0 ? BM / 2 : BM;  // rows per consumer warpgroup
  constexpr int MI = WG_M / 64;                 // m64 wgmma blocks per consumer
  constexpr int A_BYTES = BM * BK * 2;
  constexpr int B_BYTES = BN * BK * 2;
  constexpr int A_SLICE = BM / CLUSTER_N;       // rows of A this CTA loads (multicast if < BM)
  constexpr int B_SLICE = BN / CLUSTER_M;
  constexpr int OBN = GATED ? BN / 2 : BN;     // columns of C per tile
  constexpr int EPI_N = OBN % 64 == 0 ? 64 : 32;  // columns per TMA-store chunk
  constexpr int EPI_ROW = EPI_N * 2;             // bytes per staged row (= its swizzle width)
  constexpr int EPI_BUF = 64 * EPI_ROW;
  constexpr int C_BYTES = EPILOGUE != 0 ? 4 * EPI_BUF : 0;  // 2 consumers x double buffer
  constexpr int NDEST = CLUSTER_M + CLUSTER_N - 1;  // CTAs that write into this CTA's ring
  constexpr int CONSUMERS_PER_STAGE = SCHEDULE == 0 ? 2 : 1;
  constexpr int PER_CLUSTER = SCHEDULE == 1 ? 2 : 1;  // work items per cluster when !PERSISTENT
  // EPILOGUE 2 (cooperative, no split-K): a tile's output is stored during the next tile's
  // first k-block instead of between the two main loops.
  constexpr bool DEFER = EPILOGUE == 2;
  static_assert(BK % 16 == 0 && KCH >= 1 && KCH * SW == BK * 2, "BK vs swizzle");
  static_assert(WG_M % 64 == 0 && MI >= 1, "rows per consumer must be a multiple of 64");
  static_assert(BM % CLUSTER_N == 0 && A_SLICE % 8 == 0, "A slice");
  static_assert(BN % CLUSTER_M == 0 && B_SLICE % 8 == 0, "B slice");
  static_assert(OBN % 8 == 0 && (EPILOGUE == 0 || OBN % 32 == 0), "BN: EPILOGUE 1/2 store 32-column chunks");
  static_assert(!GATED || (CLUSTER_M == 1 && !SWAP_AB), "GATED: no B multicast, no swap-AB");
  static_assert(!SWAP_AB || EPILOGUE == 0, "swap-AB writes C transposed with direct stores");
  static_assert(SPLIT_K >= 1, "split");
  static_assert(EPILOGUE >= 0 && EPILOGUE <= 2 && (EPILOGUE != 2 || SPLIT_K == 1),
                "EPILOGUE 2 (deferred TMA store) needs SPLIT_K == 1");
  using Work = WorkList<PERSISTENT, PER_CLUSTER, SPLIT_K>;

  extern __shared__ unsigned char smem_raw[];
  const u32 smem_base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const u32 sA = smem_base;
  const u32 sB = sA + STAGES * A_BYTES;
  const u32 sC = sB + STAGES * B_BYTES;
  const u32 bars = sC + C_BYTES;
  const u32 full_bar = bars;                 // STAGES x 8 bytes
  const u32 empty_bar = bars + 8 * STAGES;   // STAGES x 8 bytes
  volatile int* flags =
      reinterpret_cast<volatile int*>(smem_raw + (bars + 16 * STAGES - smem_u32(smem_raw)));

  const int wg = threadIdx.x / 128;
  const int t = threadIdx.x % 128;

#ifdef TUNEFW_TIMELINE
  __shared__ TimelineRecord tl_rec;
  if (threadIdx.x == 0) TL_MARK(0);
#endif
  // ---- barriers ---------------------------------------------------------------------------------
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full_bar + 8 * s, 1);
      mbar_init(empty_bar + 8 * s, CONSUMERS_PER_STAGE * NDEST);
    }
    fence_mbar_init();
    tma_prefetch_desc(&tmap_a);
    tma_prefetch_desc(&tmap_b);
    if (EPILOGUE != 0) tma_prefetch_desc(&tmap_c);
  }
  if (CS > 1) {
    cluster_sync();
  } else {
    __syncthreads();
  }
  if (threadIdx.x == 0) TL_MARK(1);
  pdl_launch_dependents();

  if (wg == 0) {
    // =============================== producer ==================================================
    setmaxnreg_dec<kProducerRegs>();
    // The schedule (identical in every role and every CTA of a cluster). Computed after
    // setmaxnreg in each role so that nothing is live across the register reallocation.
    const int num_m = (M + BM - 1) / BM;
    const int num_n = (N + OBN - 1) / OBN;
    const int cm_tiles = (num_m + CLUSTER_M - 1) / CLUSTER_M;
    const int cn_tiles = (num_n + CLUSTER_N - 1) / CLUSTER_N;
    const int k_iters = (K + BK - 1) / BK;
    const int cid = blockIdx.x / CLUSTER_M;
    const int ncl = gridDim.x / CLUSTER_M;
    const int rx = CLUSTER_M == 1 ? 0 : blockIdx.x % CLUSTER_M;  // == %cluster_ctaid.x
    const int ry = CLUSTER_N == 1 ? 0 : blockIdx.y % CLUSTER_N;  // == %cluster_ctaid.y
    if (t == 0) {
      unsigned short mask_a = 0, mask_b = 0;  // A shared along the cluster's N, B along M
      for (int j = 0; j < CLUSTER_N; ++j) mask_a |= (unsigned short)(1u << (rx + j * CLUSTER_M));
      for (int i = 0; i < CLUSTER_M; ++i) mask_b |= (unsigned short)(1u << (i + ry * CLUSTER_M));
      int it = 0;
      Work work(cid, ncl, cm_tiles * cn_tiles, k_iters);
      Unit u;
      // No L2 prefetch of the first ring before the wait: measured on the mid-M winners
      // (timeline_variants_h200.json), the prefetch's boxes queued ahead of the ring's own loads
      // of the same lines delay the first stage by ~0.8 us in a plain launch and gain nothing
      // in a programmatic one.
      pdl_wait();
      while (work.next(u)) {
        int tm, tn;
        cluster_tile<CLUSTER_M, CLUSTER_N, RASTER, GROUP>(u.t, cm_tiles, cn_tiles, rx, ry, tm, tn);
        const int kb0 = u.kb0, kb1 = u.kb1;
        const int a_row = tm * BM + ry * A_SLICE;
        const int b_row = tn * OBN + rx * B_SLICE;
        for (int kb = kb0; kb < kb1; ++kb, ++it) {
          const int s = it % STAGES;
          const u32 ph = (u32)(it / STAGES) & 1u;
          mbar_wait(empty_bar + 8 * s, ph ^ 1u);  // released by every CTA this one writes into
          const u32 fb = full_bar + 8 * s;
          mbar_arrive_expect_tx(fb, A_BYTES + B_BYTES);
#pragma unroll
          for (int c = 0; c < KCH; ++c) {
            const int kc = kb * BK + c * (SW / 2);
            const u32 da = sA + s * A_BYTES + c * BM * SW + ry * A_SLICE * SW;
            const u32 db = sB + s * B_BYTES + c * BN * SW + rx * B_SLICE * SW;
            if (CLUSTER_N == 1)
              tma_load_2d(da, &tmap_a, kc, a_row, fb);
            else
              tma_load_2d_multicast(da, &tmap_a, kc, a_row, fb, mask_a);
            if (CLUSTER_M == 1) {
              tma_load_2d(db, &tmap_b, kc, b_row, fb);
              if (GATED) tma_load_2d(db + OBN * SW, &tmap_b, kc, N + b_row, fb);  // Bu under Bg
            } else
              tma_load_2d_multicast(db, &tmap_b, kc, b_row, fb, mask_b);
          }
          if (it == 0) TL_MARK(2);
        }
      }
#ifdef TUNEFW_TIMELINE
      TL_MARK(3);
      const unsigned slot = atomicAdd(&tunefw_timeline_next, 1u);
      tl_rec.slot = slot < TUNEFW_TIMELINE_CTAS ? (int)slot : -1;
#endif
    }
#ifdef TUNEFW_TIMELINE
    if (t < 32) {
      __syncwarp();
      named_bar_arrive(kTimelineBar, 64);
    }
#endif
  } else {
    // =============================== consumers =================================================
    setmaxnreg_inc<kConsumerRegs>();
    pdl_wait();  // C and the workspace after the kernel before this one
    // The schedule (identical in every role and every CTA of a cluster). Computed after
    // setmaxnreg in each role so that nothing is live across the register reallocation.
    const int num_m = (M + BM - 1) / BM;
    const int num_n = (N + OBN - 1) / OBN;
    const int cm_tiles = (num_m + CLUSTER_M - 1) / CLUSTER_M;
    const int cn_tiles = (num_n + CLUSTER_N - 1) / CLUSTER_N;
    const int k_iters = (K + BK - 1) / BK;
    const int cid = blockIdx.x / CLUSTER_M;
    const int ncl = gridDim.x / CLUSTER_M;
    const int rx = CLUSTER_M == 1 ? 0 : blockIdx.x % CLUSTER_M;  // == %cluster_ctaid.x
    const int ry = CLUSTER_N == 1 ? 0 : blockIdx.y % CLUSTER_N;  // == %cluster_ctaid.y
    const int cw = wg - 1;                   // consumer index 0 / 1
    const int warp = t / 32;
    const int lane = t % 32;
    const int row0 = SCHEDULE == 0 ? cw * WG_M : 0;  // first tile row of this consumer
    // Where this consumer's stage releases go: lane 0 of warp d signals destination d.
    u32 release_rank = 0;
    bool releaser = false;
    if (lane == 0 && warp < NDEST) {
      releaser = true;
      int dx, dy;
      if (warp < CLUSTER_N) {
        dx = rx;
        dy = warp;
      } else {
        const int i = warp - CLUSTER_N;
        dx = i < rx ? i : i + 1;
        dy = ry;
      }
      release_rank = (u32)(dx + dy * CLUSTER_M);
    }
    const bool release_local = CS == 1 || release_rank == cluster_ctarank();

    const u64 desc_a0 = smem_desc(sA, SW);
    const u64 desc_b0 = smem_desc(sB, SW);
    const u32 my_buf = sC + cw * 2 * EPI_BUF;
    float acc[MI][BN / 2];
    // EPILOGUE 2: the finished tile's output packed to 16 bits, stored to C while the next
    // tile's first wgmma group runs (pend_row < 0: nothing pending).
    u32 pend[DEFER ? MI : 1][DEFER ? OBN / 4 : 1];
    int pend_row = -1, pend_col = 0;
    int it = 0;
    int epi_chunk = 0;
    Work work(cid, ncl, cm_tiles * cn_tiles, k_iters);
    const int n_local = work.count;

    // Release ring slot `stage_it` to the CTA this thread signals (its wgmma reads are done).
    auto release = [&](int stage_it) {
      if (releaser) {
        const u32 eb = empty_bar + 8 * (stage_it % STAGES);
        if (release_local)
          mbar_arrive(eb);
        else
          mbar_arrive_cluster(mapa(eb, release_rank));
      }
    };
    // Wait for ring slot `it` and issue k-block kb's wgmma group on it (kb == 0: D = A*B).
    auto issue = [&](int kb) {
      const int s = it % STAGES;
      mbar_wait(full_bar + 8 * s, (u32)(it / STAGES) & 1u);
      wgmma_fence();
      // Descriptors differ from the ring base's only in the start-address field (addr >> 4),
      // which cannot carry out of its 14 bits: shared memory is below 256 KB.
      const u64 da_st = desc_a0 + (u64)((s * A_BYTES + row0 * SW) >> 4);
      const u64 db_st = desc_b0 + (u64)((s * B_BYTES) >> 4);
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk) {
        constexpr int KB = 32;  // bytes of one k16 slice
        const int chunk = (kk * KB) / SW;
        const int within = (kk * KB) % SW;
        const u64 db = db_st + (u64)((chunk * BN * SW + within) >> 4);
#pragma unroll
        for (int mi = 0; mi < MI; ++mi) {
          const u64 da = da_st + (u64)((chunk * BM * SW + mi * 64 * SW + within) >> 4);
          Wgmma<BN, DTYPE>::mma(acc[mi], da, db, (kb > 0 || kk > 0) ? 1 : 0);
        }
      }
      wgmma_commit();
    };
    auto flush_pending = [&]() {
      if constexpr (DEFER) {
        auto from_pend = [&](int mi, int j, u32& lo, u32& hi) {
          lo = pend[mi][2 * j];
          hi = pend[mi][2 * j + 1];
        };
        epilogue_tma<OBN, MI, EPI_N, EPI_N / 16>(from_pend, &tmap_c, my_buf, epi_chunk, M, N,
                                                pend_row, pend_col, t, cw);
        pend_row = -1;
      }
    };

    Unit u;
    for (int local = 0; work.next(u); ++local) {
      int tm, tn;
      cluster_tile<CLUSTER_M, CLUSTER_N, RASTER, GROUP>(u.t, cm_tiles, cn_tiles, rx, ry, tm, tn);
      const int nk = u.kb1 - u.kb0;
      if (SCHEDULE == 1 && (local & 1) != cw) {  // the other consumer's tile
        it += nk;
        continue;
      }
      // Ping-pong: wait for the turn (the previous tile's consumer has passed all its waits).
      if (SCHEDULE == 1 && local > 0) named_bar_sync(kOrderBar + cw, 256);

      // ---- main loop: one wgmma group in flight; a slot is released once its group is done ----
      if (nk == 0) {
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
#pragma unroll
          for (int i = 0; i < BN / 2; ++i) acc[mi][i] = 0.f;
      }
      for (int kb = 0; kb < nk; ++kb, ++it) {
        issue(kb);
        if (local == 0 && kb == 0 && cw == 0 && t == 0) TL_MARK(4);
        if (DEFER && kb == 0 && pend_row >= 0) flush_pending();  // overlaps the first group
        wgmma_wait<1>();
        if (kb > 0) release(it - 1);
      }
      // Ping-pong: hand the ring to the next tile's consumer (every thread of this one is past
      // its last full-barrier wait) while this one drains its last wgmma group and its epilogue.
      if (SCHEDULE == 1 && local + 1 < n_local) named_bar_arrive(kOrderBar + (cw ^ 1), 256);
      wgmma_wait<0>();
      if (cw == 0 && t == 0) TL_MARK(5);
#pragma unroll
      for (int mi = 0; mi < MI; ++mi) fence_regs(acc[mi]);
      if (nk > 0) release(it - 1);

      if (tm >= num_m || tn >= num_n) continue;  // cluster padding: nothing to write

      const int tile_row = tm * BM + row0;
      const int tile_col = tn * OBN;
      // Output group j (columns j*8.., rows r and r + 8) from the accumulators: packed, or
      // GATED, silu(gate) * up of tile columns j*8.. and OBN + j*8.. (accumulators + OBN/2).
      auto from_acc = [&](int mi, int j, u32& lo, u32& hi) {
        if constexpr (GATED) {
          constexpr int U = OBN / 2;
          const float* a = &acc[mi][4 * j];
          lo = pack2<DTYPE>(tunefw::silu_mul(a[0], a[U]), tunefw::silu_mul(a[1], a[U + 1]));
          hi = pack2<DTYPE>(tunefw::silu_mul(a[2], a[U + 2]), tunefw::silu_mul(a[3], a[U + 3]));
        } else {
          lo = pack2<DTYPE>(acc[mi][4 * j], acc[mi][4 * j + 1]);
          hi = pack2<DTYPE>(acc[mi][4 * j + 2], acc[mi][4 * j + 3]);
        }
      };
      if (SPLIT_K > 1) {
        // ---- split-K: publish the partial; the last split to arrive sums all of them ----
        const int tile_id = tm * num_n + tn;
        int* counters = reinterpret_cast<int*>(workspace);
        const int cnt_region = ((num_m * num_n + 63) / 64) * 64;
        const size_t tile_floats = (size_t)BM * BN;
        const size_t wg_off = SCHEDULE == 0 ? (size_t)cw * WG_M * BN : 0;
        const float* parts =
            workspace + cnt_region + (size_t)tile_id * SPLIT_K * tile_floats + wg_off + t * 4;
        float* mine = const_cast<float*>(parts) + (size_t)u.split * tile_floats;
        // A warp's 16 rows of block mi: partials of rows past M are neither written nor read
        // (at M = 16 that is 3/4 of a 64-row tile's reduction traffic).
        auto rows_live = [&](int mi) { return tile_row + mi * 64 + (t / 32) * 16 < M; };
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
          if (rows_live(mi))
#pragma unroll
            for (int j = 0; j < BN / 8; ++j)
              st_global_f4(mine + (size_t)(mi * (BN / 8) + j) * 512, acc[mi][4 * j],
                           acc[mi][4 * j + 1], acc[mi][4 * j + 2], acc[mi][4 * j + 3]);
        // Published by one acq_rel atomic after the barrier that orders every thread's partial
        // stores before it (the release covers them, as the acquire of the last split covers
        // its threads' loads after the next barrier): no fence in every thread on either side.
        const int bar_id = SCHEDULE == 0 ? 1 : 2 + cw;
        const int bar_n = SCHEDULE == 0 ? 256 : 128;
        const int slot = SCHEDULE == 0 ? 0 : cw;
        named_bar_sync(bar_id, bar_n);
        if (t == 0 && (SCHEDULE == 1 || cw == 0)) {
          const int old = atom_add_acq_rel_gpu(counters + tile_id, 1);
          const int last = old == SPLIT_K - 1;
          if (last) counters[tile_id] = 0;  // ready for the next launch
          flags[slot] = last;
        }
        named_bar_sync(bar_id, bar_n);
        if (!flags[slot]) continue;
        // One L2 round trip per split: its loads are issued together.
        auto add_partial = [&](int sp) {
          const float* src = parts + (size_t)sp * tile_floats;
#pragma unroll
          for (int mi = 0; mi < MI; ++mi)
            if (rows_live(mi))
#pragma unroll
              for (int j = 0; j < BN / 8; ++j) {
                float a0, a1, a2, a3;
                ld_global_cg_f4(src + (size_t)(mi * (BN / 8) + j) * 512, a0, a1, a2, a3);
                acc[mi][4 * j] += a0;
                acc[mi][4 * j + 1] += a1;
                acc[mi][4 * j + 2] += a2;
                acc[mi][4 * j + 3] += a3;
              }
        };
        if (SPLIT_K == 2) {
          // a + b == b + a bit for bit: the other split's partial is added to this one's
          // accumulators (deterministic whichever arrived last; no re-read of its own).
          add_partial(1 - u.split);
        } else {
          // Splits 0..S-1 summed in index order whichever arrived last (deterministic).
#pragma unroll
          for (int mi = 0; mi < MI; ++mi)
#pragma unroll
            for (int i = 0; i < BN / 2; ++i) acc[mi][i] = 0.f;
#pragma unroll 1
          for (int sp = 0; sp < SPLIT_K; ++sp) add_partial(sp);
        }
      } else if (DEFER) {
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
#pragma unroll
          for (int j = 0; j < OBN / 8; ++j) from_acc(mi, j, pend[mi][2 * j], pend[mi][2 * j + 1]);
        pend_row = tile_row;
        pend_col = tile_col;
        continue;
      }
      // ---- epilogue from the accumulators (a whole tile, or the sum of its splits) ----
      if (EPILOGUE == 0)
        epilogue_direct<OBN, MI, OBN / 8, SWAP_AB>(from_acc, C, M, N, tile_row, tile_col, t);
      else
        epilogue_tma<OBN, MI, EPI_N, EPI_N / 16>(from_acc, &tmap_c, my_buf, epi_chunk, M, N,
                                                tile_row, tile_col, t, cw);
    }
    if (DEFER && pend_row >= 0) flush_pending();
    if (EPILOGUE != 0 && t == 0) bulk_wait_group<0>();
#ifdef TUNEFW_TIMELINE
    if (cw == 0 && t == 0) {
      TL_MARK(6);
      unsigned sm;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
      tl_rec.w[16] = ((unsigned long long)sm << 32) | (blockIdx.x + blockIdx.y * gridDim.x);
      tl_rec.w[17] = (unsigned long long)n_local;
    }
#endif
  }

  // A CTA must outlive the remote arrivals and multicast writes of its cluster peers.
  if (CS > 1) {
    __syncwarp();
    cluster_sync();
  }
#ifdef TUNEFW_TIMELINE
  if (threadIdx.x / 32 == 4) {  // consumer 0's first warp takes the record from the producer's
    named_bar_sync(kTimelineBar, 64);
    if (threadIdx.x == 128) {
      TL_MARK(7);
      if (tl_rec.slot >= 0)
        for (int i = 0; i < TUNEFW_TIMELINE_WORDS; ++i)
          tunefw_timeline[(size_t)tl_rec.slot * TUNEFW_TIMELINE_WORDS + i] = tl_rec.w[i];
    }
  }
#endif
}
