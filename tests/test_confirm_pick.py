"""The pick of a problem's confirmations is the best ratio to the cuBLAS timed beside it."""
from tunefw.outcome import Outcome, Status
from tunefw.tune.confirm import ranked


def _confirmed(tflops: float, cublas: float | None) -> Outcome:
    return Outcome(Status.OK, tflops=tflops, cublas_tflops=cublas)


def test_a_confirmation_on_a_higher_clock_does_not_win_on_raw_tflops():
    # Trial 7 was confirmed while the GPU ran 8% faster (its cuBLAS shows it); trial 9 beats
    # cuBLAS in its own run.
    rows = [(7, _confirmed(720.0, 740.0)), (9, _confirmed(700.0, 690.0))]
    assert ranked(rows)[0][0] == 9


def test_without_cublas_figures_the_fastest_wins():
    rows = [(7, _confirmed(720.0, None)), (9, _confirmed(700.0, 690.0))]
    assert ranked(rows)[0][0] == 7
