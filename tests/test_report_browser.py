"""The report page as a browser draws it: headless Chromium (Debian's `chromium`; .ci/run installs
it) renders the file offline to a screenshot that holds the banner and the figures. Skips where
no chromium is installed."""
import shutil
import subprocess

import pytest
from PIL import Image

from conftest import invoke_cli, seed_study

CHROMIUM = shutil.which("chromium")
BANNER = (0xB0, 0x00, 0x20)  # the SIMULATED banner's background (page.STYLE)
LOSS_BAR = (0xC6, 0x28, 0x28)  # a losing shape's bar in the ratio figure (plot.LOSS)


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (apt-get install chromium)")
def test_chromium_renders_the_report(tmp_path, db_url):
    seed_study(db_url, "r", ("1024x1024x1024", "128x6144x4096"), trials=5)
    page, shot = tmp_path / "report.html", tmp_path / "report.png"
    made = invoke_cli("report", "r", "--html", str(page), db=db_url)
    assert made.returncode == 0, made.stderr
    # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start; a container's
    # /dev/shm can be too small for it (--disable-dev-shm-usage).
    ran = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--hide-scrollbars", f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}",
         "--window-size=1280,3000", page.as_uri()],
        capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr[-2000:]
    image = Image.open(shot).convert("RGB")
    assert image.size == (1280, 3000)
    colours = image.getcolors(maxcolors=1 << 22)
    assert len(colours) > 200  # text, plots and tables, not one flat colour
    assert any(c == BANNER for _, c in colours)  # the page's styles applied
    assert any(c == LOSS_BAR for _, c in colours)  # an embedded PNG decoded and drawn
