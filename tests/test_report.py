"""`tunefw report`: the HTML page of a simulated study has its plots and tables.

The study's rows are written directly (conftest.seed_study): the report reads rows, and the
launches that make them are tested in test_launch_sim.py."""
from html.parser import HTMLParser

import pytest

from conftest import invoke_cli, seed_study
SHAPES = ("1024x1024x1024", "128x6144x4096")


class _Page(HTMLParser):
    """Counts figures and collects each table's rows as lists of cell texts, by class."""

    def __init__(self) -> None:
        super().__init__()
        self.svgs = self.imgs = 0
        self.tables: dict[str, list[list[str]]] = {}
        self.text: list[str] = []
        self._table: str | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "svg":
            self.svgs += 1
        elif tag == "img":
            self.imgs += 1
        elif tag == "table":
            self._table = dict(attrs).get("class", "")
            self.tables[self._table] = []
        elif tag == "tr" and self._table is not None:
            self.tables[self._table].append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.tables[self._table][-1].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "table":
            self._table = None

    def handle_data(self, data):
        self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)


def test_report_of_a_simulated_study(tmp_path, db_url):
    winner_ids = seed_study(db_url, "r", SHAPES, trials=5)
    page = tmp_path / "report.html"
    made = invoke_cli("report", "r", "--html", str(page), db=db_url)
    assert made.returncode == 0, made.stderr
    assert "(SIMULATED)" in made.stdout
    parsed = _Page()
    parsed.feed(page.read_text())
    assert parsed.svgs + parsed.imgs >= 2  # TFLOP/s bars and convergence
    assert "SIMULATED: modeled device, not a measurement" in "".join(parsed.text)
    labels = {f"{s} bf16" for s in SHAPES}
    outcomes = parsed.tables["outcomes"]
    assert outcomes[0][0] == "problem" and outcomes[0][-1] == "evaluated" and "OK" in outcomes[0]
    assert {row[0] for row in outcomes[1:]} == labels
    assert all(row[-1] == "5" for row in outcomes[1:])
    winners = parsed.tables["winners"]
    assert {row[0] for row in winners[1:]} == labels
    assert winners[0] == ["problem", "family", "config", "TFLOP/s", "cuBLAS TFLOP/s", "ratio",
                          "confirmed", "trial"]
    assert [(float(r[3]), float(r[4]), r[5], r[6], int(r[7])) for r in winners[1:]] == [
        (140.0, 150.0, "0.933", "True", trial_id) for trial_id in winner_ids]
    device = dict(parsed.tables["device"][1:])
    assert device["name"] == "SIMULATED NVIDIA H200"


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
              "rows": [row, dict(row, M=128, path="cublas", family="cublas", ratio=1.0)],
              "geomean": {"ratio": 1.04, "triton_ratio": 1.1}}
    parsed = _Page()
    parsed.feed(bench_html(result))
    assert parsed.svgs == 1
    bench = parsed.tables["bench"]
    assert [r[:2] for r in bench[1:]] == [["4096x4096x4096 bf16", "exact"], ["128x4096x4096 bf16", "cublas"]]
    assert "SIMULATED" not in "".join(parsed.text)
