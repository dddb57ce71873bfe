"""ptxas's figures for the winners whose trial stored none (the simulated device, a replay, a
database older than those columns): `tunefw report --ptxas` compiles each such winning config
here (NVRTC, no GPU) for the architecture of the study's device, and the page says which
figures came from the trial and which from this compile."""
from __future__ import annotations

import os
from pathlib import Path

from tunefw.cuda.compiler import CompilePool
from tunefw.report.data import StudyReport
from tunefw.templates import FAMILIES, get_family

FROM_TRIAL, FROM_REPORT = "trial", "compiled for this report"


def compile_missing(data: StudyReport, cache_dir: Path | None = None) -> int:
    """Fill the ptxas figures of every winner that has none by compiling its config (cubins
    cached as a launch's are); marks where each winner's figures came from. Returns how many
    were compiled (none without a known device: no architecture to compile for)."""
    missing = []
    for p in data.problems:
        best = p.best
        if best is None:
            continue
        if best.get("ptxas_regs") is not None:
            best["ptxas_from"] = FROM_TRIAL
        elif data.device is not None and best["family"] in FAMILIES:
            missing.append((p, best))
    if not missing:
        return 0
    with CompilePool(min(os.cpu_count() or 1, len(missing)), cache_dir=cache_dir) as pool:
        futures = [(best, pool.submit(get_family(best["family"]), best["config"],
                                      p.problem.dtype, data.device.arch))
                   for p, best in missing]
        for best, future in futures:
            result = future.result()
            if result.ok:
                best.update(ptxas_regs=result.regs, ptxas_smem_bytes=result.smem,
                            ptxas_spill_bytes=result.spill_bytes, ptxas_from=FROM_REPORT)
    return sum(best.get("ptxas_from") == FROM_REPORT for _, best in missing)
