"""The samples table of a run's database, analysed: memory series and their leak fits, the pool's
fragmentation, batches, the server's fallback, fault and retry counters, chaos injections, health probes
and the database's own growth (the parts of ``report.json`` that :func:`veo_edge.soak.analyse.analyse`
takes from the samples; the requests and latencies come from the windows table there).

The definitions (warm-up, leak rate, disk rate) are :mod:`veo_edge.soak.analyse`'s.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from veo_edge.soak.config import SoakConfig
from veo_edge.soak.fits import theil_sen
from veo_edge.soak.store import RunStore

LEAK_SERIES = ("rss", "uss", "gpu_used", "pool_in_use")


def analyse_samples(
    store: RunStore, config: SoakConfig, segments: list[dict[str, Any]], warmed: Callable[[int, float], bool]
) -> dict[str, Any]:
    """The report's parts the samples give (``leak``, ``fallbacks``, ``server``, ...), plus
    ``memory_sampled``, ``samples`` (their count) and ``db_points`` (the database's size over time, after
    the first window) for the run and disk sections."""
    series: dict[str, dict[int, tuple[list[float], list[float]]]] = {k: {} for k in LEAK_SERIES}
    frag_ts, frag_vals, entropy_vals, batches = [], [], [], {}
    fallbacks_by_seg: dict[int, list[int]] = {}
    backends: list[str] = []
    recoveries_by_seg: dict[int, list[int]] = {}  # as fallbacks: the server's counter runs on
    injected_by_seg: dict[int, dict[str, int]] = {}  # chaos: per segment, the runtime's counters
    counted_by_seg: dict[tuple[str, int], list[dict]] = {}  # faults / retries by backend
    first_last: dict[str, list[Any]] = {}
    n_samples = 0
    probes: dict[str, Any] = {"probes": 0, "failed": 0, "down_at_s": None, "down_at_end": None}
    # a run recorded before the health probe: its own /metrics scrape (HTTP, no --metrics-url) stands in
    scrapes = dict(probes, basis="GET /metrics: recorded before health probes")
    scraped = config.kind == "http" and config.metrics_url is None
    db_pts: list[tuple[float, float]] = []  # the database's size, after the first window
    baselined: set[int] = set()  # segments with a sample before their load (older runs: none)
    for s in store.rows("samples"):
        n_samples += 1
        for k in (*LEAK_SERIES, "fds", "threads"):
            if s[k] is not None:
                first_last.setdefault(k, [s[k], s[k]])[1] = s[k]
                if k in series and warmed(s["segment"], s["t"]):
                    ts, ys = series[k].setdefault(s["segment"], ([], []))
                    ts.append(s["t"])
                    ys.append(float(s[k]))
        if s["pool_fragmentation"] is not None:
            frag_ts.append(s["t"])
            frag_vals.append(s["pool_fragmentation"])
            entropy_vals.append(s["pool_entropy"])
        if s["fallbacks"] is not None:  # per segment: [first, max]
            fb = fallbacks_by_seg.setdefault(s["segment"], [int(s["fallbacks"])] * 2)
            fb[1] = max(fb[1], int(s["fallbacks"]))
        if s["batches"] is not None and warmed(s["segment"], s["t"]):
            batches.setdefault(s["segment"], ([], []))
            batches[s["segment"]][0].append(s["t"])
            batches[s["segment"]][1].append(float(s["batches"]))
        if s["active_backend"] and s["active_backend"] not in backends:
            backends.append(s["active_backend"])
        if s["extra"]:
            extra = json.loads(s["extra"])
            if extra.get("baseline"):
                baselined.add(s["segment"])
            if extra.get("live") is not None:
                _probed(probes, s["t"], bool(extra["live"]))
            elif scraped:
                _probed(scrapes, s["t"], "scrape_error" not in extra)
            if extra.get("db_bytes") is not None and s["t"] >= config.window_s:
                db_pts.append((s["t"], float(extra["db_bytes"])))
            if extra.get("recoveries") is not None:
                rc = recoveries_by_seg.setdefault(s["segment"], [int(extra["recoveries"])] * 2)
                rc[1] = max(rc[1], int(extra["recoveries"]))
            seg_injected = injected_by_seg.setdefault(s["segment"], {})
            for rule, n in (extra.get("injected") or {}).items():
                seg_injected[rule] = max(seg_injected.get(rule, 0), int(n))
            for key in ("faults", "retries"):  # per segment: [first, last] of each counter
                if extra.get(key) is not None:
                    seen = counted_by_seg.setdefault((key, s["segment"]), [extra[key], extra[key]])
                    seen[1] = extra[key]
    leak: dict[str, Any] = {}
    for k in LEAK_SERIES:
        fits = {}
        for seg_id, (ts, ys) in series[k].items():
            f = theil_sen(ts, ys)
            if f is not None:
                fits[seg_id] = {**f, "segment": seg_id}
        if fits:
            head = max(fits.values(), key=lambda f: f["span_s"])
            leak[k] = {**head, "per_segment": list(fits.values())}
    batch_fits = [f for f in (theil_sen(*v) for v in batches.values()) if f is not None]
    in_process = config.url is None
    fallbacks = sum(v[1] - (0 if in_process else v[0]) for v in fallbacks_by_seg.values())
    recoveries = sum(v[1] - (0 if in_process else v[0]) for v in recoveries_by_seg.values())
    fragmentation = None
    if frag_vals:
        tail = frag_vals[-max(1, len(frag_vals) // 10) :]
        ent_tail = [e for e in entropy_vals[-len(tail) :] if e is not None]
        fragmentation = {
            "final": sorted(tail)[len(tail) // 2],
            "max": max(frag_vals),
            "entropy_bits_final": sorted(ent_tail)[len(ent_tail) // 2] if ent_tail else None,
            "samples": len(frag_vals),
        }

    return {
        "memory_sampled": any(k in first_last for k in LEAK_SERIES),
        "leak": leak,
        "batches_per_hour": max(batch_fits, key=lambda f: f["span_s"])["bytes_per_hour"]
        if batch_fits
        else None,
        "fallbacks": {
            # None: not measured (a gRPC soak without --metrics-url reads no counter of the server)
            "switches": fallbacks if fallbacks_by_seg or in_process else None,
            "recoveries": recoveries if fallbacks_by_seg or in_process else None,
            "backends": backends,
            **_by_backend(counted_by_seg, in_process),
            "counted_from": _counted_from(in_process, baselined, segments),
        },
        "chaos": _chaos(config.chaos, injected_by_seg),
        "fragmentation": fragmentation,
        "resources": {k: {"first": v[0], "last": v[1]} for k, v in first_last.items()},
        "server": dict(probes, basis="health probe")
        if probes["probes"]
        else (scrapes if scrapes["probes"] > scrapes["failed"] else None),  # /metrics answered once
        "samples": n_samples,
        "db_points": db_pts,
    }


def _by_backend(by_seg: dict[tuple[str, int], list[dict]], in_process: bool) -> dict[str, Any]:
    """Faults and retries seen during the run, ``{backend: {kind or outcome: n}}``: in-process each
    segment's runtime counted from zero; a server's counters run on, so only what grew in a segment."""
    out: dict[str, dict[str, dict[str, int]]] = {"faults": {}, "retries": {}}
    for (key, _), (first, last) in sorted(by_seg.items()):
        for backend, counts in last.items():
            for label, n in counts.items():
                grew = n - (0 if in_process else first.get(backend, {}).get(label, 0))
                if grew:
                    mine = out[key].setdefault(backend, {})
                    mine[label] = mine.get(label, 0) + grew
    return out


def _counted_from(in_process: bool, baselined: set[int], segments: list[dict[str, Any]]) -> str:
    """Where the switches, faults and retries count from (a server's counters run on)."""
    if in_process:
        return "zero: each segment's runtime counts from its start"
    if all(s["id"] in baselined for s in segments):
        return "a scrape before each segment's load, to the one after its drain"
    return "each segment's first sample, about one sample interval into its load (recorded before baselines)"


def _chaos(schedule: dict[str, Any] | None, by_segment: dict[int, dict[str, int]]) -> dict[str, Any] | None:
    """The chaos schedule and the faults it injected (summed over segments: each ran its own runtime)."""
    if not schedule:
        return None
    injected: dict[str, int] = {}
    for counts in by_segment.values():
        for rule, n in counts.items():
            injected[rule] = injected.get(rule, 0) + n
    return {"schedule": schedule, "injected": injected, "total": sum(injected.values())}


def _probed(probes: dict[str, Any], t: float, ok: bool) -> None:
    probes["probes"] += 1
    probes["down_at_end"] = not ok
    if not ok:
        probes["failed"] += 1
        if probes["down_at_s"] is None:
            probes["down_at_s"] = t


def disk_rate(pts: list[tuple[float, float]], db_bytes: int, recorded: float, page: int) -> dict[str, Any]:
    """Bytes per hour the database grew after the first window (its fixed size left out); a run recorded
    before the size was sampled, or too short to have two samples after its first window, falls back to
    the file over the whole run, which includes that fixed size (said in ``basis``)."""
    if len(pts) >= 2 and pts[-1][0] - pts[0][0] > 0:
        rate = (pts[-1][1] - pts[0][1]) / ((pts[-1][0] - pts[0][0]) / 3600.0)
        span_h = (pts[-1][0] - pts[0][0]) / 3600.0
        basis = (
            f"growth of the database from {pts[0][0]:.0f} s to {pts[-1][0]:.0f} s, after the first window, "
            f"in {page // 1024} KiB pages: ±{page / span_h / (1 << 20):.3g} MiB/h over this span"
        )
        return {"bytes_per_hour": rate, "basis": basis}
    if recorded > 0:
        return {
            "bytes_per_hour": db_bytes / (recorded / 3600.0),
            "basis": "whole file over the run, its fixed size included: an upper bound",
        }
    return {"bytes_per_hour": None, "basis": None}
