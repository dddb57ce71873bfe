"""Kernel templates -> cubins: NVRTC (nvcc as fallback) in killable worker processes, cached.

A compile runs in a separate worker process (tunefw/cuda/compile_worker.py), so one that never
ends is killed at its timeout (COMPILE_TIMEOUT) without harming the caller; its log is kept on
failure (COMPILE_ERROR). Results live in a content-addressed disk cache keyed by everything that
changes the cubin, and a cache hit is answered in the calling process without touching a worker.
"""
from __future__ import annotations

import atexit
import functools
import hashlib
import json
import os
import queue
import re
import shutil
import subprocess
import tempfile
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from tunefw.cuda.compile_worker import Worker, WorkerGone
from tunefw.errors import UserError
from tunefw.outcome import Status
from tunefw.templates.base import TEMPLATE_DIR, KernelTemplate, source_files

FLAGS = ("-std=c++17", "--ptxas-options=-v")
CACHE_FORMAT = 1  # bump when the stored metadata changes meaning
_ARCH = re.compile(r"^sm_(\d{2,3})(a?)$")


# ---- results -------------------------------------------------------------------------------
@dataclass
class CompileResult:
    """One compile (or cache hit): the cubin and what ptxas said about the kernel."""

    status: Status
    cubin: bytes | None
    lowered_name: str
    log: str
    regs: int | None
    smem: int | None  # static shared memory in bytes
    spill_bytes: int | None  # spill stores + spill loads
    seconds: float  # compile time in the worker, or the cache lookup time on a hit
    cached: bool
    key: str

    @property
    def ok(self) -> bool:
        return self.status == Status.OK


# ---- compiler choice ----------------------------------------------------------------------
@dataclass(frozen=True)
class CompilerInfo:
    """Which compiler builds cubins here: 'nvrtc' (preferred) or 'nvcc', and its version."""

    backend: str
    version: str
    nvcc: str | None = None

    @property
    def label(self) -> str:
        return f"{self.backend} {self.version}"


def _nvrtc_info() -> CompilerInfo | None:
    try:
        from cuda.bindings import nvrtc
        err, major, minor = nvrtc.nvrtcVersion()
    except Exception:  # no cuda-bindings, or libnvrtc cannot be loaded
        return None
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        return None
    return CompilerInfo("nvrtc", f"{major}.{minor}")


def _nvcc_info() -> CompilerInfo | None:
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    nvcc = shutil.which("nvcc") or (home and shutil.which("nvcc", path=str(Path(home) / "bin")))
    if not nvcc:
        return None
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    match = re.search(r"\bV(\d+\.\d+\.\d+)", out)
    return CompilerInfo("nvcc", match.group(1) if match else "unknown", nvcc)


@functools.cache
def compiler_info() -> CompilerInfo:
    """NVRTC when it loads, else nvcc; TUNEFW_COMPILER=nvcc|nvrtc forces one."""
    forced = os.environ.get("TUNEFW_COMPILER", "")
    if forced not in ("", "nvrtc", "nvcc"):
        raise UserError(f"TUNEFW_COMPILER={forced!r}: expected nvrtc or nvcc")
    order = {"nvrtc": (_nvrtc_info,), "nvcc": (_nvcc_info,)}.get(forced, (_nvrtc_info, _nvcc_info))
    for probe in order:
        info = probe()
        if info:
            return info
    raise UserError("no CUDA compiler: install nvidia-cuda-nvrtc and cuda-bindings, or put nvcc on PATH")


# ---- cache keys ---------------------------------------------------------------------------
def check_arch(arch: str) -> str:
    """Validate a compile target such as sm_80, sm_90 or sm_90a."""
    if not _ARCH.match(arch):
        raise UserError(f"arch {arch!r}: expected sm_XY or sm_XYa, e.g. sm_80, sm_90a")
    return arch


def undeclared_includes(template: KernelTemplate, root: Path) -> list[str]:
    """Files under ``root`` the template's source includes (recursively) that its declared
    ``headers`` leave out: their edits would not reach the family's source hash."""
    if template.headers is None:  # not declared: the hash follows the includes themselves
        return []
    root = Path(root).resolve()
    declared = {p.resolve() for p in template.source_paths(root)}
    found = source_files(root / template.source, (root / "include", root))
    return sorted(p.relative_to(root).as_posix() for p in found
                  if p.is_relative_to(root) and p not in declared)


def cache_root(cache_dir: Path | str | None) -> Path:
    """The cache directory: the argument, else $TUNEFW_CACHE_DIR, else ~/.cache/tunefw."""
    if cache_dir:
        return Path(cache_dir).expanduser()
    env = os.environ.get("TUNEFW_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "tunefw"


@dataclass
class _Job:
    """Everything a worker needs for one compile, plus where its result is cached."""

    key: str
    request: dict
    timeout_s: float
    cache: "_Cache"


def prepare_compile(template: KernelTemplate, config: Mapping[str, Any], dtype: str, arch: str,
                    source_dir: Path | None, cache_dir: Path | str | None,
                    timeout_s: float, gate: str = "none") -> _Job:
    """Read the sources, build the options and the content-addressed key for one compile."""
    check_arch(arch)
    root = Path(source_dir or TEMPLATE_DIR).resolve()
    source = root / template.source
    if not source.is_file():
        raise UserError(f"family {template.family}: template source {source} not found")
    include = root / "include"
    info = compiler_info()
    name = template.name_expression(config, dtype, gate)
    undeclared = undeclared_includes(template, root)
    if undeclared:
        raise UserError(f"family {template.family}: {template.source} includes "
                        f"{', '.join(undeclared)}, not declared in its headers")
    # The family's one source hash (template + declared headers), as result reuse uses it.
    identity = json.dumps({"sources": template.source_hash(root), "name": name, "arch": arch,
                           "flags": FLAGS, "compiler": info.label, "format": CACHE_FORMAT})
    key = hashlib.sha256(identity.encode()).hexdigest()
    options = [f"--gpu-architecture={arch}", *FLAGS, f"-I{include}", f"-I{root}"]
    request = {"backend": info.backend, "nvcc": info.nvcc, "source": source.read_text(),
               "source_path": str(source), "name": name, "options": options}
    return _Job(key, request, timeout_s, _Cache(cache_root(cache_dir)))


# ---- disk cache ---------------------------------------------------------------------------
class _Cache:
    """cubin + JSON metadata per key, each written to a temporary file and renamed into place."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _paths(self, key: str) -> tuple[Path, Path]:
        folder = self.root / key[:2]
        return folder / f"{key}.cubin", folder / f"{key}.json"

    def load(self, key: str) -> CompileResult | None:
        start = time.perf_counter()
        cubin_path, meta_path = self._paths(key)
        try:
            meta = json.loads(meta_path.read_text())
            cubin = cubin_path.read_bytes() if meta["status"] == Status.OK.value else None
        except (OSError, ValueError, KeyError):
            return None
        return CompileResult(Status(meta["status"]), cubin, meta["lowered_name"], meta["log"],
                             meta["regs"], meta["smem"], meta["spill_bytes"],
                             time.perf_counter() - start, True, key)

    def store(self, result: CompileResult) -> None:
        cubin_path, meta_path = self._paths(result.key)
        cubin_path.parent.mkdir(parents=True, exist_ok=True)
        if result.cubin is not None:
            _write_atomic(cubin_path, result.cubin)
        meta = {"status": result.status.value, "lowered_name": result.lowered_name, "log": result.log,
                "regs": result.regs, "smem": result.smem, "spill_bytes": result.spill_bytes,
                "compile_seconds": result.seconds}
        _write_atomic(meta_path, json.dumps(meta).encode())


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# ---- the pool -----------------------------------------------------------------------------
class CompilePool:
    """Compiles in parallel on N worker processes (started on demand), with per-compile timeouts.

    Cache hits complete at once in the caller; identical compiles in flight share one future.
    """

    def __init__(self, workers: int | None = None, *, cache_dir: Path | str | None = None,
                 timeout_s: float = 120.0, source_dir: Path | None = None) -> None:
        self.workers = max(1, workers or os.cpu_count() or 1)
        self.cache_dir = cache_dir
        self.timeout_s = timeout_s
        self.source_dir = source_dir
        self._queue: queue.Queue[tuple[_Job, Future] | None] = queue.Queue()
        self._inflight: dict[str, Future] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._threads = [threading.Thread(target=self._slot, name=f"tunefw-compile-{i}", daemon=True)
                         for i in range(self.workers)]
        for thread in self._threads:
            thread.start()

    def submit(self, template: KernelTemplate, config: Mapping[str, Any], dtype: str, arch: str,
               *, timeout_s: float | None = None, gate: str = "none") -> Future:
        """A future CompileResult for one config; raises UserError on bad arch or missing source."""
        job = prepare_compile(template, config, dtype, arch, self.source_dir, self.cache_dir,
                              self.timeout_s if timeout_s is None else timeout_s, gate)
        return self.submit_job(job)

    def submit_job(self, job: _Job) -> Future:
        hit = job.cache.load(job.key)
        if hit is not None:
            done: Future = Future()
            done.set_result(hit)
            return done
        with self._lock:
            if self._closed:
                raise RuntimeError("CompilePool is closed")
            if job.key in self._inflight:
                return self._inflight[job.key]
            future: Future = Future()
            self._inflight[job.key] = future
        self._queue.put((job, future))
        return future

    def _slot(self) -> None:
        """One worker slot: takes jobs, (re)starts its process when needed, records results."""
        worker: Worker | None = None
        while (item := self._queue.get()) is not None:
            job, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                worker = worker or Worker(job.request["backend"])
                result = self._result(job, worker.run(job.request, job.timeout_s))
                job.cache.store(result)  # compile errors too: the key pins every input
            except WorkerGone as gone:
                worker = None
                result = self._failure(job, str(gone))
            except BaseException as exc:  # keep the slot alive; the caller sees the error
                with self._lock:
                    self._inflight.pop(job.key, None)
                future.set_exception(exc)
                continue
            with self._lock:
                self._inflight.pop(job.key, None)
            future.set_result(result)
        if worker:
            worker.close()

    @staticmethod
    def _result(job: _Job, answer: dict) -> CompileResult:
        status = Status.OK if answer["ok"] else Status.COMPILE_ERROR
        return CompileResult(status, answer.get("cubin"), answer.get("lowered", ""), answer["log"],
                             answer.get("regs"), answer.get("smem"), answer.get("spill_bytes"),
                             answer["seconds"], False, job.key)

    @staticmethod
    def _failure(job: _Job, what: str) -> CompileResult:
        if what == "timeout":
            return CompileResult(Status.COMPILE_TIMEOUT, None, "", f"compile exceeded {job.timeout_s:g} s "
                                 f"and was killed ({job.request['name']})", None, None, None,
                                 job.timeout_s, False, job.key)
        return CompileResult(Status.COMPILE_ERROR, None, "", what, None, None, None, 0.0, False, job.key)

    def close(self) -> None:
        """Cancel queued compiles, let running ones finish, stop the worker processes."""
        with self._lock:
            self._closed = True
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item:
                item[1].cancel()
        for _ in self._threads:
            self._queue.put(None)
        for thread in self._threads:
            thread.join()

    def __enter__(self) -> "CompilePool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@functools.cache
def _shared_pool() -> CompilePool:
    pool = CompilePool()
    atexit.register(pool.close)
    return pool


# A forked child inherits the cached pool but not its threads: it must start its own.
os.register_at_fork(after_in_child=_shared_pool.cache_clear)


def compile_kernel(template: KernelTemplate, config: Mapping[str, Any], dtype: str, arch: str, *,
                   cache_dir: Path | str | None = None, timeout_s: float = 120.0,
                   source_dir: Path | None = None, gate: str = "none") -> CompileResult:
    """Compile one config (in a worker process of a shared pool) or return its cached cubin."""
    job = prepare_compile(template, config, dtype, arch, source_dir, cache_dir, timeout_s, gate)
    return _shared_pool().submit_job(job).result()


# ---- SASS checks --------------------------------------------------------------------------
def cuobjdump_path() -> str:
    """cuobjdump from the nvidia-cuda-cuobjdump wheel, else from PATH."""
    try:
        from cuda.pathfinder import find_nvidia_binary_utility
        found = find_nvidia_binary_utility("cuobjdump")
    except Exception:  # cuda-pathfinder missing or too old
        found = None
    found = found or shutil.which("cuobjdump")
    if not found:
        raise UserError("cuobjdump not found: pip install nvidia-cuda-cuobjdump")
    return found


def sass_opcodes(cubin: bytes) -> list[str]:
    """The opcodes (with modifiers, e.g. 'STL.64') of every SASS instruction in a cubin."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        proc = subprocess.run([cuobjdump_path(), "-sass", f.name], capture_output=True, text=True,
                              timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"cuobjdump failed: {proc.stderr.strip()}")
    return re.findall(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)",
                      proc.stdout, re.MULTILINE)


def sass_check(cubin: bytes, require_hgmma: bool = False, require_op: str | None = None) -> str | None:
    """Why the SASS is unacceptable: local memory use, or no ``require_op`` (e.g. HMMA for
    mma.sync) / HGMMA (``require_hgmma``) where the family's tensor-core op is required."""
    bases = [op.split(".", 1)[0] for op in sass_opcodes(cubin)]
    local = sum(base in ("LDL", "STL") for base in bases)
    if local:
        return f"SASS touches local memory: {local} LDL/STL instructions (spills or stack arrays)"
    if require_hgmma and "HGMMA" not in bases:
        return "SASS has no HGMMA instruction (wgmma not used)"
    if require_op and require_op not in bases:
        return f"SASS has no {require_op} instruction (tensor cores not used)"
    return None
