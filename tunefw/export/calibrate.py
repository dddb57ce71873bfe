"""`tunefw dispatch calibrate`: measure the table's non-exact rules on in-between shapes.

For each asked shape that a bucket or nearest rule serves (tunefw.runtime.rules, evidence
ignored), the rule's entry is timed on that shape against cuBLAS by an injectable ``measure``
function and the result is written into the table as evidence; a measured ratio below
``evidence_min_ratio`` then routes the shape, and its neighbours in M, to cuBLAS, and an M with
evidence on one side only is unproven (cuBLAS unless the first-call guard times it), so measure
both sides of the Ms that matter (``between_shapes`` does, per gap of tuned Ms). The default
``measure`` runs on the GPU through tunefw.measure.bench (verified first, then timed
interleaved with cuBLAS, L2 flushed); a wrong answer counts as 0 TFLOP/s.
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterable

from tunefw.errors import UserError
from tunefw.problem import DTYPES, GemmProblem, parse_shape
from tunefw.runtime.dispatch import DispatchEntry, DispatchTable, Evidence
from tunefw.runtime.rules import table_rule

Measure = Callable[[DispatchEntry, GemmProblem], tuple[float, float]]  # -> (tflops, cuBLAS)
MAX_SHAPES = 100000


def read_shapes(path: str | Path) -> list[GemmProblem]:
    """Shapes from a file: one ``MxNxK [dtype]`` per line ('#' comments), or a JSON list of
    ``"MxNxK"`` strings / ``{"M", "N", "K"[, "dtype"]}`` objects."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: not UTF-8 text") from None
    items: list = []
    if text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except (ValueError, RecursionError):
            raise UserError(f"{path}: not a JSON list of shapes") from None
    else:
        for line in text.splitlines():
            words = line.split("#", 1)[0].split()
            if words:
                items.append(words)
    if len(items) > MAX_SHAPES:
        raise UserError(f"{path}: {len(items)} shapes: at most {MAX_SHAPES}")
    shapes = []
    for i, item in enumerate(items):
        try:
            shapes.append(_shape(item))
        except UserError as exc:
            raise UserError(f"{path}: shape {i + 1}: {exc}") from None
    if not shapes:
        raise UserError(f"{path}: no shapes")
    return shapes


def between_ms(tuned: Iterable[int]) -> list[int]:
    """For each pair of neighbouring tuned M values a < b: a + 1, their geometric middle and
    b - 1 (the Ms whose calibration brackets every M in between)."""
    ms = sorted(set(tuned))
    return [m for a, b in zip(ms, ms[1:])
            for m in sorted({a + 1, round((a * b) ** 0.5), b - 1} - {a, b})]


def between_shapes(table: DispatchTable, label: str) -> list[GemmProblem]:
    """In-between shapes of the layers whose label is ``label`` or starts with ``label.``: for
    each pair of neighbouring tuned M values a < b, a + 1, their geometric middle and b - 1."""
    shapes = []
    for entries in table.layers().values():
        if not any(e.label == label or e.label.startswith(label + ".") for e in entries):
            continue
        e0 = entries[0]
        if e0.gate != "none":  # evidence is measured against cuBLAS: plain GEMM layers only
            continue
        shapes += [GemmProblem(m, e0.N, e0.K, e0.dtype, e0.layout)
                   for m in between_ms(e.M for e in entries)]
    if not shapes:
        raise UserError(f"--model {label!r}: no layer of the table has that label "
                        "(or each has one tuned M)")
    return shapes


def _shape(item: object) -> GemmProblem:
    if isinstance(item, str):
        item = [item]
    if isinstance(item, list) and 1 <= len(item) <= 2 and all(isinstance(w, str) for w in item):
        dtype = item[1] if len(item) == 2 else "bf16"
        if dtype not in DTYPES:
            raise UserError(f"dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
        problem = parse_shape(item[0], dtype)
        if problem.gate != "none":
            raise UserError(f"{item[0]!r}: calibration times plain GEMMs against cuBLAS (a gated "
                            "shape is served by its own entries, guarded at first call)")
        return problem
    if isinstance(item, dict) and set(item) <= {"M", "N", "K", "dtype"} and {"M", "N", "K"} <= set(item):
        return GemmProblem(item["M"], item["N"], item["K"], item.get("dtype", "bf16"))
    raise UserError(f"{str(item)[:60]!r}: expected MxNxK [dtype] or {{M, N, K[, dtype]}}")


def calibrate(table: DispatchTable, shapes: list[GemmProblem], measure: Measure,
              min_ratio: float | None = None,
              progress: Callable[[Evidence], None] | None = None) -> DispatchTable:
    """The table with evidence for every shape a non-exact rule serves (earlier evidence of the
    same shape replaced); ``min_ratio`` sets the table's evidence_min_ratio."""
    device = table.device()
    measured: dict[str, Evidence] = {}
    for problem in shapes:
        rule, entry, _ = table_rule(table, problem, device)
        if (entry is None or rule == "exact" or entry.is_cublas or problem.key() in measured
                or problem.gate != "none"):  # evidence (a plain GEMM's) has no gate
            continue
        tflops, cublas = measure(entry, problem)
        for what, value in (("tflops", tflops), ("cuBLAS TFLOP/s", cublas)):
            if not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
                raise UserError(f"{problem.key()}: measured {what} {value!r}: expected a finite number >= 0")
        if cublas <= 0:
            raise UserError(f"{problem.key()}: measured cuBLAS TFLOP/s {cublas!r}: expected > 0")
        point = Evidence(problem.M, problem.N, problem.K, problem.dtype, problem.layout, rule,
                         (entry.M, entry.N, entry.K), float(tflops), float(cublas))
        measured[problem.key()] = point
        if progress:
            progress(point)
    kept = [v for v in table.evidence
            if f"{v.M}x{v.N}x{v.K}:{v.dtype}:{v.layout}" not in measured]
    threshold = table.evidence_min_ratio if min_ratio is None else min_ratio
    if not (0 <= threshold < float("inf")):
        raise UserError(f"--min-ratio {threshold}: expected a finite number >= 0")
    return replace(table, evidence=kept + list(measured.values()), evidence_min_ratio=threshold)


def cuda_measure(cubin_dir: str | Path | None = None,
                 cache_dir: str | Path | None = None) -> Measure:
    """The GPU measurement: the entry's kernel on the shape vs cuBLAS, as tunefw bench times it."""
    import torch

    if not torch.cuda.is_available():
        raise UserError("tunefw dispatch calibrate needs a CUDA GPU (none is visible)")
    from tunefw.evaluate import method
    from tunefw.evaluate.cuda import CudaEvaluator
    from tunefw.measure.bench import bench_entry
    from tunefw.runtime.dispatcher import Dispatcher

    evaluator = CudaEvaluator(0)
    flush = method.L2Flush(evaluator.device_spec().l2_bytes)
    counter = iter(range(10**9))

    def measure(entry: DispatchEntry, problem: GemmProblem) -> tuple[float, float]:
        one = DispatchTable(False, {"name": evaluator.device_spec().name,
                                    "cc": evaluator.device_spec().cc}, [entry])
        dispatcher = Dispatcher(one, cubin_dir=cubin_dir, cache_dir=cache_dir, guard=False,
                                programmatic=False)  # a decision: plain launches (runtime/plan.py)
        row = bench_entry(dispatcher, problem, next(counter), flush, None)
        if row["path"] == "cublas" or row["wrong"]:
            return 0.0, row["cublas_tflops"]
        return row["tflops"], row["cublas_tflops"]

    return measure
