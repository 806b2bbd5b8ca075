import numpy as np
import pytest

from veo_edge.errors import ParityError
from veo_edge.export.parity import compare, seeded_inputs


def test_seeded_inputs_are_reproducible():
    a = seeded_inputs((3, 8, 8), 2, seed=5)
    assert a.dtype == np.float32 and a.shape == (2, 3, 8, 8)
    np.testing.assert_array_equal(a, seeded_inputs((3, 8, 8), 2, seed=5))


def test_compare_measures_error_cosine_and_top1(rng):
    ref = rng.standard_normal((4, 10))
    stats = compare("x", ref + 1e-7, ref, baseline=1e-7)
    assert stats.passed and stats.top1_agreement == 1.0 and stats.min_cosine > 0.999999
    assert stats.max_abs == pytest.approx(1e-7, rel=1e-3)
    assert stats.tolerance == pytest.approx(20 * 1e-7 + 1e-5 * np.abs(ref).max())


def test_compare_fails_when_the_error_exceeds_the_baseline_derived_tolerance(rng):
    ref = rng.standard_normal((4, 10))
    stats = compare("x", ref + 1e-3, ref, baseline=1e-7)
    assert not stats.passed


def test_top1_counts_only_samples_with_a_clear_margin(rng):
    ref = rng.standard_normal((2, 10))
    got = ref.copy()
    got[0, ref[0].argmax()] = ref[0].min() - 1
    clear = compare("x", got, ref, baseline=1e-4)
    assert clear.top1_agreement == 0.5 and clear.ambiguous == 0 and not clear.passed
    # with a tolerance wider than every top-2 margin no sample is clear enough to count
    vague = compare("x", got, ref, baseline=10.0)
    assert vague.ambiguous == 2 and vague.top1_agreement == 1.0


def test_parity_failure_error_names_the_numbers():
    from veo_edge.export.parity import check_all

    class Reference:
        def __call__(self, x):
            out = x.reshape(x.shape[0], -1)[:, :5].astype(np.float64)
            return out, out.astype(np.float32)

    runs = {"candidate": lambda x: x.reshape(x.shape[0], -1)[:, :5] + 0.5}
    with pytest.raises(ParityError, match=r"candidate batch 1: max abs 0\.5 \(tolerance .*\), .*top-1"):
        check_all(runs, Reference(), (3, 4, 4), (1, 4), seed=0)
