"""Self-contained HTML pages: a study's report (`tunefw report`, study.py) and bench results
(`tunefw bench --html`, bench.py). Figures are PNGs embedded in the page; nothing is fetched."""
from tunefw.report.bench import bench_html
from tunefw.report.data import best_so_far
from tunefw.report.study import write_report

__all__ = ["bench_html", "best_so_far", "write_report"]
