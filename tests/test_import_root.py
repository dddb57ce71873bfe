"""The PYTHONPATH the sweep hands its child processes (Ray workers, the sampler host)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tunefw.framing import helper_pythonpath


def test_children_import_tunefw_and_not_its_cuda_package_as_nvidias():
    # tunefw/ itself on the path made `cuda` resolve to tunefw/cuda in every GPU worker, so
    # `from cuda.bindings import driver` failed there (seen on the H200 after the folder moves)
    root = Path(helper_pythonpath().split(os.pathsep)[0])
    assert (root / "tunefw" / "__init__.py").is_file()
    assert not (root / "cuda").exists()
    probe = "import importlib.util as u, tunefw; s = u.find_spec('cuda'); print(tunefw.__file__, s and s.origin)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         env=dict(os.environ, PYTHONPATH=str(root)), cwd="/").stdout.split()
    assert Path(out[0]).resolve() == root / "tunefw" / "__init__.py"
    assert out[1] == "None" or not Path(out[1]).resolve().is_relative_to(root / "tunefw")
