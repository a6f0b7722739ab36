"""What a run record must hold before anything reads it: one check, applied where records are
read (bench.records.store.read_record), so leaderboard, claims, compare, plot, the suite runner's
"done already" and gpucheck all refuse the same records, each with a line naming the file and
the field. A record that cannot be right — a number that is not finite, an interval reversed or
far from its own value, a provenance that is not a mapping — is never pooled and never wins a
tie against a real record of the same seed.

Every record: its identity (run id, task, model, trainer, seed, status) and provenance. An `ok`
record also: what the readers show and compare (FIELDS, and SCORED_FIELDS by how the task is
scored), its intervals, per-position and per-sequence values and its loss curve.
"""
from __future__ import annotations

import math
import operator
from functools import partial
from numbers import Real

STATUSES = ("ok", "failed", "running")  # bench/training/train.py writes these

IDENTITY = {("run_id",): str, ("task", "name"): str, ("task", "config"): dict,
            ("model", "name"): str, ("model", "config"): dict, ("trainer", "config"): dict,
            ("seed",): int, ("status",): str}
# What readers use from an `ok` record
FIELDS = {("params",): int, ("state_size",): int, ("train", "steps"): int,
          ("train", "wall_time_s"): Real, ("metrics", "sequences"): int,
          ("metrics", "loss"): dict, ("metrics", "roles"): dict}
# ... and by the task's scoring: the Bayes gap, or perplexity (text, no Bayes predictor)
SCORED_FIELDS = {
    "gap": {("metrics", "gap_reference"): str, ("metrics", "gap_reference_role"): str,
            ("metrics", "bayes_gap"): Real, ("metrics", "bayes_gap_ci"): list,
            ("metrics", "relative_gap"): Real, ("metrics", "gap"): dict,
            ("metrics", "gap_ci"): dict, ("per_position", "gap.model"): list},
    "perplexity": {("metrics", "perplexity"): dict, ("metrics", "perplexity_ci"): dict,
                   ("metrics", "bits_per_byte"): dict, ("per_position", "loss.model"): list}}
COUNTS = {("seed",), ("params",), ("state_size",), ("train", "steps")}  # >= 0
# A time no run takes (a year): 1e308 s is finite, passes a type check and would print 309 digits
MAX_TIME_S = 366 * 86400
TIMES = {("wall_time_s",): Real, ("eval_time_s",): Real}  # checked where present
PROVENANCE = {"commit": str, "code": str, "dirty": bool, "version": str, "torch": str}


def number_or_null(value) -> bool:
    """A number as records hold them: finite, or null where it was not (strict JSON)."""
    return value is None or (isinstance(value, Real) and not isinstance(value, bool)
                             and math.isfinite(value))


_NOT_NONE = partial(operator.is_not, None)


def numbers_or_nulls(values: list) -> bool:
    """number_or_null of every value. A record's lists are floats as JSON parses them, some with
    nulls: those are checked in C (all(map(...))), 7 million values of results/ in 1 s rather than
    11; any other list value by value."""
    kinds = set(map(type, values))
    if kinds <= {float, type(None)}:
        return all(map(math.isfinite, filter(_NOT_NONE, values) if type(None) in kinds
                       else values))
    return all(number_or_null(v) for v in values)


def problem(record: dict) -> str | None:
    """Why record cannot be used (the field and what is wrong with it), or None."""
    why = _typed(record, IDENTITY)
    if why:
        return why
    if record["status"] not in STATUSES:
        return f"status {record['status']!r} is not one of {', '.join(STATUSES)}"
    if not record["run_id"]:
        return "run_id is empty"
    for key in ("name", "origin", "reason"):
        if record.get(key) is not None and not isinstance(record[key], str):
            return f"{key} is not a string"
    overrides = record.get("overrides", [])
    if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
        return "overrides is not a list of strings"
    why = _provenance(record.get("provenance"))
    if why or record["status"] != "ok":
        return why
    return _scored(record)


def _lookup(record: dict, keys: tuple):
    value = record
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _typed(record: dict, fields: dict) -> str | None:
    bad = []
    for keys, kind in fields.items():
        value, name = _lookup(record, keys), ".".join(keys)
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            bad.append(name if value is None else f"{name} (a {type(value).__name__})")
        elif kind is Real and not math.isfinite(value):
            bad.append(f"{name} (not a finite number)")
        elif kind is Real and keys[-1].endswith("time_s") and value < 0:
            bad.append(f"{name} (negative)")
        elif kind is Real and keys[-1].endswith("time_s") and value > MAX_TIME_S:
            bad.append(f"{name} (over a year)")
        elif kind is int and keys in COUNTS and value < 0:
            bad.append(f"{name} (negative)")
        elif kind is list and not numbers_or_nulls(value):
            bad.append(f"{name} (not a list of numbers)")
    return f"missing or malformed {', '.join(bad)}" if bad else None


def _provenance(provenance) -> str | None:
    if provenance is None:
        return None  # records before provenance existed: their code version is unknown
    if not isinstance(provenance, dict):
        return f"provenance is a {type(provenance).__name__}, not a mapping"
    for key, kind in PROVENANCE.items():
        value = provenance.get(key)
        if value is not None and not isinstance(value, kind):
            return f"provenance.{key} is a {type(value).__name__}, not a {kind.__name__}"
    return None


def _interval(name: str, value, interval) -> str | None:
    """An interval is a pair (lo <= hi) that holds its value or lies near it. A percentile
    bootstrap interval need not hold the point estimate exactly, so a value is refused only
    when it lies more than the interval's width outside it: 1e308 against [0.0009, 0.0014]."""
    if not (isinstance(interval, list) and len(interval) == 2
            and all(number_or_null(v) for v in interval)):
        return f"{name} is not a pair of numbers"
    lo, hi = interval
    if lo is None or hi is None or value is None:
        return None  # undefined (no sequence scored in a band): shown as such
    if lo > hi:
        return f"{name} is reversed ({lo:g} > {hi:g})"
    slack = (hi - lo) + 1e-9 * max(abs(lo), abs(hi), 1e-12)
    if not lo - slack <= value <= hi + slack:
        return f"{name} [{lo:g}, {hi:g}] is far from its value {value:g}"
    return None


def _scored(record: dict) -> str | None:
    metrics = record.get("metrics")
    scoring = metrics.get("scoring", "gap") if isinstance(metrics, dict) else "gap"
    if scoring not in SCORED_FIELDS:
        return f"unknown metrics.scoring {scoring!r}"
    present = {keys: kind for keys, kind in TIMES.items() if _lookup(record, keys) is not None}
    why = _typed(record, {**FIELDS, **SCORED_FIELDS[scoring], **present})
    if why:
        return why
    m = record["metrics"]
    if m["sequences"] < 1:
        return "metrics.sequences is below 1"
    tables = ("loss", "gap") if scoring == "gap" else ("loss", "perplexity", "bits_per_byte")
    odd = [f"metrics.{table}.{name}" for table in tables for name, value in m[table].items()
           if not number_or_null(value)]
    if odd:
        return f"not a finite number: {', '.join(odd)}"
    if scoring == "perplexity":
        lacking = [name for name in ["model", *m["roles"]]
                   if not all(name in m[key] for key in ("loss", "perplexity", "perplexity_ci"))]
        checked = [("perplexity", "perplexity_ci")]
    else:
        lacking = [name for name in [m["gap_reference"], *m["roles"]]
                   if not all(name in m[key] for key in ("loss", "gap", "gap_ci"))]
        checked = [("gap", "gap_ci")]
        why = _interval("metrics.bayes_gap_ci", m["bayes_gap"], m["bayes_gap_ci"])
        if why:
            return why
    if lacking:
        return f"metrics lack the loss, gap or interval of {', '.join(sorted(set(lacking)))}"
    if isinstance(m.get("loss_ci"), dict):
        checked.append(("loss", "loss_ci"))
    elif "loss_ci" in m:
        return "metrics.loss_ci is not a mapping"
    for table, intervals in checked:
        if not isinstance(m[intervals], dict):
            return f"metrics.{intervals} is not a mapping"
        for name, interval in m[intervals].items():
            why = _interval(f"metrics.{intervals}.{name}", m[table].get(name), interval)
            if why:
                return why
    return _per_position(record) or _per_sequence(record) or _curves(record)


def _per_position(record: dict) -> str | None:
    """The per-position curves and, where a record has them (since 2026-11-30), their standard
    errors: one list of numbers per curve."""
    for key in ("per_position", "per_position_stderr"):
        table = record.get(key, {})
        if not isinstance(table, dict):
            return f"{key} is not a mapping"
        for name, values in table.items():
            if not isinstance(values, list) or not numbers_or_nulls(values):
                return f"{key}.{name} is not a list of numbers"
    return None


def _per_sequence(record: dict) -> str | None:
    """Per-sequence losses (what paired comparisons resample): one number per held-out
    sequence for every predictor they list; for text (perplexity scoring), each window's loss
    sum and scored tokens."""
    table = record.get("per_sequence")
    if table is None:
        return None  # records before paired comparisons existed
    if not isinstance(table, dict) or not isinstance(table.get("loss", {}), dict):
        return "per_sequence is not a mapping of per-sequence losses"
    n = record["metrics"]["sequences"]
    if not isinstance(table.get("loss_sum", {}), dict):
        return "per_sequence.loss_sum is not a mapping"
    tokens = table.get("tokens")
    if tokens is not None and not (isinstance(tokens, list) and len(tokens) == n
                                   and numbers_or_nulls(tokens)):
        return f"per_sequence.tokens is not {n} numbers (metrics.sequences)"
    for name, values in table.get("loss_sum", {}).items():
        if not (isinstance(values, list) and len(values) == n and numbers_or_nulls(values)):
            return f"per_sequence.loss_sum.{name} is not {n} numbers (metrics.sequences)"
    for name, values in table.get("loss", {}).items():
        if not (isinstance(values, list) and len(values) == n
                and numbers_or_nulls(values)):
            return (f"per_sequence.loss.{name} is not {n} numbers (metrics.sequences)")
    digest = record["metrics"].get("held_out_digest")
    if digest is not None and not isinstance(digest, str):
        return "metrics.held_out_digest is not a string"
    return _task_sequences(table.get("task", {}), n, "per_sequence.task")


def _task_sequences(tree, n: int, where: str) -> str | None:
    """per_sequence.task (tasks' summarize_sequences): mappings whose leaves are lists of n
    numbers, or plain numbers and nulls."""
    if not isinstance(tree, dict):
        return f"{where} is not a mapping"
    for key, value in tree.items():
        if isinstance(value, dict):
            why = _task_sequences(value, n, f"{where}.{key}")
            if why:
                return why
        elif isinstance(value, list):
            if len(value) != n or not numbers_or_nulls(value):
                return f"{where}.{key} is not {n} numbers (metrics.sequences)"
        elif not number_or_null(value):
            return f"{where}.{key} is neither numbers nor a mapping"
    return None


def _curves(record: dict) -> str | None:
    for key in ("loss_curve", "val_curve"):
        curve = record["train"].get(key)
        if curve is None:
            continue
        if not isinstance(curve, list) or not all(
                isinstance(p, list) and len(p) == 2 and isinstance(p[0], int)
                and not isinstance(p[0], bool) and number_or_null(p[1]) for p in curve):
            return f"train.{key} is not a list of [step, value] pairs"
    return None
