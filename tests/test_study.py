from pathlib import Path

import pytest

from tunefw.errors import UserError
from tunefw.problem import GemmProblem
from tunefw.study.spec import load_study_file, parse_study

STUDIES = Path(__file__).resolve().parent.parent / "studies"


def test_shipped_studies_parse():
    quick = load_study_file(STUDIES / "quickstart.yaml")
    assert quick.name == "quickstart" and 2 <= len(quick.problems) <= 3
    square = load_study_file(STUDIES / "square.yaml")
    assert {(p.M, p.N, p.K) for p in square.problems} == {(4096,) * 3, (8192,) * 3}


def test_llama3_layers_expand_to_model_shapes():
    spec = load_study_file(STUDIES / "llama3_8b.yaml")
    shapes = {(p.M, p.N, p.K) for p in spec.problems}
    assert len(spec.problems) == 56  # 4 layers x the M grid (powers of two 1..8192)
    assert (128, 6144, 4096) in shapes      # qkv at decode
    assert (16, 4096, 14336) in shapes      # down at decode
    assert (8192, 28672, 4096) in shapes    # fused gate+up at prefill
    assert (2048, 4096, 4096) in shapes     # o_proj
    assert set(spec.labels) == {"llama3_8b.qkv", "llama3_8b.o_proj", "llama3_8b.gate_up",
                                "llama3_8b.down"}


def test_defaults_and_override_name():
    spec = parse_study({"problems": [{"M": 1, "N": 8, "K": 8}]}, "t", name="x")
    assert (spec.name, spec.sampler, spec.trials, spec.families) == ("x", "tpe", 64, None)
    assert spec.problems == [GemmProblem(1, 8, 8)]


def test_roundtrip_through_dict():
    spec = load_study_file(STUDIES / "llama3_8b.yaml")
    again = type(spec).from_dict(spec.to_dict())
    assert again.problems == spec.problems and again.labels == spec.labels


@pytest.mark.parametrize("data, needle", [
    ({"name": "s", "problems": [{"M": 4, "N": 100, "K": 8}]}, "problems[0]: problem N=100"),
    ({"name": "s", "problems": [{"M": 4, "N": 8}]}, "problems[0]: missing K"),
    ({"name": "s", "problems": ["4x8x8"], "sampler": "bayes"}, "sampler='bayes'"),
    ({"name": "s", "problems": ["4x8x8"], "families": ["cutlass"]}, "unknown family 'cutlass'"),
    ({"name": "s", "problems": ["4x8x8"], "trials": 0}, "trials=0"),
    ({"name": "s", "problems": ["4x8x8"], "colour": 1}, "unknown key(s) colour"),
    ({"name": "s"}, "no problems"),
    ({"name": "s", "problems": ["4x8x8"], "sim": {"faults": {"meteor": 0.1}}}, "unknown fault"),
])
def test_bad_study_one_line_errors(data, needle):
    with pytest.raises(UserError) as exc:
        parse_study(data, "f.yaml")
    assert needle in str(exc.value) and "\n" not in str(exc.value)
    assert str(exc.value).startswith("f.yaml: ")


def test_malformed_yaml(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("name: x\nproblems: [4x8x8\n")
    with pytest.raises(UserError, match=r"bad.yaml: malformed YAML at line \d"):
        load_study_file(f)
