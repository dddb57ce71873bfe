"""The installed package carries what it needs at run time: kernel templates and migrations."""
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import REPO


@pytest.mark.slow
def test_wheel_ships_kernel_templates_and_migrations(tmp_path: Path):
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                            "--no-build-isolation", "-w", str(tmp_path), str(REPO)],
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr
    (wheel,) = tmp_path.glob("tunefw-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    templates = {f"tunefw/kernel_templates/{p.relative_to(REPO / 'kernel_templates').as_posix()}"
                 for p in (REPO / "kernel_templates").rglob("*.cuh")}
    assert templates and templates <= names
    assert {"tunefw/store/migrations/env.py",
            "tunefw/store/migrations/versions/0001_initial.py"} <= names
    assert "tunefw/templates/wgmma_sm90.py" in names and "tunefw/evaluate/cuda.py" in names
    # Every module of the source tree ships (packages are listed by hand in pyproject.toml).
    modules = {p.relative_to(REPO).as_posix() for p in (REPO / "tunefw").rglob("*.py")}
    assert modules <= names, sorted(modules - names)
