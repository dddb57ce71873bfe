#!/usr/bin/env python3
"""GPU check of the mma_sm80 family: correctness sweep, timing vs cuBLAS, mma.sync ceiling.

Run from the repo root on a GPU machine (torch + cuda-bindings + NVRTC):

    PYTHONPATH=. python3 benchmarks/mma_sm80_gpu_check.py            # everything, < 6 min
    PYTHONPATH=. python3 benchmarks/mma_sm80_gpu_check.py --compile-only   # CPU: NVRTC only

Self-contained: NVRTC (cuda-bindings) compiles the template by name expression for the GPU's
arch, the driver API loads and launches it on torch tensors in torch's current stream.

Fault isolation: the parent never launches a kernel. Each part runs in a child process; a
kernel that poisons its CUDA context (illegal address, ...) kills only that child, the config
is recorded as RUNTIME_CRASH and the sweep resumes after it in a fresh child.

Parts (children, in this order): peak (mma.sync register-only throughput), timing (a handful of
promising configs at 4096^3 and 8192^3 vs torch.matmul, each verified first), correctness (~40
random valid configs over edge shapes + every SPLIT_K/EPILOGUE/DBUF/BK path, each launched twice
on NaN-poisoned output inside guard-banded buffers: results verified, bitwise equal across the
two launches, split-K counters back at 0, guard bands untouched).
Writes $OUT/mma_sm80_gpu_check.json when $OUT is set.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import ctypes
import datetime as _dt
import hashlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
TEMPLATES = REPO / "kernel_templates"
SCRIPT = "benchmarks/mma_sm80_gpu_check.py"
TOTAL_BUDGET_S = 330.0  # whole script, < 6 min


from tunefw.templates.mma_sm80 import MmaSm80  # noqa: E402
from tunefw.device import DeviceSpec  # noqa: E402
from tunefw.problem import GemmProblem  # noqa: E402

T = MmaSm80()

CORRECTNESS_SHAPES = [(1, 8, 8), (17, 24, 40), (129, 136, 264), (4095, 4104, 4104), (256, 512, 1024)]
TIMING_SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192)]
BASE = T.default_config()
# Promising large-problem configs (bf16); all are verified on each timing shape before timing.
TIMING_CONFIGS = [
    dict(BASE),
    dict(BASE, STAGES=5),
    dict(BASE, BN=256, STAGES=3),
    dict(BASE, BN=256, STAGES=4),
    dict(BASE, BM=256, STAGES=4),
    dict(BASE, BM=256, STAGES=3, RASTER=1),
    dict(BASE, BK=64, STAGES=3),
    dict(BASE, BN=256, BK=64, STAGES=3),
    dict(BASE, BN=256, STAGES=4, EPILOGUE=1),
    dict(BASE, BN=256, STAGES=4, GROUP=16),
]

PEAK_SOURCE = r'''
#include "tunefw/sm80.cuh"
// Register-only mma.sync m16n8k16 throughput: CHAINS independent accumulators per warp, no
// memory traffic in the loop. Operands are non-zero bf16/fp16 patterns.
template <int DTYPE, int CHAINS>
__global__ void __launch_bounds__(256) mma_peak(float* out, int iters) {
  using namespace tunefw;
  const u32 base = DTYPE == 0 ? 0x3c003c00u : 0x24002400u;  // small normal values
  u32 a[4] = {base ^ (threadIdx.x & 7u), base, base ^ 1u, base};
  const u32 b0 = base ^ 2u, b1 = base;
  float acc[CHAINS][4];
#pragma unroll
  for (int c = 0; c < CHAINS; ++c) acc[c][0] = acc[c][1] = acc[c][2] = acc[c][3] = 0.0f;
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int c = 0; c < CHAINS; ++c) mma_16816<DTYPE>(acc[c], a, b0, b1);
  }
  float s = 0.0f;
#pragma unroll
  for (int c = 0; c < CHAINS; ++c) s += acc[c][0] + acc[c][1] + acc[c][2] + acc[c][3];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
'''


# ---- compiling (NVRTC; no GPU needed) ---------------------------------------------------------
def _nvrtc_ok(res):
    from cuda.bindings import nvrtc
    if res[0] != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(f"NVRTC error {res[0]}")
    return res[1] if len(res) > 1 else None


def nvrtc_compile(source: str, name_expr: str, arch: str) -> dict:
    """-> {ok, cubin (hex), lowered, log, seconds}"""
    from cuda.bindings import nvrtc
    t0 = time.time()
    prog = _nvrtc_ok(nvrtc.nvrtcCreateProgram(source.encode(), b"tunefw_gpu_check.cu", 0, [], []))
    try:
        _nvrtc_ok(nvrtc.nvrtcAddNameExpression(prog, name_expr.encode()))
        opts = [f"--gpu-architecture={arch}", "-std=c++17", f"-I{TEMPLATES}",
                f"-I{TEMPLATES / 'include'}", "--ptxas-options=-v"]
        res = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        size = _nvrtc_ok(nvrtc.nvrtcGetProgramLogSize(prog))
        buf = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, buf)
        log = buf.decode(errors="replace").rstrip("\x00")
        if res[0] != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            return dict(ok=False, log=log[-4000:], seconds=time.time() - t0)
        lowered = _nvrtc_ok(nvrtc.nvrtcGetLoweredName(prog, name_expr.encode()))
        lowered = lowered.decode() if isinstance(lowered, bytes) else lowered
        size = _nvrtc_ok(nvrtc.nvrtcGetCUBINSize(prog))
        cubin = b" " * size
        nvrtc.nvrtcGetCUBIN(prog, cubin)
        return dict(ok=True, cubin=cubin.hex(), lowered=lowered, log=log[-4000:],
                    seconds=time.time() - t0)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def cache_key(source: str, name_expr: str, arch: str) -> str:
    h = hashlib.sha256()
    for path in sorted(TEMPLATES.rglob("*.cuh")):
        h.update(path.read_bytes())
    h.update(f"{source}\0{name_expr}\0{arch}".encode())
    return h.hexdigest()[:24]


def compile_cached(cache: Path, source: str, name_expr: str, arch: str) -> dict:
    path = cache / f"{cache_key(source, name_expr, arch)}.json"
    if path.exists():
        return json.loads(path.read_text())
    result = nvrtc_compile(source, name_expr, arch)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result))
    tmp.replace(path)
    return result


def _compile_job(args):
    cache, source, name_expr, arch = args
    try:
        return name_expr, compile_cached(Path(cache), source, name_expr, arch)
    except Exception as exc:  # noqa: BLE001 - reported per config
        return name_expr, dict(ok=False, log=f"{type(exc).__name__}: {exc}")


def family_source() -> str:
    return f'#include "{MmaSm80.source}"\n'


def precompile(cache: Path, jobs: list[tuple[str, str]], arch: str) -> dict[str, dict]:
    """jobs: (source, name_expr). Compiles in a process pool (spawn: no CUDA state)."""
    unique = list(dict.fromkeys(jobs))
    workers = max(1, min(16, (os.cpu_count() or 2)))
    ctx = __import__("multiprocessing").get_context("spawn")
    out = {}
    with cf.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        for name, res in pool.map(_compile_job, [(str(cache), s, n, arch) for s, n in unique]):
            out[name] = res
    return out


# ---- the plan (pure Python: which configs on which shapes) -------------------------------------
def device_spec_from_driver() -> tuple[DeviceSpec, str]:
    """Limits of GPU 0 via the driver API, without creating a context."""
    from cuda.bindings import driver as d

    def ok(res):
        if res[0] != d.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"driver error {res[0]}")
        return res[1] if len(res) > 1 else None

    ok(d.cuInit(0))
    dev = ok(d.cuDeviceGet(0))
    A = d.CUdevice_attribute
    attr = lambda a: ok(d.cuDeviceGetAttribute(a, dev))  # noqa: E731
    major = attr(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
    minor = attr(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
    name = ok(d.cuDeviceGetName(256, dev))
    name = name.split(b"\0")[0].decode() if isinstance(name, bytes) else str(name)
    spec = DeviceSpec(
        name=name, cc=major * 10 + minor,
        sm_count=attr(A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
        smem_per_block_optin=attr(A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
        smem_per_sm=attr(A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR),
        regs_per_sm=attr(A.CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR),
        max_threads_per_block=attr(A.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK),
        l2_bytes=attr(A.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE),
    )
    return spec, f"sm_{major}{minor}"


def correctness_plan(device: DeviceSpec, n_random: int, seed: int = 2024) -> list[dict]:
    """Items {config, dtype, shape}: every path forced once, then random valid configs."""
    rng = random.Random(seed)
    items: list[dict] = []

    def add(config, shape, dtype="bf16"):
        prob = GemmProblem(*shape, dtype=dtype)
        if T.check(config, prob, device) is None:
            items.append(dict(config=dict(config), dtype=dtype, shape=list(shape)))
            return True
        return False

    forced = [
        dict(BASE), dict(BASE, SPLIT_K=2), dict(BASE, SPLIT_K=4, EPILOGUE=1),
        dict(BASE, BK=16, DBUF=1), dict(BASE, BK=16, DBUF=0, SPLIT_K=8),
        dict(BASE, BK=64, STAGES=3, SWIZZLE=0), dict(BASE, DBUF=0, EPILOGUE=1, RASTER=1, GROUP=4),
        dict(BASE, BM=32, BN=32, WM=16, WN=16, STAGES=2, SPLIT_K=16, BK=16),
        dict(BASE, BM=256, BN=64, WM=64, WN=32, STAGES=3, EPILOGUE=1, GROUP=1),
        dict(BASE, BN=256, STAGES=3, RASTER=1, GROUP=16),
    ]
    for i, config in enumerate(forced):
        for shape in CORRECTNESS_SHAPES:
            add(config, shape, "fp16" if i % 3 == 2 else "bf16")
    space = list(T.iter_space())
    rng.shuffle(space)
    want = {s: n_random // len(CORRECTNESS_SHAPES) + 1 for s in map(tuple, CORRECTNESS_SHAPES)}
    for config in space:
        if not any(want.values()):
            break
        shape = rng.choice([s for s, n in want.items() if n > 0])
        dtype = rng.choice(["bf16", "bf16", "fp16"])
        if add(config, shape, dtype):
            want[shape] -= 1
    return items


def timing_plan(device: DeviceSpec) -> list[dict]:
    items = []
    for shape in TIMING_SHAPES:
        for config in TIMING_CONFIGS:
            if T.check(config, GemmProblem(*shape), device) is None:
                items.append(dict(config=dict(config), dtype="bf16", shape=list(shape)))
    return items


# ---- GPU side (children only) ------------------------------------------------------------------
class Gpu:
    """torch's primary context + the driver API for our modules."""

    def __init__(self):
        import torch
        from cuda.bindings import driver
        self.torch, self.d = torch, driver
        torch.cuda.init()
        torch.zeros(1, device="cuda")  # make torch's primary context current on this thread
        self.modules = {}

    def ok(self, res):
        err = res[0]
        if err != self.d.CUresult.CUDA_SUCCESS:
            name = self.d.cuGetErrorName(err)[1]
            raise RuntimeError(f"CUDA driver error {err}: {name}")
        return res[1] if len(res) > 1 else None

    def function(self, compiled: dict, smem: int):
        key = compiled["lowered"]
        if key not in self.modules:
            cubin = ctypes.create_string_buffer(bytes.fromhex(compiled["cubin"]))
            module = self.ok(self.d.cuModuleLoadData(ctypes.addressof(cubin)))
            func = self.ok(self.d.cuModuleGetFunction(module, compiled["lowered"].encode()))
            self.modules[key] = (module, func, cubin)
        func = self.modules[key][1]
        if smem > 0:
            self.ok(self.d.cuFuncSetAttribute(
                func, self.d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem))
        return func

    def launch(self, func, grid, block, smem, args):
        """args: [(value, ctypes type)] -> raw void** (keeps the ctypes objects alive)."""
        holders = [t(v) for v, t in args]
        ptrs = (ctypes.c_void_p * len(holders))(*[ctypes.addressof(h) for h in holders])
        stream = self.torch.cuda.current_stream().cuda_stream
        self.ok(self.d.cuLaunchKernel(func, grid[0], grid[1], grid[2], block[0], block[1], block[2],
                                      smem, self.d.CUstream(stream), ctypes.addressof(ptrs), 0))
        return holders, ptrs


STICKY = ("ILLEGAL_ADDRESS", "LAUNCH_FAILED", "MISALIGNED", "ILLEGAL_INSTRUCTION", "HARDWARE",
          "ASSERT", "ECC", "TRAP", "illegal memory access", "unspecified launch failure")


def is_sticky(exc: BaseException) -> bool:
    text = str(exc)
    return any(s in text for s in STICKY)


GUARD = 4096  # elements of guard band on each side of A, B, C


def run_item(gpu: Gpu, compiled: dict, item: dict, device: DeviceSpec, launches: int = 2) -> dict:
    """Verify one config on one shape: NaN-poisoned C inside guard bands, launched `launches`
    times (bitwise-equal results, counters back at 0, guards intact)."""
    torch = gpu.torch
    from tunefw.evaluate.method import TORCH_DTYPE, make_inputs, reference, verify
    M, N, K = item["shape"]
    dtype, config = item["dtype"], item["config"]
    prob = GemmProblem(M, N, K, dtype=dtype)
    launch = T.launch(config, prob, device)
    tdt = TORCH_DTYPE[dtype]
    seed = (M * 1000003 + N * 1009 + K) % 2**31
    a, b = make_inputs(M, N, K, dtype, seed, device="cuda")
    nan_bits = 0x7FC0 if dtype == "bf16" else 0x7E00

    def banded(n, fill_bits):
        buf = torch.full((n + 2 * GUARD,), fill_bits, dtype=torch.int16, device="cuda").view(tdt)
        return buf, buf[GUARD:GUARD + n]

    # operands inside NaN guard bands: an out-of-bounds read that reaches the math shows as NaN
    abuf, av = banded(M * K, nan_bits)
    bbuf, bv = banded(N * K, nan_bits)
    av.copy_(a.reshape(-1))
    bv.copy_(b.reshape(-1))
    sentinel = 0x1234
    cbuf = torch.full((M * N + 2 * GUARD,), sentinel, dtype=torch.int16, device="cuda")
    cv = cbuf[GUARD:GUARD + M * N]
    ws = None
    if launch.workspace_bytes:
        ws = torch.zeros(launch.workspace_bytes // 4 + 64, dtype=torch.int32, device="cuda")
    ref = reference(a, b)
    base = torch.matmul(a, b.T)
    func = gpu.function(compiled, launch.smem_bytes)
    ptrs = {"a": av.data_ptr(), "b": bv.data_ptr(), "c": cv.data_ptr(),
            "workspace": ws.data_ptr() if ws is not None else 0}
    outs, verdicts = [], []
    for _ in range(launches):
        cv.fill_(nan_bits)
        gpu.launch(func, launch.grid, launch.block, launch.smem_bytes,
                   T.kernel_args(config, prob, ptrs))
        torch.cuda.synchronize()
        out = cv.view(tdt).reshape(M, N).clone()
        outs.append(out)
        verdicts.append(verify(out, ref, dtype, baseline=base))
    problems = [v.reason for v in verdicts if not v.ok]
    if launches > 1 and not torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16)):
        problems.append("two launches differ bitwise (non-deterministic or counter not reset)")
    if ws is not None:
        tiles = launch.grid[0]
        cnt = ws[:tiles]
        if bool((cnt != 0).any()):
            problems.append(f"split-K counters not reset: {int((cnt != 0).sum())} nonzero")
    guard_ok = bool((cbuf[:GUARD] == sentinel).all()) and bool((cbuf[GUARD + M * N:] == sentinel).all())
    if not guard_ok:
        problems.append("write outside C (guard band changed)")
    for name, buf in (("A", abuf), ("B", bbuf)):
        raw = buf.view(torch.int16)
        if not (bool((raw[:GUARD] == nan_bits).all()) and bool((raw[-GUARD:] == nan_bits).all())):
            problems.append(f"{name} guard band changed")
    return dict(status="OK" if not problems else "WRONG_ANSWER", rel_err=verdicts[0].rel_err,
                reason="; ".join(problems))


def time_item(gpu: Gpu, compiled: dict, item: dict, device: DeviceSpec, iters: int = 30,
              warmup: int = 5) -> dict:
    """Median kernel time with L2 flushed between launches; cuBLAS the same way."""
    torch = gpu.torch
    from tunefw.evaluate.method import make_inputs
    M, N, K = item["shape"]
    dtype, config = item["dtype"], item["config"]
    prob = GemmProblem(M, N, K, dtype=dtype)
    launch = T.launch(config, prob, device)
    a, b = make_inputs(M, N, K, dtype, 7, device="cuda")
    c = torch.empty(M, N, dtype=a.dtype, device="cuda")
    ws = torch.zeros(max(launch.workspace_bytes, 4) // 4, dtype=torch.int32, device="cuda")
    flush = torch.empty(max(2 * device.l2_bytes, 128 * 2**20) // 4, dtype=torch.int32, device="cuda")
    func = gpu.function(compiled, launch.smem_bytes)
    args = T.kernel_args(config, prob, {"a": a.data_ptr(), "b": b.data_ptr(), "c": c.data_ptr(),
                                        "workspace": ws.data_ptr()})

    def ours():
        gpu.launch(func, launch.grid, launch.block, launch.smem_bytes, args)

    def cublas():
        torch.matmul(a, b.T, out=c)

    def measure(fn):
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(iters):
            flush.fill_(1)
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            fn()
            e1.record()
            e1.synchronize()
            times.append(e0.elapsed_time(e1))
        return statistics.median(times), min(times)

    ms, ms_min = measure(ours)
    cb_ms, cb_min = measure(cublas)
    flops = 2.0 * M * N * K
    tf, cb = flops / ms / 1e9, flops / cb_ms / 1e9
    return dict(status="OK", median_ms=ms, min_ms=ms_min, tflops=tf, cublas_median_ms=cb_ms,
                cublas_tflops=cb, ratio=tf / cb)


def child_main(args) -> int:
    """Run one part; append one JSON line per item to args.jsonl (flushed)."""
    device, arch = device_spec_from_driver()
    cache = Path(args.cache)
    out = open(args.jsonl, "a", buffering=1)
    gpu = Gpu()
    if args.part == "peak":
        props = gpu.torch.cuda.get_device_properties(0)
        best = {}
        for dtype_code, dtype in ((0, "bf16"), (1, "fp16")):
            for chains in (4, 8, 16):
                name = f"mma_peak<{dtype_code}, {chains}>"
                comp = compile_cached(cache, PEAK_SOURCE, name, arch)
                if not comp["ok"]:
                    out.write(json.dumps(dict(part="peak", name=name, status="COMPILE_ERROR",
                                              log=comp["log"][-1500:])) + "\n")
                    continue
                func = gpu.function(comp, 0)
                blocks, threads, iters = props.multi_processor_count * 4, 256, 2048 // chains * 4
                buf = gpu.torch.empty(blocks * threads, dtype=gpu.torch.float32, device="cuda")
                largs = [(buf.data_ptr(), ctypes.c_void_p), (iters, ctypes.c_int)]
                for _ in range(2):
                    gpu.launch(func, (blocks, 1, 1), (threads, 1, 1), 0, largs)
                gpu.torch.cuda.synchronize()
                times = []
                for _ in range(5):
                    e0 = gpu.torch.cuda.Event(enable_timing=True)
                    e1 = gpu.torch.cuda.Event(enable_timing=True)
                    e0.record()
                    gpu.launch(func, (blocks, 1, 1), (threads, 1, 1), 0, largs)
                    e1.record()
                    e1.synchronize()
                    times.append(e0.elapsed_time(e1))
                ms = statistics.median(times)
                flops = blocks * (threads // 32) * iters * chains * 2.0 * 16 * 8 * 16
                tf = flops / ms / 1e9
                best[dtype] = max(best.get(dtype, 0.0), tf)
                out.write(json.dumps(dict(part="peak", name=name, dtype=dtype, chains=chains,
                                          ms=ms, tflops=tf, status="OK")) + "\n")
        return 0
    plan = json.loads(Path(args.plan).read_text())
    compiled = json.loads(Path(args.compiled).read_text())
    deadline = time.time() + args.budget
    for idx in range(args.start, len(plan)):
        item = plan[idx]
        name = T.name_expression(item["config"], item["dtype"])
        rec = dict(part=args.part, index=idx, name=name, **item)
        if time.time() > deadline:
            rec.update(status="SKIPPED", reason="time budget")
            out.write(json.dumps(rec) + "\n")
            continue
        comp = compiled.get(name) or compile_cached(cache, family_source(), name, arch)
        if not comp.get("ok"):
            rec.update(status="COMPILE_ERROR", reason=comp.get("log", "")[-1500:])
            out.write(json.dumps(rec) + "\n")
            continue
        # mark the attempt first: if the process dies, the parent knows which item killed it
        out.write(json.dumps(dict(part=args.part, index=idx, status="STARTED")) + "\n")
        try:
            res = run_item(gpu, comp, item, device)
            if args.part == "timing" and res["status"] == "OK":
                res.update(time_item(gpu, comp, item, device))
            rec.update(res)
        except Exception as exc:  # noqa: BLE001 - one bad config never stops the sweep
            sticky = is_sticky(exc)
            rec.update(status="RUNTIME_CRASH" if sticky else "ERROR",
                       reason=f"{type(exc).__name__}: {exc}"[-1500:],
                       trace=traceback.format_exc()[-1500:])
            out.write(json.dumps(rec) + "\n")
            if sticky:
                return 3  # context poisoned: the parent resumes after this item
            continue
        out.write(json.dumps(rec) + "\n")
    return 0


# ---- parent: plan, compile, run children, report ------------------------------------------------
def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return rows


def run_part(part: str, work: Path, plan: list[dict] | None, compiled_path: Path,
             deadline: float) -> list[dict]:
    jsonl = work / f"{part}.jsonl"
    plan_path = work / f"{part}.plan.json"
    if plan is not None:
        plan_path.write_text(json.dumps(plan))
    start = 0
    n = len(plan) if plan is not None else 0
    restarts = 0
    while True:
        left = deadline - time.time()
        if left < 5:
            break
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", part, "--jsonl", str(jsonl),
               "--cache", str(work / "cubins"), "--plan", str(plan_path), "--compiled",
               str(compiled_path), "--start", str(start), "--budget", str(max(1.0, left - 10))]
        env = dict(os.environ, PYTHONPATH=f"{REPO}:{os.environ.get('PYTHONPATH', '')}")
        try:
            proc = subprocess.run(cmd, env=env, timeout=left, capture_output=True, text=True)
            rc, tail = proc.returncode, (proc.stderr or "")[-3000:]
        except subprocess.TimeoutExpired:
            rc, tail = -9, "child timed out"
        if plan is None:  # peak: one shot
            if rc != 0:
                print(f"[{part}] child rc={rc}\n{tail}", file=sys.stderr)
            break
        rows = [r for r in read_jsonl(jsonl) if r.get("part") == part]
        done = {r["index"] for r in rows if r.get("status") != "STARTED"}
        started = [r["index"] for r in rows if r.get("status") == "STARTED"]
        if rc == 0 and all(i in done for i in range(start, n)):
            break
        # the child died (crash/timeout) or returned 3: resume after the item it was on
        crashed = [i for i in started if i not in done]
        last = max(crashed) if crashed else max(done, default=start - 1)
        if crashed:
            with open(jsonl, "a") as f:
                rec = dict(part=part, index=last, status="RUNTIME_CRASH",
                           reason=f"child exited rc={rc}: {tail[-800:]}", **plan[last])
                f.write(json.dumps(rec) + "\n")
        if last + 1 <= start and not crashed:
            print(f"[{part}] child rc={rc} made no progress; giving up\n{tail}", file=sys.stderr)
            break
        start = last + 1
        restarts += 1
        print(f"[{part}] child rc={rc}; resuming at item {start} (restart {restarts})", file=sys.stderr)
        if start >= n or restarts > 20:
            break
    rows = [r for r in read_jsonl(jsonl) if r.get("part") == part and r.get("status") != "STARTED"]
    final = {}
    for r in rows:
        final[r.get("index", r.get("name"))] = r
    return list(final.values())


def fingerprint(device: DeviceSpec) -> dict:
    info = {"name": device.name, "cc": device.cc, "sm_count": device.sm_count}
    try:
        from cuda.bindings import driver as d, nvrtc
        info["driver"] = d.cuDriverGetVersion()[1]
        major, minor = nvrtc.nvrtcVersion()[1:3]
        info["compiler"] = f"NVRTC {major}.{minor}"
    except Exception:  # noqa: BLE001
        pass
    try:
        import torch
        info["cuda"] = torch.version.cuda
        info["torch"] = torch.__version__
    except Exception:  # noqa: BLE001
        pass
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=uuid,driver_version,clocks.sm,clocks.max.sm,power.limit",
             "--format=csv,noheader,nounits", "-i", "0"], capture_output=True, text=True, timeout=20)
        uuid, drv, sm, sm_max, power = [x.strip() for x in out.stdout.strip().split(",")]
        info.update(uuid=uuid, driver=drv, sm_clock_mhz=sm, sm_clock_max_mhz=sm_max,
                    power_limit_w=power)
    except Exception:  # noqa: BLE001
        pass
    return info


def parent_main(args) -> int:
    t_start = time.time()
    deadline = t_start + args.budget
    device, arch = device_spec_from_driver() if not args.compile_only else (None, args.arch)
    if device is None:
        from tunefw.device import H200
        device = H200
    corr = correctness_plan(device, args.n_random)
    timing = timing_plan(device)
    work = Path(tempfile.mkdtemp(prefix="mma_sm80_check_"))
    (work / "cubins").mkdir()
    jobs = [(family_source(), T.name_expression(i["config"], i["dtype"])) for i in corr + timing]
    jobs += [(PEAK_SOURCE, f"mma_peak<{d}, {c}>") for d in (0, 1) for c in (4, 8, 16)]
    t0 = time.time()
    compiled = precompile(work / "cubins", jobs, arch)
    bad = {k: v for k, v in compiled.items() if not v.get("ok")}
    print(f"compiled {len(compiled)} kernels for {arch} in {time.time() - t0:.1f}s "
          f"({len(bad)} failed); correctness items {len(corr)}, timing items {len(timing)}")
    for k, v in list(bad.items())[:3]:
        print(f"  COMPILE_ERROR {k}: {v.get('log', '')[-600:]}")
    compiled_path = work / "compiled.json"
    compiled_path.write_text(json.dumps({k: v for k, v in compiled.items()}))
    if args.compile_only:
        return 1 if bad else 0

    peak_rows = run_part("peak", work, None, compiled_path, min(deadline, time.time() + 60))
    timing_rows = run_part("timing", work, timing, compiled_path,
                           min(deadline - 60, time.time() + 150))
    corr_rows = run_part("correctness", work, corr, compiled_path, deadline)

    peak = {}
    for r in peak_rows:
        if r.get("status") == "OK":
            peak[r["dtype"]] = max(peak.get(r["dtype"], 0.0), r["tflops"])
    statuses = {}
    for r in corr_rows + timing_rows:
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    wrong = [r for r in corr_rows + timing_rows if r["status"] in ("WRONG_ANSWER", "RUNTIME_CRASH", "ERROR")]
    rows = []
    for shape in TIMING_SHAPES:
        ok = [r for r in timing_rows if r["shape"] == list(shape) and r["status"] == "OK"]
        for r in sorted(ok, key=lambda r: -r["tflops"]):
            rows.append({"family": T.family, "dtype": r["dtype"], "M": shape[0], "N": shape[1],
                         "K": shape[2], "config": r["config"], "tflops": round(r["tflops"], 1),
                         "cublas_tflops": round(r["cublas_tflops"], 1), "ratio": round(r["ratio"], 3),
                         "median_ms": r["median_ms"], "min_ms": r["min_ms"]})
    result = {
        "script": SCRIPT, "date": _dt.date.today().isoformat(), "device": fingerprint(device),
        "mma_sync_peak_tflops": round(peak.get("bf16", 0.0), 1),
        "mma_sync_peak_tflops_fp16": round(peak.get("fp16", 0.0), 1),
        "rows": rows,
        "correctness": {"configs_checked": len(corr_rows), "statuses": statuses,
                        "wrong": len(wrong),
                        "failures": [{k: r.get(k) for k in ("name", "shape", "dtype", "status", "reason")}
                                     for r in wrong][:40],
                        "items": [{k: r.get(k) for k in ("name", "shape", "dtype", "status", "rel_err")}
                                  for r in corr_rows]},
        "peak_rows": peak_rows,
        "wall_s": round(time.time() - t_start, 1),
    }
    out_dir = os.environ.get("OUT")
    if out_dir:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / "mma_sm80_gpu_check.json").write_text(json.dumps(result, indent=1))
    # ---- short table last ----
    print(f"\ncorrectness: {len(corr_rows)} config/shape items, statuses {statuses}")
    for r in wrong[:10]:
        print(f"  {r['status']}: {r.get('name')} {r.get('shape')} {r.get('dtype')}: {str(r.get('reason'))[:300]}")
    print(f"mma.sync m16n8k16 register-only peak: bf16 {peak.get('bf16', 0):.1f} TFLOP/s, "
          f"fp16 {peak.get('fp16', 0):.1f} TFLOP/s")
    print(f"{'shape':>16} {'TFLOP/s':>8} {'cuBLAS':>8} {'ratio':>6}  config")
    for r in rows:
        c = r["config"]
        cfg = (f"{c['BM']}x{c['BN']}x{c['BK']} w{c['WM']}x{c['WN']} s{c['STAGES']} sw{c['SWIZZLE']} "
               f"db{c['DBUF']} r{c['RASTER']}g{c['GROUP']} sk{c['SPLIT_K']} ep{c['EPILOGUE']}")
        print(f"{r['M']}x{r['N']}x{r['K']:>6} {r['tflops']:8.1f} {r['cublas_tflops']:8.1f} {r['ratio']:6.3f}  {cfg}")
    bad_timing = [r for r in timing_rows if r["status"] != "OK"]
    for r in bad_timing[:5]:
        print(f"  timing item {r.get('name')} {r.get('shape')}: {r['status']} {str(r.get('reason'))[:200]}")
    print(f"wall {time.time() - t_start:.0f}s; work dir {work}")
    return 0 if not wrong else 2


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compile-only", action="store_true", help="plan + NVRTC compile, no GPU")
    ap.add_argument("--arch", default="sm_90", help="arch for --compile-only")
    ap.add_argument("--n-random", type=int, default=40, help="random valid configs in the sweep")
    ap.add_argument("--budget", type=float, default=TOTAL_BUDGET_S, help="seconds for everything")
    ap.add_argument("--child", choices=["peak", "timing", "correctness"], help=argparse.SUPPRESS)
    ap.add_argument("--jsonl", help=argparse.SUPPRESS)
    ap.add_argument("--cache", help=argparse.SUPPRESS)
    ap.add_argument("--plan", help=argparse.SUPPRESS)
    ap.add_argument("--compiled", help=argparse.SUPPRESS)
    ap.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        args.part = args.child
        return child_main(args)
    return parent_main(args)


if __name__ == "__main__":
    sys.exit(main())
