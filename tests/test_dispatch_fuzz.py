"""Property test over dispatch.json documents: a rejected one is one line (a UserError, never
another exception), an accepted one round-trips through render -> parse unchanged."""
import copy
import json

import pytest

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import invoke_cli
from tunefw.errors import UserError
from tunefw.export.table import render
from tunefw.runtime.dispatch import parse
from tunefw.templates import FAMILIES

BASE = {
    "schema_version": 2, "simulated": False, "fingerprint": {"name": "NVIDIA H200", "cc": 90},
    "min_ratio": 1.0, "evidence_min_ratio": 1.0,
    "entries": [
        {"M": 2048, "N": 4096, "K": 4096, "dtype": "bf16", "layout": "TN", "label": "m.o_proj",
         "family": "wgmma_sm90", "config": dict(FAMILIES["wgmma_sm90"].default_config()),
         "tflops": 700.0, "cublas_tflops": 650.0, "trial_id": 3, "route": "kernel", "reason": None},
        {"M": 128, "N": 4096, "K": 4096, "dtype": "bf16", "layout": "TN", "label": "",
         "family": "mma_sm80", "config": dict(FAMILIES["mma_sm80"].default_config()),
         "tflops": 90.0, "cublas_tflops": 100.0, "trial_id": 4, "route": "cublas", "reason": "lost"},
    ],
    "evidence": [{"M": 300, "N": 4096, "K": 4096, "dtype": "bf16", "layout": "TN", "rule": "bucket",
                  "served_by": [2048, 4096, 4096], "tflops": 500.0, "cublas_tflops": 600.0}],
}

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
                    st.sampled_from(["bf16", "TN", "kernel", "cublas", "mma_sm80", "bucket", "NaN"]),
                    st.sampled_from([0, 1, 2, 8, 64, 128, 4096, 1.0, -1.0, 1e308]))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=8)


def _paths(doc, prefix=()):
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, prefix + (i,))


@st.composite
def documents(draw):
    doc = copy.deepcopy(BASE)
    for _ in range(draw(st.integers(0, 3))):
        paths = [p for p in _paths(doc) if p]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = doc
        for part in path[:-1]:
            parent = parent[part]
        action = draw(st.sampled_from(["set", "set", "delete", "add"]))
        if action == "set":
            parent[path[-1]] = draw(values)
        elif action == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.text(max_size=6))] = draw(values)
        else:
            parent.append(draw(values))
    return doc


def _check(text):
    try:
        table = parse(text, "d.json")
    except UserError as exc:
        message = str(exc)
        assert message.startswith("d.json: ") and "\n" not in message and "Traceback" not in message
        return None
    again = parse(render(table, "json"), "d.json")
    assert again.as_dict() == table.as_dict()
    assert again.entries == table.entries and again.evidence == table.evidence
    return table


def test_the_base_document_is_accepted():
    assert _check(json.dumps(BASE)) is not None


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents())
def test_mutated_documents(doc):
    _check(json.dumps(doc, allow_nan=True))


@settings(max_examples=150, deadline=None)
@given(st.one_of(values, st.binary(max_size=40).map(lambda b: b)))
def test_arbitrary_documents(doc):
    _check(doc if isinstance(doc, bytes) else json.dumps(doc, allow_nan=True))


def test_the_cli_reports_a_rejected_document_in_one_line(tmp_path):
    path = tmp_path / "d.json"
    bad = copy.deepcopy(BASE)
    bad["entries"][0]["config"]["GROUP"] = True
    path.write_text(json.dumps(bad))
    result = invoke_cli("dispatch", "explain", str(path), "64x64x64")
    assert result.returncode == 1 and result.stderr.count("\n") == 1
    assert "entries[0].config: GROUP=True: expected an integer or a string" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_config_key_holding_a_newline_gives_one_line():
    doc = json.loads(json.dumps(BASE))
    doc["entries"][0]["config"]["\n"] = None
    with pytest.raises(UserError) as err:
        parse(json.dumps(doc), "d.json")
    assert "\n" not in str(err.value) and "'\\n'=None" in str(err.value)
