"""What every GPU script's result file carries and where it goes: the commit measured (given, for
a device tree without git metadata, else git's), the device from a worker's fingerprint, and the
path ($OUT/NAME, else benchmarks/results/NAME)."""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parent.parent
DEVICE_KEYS = ("name", "uuid", "cc", "sm_count", "driver", "cuda", "compiler", "method",
               "sm_clock_mhz", "power_limit_w", "power_w", "temperature_c")


def commit(given: str | None = None) -> str | None:
    """``given``, else $TUNEFW_COMMIT (set on a device tree without git metadata), else HEAD of
    the repository (None where neither is known)."""
    if given or os.environ.get("TUNEFW_COMMIT"):
        return given or os.environ["TUNEFW_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             cwd=REPO, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def smi() -> dict:
    """The GPU as nvidia-smi reports it now (clocks, power, temperature), or why not."""
    fields = ("name,driver_version,pstate,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,"
              "temperature.gpu,power.draw,power.limit")
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return {"error": str(exc)}
    return dict(zip(fields.split(","), (v.strip() for v in out.splitlines()[0].split(","))))


def report_header(script: str, given_commit: str | None = None) -> dict:
    """The fields a torch GPU script's result file starts with: the script, the commit measured,
    the GPU's name, nvidia-smi's reading now and torch's version."""
    import torch

    return {"script": script, "commit": commit(given_commit), "gpu": torch.cuda.get_device_name(),
            "nvidia_smi": smi(), "torch": torch.__version__}


def device(fingerprint: dict) -> dict:
    """The device keys of a worker's fingerprint (None where it has none)."""
    return {k: fingerprint.get(k) for k in DEVICE_KEYS}


def card_tag() -> str | None:
    """The CUDA device's model as result files name it ('h100', 'h200'; None without one)."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    found = re.search(r"\b([A-Z]\d{2,3})\b", torch.cuda.get_device_name(0))
    return found.group(1).lower() if found else None


def out_path(name: str, given: Path | None = None) -> Path:
    """``given``, else $OUT/NAME, else benchmarks/results/NAME, where NAME's '_h200' becomes the
    GPU the script runs on (a device call asking for an H200 may get an H100: its results are
    never filed as an H200's)."""
    if given:
        return given
    tag = card_tag()
    if tag and tag != "h200":
        name = name.replace("_h200", f"_{tag}")
    return Path(os.environ.get("OUT") or REPO / "benchmarks" / "results") / name


def write(result: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(f"wrote {path}")


def guarded(part: Callable[[], dict]) -> dict:
    """The part's result with its wall time, or its error (the run goes on to the next part)."""
    start = time.monotonic()
    try:
        out = part()
    except Exception as exc:
        out = {"error": f"{type(exc).__name__}: {exc}",
               "traceback": traceback.format_exc().splitlines()[-12:]}
    return {**out, "seconds": round(time.monotonic() - start, 1)}


def child_json(cmd: list[str], failed: dict, timeout_s: float = 300) -> dict:
    """The last JSON line a child process printed, or ``failed`` with the end of its stderr
    (scripts that measure each case in a fresh process)."""
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode == 0 and lines:
        return json.loads(lines[-1])
    return {**failed, "error": done.stderr.strip().splitlines()[-3:]}


def table_probe_parser(doc: str, shapes: str, processes: int, pairs: int) -> argparse.ArgumentParser:
    """The arguments of a script that probes a dispatch table's shapes in fresh processes
    (--table, --cubins, --shapes, --processes, --pairs, --seed, --commit, --out; --child is the
    parent's call of itself)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--table", required=True)
    ap.add_argument("--cubins")
    ap.add_argument("--shapes", default=shapes, help="MxNxK list")
    ap.add_argument("--processes", type=int, default=processes, help="fresh processes")
    ap.add_argument("--pairs", type=int, default=pairs, help="flushed pairs timed a shape")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--commit")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return ap


def probe_child_command(script: str, args: argparse.Namespace) -> list[str]:
    """A table_probe_parser script's call of itself as a child (what every child shares; the
    caller appends --seed and its own)."""
    return ([sys.executable, script, "--child", "--table", args.table, "--shapes", args.shapes,
             "--pairs", str(args.pairs)] + (["--cubins", args.cubins] if args.cubins else []))
