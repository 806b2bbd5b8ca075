"""The run directory's database: everything a soak records, committed as it comes (SQLite, WAL).

``RUN_DIR/soak.db`` holds the run's configuration (``meta``), one row per process that worked on the run
(``segments``: the first run and each ``--resume``), one row per latency window (counts, percentiles and
the window's HdrHistogram, encoded), one row per resource sample, and events (errors, fallbacks, chaos,
interruptions). The soak commits at every sample tick, the open window's counts as they stand included,
so a SIGKILL loses at most the last tick; WAL mode
keeps every committed row readable while the run writes. Memory in the soak process stays bounded: the
only growing state is on disk.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

from veo_edge.errors import RunDirError

FORMAT = "veo-edge-soak"
FORMAT_VERSION = 1
DB_NAME = "soak.db"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS segments (
    id INTEGER PRIMARY KEY, pid INTEGER, started_wall REAL NOT NULL, offset_s REAL NOT NULL,
    ended_wall REAL, end_reason TEXT, in_flight_at_end INTEGER, issued_until REAL);
CREATE TABLE IF NOT EXISTS windows (
    segment INTEGER NOT NULL, t0 REAL NOT NULL, t1 REAL NOT NULL,
    issued INTEGER NOT NULL, ok INTEGER NOT NULL, errors INTEGER NOT NULL, timeouts INTEGER NOT NULL,
    samples INTEGER NOT NULL, p50_us REAL, p90_us REAL, p99_us REAL, p999_us REAL, max_us REAL,
    min_us REAL, mean_us REAL, hist TEXT, not_sent INTEGER, kinds TEXT, not_sent_why TEXT);
CREATE TABLE IF NOT EXISTS samples (
    segment INTEGER NOT NULL, t REAL NOT NULL, wall REAL NOT NULL,
    rss INTEGER, uss INTEGER, fds INTEGER, threads INTEGER, gpu_used INTEGER,
    pool_in_use INTEGER, pool_free INTEGER, pool_largest INTEGER, pool_fragmentation REAL,
    pool_entropy REAL, fallbacks INTEGER, batches INTEGER, active_backend TEXT, extra TEXT);
CREATE TABLE IF NOT EXISTS events (
    segment INTEGER NOT NULL, t REAL NOT NULL, kind TEXT NOT NULL, detail TEXT);
"""
WINDOW_COLUMNS = [
    "segment",
    "t0",
    "t1",
    "issued",
    "ok",
    "errors",
    "timeouts",
    "samples",
    "p50_us",
    "p90_us",
    "p99_us",
    "p999_us",
    "max_us",
    "min_us",
    "mean_us",
    "hist",
    "not_sent",
    "kinds",
    "not_sent_why",
]
#: columns added since format 1 was first written (added on open; absent reads as NULL)
_ADDED_COLUMNS = {
    "windows": {"not_sent": "INTEGER", "kinds": "TEXT", "not_sent_why": "TEXT"},
    "segments": {"issued_until": "REAL"},
}
SAMPLE_COLUMNS = [
    "segment",
    "t",
    "wall",
    "rss",
    "uss",
    "fds",
    "threads",
    "gpu_used",
    "pool_in_use",
    "pool_free",
    "pool_largest",
    "pool_fragmentation",
    "pool_entropy",
    "fallbacks",
    "batches",
    "active_backend",
    "extra",
]


class RunStore:
    """One run directory's database. ``create`` a new run or ``open`` an existing one."""

    def __init__(self, path: Path, conn: sqlite3.Connection) -> None:
        self.path = path
        self.conn = conn
        self.segment: int | None = None
        self._open_window: int | None = None  # rowid of the window ``put_window`` keeps rewriting

    # -- opening ----------------------------------------------------------------------------------
    @staticmethod
    def check_new(run_dir: Path) -> None:
        """Raise :class:`RunDirError` unless ``run_dir`` can hold a new run (absent or empty)."""
        run_dir = Path(run_dir)
        if run_dir.exists() and not run_dir.is_dir():
            raise RunDirError(f"--out {run_dir} is a file; expected a new or empty directory for the run")
        if run_dir.is_dir() and any(run_dir.iterdir()):
            hint = (
                f"`veo-edge soak --resume {run_dir}` continues it"
                if (run_dir / DB_NAME).is_file()
                else "choose a new directory"
            )
            raise RunDirError(f"--out {run_dir} is not empty; a soak writes into a new directory ({hint})")

    @classmethod
    def create(cls, run_dir: Path, config: dict[str, Any]) -> RunStore:
        run_dir = Path(run_dir)
        cls.check_new(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        store = cls(run_dir, _connect(run_dir / DB_NAME))
        with store.conn:
            store.conn.executescript(_SCHEMA)
            store._set_meta(
                format=FORMAT,
                format_version=FORMAT_VERSION,
                config=config,
                created=time.time(),
                status="running",
            )
        return store

    @classmethod
    def open(cls, run_dir: Path) -> RunStore:
        run_dir = Path(run_dir)
        db = run_dir / DB_NAME
        if not run_dir.is_dir():
            raise RunDirError(
                f"run directory {run_dir} does not exist; give the --out of a `veo-edge soak` run"
            )
        if not db.is_file():
            raise RunDirError(
                f"{run_dir} is not a soak run directory (no {DB_NAME}); give the --out of a `veo-edge soak` run"
            )
        try:
            conn = _connect(db)
            rows = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        except sqlite3.DatabaseError as e:
            raise RunDirError(
                f"{db} is corrupt or not a veo-edge soak database ({e}); the run cannot be read, start a new one"
            ) from e
        meta = {k: json.loads(v) for k, v in rows.items()}
        if meta.get("format") != FORMAT:
            conn.close()
            raise RunDirError(
                f"{db} is an SQLite database of something else (format {meta.get('format')!r}, expected "
                f"{FORMAT!r}); give the --out of a `veo-edge soak` run"
            )
        if meta.get("format_version") != FORMAT_VERSION:
            conn.close()
            raise RunDirError(
                f"{db} has soak format {meta.get('format_version')!r}, this veo-edge reads {FORMAT_VERSION}; "
                "report it with the veo-edge that recorded it"
            )
        with conn:
            for table, added in _ADDED_COLUMNS.items():
                have = {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}
                for name, kind in added.items():
                    if name not in have:
                        conn.execute(f"ALTER TABLE {table} ADD COLUMN {name} {kind}")
        return cls(run_dir, conn)

    # -- meta -------------------------------------------------------------------------------------
    def _set_meta(self, **values: Any) -> None:
        self.conn.executemany(
            "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
            [(k, json.dumps(v)) for k, v in values.items()],
        )

    def meta(self) -> dict[str, Any]:
        return {k: json.loads(v) for k, v in self.conn.execute("SELECT key, value FROM meta")}

    @property
    def config(self) -> dict[str, Any]:
        return self.meta()["config"]

    def set_status(self, status: str) -> None:
        with self.conn:
            self._set_meta(status=status)

    # -- writing ----------------------------------------------------------------------------------
    def begin_segment(self, pid: int) -> tuple[int, float]:
        """A new segment starting where the committed data ends; returns (segment id, offset in s)."""
        offset = self.recorded_until()
        with self.conn:
            cur = self.conn.execute(
                "INSERT INTO segments (pid, started_wall, offset_s) VALUES (?, ?, ?)",
                (pid, time.time(), offset),
            )
            self._set_meta(status="running")
        self.segment = int(cur.lastrowid)
        return self.segment, offset

    def stopped_issuing(self, t: float) -> None:
        """The current segment stopped issuing at run time ``t`` (its planned end or an interruption):
        its run time ends there, the drain after it not counted (committed at once, so a segment killed
        while it drains keeps it)."""
        with self.conn:
            self.conn.execute("UPDATE segments SET issued_until = ? WHERE id = ?", (t, self.segment))

    def end_segment(self, reason: str, in_flight: int) -> None:
        with self.conn:
            self.conn.execute(
                "UPDATE segments SET ended_wall = ?, end_reason = ?, in_flight_at_end = ? WHERE id = ?",
                (time.time(), reason, in_flight, self.segment),
            )
        self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the run's data all in soak.db again

    def add_window(self, row: dict[str, Any]) -> None:
        self._insert("windows", WINDOW_COLUMNS, self._window_row(row))

    def put_window(self, row: dict[str, Any], final: bool) -> None:
        """The open window as it stands: inserted at its first tick and rewritten at the next ones, so a
        SIGKILL keeps its counts up to the last commit; ``final`` closes it (the next put starts a row)."""
        row = self._window_row(row)
        if self._open_window is None:
            self._open_window = self._insert("windows", WINDOW_COLUMNS, row)
        else:
            sets = ", ".join(f"{c} = ?" for c in WINDOW_COLUMNS)
            values = [row.get(c) for c in WINDOW_COLUMNS]
            self.conn.execute(f"UPDATE windows SET {sets} WHERE rowid = ?", [*values, self._open_window])
        if final:
            self._open_window = None

    def _window_row(self, row: dict[str, Any]) -> dict[str, Any]:
        row = {**row, "segment": self.segment}
        for key in ("kinds", "not_sent_why"):  # errors by kind (``load.error_label``), not sent by reason
            if isinstance(row.get(key), dict):
                row[key] = json.dumps(row[key], separators=(",", ":"))
        return row

    def add_sample(self, row: dict[str, Any]) -> None:
        row = {**row, "segment": self.segment}
        if isinstance(row.get("extra"), dict):
            row["extra"] = json.dumps(row["extra"], separators=(",", ":"))
        self._insert("samples", SAMPLE_COLUMNS, row)

    def add_event(self, t: float, kind: str, detail: str) -> None:
        self.conn.execute(
            "INSERT INTO events (segment, t, kind, detail) VALUES (?, ?, ?, ?)",
            (self.segment, t, kind, detail),
        )

    def commit(self) -> None:
        self.conn.commit()

    def _insert(self, table: str, columns: list[str], row: dict[str, Any]) -> int:
        cur = self.conn.execute(
            f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
            [row.get(c) for c in columns],
        )
        return int(cur.lastrowid)

    # -- reading ----------------------------------------------------------------------------------
    def recorded_until(self) -> float:
        """Run time (s) up to which data is committed: the end of the last window or sample."""
        w = self.conn.execute("SELECT MAX(t1) FROM windows").fetchone()[0] or 0.0
        s = self.conn.execute("SELECT MAX(t) FROM samples").fetchone()[0] or 0.0
        return float(max(w, s))

    def ran_s(self) -> float:
        """Run time (s) spent issuing, summed over the segments: what counts toward ``--duration``. A
        segment's ends where it stopped issuing (its drain is recorded but not counted); one killed
        before that ends where its windows end, which is where its counts do (its last commit; a run
        recorded by an older veo-edge committed windows only as they closed, so its later samples are
        not run time: a resume issues their arrivals again rather than all at once)."""
        ran = 0.0
        for seg_id, offset, until in self.conn.execute("SELECT id, offset_s, issued_until FROM segments"):
            if until is None:
                w = self.conn.execute("SELECT MAX(t1) FROM windows WHERE segment = ?", (seg_id,)).fetchone()[
                    0
                ]
                until = offset if w is None else w
            ran += max(until - offset, 0.0)
        return ran

    def issued(self) -> int:
        """Arrivals issued so far, as committed (a resumed open loop continues its arrivals after them)."""
        return int(self.conn.execute("SELECT COALESCE(SUM(issued), 0) FROM windows").fetchone()[0])

    def rows(self, table: str) -> Iterator[dict[str, Any]]:
        if table not in ("windows", "samples", "events", "segments"):
            raise ValueError(table)
        order = {"windows": "t0", "samples": "t", "events": "t", "segments": "id"}[table]
        cur = self.conn.execute(f"SELECT * FROM {table} ORDER BY {order}")
        names = [d[0] for d in cur.description]
        for values in cur:
            yield dict(zip(names, values, strict=True))

    def count(self, table: str) -> int:
        if table not in ("windows", "samples", "events", "segments"):
            raise ValueError(table)
        return int(self.conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])

    def rows_strided(self, table: str, limit: int) -> Iterator[dict[str, Any]]:
        """Every k-th row, so that at most about ``limit`` come back (for plots of long runs)."""
        stride = max(1, -(-self.count(table) // limit))
        for i, row in enumerate(self.rows(table)):
            if i % stride == 0:
                yield row

    def page_size(self) -> int:
        return int(self.conn.execute("PRAGMA page_size").fetchone()[0])

    def logical_bytes(self) -> int:
        """The database's size as this connection sees it (pages written, in the WAL or not): it grows
        with the data, not with checkpoints."""
        return int(self.conn.execute("PRAGMA page_count").fetchone()[0]) * self.page_size()

    def size_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.path.glob(f"{DB_NAME}*") if p.is_file())

    def close(self) -> None:
        self.conn.close()


def _connect(db: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(db, check_same_thread=False, isolation_level="DEFERRED")
    with closing(conn.cursor()) as cur:
        cur.execute("PRAGMA journal_mode = WAL")
        cur.execute("PRAGMA synchronous = NORMAL")  # WAL + NORMAL: a killed process loses no commit
        cur.execute("PRAGMA cache_size = -512")  # 512 KiB: the soak's own memory stays small and flat
    return conn
