"""`tunefw export --format cpp`: a self-contained C++17 header of a dispatch table.

The header's lookup() gives the same answer as tunefw.runtime.rules.lookup(table, problem) on the
table's own device: the rules of tunefw/runtime/rules.py (exact, bucket, nearest, calibration
evidence and its unproven routes, cuBLAS routes), written out in C++. check() cannot run in
C++, so validity is split in two:

* the part of check() that does not depend on the shape (space, device limits) is evaluated
  here, per entry, on the entry's own shape: ``nearest_ok`` (an entry whose config fails its own
  shape serves no shape, its own included);
* the part that depends on the shape is written out below per family (``fits_<family>``),
  mirroring templates/<family>.py::_check. tests/test_export_cpp.py compares both with Python on
  random configs and shapes, so a change to a family's check() the header does not follow fails.

Distances use the same arithmetic as GemmProblem.log_distance (std::log, std::pow(d, 2.0),
left-to-right sum, std::sqrt). Python >= 3.12 sums floats with compensation, so there two
entries whose distances differ only in the last bit may be ordered differently.

Nothing from the table reaches the header unchecked: every config value is checked against its
family's declaration (type and value) and every template argument is an int literal; every
string (device name, labels, reasons) is an escaped C++ string literal, and comments carry only
escaped text.
"""
from __future__ import annotations

import math
import re

from tunefw.errors import UserError
from tunefw.problem import GATES
from tunefw.runtime.dispatch import DispatchEntry, DispatchTable, config_reason
from tunefw.export.cpp_fits import CPP_FITS, KNOBS_FROM_ARGS, RULE_DEFAULTS, RULE_FIELDS
from tunefw.templates import FAMILIES
from tunefw.templates.mma_sm80 import MAX_WORKSPACE_BYTES
from tunefw.templates.rows_sm90 import SM_RESERVED_SMEM

_INT = re.compile(r"-?[0-9]{1,19}")
_PLAIN = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,:;_-+=()[]<>/*#@%&!~^|{}")


def cpp_string(text: str) -> str:
    """``text`` as a C++ string literal: anything but plain printable ASCII as octal escapes."""
    return '"' + "".join(c if c in _PLAIN else "".join(f"\\{b:03o}" for b in c.encode("utf-8"))
                         for c in text) + '"'


def cpp_comment(text: str) -> str:
    """``text`` for a // comment: plain printable ASCII, the rest as octal escapes."""
    return cpp_string(text)[1:-1].replace("*/", "*\\057")


def cpp_int(value: object, what: str, bits: int = 32) -> str:
    """A checked int literal (never bool, float or text that is not a ``bits``-bit integer)."""
    text = str(value)
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not _INT.fullmatch(text) \
            or not -2**(bits - 1) <= int(text) < 2**(bits - 1):
        raise UserError(f"--format cpp: {what}={value!r}: expected a {bits}-bit integer")
    return str(int(text))


def cpp_double(value: float | None, what: str) -> str:
    """A finite double literal; None (unknown) is -1.0."""
    if value is None:
        return "-1.0"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UserError(f"--format cpp: {what}={value!r}: expected a finite number")
    return repr(float(value))


def _template_args(e: DispatchEntry, index: int) -> list[str]:
    reason = config_reason(e.family, e.config)
    if reason:
        raise UserError(f"--format cpp: entries[{index}].config: {reason}")
    args = FAMILIES[e.family].template_args(e.config, e.dtype, e.gate)
    return [cpp_int(a, f"entries[{index}] template argument {k}") for k, a in enumerate(args)]


def _cpp_entry(e: DispatchEntry, index: int, nearest_ok: bool) -> str:
    args = _template_args(e, index)
    rules = ", ".join(cpp_int(e.config.get(f, RULE_DEFAULTS.get(f, 0)), f"entries[{index}].{f}")
                      for f in RULE_FIELDS)
    hint = FAMILIES[e.family].cost_hint(e.config)
    tile = ", ".join(cpp_int(v, f"entries[{index}] tile")
                     for v in (hint.tile_m, hint.tile_n, hint.split_k))
    ratio = e.ratio
    dims = ", ".join(cpp_int(v, f"entries[{index}].{n}", 63) for n, v in zip("MNK", (e.M, e.N, e.K)))
    return (f"    {{{dims}, DType::{e.dtype}, Family::{e.family}, Gate::{e.gate}, "
            f"{cpp_string(FAMILIES[e.family].name_expression(e.config, e.dtype, e.gate))}, {len(args)}, "
            f"{{{', '.join(args)}}}, {rules}, {tile}, {str(nearest_ok).lower()}, "
            f"{str(e.is_cublas).lower()}, {cpp_double(e.tflops, 'tflops')}, "
            f"{cpp_double(e.cublas_tflops, 'cublas_tflops')}, {cpp_double(ratio, 'ratio')}, "
            f"{cpp_int(e.trial_id, f'entries[{index}].trial_id', 64)}LL, "
            f"{cpp_string(e.label)}, {cpp_string(e.reason or '')}}},  // [{index}]")


def _cpp_evidence(table: DispatchTable) -> str:
    index = {}
    for i, e in enumerate(table.entries):  # evidence is of plain GEMMs (rules.evidence_for)
        if e.gate == "none":
            index.setdefault((e.M, e.N, e.K, e.dtype, e.layout), i)
    rows = []
    for j, v in enumerate(table.evidence):
        i = index.get((*v.served_by, v.dtype, v.layout))
        if i is None:
            raise UserError(f"--format cpp: evidence[{j}] is served by no entry")
        dims = ", ".join(cpp_int(x, f"evidence[{j}].{n}", 63) for n, x in zip("MNK", (v.M, v.N, v.K)))
        rows.append(f"    {{{dims}, DType::{v.dtype}, {i}, {cpp_double(v.tflops, 'tflops')}, "
                    f"{cpp_double(v.cublas_tflops, 'cublas_tflops')}, "
                    f"{cpp_double(v.ratio, 'ratio')}}},  // evidence[{j}] ({v.rule})")
    return "\n".join(rows) or "    {0, 0, 0, DType::bf16, -1, 0.0, 0.0, 0.0},  // none"


def _knob_prelude(family: str) -> str:
    """``const int64_t KNOB = e.args[i];`` for each declared knob of a KNOBS_FROM_ARGS family,
    at its place in the kernel's order (KernelTemplate.kernel_order, after the dtype code)."""
    if family not in KNOBS_FROM_ARGS:
        return ""
    return "".join(f"  [[maybe_unused]] const int64_t {name} = e.args[{i + 1}];\n"
                   for i, name in enumerate(FAMILIES[family].kernel_order()) if name != "GATED")


def render_cpp(table: DispatchTable) -> str:
    """A self-contained C++17 header: the entries, their template arguments and lookup()."""
    if not table.entries:
        raise UserError("the dispatch table has no entries: nothing to write")
    missing = sorted({e.family for e in table.entries} - set(CPP_FITS))
    if missing:
        raise UserError(f"--format cpp: no C++ validity rules for family {', '.join(missing)}")
    device = table.device()
    families = sorted(FAMILIES)
    fp = table.fingerprint
    name = str(fp.get("name", "mixed devices"))
    cc = fp.get("cc")
    cc_text = cpp_int(cc, "fingerprint.cc") if cc is not None else "0"
    max_args = max(len(_template_args(e, i)) for i, e in enumerate(table.entries))
    rows = "\n".join(_cpp_entry(e, i, FAMILIES[e.family].check(e.config, e.problem, device) is None)
                     for i, e in enumerate(table.entries))
    xmacro = " \\\n".join(
        f"  X({i}, {e.family}, {FAMILIES[e.family].kernel}, {', '.join(_template_args(e, i))})"
        for i, e in enumerate(table.entries))
    fits = "\n\n".join(
        f"inline bool fits_{f}(const Entry& e, int64_t M, int64_t N, int64_t K) {{\n"
        f"{_knob_prelude(f)}{CPP_FITS[f]}\n}}" for f in families if f in CPP_FITS)
    cases = "\n".join(f"    case Family::{f}: return detail::fits_{f}(e, M, N, K);"
                      for f in families if f in CPP_FITS)
    threshold = cpp_double(table.evidence_min_ratio, "evidence_min_ratio")
    return f"""\
// Generated by `tunefw export --format cpp`: the winners of a tuning study. Do not edit.
// Device: {cpp_comment(name)} (cc {cc_text}){" -- SIMULATED: no real measurement" if table.simulated else ""}
// Problems are C[M,N] = A[M,K] * B[N,K]^T (layout TN); gated ones (Gate::silu) are
// C = silu(A Bg^T) * (A Bu^T) for B = [Bg; Bu] of 2N rows (a SwiGLU MLP's gate and up).
//
// tunefw::dispatch::lookup(M, N, K, dtype, gate) answers like tunefw's Python DispatchTable.lookup
// (tunefw/runtime/rules.py); nullptr means "use cuBLAS" (gated: the stock form, one cuBLAS GEMM
// over [Bg; Bu] then SiLU and the product). Only entries of the asked gate are considered:
//  1. exact: the entry of that shape; a cuBLAS-route entry (it measured below cuBLAS) -> nullptr.
//  2. bucket: among the entries of the same layer (N, K, dtype) valid for the shape (cuBLAS-route
//     entries count as valid), the smallest tuned M above the asked M, else the largest below;
//     a cuBLAS-route entry -> nullptr.
//  3. nearest: else the nearest kernel entry of the same dtype by sqrt(sum((log x - log
//     x_entry)^2)) over M, N, K (ties: smaller M, then N, then K) valid for the shape.
//  4. evidence: for rules 2 and 3, the measured shapes (kEvidence) served by the same entry with
//     the same N, K: the shape's own measurement, else those next to it in M below and above;
//     any ratio below kEvidenceMinRatio -> nullptr; evidence on one side of M only, or an M
//     where the entry's tiles and last wave of SMs are fuller at both measured Ms than here
//     (tile_fill; unproven: the Python runtime's first-call guard may time it) -> nullptr.
// Shapes that are not tunable problems (M < 1, N or K not a positive multiple of 8) get nullptr.
// TUNEFW_DISPATCH_FOR_EACH(X) expands X(index, family, kernel, template arguments...) per entry,
// so an engine can instantiate every winner, e.g. kernel<template arguments...>.
#pragma once

#include <cmath>
#include <cstdint>

namespace tunefw {{
namespace dispatch {{

enum class DType : int {{ bf16 = 0, fp16 = 1 }};
enum class Gate : int {{ {", ".join(f"{g} = {i}" for i, g in enumerate(GATES))} }};
enum class Family : int {{ {", ".join(f"{n} = {i}" for i, n in enumerate(families))} }};
enum class Rule : int {{ none = 0, exact = 1, bucket = 2, nearest = 3 }};

struct Entry {{
  int64_t M, N, K;
  DType dtype;
  Family family;
  Gate gate;  // the problem's gate: the entry serves only that gate
  const char* kernel;  // the instantiation, e.g. "gemm_wgmma_sm90<0, 128, ...>"
  int num_args;
  int args[{max_args}];  // its template arguments, in the kernel's order (GATED after the knobs)
  int bm, bn, bk, split_k, cluster_m, cluster_n, persistent;  // what the validity rules read
  int tile_m, tile_n, tile_split;  // C's tile over (M, N) and its K split: rule 4's tile fill
  bool nearest_ok;  // the config passed check() on its own shape: it may serve (any shape)
  bool cublas_route;  // exported as a cuBLAS route: its winner measured below cuBLAS
  double tflops, cublas_tflops, ratio;  // measured; -1.0: no cuBLAS figure
  int64_t trial_id;
  const char* label;  // the layer, e.g. "llama3_8b.qkv"
  const char* reason;  // why a cuBLAS route ("" for kernel entries)
}};

struct Evidence {{  // a calibration measurement of a shape a non-exact rule serves
  int64_t M, N, K;
  DType dtype;
  int entry;  // index of the entry that served it (-1: none, the placeholder row)
  double tflops, cublas_tflops, ratio;
}};

inline constexpr bool kSimulated = {str(table.simulated).lower()};
inline constexpr const char* kDeviceName = {cpp_string(name if "name" in fp else "mixed")};
inline constexpr int kDeviceCC = {cc_text};
inline constexpr double kEvidenceMinRatio = {threshold};
inline constexpr int kNumEntries = {len(table.entries)};
inline constexpr Entry kEntries[kNumEntries] = {{
{rows}
}};
inline constexpr int kNumEvidence = {len(table.evidence)};
inline constexpr Evidence kEvidence[{max(1, len(table.evidence))}] = {{
{_cpp_evidence(table)}
}};

#define TUNEFW_DISPATCH_FOR_EACH(X) \\
{xmacro}

namespace detail {{
inline constexpr int64_t kMaxGrid = 2147483647;
inline constexpr int64_t kMaxWorkspaceBytes = {MAX_WORKSPACE_BYTES}LL;
inline constexpr int64_t kSmemPerBlockOptin = {cpp_int(device.smem_per_block_optin, "smem_per_block_optin")};
inline constexpr int64_t kSmemPerSm = {cpp_int(device.smem_per_sm, "smem_per_sm")};
inline constexpr int64_t kSmemReservedPerBlock = {SM_RESERVED_SMEM};
inline constexpr int64_t kSmCount = {cpp_int(device.sm_count, "sm_count")};
inline int64_t cdiv(int64_t a, int64_t b) {{ return (a + b - 1) / b; }}

// The useful share of e's launched work at (M, N): C over its padded tiles, times the fill of
// its last wave of SMs (tunefw/runtime/rules.py tile_fill, the same arithmetic).
inline double tile_fill(const Entry& e, int64_t M, int64_t N) {{
  const int64_t rows = cdiv(M, e.tile_m), cols = cdiv(N, e.tile_n);
  const int64_t items = rows * cols * e.tile_split, waves = cdiv(items, kSmCount);
  return double(M * N) / double(rows * e.tile_m * cols * e.tile_n) * double(items) /
         double(waves * kSmCount);
}}

{fits}

inline double log_distance(const Entry& e, int64_t M, int64_t N, int64_t K) {{
  double sum = 0.0;
  sum += std::pow(std::log(double(M)) - std::log(double(e.M)), 2.0);
  sum += std::pow(std::log(double(N)) - std::log(double(e.N)), 2.0);
  sum += std::pow(std::log(double(K)) - std::log(double(e.K)), 2.0);
  return std::sqrt(sum);
}}
}}  // namespace detail

// Whether entry e's config can run the shape (the shape-dependent part of check()).
inline bool fits(const Entry& e, int64_t M, int64_t N, int64_t K) {{
  switch (e.family) {{
{cases}
  }}
  return false;
}}

// Rules 1-3: the index of the entry the table's rule picks (cuBLAS routes included), or -1.
inline int rule_index(int64_t M, int64_t N, int64_t K, DType dtype, Gate gate, Rule* rule) {{
  *rule = Rule::none;
  for (int i = 0; i < kNumEntries; ++i) {{
    const Entry& e = kEntries[i];
    if (e.dtype == dtype && e.gate == gate && e.M == M && e.N == N && e.K == K && (e.cublas_route || e.nearest_ok)) {{
      *rule = Rule::exact;
      return i;
    }}
  }}
  int above = -1, below = -1;
  for (int i = 0; i < kNumEntries; ++i) {{
    const Entry& e = kEntries[i];
    if (e.dtype != dtype || e.gate != gate || e.N != N || e.K != K) continue;
    if (!e.cublas_route && !(e.nearest_ok && fits(e, M, N, K))) continue;
    if (e.M > M && (above < 0 || e.M < kEntries[above].M)) above = i;
    if (e.M < M && (below < 0 || e.M > kEntries[below].M)) below = i;
  }}
  if (above >= 0 || below >= 0) {{
    *rule = Rule::bucket;
    return above >= 0 ? above : below;
  }}
  int best = -1;
  double best_d = 0.0;
  for (int i = 0; i < kNumEntries; ++i) {{
    const Entry& e = kEntries[i];
    if (e.dtype != dtype || e.gate != gate || e.cublas_route || !e.nearest_ok || !fits(e, M, N, K))
      continue;
    const double d = detail::log_distance(e, M, N, K);
    const Entry* b = best < 0 ? nullptr : &kEntries[best];
    if (b == nullptr || d < best_d ||
        (d == best_d && (e.M < b->M || (e.M == b->M && (e.N < b->N ||
                                          (e.N == b->N && e.K < b->K)))))) {{
      best = i;
      best_d = d;
    }}
  }}
  if (best >= 0) *rule = Rule::nearest;
  return best;
}}

// lookup() as an index into kEntries, -1 for cuBLAS.
inline int lookup_index(int64_t M, int64_t N, int64_t K, DType dtype, Gate gate = Gate::none) {{
  if (M < 1 || N < 8 || K < 8 || N % 8 != 0 || K % 8 != 0) return -1;
  Rule rule;
  const int i = rule_index(M, N, K, dtype, gate, &rule);
  if (i < 0 || kEntries[i].cublas_route) return -1;
  if (rule == Rule::exact) return i;
  int below = -1, above = -1;  // rule 4: calibration evidence of the same entry and layer
  for (int j = 0; j < kNumEvidence; ++j) {{
    const Evidence& v = kEvidence[j];
    if (v.entry != i || v.dtype != dtype || v.N != N || v.K != K) continue;
    if (v.M == M) return v.ratio < kEvidenceMinRatio ? -1 : i;
    if (v.M < M && (below < 0 || v.M > kEvidence[below].M)) below = j;
    if (v.M > M && (above < 0 || v.M < kEvidence[above].M)) above = j;
  }}
  if ((below >= 0) != (above >= 0)) return -1;  // evidence on one side only: unproven
  if (below >= 0 && kEvidence[below].ratio < kEvidenceMinRatio) return -1;
  if (above >= 0 && kEvidence[above].ratio < kEvidenceMinRatio) return -1;
  if (below >= 0) {{  // bracketed: unproven where the tiles are emptier than at both sides
    const double fill = detail::tile_fill(kEntries[i], M, N);
    const double lo = detail::tile_fill(kEntries[i], kEvidence[below].M, N);
    const double hi = detail::tile_fill(kEntries[i], kEvidence[above].M, N);
    if (fill < (lo < hi ? lo : hi) - 1e-9) return -1;
  }}
  return i;
}}

// The entry for the shape, or nullptr: use cuBLAS.
inline const Entry* lookup(int64_t M, int64_t N, int64_t K, DType dtype, Gate gate = Gate::none) {{
  const int i = lookup_index(M, N, K, dtype, gate);
  return i < 0 ? nullptr : &kEntries[i];
}}

}}  // namespace dispatch
}}  // namespace tunefw
"""
