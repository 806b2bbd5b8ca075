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
