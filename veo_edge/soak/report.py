"""Write a run's report: ``report.json`` (documented in the README), ``report.md`` with the figures, and
the PNG plots (matplotlib, Agg): latency over time with percentile bands, memory over time with the
fitted trend, the latency histogram, throughput and errors, and fragmentation when a pool is in use.

Files are written to temporary names and renamed into place, so a report is either complete or absent.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from veo_edge.soak.analyse import analyse
from veo_edge.soak.config import Thresholds
from veo_edge.soak.plots import write_plots
from veo_edge.soak.store import RunStore
from veo_edge.soak.units import format_duration, format_mib, format_ms, format_rate
from veo_edge.soak.verdict import outcome


def write_report(run_dir: Path, thresholds: Thresholds | None = None) -> dict[str, Any]:
    """Analyse ``run_dir`` and write its report files; returns the report (``report.json``'s content)."""
    run_dir = Path(run_dir)
    store = RunStore.open(run_dir)
    try:
        report = analyse(store, thresholds)
        plots = write_plots(store, report, run_dir)
    finally:
        store.close()
    report["plots"] = plots
    _atomic(run_dir / "report.json", json.dumps(report, indent=2, default=str) + "\n")
    _atomic(run_dir / "report.md", markdown(report))
    return report


def _atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _fmt(v: Any, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 1e4 else f"{v:.{digits}f}"
    return str(v)


def _check_value(name: str, v: Any, threshold: bool = False) -> str:
    """A verdict value in the unit of its check: MiB/h for leaks, ms for jitter and tail, s, counts."""
    if v is None:
        return "-"
    if name.startswith("leak"):
        return f"{format_mib(v)} MiB/h" if threshold else format_rate(v)
    if name in ("jitter", "tail"):
        return f"{format_ms(v)} ms"
    if name == "duration":
        return format_duration(v)
    return _fmt(v)


def _request_lines(req: dict[str, Any]) -> list[str]:
    lines = [
        f"- requests: {req['issued']} issued, {req.get('sent', req['issued'])} sent, {req['ok']} answered, "
        f"{req['errors']} errors, {req['timeouts']} timeouts, {req.get('not_sent', 0)} not sent (client "
        f"backlog), {req['lost']} lost"
        + (f", {req['in_flight_when_killed']} in flight when killed" if req["in_flight_when_killed"] else "")
        + (f"; latency from the {req['latency_from']}" if req.get("latency_from") else "")
    ]
    if req.get("offered_rps"):
        sustained = not req.get("not_sent")
        lines.append(
            f"- rate: offered {req['offered_rps']:g} req/s, sent {req['sent_rps']:.1f}, answered "
            f"{req['answered_rps']:.1f}"
            + (
                ""
                if sustained
                else f" — **the offered rate was not sustained**: {req['not_sent']} arrivals were never sent, "
                "so the latencies describe only the requests that were"
            )
        )
    why = req.get("not_sent_why") or {}
    if why:
        lines.append(f"- not sent, by reason ({sum(why.values())} in all):")
        lines += [f"  - {n}: {reason}" for reason, n in why.items()]
    return lines


def _counts(fallbacks: dict[str, Any], key: str) -> str:
    """``openvino oom 3, onnxruntime ok 3`` from ``{backend: {label: n}}``; ``-`` when none (or not read)."""
    counts = fallbacks.get(key) or {}
    return ", ".join(f"{b} {label} {n}" for b, c in counts.items() for label, n in c.items()) or "-"


def markdown(r: dict[str, Any]) -> str:
    run, req, lat, jit = r["run"], r["requests"], r["latency_ms"], r["jitter"]
    verdict = "PASS" if r["verdict"]["pass"] else "FAIL"
    lines = [
        f"# Soak report: {verdict}",
        "",
        f"- target: `{run['target']}` ({run['kind']}), {run['mode']}, batch {run['batch']}",
        f"- ran {format_duration(run.get('ran_s', run['recorded_s']))} of {format_duration(run['planned_s'])} "
        f"({run['status']}, {len(run['segments'])} segment(s); recorded {format_duration(run['recorded_s'])}, "
        f"the drains included), warm-up {format_duration(run['warmup_s'])} per segment",
        *_request_lines(req),
        *(
            [
                "- server: "
                + (
                    "answered every health probe"
                    if not r["server"]["failed"]
                    else f"**stopped answering at {r['server']['down_at_s']:.1f} s**"
                    + (" and never came back" if r["server"]["down_at_end"] else "")
                )
            ]
            if r.get("server")
            else []
        ),
        f"- fallbacks: {r['fallbacks']['switches']} switches, {r['fallbacks']['recoveries']} recoveries; "
        f"backends: {', '.join(r['fallbacks']['backends']) or '-'}; faults: {_counts(r['fallbacks'], 'faults')}; "
        f"retries: {_counts(r['fallbacks'], 'retries')}"
        if r["fallbacks"]["switches"] is not None
        else "- fallbacks: not measured: no counter of the server was read (gRPC carries no /metrics: give "
        "--metrics-url)",
        *(
            [
                f"- chaos: {r['chaos']['total']} faults injected"
                + (
                    " (" + ", ".join(f"{rule}: {n}" for rule, n in r["chaos"]["injected"].items()) + ")"
                    if r["chaos"]["injected"]
                    else ""
                )
            ]
            if r.get("chaos")
            else []
        ),
        f"- disk: {format_mib(r['disk']['db_bytes'])} MiB, {format_rate(r['disk']['bytes_per_hour'])}"
        + (f" ({r['disk']['basis']})" if r["disk"].get("basis") else ""),
        "",
        "## Verdict",
        "",
        "| check | value | threshold | result | detail |",
        "| --- | --- | --- | --- | --- |",
    ]
    for c in r["verdict"]["checks"]:
        lines.append(
            f"| {c['name']} | {_check_value(c['name'], c['value'])} | {_check_value(c['name'], c['threshold'], True)} "
            f"| {outcome(c).replace('FAIL', '**FAIL**')} | {c['detail']} |"
        )
    lines += [
        "",
        "## Latency (ms)",
        "",
        "| | count | p50 | p90 | p99 | p99.9 | max |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, p in (("whole run", lat["overall"]), ("after warm-up", lat["after_warmup"])):
        if p:
            lines.append(
                f"| {name} | {p['count']} | "
                + " | ".join(format_ms(p[k]) for k in ("p50", "p90", "p99", "p999", "max"))
                + " |"
            )
    lines += [
        "",
        (
            f"Jitter: ±{format_ms(jit['jitter_ms'])} ms (half-range of per-window p50 after warm-up, "
            f"{jit['windows']} windows: {format_ms(jit['p50_min_ms'])}..{format_ms(jit['p50_max_ms'])} ms)"
            if jit["jitter_ms"] is not None
            else f"Jitter: skipped (too few windows: {jit['windows']} after warm-up)"
        )
        + f"; tail p99 − p50: {format_ms(jit['tail_ms'])} ms.",
        "",
        "![latency](latency.png)",
        "",
        "![histogram](histogram.png)",
        "",
        "## Memory",
        "",
        "| series | slope (MiB/h) | 95 % CI (MiB/h) | samples | segment |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, fit in r["leak"].items():
        for f in fit["per_segment"]:
            lines.append(
                f"| {name} | {format_rate(f['bytes_per_hour'], False)} | [{format_rate(f['low'], False)}, "
                f"{format_rate(f['high'], False)}] | {f['samples']} | {f['segment']} |"
            )
    lines += ["", "![memory](memory.png)", "", "## Throughput", ""]
    tp = r["throughput"]
    lines += [
        f"Mean {_fmt(tp['mean_rps'])} answered/s (window min {_fmt(tp['min_window_rps'])}, max {_fmt(tp['max_window_rps'])}).",
        "",
        "![throughput](throughput.png)",
        "",
    ]
    if r["fragmentation"]:
        f = r["fragmentation"]
        lines += [
            "## Memory pool fragmentation",
            "",
            f"Final {_fmt(f['final'])} (max {_fmt(f['max'])}), free-block entropy {_fmt(f['entropy_bits_final'])} bits.",
            "",
            "![fragmentation](fragmentation.png)",
            "",
        ]
    if req["first_errors"]:
        lines += ["## First errors", ""] + [f"- {e}" for e in req["first_errors"]] + [""]
    if r["events"]:
        lines += (
            ["## Events", ""]
            + [f"- {e['t']:.1f} s {e['kind']}: {e['detail']}" for e in r["events"][:50]]
            + [""]
        )
    return "\n".join(lines)
