"""Strict verification on the CPU: fake kernels (torch ops on CPU tensors) that write outside C,
into or around their inputs, read past an input, differ on a second launch, or are wrong on a
small grid, each caught."""
from __future__ import annotations

import torch

from tunefw.evaluate import method
from tunefw.evaluate.strict import GUARD_ELEMS, SENTINEL, GuardedOutput, Operands, strict_verify

M, N, K = 24, 40, 64


def setup():
    a, b = method.make_inputs(M, N, K, "bf16", seed=3)
    cublas = (a.float() @ b.float().T).to(torch.bfloat16)
    ops = Operands(a, b, a.clone(), b.clone(), method.reference(a, b), cublas)
    return ops, GuardedOutput(cublas)


def kernel(ops: Operands, out: GuardedOutput, *, flaw: str = "", calls: list | None = None):
    """A 'launch': C = A B^T in bf16, with the asked-for flaw."""
    calls = [] if calls is None else calls

    def run() -> None:
        calls.append(1)
        out.c.copy_((ops.a.float() @ ops.b.float().T).to(torch.bfloat16))
        if flaw == "after_c":
            out.full[GUARD_ELEMS + M * N + 3] = 1.0
        if flaw == "before_c":
            out.full[GUARD_ELEMS - 1] = 0.0
        if flaw == "into_a":
            ops.a[0, 0] = 7.0
        if flaw == "after_b":
            ops.bands[1].full[GUARD_ELEMS + N * K] = 0.0
        if flaw == "before_a":
            ops.bands[0].full[GUARD_ELEMS - 2] = 1.0
        if flaw == "reads_past_b":  # a masked load one element past B's end, times a zero mask
            out.c[:, -1] += (0.0 * ops.bands[1].full[GUARD_ELEMS + N * K].float()).to(torch.bfloat16)
        if flaw == "second_differs" and len(calls) == 3:  # throw-away, verified, then this one
            out.c[5, 6] = out.c[5, 6] * (1 + 2**-7)
        if flaw == "unwritten":
            out.c[-1, -8:] = float("nan")
    return run


def test_a_correct_kernel_passes_and_launches_three_times():
    ops, out = setup()
    calls: list = []
    verdict = strict_verify(kernel(ops, out, calls=calls), lambda: None, out, ops, "bf16")
    assert verdict.ok and verdict.rel_err < 1e-2
    assert len(calls) == 3  # throw-away, verified, second launch compared bit for bit


def test_writes_outside_c_are_caught_on_either_side():
    for flaw, side, offset in (("after_c", "after", M * N + 3), ("before_c", "before", -1)):
        ops, out = setup()
        verdict = strict_verify(kernel(ops, out, flaw=flaw), lambda: None, out, ops, "bf16")
        assert not verdict.ok
        assert verdict.reason == (f"launch: wrote outside C: 1 element(s) of the guard band {side} "
                                  f"C, first at offset {offset} from C's start")


def test_a_kernel_that_writes_its_input_is_caught_and_the_input_restored():
    ops, out = setup()
    verdict = strict_verify(kernel(ops, out, flaw="into_a"), lambda: None, out, ops, "bf16")
    assert not verdict.ok and verdict.reason == "wrote into its input A"
    assert torch.equal(ops.a, ops.a0)


def test_a_second_launch_with_other_bits_is_caught():
    ops, out = setup()
    verdict = strict_verify(kernel(ops, out, flaw="second_differs"), lambda: None, out, ops, "bf16")
    assert not verdict.ok
    assert verdict.reason.startswith("second launch differs from the first: 1 element(s), first at (5, 6)")


def test_unwritten_elements_keep_the_sentinel_and_fail():
    ops, out = setup()
    verdict = strict_verify(kernel(ops, out, flaw="unwritten"), lambda: None, out, ops, "bf16")
    assert not verdict.ok and "non-finite" in verdict.reason


def test_a_small_grid_launch_is_verified_on_its_own():
    ops, out = setup()

    def small() -> None:
        out.c.copy_((ops.a.float() @ ops.b.float().T).to(torch.bfloat16))
        out.c[7].mul_(1.5)  # one work unit wrong when a CTA takes several
    verdict = strict_verify(kernel(ops, out), lambda: None, out, ops, "bf16", small_grid=small)
    assert not verdict.ok and verdict.reason.startswith("small grid: ")


def test_the_sentinel_is_nan_in_both_dtypes():
    bits = torch.tensor([SENTINEL], dtype=torch.int16)
    assert torch.isnan(bits.view(torch.bfloat16)).all() and torch.isnan(bits.view(torch.float16)).all()
    out = GuardedOutput(torch.empty(M, N, dtype=torch.float16))
    out.poison()
    assert out.guards_intact() is None and out.c.data_ptr() - out.full.data_ptr() == 2 * GUARD_ELEMS


def test_a_split_k_counter_left_dirty_is_caught():
    # Serial split-K as tests/faults' splitk_dirty does it: SPLITS partial sums per element and a
    # counter the last split sees at SPLITS - 1 before it writes C; the counter is never reset and
    # the workspace is zeroed once per trial, so only the throw-away launch writes C.
    ops, out = setup()
    splits, counter = 4, torch.zeros(1, dtype=torch.int32)
    chunk = K // splits

    def run() -> None:
        partial = [ops.a[:, s * chunk:(s + 1) * chunk].float() @ ops.b[:, s * chunk:(s + 1) * chunk].float().T
                   for s in range(splits)]
        for _ in range(splits):
            counter.add_(1)
            if int(counter) == splits:
                out.c.copy_(sum(partial).to(torch.bfloat16))
    verdict = strict_verify(run, lambda: None, out, ops, "bf16")
    assert int(counter) == 2 * splits  # the throw-away and the verified launch, no more
    assert not verdict.ok and verdict.reason.startswith(f"{M * N} non-finite elements")


def test_a_kernel_that_writes_around_its_inputs_is_caught_and_the_band_restored():
    for flaw, name, side, offset in (("after_b", "B", "after", N * K),
                                     ("before_a", "A", "before", -2)):
        ops, out = setup()
        verdict = strict_verify(kernel(ops, out, flaw=flaw), lambda: None, out, ops, "bf16")
        assert not verdict.ok
        assert verdict.reason == (f"wrote outside {name}: 1 element(s) of the guard band {side} "
                                  f"{name}, first at offset {offset} from {name}'s start")
        assert ops.changed() is None  # the band holds the sentinel again
    assert strict_verify(kernel(ops, out), lambda: None, out, ops, "bf16").ok


def test_a_read_past_an_input_that_reaches_the_math_is_caught():
    ops, out = setup()
    verdict = strict_verify(kernel(ops, out, flaw="reads_past_b"), lambda: None, out, ops, "bf16")
    assert not verdict.ok
    assert verdict.reason == f"{M} non-finite elements (unwritten or NaN), first at (0, {N - 1})"


def test_the_operands_are_views_inside_their_bands_with_the_values_given():
    a, b = method.make_inputs(M, N, K, "fp16", seed=5)
    ops = Operands(a, b, a.clone(), b.clone(), method.reference(a, b), a @ b.T)
    for band, given in zip(ops.bands, (a, b)):
        assert band.inner.data_ptr() - band.full.data_ptr() == 2 * GUARD_ELEMS
        assert torch.equal(band.inner, given) and band.inner.data_ptr() != given.data_ptr()
        assert torch.isnan(band.full[:GUARD_ELEMS]).all() and torch.isnan(band.full[-GUARD_ELEMS:]).all()
    assert ops.a.data_ptr() == ops.bands[0].inner.data_ptr() and ops.b.is_contiguous()
