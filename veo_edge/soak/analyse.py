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

The percentiles and fits are computed in :mod:`veo_edge.soak.fits`; the checks against the thresholds
are :func:`veo_edge.soak.verdict.verdict`, re-exported here.
"""

from __future__ import annotations

import json
from typing import Any

from veo_edge.soak.config import SoakConfig, Thresholds
from veo_edge.soak.fits import MIN_FIT_SAMPLES, percentiles, theil_sen
from veo_edge.soak.load import decode_histogram, new_histogram
from veo_edge.soak.store import RunStore
from veo_edge.soak.verdict import verdict

__all__ = ["MIN_FIT_SAMPLES", "REPORT_FORMAT", "REPORT_VERSION", "analyse", "verdict"]

REPORT_FORMAT = "veo-edge-soak-report"
REPORT_VERSION = 1
MIN_WINDOW_SAMPLES = 10
#: the jitter (a half-range of window medians) needs this many windows; fewer reads as skipped
MIN_JITTER_WINDOWS = 2
#: per-window detail kept in the report (consecutive windows merged beyond: see ``windows_stride``)
MAX_WINDOWS_KEPT = 2000
LEAK_SERIES = ("rss", "uss", "gpu_used", "pool_in_use")


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
    for w in store.rows("windows"):
        for k in totals:
            totals[k] += w.get(k) or 0
        if w.get("kinds"):
            kinds = kinds or {}
            for k, n in json.loads(w["kinds"]).items():
                kinds[k] = kinds.get(k, 0) + n
        per_seg[w["segment"]]["issued"] += w["issued"]
        per_seg[w["segment"]]["done"] += w["ok"] + w["errors"] + w["timeouts"] + (w.get("not_sent") or 0)
        span = max(w["t1"] - w["t0"], 1e-9)
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
        if w["hist"]:
            h = decode_histogram(w["hist"])
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
    first_errors: list[str] = []
    events = []
    for e in store.rows("events"):
        if e["kind"] in ("error", "timeout", "backlog"):
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

    # -- memory series and leak fits ------------------------------------------------------------------
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

    recorded = store.recorded_until()
    run = {
        "run_dir": str(store.path),
        "target": config.url or config.build_dir,
        "kind": config.kind,
        # where the server's memory came from (None in-process: this process's own), and whether any
        # sample had it: a run without one has no leak check to fail
        "metrics_url": config.metrics_source,
        "memory_sampled": any(k in first_last for k in LEAK_SERIES),
        "mode": config.mode,
        "batch": config.batch,
        "planned_s": config.duration_s,
        "recorded_s": recorded,
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
            "first_errors": first_errors,
        },
        "latency_ms": {"overall": percentiles(overall), "after_warmup": steady_p},
        "jitter": jitter,
        "throughput": _throughput(windows),
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
        "disk": {"db_bytes": db_bytes, **_disk_rate(db_pts, db_bytes, recorded, store.page_size())}
        | {"samples": n_samples, "windows": len(windows)},
        "server": dict(probes, basis="health probe")
        if probes["probes"]
        else (scrapes if scrapes["probes"] > scrapes["failed"] else None),  # /metrics answered once
        "events": events,
        "windows": windows,
        "windows_stride": stride,
    }
    report["verdict"] = verdict(report, th)
    return report


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


def _disk_rate(pts: list[tuple[float, float]], db_bytes: int, recorded: float, page: int) -> dict[str, Any]:
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
