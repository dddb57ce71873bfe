import pytest

from tunefw.errors import UserError
from tunefw.problem import GemmProblem, parse_shape


def test_valid_problem_key_and_flops():
    p = GemmProblem(17, 24, 40)
    assert p.key() == "17x24x40:bf16:TN"
    assert p.flops == 2 * 17 * 24 * 40
    assert p.min_bytes == 2 * (17 * 40 + 24 * 40 + 17 * 24)


@pytest.mark.parametrize("kwargs, field, rule", [
    (dict(M=0, N=8, K=8), "M", ">= 1"),
    (dict(M=4, N=100, K=8), "N", "multiple of 8"),
    (dict(M=4, N=8, K=0), "K", "multiple of 8"),
    (dict(M=4, N=8, K=12), "K", "multiple of 8"),
    (dict(M=4, N=8, K=8, dtype="fp32"), "dtype", "bf16"),
    (dict(M=4, N=8, K=8, layout="NN"), "layout", "TN"),
    (dict(M=4.5, N=8, K=8), "M", "integer"),
])
def test_bad_problem_names_field_and_rule(kwargs, field, rule):
    with pytest.raises(UserError) as exc:
        GemmProblem(**kwargs)
    msg = str(exc.value)
    assert f"{field}=" in msg and rule in msg and "\n" not in msg


def test_parse_shape():
    assert parse_shape("4096x28672X4096", "fp16") == GemmProblem(4096, 28672, 4096, "fp16")
    with pytest.raises(UserError, match="expected MxNxK"):
        parse_shape("4096x4096")


def test_log_distance_is_symmetric_and_zero_on_self():
    a, b = GemmProblem(16, 4096, 4096), GemmProblem(128, 4096, 4096)
    assert a.log_distance(a) == 0
    assert a.log_distance(b) == pytest.approx(b.log_distance(a))
    assert a.log_distance(b) == pytest.approx(3 * 0.6931471805599453)
