"""Figures of the best config per shape: its ratio to cuBLAS, and its place on the roofline."""
from __future__ import annotations

from typing import Any

from tunefw.device import DeviceSpec
from tunefw.report.data import ProblemReport
from tunefw.report.plot import CUBLAS, LOSS, TUNEFW, WIN, parity, png_img, pyplot, titled
from tunefw.report.shapes import ceilings, is_loss, ratio_of, shape_roof, verdict

NUMBERED_AT_MOST = 30  # roofline points numbered (with a key) up to this many shapes
OFFSETS = ((5, 2), (5, -9), (-11, 2), (-11, -9))  # neighbours' numbers apart


def ratio_figure(problems: list[ProblemReport], kind: str | None) -> str:
    """Ratio to cuBLAS per shape, worst first, as bars from the 1.0 parity line ending in a dot:
    losses red, wins green, exact parity grey, each labelled with its value."""
    ranked = sorted(((ratio_of(p), p.label) for p in problems if ratio_of(p) is not None))
    fig, ax = pyplot().subplots(figsize=(9, 0.32 * len(ranked) + 1.6), layout="constrained")
    ys = list(range(len(ranked)))
    ratios = [r for r, _ in ranked]
    colours = [{"LOSS": LOSS, "parity": CUBLAS}.get(verdict(r), WIN) for r in ratios]
    ax.barh(ys, [r - 1.0 for r in ratios], left=1.0, height=0.6, color=colours)
    ax.scatter(ratios, ys, s=14, color=colours, zorder=3)
    for y, r in zip(ys, ratios):
        ax.annotate(f"{r:.3f}", (r, y), xytext=(-5 if is_loss(r) else 5, 0),
                    textcoords="offset points", va="center", ha="right" if is_loss(r) else "left",
                    fontsize=7)
    parity(ax, vertical=True)
    low, high = min(ratios + [1.0]), max(ratios + [1.0])
    pad = max(high - low, 0.04) * 0.12  # room for the value labels at both ends
    ax.set_xlim(low - pad, high + pad)
    ax.set_yticks(ys, [label for _, label in ranked], fontsize=8)
    ax.set_ylim(len(ranked) - 0.5, -0.5)  # worst at the top
    ax.set_xlabel("best config's TFLOP/s / cuBLAS TFLOP/s (same screen); dashed: parity 1.0")
    return png_img(fig, titled("ratio to cuBLAS per shape (red: slower than cuBLAS)", kind), ax)


def _ceiling_lines(ax: Any, device: DeviceSpec, intensities: list[float]) -> None:
    """The bandwidth ceilings (bandwidth x intensity, capped by the compute rate) and the compute
    ceiling, labelled with their values and sources; x spans the shapes and the ridge points."""
    bandwidths = [c for c in ceilings(device) if c.unit == "GB/s"]
    compute = next(c for c in ceilings(device) if c.unit == "TFLOP/s")
    ridges = [compute.value * 1e3 / c.value for c in bandwidths]
    x0, x1 = min(intensities + ridges) / 2, max(intensities + ridges) * 4
    xs = [x0 * (x1 / x0) ** (i / 200) for i in range(201)]
    for c, style in zip(bandwidths, ("-", ":")):
        ax.plot(xs, [min(compute.value, x * c.value / 1e3) for x in xs], style, color="black",
                linewidth=1.2, label=c.label)
    ax.axhline(compute.value, color="#6a1b9a", linewidth=1, linestyle="-.", label=compute.label)
    ax.set_xlim(x0, x1)


def roofline_figure(problems: list[ProblemReport], device: DeviceSpec, kind: str | None) -> str:
    """Achieved TFLOP/s against arithmetic intensity (log-log) under the device's ceilings: per
    shape tunefw's best (filled; red where it loses) and cuBLAS (hollow square) at the same
    intensity, joined by a line; numbered, with a key naming each shape and its bound."""
    shown = [(p, shape_roof(p.problem, device, p.best["tflops"], p.best["cublas_tflops"]))
             for p in problems if p.best]
    numbered = len(shown) <= NUMBERED_AT_MOST
    fig, ax = pyplot().subplots(figsize=(14 if numbered else 9, 5.5), layout="constrained")
    _ceiling_lines(ax, device, [r.intensity for _, r in shown])
    for n, (p, r) in enumerate(shown, 1):
        best, ref = p.best["tflops"], p.best["cublas_tflops"]
        if ref:
            ax.plot([r.intensity] * 2, [best, ref], color="#9e9e9e", linewidth=0.8, zorder=1)
            ax.scatter([r.intensity], [ref], s=36, facecolors="none", edgecolors=CUBLAS,
                       marker="s", zorder=2)
        ax.scatter([r.intensity], [best], s=30, zorder=3,
                   color=LOSS if is_loss(ratio_of(p)) else TUNEFW)
        if numbered:
            ax.annotate(str(n), (r.intensity, best), xytext=OFFSETS[n % len(OFFSETS)],
                        textcoords="offset points", fontsize=7)
    ax.scatter([], [], s=30, color=TUNEFW, label="tunefw best (red: slower than cuBLAS)")
    ax.scatter([], [], s=36, facecolors="none", edgecolors=CUBLAS, marker="s", label="cuBLAS")
    ax.set_xscale("log")
    ax.set_yscale("log")
    rates = [t for p, _ in shown for t in (p.best["tflops"], p.best["cublas_tflops"]) if t]
    ax.set_ylim(min(rates + [device.peak_tflops_bf16]) / 3, device.peak_tflops_bf16 * 1.6)
    ax.set_xlabel("arithmetic intensity: FLOP per byte of A, B and C moved once")
    ax.set_ylabel("TFLOP/s")
    ax.legend(loc="lower right", fontsize=7)
    ax.grid(True, which="both", linewidth=0.3, alpha=0.5)
    if numbered:
        key = "\n".join(f"{n:>2}  {p.label}: {r.bound}-bound" for n, (p, r) in enumerate(shown, 1))
        ax.text(1.02, 1.0, key, transform=ax.transAxes, va="top", fontsize=7, family="monospace")
    return png_img(fig, titled(f"roofline of {device.name}", kind), ax)
