"""What runs cost here, read off the records of runs already made: the price of a suite's entries
before they run (`python -m bench suite name=... plan=true`) and of the runs an open claim needs
(`python -m bench claims plan`). A price is a record's `wall_time_s`, the whole run as it ran
(its threads, its machine's load), less the references it computed (a held-out set's first run
computes them for the others: `references_price` prices them apart): an estimate, said as one,
never a measurement of the run to come."""
from __future__ import annotations

import heapq
import math
import statistics
from dataclasses import dataclass

from bench.config.formats import plural
from bench.records.store import config_matches, environment, record_matches
from bench.reports.selection import age


def wall_time(record: dict) -> float | None:
    """A record's whole-run wall time in seconds, if it is a positive finite number."""
    value = record.get("wall_time_s")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def references_seconds(record: dict) -> float | None:
    """The seconds a record's run spent computing its held-out set's references: 0 where it read
    them from the reference cache, None where the record does not say (older records)."""
    evaluation = record.get("eval") if isinstance(record.get("eval"), dict) else {}
    times = evaluation.get("time_s") if isinstance(evaluation.get("time_s"), dict) else {}
    spent = times.get("references")
    if evaluation.get("references_cached") is True:
        return 0.0
    if evaluation.get("references_cached") is False and isinstance(spent, (int, float)) \
            and not isinstance(spent, bool) and math.isfinite(spent) and spent >= 0:
        return float(spent)
    return None


def run_time(record: dict) -> float | None:
    """What the record's run costs with its references read from the cache: its wall time less
    the references it computed (a suite's first run of a held-out set computes them once for
    the others; references_price prices them apart)."""
    wall = wall_time(record)
    if wall is None:
        return None
    spent = references_seconds(record) or 0.0
    return wall - spent if wall - spent > 0 else wall


def threads(record: dict) -> int | None:
    value = (record.get("train") or {}).get("threads")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def made_on(record: dict) -> str:
    """The day a record was made, YYYY-MM-DD (its run id's time stamp, else its file's time)."""
    stamp = age(record)[0]  # YYYYMMDD-HHMMSS
    return f"{stamp[:4]}-{stamp[4:6]}-{stamp[6:8]}"


def seconds_per_step(task_name: str, model_name: str, records: list[dict],
                     device: str = "cpu") -> float | None:
    """The median of wall time / trainer.max_steps over the records of one task and model on
    `device` (any other settings): what a run with no record of its own costs a step, roughly."""
    rates = []
    for record in records:
        if record["task"]["name"] != task_name or record["model"]["name"] != model_name \
                or environment(record).device != device:
            continue
        wall, steps = run_time(record), record["trainer"]["config"].get("max_steps")
        if wall is not None and isinstance(steps, int) and not isinstance(steps, bool) \
                and steps > 0:
            rates.append(wall / steps)
    return statistics.median(rates) if rates else None


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


@dataclass
class Price:
    """seconds: what the run is expected to take (None: nothing to tell); source: from what;
    threads: the thread counts of the records it comes from."""

    seconds: float | None
    source: str
    threads: frozenset = frozenset()


def price(config, records: list[dict], device: str, threads_wanted: int | None = None) -> Price:
    """A run's price from `records` of its device, the closest evidence first: its own run (same
    config and seed) by any code, the newest; other seeds of its config, their median; the
    median time a step of runs with its task and model config (other steps, lr, ...), then of
    any run of its task and model, times its steps. Where records of `threads_wanted` threads
    exist at a level, only they count there."""
    mine = [r for r in records if environment(r).device == device and run_time(r) is not None]

    def at_threads(found: list[dict]) -> list[dict]:
        same = [r for r in found if threads(r) == threads_wanted]
        return same if threads_wanted is not None and same else found

    def of(found: list[dict]) -> frozenset:
        return frozenset(t for r in found if (t := threads(r)) is not None)

    matching = [r for r in mine if record_matches(r, config)]
    own = at_threads([r for r in matching if r.get("seed") == config.seed])
    if own:
        newest = max(own, key=age)
        return Price(run_time(newest), f"its own record of {made_on(newest)}", of([newest]))
    others = at_threads(matching)
    if others:
        return Price(statistics.median(run_time(r) for r in others),
                     f"its config's other seeds ({len(others)})", of(others))
    same_model = [r for r in mine if r["task"]["name"] == config.task_name
                  and r["model"]["name"] == config.model_name]
    same_setup = at_threads([r for r in same_model
                             if config_matches(r["task"]["config"], config.task)
                             and config_matches(r["model"]["config"], config.model)])
    for found, what in ((same_setup, "this task and model config's"),
                        (at_threads(same_model), f"{config.task_name} {config.model_name}'s")):
        rate = seconds_per_step(config.task_name, config.model_name, found, device)
        if rate is not None:
            return Price(rate * config.trainer.max_steps, f"{what} time a step "
                         f"({plural(len(found), 'record')})", of(found))
    return Price(None, f"no record of {config.task_name} {config.model_name} on {device}")


def references_price(config, records: list[dict], device: str) -> Price:
    """The references of the held-out set of `config` (its task config, trainer.eval_sequences
    sequences), for a run that computes them: the records of its task config on `device` that
    computed theirs, their median seconds a held-out sequence, times its sequences."""
    rates = []
    for record in records:
        spent = references_seconds(record)
        sequences = (record.get("metrics") or {}).get("sequences")
        if spent and isinstance(sequences, int) and not isinstance(sequences, bool) \
                and sequences > 0 and environment(record).device == device \
                and record["task"]["name"] == config.task_name \
                and config_matches(record["task"]["config"], config.task):
            rates.append(spent / sequences)
    if not rates:
        return Price(None, f"no record of {config.task_name} that computed its references")
    return Price(statistics.median(rates) * config.trainer.eval_sequences,
                 f"{plural(len(rates), 'record')} that computed them, scaled to "
                 f"{config.trainer.eval_sequences} sequences")


def launcher_wall(seconds: list[float], workers: int) -> float:
    """The wall time of runs of these durations (in entry order) dealt as `launcher=local
    workers=N` deals them (bench/cli/launch.py `work`): worker k goes through the entries from
    its share's start (k·n/N) onwards, wrapping round, and takes the next one no worker has
    taken whenever it is free."""
    count = len(seconds)
    if count == 0:
        return 0.0
    workers = max(1, min(workers, count))
    orders = [[(k * count // workers + j) % count for j in range(count)] for k in range(workers)]
    taken, cursor = [False] * count, [0] * workers
    free = [(0.0, k) for k in range(workers)]  # (time the worker is free, worker)
    end = 0.0
    while free:
        now, k = heapq.heappop(free)
        while cursor[k] < count and taken[orders[k][cursor[k]]]:
            cursor[k] += 1
        if cursor[k] == count:  # nothing left for it: it stops
            end = max(end, now)
            continue
        entry = orders[k][cursor[k]]
        taken[entry] = True
        heapq.heappush(free, (now + seconds[entry], k))
    return end
