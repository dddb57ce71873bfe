// mma_sm80.cuh - Ampere-style tensor-core GEMM: cp.async -> shared (multi-stage ring, XOR
// swizzle) -> ldmatrix.x4 -> mma.sync.m16n8k16 (f32 accumulate) -> bf16/fp16 output.
//
// C[M,N] = A[M,K] @ B[N,K]^T, all row-major (TN). Any M >= 1; N, K multiples of 8. Edge tiles
// are zero-filled on load (cp.async src-size 0) and guarded on store.
//
// Template parameters (the Python side, tunefw/templates/mma_sm80.py, declares their values):
//   DTYPE    0 bf16, 1 fp16
//   BM,BN,BK block tile; WM,WN warp tile (warps = BM/WM * BN/WN)
//   STAGES   shared-memory pipeline depth (dynamic shared memory)
//   SWIZZLE  0 plain rows, 1 XOR of the 16-byte chunk index (sized to the row width)
//   DBUF     1: double-buffer the ldmatrix fragments (load k-step s+1 while multiplying s)
//   RASTER   0: tile groups of GROUP block-rows, 1: groups of GROUP block-columns
//   SPLIT_K  number of K slices (blockIdx.z); the last CTA of a tile to finish reduces the
//            fp32 partials in fixed split order (deterministic) and resets the tile counter
//   EPILOGUE 0: direct 4-byte stores from fragments, 1: staged through shared memory, 16-byte
//            stores
//
// Workspace (SPLIT_K > 1): [counters: tiles ints, padded to 256 bytes][partials: tiles x
// SPLIT_K x BM*BN fp32]. Zero-filled once when allocated; the kernel leaves counters at 0.
#pragma once
#include "tunefw/sm80.cuh"

namespace tunefw {

// Dynamic shared memory of one block (bytes); the Python estimate must equal this.
template <int BM, int BN, int BK, int STAGES, int EPILOGUE>
struct MmaSm80Smem {
  static constexpr int pipeline = STAGES * (BM + BN) * BK * 2;
  static constexpr int staging = EPILOGUE ? BM * (BN * 2 + 16) : 0;
  static constexpr int bytes = pipeline > staging ? pipeline : staging;
};

// Bytes of the counter area at the start of the split-K workspace.
__host__ __device__ constexpr long long mma_sm80_counter_bytes(long long tiles) {
  return (tiles * 4 + 255) / 256 * 256;
}

}  // namespace tunefw

template <int DTYPE, int BM, int BN, int BK, int WM, int WN, int STAGES, int SWIZZLE, int DBUF,
          int RASTER, int GROUP, int SPLIT_K, int EPILOGUE>
__global__ void __launch_bounds__((BM / WM) * (BN / WN) * 32, 1)
    gemm_mma_sm80(const unsigned short* A, const unsigned short* B, unsigned short* C,
                  float* workspace, int M, int N, int K) {
  using namespace tunefw;

  // ---- compile-time shape ---------------------------------------------------------------------
  constexpr int WARPS_M = BM / WM;
  constexpr int WARPS_N = BN / WN;
  constexpr int WARPS = WARPS_M * WARPS_N;
  constexpr int THREADS = WARPS * 32;
  constexpr int MI = WM / 16;  // m16 fragments per warp
  constexpr int NI = WN / 8;   // n8 fragments per warp
  constexpr int NJ = WN / 16;  // ldmatrix.x4 loads of B per k-step (two n8 fragments each)
  constexpr int KS = BK / 16;  // k16 steps per block tile
  constexpr int CPR = BK / 8;  // 16-byte chunks per shared-memory row
  constexpr int RPL = 8 / CPR; // rows per 128-byte line
  constexpr int ROW_BYTES = BK * 2;
  constexpr int A_STAGE = BM * ROW_BYTES;
  constexpr int STAGE_BYTES = (BM + BN) * ROW_BYTES;
  constexpr int A_CHUNKS = BM * CPR;
  constexpr int B_CHUNKS = BN * CPR;
  constexpr int A_ITERS = (A_CHUNKS + THREADS - 1) / THREADS;
  constexpr int B_ITERS = (B_CHUNKS + THREADS - 1) / THREADS;
  constexpr int ROW_STEP = THREADS / CPR;  // rows between a thread's successive chunks
  constexpr int NBUF = DBUF ? 2 : 1;

  static_assert(DTYPE == 0 || DTYPE == 1, "DTYPE: 0 bf16, 1 fp16");
  static_assert(BM % WM == 0 && BN % WN == 0, "warp tile must divide the block tile");
  static_assert(WM % 16 == 0 && WN % 16 == 0, "warp tile must be a multiple of 16x16");
  static_assert(BK % 16 == 0 && BK <= 64, "BK in {16, 32, 64}");
  static_assert(THREADS % CPR == 0, "threads must cover whole rows of chunks");
  static_assert(STAGES >= 2, "at least two pipeline stages");
  static_assert(SPLIT_K >= 1 && GROUP >= 1, "SPLIT_K, GROUP >= 1");
  static_assert(A_ITERS <= 32 && B_ITERS <= 32, "row predicates are kept in a 32-bit mask");

  extern __shared__ __align__(128) unsigned char smem[];
  const u32 smem_base = smem_u32(smem);

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int warp_m = warp / WARPS_N;
  const int warp_n = warp % WARPS_N;

  // ---- which output tile (grouped rasterization for L2 reuse) ---------------------------------
  const int tiles_m = (M + BM - 1) / BM;
  const int tiles_n = (N + BN - 1) / BN;
  const int pid = blockIdx.x;
  int tm, tn;
  if (RASTER == 0) {
    const int per_group = GROUP * tiles_n;
    const int group = pid / per_group;
    const int first = group * GROUP;
    const int rows = imin(tiles_m - first, GROUP);
    const int r = pid - group * per_group;
    tm = first + r % rows;
    tn = r / rows;
  } else {
    const int per_group = GROUP * tiles_m;
    const int group = pid / per_group;
    const int first = group * GROUP;
    const int cols = imin(tiles_n - first, GROUP);
    const int r = pid - group * per_group;
    tn = first + r % cols;
    tm = r / cols;
  }
  const int m0 = tm * BM;
  const int n0 = tn * BN;

  // ---- this CTA's slice of K -----------------------------------------------------------------
  const int ktiles = (K + BK - 1) / BK;
  const int split = SPLIT_K > 1 ? (int)blockIdx.z : 0;
  const int per_split = (ktiles + SPLIT_K - 1) / SPLIT_K;
  const int kt_begin = split * per_split;
  const int nkt = imax(imin(ktiles - kt_begin, per_split), 0);

  // ---- global -> shared (cp.async) addressing, hoisted --------------------------------------
  // Thread t copies chunk c = t % CPR of rows t / CPR + i * ROW_STEP. The chunk's physical slot
  // in the row is c ^ swz(row) (swz sized to the row width so that 8 consecutive rows at the
  // same logical chunk hit 8 different 16-byte bank groups).
  const int ld_c = tid % CPR;
  const int ld_r = tid / CPR;
  auto swz = [](int row) -> int { return SWIZZLE ? (row / RPL) % CPR : 0; };

  const unsigned short* a_src = A + (i64)imin(m0 + ld_r, M - 1) * K + ld_c * 8 + (i64)kt_begin * BK;
  const unsigned short* b_src = B + (i64)imin(n0 + ld_r, N - 1) * K + ld_c * 8 + (i64)kt_begin * BK;
  const i64 src_step = (i64)ROW_STEP * K;  // elements between a thread's successive rows
  u32 a_ok = 0, b_ok = 0;                   // per-iteration row predicates (bit i)
#pragma unroll
  for (int i = 0; i < A_ITERS; ++i) {
    const int r = ld_r + i * ROW_STEP;
    if (r < BM && m0 + r < M) a_ok |= 1u << i;
  }
#pragma unroll
  for (int i = 0; i < B_ITERS; ++i) {
    const int r = ld_r + i * ROW_STEP;
    if (r < BN && n0 + r < N) b_ok |= 1u << i;
  }

  // Row ld_r + i*ROW_STEP has swizzle (swz(ld_r) + i*THREADS/8) % CPR (ROW_STEP/RPL = THREADS/8),
  // so the shared offset of copy i is a constant plus the swizzled chunk of copy 0's row.
  const int swz0 = swz(ld_r);
  const u32 st_base = ld_r * ROW_BYTES;
  auto st_off = [&](int i) -> u32 {
    const int sw = SWIZZLE ? ((swz0 + i * (THREADS / 8)) & (CPR - 1)) : 0;
    return st_base + (u32)((ld_c ^ sw) << 4);
  };

  auto load_tile = [&](int j, int stage) {
    const int kofs = j * BK;  // relative to this split's first k tile
    const bool k_ok = (kt_begin + j) * BK + ld_c * 8 < K;
    const u32 sa = smem_base + stage * STAGE_BYTES;
    const u32 sb = sa + A_STAGE;
#pragma unroll
    for (int i = 0; i < A_ITERS; ++i) {
      const int r = ld_r + i * ROW_STEP;
      if (A_CHUNKS % THREADS == 0 || r < BM) {
        const bool p = k_ok && ((a_ok >> i) & 1u);
        const unsigned short* src = p ? a_src + i * src_step + kofs : A;
        cp_async_16(sa + i * ROW_STEP * ROW_BYTES + st_off(i), src, p);
      }
    }
#pragma unroll
    for (int i = 0; i < B_ITERS; ++i) {
      const int r = ld_r + i * ROW_STEP;
      if (B_CHUNKS % THREADS == 0 || r < BN) {
        const bool p = k_ok && ((b_ok >> i) & 1u);
        const unsigned short* src = p ? b_src + i * src_step + kofs : B;
        cp_async_16(sb + i * ROW_STEP * ROW_BYTES + st_off(i), src, p);
      }
    }
  };

  // ---- shared -> registers (ldmatrix) addressing, hoisted -----------------------------------
  // A (m16 x k16 per x4): lane l points at row l & 15, logical chunk 2*ks + (l >> 4).
  // B (two n8 x k16 per x4): lane l points at row (l & 7) + ((l >> 4) << 3), chunk 2*ks +
  // ((l >> 3) & 1). The swizzle of rows r and r + 16*i agree, so one XOR term per lane serves
  // all fragments; the k-step enters as "^ (ks * 32)" on the byte offset of the chunk.
  const int a_row = warp_m * WM + (lane & 15);
  const int b_row = warp_n * WN + (lane & 7) + ((lane >> 4) << 3);
  const u32 a_frag = a_row * ROW_BYTES;
  const u32 a_chunk = (u32)(((lane >> 4) ^ swz(a_row)) << 4);
  const u32 b_frag = A_STAGE + b_row * ROW_BYTES;
  const u32 b_chunk = (u32)((((lane >> 3) & 1) ^ swz(b_row)) << 4);

  u32 af[NBUF][MI][4];
  u32 bfr[NBUF][NJ][4];
  float acc[MI][NI][4];
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int ni = 0; ni < NI; ++ni)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[mi][ni][q] = 0.0f;

  auto load_frags = [&](u32 (&fa)[MI][4], u32 (&fb)[NJ][4], u32 stage_addr, int ks) {
    const u32 ao = stage_addr + a_frag + (a_chunk ^ (u32)(ks * 32));
    const u32 bo = stage_addr + b_frag + (b_chunk ^ (u32)(ks * 32));
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) ldmatrix_x4(fa[mi], ao + mi * 16 * ROW_BYTES);
#pragma unroll
    for (int nj = 0; nj < NJ; ++nj) ldmatrix_x4(fb[nj], bo + nj * 16 * ROW_BYTES);
  };

  auto mma_all = [&](const u32 (&fa)[MI][4], const u32 (&fb)[NJ][4]) {
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
      for (int n = 0; n < NI; ++n) {
        const int ni = (mi & 1) ? NI - 1 - n : n;  // serpentine: reuse B registers across rows
        mma_16816<DTYPE>(acc[mi][ni], fa[mi], fb[ni >> 1][(ni & 1) * 2], fb[ni >> 1][(ni & 1) * 2 + 1]);
      }
    }
  };

  // ---- prologue: fill STAGES-1 stages --------------------------------------------------------
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < nkt) load_tile(s, s);
    cp_async_commit();
  }
  cp_async_wait<STAGES - 2>();
  block_sync();

  int read_stage = 0;
  int write_stage = STAGES - 1;
  u32 read_addr = smem_base;

  if (DBUF && nkt > 0) load_frags(af[0], bfr[0], read_addr, 0);

  // One block tile of the main loop; P is the fragment-buffer parity of its first k-step (the
  // buffers alternate over the global k-step count, so with an odd KS the loop body is
  // inlined twice and alternates). P is a literal at both call sites, so after inlining every
  // fragment index is a constant (a generic lambda would say so in the type, but NVRTC 13.0
  // refuses generic lambdas in JIT mode).
  auto tile_body = [&](int j, const int P) {
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      if (ks == 0) {
        // Refill the stage that was read in tile j-1 (every warp passed the barrier after it).
        const int jn = j + STAGES - 1;
        if (jn < nkt) load_tile(jn, write_stage);
        cp_async_commit();
        write_stage = (write_stage + 1 == STAGES) ? 0 : write_stage + 1;
      }
      if constexpr (DBUF != 0) {
        const int b_now = (ks + P) & 1;
        const int b_next = (ks + 1 + P) & 1;
        if (ks == KS - 1) {
          // Tile j+1 must be resident before its first fragments are read.
          cp_async_wait<STAGES - 2>();
          block_sync();
          read_stage = (read_stage + 1 == STAGES) ? 0 : read_stage + 1;
          read_addr = smem_base + read_stage * STAGE_BYTES;
          if (j + 1 < nkt) load_frags(af[b_next & (NBUF - 1)], bfr[b_next & (NBUF - 1)], read_addr, 0);
        } else {
          load_frags(af[b_next & (NBUF - 1)], bfr[b_next & (NBUF - 1)], read_addr, ks + 1);
        }
        mma_all(af[b_now & (NBUF - 1)], bfr[b_now & (NBUF - 1)]);
      } else {
        load_frags(af[0], bfr[0], read_addr, ks);
        mma_all(af[0], bfr[0]);
        if (ks == KS - 1) {
          cp_async_wait<STAGES - 2>();
          block_sync();
          read_stage = (read_stage + 1 == STAGES) ? 0 : read_stage + 1;
          read_addr = smem_base + read_stage * STAGE_BYTES;
        }
      }
    }
  };

  if constexpr (DBUF != 0 && (KS & 1) != 0) {
    for (int j = 0; j < nkt; j += 2) {
      tile_body(j, 0);
      if (j + 1 < nkt) tile_body(j + 1, 1);
    }
  } else {
    for (int j = 0; j < nkt; ++j) tile_body(j, 0);
  }

  // ---- split-K: publish partial, last CTA of the tile reduces in split order ---------------
  if (SPLIT_K > 1) {
    const int tile = tm * tiles_n + tn;
    const long long tiles = (long long)tiles_m * tiles_n;
    int* counters = reinterpret_cast<int*>(workspace);
    float* parts = workspace + mma_sm80_counter_bytes(tiles) / 4;
    float* mine = parts + ((i64)tile * SPLIT_K + split) * (BM * BN);
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
      for (int ni = 0; ni < NI; ++ni)
        st_global_cg_v4_f32(mine + ((mi * NI + ni) * THREADS + tid) * 4, acc[mi][ni][0],
                            acc[mi][ni][1], acc[mi][ni][2], acc[mi][ni][3]);
    fence_gpu();
    cp_async_wait<0>();
    block_sync();  // every warp is done with shared memory and has published its partial
    if (tid == 0) {
      const int prev = atomic_add_gpu(counters + tile, 1);
      st_shared_s32(smem_base, prev == SPLIT_K - 1 ? 1 : 0);
    }
    block_sync();
    const int last = ld_shared_s32(smem_base);
    if (!last) return;  // uniform across the block
    fence_gpu();
    const float* tile_parts = parts + (i64)tile * SPLIT_K * (BM * BN);
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
      for (int ni = 0; ni < NI; ++ni)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[mi][ni][q] = 0.0f;
    // Row of fragments by row of fragments (bounded loads in flight: NI float4 at a time), each
    // summed over the splits in index order.
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) {
#pragma unroll 1
      for (int s = 0; s < SPLIT_K; ++s) {
        const float* p = tile_parts + (i64)s * (BM * BN) + (mi * NI * THREADS + tid) * 4;
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) {
          float x, y, z, w;
          ld_global_cg_v4_f32(p + ni * THREADS * 4, x, y, z, w);
          acc[mi][ni][0] += x;
          acc[mi][ni][1] += y;
          acc[mi][ni][2] += z;
          acc[mi][ni][3] += w;
        }
      }
    }
    if (tid == 0) st_global_s32_relaxed(counters + tile, 0);  // ready for the next launch
  }

  // ---- epilogue ----------------------------------------------------------------------------
  const int g = lane >> 2;       // fragment row within 8
  const int t2 = (lane & 3) * 2;  // fragment column pair
  if (EPILOGUE == 0) {
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) {
      const int r0 = m0 + warp_m * WM + mi * 16 + g;
#pragma unroll
      for (int ni = 0; ni < NI; ++ni) {
        const int c = n0 + warp_n * WN + ni * 8 + t2;
        if (c < N) {
          if (r0 < M)
            st_global_u32(C + (i64)r0 * N + c, pack_x2<DTYPE>(acc[mi][ni][0], acc[mi][ni][1]));
          if (r0 + 8 < M)
            st_global_u32(C + (i64)(r0 + 8) * N + c,
                          pack_x2<DTYPE>(acc[mi][ni][2], acc[mi][ni][3]));
        }
      }
    }
  } else {
    // Stage the tile in shared memory (rows padded by 16 bytes: the fragment writes of one
    // warp then hit 32 distinct banks), then write 16-byte chunks of whole rows.
    constexpr int CROW = BN * 2 + 16;
    constexpr int CCHUNKS = BM * BN / 8;
    constexpr int CPR_OUT = BN / 8;
    constexpr int C_ITERS = (CCHUNKS + THREADS - 1) / THREADS;
    cp_async_wait<0>();
    block_sync();  // the pipeline buffers are free
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) {
      const int r = warp_m * WM + mi * 16 + g;
#pragma unroll
      for (int ni = 0; ni < NI; ++ni) {
        const int c = warp_n * WN + ni * 8 + t2;
        const u32 addr = smem_base + r * CROW + c * 2;
        st_shared_u32(addr, pack_x2<DTYPE>(acc[mi][ni][0], acc[mi][ni][1]));
        st_shared_u32(addr + 8 * CROW, pack_x2<DTYPE>(acc[mi][ni][2], acc[mi][ni][3]));
      }
    }
    block_sync();
#pragma unroll
    for (int i = 0; i < C_ITERS; ++i) {
      const int id = i * THREADS + tid;
      if (CCHUNKS % THREADS == 0 || id < CCHUNKS) {
        const int r = id / CPR_OUT;
        const int c = (id % CPR_OUT) * 8;
        if (m0 + r < M && n0 + c < N) {
          u32 x, y, z, w;
          ld_shared_v4_u32(smem_base + r * CROW + c * 2, x, y, z, w);
          st_global_v4_u32(C + (i64)(m0 + r) * N + n0 + c, x, y, z, w);
        }
      }
    }
  }
}
