"""`tunefw report`: the HTML page of a study has its sections, figures and tables, with the values
of the study's rows.

The study's rows are written directly (conftest.seed_study): the report reads rows, and the
launches that make them are tested in test_launch_sim.py."""
import base64
import io
from html.parser import HTMLParser

import pytest
from PIL import Image

from conftest import invoke_cli, seed_study
from tunefw.device import H200
from tunefw.problem import GemmProblem
from tunefw.templates import FAMILIES

SHAPES = ("1024x1024x1024", "128x6144x4096")
LABELS = [f"{s} bf16" for s in SHAPES]
SECTIONS = ["summary", "ratio", "roofline", "convergence", "knobs", "trials", "winners", "outcomes",
            "device"]
KNOBS = list(FAMILIES["mma_sm80"].param_names)


class _Page(HTMLParser):
    """Collects sections, images (alt, src), tables by class (as row lists, with row classes)
    and the page's text."""

    def __init__(self) -> None:
        super().__init__()
        self.sections: list[str] = []
        self.imgs: list[dict] = []
        self.svgs = 0
        self.tables: dict[str, list[dict]] = {}
        self.text: list[str] = []
        self._table: dict | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "section":
            self.sections.append(a["id"])
        elif tag == "img":
            self.imgs.append(a)
        elif tag == "svg":
            self.svgs += 1
        elif tag == "table":
            self._table = {"rows": [], "classes": []}
            self.tables.setdefault(a.get("class", ""), []).append(self._table)
        elif tag == "tr" and self._table is not None:
            self._table["rows"].append([])
            self._table["classes"].append(a.get("class", ""))
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self._table["rows"][-1].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "table":
            self._table = None

    def handle_data(self, data):
        self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)


def _set_rows(db_url: str, name: str, winner_tflops: dict[int, float] | None = None,
              backend: str | None = None, fingerprint: dict | None = None) -> None:
    """Change a seeded study through the store API: winners' TFLOP/s by problem index, and the
    backend and fingerprint a launch would have recorded."""
    from tunefw.store import open_store
    from tunefw.store import queries as q
    store = open_store(db_url)
    with store.session() as s:
        study = q.get_study(s, name)
        for i, tflops in (winner_tflops or {}).items():
            problem = study.problems[i]
            best = q.best_trial(s, problem, study.round)
            q.set_winner(s, problem, best, tflops, best.cublas_tflops, confirmed=True)
        if backend is not None:
            study.backend, study.fingerprint, study.stats = backend, fingerprint, {}
    store.close()


def _render(tmp_path, db_url, name="r", *options: str) -> tuple[_Page, str]:
    page = tmp_path / "report.html"
    made = invoke_cli("report", name, "--html", str(page), *options, db=db_url)
    assert made.returncode == 0, made.stderr
    parsed = _Page()
    parsed.feed(page.read_text())
    return parsed, made.stdout


def _png(img: dict) -> Image.Image:
    """The embedded PNG of an <img>, decoded (a data: URL, nothing fetched)."""
    prefix = "data:image/png;base64,"
    assert img["src"].startswith(prefix)
    raw = base64.b64decode(img["src"][len(prefix):], validate=True)
    assert raw[:8] == b"\x89PNG\r\n\x1a\n" and len(raw) > 5000
    image = Image.open(io.BytesIO(raw))
    image.load()
    return image


def _attainable(shape: str) -> float:
    """The roofline at the shape's intensity on the H200: min(peak, intensity x measured read)."""
    m, n, k = map(int, shape.split("x"))
    p = GemmProblem(m, n, k)
    return min(H200.peak_tflops_bf16, p.flops / p.min_bytes * H200.stream_read_gbs / 1e3)


def _seed(db_url: str) -> list[int]:
    """Two problems on the SIMULATED H200: the first's winner beats cuBLAS (1.1), the second's
    loses (140 of 150 TFLOP/s); the first winner's row holds ptxas's figures (as a compiled
    trial's does), the second's none (as a simulated one's). Returns the winners' trial ids."""
    from tunefw.store import open_store
    from tunefw.store.models import Trial
    winner_ids = seed_study(db_url, "r", SHAPES, trials=5)
    _set_rows(db_url, "r", {0: 165.0})
    store = open_store(db_url)
    with store.session() as s:
        t = s.get(Trial, winner_ids[0])
        t.ptxas_regs, t.ptxas_smem_bytes, t.ptxas_spill_bytes = 154, 1024, 0
    store.close()
    return winner_ids


@pytest.fixture
def seeded(db_url):
    _seed(db_url)


@pytest.fixture(scope="module")
def simulated(tmp_path_factory) -> tuple[_Page, str, list[int]]:
    """The page of the seeded SIMULATED study (rendered once for the tests that only read it),
    the CLI's output and the winners' trial ids."""
    tmp = tmp_path_factory.mktemp("report")
    db_url = f"sqlite:///{tmp / 'tunefw.db'}"
    winner_ids = _seed(db_url)
    return (*_render(tmp, db_url), winner_ids)


def test_report_of_a_simulated_study(simulated):
    parsed, stdout, _ = simulated
    assert "(SIMULATED)" in stdout
    assert parsed.sections == SECTIONS
    text = "".join(parsed.text)
    assert "SIMULATED: modeled device, not a measurement" in text
    assert "1 shape(s) at or above cuBLAS, 1 below: 128x6144x4096 bf16" in text
    # ratio, roofline, convergence, one knob figure (the only family), all trials
    assert parsed.svgs == 0 and len(parsed.imgs) == 5
    for img in parsed.imgs:
        image = _png(img)
        assert image.width > 300 and image.height > 200
        assert len(image.convert("RGB").getcolors(maxcolors=1 << 20)) > 50  # a plot, not a blank
        assert img["alt"].endswith("[SIMULATED]")
    assert "mma_sm80: ratio to cuBLAS per knob value (8 OK trials) [SIMULATED]" in [
        i["alt"] for i in parsed.imgs]


def test_winners_table_has_a_column_per_knob_and_marks_losses(simulated):
    parsed, _, winner_ids = simulated
    (winners,) = parsed.tables["winners"]
    header, *rows = winners["rows"]
    assert header[:12] == ["problem", "vs cuBLAS", "ratio", "screen ratio", "TFLOP/s",
                           "cuBLAS TFLOP/s", "TB/s", "bound", "% of roofline",
                           "cuBLAS % of roofline", "confirmed", "trial"]
    assert header[12:12 + len(KNOBS)] == KNOBS
    assert header[12 + len(KNOBS):] == ["CTAs", "threads", "regs/thread (est.)", "dynamic smem B",
                                        "regs/thread (ptxas)", "static smem B (ptxas)",
                                        "spill B (ptxas)", "ptxas from"]
    cells = [dict(zip(header, row)) for row in rows]
    assert [c["problem"] for c in cells] == LABELS
    assert [(c["ratio"], c["vs cuBLAS"], c["TFLOP/s"], c["screen ratio"]) for c in cells] == [
        ("1.100", "win", "165.0", "0.933"), ("0.933", "LOSS", "140.0", "0.933")]
    assert [int(c["trial"]) for c in cells] == winner_ids
    assert [c["confirmed"] for c in cells] == ["True", "True"]
    assert winners["classes"][1:] == ["", "loss"]
    assert [c["bound"] for c in cells] == ["compute", "memory"]
    assert [c["% of roofline"] for c in cells] == [
        f"{100 * t / _attainable(s):.0f}%" for t, s in zip((165.0, 140.0), SHAPES)]
    seeds = FAMILIES["mma_sm80"].seed_configs()
    assert [[c[k] for k in KNOBS] for c in cells] == [[str(seeds[4][k]) for k in KNOBS]] * 2
    assert all(int(c["threads"]) > 0 and int(c["dynamic smem B"]) > 0 for c in cells)
    assert [(c["regs/thread (ptxas)"], c["static smem B (ptxas)"], c["spill B (ptxas)"],
             c["ptxas from"]) for c in cells] == [("154", "1024", "0", "trial"),
                                                   ("-", "-", "-", "-")]
    outcomes = parsed.tables["outcomes"][0]["rows"]
    assert outcomes[0][0] == "problem" and outcomes[0][-1] == "evaluated" and "OK" in outcomes[0]
    assert [row[0] for row in outcomes[1:]] == LABELS
    assert all(row[-1] == "5" for row in outcomes[1:])
    device = dict(parsed.tables["device"][0]["rows"][1:])
    assert device["name"] == "SIMULATED NVIDIA H200"


def test_ptxas_fills_the_winners_without_figures_by_compiling_them(tmp_path, db_url, seeded):
    """--ptxas: the second winner (a simulated trial: no figures stored) is compiled here for
    the device's architecture; the first keeps its trial's figures."""
    from tunefw.cuda.compiler import compile_kernel
    parsed, stdout = _render(tmp_path, db_url, "r", "--ptxas", "--cache-dir",
                             str(tmp_path / "cubins"))
    assert stdout.strip().endswith("; ptxas figures of 1 winner(s) compiled for it")
    (winners,) = parsed.tables["winners"]
    header, *rows = winners["rows"]
    cells = [dict(zip(header, row)) for row in rows]
    config = {k: int(cells[1][k]) for k in KNOBS}
    compiled = compile_kernel(FAMILIES["mma_sm80"], config, "bf16", H200.arch,
                              cache_dir=tmp_path / "cubins")
    assert compiled.cached  # the report's own compile, found in its cache
    assert [(c["regs/thread (ptxas)"], c["static smem B (ptxas)"], c["spill B (ptxas)"],
             c["ptxas from"]) for c in cells] == [
        ("154", "1024", "0", "trial"),
        (str(compiled.regs), str(compiled.smem), str(compiled.spill_bytes),
         "compiled for this report")]


@pytest.mark.parametrize("backend, name, banner", [
    ("replay", "REPLAY NVIDIA H200", "REPLAY: answers looked up in recorded sweeps"),
    ("cuda", "NVIDIA H200", None)])
def test_the_kind_of_result_labels_the_page_and_every_figure(tmp_path, db_url, seeded, backend,
                                                              name, banner):
    _set_rows(db_url, "r", backend=backend,
              fingerprint={"name": name, "cc": 90, "replay": backend == "replay"})
    parsed, stdout = _render(tmp_path, db_url)
    text = "".join(parsed.text)
    assert "SIMULATED" not in text and "(SIMULATED)" not in stdout
    assert len(parsed.imgs) == 5
    if banner:
        assert banner in text
        assert all(i["alt"].endswith("[REPLAY]") for i in parsed.imgs)
    else:
        assert "REPLAY" not in text
        assert not any(i["alt"].endswith("]") for i in parsed.imgs)
        assert "streaming read 4226 GB/s (measured)" in text


def test_a_device_without_declared_rates_has_no_roofline(tmp_path, db_url, seeded):
    _set_rows(db_url, "r", backend="cuda", fingerprint={"name": "NVIDIA Mystery GPU", "cc": 90})
    parsed, _ = _render(tmp_path, db_url)
    assert "No rates are declared for 'NVIDIA Mystery GPU'" in "".join(parsed.text)
    assert len(parsed.imgs) == 4  # no roofline
    header, *rows = parsed.tables["winners"][0]["rows"]
    cells = [dict(zip(header, row)) for row in rows]
    assert [(c["bound"], c["% of roofline"], c["threads"]) for c in cells] == [("-", "-", "-")] * 2


def test_report_of_a_study_not_launched_yet(tmp_path, db_url):
    made = invoke_cli("study", "create", "fresh", "--shape", "256x256x256", db=db_url)
    assert made.returncode == 0, made.stderr
    parsed, _ = _render(tmp_path, db_url, "fresh")
    assert parsed.sections == ["summary", "ratio", "roofline", "convergence", "winners",
                               "outcomes", "device"]
    assert parsed.imgs == [] and "winners" not in parsed.tables
    assert "No evaluated trial yet." in "".join(parsed.text)


def test_report_errors_are_one_line(tmp_path, db_url):
    missing = invoke_cli("report", "nope", "--html", str(tmp_path / "x.html"), db=db_url)
    assert missing.returncode == 1 and len(missing.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x.html").exists()


def test_bench_without_a_gpu_is_one_line(tmp_path, db_url):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    table = tmp_path / "d.json"
    table.write_text('{"schema_version": 1, "simulated": true, "fingerprint": {}, "entries": []}')
    ran = invoke_cli("bench", str(table), db=db_url)
    assert ran.returncode == 1
    assert ran.stderr.strip() == "tunefw: error: tunefw bench needs a CUDA GPU (none is visible)"


def test_bench_page_from_a_result_file():
    from tunefw.report import bench_html

    row = {"M": 4096, "N": 4096, "K": 4096, "dtype": "bf16", "path": "exact", "family": "wgmma_sm90",
           "tflops": 700.0, "cublas_tflops": 650.0, "triton_tflops": 600.0, "ratio": 700 / 650,
           "triton_ratio": 700 / 600, "overhead_us": 4.2, "wrong": False}
    result = {"date": "2026-01-01", "device": {"name": "NVIDIA H200"}, "simulated_table": False,
              "rows": [row, dict(row, M=128, path="cublas", family="cublas", ratio=1.0),
                       dict(row, M=16, N=14336, gate="silu", triton_tflops=None, triton_ratio=None)],
              "geomean": {"ratio": 1.04, "triton_ratio": 1.1}}
    parsed = _Page()
    parsed.feed(bench_html(result))
    (img,) = parsed.imgs
    assert _png(img).width > 300 and img["alt"] == "tunefw runtime vs cuBLAS vs Triton"
    bench = parsed.tables["bench"][0]["rows"]
    assert [r[:2] for r in bench[1:]] == [["4096x4096x4096 bf16", "exact"], ["128x4096x4096 bf16", "cublas"],
                                          ["16x14336x4096 bf16 silu", "exact"]]  # gated: named so
    assert "SIMULATED" not in "".join(parsed.text)
