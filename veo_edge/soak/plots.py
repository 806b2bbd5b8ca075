"""The soak report's figures (matplotlib, Agg), each written to a temporary name and renamed into place:
latency over time with percentile bands, memory over time with the fitted trends, the latency histogram,
throughput and errors, and fragmentation when a pool is in use."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from veo_edge.soak.load import decode_histogram
from veo_edge.soak.store import RunStore

#: points per plotted memory series (every k-th sample of longer runs)
MAX_PLOT_SAMPLES = 5000
PLOTS = ("latency.png", "memory.png", "histogram.png", "throughput.png", "fragmentation.png")


def _hours(seconds: float) -> tuple[float, str]:
    if seconds >= 3 * 3600:
        return 3600.0, "h"
    if seconds >= 180:
        return 60.0, "min"
    return 1.0, "s"


def write_plots(store: RunStore, report: dict[str, Any], run_dir: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    scale, unit = _hours(max(report["run"]["recorded_s"], 1.0))
    windows = report["windows"]

    def save(fig, name: str) -> None:
        tmp = run_dir / f".{name}.tmp.png"
        fig.savefig(tmp, dpi=100, bbox_inches="tight")
        plt.close(fig)
        os.replace(tmp, run_dir / name)
        written.append(name)

    def boundaries(ax) -> None:
        for seg in report["run"]["segments"][1:]:
            ax.axvline(seg["offset_s"] / scale, color="grey", ls=":", lw=1)
        for seg in report["run"]["segments"]:
            ax.axvspan(
                seg["offset_s"] / scale, (seg["offset_s"] + report["run"]["warmup_s"]) / scale, color="0.92"
            )

    # latency over time with percentile bands
    fig, ax = plt.subplots(figsize=(9, 4))
    lw = [w for w in windows if w["p50"] is not None]
    x = [(w["t0"] + w["t1"]) / 2 / scale for w in lw]
    if lw:
        ax.fill_between(x, [w["p50"] for w in lw], [w["p99"] for w in lw], alpha=0.25, label="p50..p99")
        ax.fill_between(x, [w["p99"] for w in lw], [w["p999"] for w in lw], alpha=0.12, label="p99..p99.9")
        ax.plot(x, [w["p50"] for w in lw], lw=1.2, label="p50")
        ax.plot(x, [w["p99"] for w in lw], lw=0.8, label="p99")
        ax.plot(x, [w["max"] for w in lw], lw=0.5, ls="--", label="max")
    boundaries(ax)
    ax.set(xlabel=f"run time ({unit})", ylabel="latency (ms)", title="Latency per window")
    if lw:
        ax.legend(loc="upper right", fontsize=8)
    save(fig, "latency.png")

    # memory over time with the fitted trends
    samples = list(store.rows_strided("samples", MAX_PLOT_SAMPLES))
    fig, ax = plt.subplots(figsize=(9, 4))
    mib = 1 << 20
    for key, label in (
        ("rss", "RSS"),
        ("uss", "USS"),
        ("gpu_used", "GPU used"),
        ("pool_in_use", "pool in use"),
    ):
        pts = [(s["t"], s[key]) for s in samples if s[key] is not None]
        if not pts:
            continue
        (line,) = ax.plot([t / scale for t, _ in pts], [v / mib for _, v in pts], lw=1, label=label)
        fit = report["leak"].get(key)
        for f in fit["per_segment"] if fit else []:
            seg = next(s for s in report["run"]["segments"] if s["id"] == f["segment"])
            seg_pts = [t for t, _ in pts if t >= seg["offset_s"] + report["run"]["warmup_s"]]
            seg_pts = [t for t in seg_pts if _segment_of(report, t) == f["segment"]]
            if seg_pts:
                xs = [min(seg_pts), max(seg_pts)]
                ys = [(f["intercept"] + f["bytes_per_hour"] * t / 3600) / mib for t in xs]
                ax.plot(
                    [t / scale for t in xs],
                    ys,
                    ls="--",
                    color=line.get_color(),
                    lw=1.5,
                    label=f"{label} fit {f['bytes_per_hour'] / mib:+.2f} MiB/h",
                )
    boundaries(ax)
    ax.set(xlabel=f"run time ({unit})", ylabel="MiB", title="Memory of the process under test")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best", fontsize=8)
    save(fig, "memory.png")

    # latency histogram (all windows merged)
    from veo_edge.soak.load import new_histogram

    merged = new_histogram()
    for w in store.rows("windows"):
        if w["hist"]:
            merged.add(decode_histogram(w["hist"]))
    fig, ax = plt.subplots(figsize=(9, 4))
    ylabel = "answers per bin"
    if merged.get_total_count():
        edges, counts, log = _histogram_bins(merged)
        ax.stairs(counts, edges, fill=True, alpha=0.8)
        if log:
            ax.set_xscale("log")
            ylabel = "answers per bin (log-spaced bins)"
        lat = report["latency_ms"]["overall"]
        for p in ("p50", "p99", "p999"):
            ax.axvline(lat[p], ls="--", lw=0.8, color="k")
            ax.text(lat[p], ax.get_ylim()[1] * 0.9, p, fontsize=8)
    ax.set(xlabel="latency (ms)", ylabel=ylabel, title="Latency histogram (whole run, answered requests)")
    save(fig, "histogram.png")

    # throughput and errors
    fig, ax = plt.subplots(figsize=(9, 3.5))
    ax.plot(
        [(w["t0"] + w["t1"]) / 2 / scale for w in windows],
        [w["rps"] for w in windows],
        lw=1,
        label="answered/s",
    )
    errs = [(w["t1"] / scale, w["errors"]) for w in windows if w["errors"]]
    if errs:
        ax2 = ax.twinx()
        ax2.bar(
            [e[0] for e in errs],
            [e[1] for e in errs],
            color="tab:red",
            width=0.5 * report["run"]["window_s"] / scale,
        )
        ax2.set_ylabel("errors per window", color="tab:red")
    boundaries(ax)
    ax.set(xlabel=f"run time ({unit})", ylabel="requests/s", title="Throughput")
    save(fig, "throughput.png")

    # fragmentation over time
    frag = [
        (s["t"], s["pool_fragmentation"], s["pool_entropy"], s["pool_largest"], s["pool_free"])
        for s in samples
        if s["pool_fragmentation"] is not None
    ]
    if frag:
        fig, (a1, a2) = plt.subplots(2, 1, figsize=(9, 5), sharex=True)
        xs = [f[0] / scale for f in frag]
        handles = a1.plot(xs, [f[1] for f in frag], label="1 - largest/free")
        if any(f[2] is not None for f in frag):
            a1b = a1.twinx()
            handles += a1b.plot(
                xs,
                [f[2] if f[2] is not None else float("nan") for f in frag],
                color="tab:orange",
                label="entropy (bits)",
            )
            a1b.set_ylabel("entropy (bits)")
        a1.set(ylabel="fragmentation", title="Memory pool fragmentation")
        a1.legend(handles=handles, fontsize=8, loc="upper left")
        a2.plot(xs, [(f[4] or 0) / mib for f in frag], label="free")
        a2.plot(xs, [(f[3] or 0) / mib for f in frag], label="largest free block")
        a2.set(xlabel=f"run time ({unit})", ylabel="MiB")
        a2.legend(fontsize=8)
        save(fig, "fragmentation.png")
    return written


def _histogram_bins(h, bins: int = 60) -> tuple[Any, Any, bool]:
    """The HdrHistogram's counts re-binned into ``bins`` equal-width bins (log-spaced when the latencies
    span more than a factor of 20), so the bar heights show the shape instead of the HDR bucket widths;
    returns (edges in ms, counts, log-spaced)."""
    import numpy as np

    vals, counts = [], []
    for item in h.get_recorded_iterator():
        vals.append(item.value_iterated_to / 1e3)
        counts.append(item.count_at_value_iterated_to)
    lo, hi = min(vals), max(vals)
    log = lo > 0 and hi / lo > 20
    if hi <= lo:
        edges = np.array([lo * 0.99, hi * 1.01 + 1e-3])
    elif log:
        edges = np.geomspace(lo, hi * 1.0001, bins + 1)
    else:
        edges = np.linspace(lo, hi * 1.0001, bins + 1)
    hist, edges = np.histogram(vals, bins=edges, weights=counts)
    return edges, hist, log


def _segment_of(report: dict[str, Any], t: float) -> int:
    seg_id = report["run"]["segments"][0]["id"]
    for seg in report["run"]["segments"]:
        if t >= seg["offset_s"]:
            seg_id = seg["id"]
    return seg_id
