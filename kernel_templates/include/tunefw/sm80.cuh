// tunefw/sm80.cuh - small PTX wrappers for Ampere-style (sm_80+) kernels.
//
// Self-contained on purpose: NVRTC here has no CUDA headers, so nothing is included and the
// fixed-width types are our own. bf16/fp16 values are carried as raw 16-bit patterns
// (unsigned short) or packed pairs (u32); conversions go through PTX cvt.
#pragma once

namespace tunefw {

typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef int i32;
typedef long long i64;

// Compile-time integer as a type (for generic lambdas that need a constant).
template <int V>
struct IntC {
  static constexpr int value = V;
};

__device__ __forceinline__ int imin(int a, int b) { return a < b ? a : b; }
__device__ __forceinline__ int imax(int a, int b) { return a > b ? a : b; }

// ---- addresses -------------------------------------------------------------------------------

// 32-bit shared-window address of a generic pointer into shared memory.
__device__ __forceinline__ u32 smem_u32(const void* p) {
  u32 r;
  asm("{\n\t.reg .u64 t;\n\tcvta.to.shared.u64 t, %1;\n\tcvt.u32.u64 %0, t;\n\t}\n"
      : "=r"(r)
      : "l"(p));
  return r;
}

// ---- cp.async (global -> shared, 16 bytes, L2 only) -------------------------------------------

// Copies 16 bytes when `pred`, else writes 16 zero bytes (src-size 0: nothing is read from src,
// but callers still pass a valid address).
__device__ __forceinline__ void cp_async_16(u32 dst, const void* src, bool pred) {
  const int n = pred ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Wait until at most N committed groups of this thread are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// ---- ldmatrix ---------------------------------------------------------------------------------

__device__ __forceinline__ void ldmatrix_x4(u32 (&r)[4], u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(u32 (&r)[4], u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// ---- mma.sync m16n8k16, f32 accumulate (D = A * B + D) ----------------------------------------

__device__ __forceinline__ void mma_16816_bf16(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma_16816_f16(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// DTYPE 0: bf16, 1: fp16.
template <int DTYPE>
__device__ __forceinline__ void mma_16816(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  if (DTYPE == 0) {
    mma_16816_bf16(d, a, b0, b1);
  } else {
    mma_16816_f16(d, a, b0, b1);
  }
}

// ---- conversions (round to nearest even) ------------------------------------------------------

// Packs (lo, hi) into one u32: lo in bits 0..15 (lower address), hi in bits 16..31.
__device__ __forceinline__ u32 pack_bf16x2(float lo, float hi) {
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

__device__ __forceinline__ u32 pack_f16x2(float lo, float hi) {
  u32 r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

template <int DTYPE>
__device__ __forceinline__ u32 pack_x2(float lo, float hi) {
  return DTYPE == 0 ? pack_bf16x2(lo, hi) : pack_f16x2(lo, hi);
}

// ---- plain memory ops with explicit widths / cache behaviour ----------------------------------

__device__ __forceinline__ void st_global_u32(void* p, u32 v) {
  asm volatile("st.global.b32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ void st_global_v4_u32(void* p, u32 a, u32 b, u32 c, u32 d) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "r"(a), "r"(b), "r"(c),
               "r"(d)
               : "memory");
}

// Stores that stay in L2 (split-K partials: read back by another CTA).
__device__ __forceinline__ void st_global_cg_v4_f32(float* p, float a, float b, float c, float d) {
  asm volatile("st.global.cg.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "f"(a), "f"(b), "f"(c),
               "f"(d)
               : "memory");
}

// Loads that bypass L1 (data written by other CTAs during this launch).
__device__ __forceinline__ void ld_global_cg_v4_f32(const float* p, float& a, float& b, float& c,
                                                    float& d) {
  asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(a), "=f"(b), "=f"(c), "=f"(d)
               : "l"(p)
               : "memory");
}

__device__ __forceinline__ void st_shared_u32(u32 addr, u32 v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}

__device__ __forceinline__ void ld_shared_v4_u32(u32 addr, u32& a, u32& b, u32& c, u32& d) {
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(a), "=r"(b), "=r"(c), "=r"(d)
               : "r"(addr)
               : "memory");
}

__device__ __forceinline__ void st_shared_s32(u32 addr, int v) {
  asm volatile("st.shared.s32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}

__device__ __forceinline__ int ld_shared_s32(u32 addr) {
  int v;
  asm volatile("ld.shared.s32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
  return v;
}

// ---- synchronisation --------------------------------------------------------------------------

__device__ __forceinline__ void block_sync() { asm volatile("bar.sync 0;\n" ::: "memory"); }

__device__ __forceinline__ void fence_gpu() { asm volatile("fence.acq_rel.gpu;\n" ::: "memory"); }

// Atomic add on a global int, relaxed at gpu scope; returns the old value.
__device__ __forceinline__ int atomic_add_gpu(int* p, int v) {
  int old;
  asm volatile("atom.relaxed.gpu.global.add.s32 %0, [%1], %2;\n"
               : "=r"(old)
               : "l"(p), "r"(v)
               : "memory");
  return old;
}

__device__ __forceinline__ void st_global_s32_relaxed(int* p, int v) {
  asm volatile("st.relaxed.gpu.global.s32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

}  // namespace tunefw
