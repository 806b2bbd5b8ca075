"""Pictures of bench results: a PNG from each JSON file the benches write with ``--json``.

    python bench/plot.py docs/img/*.json   # FILE.json -> FILE.png beside it

What is drawn follows from the file's tables:
- ``served`` (``serve.py limit`` and ``load``: rows of clients, samples_s, p50_ms): throughput and p50
  latency over concurrency, a line per server and transport; the ``raw`` table's limit rows dashed;
- ``memory over time`` (``soak_disk.py``): RSS and USS over the run's time, with the windows' p50/p99
  latency beside them when the file has them.
"""

from __future__ import annotations

import argparse
import json
import textwrap
from pathlib import Path


def served(doc: dict, tables: dict, fig) -> None:
    rows, raw = tables["served"], tables.get("raw", [])
    rate, lat = fig.subplots(1, 2)
    for key in dict.fromkeys((r["who"], r["transport"]) for r in rows):
        line = sorted((r for r in rows if (r["who"], r["transport"]) == key), key=lambda r: r["clients"])
        style = {
            "marker": "o",
            "linestyle": "--" if key[0].startswith("triton") else "-",
            "label": " ".join(key),
        }
        rate.plot([r["clients"] for r in line], [r["samples_s"] for r in line], **style)
        lat.plot([r["clients"] for r in line], [r["p50_ms"] for r in line], **style)
    limits = [r for r in raw if r["row"].startswith("raw limit") and "round 1" not in r["row"]]
    styles = iter((":", "-.", (0, (1, 3))))
    lines = [
        rate.axhline(r["samples_s"], color="grey", linestyle=next(styles, ":"), linewidth=1, label=r["row"])
        for r in limits
    ]
    if lines:
        rate.legend(handles=lines, fontsize=7, loc="lower right")
    for ax, label in ((rate, "samples/s"), (lat, "p50 latency, ms")):
        ax.set_xscale("log", base=2)
        clients = sorted({r["clients"] for r in rows})
        ax.set_xticks(clients, [str(c) for c in clients])
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    lat.legend(fontsize=7)


def memory(doc: dict, tables: dict, fig) -> None:
    rows = tables["memory over time"]
    windows = tables.get("latency over time")
    axes = fig.subplots(1, 2 if windows else 1)
    mem = axes[0] if windows else axes
    for key, label in (("rss_mib", "RSS"), ("uss_mib", "USS")):
        points = [(r["t_s"], r[key]) for r in rows if r.get(key) is not None]
        if points:
            mem.plot(*zip(*points, strict=True), label=label)
    mem.set_xlabel("time, s")
    mem.set_ylabel("MiB")
    mem.legend(fontsize=7)
    mem.grid(alpha=0.3)
    if windows:
        for key in ("p50_ms", "p99_ms"):
            points = [(r["t_s"], r[key]) for r in windows if r.get(key) is not None]
            if points:
                axes[1].plot(*zip(*points, strict=True), label=key.split("_")[0])
        axes[1].set_xlabel("time, s")
        axes[1].set_ylabel("latency, ms")
        axes[1].legend(fontsize=7)
        axes[1].grid(alpha=0.3)


def plot(path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    doc = json.loads(path.read_text())
    tables = {t["title"]: t["rows"] for t in doc["tables"]}
    fig = plt.figure(figsize=(9, 3.4), dpi=90, layout="constrained")
    if "served" in tables:
        served(doc, tables, fig)
    elif "memory over time" in tables:
        memory(doc, tables, fig)
    else:
        raise SystemExit(f"{path}: no table to draw (served, memory over time); found {sorted(tables)}")
    fig.suptitle(textwrap.fill(doc.get("title") or doc["command"], 120), fontsize=8)
    out = path.with_suffix(".png")
    fig.savefig(out, metadata={"Software": None})
    plt.close(fig)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", type=Path, help="JSON results (--json of a bench)")
    for path in ap.parse_args().files:
        out = plot(path)
        print(f"{out} ({out.stat().st_size / 1e3:.0f} kB)")


if __name__ == "__main__":
    main()
