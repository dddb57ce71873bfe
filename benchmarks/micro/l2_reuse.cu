// L2-reuse microbenchmark (H200, sm_90a): what does a decode GEMM CTA's second operand cost
// while it streams its share of the weight once?
//
// The committed wgmma probes (membound*_probe_h200.json) leave two readings of why M = 64..128
// decode shapes stop at 2.5-3.5 TB/s: the L2 -> SM traffic of the activation tiles that every
// CTA re-reads (5.4-7.6 TB/s together in the winners), or something per launch. This isolates
// the first: CTA b owns R weight rows (split SPLIT ways along K) and per stage loads, beside its
// R x BK weight box, RA x BK rows of one small activation tensor that every CTA reads (L2-hot
// after the first): RA = 0 is the pure stream, RA = 64..256 the activation tiles of BM = 64..256
// (non-swapped) or of BN under swap-AB. If the time per launch grows with RA at equal weight
// bytes, L2 -> SM bandwidth binds there and the decode path must cut it (wider weight tiles,
// multicast); if it does not, the losses are elsewhere (split-K reduction, ramp, scheduling).
// MC = 2 runs clusters of two CTAs (adjacent weight rows) that multicast the activation box
// (each CTA issues half of it to both), as wgmma_sm90's CLUSTER_M does for its shared operand.
// The weight's stage: KB adjacent 64-column boxes a row (wgmma_sm90's BK = 64 * KB), or with
// PACK = 1 one 1D bulk copy of the same bytes from a weight pre-packed stage by stage (each
// CTA's share contiguous, as a layout that stores every 64-column chunk of R rows already
// swizzled would be: what wgmma reads from shared memory is the same).
// OCC = 2 runs two CTAs per SM (each with at most 96 KB in flight, K split twice as many ways so
// the grid fills them): wgmma_sm90 is one CTA an SM (__launch_bounds__(384, 1)), and the
// streaming micro's 1D copies ran 8% faster at two CTAs an SM than at one (stream_micro_h200.json).
// A second argument `occ` runs only the OCC = 2 variants and their pure-stream baselines.
// Output: one JSON object per line (parameters, microseconds per launch, weight TB/s, L2 -> SM
// TB/s of weight plus activation bytes).
//
// Build (repo root): nvcc -O3 -std=c++17 -arch=sm_90a -Ikernel_templates -Ikernel_templates/include \
//     benchmarks/micro/l2_reuse.cu -o benchmarks/micro/build/l2_reuse
#include <array>
#include <string>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "micro_host.cuh"

#include "rows_sm90.cuh"  // the mbarrier, TMA and bulk-copy helpers of the kernel templates

using tunefw::sm90::u32;
using tunefw::sm90::u64;
using namespace tunefw::sm90;
using tunefw::rows::bulk_load;

constexpr int BOX = 64;  // the columns of one 128-byte swizzled box, as the GEMMs load a stage

// One producer thread (warp 1, lane 0), one consumer warp (warp 0) that touches and frees each
// stage. Stage s: weight box R x BK at ring + s * stage, activation box RA x BK after it.
__global__ void __launch_bounds__(64) reuse_stream(const __grid_constant__ CUtensorMap wmap,
                                                   const __grid_constant__ CUtensorMap amap,
                                                   const unsigned char* packed, int R, int RA,
                                                   int KB, int STAGES, int K, int SPLIT, int MC,
                                                   u32* out) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  const u32 ring = smem_u32(smem);
  const int BK = BOX * KB;
  const int wbytes = R * BK * 2, abytes = RA * BK * 2, stage = wbytes + abytes;
  const u32 full = ring + STAGES * stage, empty = full + STAGES * 8;
  const int row0 = (blockIdx.x / SPLIT) * R, part = blockIdx.x % SPLIT;
  const int chunks = K / BK / SPLIT, c0 = part * chunks;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const u32 rank = MC > 1 ? cluster_ctarank() : 0;
  if (threadIdx.x == 0) init_ring_barriers(full, empty, STAGES, MC);
  __syncthreads();
  if (MC > 1) cluster_sync();  // the peer's barriers exist before its first multicast lands
  if (warp == 0) {
    u32 acc = 0;
    for (int j = 0; j < chunks; ++j) {
      const int s = j % STAGES;
      mbar_wait(full + s * 8, (j / STAGES) & 1);
      const u32* st = reinterpret_cast<const u32*>(smem + s * stage);
      for (int i = lane; i < stage / 4; i += 32 * 64) acc += st[i];
      __syncwarp();
      if (lane == 0) {  // free the slot in every CTA that writes into it (multicast: both)
        for (u32 r = 0; r < (u32)MC; ++r)
          MC > 1 ? mbar_arrive_cluster(mapa(empty + s * 8, r)) : mbar_arrive(empty + s * 8);
      }
    }
    if (acc == 0x9e3779b9u) out[blockIdx.x] = acc;
  } else if (lane == 0) {
    const int half = RA / MC;
    for (int j = 0; j < chunks; ++j) {
      const int s = j % STAGES;
      if (j >= STAGES) mbar_wait(empty + s * 8, ((j / STAGES) + 1) & 1);
      const u32 st = ring + s * stage;
      mbar_arrive_expect_tx(full + s * 8, stage);
      for (int b = 0; b < KB; ++b) {
        const int k = (c0 + j) * BK + b * BOX;
        const u32 box = b * R * BOX * 2, abox = b * RA * BOX * 2;
        if (!packed) tma_load_2d(st + box, &wmap, k, row0, full + s * 8);
        if (RA && MC == 1) tma_load_2d(st + wbytes + abox, &amap, k, 0, full + s * 8);
        if (RA && MC > 1)
          tma_load_2d_multicast(st + wbytes + abox + rank * half * BOX * 2, &amap, k, rank * half,
                                full + s * 8, (unsigned short)((1u << MC) - 1));
      }
      if (packed)  // this CTA's share of the packed weight: its stages back to back
        bulk_load(st, packed + ((u64)row0 * K + (u64)(c0 + j) * R * BK) * 2, wbytes, full + s * 8);
    }
  }
  if (MC > 1) cluster_sync();  // no CTA leaves while its peer may still multicast into it
}

static EncodeTiled encode = nullptr;  // tensor_map_encoder(), once in main

static CUtensorMap make_map(void* base, int rows, int K, int box_rows) {
  CUtensorMap m;
  cuuint64_t dims[2] = {(cuuint64_t)K, (cuuint64_t)rows};
  cuuint64_t strides[1] = {(cuuint64_t)K * 2};
  cuuint32_t box[2] = {(cuuint32_t)BOX, (cuuint32_t)box_rows};
  cuuint32_t es[2] = {1, 1};
  CUresult r = encode(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, base, dims, strides, box, es,
                      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    fprintf(stderr, "encode failed %d (rows=%d box=%d)\n", (int)r, rows, box_rows);
    exit(1);
  }
  return m;
}

int main(int argc, char** argv) {
  const int reps = argc > 1 ? atoi(argv[1]) : 30;
  const bool occ_only = argc > 2 && std::string(argv[2]) == "occ";
  CK(cudaFree(0));
  cudaDeviceProp p;
  CK(cudaGetDeviceProperties(&p, 0));
  encode = tensor_map_encoder();
  CK(cudaFuncSetAttribute(reuse_stream, cudaFuncAttributeMaxDynamicSharedMemorySize, 232448));
  u32* out;
  CK(cudaMalloc(&out, 1 << 20));
  unsigned char* act;  // the activations every CTA reads: 256 rows x K, L2-hot after one launch
  const int shapes[][2] = {{4096, 4096}, {6144, 4096}, {4096, 14336}};
  CK(cudaMalloc(&act, (size_t)256 * 14336 * 2));
  CK(cudaMemset(act, 1, (size_t)256 * 14336 * 2));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (auto& s : shapes) {
    const int N = s[0], K = s[1];
    const u64 wbytes = (u64)N * K * 2;
    const int copies = (int)((3 * (u64)p.l2CacheSize + wbytes - 1) / wbytes) + 1;
    std::vector<unsigned char*> weights(copies < 2 ? 2 : copies);
    for (size_t c = 0; c < weights.size(); ++c) {
      CK(cudaMalloc(&weights[c], wbytes));
      CK(cudaMemset(weights[c], (int)c + 1, wbytes));
    }
    for (int R : {64, 128}) {
      // (KB, PACK, RA, MC, OCC): the 64-deep stages with every activation load, then deeper
      // stages and the packed weight with none or 64 activation rows, no cluster, at one CTA an
      // SM and at two
      std::vector<std::array<int, 5>> variants;
      for (int RA : {0, 64, 128, 256})
        for (int MC : {1, 2})
          if (!occ_only || (RA == 0 && MC == 1)) variants.push_back({1, 0, RA, MC, 1});
      for (int OCC : {1, 2})
        for (int KB : {1, 2, 4})
          for (int PACK : {0, 1})
            for (int RA : {0, 64})
              if ((KB > 1 || PACK || OCC > 1) && (!occ_only || OCC > 1))
                variants.push_back({KB, PACK, RA, 1, OCC});
      for (const auto& v : variants) {
        const int KB = v[0], PACK = v[1], RA = v[2], MC = v[3], OCC = v[4], BK = BOX * KB;
        // 96-128 CTAs as the winners, twice as many at two an SM
        const int split = (N / R <= 32 ? 4 : N / R <= 64 ? 2 : 1) * OCC;
        if ((MC > 1 && RA == 0) || (N / R * split) % MC || (K / BK) % split) continue;
        const int stage = (R + RA) * BK * 2, inflight = OCC > 1 ? 98304 : 196608;
        const int stages = 8 < inflight / stage ? 8 : inflight / stage;
        if (stages < 2) continue;
        const int smem = stages * stage + stages * 16 + 1024;
        std::vector<CUtensorMap> wm;
        for (auto* w : weights) wm.push_back(make_map(w, N, K, R));
        const CUtensorMap am = make_map(act, 256, K, RA ? RA / MC : 64);
        const int grid = N / R * split;
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute attr[1];
        cfg.gridDim = dim3(grid);
        cfg.blockDim = dim3(64);
        cfg.dynamicSmemBytes = smem;
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = MC;
        attr[0].val.clusterDim.y = 1;
        attr[0].val.clusterDim.z = 1;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
        auto launch = [&](int i) {
          const unsigned char* packed = PACK ? weights[i % weights.size()] : nullptr;
          CK(cudaLaunchKernelEx(&cfg, reuse_stream, wm[i % wm.size()], am, packed, R, RA, KB,
                                stages, K, split, MC, out));
        };
        for (size_t i = 0; i < wm.size(); ++i) launch((int)i);  // warm, activations into L2
        CK(cudaDeviceSynchronize());
        CK(cudaEventRecord(e0));
        for (int i = 0; i < reps; ++i) launch(i);
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        CK(cudaGetLastError());
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        const double us = ms * 1000.0 / reps;
        const double l2_bytes = (double)wbytes + (double)grid * RA * (K / split) * 2 / MC;
        printf("{\"N\":%d,\"K\":%d,\"R\":%d,\"RA\":%d,\"MC\":%d,\"KB\":%d,\"PACK\":%d,"
               "\"OCC\":%d,\"split\":%d,\"stages\":%d,\"grid\":%d,\"us\":%.3f,"
               "\"weight_tbs\":%.4f,\"l2_to_sm_tbs\":%.4f}\n",
               N, K, R, RA, MC, KB, PACK, OCC, split, stages, grid, us,
               wbytes / (us * 1e-6) / 1e12, l2_bytes / (us * 1e-6) / 1e12);
        fflush(stdout);
      }
    }
    for (auto* w : weights) CK(cudaFree(w));
  }
  return 0;
}
