"""Durations and sizes in human units, and their errors."""

from __future__ import annotations

import pytest

from veo_edge.errors import UsageError
from veo_edge.soak.units import format_duration, parse_duration, parse_size


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30),
        ("10m", 600),
        ("72h", 72 * 3600),
        ("1h30m", 5400),
        ("2d", 172800),
        ("45", 45),
        ("1.5m", 90),
        ("250ms", 0.25),
        (" 2h 5m ", 7500),
    ],
)
def test_durations(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "10x", "h", "m10", "-5s", "10m5", "1e3s", "72 hours"])
def test_bad_durations_say_what_is_expected(text):
    with pytest.raises(UsageError, match=r"--duration .* (is not a duration|must be).*e\.g\. 30s, 10m, 72h"):
        parse_duration(text, "--duration")


def test_zero_duration_is_refused_unless_allowed():
    with pytest.raises(UsageError, match=r"--duration '0s' must be > 0"):
        parse_duration("0s", "--duration")
    assert parse_duration("0s", "--warmup", allow_zero=True) == 0


def test_format_duration():
    assert [format_duration(s) for s in (12.5, 65, 3725, 90000)] == ["12.5s", "1m05s", "1h02m05s", "1d01h00m"]


def test_sizes():
    assert parse_size("1MiB") == 1 << 20
    assert parse_size("512k") == 512 << 10
    assert parse_size("2G") == 2 << 30
    assert parse_size("100") == 100
    with pytest.raises(UsageError, match=r"--leak-floor 'lots' is not a size; expected bytes or a number"):
        parse_size("lots", "--leak-floor")


def test_report_units_are_human():
    """report.md's latencies in ms and rates in MiB/h, never 3.52e+04 ms or 2.553e+08 B/h."""
    from veo_edge.soak.units import format_mib, format_ms, format_rate

    assert [format_ms(v) for v in (0.4123, 24.143, 512.34, 35200.4, None)] == [
        "0.412",
        "24.14",
        "512.3",
        "35,200",
        "-",
    ]
    assert format_rate(2.553e8) == "+243.47 MiB/h" and format_rate(-(1 << 19)) == "-0.500 MiB/h"
    assert format_rate(1.879e7, False) == "+17.92" and format_mib(3 << 30) == "3,072"
