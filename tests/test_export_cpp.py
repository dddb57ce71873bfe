"""`tunefw export --format cpp`: the header compiles with g++ and answers like Python's lookup."""
import random
import shutil
import subprocess

import pytest

from tunefw.compile_cmd import sample_configs
from tunefw.device import H200
from tunefw.dispatch import DispatchEntry, DispatchTable
from tunefw.errors import UserError
from tunefw.export import render
from tunefw.problem import GemmProblem
from tunefw.templates import FAMILIES

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")

MAIN = r"""
#include <cstdio>
#include "dispatch.h"
using namespace tunefw::dispatch;
int main() {
  long long M, N, K; int dt;
  while (std::scanf("%lld %lld %lld %d", &M, &N, &K, &dt) == 4) {
    std::printf("%d ", lookup_index(M, N, K, DType(dt)));
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
    """Entries of both families and dtypes, with random valid configs (split-K, clusters)."""
    rng = random.Random(seed)
    entries = []
    for i in range(40):
        family = FAMILIES[("mma_sm80", "wgmma_sm90")[i % 2]]
        problem = GemmProblem(rng.choice([16, 64, 128, 512, 2048, 4096, 8192]),
                              rng.choice([256, 1024, 4096, 6144, 14336]),
                              rng.choice([64, 512, 4096, 14336]), ("bf16", "fp16")[i % 3 == 0])
        (config,) = sample_configs(family, problem, H200, 1, seed=seed * 100 + i)
        entries.append(DispatchEntry(problem.M, problem.N, problem.K, problem.dtype, "TN",
                                     family.family, config, 100.0 + i, 90.0, i))
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
    M, N, K, dtype = shape
    try:
        problem = GemmProblem(M, N, K, dtype)
    except UserError:
        return -1
    entry = table.lookup(problem)
    return -1 if entry is None else next(i for i, e in enumerate(table.entries) if e is entry)


def _run_header(tmp_path, table: DispatchTable, shapes) -> list[str]:
    (tmp_path / "dispatch.h").write_text(render(table, "cpp"))
    (tmp_path / "main.cpp").write_text(MAIN)
    built = subprocess.run(["g++", "-std=c++17", "-O1", "-Wall", "-Werror", "-o",
                            str(tmp_path / "lookup"), str(tmp_path / "main.cpp")],
                           capture_output=True, text=True, cwd=tmp_path)
    assert built.returncode == 0, built.stderr
    stdin = "".join(f"{M} {N} {K} {('bf16', 'fp16').index(d)}\n" for M, N, K, d in shapes)
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
    entries = [DispatchEntry(M, 4096, 4096, "bf16", "TN", "wgmma_sm90", config, 1.0, None, M)
               for M in (8192, 2048)]
    table = DispatchTable(False, {"name": "NVIDIA H200", "cc": 90}, entries)
    shapes = [(4096, 4096, 4096, "bf16"), (4096, 4096, 4096, "fp16")]
    answers = [line.split()[0] for line in _run_header(tmp_path, table, shapes)]
    assert answers == ["1", "-1"] == [str(_python_answer(table, s)) for s in shapes]


def test_header_text(tmp_path):
    wg = FAMILIES["wgmma_sm90"]
    entry = DispatchEntry(4096, 4096, 4096, "bf16", "TN", "wgmma_sm90", wg.default_config(), 700.0, 650.0, 7)
    text = render(DispatchTable(True, {"name": "SIMULATED NVIDIA H200", "cc": 90}, [entry]), "cpp")
    args = ", ".join(wg.template_args(wg.default_config(), "bf16"))
    assert f"X(0, wgmma_sm90, gemm_wgmma_sm90, {args})" in text
    assert f'"gemm_wgmma_sm90<{args}>", 14, {{{args}}}' in text
    assert "SIMULATED" in text and "inline constexpr bool kSimulated = true;" in text
    with pytest.raises(UserError, match="no entries"):
        render(DispatchTable(False, {}, []), "cpp")


def test_export_command_writes_the_header(tmp_path, cli, db_url):
    made = cli("study", "create", "h", "--shape", "256x256x256", db=db_url)
    assert made.returncode == 0, made.stderr
    empty = cli("export", str(tmp_path / "d.h"), "--format", "cpp", db=db_url)
    assert empty.returncode == 1 and "no OK trial" in empty.stderr
    bad = cli("export", str(tmp_path / "d.h"), "--format", "hpp", db=db_url)
    assert bad.stderr.strip() == "tunefw: error: --format 'hpp': expected one of json, csv, cpp"
