"""Which engine serves: the decision logic of ``veo-edge engine build``, without TensorRT or a GPU."""

import math

import pytest

from veo_edge.engine.selection import Decision, Measurement, decide, median_ms, tolerance, variants_to_build
from veo_edge.errors import UsageError


def m(variant, b1, bmax, err, scale=10.0):
    return Measurement(variant, {1: b1, 8: bmax}, err, scale)


PLAIN = m("plain", 1.00, 4.00, 2e-5)


def test_variants_to_build_per_mode():
    assert variants_to_build("fastest", True) == ["plugins", "plain"]
    assert variants_to_build("fastest", False) == ["plain"]  # no plugin graph: TensorRT's own only
    assert variants_to_build("plain", True) == ["plain"]
    assert variants_to_build("plugins", True) == ["plugins"]
    with pytest.raises(UsageError, match=r"--engine plugins: this build has no plugins_onnx artifact"):
        variants_to_build("plugins", False)
    with pytest.raises(
        UsageError, match=r"unknown engine choice 'trt'; choose one of: fastest, plugins, plain"
    ):
        variants_to_build("trt", True)


def test_the_faster_equivalent_plugin_engine_is_kept():
    d = decide("fastest", [m("plugins", 0.80, 3.00, 3e-5), PLAIN], "fp32")
    assert d.chosen == "plugins"
    assert "equivalent and faster at every batch timed (batch 1: 1.25x, batch 8: 1.33x)" in d.reason
    assert d.tolerance == pytest.approx(2 * 2e-5 + 1e-5 * 10.0)


@pytest.mark.parametrize(
    ("plugins", "why"),
    [
        (
            m("plugins", 0.80, 4.50, 3e-5),
            "not faster at batch 8 (4.500 ms vs 4.000 ms)",
        ),  # slower at max batch
        (m("plugins", 1.20, 3.00, 3e-5), "not faster at batch 1"),  # slower at batch 1
        (m("plugins", 1.00, 4.00, 3e-5), "not faster at batch 1"),  # a tie goes to TensorRT's own
        (m("plugins", 0.50, 2.00, 1e-3), "not equivalent: max abs err 0.001 > 0.00014"),  # fast but wrong
        (m("plugins", 0.50, 2.00, math.nan), "not equivalent"),  # NaN outputs are never equivalent
    ],
)
def test_the_plain_engine_is_kept_unless_the_plugins_win_everywhere(plugins, why):
    d = decide("fastest", [plugins, PLAIN], "fp32")
    assert d.chosen == "plain" and why in d.reason


def test_fp16_tolerance_has_a_wider_floor():
    assert tolerance(PLAIN, "fp16") == pytest.approx(2 * 2e-5 + 1e-3 * 10.0)
    assert decide("fastest", [m("plugins", 0.5, 2.0, 5e-3), PLAIN], "fp16").chosen == "plugins"
    assert decide("fastest", [m("plugins", 0.5, 2.0, 5e-3), PLAIN], "fp32").chosen == "plain"


def test_forced_modes_and_bad_input():
    assert decide("plugins", [m("plugins", 9.0, 9.0, 1.0)], "fp32").chosen == "plugins"  # the user's call
    assert decide("plain", [PLAIN], "fp32").reason == "--engine plain was asked for"
    assert decide("fastest", [PLAIN], "fp32").chosen == "plain"
    with pytest.raises(UsageError, match="needs the plain engine measured"):
        decide("fastest", [m("plugins", 1, 1, 0)], "fp32")
    with pytest.raises(UsageError, match="timed at different batch sizes"):
        decide("fastest", [Measurement("plugins", {1: 0.5}, 0.0, 1.0), PLAIN], "fp32")
    with pytest.raises(UsageError, match="--engine plugins: no plugins engine was measured"):
        decide("plugins", [PLAIN], "fp32")


def test_decisions_round_trip_and_read_well():
    d = decide("fastest", [m("plugins", 0.80, 3.00, 3e-5), PLAIN], "fp32")
    back = Decision.from_dict(d.to_dict())
    assert back == d
    lines = d.lines()
    assert lines[0].startswith("engine: plugins (fastest): equivalent and faster")
    assert lines[1] == "  plugins: batch 1: 0.800 ms, batch 8: 3.000 ms; max abs err 3e-05 (ref scale 10)"


def test_median_is_taken_after_the_warm_up():
    samples = iter([100.0, 100.0, 3.0, 1.0, 2.0, 9.0, 4.0])  # two slow warm-up runs, then five timed

    assert median_ms(lambda: next(samples), warmup=2, reps=5) == 3.0
    with pytest.raises(UsageError, match="reps >= 1"):
        median_ms(lambda: 1.0, warmup=0, reps=0)
