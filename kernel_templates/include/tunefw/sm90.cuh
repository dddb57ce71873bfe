// tunefw/sm90.cuh: small PTX wrappers for Hopper (sm_90a) GEMM kernels.
//
// Self-contained on purpose: NVRTC in tunefw runs without the CUDA headers, so nothing here
// includes anything. Shared-memory addresses are 32-bit shared::cta addresses (cvta'd once);
// tensor maps are the 128-byte opaque CUtensorMap built on the host by cuTensorMapEncodeTiled.
#pragma once

namespace tunefw {
namespace sm90 {

typedef unsigned int u32;
typedef unsigned long long u64;

// ---- addresses, ids ------------------------------------------------------------------------
__device__ __forceinline__ u32 smem_u32(const void* p) {
  u64 r;
  asm("cvta.to.shared.u64 %0, %1;" : "=l"(r) : "l"(reinterpret_cast<u64>(p)));
  return static_cast<u32>(r);
}
__device__ __forceinline__ u32 cluster_ctarank() {
  u32 r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
// Address of the same shared-memory location in CTA `rank` of this cluster (shared::cluster).
__device__ __forceinline__ u32 mapa(u32 addr, u32 rank) {
  u32 r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}
__device__ __forceinline__ void cluster_arrive() {
  asm volatile("barrier.cluster.arrive.release;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.acquire;" ::: "memory");
}
__device__ __forceinline__ void cluster_sync() {
  cluster_arrive();
  cluster_wait();
}
// Named barrier `id` (1..15) over `count` threads (a multiple of 32).
__device__ __forceinline__ void named_bar_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(count) : "memory");
}
// Arrive at named barrier `id` without waiting (the other side of a bar.sync hand-off).
__device__ __forceinline__ void named_bar_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(count) : "memory");
}

// The same value, through a volatile asm: the compiler cannot hoist what depends on it out of
// a loop (keeps addresses used once per tile from living in registers across the main loop).
__device__ __forceinline__ int opaque(int v) {
  int r;
  asm volatile("mov.b32 %0, %1;" : "=r"(r) : "r"(v));
  return r;
}

// ---- programmatic dependent launch ----------------------------------------------------------
// A kernel the runtime launches with programmatic stream serialization may start while the
// kernels before it on the stream still run (a chain of such kernels, each triggering early,
// can overlap more than one): before pdl_wait() it must touch no global memory at all. Not the
// weight either: tunefw.gemm's B can be any tensor, and an optimizer step writes a Linear's
// weight right before the next forward. What it can do early is its prologue (barriers, the
// tensor-map prefetch from the kernel's parameters). An L2 prefetch of the weight's first ring
// would be safe too, but every sm90 family measured it a loss (its boxes queue ahead of the
// ring's own loads: timeline_variants_h200.json, timeline_stream_pf_h200.json), so none has one.
// Launched without that attribute (tuning, the guard's reference), pdl_wait() returns at once
// and the trigger has no dependent.
// Let the next kernel on the stream (if it was launched to depend programmatically) start its
// own prologue as SMs free up: issued by every thread of every CTA early, as the next kernel
// reads nothing before its own pdl_wait(), which waits for this kernel to finish.
__device__ __forceinline__ void pdl_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
// Wait until the kernels this one depends on have finished and their writes are visible.
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// ---- register reallocation (warp specialization) --------------------------------------------
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N));
}

// ---- mbarrier -----------------------------------------------------------------------------
__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
// Makes barrier initialisation visible to the async proxy and to the other CTAs of the cluster.
__device__ __forceinline__ void fence_mbar_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// A ring's STAGES full/empty barrier pairs (8 bytes apart): full completes on one arrival (the
// producer's expect_tx) plus its bytes, empty on `consumers` arrivals. Call from one thread; the
// caller then syncs the block (or the cluster).
__device__ __forceinline__ void init_ring_barriers(u32 full, u32 empty, int stages, int consumers) {
  for (int s = 0; s < stages; ++s) {
    mbar_init(full + s * 8, 1);
    mbar_init(empty + s * 8, consumers);
  }
  fence_mbar_init();
}
__device__ __forceinline__ void mbar_arrive(u32 bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
// Arrive on a barrier of another CTA of the cluster (address from mapa()). Default (.cta)
// release semantics: an explicit .release.cluster costs a full MEMBAR.ALL.GPU per arrive, and
// the data it orders (wgmma reads of the stage) is complete at wgmma.wait_group anyway.
__device__ __forceinline__ void mbar_arrive_cluster(u32 remote_bar) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(remote_bar) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(u32 bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}
// Spin until the phase with parity `parity` of the barrier has completed.
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
  u32 done;
  do {
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}
// Same, with cluster-scope acquire (arrivals came from other CTAs of the cluster).
__device__ __forceinline__ void mbar_wait_cluster(u32 bar, u32 parity) {
  u32 done;
  do {
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

// ---- fences -----------------------------------------------------------------------------------
// Generic-proxy shared-memory writes -> visible to the async proxy (TMA store, wgmma).
// Add to a global counter at GPU scope with acquire-release semantics and return the old value:
// one thread's release publishes every write its CTA ordered before it with a barrier, and its
// acquire makes the other CTAs' published writes visible to what the CTA does after the next one
// (the serial split-K hand-off, with no per-thread fence).
__device__ __forceinline__ int atom_add_acq_rel_gpu(int* p, int v) {
  int old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// ---- TMA (cp.async.bulk.tensor) -------------------------------------------------------------
__device__ __forceinline__ void tma_prefetch_desc(const void* tmap) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<u64>(tmap)) : "memory");
}
// 2D tile load global -> shared, completing `bar` with the bytes it wrote.
__device__ __forceinline__ void tma_load_2d(u32 dst, const void* tmap, int c0, int c1, u32 bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
      "l"(reinterpret_cast<u64>(tmap)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}
// Same tile written to the same offset of every CTA in `mask` (bit = cluster rank); each
// destination's barrier at offset `bar` gets the complete_tx.
__device__ __forceinline__ void tma_load_2d_multicast(u32 dst, const void* tmap, int c0, int c1,
                                                      u32 bar, unsigned short mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(dst),
      "l"(reinterpret_cast<u64>(tmap)), "r"(c0), "r"(c1), "r"(bar), "h"(mask)
      : "memory");
}
// 2D tile store shared -> global (clipped at the tensor bounds), tracked as a bulk group.
__device__ __forceinline__ void tma_store_2d(const void* tmap, u32 src, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];" ::"l"(
          reinterpret_cast<u64>(tmap)),
      "r"(c0), "r"(c1), "r"(src)
      : "memory");
}
// Same, as predicated instructions rather than a branch (so it may sit between wgmma issue and
// wait without ptxas serializing the wgmmas around a divergent path): the store is issued where
// `store` is set, and a bulk group (empty if there was no store) is committed where `commit` is.
__device__ __forceinline__ void tma_store_2d_if(bool store, bool commit, const void* tmap, u32 src,
                                                int c0, int c1) {
  asm volatile(
      "{\n.reg .pred ps, pc;\nsetp.ne.b32 ps, %4, 0;\nsetp.ne.b32 pc, %5, 0;\n"
      "@ps cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n"
      "@pc cp.async.bulk.commit_group;\n}\n" ::"l"(reinterpret_cast<u64>(tmap)),
      "r"(c0), "r"(c1), "r"(src), "r"((int)store), "r"((int)commit)
      : "memory");
}
__device__ __forceinline__ void bulk_commit_group() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
// Wait until at most N bulk groups still read their shared-memory source.
template <int N>
__device__ __forceinline__ void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}
// Wait until at most N bulk groups are outstanding (writes done).
template <int N>
__device__ __forceinline__ void bulk_wait_group() {
  asm volatile("cp.async.bulk.wait_group %0;" ::"n"(N) : "memory");
}

// ---- wgmma ----------------------------------------------------------------------------------
// Shared-memory matrix descriptor for a K-major operand tile written by TMA with `swizzle_bytes`
// swizzle (128, 64 or 32): rows of swizzle_bytes bytes, 8-row groups `8*swizzle_bytes` apart.
// The start address may move by multiples of 32 bytes inside a swizzle row (next k16 slice).
__device__ __forceinline__ u64 smem_desc(u32 addr, int swizzle_bytes) {
  u64 mode = swizzle_bytes == 128 ? 1ull : (swizzle_bytes == 64 ? 2ull : 3ull);
  u64 desc = 0;
  desc |= static_cast<u64>((addr & 0x3FFFF) >> 4);                 // start address, bits 0-13
  desc |= static_cast<u64>(1) << 16;                               // leading byte offset (unused)
  desc |= static_cast<u64>((8 * swizzle_bytes) >> 4) << 32;        // stride byte offset
  desc |= mode << 62;                                              // swizzle mode
  return desc;
}
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accumulator reads/writes across wgmma fences and waits.
template <int R>
__device__ __forceinline__ void fence_regs(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// ---- conversions / stores -------------------------------------------------------------------
// Two floats -> packed 16-bit pair (lo in the low half). DT 0: bf16, 1: fp16.
template <int DT>
__device__ __forceinline__ u32 pack2(float lo, float hi) {
  u32 r;
  if (DT == 0)
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  else
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
// Four 8x8 16-bit matrices to shared memory: lanes 8i..8i+7 give the row addresses of matrix i,
// and each thread's r_i is its (row lane/4, columns 2*(lane%4) + 0..1) pair of matrix i.
__device__ __forceinline__ void stmatrix_x4(u32 addr, u32 r0, u32 r1, u32 r2, u32 r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr),
               "r"(r0), "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}
__device__ __forceinline__ void st_shared_u32(u32 addr, u32 v) {
  asm volatile("st.shared.u32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ void st_global_u32(void* p, u32 v) {
  asm volatile("st.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void st_global_f4(float* p, float a, float b, float c, float d) {
  asm volatile("st.global.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(a), "f"(b), "f"(c),
               "f"(d)
               : "memory");
}
// L2-only load (data written by other CTAs during this launch).
__device__ __forceinline__ void ld_global_cg_f4(const float* p, float& a, float& b, float& c,
                                                float& d) {
  asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(a), "=f"(b), "=f"(c), "=f"(d)
               : "l"(p)
               : "memory");
}

}  // namespace sm90
}  // namespace tunefw
