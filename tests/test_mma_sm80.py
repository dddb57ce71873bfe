"""CPU tests of the mma_sm80 family: the space, check(), launch, and NVRTC compiles.

Correctness of the kernel's results needs a GPU: benchmarks/mma_sm80_gpu_check.py.

The one-parameter-at-a-time compile set (every value check() allows) builds each move on sm_90
bf16 and once more on another (dtype, arch) variant in turn, in a process pool; set
TUNEFW_QUICK=1 to compile only sm_90 bf16 there.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from cubin import kernel_text
from space import sample_space, shuffled_valid

REPO = Path(__file__).resolve().parent.parent
TEMPLATES = REPO / "kernel_templates"


from tunefw.templates.mma_sm80 import MmaSm80  # noqa: E402

from tunefw.device import A100, H200, DeviceSpec  # noqa: E402
from tunefw.problem import GemmProblem  # noqa: E402

T = MmaSm80()
BIG = GemmProblem(4096, 4096, 4096)
QUICK = os.environ.get("TUNEFW_QUICK", "") not in ("", "0")
WORKERS = max(1, min(4, os.cpu_count() or 1))


# ---- compiling --------------------------------------------------------------------------------
@dataclass
class Compiled:
    ok: bool
    cubin: bytes
    lowered_name: str
    log: str
    regs: int | None
    smem: int | None
    spill_bytes: int | None


def _parse_ptxas(log: str) -> tuple[int | None, int | None, int | None]:
    regs = re.search(r"Used (\d+) registers", log)
    smem = re.search(r"(\d+) bytes smem", log)
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    return (int(regs.group(1)) if regs else None,
            int(smem.group(1)) if smem else 0,
            sum(int(a) + int(b) for a, b in spills) if spills else None)


def nvrtc_compile(name_expr: str, arch: str, extra_source: str = "") -> Compiled:
    """Compile one instantiation with NVRTC (ptxas -v for the resource report)."""
    from cuda.bindings import nvrtc

    def ok(res):
        if res[0] != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise RuntimeError(f"NVRTC: {res[0]}")
        return res[1] if len(res) > 1 else None

    src = f'#include "{MmaSm80.source}"\n{extra_source}'.encode()
    prog = ok(nvrtc.nvrtcCreateProgram(src, b"mma_sm80_test.cu", 0, [], []))
    try:
        ok(nvrtc.nvrtcAddNameExpression(prog, name_expr.encode()))
        opts = [f"--gpu-architecture={arch}", "-std=c++17", f"-I{TEMPLATES}",
                f"-I{TEMPLATES / 'include'}", "--ptxas-options=-v"]
        res = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        size = ok(nvrtc.nvrtcGetProgramLogSize(prog))
        buf = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, buf)
        log = buf.decode(errors="replace").rstrip("\x00")
        if res[0] != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            return Compiled(False, b"", "", log, None, None, None)
        lowered = ok(nvrtc.nvrtcGetLoweredName(prog, name_expr.encode()))
        lowered = lowered.decode() if isinstance(lowered, bytes) else lowered
        size = ok(nvrtc.nvrtcGetCUBINSize(prog))
        cubin = b" " * size
        nvrtc.nvrtcGetCUBIN(prog, cubin)
        regs, smem, spills = _parse_ptxas(log)
        return Compiled(True, cubin, lowered, log, regs, smem, spills)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def compile_config(config: dict, dtype: str = "bf16", arch: str = "sm_90") -> Compiled:
    """One config through tunefw's compiler (cached)."""
    from tunefw.cuda.compiler import compile_kernel
    return _compiled(compile_kernel(T, config, dtype, arch))


def _compiled(r) -> Compiled:
    return Compiled(r.ok, r.cubin or b"", r.lowered_name or "", r.log or "", r.regs, r.smem,
                    r.spill_bytes)


def compile_many(jobs):
    """Compile (config, dtype, arch) jobs in parallel through tunefw's own compile pool, into
    the session's cubin cache (conftest), so tests that build the same kernel build it once."""
    from tunefw.cuda.compiler import CompilePool
    with CompilePool(WORKERS) as pool:
        futures = [pool.submit(T, config, dtype, arch) for config, dtype, arch in jobs]
        return [_compiled(f.result()) for f in futures]


# ---- configs ----------------------------------------------------------------------------------
def _repair(config: dict, moved: str, problem: GemmProblem, device: DeviceSpec) -> dict | None:
    """The nearest valid config when a one-knob move breaks a dependent rule (e.g. BM=32 with
    WM=64): shrink the warp tile, then the stage count, never touching the moved knob."""
    if T.check(config, problem, device) is None:
        return config

    def choices(name):
        values = sorted(dict(((p.name, p.values) for p in T.params))[name], reverse=True)
        return [config[name]] if name == moved else [config[name]] + values

    for wm in choices("WM"):
        for wn in choices("WN"):
            for stages in choices("STAGES"):
                c = dict(config, WM=wm, WN=wn, STAGES=stages)
                if T.check(c, problem, device) is None:
                    return c
    return None


def one_at_a_time(device: DeviceSpec = H200, problem: GemmProblem = BIG):
    """(param, value, config) for every non-default value of every parameter that check() allows
    (directly, or after the minimal repair of dependent knobs)."""
    default = T.default_config()
    out = []
    for p in T.params:
        for v in p.values[1:]:
            moved = dict(default, **{p.name: v})
            fixed = _repair(moved, p.name, problem, device)
            if fixed is not None and fixed[p.name] == v:
                out.append((p.name, v, fixed))
    return out


def test_default_config_is_valid():
    c = T.default_config()
    assert c == dict(BM=128, BN=128, BK=32, WM=64, WN=64, STAGES=4, SWIZZLE=1, DBUF=1, RASTER=0,
                     GROUP=8, SPLIT_K=1, EPILOGUE=0)
    for dev in (H200, A100):
        assert T.check(c, BIG, dev) is None


def test_template_args_follow_the_kernel_signature():
    text = (TEMPLATES / MmaSm80.source).read_text()
    decl = re.search(r"template\s*<([^>]*)>\s*__global__", text).group(1)
    names = [re.sub(r"/\*.*?\*/", "", part).split()[-1] for part in decl.split(",")]
    assert names == ["DTYPE"] + list(T.param_names)
    c = T.default_config()
    assert T.name_expression(c, "bf16") == "gemm_mma_sm80<0, 128, 128, 32, 64, 64, 4, 1, 1, 0, 8, 1, 0>"
    assert T.template_args(c, "fp16")[0] == "1"
    sig = re.search(r"gemm_mma_sm80\(([^)]*)\)", text).group(1)
    assert [a.split()[-1].lstrip("*") for a in sig.split(",")] == ["A", "B", "C", "workspace", "M", "N", "K"]


def test_every_param_value_is_reachable():
    """Every declared value of every knob appears in some valid one-at-a-time config."""
    seen = {(p, v) for p, v, _ in one_at_a_time()}
    for p in T.params:
        for v in p.values[1:]:
            assert (p.name, v) in seen, f"{p.name}={v} never valid near the default"


def test_launch_geometry_and_args():
    c = T.default_config()
    prob = GemmProblem(4095, 4104, 4104)
    launch = T.launch(c, prob, H200)
    assert launch.grid == (32 * 33, 1, 1) and launch.block == (128, 1, 1)
    assert launch.smem_bytes == 4 * 256 * 32 * 2 and launch.workspace_bytes == 0
    c2 = dict(c, SPLIT_K=4)
    launch2 = T.launch(c2, prob, H200)
    tiles = 32 * 33
    assert launch2.grid == (tiles, 1, 4)
    assert launch2.workspace_bytes == ((tiles * 4 + 255) // 256) * 256 + tiles * 4 * 128 * 128 * 4
    args = T.kernel_args(c, prob, {"a": 1, "b": 2, "c": 3, "workspace": 4})
    import ctypes
    assert [v for v, _ in args] == [1, 2, 3, 4, 4095, 4104, 4104]
    assert [t for _, t in args] == [ctypes.c_void_p] * 4 + [ctypes.c_int] * 3


REJECTS = [
    # (changes, problem, device, text the reason must mention)
    (dict(BM=32, WM=64), BIG, H200, "WM"),
    (dict(BN=32, WN=64), BIG, H200, "WN"),
    (dict(BM=256, BN=256, WM=32, WN=32), BIG, H200, "warps"),
    (dict(BM=256, WM=64), BIG, replace(H200, max_threads_per_block=128), "threads"),
    (dict(BM=256, BN=256, BK=64, STAGES=6), BIG, H200, "shared memory"),
    (dict(BM=256, BK=64, STAGES=6), BIG, A100, "STAGES"),
    (dict(BM=256, BN=256, WM=128, WN=128), BIG, H200, "register"),
    (dict(BM=256, BN=256), BIG, H200, "per SM"),
    (dict(BM=256, BN=32, BK=64, WM=128, WN=32, STAGES=2), BIG, H200, "BM=256"),
    (dict(SPLIT_K=4), GemmProblem(512, 512, 64), H200, "SPLIT_K"),
    (dict(SPLIT_K=4), GemmProblem(512, 512, 160), H200, "SPLIT_K"),
    (dict(SPLIT_K=16), GemmProblem(8192, 8192, 8192), H200, "SPLIT_K"),
    (dict(BM=96), BIG, H200, "BM"),
    (dict(), BIG, replace(H200, cc=75, name="T4"), "compute capability"),
]


@pytest.mark.parametrize("changes,problem,device,needle", REJECTS)
def test_check_rejects_with_a_reason(changes, problem, device, needle):
    config = dict(T.default_config(), **changes)
    reason = T.check(config, problem, device)
    assert reason is not None, f"{changes} should be rejected"
    assert needle in reason and "\n" not in reason, reason


def test_check_accepts_a_share_of_the_space():
    """A sample of the raw space: enough of it is runnable at 4096^3 for samplers to find.
    (check()'s speed is a benchmark's business, not an assert on a shared machine's clock.)"""
    import random
    configs = sample_space(T, random.Random(0), 20000)
    valid = sum(T.check(c, BIG, H200) is None for c in configs)
    assert valid > 500


def test_smem_estimate_is_exact_in_cuda():
    """The kernel's own MmaSm80Smem<...>::bytes equals the Python estimate (static_assert)."""
    configs = [c for _, _, c in one_at_a_time()] + [T.default_config()]
    lines = []
    for c in configs:
        lines.append(
            f"static_assert(tunefw::MmaSm80Smem<{c['BM']}, {c['BN']}, {c['BK']}, {c['STAGES']}, "
            f"{c['EPILOGUE']}>::bytes == {T.estimate(c).smem_bytes}, \"smem\");")
    probe = "\n".join(lines) + "\n"
    r = nvrtc_compile(T.name_expression(T.default_config(), "bf16"), "sm_90", extra_source=probe)
    assert r.ok, r.log


def _sample_configs(n: int = 5, seed: int = 1):
    import itertools
    import random
    picked = list(itertools.islice(shuffled_valid(T, random.Random(seed), BIG, H200), n))
    return [T.default_config(), dict(T.default_config(), BN=256)] + picked


# Registers: ptxas takes what the launch bounds allow (up to 255 with few threads), so its count
# can sit well above the need; the estimate is calibrated so that accepted configs never spill
# (asserted below) and stays within this many registers of ptxas's count.
REG_TOLERANCE = 64


def test_estimates_match_compiler():
    configs = _sample_configs()
    results = compile_many([(c, "bf16", "sm_90") for c in configs])
    rows = []
    for c, r in zip(configs, results):
        assert r.ok, r.log
        est = T.estimate(c)
        rows.append((c, est.regs_per_thread, r.regs, r.spill_bytes))
        assert r.smem == 0, "the kernel uses dynamic shared memory only"
        assert r.spill_bytes == 0, f"{c}: ptxas spilled {r.spill_bytes} B\n{r.log}"
        assert abs(est.regs_per_thread - r.regs) <= REG_TOLERANCE, rows[-1]
        assert r.regs <= 255


VARIANTS = [("bf16", "sm_90"), ("bf16", "sm_80"), ("fp16", "sm_80"), ("fp16", "sm_90")]


def test_one_at_a_time_compiles():
    """Every value of every knob that check() allows compiles without spilling, on sm_90 bf16
    (the builds test_every_knob_changes_code_or_launch shares through the cache) and once more
    on one of the other (dtype, arch) variants in turn; the default config on all four. About
    60 builds where every move on every variant was 120: dtype and arch change no knob's code
    path that a config of each variant does not also take."""
    moves = [c for _, _, c in one_at_a_time()]
    if QUICK:
        jobs = [(c, "bf16", "sm_90") for c in [T.default_config()] + moves]
    else:
        others = VARIANTS[1:]
        jobs = ([(T.default_config(), d, a) for d, a in VARIANTS]
                + [(c, "bf16", "sm_90") for c in moves]
                + [(c, *others[i % len(others)]) for i, c in enumerate(moves)])
    results = compile_many(jobs)
    bad = [(j, r.log[-2000:]) for j, r in zip(jobs, results) if not r.ok]
    assert not bad, bad[:2]
    spills = [(j, r.spill_bytes) for j, r in zip(jobs, results) if r.spill_bytes]
    assert not spills, spills


def test_every_knob_changes_code_or_launch():
    """Moving any one knob changes the kernel's code or its launch geometry (no knob ignored)."""
    default = T.default_config()
    moves = one_at_a_time()
    jobs = [(default, "bf16", "sm_90"), (default, "fp16", "sm_90")] + [(c, "bf16", "sm_90") for _, _, c in moves]
    results = compile_many(jobs)
    base = kernel_text(results[0].cubin, results[0].lowered_name)
    assert kernel_text(results[1].cubin, results[1].lowered_name) != base, "dtype ignored"
    base_launch = T.launch(default, BIG, H200)
    for (name, value, c), r in zip(moves, results[2:]):
        code = kernel_text(r.cubin, r.lowered_name)
        launch = T.launch(c, BIG, H200)
        assert code != base or launch != base_launch, f"{name}={value} changed nothing"


def _tool(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    try:
        import nvidia
        for root in nvidia.__path__:
            for cand in Path(root).glob(f"*/bin/{name}"):
                return str(cand)
    except ImportError:
        pass
    cand = Path("/usr/local/cuda/bin") / name
    return str(cand) if cand.exists() else None


def sass_of(cubin: bytes, tmp_path: Path) -> str:
    cuobjdump, nvdisasm = _tool("cuobjdump"), _tool("nvdisasm")
    if not cuobjdump or not nvdisasm:
        pytest.skip("cuobjdump/nvdisasm not installed")
    path = tmp_path / "k.cubin"
    path.write_bytes(cubin)
    env = dict(os.environ, PATH=f"{Path(nvdisasm).parent}:{os.environ.get('PATH', '')}")
    return subprocess.run([cuobjdump, "-sass", str(path)], capture_output=True, text=True,
                          check=True, env=env).stdout


@pytest.mark.parametrize("changes", [dict(), dict(BN=256, STAGES=3), dict(SPLIT_K=4, EPILOGUE=1)])
def test_sass_uses_tensor_cores_without_local_memory(changes, tmp_path):
    r = compile_config(dict(T.default_config(), **changes), "bf16", "sm_90")
    assert r.ok, r.log
    sass = sass_of(r.cubin, tmp_path)
    for op in ("HMMA.16816.F32.BF16", "LDSM.16.M88.4", "LDGSTS"):
        assert op in sass, op
    assert not re.search(r"\b(LDL|STL)\b", sass), "local memory in the kernel"


def test_nvcc_compiles_the_template(tmp_path):
    nvcc = _tool("nvcc")
    if not nvcc:
        pytest.skip("nvcc not installed")
    c = T.default_config()
    args = ", ".join(T.template_args(c, "fp16"))
    src = tmp_path / "inst.cu"
    src.write_text(f'#include "{MmaSm80.source}"\n'
                   f"template __global__ void gemm_mma_sm80<{args}>(const unsigned short*, "
                   "const unsigned short*, unsigned short*, float*, int, int, int);\n")
    for arch in ("sm_80", "sm_90"):
        subprocess.run([nvcc, "-std=c++17", f"-arch={arch}", "-cubin", f"-I{TEMPLATES}",
                        f"-I{TEMPLATES / 'include'}", "-o", str(tmp_path / f"{arch}.cubin"),
                        str(src)], check=True, capture_output=True, text=True)
