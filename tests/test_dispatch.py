import json

import pytest

from tunefw import dispatch
from tunefw.device import H200
from tunefw.errors import UserError
from tunefw.problem import GemmProblem
from tunefw.templates import FAMILIES


def _entry(M, N, K, family="mma_sm80", config=None, dtype="bf16"):
    fam = FAMILIES[family]
    return {"M": M, "N": N, "K": K, "dtype": dtype, "layout": "TN", "family": family,
            "config": config or fam.default_config(), "tflops": 100.0, "cublas_tflops": 90.0,
            "trial_id": M}


def _write(tmp_path, entries, **top):
    data = {"schema_version": 1, "simulated": True,
            "fingerprint": {"name": "SIMULATED NVIDIA H200"}, "entries": entries}
    data.update(top)
    path = tmp_path / "dispatch.json"
    path.write_text(json.dumps(data))
    return path


def test_exact_then_nearest_then_none(tmp_path):
    table = dispatch.load(_write(tmp_path, [_entry(4096, 4096, 4096), _entry(128, 6144, 4096)]))
    assert table.lookup(GemmProblem(4096, 4096, 4096)).M == 4096
    near = table.lookup(GemmProblem(3000, 4096, 4096))
    assert (near.M, near.N) == (4096, 4096)
    assert table.lookup(GemmProblem(100, 6144, 4096)).M == 128
    assert table.lookup(GemmProblem(4096, 4096, 4096, dtype="fp16")) is None  # other dtype


def test_nearest_skips_entries_whose_config_fails_check(tmp_path):
    fam = FAMILIES["mma_sm80"]
    split = dict(fam.default_config(), SPLIT_K=16, BK=64)
    problem = GemmProblem(64, 64, 64)  # K too short for 16 splits of 64
    assert fam.check(split, problem, H200) is not None
    table = dispatch.load(_write(tmp_path, [_entry(64, 64, 65536, config=split),
                                            _entry(8192, 8192, 8192)]))
    picked = table.lookup(problem)
    assert picked is not None and picked.M == 8192  # farther, but its config can run


@pytest.mark.parametrize("mutate, needle", [
    (lambda d: d.update(schema_version=2), "schema_version=2: expected 1"),
    (lambda d: d.pop("entries"), "entries: expected list"),
    (lambda d: d["entries"][0].pop("family"), "entries[0]: missing family"),
    (lambda d: d["entries"][0].update(N=100), "entries[0]: problem N=100"),
    (lambda d: d["entries"][0].update(family="nope"), "entries[0].family='nope'"),
    (lambda d: d["entries"][0]["config"].update(BM=7), "entries[0].config: BM=7 not in"),
])
def test_bad_files_give_one_line_errors(tmp_path, mutate, needle):
    data = {"schema_version": 1, "simulated": False, "fingerprint": {},
            "entries": [_entry(64, 64, 64)]}
    mutate(data)
    path = tmp_path / "d.json"
    path.write_text(json.dumps(data))
    with pytest.raises(UserError) as exc:
        dispatch.load(path)
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_not_json(tmp_path):
    path = tmp_path / "d.json"
    path.write_text("{nope")
    with pytest.raises(UserError, match="not JSON"):
        dispatch.load(path)
