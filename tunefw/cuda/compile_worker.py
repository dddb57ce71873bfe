"""One compiler process: NVRTC (or nvcc) compiles one request at a time, read on stdin and
answered on stdout (tunefw.framing), with the ptxas figures; ``Worker`` is the caller's handle on
it, killed (with nvcc's children) when it overruns its deadline or dies."""
from __future__ import annotations

import os
import pickle
import re
import select
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tunefw.framing import helper_pythonpath, recv, send

WORKER_START_TIMEOUT_S = 120.0


def _ptxas_resources(log: str, lowered: str) -> dict:
    """Registers, static smem and spill bytes of one entry function from a `ptxas -v` log."""
    start = log.find(f"Compiling entry function '{lowered}'")
    if start < 0:
        return {"regs": None, "smem": None, "spill_bytes": None}
    end = log.find("Compiling entry function", start + 1)
    block = log[start:end if end > 0 else len(log)]
    regs = re.search(r"Used (\d+) registers", block)
    smem = re.search(r"(\d+) bytes smem", block)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", block)
    return {"regs": int(regs.group(1)) if regs else None,
            "smem": int(smem.group(1)) if smem else 0,
            "spill_bytes": int(spill.group(1)) + int(spill.group(2)) if spill else None}


def _nvrtc_compile(req: dict) -> dict:
    from cuda.bindings import nvrtc

    ok = nvrtc.nvrtcResult.NVRTC_SUCCESS
    name = req["name"].encode()
    err, prog = nvrtc.nvrtcCreateProgram(req["source"].encode(), Path(req["source_path"]).name.encode(),
                                         0, [], [])
    if err != ok:
        return {"ok": False, "log": f"nvrtcCreateProgram: {err.name}"}
    try:
        nvrtc.nvrtcAddNameExpression(prog, name)
        options = [o.encode() for o in req["options"]]
        (result,) = nvrtc.nvrtcCompileProgram(prog, len(options), options)
        _, size = nvrtc.nvrtcGetProgramLogSize(prog)
        log = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, log)
        log_text = log.rstrip(b"\0 ").decode(errors="replace")
        if result != ok:
            return {"ok": False, "log": f"{result.name}\n{log_text}"}
        err, lowered = nvrtc.nvrtcGetLoweredName(prog, name)
        if err != ok:
            return {"ok": False, "log": f"nvrtcGetLoweredName({req['name']}): {err.name}\n{log_text}"}
        _, size = nvrtc.nvrtcGetCUBINSize(prog)
        cubin = b" " * size
        nvrtc.nvrtcGetCUBIN(prog, cubin)
        return {"ok": True, "log": log_text, "cubin": cubin, "lowered": lowered.decode()}
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _nvcc_entry(log: str, name: str) -> str | None:
    """The mangled entry function that instantiates ``name`` (nvcc has no lowered-name API)."""
    entries = re.findall(r"Compiling entry function '([^']+)'", log)
    base = name.split("<", 1)[0].split("::")[-1].strip()
    matches = [e for e in entries if f"{len(base)}{base}I" in e]
    return matches[0] if len(matches) == 1 else (entries[0] if len(entries) == 1 else None)


def _nvcc_compile(req: dict) -> dict:
    with tempfile.TemporaryDirectory(prefix="tunefw-nvcc-") as tmp:
        unit = Path(tmp) / "unit.cu"
        unit.write_text(f'#include "{req["source_path"]}"\n'
                        f'static void* const tunefw_instance = (void*)&{req["name"]};\n')
        out = Path(tmp) / "unit.cubin"
        proc = subprocess.run([req["nvcc"], "-cubin", "-o", str(out), *req["options"],
                               "-diag-suppress=177", str(unit)], capture_output=True, text=True)
        log = proc.stdout + proc.stderr
        if proc.returncode != 0:
            return {"ok": False, "log": f"nvcc exited with {proc.returncode}\n{log}"}
        lowered = _nvcc_entry(log, req["name"])
        if lowered is None:
            return {"ok": False, "log": f"cannot tell which entry function is {req['name']}\n{log}"}
        return {"ok": True, "log": log, "cubin": out.read_bytes(), "lowered": lowered}


def _run_request(req: dict) -> dict:
    """Compile one request; adds the compile time and the ptxas resource figures."""
    start = time.perf_counter()
    result = (_nvrtc_compile if req["backend"] == "nvrtc" else _nvcc_compile)(req)
    result["seconds"] = time.perf_counter() - start
    if result["ok"]:
        result.update(_ptxas_resources(result["log"], result["lowered"]))
    return result


def serve() -> None:
    """Worker process main loop: read requests on stdin, answer on the original stdout."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything a library prints goes to stderr, never into the protocol
    backend = sys.argv[1] if len(sys.argv) > 1 else "nvrtc"
    if backend == "nvrtc":
        from cuda.bindings import nvrtc  # noqa: F401  (imported before 'ready': not timed per compile)
    send(out, "ready")
    while (req := recv(sys.stdin.buffer)) is not None:
        send(out, _run_request(req))


class WorkerGone(Exception):
    """The worker died or overran its deadline; it has been killed."""


class Worker:
    """One compiler process in its own process group (nvcc's children die with it)."""

    def __init__(self, backend: str) -> None:
        env = dict(os.environ, PYTHONPATH=helper_pythonpath())
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from tunefw.cuda.compile_worker import serve; serve()", backend],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, start_new_session=True)
        try:
            ready = self._read(time.monotonic() + WORKER_START_TIMEOUT_S)
        except WorkerGone as gone:
            raise WorkerGone(f"compiler process failed to start ({gone})") from None
        if ready != "ready":
            raise WorkerGone(f"compiler process failed to start ({self.kill()})")

    def _read_exact(self, n: int, deadline: float) -> bytes:
        fd = self.proc.stdout.fileno()
        chunks, got = [], 0
        while got < n:
            if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
                raise WorkerGone(self.kill(timed_out=True))
            chunk = os.read(fd, n - got)
            if not chunk:
                raise WorkerGone(self.kill())
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def _read(self, deadline: float) -> Any:
        size = struct.unpack("<Q", self._read_exact(8, deadline))[0]
        return pickle.loads(self._read_exact(size, deadline))

    def run(self, request: dict, timeout_s: float) -> dict:
        """Send one request and wait for its answer until the deadline (then kill)."""
        try:
            send(self.proc.stdin, request)
        except BrokenPipeError:
            raise WorkerGone(self.kill()) from None
        return self._read(time.monotonic() + timeout_s)

    def kill(self, timed_out: bool = False) -> str:
        """Kill the process group; returns what happened, for the compile log."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        code = self.proc.wait()
        if timed_out:
            return "timeout"
        return f"compiler process exited with code {code}" + (" (killed: out of memory?)" if code == -9 else "")

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            self.kill()
