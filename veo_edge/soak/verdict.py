"""The soak's verdict: each check of a report (``analyse``'s result) against the thresholds, and the run
passes when every check passes."""

from __future__ import annotations

import math
from typing import Any

from veo_edge.soak.config import Thresholds
from veo_edge.soak.fits import MIN_FIT_SAMPLES
from veo_edge.soak.units import format_rate


def verdict(report: dict[str, Any], th: Thresholds) -> dict[str, Any]:
    """Each check: name, value, threshold, pass; the run passes when every check passes."""
    checks = []

    def check(name: str, value: Any, threshold: Any, ok: bool, detail: str, skipped: bool = False) -> None:
        c = {"name": name, "value": value, "threshold": threshold, "pass": bool(ok), "detail": detail}
        checks.append(c | ({"skipped": True} if skipped else {}))

    run, req = report["run"], report["requests"]
    ran = run.get("ran_s", run["recorded_s"])  # run time: the drains after each segment not counted
    check(
        "duration",
        ran,
        run["planned_s"],
        run["status"] == "complete" and ran >= run["planned_s"] - 1e-6,
        f"ran {ran:.1f} s of {run['planned_s']:.1f} s ({run['status']})",
    )
    server = report.get("server")
    if server is not None:  # a server's health probe, every sample tick
        down = next((e["detail"] for e in report["events"] if e["kind"] == "server_down"), None)
        check(
            "server",
            server["failed"],
            0,
            server["failed"] == 0,
            f"answered all {server['probes']} probes ({server.get('basis', 'health probe')})"
            if not server["failed"]
            else f"the server stopped answering at {server['down_at_s']:.1f} s"
            + (" and was still down at the end (it died or was stopped)" if server["down_at_end"] else "")
            + f"; {server['failed']} of {server['probes']} probes ({server.get('basis', 'health probe')}) failed"
            + (f" ({down.split(': ', 1)[-1]})" if down else ""),
        )
    if req.get("offered_rps"):  # open loop: was the offered rate sent at all?
        not_sent = req.get("not_sent", 0)
        check(
            "rate",
            not_sent,
            0,
            not_sent == 0,
            f"offered {req['offered_rps']:g} req/s, sent {req['sent_rps']:.1f}, answered {req['answered_rps']:.1f}"
            + (
                f"; NOT sustained: {not_sent} arrivals not sent (client backlog), latencies only of those sent"
                if not_sent
                else ""
            ),
        )
    errors = req["errors"] + req["timeouts"]
    kinds = ", ".join(f"{k} {n}" for k, n in (req.get("error_kinds") or {}).items())
    check(
        "errors",
        errors,
        th.max_errors,
        errors <= th.max_errors,
        f"{req['errors']} errors, {req['timeouts']} timeouts" + (f" ({kinds})" if kinds else ""),
    )
    check(
        "lost",
        req["lost"],
        th.max_lost,
        req["lost"] <= th.max_lost,
        "sent but never answered (clean segments)",
    )
    jit = report["jitter"]
    j = jit["jitter_ms"]
    need = jit.get("min_windows", 1)
    check(
        "jitter",
        j,
        th.max_jitter_ms,
        j is None or j <= th.max_jitter_ms,
        f"skipped (too few windows): {jit['windows']} after warm-up with enough answers, the jitter needs {need}"
        if j is None
        else f"±{j:.3f} ms over {jit['windows']} windows",
        skipped=j is None,
    )
    tail = report["jitter"]["tail_ms"]
    if th.max_tail_ms is not None:
        check(
            "tail",
            tail,
            th.max_tail_ms,
            tail is not None and tail <= th.max_tail_ms,
            "p99 - p50 after warm-up",
        )
    for name, fit in report["leak"].items():
        for f in fit["per_segment"]:
            contains_zero = f["low"] <= 0 <= f["high"]
            under = f["high"] <= th.leak_floor_bytes_per_h
            check(
                f"leak:{name}" + (f":segment{f['segment']}" if len(fit["per_segment"]) > 1 else ""),
                f["bytes_per_hour"],
                th.leak_floor_bytes_per_h,
                contains_zero or under,
                f"{format_rate(f['bytes_per_hour'])}, 95% CI [{format_rate(f['low'], False)}, "
                f"{format_rate(f['high'])}]"
                + (" contains 0" if contains_zero else (" under the floor" if under else " above the floor")),
            )
    if not report["leak"] and not run.get("memory_sampled", True):
        # nothing to fit at all: the server exports no memory where the run looked (gRPC without
        # --metrics-url, a metrics endpoint without process memory); said, and not held against the run
        where = run.get("metrics_url")
        check(
            "leak",
            None,
            th.leak_floor_bytes_per_h,
            True,
            "skipped: the server's memory was not sampled ("
            + (f"{where} gave none" if where else "gRPC carries no /metrics")
            + "); give --metrics-url http://HOST:PORT/metrics to check it",
            skipped=True,
        )
    elif not report["leak"]:
        check(
            "leak",
            None,
            th.leak_floor_bytes_per_h,
            True,
            f"skipped (too few samples): fewer than {MIN_FIT_SAMPLES} memory samples after warm-up in every "
            "segment; run longer, or lower --sample-interval or --warmup",
            skipped=True,
        )
    frag = report["fragmentation"]
    if frag is not None:
        check(
            "fragmentation",
            frag["final"],
            th.max_fragmentation,
            frag["final"] <= th.max_fragmentation,
            "pool 1 - largest_free/free at the end",
        )
    for c in checks:
        if isinstance(c["value"], float) and not math.isfinite(c["value"]):
            c["value"] = None
    return {"pass": all(c["pass"] for c in checks), "checks": checks}


def outcome(check: dict[str, Any]) -> str:
    """A check's word in the report and on the console: ``skipped`` (no data, not held against the run),
    ``pass`` or ``FAIL``."""
    return "skipped" if check.get("skipped") else "pass" if check["pass"] else "FAIL"
