"""Issue 14's acceptance, the part that needs no GPU: which shapes benchmarks/dispatch_guard_h200.py
serves (``plan_shapes``: each layer of the table at the M of ``UNTUNED_M`` it was not tuned at,
plus ``OTHER_MODELS``' layers the table has no entry for), which ones ``tunefw dispatch
calibrate`` measures first (``calibration_shapes``, never one of those), and the verdict on
the measured parts (``summarize``: each acceptance point a bool with its evidence)."""
from __future__ import annotations

import math
import statistics
from collections import Counter

from tunefw.runtime.dispatch import DispatchTable

UNTUNED_M = (1, 3, 7, 8, 33, 100, 129, 257, 1000, 1025, 3000, 4097, 8192)
WIDE_N, WIDE_MAX_M = 32768, 257  # a layer this wide is an lm_head: it runs at decode M
# Layers of other models, two M each; those the table has are left out, so a table of either
# Llama-3-8B layout (vLLM's fused or Hugging Face's unfused) gets 8 shapes.
OTHER_MODELS = (("llama3_8b fused qkv", 6144, 4096, (24, 1000)),
                ("llama3_8b fused gate_up", 28672, 4096, (8, 3000)),
                ("llama3_8b k_proj/v_proj", 1024, 4096, (24, 1000)),
                ("llama3_8b gate_proj/up_proj", 14336, 4096, (8, 3000)),
                ("qwen2_7b q_proj/o_proj", 3584, 3584, (3, 300)),
                ("qwen2_7b down_proj", 3584, 18944, (100, 4096)))
MAX_M = 8192
FLOOR, GEOMEAN_MIN, GUARD_MS_MAX, EXACT_TOLERANCE = 0.97, 1.02, 3.0, 0.02
MIN_UNTUNED = 48  # the issue's 40 shapes of the table's layers and 8 of other models'
PARTS = ("guard_on", "guard_off", "exact", "compile", "graph")


def plan_shapes(table: DispatchTable) -> list[dict]:
    """The untuned shapes: {M, N, K, dtype, kind ('layer' | 'other model'), label}."""
    shapes, layers = [], table.layers()
    for (n, k, dtype, layout, gate), entries in sorted(layers.items()):
        if gate != "none":  # the guard and its plan are for plain GEMMs
            continue
        tuned = {e.M for e in entries}
        label = entries[0].label or f"{n}x{k}"
        for m in UNTUNED_M:
            if m not in tuned and (n < WIDE_N or m <= WIDE_MAX_M):
                shapes.append({"M": m, "N": n, "K": k, "dtype": dtype, "kind": "layer", "label": label})
    dtype = next(iter(layers))[2] if layers else "bf16"
    for label, n, k, ms in _other_layers(table):
        shapes += [{"M": m, "N": n, "K": k, "dtype": dtype, "kind": "other model", "label": label}
                   for m in ms]
    return shapes


def _other_layers(table: DispatchTable) -> list[tuple[str, int, int, tuple[int, ...]]]:
    have = {(n, k) for n, k, _, _, gate in table.layers() if gate == "none"}
    return [o for o in OTHER_MODELS if (o[1], o[2]) not in have]


def calibration_shapes(table: DispatchTable) -> list[dict]:
    """What ``tunefw dispatch calibrate --shapes`` measures before serving: each layer's
    in-between M (tunefw.export.calibrate.between_shapes), twice its top tuned M (lm_head-wide
    layers excepted), and the other models' layers at the table's tuned M and in between; never
    a shape of plan_shapes(), so serving those tests the rules' neighbour verdicts."""
    from tunefw.errors import UserError
    from tunefw.export.calibrate import between_ms, between_shapes

    tested = {(s["M"], s["N"], s["K"]) for s in plan_shapes(table)}
    found: dict[tuple[int, int, int], dict] = {}

    def add(m: int, n: int, k: int, dtype: str) -> None:
        if (m, n, k) not in tested and m <= MAX_M and (n < WIDE_N or m <= WIDE_MAX_M):
            found.setdefault((m, n, k), {"M": m, "N": n, "K": k, "dtype": dtype})

    for label in sorted({e.label for e in table.entries}):
        try:
            for p in between_shapes(table, label):
                add(p.M, p.N, p.K, p.dtype)
        except UserError:  # its layers have one tuned M each: nothing in between
            pass
    for (n, k, dtype, _, gate), entries in table.layers().items():
        if gate != "none":
            continue
        add(2 * entries[-1].M, n, k, dtype)
    grid = sorted({e.M for e in table.entries})
    dtype = table.entries[0].dtype if table.entries else "bf16"
    for _, n, k, _ in _other_layers(table):  # the grid and its in-between Ms: verdicts that
        for m in grid + between_ms(grid):    # bracket (rule 4 serves no one-sided evidence)
            add(m, n, k, dtype)
    return list(found.values())


def geomean(values: list[float]) -> float | None:
    values = [v for v in values if v and v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def _below(rows: list[dict], key: str, floor: float) -> list[str]:
    return [f"{r['M']}x{r['N']}x{r['K']} {r[key]:.3f}" for r in rows
            if r.get(key) is not None and r[key] < floor]


# Paths on which tunefw.gemm calls F.linear(a, b), the very call the baseline times: such a row
# cannot serve slower than cuBLAS, and its measured ratio is the timing method's own A/A spread
# (0.965 at 3000x28672x4096 in dispatch_guard_hf_llama3_8b_h200.json at e122461).
BASELINE_PATHS = ("cublas", "unproven")


def _served(rows: list[dict]) -> list[dict]:
    """The rows a tuned kernel served (the never-slower points judge these)."""
    return [r for r in rows if r.get("path") not in BASELINE_PATHS]


def _baseline_spread(rows: list[dict]) -> dict:
    """The measured ratios of rows served by the baseline's own call: the method's A/A spread."""
    ratios = [r["ratio"] for r in rows if r.get("path") in BASELINE_PATHS]
    return {"shapes": len(ratios), "min": min(ratios, default=None), "max": max(ratios, default=None)}


def path_counts(rows: list[dict]) -> dict[str, int]:
    """Rows per serving path. A row holds its route after the shape's first call, so an unproven
    route the guard measured counts as 'guarded' (kept) or 'cublas'; 'unproven' is one served
    by cuBLAS unmeasured (guard off, or its kernel could not be timed)."""
    return dict(sorted(Counter(str(r.get("path")) for r in rows).items()))


def summarize(result: dict) -> dict:
    """The acceptance points from the parts' rows (each a bool with its evidence)."""
    on = [r for r in result["guard_on"] if "ratio" in r]
    off = [r for r in result["guard_off"] if "ratio" in r]
    exact = [r for r in result["exact"] if "ratio_to_confirmed" in r]
    guard_ms = [r["guard_ms"] for r in on if r.get("guard_ms")]
    over = [f"{r['M']}x{r['N']}x{r['K']} {r['guard_ms']:.2f} ms (pair {r['guard_pair_ms']:.2f})"
            for r in on if (r.get("guard_ms") or 0) > GUARD_MS_MAX]
    wrong = {part: [f"{r['M']}x{r['N']}x{r['K']}" for r in result[part] if r.get("wrong")]
             for part in PARTS}
    errors = [f"{part} {r['M']}x{r['N']}x{r['K']}: {r['error']}" for part in PARTS
              for r in result[part] if r.get("error")]
    skipped = {part: sum("skipped" in r for r in result[part]) for part in PARTS}
    g = geomean([r["ratio"] for r in on])
    on_loss, off_loss = _below(_served(on), "ratio", FLOOR), _below(_served(off), "ratio", FLOOR)
    points = {
        "untuned_never_slower": {"ok": len(on) >= MIN_UNTUNED and not on_loss,
                                 "shapes": len(on), "skipped": skipped,
                                 "min": min((r["ratio"] for r in on), default=None),
                                 "below": on_loss, "paths": path_counts(on),
                                 "baseline_call_spread": _baseline_spread(on),
                                 "unproven_unmeasured": [f"{r['M']}x{r['N']}x{r['K']}" for r in on
                                                         if r.get("path") == "unproven"]},
        "untuned_geomean": {"ok": g is not None and g >= GEOMEAN_MIN, "geomean": g},
        "guard_cost": {"ok": not over, "timed_shapes": len(guard_ms),
                       "max_ms": max(guard_ms, default=None),
                       "median_ms": statistics.median(guard_ms) if guard_ms else None, "over": over},
        "guard_off_calibrated": {"ok": bool(off) and not off_loss,
                                 "min": min((r["ratio"] for r in off), default=None),
                                 "below": off_loss, "paths": path_counts(off),
                                 "baseline_call_spread": _baseline_spread(off),
                                 "retimed": sum(not r.get("same_route_as_guard_on") for r in off)},
        "exact_at_tuned_speed": {"ok": bool(exact) and not _below(exact, "ratio_to_confirmed",
                                                                  1 - EXACT_TOLERANCE),
                                 "entries": len(exact),
                                 "min": min((r["ratio_to_confirmed"] for r in exact), default=None),
                                 "below": _below(exact, "ratio_to_confirmed", 1 - EXACT_TOLERANCE)},
        "correct_everywhere": {"ok": not any(wrong.values()) and bool(result["graph"])
                               and bool(result["compile"]), "wrong": wrong, "errors": errors},
    }
    points["all"] = all(p["ok"] for p in points.values())
    return points
