"""The committed example reports: each study created fresh in its own database with the CLI,
launched, rendered with `tunefw report`, and photographed by headless Chromium.

- ``sim_llama``: Llama-3-8B's four linear layers at M = 16 and 2048, every family, on the
  SIMULATED device (benchmarks/studies/report_sim_llama.yaml): a modeled H200, not a measurement.
- ``replay_decode2_h200``: the 20 decode shapes of benchmarks/studies/decode2_h200.yaml replayed
  from the sweeps recorded on a real H200 (benchmarks/sweeps/decode2_h200): each TFLOP/s is a
  measurement of 2026-12-01, looked up rather than re-measured, so the page says REPLAY.

    python3 benchmarks/report_pages.py [sim_llama] [replay_decode2_h200]

writes benchmarks/results/report_NAME.html and report_NAME.png (no GPU needed: the winners'
ptxas figures come from compiling them here, `tunefw report --ptxas`; `chromium` on PATH for the
screenshot).
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
# name: (study file, study name, launch backend)
PAGES = {
    "sim_llama": ("benchmarks/studies/report_sim_llama.yaml", "report_sim_llama", "sim"),
    "replay_decode2_h200": ("benchmarks/studies/decode2_h200.yaml", "decode2_h200",
                            "replay:benchmarks/sweeps/decode2_h200"),
}
WIDTH, TALL = 2100, 16000  # the screenshot's window in CSS pixels (cut to the page's height)


def tunefw(db: Path, *args: str) -> str:
    """Run `tunefw ARGS` on ``db``; its stdout, or exit with its stderr."""
    env = dict(os.environ, TUNEFW_DB=f"sqlite:///{db}")
    ran = subprocess.run([sys.executable, "-m", "tunefw", *args], cwd=REPO, env=env,
                         capture_output=True, text=True)
    if ran.returncode != 0:
        raise SystemExit(f"tunefw {' '.join(args)} failed: {ran.stderr[-2000:]}")
    return ran.stdout


def screenshot(chromium: str, html: Path, png: Path, profile: Path) -> None:
    """Headless Chromium's screenshot of ``html``, WIDTH CSS pixels wide, cut below the page's
    last non-blank row (the window is taller than any report)."""
    from PIL import Image, ImageChops

    ran = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--hide-scrollbars", f"--user-data-dir={profile}", f"--screenshot={png}",
         f"--window-size={WIDTH},{TALL}", html.as_uri()], capture_output=True, text=True,
        timeout=300)
    if ran.returncode != 0 or not png.exists():
        raise SystemExit(f"chromium failed: {ran.stderr[-2000:]}")
    image = Image.open(png).convert("RGB")
    blank = Image.new("RGB", image.size, image.getpixel((0, image.height - 1)))
    box = ImageChops.difference(image, blank).getbbox() or (0, 0, image.width, image.height)
    image.crop((0, 0, image.width, min(image.height, box[3] + 40))).save(png, optimize=True)


def make(name: str, chromium: str, tmp: Path) -> None:
    study_file, study, backend = PAGES[name]
    db = tmp / f"{name}.db"
    tunefw(db, "study", "create", study, "--from", study_file)
    tunefw(db, "launch", study, "--backend", backend, "--gpus", "8")
    html, png = RESULTS / f"report_{name}.html", RESULTS / f"report_{name}.png"
    print(tunefw(db, "report", study, "--html", str(html), "--ptxas").strip())
    screenshot(chromium, html, png, tmp / f"chromium-{name}")
    print(f"wrote {png}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help=f"pages to make: {', '.join(PAGES)} (default all)")
    args = parser.parse_args()
    unknown = sorted(set(args.names) - set(PAGES))
    if unknown:
        parser.error(f"unknown page(s) {', '.join(unknown)}: expected {', '.join(PAGES)}")
    chromium = shutil.which("chromium")
    if chromium is None:
        raise SystemExit("chromium is not on PATH (apt-get install chromium)")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.names or list(PAGES):
            make(name, chromium, Path(tmp))


if __name__ == "__main__":
    main()
