"""`python -m bench export`: every `ok` run record of a folder as one table, a row per record, for
a notebook (pandas.read_csv, or read_parquet). The columns are the record's identity (run id,
origin, task, model, seed, overrides), where it ran, what it cost, and its numbers: the model's
gap and interval, each reference's loss and gap, accuracy and perplexity where the task has them;
and the version the leaderboard pools it by (its behavioural identity or code version, and
whether today's code reproduces it). Records are those the boards read (suite records; include=all
adds ad-hoc ones); failed runs and unreadable records are left out, as on the boards."""
from __future__ import annotations

import csv
import math
from pathlib import Path

from bench.config import ConfigError
from bench.records.store import environment
from bench.reports.selection import Selection, version_label
from tasks.files import write_atomic

FORMATS = (".csv", ".parquet")
FIXED = ("run_id", "origin", "task", "model", "seed", "overrides", "trainer", "steps", "device",
         "kernel", "precision", "compile", "world_size", "params", "state_size", "sequences",
         "gap_reference", "bayes_gap", "bayes_gap_lo", "bayes_gap_hi", "relative_gap",
         "perplexity", "wall_time_s", "commit", "version", "current", "superseded")


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def row_of(record: dict, superseded: bool) -> dict:
    """One record as a flat row; a number that is not finite (or absent) is left empty."""
    metrics = record.get("metrics", {})
    train = record.get("train", {})
    ci = metrics.get("bayes_gap_ci") or [None, None]
    where = environment(record)
    label = version_label(record)
    row = {"run_id": record.get("run_id"), "origin": record.get("origin"),
           "task": record["task"]["name"], "model": record["model"]["name"],
           "seed": record.get("seed"), "overrides": " ".join(record.get("overrides") or []),
           "trainer": record.get("trainer", {}).get("name"), "steps": train.get("steps"),
           "device": where.device, "kernel": where.kernel, "precision": where.precision,
           "compile": where.compile, "world_size": train.get("world_size"),
           "params": record.get("params"), "state_size": record.get("state_size"),
           "sequences": metrics.get("sequences"), "gap_reference": metrics.get("gap_reference"),
           "bayes_gap": _number(metrics.get("bayes_gap")), "bayes_gap_lo": _number(ci[0]),
           "bayes_gap_hi": _number(ci[1]), "relative_gap": _number(metrics.get("relative_gap")),
           "perplexity": _number((metrics.get("perplexity") or {}).get("model")
                                 if isinstance(metrics.get("perplexity"), dict)
                                 else metrics.get("perplexity")),
           "wall_time_s": _number(record.get("wall_time_s")),
           "commit": (record.get("provenance") or {}).get("commit"), "version": label,
           "current": label.endswith(", current"), "superseded": superseded}
    for kind in ("loss", "gap", "accuracy"):
        values = metrics.get(kind)
        if isinstance(values, dict):
            for name, value in values.items():
                row[f"{kind}.{name}"] = _number(value)
    return row


def table(selection: Selection) -> tuple[list[str], list[dict]]:
    """(columns, rows) of every record the selection pooled, superseded rows' too, by task,
    model and seed."""
    rows = []
    for section in selection.sections:
        for pooled, superseded in ((section.rows, False), (section.superseded, True)):
            for records in pooled.values():
                rows += [row_of(record, superseded) for record in records]
    rows.sort(key=lambda r: (r["task"], r["model"], str(r["overrides"]), r["seed"] or 0,
                             r["run_id"] or ""))
    extra = sorted({key for row in rows for key in row} - set(FIXED))
    return [*FIXED, *extra], rows


def check_format(out: str | Path) -> None:
    """ConfigError unless out names a table this writes (.csv, .parquet)."""
    if Path(out).suffix not in FORMATS:
        raise ConfigError(f"export: out '{out}' must end in {' or '.join(FORMATS)}")


def write_table(selection: Selection, out: Path) -> int:
    """Write the table to out (.csv, or .parquet with pyarrow), replacing it whole; the rows."""
    check_format(out)
    columns, rows = table(selection)
    if not rows:
        raise ConfigError(f"export: no ok record to export in {selection.out_dir}")
    if out.suffix == ".parquet":
        try:
            import pyarrow
            import pyarrow.parquet
        except ImportError:
            raise ConfigError("export: a .parquet table needs pyarrow (pip install pyarrow); "
                              "out=<file>.csv needs nothing") from None
        data = pyarrow.table({c: [row.get(c) for row in rows] for c in columns})
        write_atomic(out, lambda tmp: pyarrow.parquet.write_table(data, tmp))
    else:
        def write(tmp: str) -> None:
            with open(tmp, "w", newline="") as handle:
                writer = csv.DictWriter(handle, fieldnames=columns)
                writer.writeheader()
                writer.writerows(rows)
        write_atomic(out, write)
    return len(rows)
