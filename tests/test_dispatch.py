import json

import pytest

from tunefw.device import H200
from tunefw.errors import UserError
from tunefw.problem import GemmProblem
from tunefw.runtime import dispatch
from tunefw.runtime.dispatch import DispatchEntry, DispatchTable, Evidence
from tunefw.runtime.rules import decide, lookup, tile_fill
from tunefw.templates import FAMILIES


def _entry(M, N, K, family="mma_sm80", config=None, dtype="bf16", **extra):
    fam = FAMILIES[family]
    return {"M": M, "N": N, "K": K, "dtype": dtype, "layout": "TN", "family": family,
            "config": config or fam.default_config(), "tflops": 100.0, "cublas_tflops": 90.0,
            "trial_id": M, **extra}


def _write(tmp_path, entries, version=2, **top):
    data = {"schema_version": version, "simulated": True,
            "fingerprint": {"name": "SIMULATED NVIDIA H200"}, "entries": entries}
    data.update(top)
    path = tmp_path / "dispatch.json"
    path.write_text(json.dumps(data))
    return path


def _e(M, N=4096, K=4096, family="wgmma_sm90", tflops=500.0, cublas=450.0, **kw):
    config = dict(FAMILIES[family].default_config(), CLUSTER_M=1) if family == "wgmma_sm90" \
        else FAMILIES[family].default_config()
    config.update(kw.pop("config", {}))
    return DispatchEntry(M, N, K, "bf16", "TN", family, config, tflops, cublas, M, **kw)


def _table(entries, evidence=(), **kw):
    return DispatchTable(False, {"name": "NVIDIA H200", "cc": 90}, list(entries),
                         evidence=list(evidence), **kw)


def test_exact_then_nearest_then_none(tmp_path):
    table = dispatch.load(_write(tmp_path, [_entry(4096, 4096, 4096), _entry(128, 6144, 4096)]))
    assert lookup(table, GemmProblem(4096, 4096, 4096)).M == 4096
    near = decide(table, GemmProblem(3000, 4096, 4096))
    assert (near.path, near.entry.M) == ("bucket", 4096)
    far = decide(table, GemmProblem(100, 6144, 2048))
    assert (far.path, far.entry.M) == ("nearest", 128)
    assert lookup(table, GemmProblem(4096, 4096, 4096, dtype="fp16")) is None  # other dtype


def test_nearest_skips_entries_whose_config_fails_check(tmp_path):
    fam = FAMILIES["mma_sm80"]
    split = dict(fam.default_config(), SPLIT_K=16, BK=64)
    problem = GemmProblem(64, 64, 64)  # K too short for 16 splits of 64
    assert fam.check(split, problem, H200) is not None
    table = dispatch.load(_write(tmp_path, [_entry(64, 64, 65536, config=split),
                                            _entry(8192, 8192, 8192)]))
    picked = lookup(table, problem)
    assert picked is not None and picked.M == 8192  # farther, but its config can run


def test_an_exact_entry_whose_config_fails_its_own_shape_serves_nothing():
    # a decode config for M <= 8 in a hand-edited table at M = 9: served, it left row 8 unwritten
    skinny = dict(FAMILIES["skinny_sm90"].default_config(), MTILES=1)
    assert FAMILIES["skinny_sm90"].check(skinny, GemmProblem(9, 1032, 1040), H200) is not None
    table = _table([_e(9, 1032, 1040, family="skinny_sm90", config=skinny)])
    route = decide(table, GemmProblem(9, 1032, 1040))
    assert route.path == "cublas" and route.entry is None and "MTILES=1" in route.reason
    good = _table([_e(9, 1032, 1040, family="skinny_sm90", config=skinny),
                   _e(16, 1032, 1040, family="skinny_sm90", config=dict(skinny, MTILES=2))])
    assert (decide(good, GemmProblem(9, 1032, 1040)).path,
            lookup(good, GemmProblem(9, 1032, 1040)).M) == ("bucket", 16)


def test_an_entry_measured_on_another_kernel_source_is_unproven(tmp_path):
    """tunefw upgraded, or a template edited, since the table was measured: the kernel this
    installation builds was never timed, so the entry (exact here, bucket for M=3000) is only
    a candidate for the first-call guard; a table without hashes, or with today's, serves it."""
    today = FAMILIES["wgmma_sm90"].source_hash()
    old = _table([_e(4096, source_hash="0123456789abcdef")])
    for m, rule in ((4096, "exact"), (3000, "bucket")):
        route = decide(old, GemmProblem(m, 4096, 4096))
        assert (route.path, route.entry, route.candidate.M, route.rule) == (
            "unproven", None, 4096, rule)
        assert route.reason.endswith(f"wgmma_sm90's kernel source changed since it was measured "
                                     f"(0123456789abcdef -> {today}): unproven, cuBLAS unless "
                                     "the guard measures it")
    for same in (_table([_e(4096, source_hash=today)]), _table([_e(4096)])):
        assert decide(same, GemmProblem(4096, 4096, 4096)).path == "exact"
    # written and read back: the hash kept, left out where unknown; a malformed one refused
    path = tmp_path / "d.json"
    path.write_text(json.dumps(old.as_dict()))
    assert dispatch.load(path).entries[0].source_hash == "0123456789abcdef"
    assert "source_hash" not in _table([_e(4096)]).as_dict()["entries"][0]
    path.write_text(json.dumps(old.as_dict()).replace("0123456789abcdef", "src"))
    with pytest.raises(UserError, match=r"entries\[0\]\.source_hash"):
        dispatch.load(path)


# ---- cuBLAS routes ------------------------------------------------------------------------
def test_version_1_files_load_and_losing_winners_become_cublas_routes(tmp_path):
    entries = [_entry(4096, 4096, 4096), dict(_entry(128, 6144, 4096), tflops=80.0),
               dict(_entry(64, 64, 64), cublas_tflops=None)]
    table = dispatch.load(_write(tmp_path, entries, version=1))
    assert table.schema_version == 2 and table.min_ratio == 1.0
    assert [e.route for e in table.entries] == ["kernel", "cublas", "cublas"]
    assert table.entries[1].reason == "version-1 table: ratio 0.889 < min ratio 1"
    assert table.entries[2].reason == "no cuBLAS measurement to compare with"
    route = decide(table, GemmProblem(128, 6144, 4096))
    assert (route.path, route.entry, route.rule) == ("cublas", None, "exact")
    assert "a cuBLAS route: version-1 table: ratio 0.889" in route.reason
    with pytest.raises(UserError, match="entries\\[0\\].route: unknown key"):
        dispatch.load(_write(tmp_path, [_entry(64, 64, 64, route="kernel")], version=1))


def test_cublas_route_entries_are_never_nearest_donors():
    lost = _e(4096, route="cublas", reason="confirmed ratio 0.9 < min ratio 1")
    table = _table([lost, _e(8192, N=8192, K=8192)])
    # 4096x2048x4096 is another layer: nearest skips the (closer) cuBLAS-route entry
    route = decide(table, GemmProblem(4096, 2048, 4096), H200)
    assert (route.path, route.entry.M) == ("nearest", 8192)
    # same layer, M between: the bucket at or above is a cuBLAS route -> cuBLAS
    route = decide(table, GemmProblem(3000, 4096, 4096), H200)
    assert (route.path, route.rule, route.donor.M) == ("cublas", "bucket", 4096)


# ---- bucket rule --------------------------------------------------------------------------
def test_bucket_rule_takes_the_smallest_valid_tuned_m_above():
    small = _e(128, config={"BN": 64, "SPLIT_K": 4})
    table = _table([_e(16, config={"BN": 64}), small, _e(2048), _e(8192)])
    pick = lambda M: decide(table, GemmProblem(M, 4096, 4096), H200)  # noqa: E731
    assert (pick(100).path, pick(100).entry.M) == ("bucket", 128)
    assert pick(129).entry.M == 2048 and pick(2048).path == "exact"
    assert pick(2049).entry.M == 8192
    below = pick(9000)
    assert (below.path, below.entry.M) == ("bucket", 8192) and "largest tuned M below" in below.reason
    assert pick(1).entry.M == 16
    # another layer shape (N differs): the nearest rule
    assert decide(table, GemmProblem(100, 4096, 2048), H200).path == "nearest"


def test_bucket_rule_skips_configs_invalid_for_the_asked_shape():
    cluster = _e(256, config={"BM": 128, "CLUSTER_M": 2})  # needs M > 128
    table = _table([cluster, _e(2048)])
    assert FAMILIES["wgmma_sm90"].check(cluster.config, GemmProblem(100, 4096, 4096), H200)
    assert decide(table, GemmProblem(100, 4096, 4096), H200).entry.M == 2048
    assert decide(table, GemmProblem(200, 4096, 4096), H200).entry.M == 256


# ---- evidence -----------------------------------------------------------------------------
def _ev(M, served_by, ratio, N=4096, K=4096, rule="bucket"):
    return Evidence(M, N, K, "bf16", "TN", rule, served_by, 100.0 * ratio, 100.0)


def test_evidence_routes_measured_losses_and_their_neighbours_to_cublas():
    table = _table([_e(128), _e(2048)],
                   [_ev(300, (2048, 4096, 4096), 0.6), _ev(1024, (2048, 4096, 4096), 1.05)])
    pick = lambda M: decide(table, GemmProblem(M, 4096, 4096), H200)  # noqa: E731
    loss = pick(300)
    assert (loss.path, loss.rule, loss.ratio) == ("cublas", "bucket", pytest.approx(0.6))
    assert loss.reason.startswith("calibration measured 0.600x at M=300 for the bucket entry 2048")
    assert pick(600).path == "cublas"  # between a loss (300) and a win (1024)
    win = pick(1024 + 1)
    assert pick(1024).path == "calibrated"  # its own verdict
    assert (win.path, win.entry, win.donor.M, win.ratio) == ("unproven", None, 2048,
                                                             pytest.approx(1.05))
    assert pick(100).path == "bucket"  # served by the 128 entry: no evidence of its own
    lower = _table(table.entries, table.evidence, evidence_min_ratio=0.5)
    assert decide(lower, GemmProblem(300, 4096, 4096), H200).path == "calibrated"
    bracketed = _table(table.entries, [_ev(600, (2048, 4096, 4096), 1.05),
                                       _ev(1100, (2048, 4096, 4096), 1.2)])
    win = decide(bracketed, GemmProblem(1024, 4096, 4096), H200)
    assert (win.path, win.entry.M, win.ratio) == ("calibrated", 2048, pytest.approx(1.05))
    assert win.reason.endswith("calibration measured 1.050x at M=600, 1.200x at M=1100")


def test_a_bracket_vouches_for_no_m_whose_tiles_are_emptier_than_at_both_ends():
    """Measured wins at two Ms say nothing of an M between them where the kernel's tiles and
    last wave of SMs are emptier than at both (the H200 served 3000x14336x4096 at 0.937x between
    1.011x at M=2047 and 1.004x at 4096): unproven (tests/test_export_cpp.py: the header too)."""
    table = _table([_e(2048)], [_ev(600, (2048, 4096, 4096), 1.05),
                                _ev(1100, (2048, 4096, 4096), 1.2)])
    # 128x256 tiles on N=4096: M=600 is 80 tiles in one wave of 132 SMs, 600/640 of their rows
    # used (56.8%); 1100 is 144 tiles in two waves (52.1%); 1050 the same tiles, fewer rows
    # used (49.7%); 1024 is 128 full tiles in one wave (97.0%)
    assert [round(tile_fill(table.entries[0], m, 4096, 132), 3) for m in (600, 1100, 1050, 1024)] \
        == [0.568, 0.521, 0.497, 0.97]
    route = decide(table, GemmProblem(1050, 4096, 4096), H200)
    assert (route.path, route.entry, route.donor.M, route.ratio) == (
        "unproven", None, 2048, pytest.approx(1.05))
    assert "its tiles are 49.7% full at M=1050 against 52.1% there" in route.reason
    assert decide(table, GemmProblem(1024, 4096, 4096), H200).path == "calibrated"


def test_evidence_on_one_side_of_the_asked_m_leaves_it_unproven():
    """A kernel's speed changes with M in steps (waves), so one measured M vouches for no other:
    the H200 served 1000x6144x4096 at 0.877x on the strength of 1.029x at M=2048."""
    table = _table([_e(2048)], [_ev(2048, (2048, 4096, 4096), 1.029, N=6144, rule="nearest"),
                                _ev(300, (2048, 4096, 4096), 0.6)])
    route = decide(table, GemmProblem(1000, 6144, 4096), H200)
    assert (route.path, route.entry, route.rule, route.donor.M, route.ratio) == (
        "unproven", None, "nearest", 2048, pytest.approx(1.029))
    assert route.reason == ("calibration measured 1.029x at M=2048 only, on one side of M=1000 "
                            "for the nearest entry 2048x4096x4096: unproven, cuBLAS unless the "
                            "guard measures it")
    assert lookup(table, GemmProblem(3000, 6144, 4096), H200) is None  # above it: unproven too
    assert decide(table, GemmProblem(2048, 6144, 4096), H200).path == "calibrated"  # measured
    below_a_loss = decide(table, GemmProblem(200, 4096, 4096), H200)  # a loss on one side only
    assert (below_a_loss.path, below_a_loss.ratio) == ("unproven", pytest.approx(0.6))
    assert decide(table, GemmProblem(1000, 1024, 4096), H200).path == "nearest"  # no evidence


def test_load_validates_evidence(tmp_path):
    good = {"M": 300, "N": 4096, "K": 4096, "dtype": "bf16", "layout": "TN", "rule": "bucket",
            "served_by": [2048, 4096, 4096], "tflops": 60.0, "cublas_tflops": 100.0}
    entries = [_entry(2048, 4096, 4096)]
    table = dispatch.load(_write(tmp_path, entries, evidence=[good], evidence_min_ratio=0.9))
    assert table.evidence[0].served_by == (2048, 4096, 4096) and table.evidence_min_ratio == 0.9
    assert lookup(table, GemmProblem(300, 4096, 4096)) is None
    for bad, needle in [(dict(good, served_by=[1, 8, 8]), "served_by=[1, 8, 8]: no kernel entry"),
                        (dict(good, M=2048), "is an exact entry"),
                        (dict(good, rule="exact"), "evidence[0].rule='exact'"),
                        (dict(good, cublas_tflops=0), "evidence[0].cublas_tflops=0")]:
        with pytest.raises(UserError, match=needle.replace("[", "\\[").replace("]", "\\]")):
            dispatch.load(_write(tmp_path, entries, evidence=[bad]))
    with pytest.raises(UserError, match="duplicate of evidence\\[0\\]"):
        dispatch.load(_write(tmp_path, entries, evidence=[good, good]))


def test_json_round_trip_keeps_routes_labels_and_evidence(tmp_path):
    from tunefw.export.table import render
    table = _table([_e(2048, label="m.qkv"), _e(128, route="cublas", reason="lost")],
                   [_ev(300, (2048, 4096, 4096), 0.6)], min_ratio=1.0)
    path = tmp_path / "d.json"
    path.write_text(render(table, "json"))
    again = dispatch.load(path)
    assert again.entries == table.entries and again.evidence == table.evidence
    assert again.as_dict() == table.as_dict()
    csv = render(table, "csv").splitlines()
    assert csv[0].startswith("M,N,K,dtype,layout,label,family,config,tflops,cublas_tflops,ratio")
    assert csv[2].endswith(",cublas,lost,False,none") and ",m.qkv," in csv[1]


# ---- bad files ----------------------------------------------------------------------------
@pytest.mark.parametrize("mutate, needle", [
    (lambda d: d.update(schema_version=3), "schema_version=3: expected one of 1, 2"),
    (lambda d: d.update(schema_version=True), "schema_version=True: expected one of 1, 2"),
    (lambda d: d.pop("entries"), "top level: missing entries"),
    (lambda d: d.update(entries={}), "entries={}: Input should be a valid list"),
    (lambda d: d["entries"][0].pop("family"), "entries[0]: missing family"),
    (lambda d: d["entries"][0].update(N=100), "entries[0]: problem N=100"),
    (lambda d: d["entries"][0].update(family="nope"), "entries[0].family='nope'"),
    (lambda d: d["entries"][0].update(family=["mma_sm80"]), "entries[0].family=['mma_sm80']"),
    (lambda d: d["entries"][0]["config"].update(BM=7), "entries[0].config: BM=7 not in"),
    (lambda d: d["entries"][0]["config"].update(BM=True), "entries[0].config: BM=True: expected"),
    (lambda d: d["entries"][0]["config"].update(BM=128.0), "entries[0].config: BM=128.0: expected"),
    (lambda d: d["entries"][0]["config"].update(BM=None), "entries[0].config: BM=None: expected"),
    (lambda d: d["entries"][0].update(tflops=-1.0), "entries[0].tflops=-1.0: Input should be greater"),
    (lambda d: d["entries"][0].update(tflops=1e300), "entries[0].tflops=1e+300"),
    (lambda d: d["entries"][0].update(cublas_tflops="90"), "entries[0].cublas_tflops='90'"),
    (lambda d: d["entries"][0].update(trial_id="abc"), "entries[0].trial_id='abc'"),
    (lambda d: d["entries"][0].update(trial_id=None), "entries[0].trial_id=None"),
    (lambda d: d["entries"][0].update(M=10**20), "entries[0].M=100000000000000000000"),
    (lambda d: d["entries"][0].update(colour=1), "entries[0].colour: unknown key"),
    (lambda d: d.update(colour=1), "colour: unknown key"),
    (lambda d: d.update(simulated=1), "simulated=1: Input should be a valid boolean"),
    (lambda d: d["entries"].append(dict(d["entries"][0])), "entries[1]: duplicate of entries[0]"),
    (lambda d: d["entries"][0].update(route="maybe"), "entries[0].route='maybe'"),
    (lambda d: d["fingerprint"].update(name=["x"]), "fingerprint.name=['x']"),
])
def test_bad_files_give_one_line_errors(tmp_path, mutate, needle):
    data = {"schema_version": 2, "simulated": False, "fingerprint": {},
            "entries": [_entry(64, 64, 64)]}
    mutate(data)
    path = tmp_path / "d.json"
    path.write_text(json.dumps(data))
    with pytest.raises(UserError) as exc:
        dispatch.load(path)
    assert needle in str(exc.value) and "\n" not in str(exc.value)
    assert str(exc.value).startswith(f"{path}: ")


@pytest.mark.parametrize("raw, needle", [
    (b"{nope", "not JSON (line 1"),
    (b'{"schema_version": NaN}', "not JSON (NaN is not a number JSON allows)"),
    (b'{"a": Infinity}', "Infinity is not a number JSON allows"),
    (b'{"a": 1, "a": 2}', "key 'a' appears twice"),
    (b'{"schema_version": 2, "name": "\xff"}', "not UTF-8 (byte 31)"),
    (b"[" * 100000 + b"]" * 100000, "nested too deeply"),
    (b"[1]", "expected a JSON object"),
])
def test_undecodable_files(tmp_path, raw, needle):
    path = tmp_path / "d.json"
    path.write_bytes(raw)
    with pytest.raises(UserError) as exc:
        dispatch.load(path)
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_nan_tflops_in_an_entry(tmp_path):
    text = json.dumps({"schema_version": 2, "simulated": False, "fingerprint": {},
                       "entries": [_entry(64, 64, 64)]}).replace("100.0", "NaN")
    path = tmp_path / "d.json"
    path.write_text(text)
    with pytest.raises(UserError, match="NaN is not a number JSON allows"):
        dispatch.load(path)


def test_published_schema_is_current():
    from pathlib import Path

    from tunefw.runtime.dispatch_schema import json_schema
    committed = Path(__file__).resolve().parent.parent / "dispatch.schema.json"
    assert committed.read_text() == json_schema(), "regenerate: tunefw dispatch schema dispatch.schema.json"
    schema = json.loads(committed.read_text())
    assert schema["properties"]["schema_version"]["const"] == 2
    assert schema["additionalProperties"] is False


def test_the_committed_round_4_table_no_longer_serves_m_257_by_a_losing_entry():
    from pathlib import Path
    table = dispatch.load(Path(__file__).resolve().parent.parent /
                          "benchmarks/results/dispatch_wgmma_sm90_r4_h200.json")
    route = decide(table, GemmProblem(257, 6144, 4096))  # measured 0.41x through the nearest rule
    assert (route.path, route.rule, route.donor.M) == ("cublas", "bucket", 128)
    assert "the largest tuned M below 257 (no tuned M above), is a cuBLAS route" in route.reason
    assert decide(table, GemmProblem(4096, 4096, 4096)).path == "exact"
