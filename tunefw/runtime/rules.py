"""The serving rules of a dispatch table, in one place (the C++ header's lookup() mirrors them).

For a problem (M, N, K, dtype, layout) on the table's device:

1. **exact**: the entry of that very shape, if its config passes check() for it (a table
   edited by hand, or made for another device, can hold one that does not: it serves nothing).
   A cuBLAS-route entry (its winner measured below cuBLAS at export) answers cuBLAS.
2. **bucket**: the entries of the same layer (same N, K, dtype, layout) form M buckets. The
   problem takes the entry at the smallest tuned M above the asked M whose config passes the
   family's check() for the asked shape; if no tuned M above is valid, the largest valid tuned
   M below. cuBLAS-route entries count as valid (cuBLAS runs anything) and answer cuBLAS.
3. **nearest**: a layer with no usable entry takes the nearest kernel entry of the same dtype
   and layout by log distance over (M, N, K) whose config passes check() (ties: smaller M, N,
   K). cuBLAS-route entries are never used here.
4. **calibration evidence** (non-exact rules only): the table's measured shapes served by the
   same entry with the same (N, K). A measured shape takes its own verdict; another M takes the
   verdict of the measured Ms next to it below and above: if either measured below
   ``evidence_min_ratio`` the shape is served by cuBLAS, else by the entry ('calibrated').
   Evidence on one side of the asked M only brackets nothing (the speed of a kernel changes
   with M in steps, e.g. when its tile count crosses a wave): the route is 'unproven', served
   by cuBLAS with the entry kept as ``donor``, which the first-call guard may time
   (tunefw/runtime/guard.py). So is an M between two measured ones where the kernel fills its
   tiles and its last wave of SMs worse than at both (``tile_fill``; the H200 served
   3000x14336x4096 at 0.937x by a tile that measured 1.011x at M=2047 and 1.004x at 4096,
   where 11 waves of 132 SMs are 92.5% full against 97%). A series with no evidence keeps the
   bucket / nearest route.
5. Nothing found: cuBLAS.

An entry whose ``source_hash`` differs from the source its kernel is built from here (this
installation's templates, or a shipped cubin's recorded source) was measured on another
kernel (tunefw upgraded, a template edited): whatever rule chose it, the route is 'unproven'
(cuBLAS unless the first-call guard times the kernel and keeps it).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from tunefw.device import DeviceSpec
from tunefw.problem import GemmProblem
from tunefw.runtime.dispatch import DispatchEntry, DispatchTable, Evidence
from tunefw.templates import FAMILIES, changed_source


PATHS = ("exact", "bucket", "nearest", "calibrated", "unproven", "guarded", "cublas")


@dataclass(frozen=True)
class Route:
    """How one shape is served: ``path`` (one of PATHS), the entry whose kernel runs (None:
    cuBLAS), why; the table ``rule`` that chose ``donor`` and the measured ``ratio`` behind it."""

    path: str
    entry: DispatchEntry | None
    reason: str
    rule: str = ""
    donor: DispatchEntry | None = None
    ratio: float | None = None

    @property
    def candidate(self) -> DispatchEntry | None:
        """The entry whose kernel serves the route, or, unproven, would once the guard keeps it."""
        return self.entry or (self.donor if self.path == "unproven" else None)


def shape(e: DispatchEntry | Evidence | GemmProblem) -> str:
    """'MxNxK' of an entry, evidence item or problem."""
    return f"{e.M}x{e.N}x{e.K}"


def _valid(e: DispatchEntry, problem: GemmProblem, device: DeviceSpec) -> bool:
    return FAMILIES[e.family].check(e.config, problem, device) is None


def table_rule(table: DispatchTable, problem: GemmProblem,
               device: DeviceSpec) -> tuple[str, DispatchEntry | None, str]:
    """(rule, entry, how) by rules 1-3: 'exact' | 'bucket' | 'nearest', or ('', None, '')."""
    same = [e for e in table.entries if e.dtype == problem.dtype and e.layout == problem.layout
            and e.gate == problem.gate]
    for e in same:
        if (e.M, e.N, e.K) == (problem.M, problem.N, problem.K) and (
                e.is_cublas or _valid(e, problem, device)):
            return "exact", e, "its own entry"
    layer = [e for e in same if (e.N, e.K) == (problem.N, problem.K)
             and (e.is_cublas or _valid(e, problem, device))]
    above = [e for e in layer if e.M > problem.M]
    if above:
        e = min(above, key=lambda e: e.M)
        return "bucket", e, f"the smallest tuned M above {problem.M} valid here"
    if layer:
        e = max(layer, key=lambda e: e.M)
        none = "none above is valid here" if any(
            (x.N, x.K) == (problem.N, problem.K) and x.M > problem.M for x in same) else "no tuned M above"
        return "bucket", e, f"the largest tuned M below {problem.M} ({none})"
    for e in sorted((e for e in same if not e.is_cublas),
                    key=lambda e: (problem.log_distance(e.problem), e.M, e.N, e.K)):
        if _valid(e, problem, device):
            return "nearest", e, (f"the closest whose config is valid here (log distance "
                                  f"{problem.log_distance(e.problem):.3f})")
    return "", None, ""


def evidence_for(table: DispatchTable, donor: DispatchEntry,
                 problem: GemmProblem) -> list[Evidence]:
    """The measured shapes that decide a non-exact problem served by ``donor`` (rule 4). Evidence
    is of plain GEMMs (calibration times against cuBLAS): a gated donor has none, even where a
    plain entry of its very shape has some."""
    if donor.gate != "none":
        return []
    series = [v for v in table.evidence
              if v.served_by == (donor.M, donor.N, donor.K) and v.dtype == donor.dtype
              and v.layout == donor.layout and (v.N, v.K) == (problem.N, problem.K)]
    for v in series:
        if v.M == problem.M:
            return [v]
    below = [v for v in series if v.M < problem.M]
    above = [v for v in series if v.M > problem.M]
    picked = []
    if below:
        picked.append(max(below, key=lambda v: v.M))  # max/min keep the first of equal Ms
    if above:
        picked.append(min(above, key=lambda v: v.M))
    return picked


def tile_fill(e: DispatchEntry, m: int, n: int, sm_count: int) -> float:
    """The useful share of the work ``e``'s kernel launches at M=m, N=n: C's elements over its
    padded tiles, times how full its last wave of ``sm_count`` SMs is (split-K counted)."""
    hint = FAMILIES[e.family].cost_hint(e.config)
    rows, cols = -(-m // hint.tile_m), -(-n // hint.tile_n)
    items = rows * cols * hint.split_k
    waves = -(-items // sm_count)
    return (m * n) / (rows * hint.tile_m * cols * hint.tile_n) * items / (waves * sm_count)


def _measured(points: list[Evidence]) -> str:
    return ", ".join(f"{v.ratio:.3f}x at M={v.M}" for v in points)


def lookup(table: DispatchTable, problem: GemmProblem,
           device: DeviceSpec | None = None) -> DispatchEntry | None:
    """The entry whose kernel serves the problem by the table's rules, else None: cuBLAS."""
    return decide(table, problem, device).entry


BuiltFrom = Callable[[DispatchEntry], "str | None"]


def decide(table: DispatchTable, problem: GemmProblem, device: DeviceSpec | None = None,
           built_from: BuiltFrom | None = None) -> Route:
    """The route for a problem by the table's rules (the module docstring), on ``device``
    (default: the table's own GPU); ``built_from(entry)``: the source hash the entry's kernel
    would be built from here where it is not this installation's (a shipped cubin's), or None."""
    device = device or table.device()
    rule, e, how = table_rule(table, problem, device)
    if e is None:
        return Route("cublas", None, _no_entry(table, problem, device))
    what = f"entry {shape(e)}" + (f" ({e.label})" if e.label else "")
    if e.is_cublas:
        why = "its own entry is" if rule == "exact" else f"{rule} {what}, {how}, is"
        return Route("cublas", None, f"{why} a cuBLAS route: {e.reason or 'lost to cuBLAS'}",
                     rule, e, e.ratio)
    tag = f"{e.family}, trial {e.trial_id}"
    now = changed_source(e.family, e.source_hash, built_from(e) if built_from else None)
    if now:  # the kernel this runtime would build was never timed (nor its evidence)
        return Route("unproven", None, f"{rule} {what} ({tag}): {e.family}'s kernel source "
                                       f"changed since it was measured ({e.source_hash} -> {now}): "
                                       "unproven, cuBLAS unless the guard measures it",
                     rule, e, e.ratio)
    if rule == "exact":
        ratio = f", {e.ratio:.3f}x cuBLAS" if e.ratio is not None else ""
        return Route("exact", e, f"its own entry ({tag}{ratio})", rule, e, e.ratio)
    points = evidence_for(table, e, problem)
    if not points:
        return Route(rule, e, f"{what}, {how} ({tag}); no calibration evidence", rule, e)
    if len(points) == 1 and points[0].M != problem.M:
        v = points[0]
        return Route("unproven", None, f"calibration measured {_measured(points)} only, on one side "
                                       f"of M={problem.M} for the {rule} {what}: unproven, cuBLAS "
                                       "unless the guard measures it", rule, e, v.ratio)
    worst = min(points, key=lambda v: v.ratio)
    if worst.ratio < table.evidence_min_ratio:
        return Route("cublas", None, f"calibration measured {_measured(points)} for the {rule} "
                                     f"{what} (< {table.evidence_min_ratio:g})", rule, e, worst.ratio)
    if len(points) == 2:
        fill = tile_fill(e, problem.M, problem.N, device.sm_count)
        measured = min(tile_fill(e, v.M, v.N, device.sm_count) for v in points)
        if fill < measured - 1e-9:
            return Route("unproven", None, f"calibration measured {_measured(points)} for the "
                                           f"{rule} {what}, but its tiles are {fill:.1%} full at "
                                           f"M={problem.M} against {measured:.1%} there: "
                                           "unproven, cuBLAS unless the guard measures it",
                         rule, e, worst.ratio)
    return Route("calibrated", e, f"{rule} {what}, {how} ({tag}); calibration measured "
                                  f"{_measured(points)}", rule, e, worst.ratio)


def _no_entry(table: DispatchTable, problem: GemmProblem, device: DeviceSpec) -> str:
    same = [e for e in table.entries
            if e.dtype == problem.dtype and e.gate == problem.gate and not e.is_cublas]
    if not same:
        gated = "" if problem.gate == "none" else f" gate-{problem.gate}"
        return f"the table has no {problem.dtype}{gated} kernel entry"
    nearest = min(same, key=lambda e: (problem.log_distance(e.problem), e.M, e.N, e.K))
    why = FAMILIES[nearest.family].check(nearest.config, problem, device)
    return (f"no {problem.dtype} entry's config is valid for this shape "
            f"(nearest {shape(nearest)}: {why})")
