// Streaming-read microbenchmark for the decode kernels' design (H200, sm_90a): what limits the
// bytes per second one SM pulls from HBM when a weight is streamed once?
//
// Three ways of reading a bf16 [N, K] row-major weight, each consuming every byte cheaply:
//   tma   : CTA b owns R rows x K (split SPLIT ways along K), a producer thread keeps STAGES
//           chunks of BK k in flight as 2D TMA boxes of E k x R rows (E = 64 with 128-byte
//           swizzle, as stream_sm90 does, or E = 256 unswizzled: 512-byte row runs), one
//           consumer warp touches each box and frees the stage.
//   bulk  : G CTAs each stream a contiguous range of whole CHUNK-byte 1D bulk copies (C/G of the C,
//           every byte once), STAGES in flight (the upper bound of a persistent equal-bytes split).
//   ldg   : every thread keeps U 16-byte no-allocate loads in flight (the plain-load baseline).
// The weight is replicated past 3x L2 and the copies rotate, so every launch reads HBM.
// Output: one JSON object per line (variant, parameters, microseconds per launch and TB/s, back to
// back on a stream: us, tbs; and replayed as one CUDA graph: graph_us, graph_tbs).
//
// Build (repo root): nvcc -O3 -std=c++17 -arch=sm_90a -Ikernel_templates -Ikernel_templates/include \
//     benchmarks/micro/stream_bw.cu -o benchmarks/micro/build/stream_bw
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "micro_host.cuh"

#include "rows_sm90.cuh"  // kernel_templates/: the mbarrier, TMA and bulk-copy helpers

using tunefw::sm90::u32;
using tunefw::sm90::u64;
using namespace tunefw::sm90;
using tunefw::rows::bulk_load;


// STAGES full/empty barrier pairs after the ring, one arrival each (thread 0, then a block sync).
__device__ __forceinline__ void init_ring(u32 full, u32 empty, int STAGES) {
  if (threadIdx.x == 0) init_ring_barriers(full, empty, STAGES, 1);
  __syncthreads();
}

// The consumer warp: wait for each of `chunks` stages, touch a few words of it, free it.
__device__ __forceinline__ void consume_ring(const unsigned char* ring, u32 full, u32 empty,
                                             int chunks, int STAGES, int stage_bytes, u32* out) {
  const int lane = threadIdx.x & 31;
  u32 acc = 0;
  for (int j = 0; j < chunks; ++j) {
    const int s = j % STAGES;
    mbar_wait(full + s * 8, (j / STAGES) & 1);
    const u32* st = reinterpret_cast<const u32*>(ring + s * stage_bytes);
    for (int i = lane; i < stage_bytes / 4; i += 32 * 64) acc += st[i];
    __syncwarp();
    if (lane == 0) mbar_arrive(empty + s * 8);
  }
  if (acc == 0x9e3779b9u) out[blockIdx.x] = acc;
}

// One producer thread (warp 1, lane 0) and one consumer warp (warp 0).
__global__ void __launch_bounds__(64) tma_stream(const __grid_constant__ CUtensorMap map, int R,
                                                 int BK, int E, int STAGES, int K, int SPLIT,
                                                 u32* out) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  const u32 ring = smem_u32(smem);
  const int stage_bytes = R * BK * 2, boxes = BK / E, box_bytes = R * E * 2;
  const u32 full = ring + STAGES * stage_bytes, empty = full + STAGES * 8;
  const int row0 = (blockIdx.x / SPLIT) * R, part = blockIdx.x % SPLIT;
  const int chunks = K / BK / SPLIT, c0 = part * chunks;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  init_ring(full, empty, STAGES);
  if (warp == 0) return consume_ring(smem, full, empty, chunks, STAGES, stage_bytes, out);
  if (lane != 0) return;
  for (int j = 0; j < chunks; ++j) {
    const int s = j % STAGES;
    if (j >= STAGES) mbar_wait(empty + s * 8, ((j / STAGES) + 1) & 1);
    const u32 st = ring + s * stage_bytes;
    mbar_arrive_expect_tx(full + s * 8, stage_bytes);
    for (int x = 0; x < boxes; ++x)
      tma_load_2d(st + x * box_bytes, &map, (c0 + j) * BK + x * E, row0, full + s * 8);
  }
}

__global__ void __launch_bounds__(64) bulk_stream(const unsigned char* src, u64 total, int CHUNK,
                                                  int STAGES, u32* out) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const u32 ring = smem_u32(smem_raw);
  const u32 full = ring + STAGES * CHUNK, empty = full + STAGES * 8;
  // Every chunk once: CTA b streams chunks [b*C/G, (b+1)*C/G) of the C = total/CHUNK (the host
  // only asks for sizes that are whole chunks)
  const u64 all = total / CHUNK, c0 = all * blockIdx.x / gridDim.x;
  const u64 begin = c0 * CHUNK;
  const int chunks = (int)(all * (blockIdx.x + 1) / gridDim.x - c0);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  init_ring(full, empty, STAGES);
  if (warp == 0) return consume_ring(smem_raw, full, empty, chunks, STAGES, CHUNK, out);
  if (lane != 0) return;
  for (int j = 0; j < chunks; ++j) {
    const int s = j % STAGES;
    if (j >= STAGES) mbar_wait(empty + s * 8, ((j / STAGES) + 1) & 1);
    mbar_arrive_expect_tx(full + s * 8, CHUNK);
    bulk_load(ring + s * CHUNK, src + begin + (u64)j * CHUNK, CHUNK, full + s * 8);
  }
}

template <int U>
__global__ void __launch_bounds__(256) ldg_stream(const uint4* src, u64 n16, u32* out) {
  u32 acc = 0;
  const u64 stride = (u64)gridDim.x * blockDim.x;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n16; i += stride * U) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const u64 j = i + u * stride;
      if (j < n16)
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                     : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w)
                     : "l"(src + j));
      else
        v[u] = make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) acc += v[u].x ^ v[u].w;
  }
  if (acc == 0x9e3779b9u) out[blockIdx.x] = acc;
}

__global__ void null_kernel(u32* out) {
  if (threadIdx.x == 1000) out[0] = 1;
}

static EncodeTiled encode = nullptr;  // tensor_map_encoder(), once in main

static CUtensorMap make_map(void* base, int N, int K, int R, int E) {
  CUtensorMap m;
  cuuint64_t dims[2] = {(cuuint64_t)K, (cuuint64_t)N};
  cuuint64_t strides[1] = {(cuuint64_t)K * 2};
  cuuint32_t box[2] = {(cuuint32_t)E, (cuuint32_t)R};
  cuuint32_t es[2] = {1, 1};
  CUresult r = encode(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, base, dims, strides, box, es,
                      CU_TENSOR_MAP_INTERLEAVE_NONE,
                      E == 64 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
                      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    fprintf(stderr, "encode failed %d (R=%d E=%d)\n", (int)r, R, E);
    exit(1);
  }
  return m;
}

struct Buf {
  std::vector<unsigned char*> copies;
  u64 bytes;
};

static int sms = 0;
static int reps = 30;
static cudaStream_t stream;  // every launch: a stream, so it can be captured

// Microseconds per launch over `reps` launches that rotate through the copies: back to back on
// a stream, and the same launches replayed as one CUDA graph (how the GEMM results are timed).
struct Times {
  double us, graph_us;
};

template <class F>
static Times time_us(const Buf& b, F launch) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (size_t c = 0; c < b.copies.size(); ++c) launch(b.copies[c]);  // warm
  CK(cudaStreamSynchronize(stream));
  CK(cudaEventRecord(e0, stream));
  for (int i = 0; i < reps; ++i) launch(b.copies[i % b.copies.size()]);
  CK(cudaEventRecord(e1, stream));
  CK(cudaEventSynchronize(e1));
  CK(cudaGetLastError());
  float ms = 0, graph_ms = 0;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < reps; ++i) launch(b.copies[i % b.copies.size()]);
  CK(cudaStreamEndCapture(stream, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  CK(cudaGraphLaunch(exec, stream));  // warm
  CK(cudaStreamSynchronize(stream));
  CK(cudaEventRecord(e0, stream));
  CK(cudaGraphLaunch(exec, stream));
  CK(cudaEventRecord(e1, stream));
  CK(cudaEventSynchronize(e1));
  CK(cudaEventElapsedTime(&graph_ms, e0, e1));
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  return {ms * 1000.0 / reps, graph_ms * 1000.0 / reps};
}

static void report(const char* variant, int N, int K, const char* params, int grid, Times t,
                   u64 bytes) {
  printf("{\"variant\":\"%s\",\"N\":%d,\"K\":%d,%s,\"grid\":%d,\"us\":%.3f,\"tbs\":%.4f,"
         "\"graph_us\":%.3f,\"graph_tbs\":%.4f}\n",
         variant, N, K, params, grid, t.us, bytes / (t.us * 1e-6) / 1e12, t.graph_us,
         bytes / (t.graph_us * 1e-6) / 1e12);
  fflush(stdout);
}

int main(int argc, char** argv) {
  if (argc > 1) reps = atoi(argv[1]);
  CK(cudaFree(0));
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaDeviceProp p;
  CK(cudaGetDeviceProperties(&p, 0));
  sms = p.multiProcessorCount;
  encode = tensor_map_encoder();
  CK(cudaFuncSetAttribute(tma_stream, cudaFuncAttributeMaxDynamicSharedMemorySize, 232448));
  CK(cudaFuncSetAttribute(bulk_stream, cudaFuncAttributeMaxDynamicSharedMemorySize, 232448));
  u32* out;
  CK(cudaMalloc(&out, 1 << 20));
  const u64 l2 = p.l2CacheSize;
  const int shapes[][2] = {{4096, 4096}, {6144, 4096}, {4096, 14336}, {28672, 4096}};
  char params[256];

  {  // launch gap: back-to-back null kernels
    Buf none{{(unsigned char*)out}, 0};
    Times t = time_us(none, [&](unsigned char*) { null_kernel<<<sms, 64, 0, stream>>>(out); });
    printf("{\"variant\":\"null\",\"us\":%.3f,\"graph_us\":%.3f,\"sms\":%d,\"l2\":%llu}\n", t.us,
           t.graph_us, sms, l2);
  }
  for (auto& s : shapes) {
    const int N = s[0], K = s[1];
    Buf b;
    b.bytes = (u64)N * K * 2;
    int copies = (int)((3 * l2 + b.bytes - 1) / b.bytes) + 1;
    if (copies < 2) copies = 2;
    for (int c = 0; c < copies; ++c) {
      unsigned char* d;
      CK(cudaMalloc(&d, b.bytes));
      CK(cudaMemset(d, c + 1, b.bytes));
      b.copies.push_back(d);
    }
    for (int U : {4, 8}) {
      for (int blocks_per_sm : {4, 8}) {
        const int grid = sms * blocks_per_sm;
        Times t = time_us(b, [&](unsigned char* d) {
          if (U == 4)
            ldg_stream<4><<<grid, 256, 0, stream>>>((const uint4*)d, b.bytes / 16, out);
          else
            ldg_stream<8><<<grid, 256, 0, stream>>>((const uint4*)d, b.bytes / 16, out);
        });
        snprintf(params, sizeof params, "\"U\":%d,\"blocks_per_sm\":%d", U, blocks_per_sm);
        report("ldg", N, K, params, grid, t, b.bytes);
      }
    }
    for (int chunk : {8192, 16384, 32768}) {
      for (int inflight_kb : {64, 128, 192}) {
        for (int occ : {1, 2}) {
          const int stages = inflight_kb * 1024 / chunk / occ;
          if (stages < 2) continue;
          const int smem = stages * chunk + stages * 16 + 1024;
          const int grid = sms * occ;
          if (b.bytes % chunk) continue;  // a partial chunk would go unread
          Times t = time_us(b, [&](unsigned char* d) {
            bulk_stream<<<grid, 64, smem, stream>>>(d, b.bytes, chunk, stages, out);
          });
          snprintf(params, sizeof params, "\"chunk\":%d,\"stages\":%d,\"occ\":%d", chunk, stages,
                   occ);
          report("bulk", N, K, params, grid, t, b.bytes);
        }
      }
    }
    for (int R : {16, 32, 64, 128}) {
      for (int E : {64, 256}) {
        for (int BK : {256, 512}) {
          for (int inflight_kb : {64, 128, 192}) {
            for (int split : {1, 2}) {
              const int stage_bytes = R * BK * 2;
              const int stages = inflight_kb * 1024 / stage_bytes;
              if (stages < 2 || BK < E || (K / BK) % split) continue;
              const int smem = stages * stage_bytes + stages * 16 + 1024;
              if (smem > 232448) continue;
              const int grid = N / R * split;
              std::vector<CUtensorMap> maps;
              for (auto* d : b.copies) maps.push_back(make_map(d, N, K, R, E));
              size_t idx = 0;
              Times t = time_us(b, [&](unsigned char*) {
                tma_stream<<<grid, 64, smem, stream>>>(maps[idx++ % maps.size()], R, BK, E, stages, K,
                                               split, out);
              });
              snprintf(params, sizeof params,
                       "\"R\":%d,\"E\":%d,\"BK\":%d,\"stages\":%d,\"split\":%d,\"smem\":%d", R, E,
                       BK, stages, split, smem);
              report("tma", N, K, params, grid, t, b.bytes);
            }
          }
        }
      }
    }
    for (auto* d : b.copies) CK(cudaFree(d));
  }
  return 0;
}
