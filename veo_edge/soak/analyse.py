"""From a run directory's database to numbers and a verdict (``report.json``'s content).

Definitions (the README's "Soak" section states the same):

- **Warm-up**: the first ``warmup_s`` of every segment (each ``--resume`` starts a fresh process) is
  left out of jitter, tail and leak fits; it is still counted for errors and lost requests.
- **Jitter** (±ms): half the range of the per-window p50 latencies after warm-up,
  ``±(max_w p50_w − min_w p50_w) / 2``, over windows with at least ``MIN_WINDOW_SAMPLES`` answers.
- **Tail** (ms): ``p99 − p50`` of all answers after warm-up.
- **Leak rate** (bytes/hour): the Theil–Sen slope of a memory series against time after warm-up, with
  its 95 % confidence interval (``scipy.stats.theilslopes``), per segment; the headline is the longest
  segment. It passes when the interval contains 0 or its upper end is below the floor.
- **Not sent**: arrivals the client itself did not send (open loop: its backlog full, waiting there past
  the timeout, or still queued at the end); the offered rate was then not sustained.
- **Lost**: requests sent but never answered, in segments that ended cleanly (a SIGKILLed segment's
  in-flight requests are counted apart, as ``in_flight_when_killed``).
- **Disk rate**: the growth of the database (its pages, WAL included) after the first window, so the
  fixed size of an empty run directory is not extrapolated as a rate.

This module reads the windows (requests, latency, jitter, throughput) and events tables and assembles the
report; the samples table (memory and leak fits, fragmentation, counters, probes, the database's growth)
is read in :mod:`veo_edge.soak.analyse_samples`. The percentiles and fits are computed in
:mod:`veo_edge.soak.fits`; the checks against the thresholds are :func:`veo_edge.soak.verdict.verdict`,
re-exported here.
"""

from __future__ import annotations

import json
from typing import Any

from veo_edge.soak.analyse_samples import analyse_samples, disk_rate
from veo_edge.soak.config import SoakConfig, Thresholds
from veo_edge.soak.fits import MIN_FIT_SAMPLES, MIN_JITTER_WINDOWS, percentiles
from veo_edge.soak.load import decode_histogram, new_histogram
from veo_edge.soak.store import RunStore
from veo_edge.soak.verdict import verdict

__all__ = ["MIN_FIT_SAMPLES", "MIN_JITTER_WINDOWS", "REPORT_FORMAT", "REPORT_VERSION", "analyse", "verdict"]

REPORT_FORMAT = "veo-edge-soak-report"
REPORT_VERSION = 1
MIN_WINDOW_SAMPLES = 10
#: arrivals not sent in windows recorded before their reasons were counted
UNKNOWN_WHY = "reason not recorded (recorded by an older veo-edge)"
#: per-window detail kept in the report (consecutive windows merged beyond: see ``windows_stride``)
MAX_WINDOWS_KEPT = 2000


def _segments(store: RunStore) -> list[dict[str, Any]]:
    segs = list(store.rows("segments"))
    for i, seg in enumerate(segs):
        seg["end_s"] = segs[i + 1]["offset_s"] if i + 1 < len(segs) else None
    return segs


def analyse(store: RunStore, thresholds: Thresholds | None = None) -> dict[str, Any]:
    meta = store.meta()
    config = SoakConfig.from_dict(meta["config"])
    th = thresholds or config.thresholds
    warm = config.warmup
    segments = _segments(store)
    seg_by_id = {s["id"]: s for s in segments}

    def warmed(seg_id: int, t: float) -> bool:
        return t >= seg_by_id[seg_id]["offset_s"] + warm

    # -- requests and latency, window by window (one histogram in memory at a time) -----------------
    overall, steady = new_histogram(), new_histogram()
    windows: list[dict[str, Any]] = []
    stride = max(1, -(-store.count("windows") // MAX_WINDOWS_KEPT))
    group: list[dict[str, Any]] = []
    p50s: list[float] = []
    per_seg: dict[int, dict[str, int]] = {s["id"]: {"issued": 0, "done": 0} for s in segments}
    totals = {"issued": 0, "ok": 0, "errors": 0, "timeouts": 0, "not_sent": 0}
    kinds: dict[str, int] | None = None  # errors by kind (None: a run recorded before they were counted)
    why: dict[str, int] = {}  # arrivals not sent, by reason
    for w in store.rows("windows"):
        for k in totals:
            totals[k] += w.get(k) or 0
        for k, n in (json.loads(w["not_sent_why"]) if w.get("not_sent_why") else {}).items():
            why[k] = why.get(k, 0) + n
        if w.get("kinds"):
            kinds = kinds or {}
            for k, n in json.loads(w["kinds"]).items():
                kinds[k] = kinds.get(k, 0) + n
        per_seg[w["segment"]]["issued"] += w["issued"]
        per_seg[w["segment"]]["done"] += w["ok"] + w["errors"] + w["timeouts"] + (w.get("not_sent") or 0)
        span = max(w["t1"] - w["t0"], 1e-9)
        h = decode_histogram(w["hist"]) if w["hist"] else None
        if h is not None and w["p50_us"] is None:  # an open window a SIGKILL left: summarised here
            w.update({f"{k}_us": v * 1e3 for k, v in (percentiles(h) or {}).items() if k != "count"})
        entry = {
            "t0": w["t0"],
            "t1": w["t1"],
            "segment": w["segment"],
            "rps": w["ok"] / span,
            "errors": w["errors"] + w["timeouts"],
            "not_sent": w.get("not_sent") or 0,
            "warm": warmed(w["segment"], w["t0"]),
            **{
                k: (w[f"{k}_us"] / 1e3 if w[f"{k}_us"] is not None else None)
                for k in ("p50", "p90", "p99", "p999", "max")
            },
            "samples": w["samples"],
        }
        if entry["warm"] and entry["p50"] is not None and entry["samples"] >= MIN_WINDOW_SAMPLES:
            p50s.append(entry["p50"])
        group.append(entry)
        if len(group) == stride:
            windows.append(_merge(group))
            group = []
        if h is not None:
            overall.add(h)
            if entry["warm"]:
                steady.add(h)
    if group:
        windows.append(_merge(group))
    lost = sum(
        per_seg[s["id"]]["issued"] - per_seg[s["id"]]["done"] for s in segments if s["ended_wall"] is not None
    )
    killed = [s for s in segments if s["ended_wall"] is None]
    in_flight_killed = sum(per_seg[s["id"]]["issued"] - per_seg[s["id"]]["done"] for s in killed)
    if kinds is None:  # a run recorded before kinds were counted: only errors and timeouts, exactly
        kinds = {k: n for k, n in (("error", totals["errors"]), ("timeout", totals["timeouts"])) if n}
    error_kinds: dict[str, int] = dict(sorted(kinds.items(), key=lambda kv: -kv[1]))
    if totals["not_sent"] > sum(why.values()):  # windows recorded before reasons were counted
        why[UNKNOWN_WHY] = totals["not_sent"] - sum(why.values())
    not_sent_why = dict(sorted(why.items(), key=lambda kv: -kv[1]))
    first_errors: list[str] = []
    events = []
    for e in store.rows("events"):
        if e["kind"] in ("error", "timeout"):  # a window's backlog events are events, apart from errors
            if len(first_errors) < 10:
                first_errors.append(f"{e['t']:.1f}s {e['kind']}: {e['detail']}")
        elif len(events) < 200:
            events.append({"t": e["t"], "kind": e["kind"], "detail": e["detail"]})

    # -- jitter ---------------------------------------------------------------------------------------
    steady_p = percentiles(steady)
    jitter = {
        "definition": "±(max - min)/2 of per-window p50 after warm-up",
        "windows": len(p50s),
        "p50_min_ms": min(p50s) if p50s else None,
        "p50_max_ms": max(p50s) if p50s else None,
        "jitter_ms": (max(p50s) - min(p50s)) / 2 if len(p50s) >= MIN_JITTER_WINDOWS else None,
        "min_windows": MIN_JITTER_WINDOWS,
        "tail_ms": (steady_p["p99"] - steady_p["p50"]) if steady_p else None,
    }

    sampled = analyse_samples(store, config, segments, warmed)

    recorded = store.recorded_until()
    run = {
        "run_dir": str(store.path),
        "target": config.url or config.build_dir,
        "kind": config.kind,
        # where the server's memory came from (None in-process: this process's own), and whether any
        # sample had it: a run without one has no leak check to fail
        "metrics_url": config.metrics_source,
        "memory_sampled": sampled["memory_sampled"],
        "mode": config.mode,
        "batch": config.batch,
        "planned_s": config.duration_s,
        "ran_s": store.ran_s(),  # what counts toward the duration: the drains after each segment not
        "recorded_s": recorded,  # the time line, drains included
        "warmup_s": warm,
        "window_s": config.window_s,
        "sample_interval_s": config.sample_s,
        "status": meta.get("status"),
        "chaos": config.chaos,
        "segments": [
            {
                "id": s["id"],
                "offset_s": s["offset_s"],
                "end_reason": s["end_reason"] or "killed (no clean end)",
                "in_flight_at_end": s["in_flight_at_end"],
            }
            for s in segments
        ],
    }
    db_bytes = store.size_bytes()
    sent = totals["issued"] - totals["not_sent"]
    report: dict[str, Any] = {
        "format": REPORT_FORMAT,
        "version": REPORT_VERSION,
        "run": run,
        "requests": {
            **totals,
            "sent": sent,
            # open loop: the rate asked for, and the shares of it sent and answered (arrivals are exact)
            "offered_rps": config.rate,
            "sent_rps": config.rate * sent / totals["issued"] if config.rate and totals["issued"] else None,
            "answered_rps": config.rate * totals["ok"] / totals["issued"]
            if config.rate and totals["issued"]
            else None,
            "latency_from": "scheduled send (open loop)" if config.rate else "actual send (closed loop)",
            "lost": lost,
            "in_flight_when_killed": in_flight_killed,
            "samples_per_request": config.batch,
            "error_kinds": error_kinds,
            "not_sent_why": not_sent_why,
            "first_errors": first_errors,
        },
        "latency_ms": {"overall": percentiles(overall), "after_warmup": steady_p},
        "jitter": jitter,
        "throughput": _throughput(windows),
        "leak": sampled["leak"],
        "batches_per_hour": sampled["batches_per_hour"],
        "fallbacks": sampled["fallbacks"],
        "chaos": sampled["chaos"],
        "fragmentation": sampled["fragmentation"],
        "resources": sampled["resources"],
        "disk": {
            "db_bytes": db_bytes,
            **disk_rate(sampled["db_points"], db_bytes, recorded, store.page_size()),
        }
        | {"samples": sampled["samples"], "windows": len(windows)},
        "server": sampled["server"],
        "events": events,
        "windows": windows,
        "windows_stride": stride,
    }
    report["verdict"] = verdict(report, th)
    return report


def _merge(group: list[dict[str, Any]]) -> dict[str, Any]:
    """Consecutive windows as one: medians of p50, maxima of the upper percentiles, summed counts."""
    if len(group) == 1:
        return group[0]
    span = max(group[-1]["t1"] - group[0]["t0"], 1e-9)
    p50s = sorted(w["p50"] for w in group if w["p50"] is not None)

    def top(key: str) -> float | None:
        vals = [w[key] for w in group if w[key] is not None]
        return max(vals) if vals else None

    return {
        "t0": group[0]["t0"],
        "t1": group[-1]["t1"],
        "segment": group[-1]["segment"],
        "rps": sum(w["rps"] * (w["t1"] - w["t0"]) for w in group) / span,
        "errors": sum(w["errors"] for w in group),
        "not_sent": sum(w["not_sent"] for w in group),
        "warm": all(w["warm"] for w in group),
        "p50": p50s[len(p50s) // 2] if p50s else None,
        **{k: top(k) for k in ("p90", "p99", "p999", "max")},
        "samples": sum(w["samples"] for w in group),
    }


def _throughput(windows: list[dict[str, Any]]) -> dict[str, Any]:
    rps = [w["rps"] for w in windows if w["t1"] - w["t0"] > 0.5]
    return {
        "mean_rps": sum(rps) / len(rps) if rps else None,
        "min_window_rps": min(rps) if rps else None,
        "max_window_rps": max(rps) if rps else None,
    }
