"""`tunefw export --format cpp`: the header compiles with g++ and answers like Python's lookup."""
import random
import shutil
import subprocess

import pytest

from tunefw.cli.compile import sample_configs
from conftest import invoke_cli
from tunefw.device import H200
from tunefw.errors import UserError
from tunefw.export.table import render
from tunefw.problem import GATES, GemmProblem
from tunefw.runtime.dispatch import DispatchEntry, DispatchTable
from tunefw.runtime.rules import decide, lookup
from tunefw.templates import FAMILIES

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")

MAIN = r"""
#include <cstdio>
#include "dispatch.h"
using namespace tunefw::dispatch;
int main() {
  long long M, N, K; int dt, gate;
  while (std::scanf("%lld %lld %lld %d %d", &M, &N, &K, &dt, &gate) == 5) {
    std::printf("%d ", lookup_index(M, N, K, DType(dt), Gate(gate)));
    for (const Entry& e : kEntries) std::printf("%d", fits(e, M, N, K) ? 1 : 0);
    std::printf("\n");
  }
  static_assert(kNumEntries > 0, "entries");
#define COUNT(i, family, kernel, ...) +1
  static_assert(0 TUNEFW_DISPATCH_FOR_EACH(COUNT) == kNumEntries, "x-macro");
  return 0;
}
"""


def _entries(seed: int) -> list[DispatchEntry]:
    """Entries of every family and dtype, with random valid configs (split-K, clusters)."""
    rng = random.Random(seed)
    entries = []
    names = ("mma_sm80", "wgmma_sm90", "skinny_sm90", "stream_sm90", "rows_sm90")
    for i in range(48):
        family = FAMILIES[names[i % len(names)]]
        ms = {"skinny_sm90": [1, 3, 8, 16, 33, 64], "stream_sm90": [1, 3, 8, 17, 32],
              "rows_sm90": [1, 3, 8]}.get(family.family, [16, 64, 128, 512, 2048, 4096, 8192])
        ks = [512, 2048, 4096] if family.family == "rows_sm90" else [64, 512, 4096, 14336]
        problem = GemmProblem(rng.choice(ms), rng.choice([256, 1024, 4096, 6144, 14336]),
                              rng.choice(ks), ("bf16", "fp16")[i % 4 == 0])
        (config,) = sample_configs(family, problem, H200, 1, seed=seed * 100 + i)
        entries.append(DispatchEntry(problem.M, problem.N, problem.K, problem.dtype, "TN",
                                     family.family, config, 100.0 + i, 90.0, i))
    wgmma = FAMILIES["wgmma_sm90"]  # swap-AB: its tiles count over (N, M), valid for M <= 256
    for i, (m, n) in enumerate(((129, 4096), (64, 6144))):
        config = [c for c in wgmma.seed_configs() if c["SWAP_AB"]][i + seed]
        entries.append(DispatchEntry(m, n, 4096, "bf16", "TN", "wgmma_sm90", config, 99.0, 90.0,
                                     100 + i))
    return entries


def _shapes(seed: int) -> list[tuple[int, int, int, str]]:
    rng = random.Random(seed)
    shapes = [(1, 8, 8, "bf16"), (17, 24, 40, "fp16"), (100, 100, 64, "bf16"), (0, 64, 64, "bf16"),
              (3000, 4096, 4096, "bf16"), (65536, 65536, 8, "fp16")]
    for _ in range(300):
        shapes.append((int(2 ** rng.uniform(0, 14.5)), 8 * int(2 ** rng.uniform(0, 12)),
                       8 * int(2 ** rng.uniform(0, 12)), rng.choice(["bf16", "fp16"])))
    return shapes


def _python_answer(table: DispatchTable, shape) -> int:
    M, N, K, dtype, *gate = shape
    try:
        problem = GemmProblem(M, N, K, dtype, gate=gate[0] if gate else "none")
    except UserError:
        return -1
    entry = lookup(table, problem)
    return -1 if entry is None else next(i for i, e in enumerate(table.entries) if e is entry)


def _run_header(tmp_path, table: DispatchTable, shapes) -> list[str]:
    (tmp_path / "dispatch.h").write_text(render(table, "cpp"))
    (tmp_path / "main.cpp").write_text(MAIN)
    built = subprocess.run(["g++", "-std=c++17", "-O1", "-Wall", "-Werror", "-o",
                            str(tmp_path / "lookup"), str(tmp_path / "main.cpp")],
                           capture_output=True, text=True, cwd=tmp_path)
    assert built.returncode == 0, built.stderr
    stdin = "".join(f"{M} {N} {K} {('bf16', 'fp16').index(d)} {GATES.index(g[0] if g else 'none')}\n"
                    for M, N, K, d, *g in shapes)
    run = subprocess.run([str(tmp_path / "lookup")], input=stdin, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    return run.stdout.splitlines()


@pytest.mark.parametrize("seed", [1, 2])
def test_header_lookup_and_validity_agree_with_python(tmp_path, seed):
    table = DispatchTable(False, {"name": "NVIDIA H200", "cc": 90}, _entries(seed))
    shapes = _shapes(seed) + [(e.M, e.N, e.K, e.dtype) for e in table.entries[::4]]
    lines = _run_header(tmp_path, table, shapes)
    assert len(lines) == len(shapes)
    kinds = {"exact": 0, "nearest": 0, "cublas": 0}
    for shape, line in zip(shapes, lines):
        index, fits = line.split()
        assert int(index) == _python_answer(table, shape), shape
        kinds["cublas" if index == "-1" else "exact" if shape[:3] == (
            table.entries[int(index)].M, table.entries[int(index)].N, table.entries[int(index)].K)
            else "nearest"] += 1
        if shape[0] < 1 or shape[1] % 8:
            continue  # not a problem: both sides answer cuBLAS
        problem = GemmProblem(*shape)
        for e, bit in zip(table.entries, fits):  # the shape-dependent rules, entry by entry
            assert (bit == "1") == (FAMILIES[e.family].check(e.config, problem, H200) is None), (shape, e)
    assert min(kinds.values()) >= 1 and kinds["nearest"] >= 100


def test_equidistant_entries_break_ties_by_smaller_shape(tmp_path):
    config = FAMILIES["wgmma_sm90"].default_config()
    entries = [DispatchEntry(4096, N, 4096, "bf16", "TN", "wgmma_sm90", config, 1.0, None, N)
               for N in (8192, 2048)]
    entries += [DispatchEntry(M, 1024, 1024, "bf16", "TN", "wgmma_sm90", config, 1.0, None, M)
                for M in (8192, 2048)]
    table = DispatchTable(False, {"name": "NVIDIA H200", "cc": 90}, entries)
    shapes = [(4096, 4096, 4096, "bf16"), (4096, 4096, 4096, "fp16"), (4096, 1024, 1024, "bf16")]
    answers = [line.split()[0] for line in _run_header(tmp_path, table, shapes)]
    # nearest: equidistant N=8192 and N=2048 -> the smaller; bucket: the tuned M above (8192)
    assert answers == ["1", "-1", "2"] == [str(_python_answer(table, s)) for s in shapes]


def test_header_text(tmp_path):
    wg = FAMILIES["wgmma_sm90"]
    entry = DispatchEntry(4096, 4096, 4096, "bf16", "TN", "wgmma_sm90", wg.default_config(), 700.0, 650.0, 7)
    text = render(DispatchTable(True, {"name": "SIMULATED NVIDIA H200", "cc": 90}, [entry]), "cpp")
    targs = wg.template_args(wg.default_config(), "bf16")
    args = ", ".join(targs)
    assert len(targs) == 1 + len(wg.params) == 15
    assert f"X(0, wgmma_sm90, gemm_wgmma_sm90, {args})" in text
    assert f'"gemm_wgmma_sm90<{args}>", 15, {{{args}}}' in text
    assert "SIMULATED" in text and "inline constexpr bool kSimulated = true;" in text
    with pytest.raises(UserError, match="no entries"):
        render(DispatchTable(False, {}, []), "cpp")


def test_export_command_writes_the_header(tmp_path, db_url):
    made = invoke_cli("study", "create", "h", "--shape", "256x256x256", db=db_url)
    assert made.returncode == 0, made.stderr
    empty = invoke_cli("export", str(tmp_path / "d.h"), "--format", "cpp", db=db_url)
    assert empty.returncode == 1 and "no OK trial" in empty.stderr
    bad = invoke_cli("export", str(tmp_path / "d.h"), "--format", "hpp", db=db_url)
    assert bad.stderr.strip() == "tunefw: error: --format 'hpp': expected one of json, csv, cpp"


# ---- model tables: bucket rule, cuBLAS routes, calibration evidence -----------------------------
def _model_table(seed: int) -> DispatchTable:
    """Layers over an M grid (some winners lost: cuBLAS routes) plus measured in-between shapes."""
    from tunefw.runtime.dispatch import Evidence

    rng = random.Random(seed)
    layers = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]
    entries = []
    for n, k in layers:
        for m in rng.sample([1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192], 7):
            family = FAMILIES[rng.choice(["mma_sm80", "wgmma_sm90"])]
            problem = GemmProblem(m, n, k)
            (config,) = sample_configs(family, problem, H200, 1, seed=rng.randrange(10**6))
            lost = rng.random() < 0.2 or len(entries) % 9 == 4
            entries.append(DispatchEntry(m, n, k, "bf16", "TN", family.family, config, 100.0,
                                         120.0 if lost else 90.0, len(entries), label=f"l{n}x{k}",
                                         route="cublas" if lost else "kernel",
                                         reason="confirmed ratio 0.833 < min ratio 1" if lost else None))
    table = DispatchTable(False, {"name": "NVIDIA H200", "cc": 90}, entries)
    evidence, seen = [], {(e.M, e.N, e.K) for e in entries}
    for _ in range(60):
        n, k = rng.choice(layers[:2] + [(2048, 4096)])  # layers[2:]: no evidence
        m = rng.randrange(1, 9000)
        route = decide(table, GemmProblem(m, n, k))
        if route.entry is None or route.path == "exact" or (m, n, k) in seen:
            continue
        seen.add((m, n, k))
        e = route.entry
        evidence.append(Evidence(m, n, k, "bf16", "TN", route.rule, (e.M, e.N, e.K),
                                 rng.uniform(50, 130), 100.0))
    table.evidence = evidence
    return table


@pytest.mark.parametrize("seed", [3, 4])
def test_header_follows_bucket_rule_cublas_routes_and_evidence(tmp_path, seed):
    table = _model_table(seed)
    rng = random.Random(seed)
    shapes = [(v.M, v.N, v.K, "bf16") for v in table.evidence]
    shapes += [(v.M + d, v.N, v.K, "bf16") for v in table.evidence for d in (-1, 1) if v.M + d >= 1]
    shapes += [(e.M, e.N, e.K, "bf16") for e in table.entries]
    shapes += [(rng.randrange(1, 12000), n, k, rng.choice(["bf16", "bf16", "fp16"]))
               for n, k in [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (2048, 4096),
                            (1024, 8192)] for _ in range(40)]
    lines = _run_header(tmp_path, table, shapes)
    paths: dict[str, int] = {}
    for shape, line in zip(shapes, lines):
        assert int(line.split()[0]) == _python_answer(table, shape), shape
        route = decide(table, GemmProblem(*shape))
        paths[route.path] = paths.get(route.path, 0) + 1
        if route.path == "cublas" and route.rule:
            paths["cublas_" + route.rule] = paths.get("cublas_" + route.rule, 0) + 1
    for path in ("exact", "bucket", "nearest", "calibrated", "unproven", "cublas", "cublas_exact",
                 "cublas_bucket"):
        assert paths.get(path, 0) >= 1, (path, paths)
    text = render(table, "cpp")
    assert f"inline constexpr int kNumEvidence = {len(table.evidence)};" in text
    lost = next(e for e in table.entries if e.is_cublas)
    assert "true, 100.0, 120.0, 0.8333333333333334" in text and '"confirmed ratio 0.833' in text
    assert f'"l{lost.N}x{lost.K}"' in text


# ---- nothing from the table reaches the header unchecked -----------------------------------------
@pytest.mark.parametrize("change, needle", [
    ({"GROUP": "8> int evil() { return 1; } template <int X"}, "GROUP='8> int evil()"),
    ({"STAGES": True}, "STAGES=True"),
    ({"GROUP": True}, "GROUP=True is a bool, expected an int"),
    ({"STAGES": 4.0}, "STAGES=4.0 is a float, expected an int"),
    ({"GROUP": 1 << 40}, "GROUP=1099511627776"),
])
def test_crafted_config_values_are_refused(change, needle):
    wg = FAMILIES["wgmma_sm90"]
    entry = DispatchEntry(4096, 4096, 4096, "bf16", "TN", "wgmma_sm90",
                          dict(wg.default_config(), **change), 700.0, 650.0, 7)
    with pytest.raises(UserError, match="--format cpp: entries\\[0\\]") as exc:
        render(DispatchTable(False, {"name": "NVIDIA H200", "cc": 90}, [entry]), "cpp")
    assert needle in str(exc.value)


def test_crafted_device_name_and_label_are_escaped(tmp_path):
    name = 'H200" ; int injected = 1; //\n#error injected\n\\ ?? é'
    wg = FAMILIES["wgmma_sm90"]
    entry = DispatchEntry(4096, 4096, 4096, "bf16", "TN", "wgmma_sm90", wg.default_config(),
                          700.0, 650.0, 7, label='x"\n#error label', reason="*/ \n")
    table = DispatchTable(False, {"name": name, "cc": 90}, [entry])
    (tmp_path / "dispatch.h").write_text(render(table, "cpp"))
    (tmp_path / "main.cpp").write_text(
        '#include <cstdio>\n#include "dispatch.h"\nint main() { std::fputs(tunefw::dispatch::kDeviceName,'
        ' stdout); std::fputs("|", stdout); std::fputs(tunefw::dispatch::kEntries[0].label, stdout); }\n')
    built = subprocess.run(["g++", "-std=c++17", "-Wall", "-Werror", "-o", str(tmp_path / "n"),
                            str(tmp_path / "main.cpp")], capture_output=True, text=True, cwd=tmp_path)
    assert built.returncode == 0, built.stderr
    run = subprocess.run([str(tmp_path / "n")], capture_output=True)
    assert run.stdout.decode("utf-8") == name + "|" + entry.label
    with pytest.raises(UserError, match="fingerprint.cc='90; evil'"):
        render(DispatchTable(False, {"name": "NVIDIA H200", "cc": "90; evil"}, [entry]), "cpp")


def test_header_leaves_an_m_with_emptier_tiles_than_its_bracket_unproven(tmp_path):
    """Rule 4's tile fill in C++: between wins measured at M=600 and M=1100 (tiles of 128x256
    56.8% and 52.1% full), M=1050 (49.7%) is cuBLAS and M=1024 (97.0%) the entry, as in Python."""
    from tunefw.runtime.dispatch import Evidence

    config = dict(FAMILIES["wgmma_sm90"].default_config(), CLUSTER_M=1)
    entry = DispatchEntry(2048, 4096, 4096, "bf16", "TN", "wgmma_sm90", config, 500.0, 450.0, 1)
    table = DispatchTable(False, {"name": "NVIDIA H200", "cc": 90}, [entry], evidence=[
        Evidence(m, 4096, 4096, "bf16", "TN", "bucket", (2048, 4096, 4096), r * 450.0, 450.0)
        for m, r in ((600, 1.05), (1100, 1.2))])
    shapes = [(m, 4096, 4096, "bf16") for m in (600, 1024, 1050, 1100)]
    lines = _run_header(tmp_path, table, shapes)
    assert [int(line.split()[0]) for line in lines] == [0, 0, -1, 0]
    assert [_python_answer(table, s) for s in shapes] == [0, 0, -1, 0]


def _gated_entries(seed: int) -> list[DispatchEntry]:
    """Gated entries of both gated families (random valid configs) beside plain ones of the
    very same shapes, so that a wrong gate filter shows."""
    rng = random.Random(seed)
    entries = []
    for i in range(16):
        family = FAMILIES[("stream_sm90", "wgmma_sm90")[i % 2]]
        m = rng.choice([1, 5, 16, 33] if family.family == "stream_sm90" else [64, 512, 2048])
        problem = GemmProblem(m, rng.choice([1024, 4096, 14336]), 4096, gate="silu")
        (config,) = sample_configs(family, problem, H200, 1, seed=seed * 100 + i)
        for gate in ("silu", "none"):
            entries.append(DispatchEntry(m, problem.N, 4096, "bf16", "TN", family.family, config,
                                         100.0 + i, 90.0, 2 * i + (gate == "none"), gate=gate))
    return entries


@pytest.mark.parametrize("seed", [1, 2])
def test_header_serves_each_gate_from_its_own_entries_like_python(tmp_path, seed):
    table = DispatchTable(False, {"name": "NVIDIA H200", "cc": 90}, _gated_entries(seed))
    rng = random.Random(seed)
    shapes = [(e.M, e.N, e.K, e.dtype, e.gate) for e in table.entries]
    shapes += [(int(2 ** rng.uniform(0, 12)), e.N, e.K, "bf16", gate)  # the layers' other M: bucket
               for e in table.entries for gate in GATES]
    shapes += [(int(2 ** rng.uniform(0, 12)), 8 * int(2 ** rng.uniform(3, 11)), 4096, "bf16",
                rng.choice(GATES)) for _ in range(200)]  # other layers: nearest
    lines = _run_header(tmp_path, table, shapes)
    served = {"none": 0, "silu": 0}
    for shape, line in zip(shapes, lines):
        index, fits = line.split()
        assert int(index) == _python_answer(table, shape), shape
        if index != "-1":
            assert table.entries[int(index)].gate == shape[4]
            served[shape[4]] += 1
        problem = GemmProblem(*shape[:4], gate=shape[4])
        for e, bit in zip(table.entries, fits):
            if e.gate == shape[4]:  # fits reads the entry's own gate: same-gate pairs compare
                assert (bit == "1") == (FAMILIES[e.family].check(e.config, problem, H200) is None), (shape, e)
    assert min(served.values()) >= 10
    header = (tmp_path / "dispatch.h").read_text()
    gated = next(e for e in table.entries if e.gate == "silu")
    assert cpp_kernel(gated) in header  # the gated instantiation, GATED=1 last


def cpp_kernel(e: DispatchEntry) -> str:
    return FAMILIES[e.family].name_expression(e.config, e.dtype, e.gate)
