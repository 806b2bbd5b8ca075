"""Human units: durations (``30s``, ``10m``, ``72h``, ``1h30m``, ``2d``; a bare number is seconds) and
sizes (``1MiB``, ``512k``, ``2G``; binary units; a bare number is bytes)."""

from __future__ import annotations

import math
import re

from veo_edge.errors import UsageError

_UNITS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_EXAMPLES = "e.g. 30s, 10m, 72h, 1h30m or 2d"


def parse_duration(text: str | float | int, what: str = "duration", *, allow_zero: bool = False) -> float:
    """Seconds in ``text``; :class:`UsageError` naming ``what`` when it is not a positive duration."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        seconds = float(text)
    else:
        raw = str(text).strip().lower().replace(" ", "")
        if re.fullmatch(r"\d+(?:\.\d+)?", raw):
            seconds = float(raw)
        else:
            pos, seconds = 0, 0.0
            for m in _PART.finditer(raw):
                if m.start() != pos:
                    break
                seconds += float(m.group(1)) * _UNITS[m.group(2)]
                pos = m.end()
            if not raw or pos != len(raw):
                raise UsageError(
                    f"{what} {text!r} is not a duration; expected a number and a unit, {_EXAMPLES}"
                )
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not allow_zero):
        raise UsageError(f"{what} {text!r} must be {'>= 0' if allow_zero else '> 0'}; {_EXAMPLES}")
    return seconds


def format_duration(seconds: float) -> str:
    """``3725`` -> ``1h02m05s``; under a minute with one decimal (``12.5s``)."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    s = round(seconds)
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    if d:
        return f"{d}d{h:02d}h{m:02d}m"
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


_SIZE = re.compile(r"(\d+(?:\.\d+)?)([kmgt]?)(?:i?b)?")
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str | float | int, what: str = "size") -> float:
    """Bytes in ``text`` (binary units); :class:`UsageError` naming ``what`` when it is not a size >= 0."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        value = float(text)
    else:
        m = _SIZE.fullmatch(str(text).strip().lower().replace(" ", ""))
        if not m:
            raise UsageError(
                f"{what} {text!r} is not a size; expected bytes or a number with a unit, e.g. 1MiB, 512k"
            )
        value = float(m.group(1)) * _SIZE_UNITS[m.group(2)]
    if not math.isfinite(value) or value < 0:
        raise UsageError(f"{what} {text!r} must be >= 0 bytes")
    return value


MiB = 1 << 20  # the soak's one binary megabyte (thresholds in config, figures here)


def format_ms(ms: float | None) -> str:
    """Milliseconds with a precision that fits their size: ``0.412``, ``24.14``, ``512.3``, ``35,200``."""
    if ms is None:
        return "-"
    a = abs(ms)
    if a >= 10_000:
        return f"{ms:,.0f}"
    return f"{ms:.{3 if a < 1 else 2 if a < 100 else 1}f}"


def format_mib(nbytes: float | None, digits: int | None = None) -> str:
    """Bytes as MiB: ``0.062``, ``12.50``, ``1,024``."""
    if nbytes is None:
        return "-"
    v = nbytes / MiB
    a = abs(v)
    if digits is None:
        digits = 3 if a < 10 else 2 if a < 1000 else 0
    return f"{v:,.{digits}f}"


def format_rate(bytes_per_hour: float | None, unit: bool = True) -> str:
    """A memory or disk rate in MiB/h with a sign: ``+0.126 MiB/h``, ``-3.50 MiB/h``."""
    if bytes_per_hour is None:
        return "-"
    text = format_mib(bytes_per_hour)
    text = text if text.startswith("-") else f"+{text}"
    return f"{text} MiB/h" if unit else text
