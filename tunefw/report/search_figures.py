"""Figures of the search itself: convergence per problem, the effect of each knob, every trial;
and search-eval's convergence of each sampler on recorded sweeps."""
from __future__ import annotations

import math
from itertools import cycle
from typing import Any

from tunefw.outcome import Status
from tunefw.report.data import ProblemReport, TrialPoint
from tunefw.report.plot import (CUBLAS, LOSS, TUNEFW, WIN, parity, png_bytes, png_img, pyplot,
                                 titled)
from tunefw.templates import FAMILIES

COLUMNS = 4
FAMILY_COLOURS = ("#1565c0", "#ef6c00", "#6a1b9a", "#00838f", "#558b2f")
FAILURE_COLOURS = ("#c62828", "#ad1457", "#4e342e", "#f9a825", "#37474f", "#00695c", "#283593")


def _grid(n: int, width: float, height: float, sharey: bool = False) -> tuple[Any, list[Any]]:
    """A figure of ``n`` panels, COLUMNS wide; the unused trailing panels are hidden."""
    cols = min(COLUMNS, max(n, 1))
    rows = math.ceil(max(n, 1) / cols)
    fig, axes = pyplot().subplots(rows, cols, figsize=(width * cols, height * rows + 0.6),
                                  sharey=sharey, squeeze=False, layout="constrained")
    flat = [ax for row in axes for ax in row]
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def convergence_figure(problems: list[ProblemReport], kind: str | None) -> str:
    """Small multiples, one per problem: best ratio so far (line) and each OK trial's ratio
    (dots) against the trial number, with the parity line."""
    fig, axes = _grid(len(problems), 3.3, 2.3, sharey=True)
    for ax, p in zip(axes, problems):
        curve = [math.nan if b is None else b for b in p.curve]
        ax.step(range(1, len(curve) + 1), curve, where="post", color=TUNEFW, linewidth=1.4)
        ok = [t for t in p.trials if t.ratio is not None]
        ax.scatter([t.index for t in ok], [t.ratio for t in ok], s=5, color="#90a4ae", zorder=1)
        parity(ax)
        ax.set_title(p.label, fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in axes[-COLUMNS:]:
        ax.set_xlabel("trial number", fontsize=7)
    for ax in axes[::COLUMNS]:
        ax.set_ylabel("ratio to cuBLAS", fontsize=7)
    return png_img(fig, titled("convergence: best ratio so far (line), each OK trial (dots)", kind))


def knob_figure(family: str, trials: list[TrialPoint], kind: str | None) -> str:
    """One panel per knob of ``family``: a box of the OK trials' ratios per value tried (all
    problems pooled), values in declared order, n under each box."""
    tpl = FAMILIES[family]
    ok = [t for t in trials if t.family == family and t.ratio is not None]
    fig, axes = _grid(len(tpl.params), 2.9, 2.2, sharey=True)
    for ax, param in zip(axes, tpl.params):
        values = [v for v in param.values if any(t.config.get(param.name) == v for t in ok)]
        groups = [[t.ratio for t in ok if t.config.get(param.name) == v] for v in values]
        if groups:
            ax.boxplot(groups, widths=0.6, showfliers=True, flierprops={"markersize": 2})
            ax.set_xticks(range(1, len(values) + 1),
                          [f"{v}\nn={len(g)}" for v, g in zip(values, groups)], fontsize=6)
        parity(ax)
        ax.set_title(param.name, fontsize=8)
        ax.tick_params(axis="y", labelsize=7)
    for ax in axes[::COLUMNS]:
        ax.set_ylabel("ratio to cuBLAS", fontsize=7)
    return png_img(fig, titled(f"{family}: ratio to cuBLAS per knob value ({len(ok)} OK trials)",
                               kind))


def trials_figure(problems: list[ProblemReport], families: list[str], kind: str | None) -> str:
    """Every evaluated trial in launch order: OK ones by ratio, coloured by family (top); the
    failed ones, which have no ratio, on a strip per outcome (below, where there are any)."""
    trials = [t for p in problems for t in p.trials]
    failures = sorted({t.status for t in trials if t.status != Status.OK.value})
    rows = 2 if failures else 1
    fig, axes = pyplot().subplots(rows, 1, figsize=(11, 5.2 if failures else 4.2), sharex=True,
                                  layout="constrained", squeeze=False, gridspec_kw={
                                      "height_ratios": [4, 1 + 0.3 * len(failures)][:rows]})
    top, bottom = axes[0][0], axes[-1][0]
    for family, colour in zip(families, cycle(FAMILY_COLOURS)):
        ok = [t for t in trials if t.family == family and t.ratio is not None]
        top.scatter([t.order for t in ok], [t.ratio for t in ok], s=9, color=colour,
                    label=f"{family} OK ({len(ok)})")
    parity(top)
    top.set_ylabel("ratio to cuBLAS")
    top.legend(fontsize=7, loc="lower right")
    for row, (status, colour) in enumerate(zip(failures, cycle(FAILURE_COLOURS))):
        failed = [t.order for t in trials if t.status == status]
        bottom.scatter(failed, [row] * len(failed), marker="x", s=16, color=colour)
    if failures:
        bottom.set_yticks(range(len(failures)), [f"{s} ({sum(t.status == s for t in trials)})"
                                                 for s in failures], fontsize=7)
        bottom.set_ylim(-0.7, len(failures) - 0.3)
    bottom.set_xlabel("trial number in the study (order written)")
    return png_img(fig, titled(f"all {len(trials)} evaluated trials: ratio by family, "
                               + ("failures below" if failures else "none failed"), kind), top)


SAMPLER_COLOURS = {"tpe": TUNEFW, "random": CUBLAS, "grid": "#ef6c00", "cmaes": "#6a1b9a"}


def search_eval_figure(result: dict) -> bytes:
    """search-eval's convergence as a PNG: per sweep, each sampler's median best ratio after n
    evaluated trials relative to the sweep's reference (1.0: its confirmed best), the line of
    within 2%, the budgets on a log axis."""
    sweeps = result["sweeps"]
    fig, axes = _grid(len(sweeps), 3.3, 2.4, sharey=True)
    for ax, e in zip(axes, sweeps):
        for name, s in e["samplers"].items():
            curve = [math.nan if v is None else v / e["reference_ratio"]
                     for v in s["median_best_curve"]]
            ax.step(range(1, len(curve) + 1), curve, where="post", linewidth=1.3, label=name,
                    color=SAMPLER_COLOURS.get(name, WIN))
        ax.axhline(0.98, color=LOSS, linestyle=":", linewidth=1, label="within 2%")
        ax.set_xscale("log", base=2)
        ticks = sorted({1, 4, *result["budgets"]})
        ax.set_xticks(ticks, [str(b) for b in ticks], fontsize=7)
        ax.set_title(f"{e['problem'].split(':')[0]} {e['label']} ({e['space']} configs)",
                     fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in axes[-COLUMNS:]:
        ax.set_xlabel("evaluated trials", fontsize=7)
    for ax in axes[::COLUMNS]:
        ax.set_ylabel("best / reference", fontsize=7)
    if axes:
        axes[0].legend(fontsize=6, loc="lower right")
    return png_bytes(fig, f"search-eval: median best ratio so far over {result['seeds']} seeds, "
                          "relative to each sweep's confirmed best")
