"""Winners of a study -> dispatch table (JSON, versioned schema), CSV, or a C++ header."""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from tunefw.dispatch import DispatchEntry, DispatchTable
from tunefw.errors import UserError
from tunefw.fileio import write_atomic
from tunefw.store import Store
from tunefw.store import queries as q
from tunefw.store.models import Winner
from tunefw.templates import FAMILIES
from tunefw.templates.mma_sm80 import MAX_WORKSPACE_BYTES

FORMATS = ("json", "csv", "cpp")


def build_table(store: Store, study_name: str | None, allow_mixed: bool = False) -> DispatchTable:
    """One entry per problem: its confirmed winner, else its best OK trial (by ratio to cuBLAS)."""
    with store.session() as s:
        study = q.get_study(s, study_name)
        entries, fingerprints, evaluators = [], {}, set()
        for prow in study.problems:
            winner = s.get(Winner, prow.id)
            if winner is not None:
                trial = s.get(q.Trial, winner.trial_id)
                tflops, cublas = winner.tflops, winner.cublas_tflops
            else:
                trial = q.best_trial(s, prow, study.round)
                if trial is None:
                    continue
                tflops, cublas = trial.tflops, trial.cublas_tflops
            fingerprints.setdefault(trial.fingerprint_key, trial.fingerprint)
            evaluators.add(trial.evaluator)
            entries.append(DispatchEntry(prow.M, prow.N, prow.K, prow.dtype, prow.layout,
                                         trial.family, trial.config, tflops, cublas, trial.id))
        if not entries:
            raise UserError(f"study {study.name!r} has no OK trial to export (launch it first)")
        if len(fingerprints) > 1 and not allow_mixed:
            names = sorted({fp.get("name", "?") for fp in fingerprints.values()})
            raise UserError(f"study {study.name!r} mixes results from {len(fingerprints)} devices "
                            f"({', '.join(names)}): pass --allow-mixed-devices to export anyway")
        fingerprint = next(iter(fingerprints.values())) if len(fingerprints) == 1 else {
            "mixed": list(fingerprints.values())}
        return DispatchTable(simulated="sim" in evaluators, fingerprint=fingerprint,
                             entries=entries)


def render(table: DispatchTable, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(table.as_dict(), indent=2) + "\n"
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(["M", "N", "K", "dtype", "layout", "family", "config", "tflops",
                         "cublas_tflops", "trial_id", "simulated"])
        for e in table.entries:
            writer.writerow([e.M, e.N, e.K, e.dtype, e.layout, e.family,
                             json.dumps(e.config, sort_keys=True), e.tflops, e.cublas_tflops,
                             e.trial_id, table.simulated])
        return out.getvalue()
    if fmt == "cpp":
        return render_cpp(table)
    raise UserError(f"--format {fmt!r}: expected one of {', '.join(FORMATS)}")


def export(store: Store, path: Path, study_name: str | None, fmt: str,
           allow_mixed: bool = False) -> DispatchTable:
    """Write the study's dispatch table to ``path``; nothing is written on error."""
    if fmt not in FORMATS:
        raise UserError(f"--format {fmt!r}: expected one of {', '.join(FORMATS)}")
    table = build_table(store, study_name, allow_mixed)
    text = render(table, fmt)
    write_atomic(path, text)
    return table


# ---- C++ header ---------------------------------------------------------------------------
# The header's lookup gives the same answer as DispatchTable.lookup(problem) (the table's own
# device): exact (M, N, K, dtype) match first, in file order; else, among the same dtype, the
# entry with the smallest (log distance, M, N, K) whose config is valid for the asked shape.
# check() cannot run in C++, so validity is split in two:
#   * the part of check() that does not depend on the shape (space, device limits) is evaluated
#     here, per entry, on the entry's own shape: `nearest_ok` (an entry whose config fails its own
#     shape is served exactly but never as a nearest entry);
#   * the part that depends on the shape is written out below per family (`fits_<family>`),
#     mirroring templates/<family>.py::_check. tests/test_export_cpp.py compares both with
#     Python on random configs and shapes, so a change to a family's check() that the header
#     does not follow fails there.
# Distances use the same arithmetic as GemmProblem.log_distance (std::log, std::pow(d, 2.0),
# left-to-right sum, std::sqrt). Python >= 3.12 sums floats with compensation, so there two
# entries whose distances differ only in the last bit may be ordered differently.
CPP_FITS = {
    "mma_sm80": """\
  if (e.split_k > 1) {
    const int64_t ktiles = cdiv(K, e.bk);
    if (e.split_k > ktiles) return false;
    if (cdiv(ktiles, e.split_k) * (e.split_k - 1) >= ktiles) return false;
    const int64_t tiles = cdiv(M, e.bm) * cdiv(N, e.bn);
    const int64_t per_tile = int64_t(e.split_k) * e.bm * e.bn * 4;
    if (tiles > kMaxWorkspaceBytes / per_tile) return false;
    if (cdiv(tiles * 4, 256) * 256 + tiles * per_tile > kMaxWorkspaceBytes) return false;
  }
  return cdiv(M, e.bm) * cdiv(N, e.bn) <= kMaxGrid;""",
    "wgmma_sm90": """\
  const int64_t num_m = cdiv(M, e.bm), num_n = cdiv(N, e.bn);
  if (e.cluster_m > num_m || e.cluster_n > num_n) return false;
  if (e.split_k > cdiv(K, e.bk)) return false;
  if (e.persistent == 0 &&
      cdiv(num_m, e.cluster_m) * cdiv(num_n, e.cluster_n) * e.split_k * e.cluster_m > kMaxGrid)
    return false;
  return true;""",
}
RULE_FIELDS = ("BM", "BN", "BK", "SPLIT_K", "CLUSTER_M", "CLUSTER_N", "PERSISTENT")
RULE_DEFAULTS = {"SPLIT_K": 1, "CLUSTER_M": 1, "CLUSTER_N": 1, "PERSISTENT": 1}


def _cpp_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _cpp_entry(e: DispatchEntry, index: int, nearest_ok: bool) -> str:
    family = FAMILIES[e.family]
    args = family.template_args(e.config, e.dtype)
    rules = ", ".join(str(int(e.config.get(f, RULE_DEFAULTS.get(f, 0)))) for f in RULE_FIELDS)
    return (f"    {{{e.M}, {e.N}, {e.K}, DType::{e.dtype}, Family::{e.family}, "
            f"{_cpp_string(family.name_expression(e.config, e.dtype))}, {len(args)}, "
            f"{{{', '.join(args)}}}, {rules}, {str(nearest_ok).lower()}, {e.tflops!r}, "
            f"{e.trial_id}}},  // [{index}]")


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
    max_args = max(len(FAMILIES[e.family].template_args(e.config, e.dtype)) for e in table.entries)
    rows = "\n".join(_cpp_entry(e, i, FAMILIES[e.family].check(e.config, e.problem, device) is None)
                     for i, e in enumerate(table.entries))
    xmacro = " \\\n".join(
        f"  X({i}, {e.family}, {FAMILIES[e.family].kernel}, "
        f"{', '.join(FAMILIES[e.family].template_args(e.config, e.dtype))})"
        for i, e in enumerate(table.entries))
    fits = "\n\n".join(
        f"inline bool fits_{name}(const Entry& e, int64_t M, int64_t N, int64_t K) {{\n"
        f"{CPP_FITS[name]}\n}}" for name in families if name in CPP_FITS)
    cases = "\n".join(f"    case Family::{name}: return detail::fits_{name}(e, M, N, K);"
                      for name in families if name in CPP_FITS)
    return f"""\
// Generated by `tunefw export --format cpp`: the winners of a tuning study. Do not edit.
// Device: {fp.get("name", "mixed devices")} (cc {fp.get("cc")}){" -- SIMULATED: no real measurement" if table.simulated else ""}
// Problems are C[M,N] = A[M,K] * B[N,K]^T (layout TN).
//
// tunefw::dispatch::lookup(M, N, K, dtype) answers like tunefw's Python DispatchTable.lookup:
// the exact (M, N, K, dtype) entry, else the nearest entry of the same dtype by
// sqrt(sum((log x - log x_entry)^2)) over M, N, K (ties: smaller M, then N, then K) among the
// entries whose config is valid for the asked shape; nullptr means "use cuBLAS". Shapes that are
// not tunable problems (M < 1, N or K not a positive multiple of 8) get nullptr.
// TUNEFW_DISPATCH_FOR_EACH(X) expands X(index, family, kernel, template arguments...) per entry,
// so an engine can instantiate every winner, e.g. kernel<template arguments...>.
#pragma once

#include <cmath>
#include <cstdint>

namespace tunefw {{
namespace dispatch {{

enum class DType : int {{ bf16 = 0, fp16 = 1 }};
enum class Family : int {{ {", ".join(f"{n} = {i}" for i, n in enumerate(families))} }};

struct Entry {{
  int64_t M, N, K;
  DType dtype;
  Family family;
  const char* kernel;  // the instantiation, e.g. "gemm_wgmma_sm90<0, 128, ...>"
  int num_args;
  int args[{max_args}];  // its template arguments, in the kernel's order
  int bm, bn, bk, split_k, cluster_m, cluster_n, persistent;  // what the validity rules read
  bool nearest_ok;  // the config passed check() on its own shape: it may serve other shapes
  double tflops;
  int64_t trial_id;
}};

inline constexpr bool kSimulated = {str(table.simulated).lower()};
inline constexpr const char* kDeviceName = {_cpp_string(str(fp.get("name", "mixed")))};
inline constexpr int kDeviceCC = {int(fp.get("cc") or 0)};
inline constexpr int kNumEntries = {len(table.entries)};
inline constexpr Entry kEntries[kNumEntries] = {{
{rows}
}};

#define TUNEFW_DISPATCH_FOR_EACH(X) \\
{xmacro}

namespace detail {{
inline constexpr int64_t kMaxGrid = 2147483647;
inline constexpr int64_t kMaxWorkspaceBytes = {MAX_WORKSPACE_BYTES}LL;
inline int64_t cdiv(int64_t a, int64_t b) {{ return (a + b - 1) / b; }}

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

// The entry for the shape (exact, else nearest valid), or nullptr: use cuBLAS.
inline const Entry* lookup(int64_t M, int64_t N, int64_t K, DType dtype) {{
  if (M < 1 || N < 8 || K < 8 || N % 8 != 0 || K % 8 != 0) return nullptr;
  for (const Entry& e : kEntries)
    if (e.dtype == dtype && e.M == M && e.N == N && e.K == K) return &e;
  const Entry* best = nullptr;
  double best_d = 0.0;
  for (const Entry& e : kEntries) {{
    if (e.dtype != dtype || !e.nearest_ok || !fits(e, M, N, K)) continue;
    const double d = detail::log_distance(e, M, N, K);
    if (best == nullptr || d < best_d ||
        (d == best_d && (e.M < best->M || (e.M == best->M && (e.N < best->N ||
                                             (e.N == best->N && e.K < best->K)))))) {{
      best = &e;
      best_d = d;
    }}
  }}
  return best;
}}

// lookup() as an index into kEntries, -1 for cuBLAS.
inline int lookup_index(int64_t M, int64_t N, int64_t K, DType dtype) {{
  const Entry* e = lookup(M, N, K, dtype);
  return e == nullptr ? -1 : int(e - kEntries);
}}

}}  // namespace dispatch
}}  // namespace tunefw
"""
