"""From run records to verdicts: each quantity of a claim read from the records that match its
selector (pooled as on the leaderboard: one environment, one version — behavioural identity,
else code version — each seed once; all quantities of a claim from one machine), then the
claim's control and rule evaluated on the quantities' intervals (bench/reports/claims/rules.py).

Verdicts, in the order a claim is decided:
- **not measured**: a quantity has no record (or the claim needs a protocol the code lacks);
- **not reached at reduced scale**: the control did not hold — the models that had to train under
  the claim's protocol did not, at our (reduced) budget: no evidence either way about the paper;
  at the paper's scale the same is **undecided**; also an `attainment` claim (a model reaches a
  level) whose model did not reach it at reduced scale;
- **undecided**: the rule's intervals overlap, or a quantity it needs is not a number, or the
  verdict rests on the draw: where a seed has records of one version that disagree (a rerun
  that training's float-level noise moved), the newest is used, and the claim decided on the
  oldest instead comes out otherwise;
- **task cannot separate**: the claim's `separable` condition is false — the task leaves less
  room than the rule's margin (what in-context inference can gain on it is smaller than the
  difference the rule asks for), so neither outcome would be evidence; decided before the
  control, since no model can change it;
- **holds** (at the paper's scale, or a claim about the task itself) / **holds at reduced scale**;
- **fails** / **fails at reduced scale** (CPU-sized runs of a claim made at GPU scale): the
  control held and the rule is false with separated intervals."""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field, replace
from functools import partial
from operator import itemgetter

import torch

from bench.records.store import Environment, environment, record_matches
from bench.reports.costs import run_time, seconds_per_step
from bench.reports.claims.rules import (NO_INTERVAL, Interval, PerSequence, Sample,
                                        SequenceStatistic, Test, same_on_every_seed)
from bench.reports.claims.spec import Claim, Quantity, is_reference
from bench.reports.selection import Selection, current_version, headline, version_label
from tasks.stats import across_seeds, pooled_std

VERDICTS = ("holds", "holds at reduced scale", "fails", "fails at reduced scale",
            "task cannot separate", "not reached at reduced scale", "undecided", "not measured")
FAILS = ("fails", "fails at reduced scale")


def number(value) -> float | None:
    """A metric value as a float (records store non-finite numbers as strings); None if it is no
    number."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if value in ("NaN", "Infinity", "-Infinity"):
        return float(value.replace("Infinity", "inf"))
    return None


def lookup(node, parts: list[str]) -> tuple[object, list[str]] | None:
    """Follow parts through nested dicts; a key may itself hold dots (per_position's
    "accuracy.model"), the longest key that exists wins. Returns (value, the keys used)."""
    keys = []
    while parts:
        if not isinstance(node, dict):
            return None
        for j in range(len(parts), 0, -1):
            key = ".".join(parts[:j])
            if key in node:
                node, parts = node[key], parts[j:]
                keys.append(key)
                break
        else:
            return None
    return node, keys


class MetricMissing(LookupError):
    pass


def read_metric(record: dict, quantity: Quantity) -> tuple[float, tuple[float, float] | None]:
    """(value, interval or None) of quantity's metric in one record."""
    found = lookup(record, quantity.path)
    if found is None:
        node, have = record, []
        for part in quantity.path:  # the deepest level that exists, for the message
            nxt = lookup(node, [part])
            if nxt is None:
                break
            node, have = nxt[0], have + [part]
        options = (", ".join(sorted(map(str, node)))[:300] if isinstance(node, dict) else "")
        raise MetricMissing(f"'{quantity.metric}' is not in the records"
                            + (f"; {'.'.join(have) or 'the record'} has: {options}"
                               if options else ""))
    value, keys = found
    index, interval = quantity.index, None
    if isinstance(value, list):
        if index is None:
            raise MetricMissing(f"'{quantity.metric}' is a list of {len(value)}: give an index "
                                "[i], a slice [a:b] (its mean) or [last]")
        items = [number(v) for v in value]
        # the standard errors beside the list (`mse_stderr` beside `mse`, `per_position_stderr`
        # beside `per_position`), where the record has them
        parent = lookup(record, keys[:-2] + [keys[-2] + "_stderr", keys[-1]]) \
            if len(keys) >= 2 else None
        errors = [number(v) for v in parent[0]] if parent is not None and isinstance(
            parent[0], list) and len(parent[0]) == len(items) else [None] * len(items)
        if index == "last":
            present = [i for i, v in enumerate(items) if v is not None]
            if not present:
                raise MetricMissing(f"'{quantity.metric}' has no number")
            chosen = present[-1:]
        elif ":" in index:
            lo, hi = (int(x) if x else None for x in index.split(":"))
            chosen = [i for i in range(len(items))[lo:hi] if items[i] is not None]
            if not chosen:
                raise MetricMissing(f"'{quantity.metric}' selects no number")
        else:
            i = int(index)
            if not -len(items) <= i < len(items) or items[i] is None:
                raise MetricMissing(f"'{quantity.metric}': no number at index {i} of "
                                    f"{len(items)}")
            chosen = [i]
        mean = sum(items[i] for i in chosen) / len(chosen)
        ses = [errors[i] for i in chosen]
        if all(se is not None and math.isfinite(se) for se in ses):
            # a slice's mean over positions: the standard error of a mean of correlated means
            # is at most the mean of their standard errors (the triangle inequality for standard
            # deviations), so the interval errs wide, never narrow
            bound = sum(ses) / len(ses)
            interval = (mean - 1.96 * bound, mean + 1.96 * bound)
        return mean, interval
    if index is not None:
        raise MetricMissing(f"'{quantity.metric}' is not a list: drop the [{index}]")
    if isinstance(value, dict):
        raise MetricMissing(f"'{quantity.metric}' is a mapping; name one of its keys: "
                            f"{', '.join(sorted(map(str, value)))[:300]}")
    if value is None:  # recorded as undefined (e.g. a log-log slope of a non-positive excess)
        return math.nan, None
    result = number(value)
    if result is None:
        raise MetricMissing(f"'{quantity.metric}' is not a number ({value!r})")
    for ci_path in (keys[:-1] + [keys[-1] + "_ci"],
                    keys[:-2] + [keys[-2] + "_ci", keys[-1]] if len(keys) >= 2 else None):
        ci = lookup(record, ci_path) if ci_path else None
        if ci and isinstance(ci[0], list) and len(ci[0]) == 2:
            lo, hi = (number(v) for v in ci[0])
            if lo is not None and hi is not None:
                interval = (lo, hi)
                break
    return result, interval


@dataclass
class Measured:
    value: float
    interval: tuple[float, float] | None
    seeds: list[int]
    code: str
    across_seeds: bool
    kernel: str | None  # the SSD kernel its runs used
    per_seed: list[float] = field(default_factory=list)  # in the order of seeds
    runs: list[str] = field(default_factory=list)  # the run ids of its records
    # seed -> (held-out digest, per-sequence values), where the records carry them
    sequences: dict[int, tuple[str, PerSequence]] = field(default_factory=dict)
    seed_intervals: list[tuple[float, float] | None] = field(default_factory=list)  # own, by seed
    wall_time_s: float | None = None  # a record's mean wall time (what one more seed costs)
    # seed -> (the headline of the record used, those of older records of the same seed and
    # version that disagree with it: selection.disagree)
    twins: dict[int, tuple[float, list[float]]] = field(default_factory=dict)
    train_ended: list[float | None] = field(default_factory=list)  # by seed: final_train_loss
    train_halfway: list[float | None] = field(default_factory=list)  # by seed: at ½ of its steps
    exact: bool = False  # the quantity's claim declares it free of sampling noise

    def as_interval(self) -> Interval:
        """What an unpaired comparison uses: the 95% interval, or the value where there is
        none."""
        if self.interval is None or not math.isfinite(self.value):
            return Interval.point(self.value)
        return Interval(*self.interval)

    def as_sample(self) -> Sample:
        return Sample(dict(zip(self.seeds, self.per_seed)), self.as_interval(), self.sequences,
                      self.interval is not None or self.exact,
                      {seed: 0.0 if self.exact else (own[1] - own[0]) / 2 for seed, own
                       in zip(self.seeds, self.seed_intervals)
                       if own is not None or self.exact})

    def seed_sample(self, seed: int) -> Sample:
        """The quantity on one seed: its record's value and own interval."""
        i = self.seeds.index(seed)
        value, interval = self.per_seed[i], self.seed_intervals[i]
        return Sample({seed: value}, Interval(*interval) if interval is not None and
                      math.isfinite(value) else Interval.point(value),
                      {seed: self.sequences[seed]} if seed in self.sequences else {},
                      interval is not None or self.exact)


def pick(quantity: Quantity, rows: list[list[dict]]) -> list[dict] | None:
    """The records of quantity among rows: of the rows (each one version: identity or code, in one
    environment) matching its selector (and suite), the current one (leaderboard
    current_version: the newest, unless an older one has more seeds: a partial re-run never
    downgrades a verdict); None when no record matches. A row that pools records of several
    commits by their identity may hold older records without a metric added since: the
    quantity reads the records that have it (when none has, read_metric says what is missing)."""
    matching = []
    for row in rows:
        if not record_matches(row[0], quantity.config):
            continue
        if quantity.suite:
            row = [r for r in row if r.get("origin") == f"suite:{quantity.suite}"]
        if row:
            matching.append(row)
    if not matching:
        return None
    carrying = [kept for row in matching
                if (kept := [r for r in row if lookup(r, quantity.path) is not None])]
    return current_version(carrying or matching)


def on_one_machine(quantities: dict[str, Quantity], rows: list[list[dict]]
                   ) -> tuple[Environment | None, dict[str, list[dict]]]:
    """(machine, {quantity name: its records}) with every quantity's records from one machine
    (records.Environment.machine), so no verdict compares or pools CPU and GPU runs: the machine
    where the most quantities have records, then the most seeds, then the newest record. Unlike
    a code version, a newer machine is no better than an older one: a seed re-run on a GPU does
    not displace a CPU measurement of more seeds."""
    by_machine: dict[Environment, list[list[dict]]] = defaultdict(list)
    for row in rows:
        by_machine[environment(row[0]).machine].append(row)
    best, best_key = (None, {}), None
    for machine, machine_rows in by_machine.items():
        picked = {name: found for name, q in quantities.items()
                  if (found := pick(q, machine_rows)) is not None}
        key = (len(picked), sum(map(len, picked.values())),
               max((r["_age"] for found in picked.values() for r in found), default=()))
        if best_key is None or key > best_key:
            best, best_key = (machine, picked), key
    return best


def read_sequences(record: dict, quantity: Quantity) -> tuple[str, PerSequence] | None:
    """(held-out digest, per-sequence values) of quantity's metric in record, where it is a mean
    over held-out sequences, or a statistic of such means, that the record keeps per sequence: a
    predictor's loss (metrics.loss.<name>), its gap to the gap reference (metrics.gap.<name>) or
    the model's (metrics.bayes_gap), and the metrics.task values that the task's
    summarize_sequences keeps (task_sequences); None otherwise (an older record keeps only the
    model's losses)."""
    metrics, per_sequence = record.get("metrics"), record.get("per_sequence")
    if not isinstance(metrics, dict) or not isinstance(per_sequence, dict):
        return None
    digest = metrics.get("held_out_digest")
    if metrics.get("scoring") == "perplexity":
        found = token_means(per_sequence, quantity)
        return (digest, found) if found is not None and isinstance(digest, str) else None
    if not isinstance(per_sequence.get("loss"), dict):
        return None
    if quantity.path[:2] == ["metrics", "task"]:
        found = task_sequences(per_sequence.get("task"), quantity.path[2:], quantity.index,
                               metrics.get("sequences"))
        return (digest, found) if found is not None and isinstance(digest, str) else None
    if quantity.index is not None:
        return None
    path, losses = quantity.path, per_sequence["loss"]
    reference = metrics.get("gap_reference")
    if path == ["metrics", "bayes_gap"]:
        name, minus = "model", reference
    elif len(path) == 3 and path[:2] in (["metrics", "loss"], ["metrics", "gap"]):
        name, minus = path[2], reference if path[1] == "gap" else None
    else:
        return None
    wanted = [name] + ([minus] if minus is not None else [])
    vectors = [losses.get(n) for n in wanted]
    if not isinstance(digest, str) or not all(
            isinstance(v, list) and v and len(v) == len(vectors[0]) and plain_numbers(v)
            for v in vectors):
        return None
    values = torch.tensor(vectors[0], dtype=torch.float64)
    if minus is not None:
        values = values - torch.tensor(vectors[1], dtype=torch.float64)
    return digest, values


def token_means(per_sequence: dict, quantity: Quantity) -> SequenceStatistic | None:
    """A text record's per-token loss (metrics.loss.<name>) or its perplexity (metrics.
    perplexity.<name>, the loss's exp) from the windows' loss sums and scored tokens
    (evaluate.py score_perplexity): the ratio of their means, resampled together; None for any
    other metric or a record without them."""
    path, tokens = quantity.path, per_sequence.get("tokens")
    if quantity.index is not None or len(path) != 3 or path[0] != "metrics" \
            or path[1] not in ("loss", "perplexity"):
        return None
    sums = per_sequence.get("loss_sum", {}).get(path[2]) \
        if isinstance(per_sequence.get("loss_sum"), dict) else None
    if not (isinstance(tokens, list) and tokens and isinstance(sums, list)
            and len(sums) == len(tokens) and plain_numbers(sums) and plain_numbers(tokens)):
        return None
    columns = (torch.tensor(sums, dtype=torch.float64), torch.tensor(tokens, dtype=torch.float64))
    return SequenceStatistic(columns, per_token_perplexity if path[1] == "perplexity"
                             else per_token_loss)


def per_token_loss(sums: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return sums / tokens


def per_token_perplexity(sums: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return (sums / tokens).exp()


def task_sequences(table, path: list[str], index: str | None, n) -> PerSequence | None:
    """The per-sequence values behind metrics.task.<path>[index] in a record's per_sequence.task,
    for the task metrics whose definition says how: excess_over_bayes.<name>[i], a mean over the
    sequences of their excess in context-length bin i (tasks/lgssm.py binned_excess);
    error_distribution's `mean.<name>` (the mean of the sequences' mean errors) and
    `std.<name>` (the pooled standard deviation, tasks.stats.pooled_std of the mean errors' and
    mean squared errors' means; tasks/lgssm.py error_moments); None for any other path or a
    table that does not hold them."""
    if not isinstance(table, dict) or not isinstance(n, int) or n < 1:
        return None
    if len(path) == 2 and path[0] == "excess_over_bayes" and index is not None \
            and index.isdigit():
        by_bin = table.get("excess_over_bayes", {}).get(path[1]) \
            if isinstance(table.get("excess_over_bayes"), dict) else None
        values = by_bin.get(index) if isinstance(by_bin, dict) else None
        if isinstance(values, list) and len(values) == n and plain_numbers(values):
            return torch.tensor(values, dtype=torch.float64)
        return None
    if index is not None or len(path) != 3 or path[0] != "error_distribution" \
            or path[1] not in ("mean", "std"):
        return None
    moments = table.get("error_distribution")
    if not isinstance(moments, dict):
        return None
    coordinates = moments.get("coordinates")
    vectors = [moments.get(part, {}).get(path[2]) if isinstance(moments.get(part), dict)
               else None for part in ("mean", "square")]
    if not (isinstance(coordinates, int) and coordinates >= 1 and isinstance(n, int) and n >= 1
            and all(isinstance(v, list) and len(v) == n and plain_numbers(v) for v in vectors)
            and n * coordinates > 1):
        return None
    mean, square = (torch.tensor(v, dtype=torch.float64) for v in vectors)
    if path[1] == "mean":
        return mean
    return SequenceStatistic((mean, square), partial(pooled_std, count=n * coordinates))


def plain_numbers(values: list) -> bool:
    """Whether every value is an int or a float (not a bool). JSON parses numbers as exactly
    those two types, which one pass in C confirms (a claims check reads 5 million of them);
    anything else is looked at value by value."""
    if set(map(type, values)) <= {float, int}:
        return True
    return all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in values)


def wall_time(row: list[dict]) -> float | None:
    """The mean run time of row's records with their references read from the cache (costs.
    run_time): what one more seed of its config costs."""
    times = [t for t in map(run_time, row) if t is not None]
    return sum(times) / len(times) if times else None


TRAIN_TAIL = 0.1  # the last tenth of a run's logged training losses: where it ended


def final_train_loss(record: dict, upto: float = 1.0) -> float | None:
    """The mean of the tenth of a run's logged training losses (at least one point) that ends
    `upto` of the way through them: 1, where its training ended; ½, halfway. Read from the
    training batches alone; None where the record has no curve."""
    curve = (record.get("train") or {}).get("loss_curve")
    if not isinstance(curve, list):
        return None
    if set(map(type, curve)) == {list} and set(map(len, curve)) == {2} \
            and plain_numbers(values := list(map(itemgetter(1), curve))):
        losses = list(filter(math.isfinite, map(float, values)))  # as JSON parses a curve
    else:
        losses = [v for point in curve if isinstance(point, list) and len(point) == 2
                  and (v := number(point[1])) is not None and math.isfinite(v)]
    if not losses:
        return None
    end = max(1, round(upto * len(losses)))
    window = losses[max(0, end - max(1, round(TRAIN_TAIL * len(losses)))):end]
    return sum(window) / len(window)


def best_trained_seed(measured: "Measured | list[Measured]", among: set[int] | None = None
                      ) -> int | None:
    """The seed (of `among`, where given) whose run ended with the lowest training loss — of any
    of several quantities' runs, where given a list (ties: the lower seed); None where no such
    record has a training curve."""
    ended: dict[int, float] = {}
    for m in measured if isinstance(measured, list) else [measured]:
        for seed, loss in zip(m.seeds, m.train_ended):
            if loss is not None and (among is None or seed in among):
                ended[seed] = min(loss, ended.get(seed, loss))
    return min(ended, key=lambda seed: (ended[seed], seed)) if ended else None


def measure(quantity: Quantity, row: list[dict], claim: str) -> Measured:
    """The quantity pooled over the seeds of row (one version in one environment)."""
    read = [read_metric(record, quantity) for record in row]  # MetricMissing: decide's
    values = [v for v, _ in read]
    mean, half = across_seeds(values)
    if same_on_every_seed(values):  # one seed, or a reference on the held-out set every seed
        half = None                 # shares: the record's own (held-out) interval
    # one number: the interval of any record that has one (older records may lack it)
    interval = (mean - half, mean + half) if half is not None else next(
        (own for _, own in read if own is not None), None)
    if interval is not None and quantity.range is not None:
        # a t-interval of a bounded quantity (a probability) can reach past its bounds
        low, high = quantity.range
        interval = (max(interval[0], low), min(interval[1], high))
    order = sorted(range(len(row)), key=lambda i: row[i]["seed"])
    sequences = {record["seed"]: found for record in row
                 if (found := read_sequences(record, quantity)) is not None}
    return Measured(mean, interval, [row[i]["seed"] for i in order],
                    version_label(row[-1]), half is not None, environment(row[0]).kernel,
                    [values[i] for i in order], sorted(str(r.get("run_id")) for r in row),
                    sequences, [read[i][1] for i in order], wall_time(row),
                    {r["seed"]: (headline(r), [headline(t) for t in r["_twins"]])
                     for r in row if r.get("_twins")},
                    [final_train_loss(row[i]) for i in order],
                    [final_train_loss(row[i], upto=0.5) for i in order], quantity.exact)


@dataclass
class Decision:
    claim: Claim
    verdict: str
    scale: str | None = None  # the scale of the records used: paper or cpu
    values: dict[str, Measured] = field(default_factory=dict)
    machine: Environment | None = None  # where the records used ran
    missing: list[str] = field(default_factory=list)
    note: str = ""
    control: bool | None = None  # whether the control held (None: undecided; no control: True)
    separable: bool | None = None  # whether the task leaves the rule room (None: no condition,
    # or undecided)
    tests: list[Test] = field(default_factory=list)  # the comparisons of control, then rule
    # a quantity without records -> CPU seconds per training step of records of the same task
    # and model at other settings (what its runs would cost, roughly; None: no such record)
    step_s: dict[str, float | None] = field(default_factory=dict)
    # control_seed: quantity -> (the seed the control read it on, of how many; None: no curve)
    control_on: dict[str, tuple[int | None, int]] = field(default_factory=dict)
    # judge_seed: (the seed the claim was judged on, of how many; None: no curve)
    judged_on: tuple[int | None, int] | None = None
    # where seeds have disagreeing records and the verdict rests on which is used: the verdicts
    # on the newest records and on the oldest (the verdict is then undecided)
    on_draws: tuple[str, str] | None = None
    # not reached: quantity -> {trainer.max_steps: its value} at every budget its config has
    # records of on this machine (other_budgets): whether more steps have helped so far
    budgets: dict[str, dict[int, float]] = field(default_factory=dict)


def rows_of(selection: Selection) -> list[list[dict]]:
    """Every row, those of older code versions too: a claim picks its code version itself."""
    return [runs for section in selection.sections
            for runs in [*section.rows.values(), *section.superseded.values()]]


def _evaluate(rule, samples: dict[str, Sample], tests: list[Test]
              ) -> tuple[bool | None, str]:
    """A rule's outcome, each comparison on its paired difference where it can be
    (bench/reports/claims/rules.py), and why it is undecided when it is; its tests join `tests`."""
    undefined = [name for name in rule.used if not samples[name].defined]
    if undefined:
        return None, f"not a number: {', '.join(undefined)}"
    outcome, done = rule.decide(samples)
    tests.extend(done)
    if outcome is not None:
        return outcome, ""
    undefined = sorted({t.why for t in done if t.why.startswith("undefined")})
    unmeasured = [f"`{t.text}` ({t.why})" for t in done if t.why.startswith(NO_INTERVAL)]
    open_ = [f"`{t.text}`" for t in done if t.outcome is None
             and not t.why.startswith(("undefined", NO_INTERVAL))]
    reasons = undefined + unmeasured + (
        [f"the interval of a difference holds 0 ({', '.join(open_)})"] if open_ else [])
    return None, "; ".join(reasons)


def judge(claim: Claim, reduced: bool, samples: dict[str, Sample],
          control_samples: dict[str, Sample] | None = None
          ) -> tuple[str, str, bool | None, list[Test]]:
    """(verdict, note, whether the control held, the tests) of claim on samples: whether the
    task can separate first, then the control (on control_samples where given: one seed's, for
    control_seed; not reached at reduced scale when it failed, else undecided), then the
    rule."""
    tests: list[Test] = []
    if claim.separable is not None:
        separable, _ = _evaluate(claim.separable, samples, tests)
        if separable is False:
            return ("task cannot separate", "the task leaves less room than the rule asks "
                    f"(`{claim.separable.text}` is false): neither outcome would be evidence",
                    None, tests)
    if claim.control is not None:
        control, why = _evaluate(claim.control, control_samples or samples, tests)
        if control is not True:
            held = "did not hold" if control is False else f"is undecided ({why})"
            verdict = "not reached at reduced scale" if reduced and control is False \
                else "undecided"
            return verdict, f"control {held}", control, tests
    outcome, why = _evaluate(claim.rule, samples, tests)
    if outcome is None:
        verdict = "undecided"
    elif outcome:
        verdict = "holds at reduced scale" if reduced else "holds"
    elif claim.kind == "attainment" and reduced:
        verdict, why = "not reached at reduced scale", "the model did not reach it at our budget"
    else:
        verdict = "fails at reduced scale" if reduced else "fails"
    return verdict, why, True, tests


def judge_seeds(claim: Claim, reduced: bool, values: dict[str, Measured]
                ) -> dict[int, tuple[str, bool | None, str, list[Test]]]:
    """Each seed the quantities share (in order): the claim's verdict on that seed's records
    alone, whether its control held there (None: open), why it is undecided where it is, and
    the tests that decided it."""
    each = {}
    for seed in sorted(set.intersection(*(set(m.seeds) for m in values.values()))):
        verdict, why, control, tests = judge(claim, reduced, {name: m.seed_sample(seed)
                                                              for name, m in values.items()})
        each[seed] = verdict, control, why, tests
    return each


def judge_each_seed(claim: Claim, reduced: bool, values: dict[str, Measured]
                    ) -> tuple[str, str, bool | None, list[Test]]:
    """A claim about each trained model (`per_seed: true`), judged seed by seed on that seed's
    record (its own interval, or a paired bootstrap over its sequences): it holds when it holds
    on every seed whose model trained, fails (or is not reached) when it does on every such
    seed, and is undecided when they disagree — the row then says k of n. A seed whose control
    failed trained no model the claim is about: it is no evidence either way (not reached), and
    the claim is judged on the others; where no seed trained, it is not reached. A seed whose
    control is open may or may not have trained: where its rule says what the trained seeds say,
    it changes nothing either way; elsewhere the claim is undecided."""
    each = judge_seeds(claim, reduced, values)
    if not each:
        return "undecided", "per seed: the quantities share no seed", None, []
    seeds = list(each)
    verdicts = {seed: verdict for seed, (verdict, *_) in each.items()}
    controls = {seed: control for seed, (_, control, *_) in each.items()}
    open_control = {}
    for seed in seeds:
        if controls[seed] is None:  # what the rule says of it, were its model trained
            one = {name: m.seed_sample(seed) for name, m in values.items()}
            open_control[seed] = judge(replace(claim, control=None), reduced, one)[0]
    held = set(controls.values())
    control = held.pop() if len(held) == 1 else None  # the same on every seed, or open
    note = seeds_note(verdicts)
    # what keeps the open seeds open, where it is one thing on all of them
    open_why = {why for verdict, _, why, _ in each.values() if verdict == "undecided"}
    if len(open_why) == 1 and (why := open_why.pop()) and NO_INTERVAL not in why:
        note += f"; on {'each' if set(verdicts.values()) == {'undecided'} else 'each open one'}" \
                f": {why}"
    # a number whose noise the records do not give decides no seed: say which
    unmeasured = sorted({why for _, _, why, _ in each.values() if NO_INTERVAL in why})
    if unmeasured:
        note += "; " + "; ".join(unmeasured)
    trained = {verdicts[seed] for seed in seeds if controls[seed] is True}
    if len(trained) == 1 and open_control and set(open_control.values()) <= trained:
        note += (f"; the control is open on seed{'s' * (len(open_control) != 1)} "
                 f"{', '.join(map(str, open_control))}, whose rule agrees with the seeds that "
                 "trained: the same either way")
    elif open_control:
        trained.add("undecided")
    untrained = sum(controls[seed] is False for seed in seeds)
    if len(trained) == 1 and untrained:
        judged = sum(controls[seed] is True for seed in seeds)
        note += (f"; judged on the {judged} seed{'s' * (judged != 1)} that trained (the control "
                 f"failed on {untrained}: no evidence either way)")
    if not trained:
        return "not reached at reduced scale" if reduced else "undecided", note, control, []
    if len(trained) > 1:
        return "undecided", note, control, []
    return trained.pop(), note, True, []  # decided on the seeds whose control held


def judge_best_seed(claim: Claim, reduced: bool, values: dict[str, Measured],
                    control_samples: dict[str, Sample] | None = None):
    """A claim judged on one seed (`judge_seed`): the one, among the seeds every quantity has,
    whose run of a claim.judge_seed quantity ended with the lowest training loss — chosen from
    the training curves, never the held-out sequences, so the seed's held-out interval keeps its
    level. The control reads its models on that seed too, except control_seed's, each on the seed
    it trained best, and its references as pooled (both as control_samples has them).
    Returns judge's (verdict, note, control, tests) with every seed's verdict added to the note,
    and (the seed, of how many; None where the quantities share no seed)."""
    common = set.intersection(*(set(m.seeds) for m in values.values()))
    if not common:
        return "undecided", "the quantities share no seed", None, [], None
    seed = best_trained_seed([values[name] for name in claim.judge_seed], common)
    if seed is None:
        return ("undecided", "no seed to judge on: none of the records has a training curve",
                None, [], (None, len(common)))

    def on(s: int) -> dict[str, Sample]:
        return {name: m.seed_sample(s) for name, m in values.items()}

    def control_on(s: int) -> dict[str, Sample] | None:
        return None if control_samples is None else {
            name: sample if name in claim.control_seed or is_reference(claim.quantities[name])
            else values[name].seed_sample(s) for name, sample in control_samples.items()}

    verdict, note, control, tests = judge(claim, reduced, on(seed), control_on(seed))
    if len(common) > 1:
        if control_samples is None:
            each = judge_each_seed(claim, reduced, values)[1]
        else:  # control_seed's models read once, on their best seeds: each seed's own beside
            each = seeds_note({s: judge(claim, reduced, on(s), control_on(s))[0]
                               for s in sorted(common)})
        note = "; ".join(part for part in (note, each) if part)
    return verdict, note, control, tests, (seed, len(common))


def seeds_note(verdicts: dict[int, str]) -> str:
    """'per seed: k of n seeds <verdict>, … (0 ✓ / 1 ✗ / …)' of each seed's verdict."""
    kinds = set(verdicts.values())
    counts = {v: sum(x == v for x in verdicts.values()) for v in VERDICTS if v in kinds}
    each = ", ".join(f"{n} of {len(verdicts)} seeds {v}" for v, n in counts.items())
    marks = " / ".join(f"{seed} {_MARK[v]}" for seed, v in verdicts.items())
    return f"per seed: {each} ({marks})"


_MARK = {"holds": "✓", "holds at reduced scale": "✓", "fails": "✗", "fails at reduced scale": "✗",
         "task cannot separate": "≈",
         "not reached at reduced scale": "not reached", "undecided": "?"}


def decide(claim: Claim, rows: list[list[dict]]) -> Decision:
    if claim.needs:
        return Decision(claim, "not measured", note=f"needs {claim.needs}")
    attempts = []
    if claim.paper_quantities:
        attempts.append(("paper", claim.paper_quantities))
    attempts.append((claim.scale, claim.quantities))
    for scale, quantities in attempts:
        machine, found = on_one_machine(quantities, rows)
        missing = [name for name in quantities if name not in found]
        if not missing:
            break
    values, lacking = {}, []
    for name in quantities:
        if name in found:
            try:
                values[name] = measure(quantities[name], found[name], claim.id)
            except MetricMissing as error:  # records of older code: rerun, not a crash
                lacking.append(f"{name}: {error}")
    if missing or lacking:
        note = "; ".join(["needs a GPU"] * bool(claim.gpu and missing) +
                         [f"records lack the metric ({'; '.join(lacking)}): rerun with the "
                          "current code"] * bool(lacking))
        return Decision(claim, "not measured", missing=missing + [m.split(":")[0] for m in lacking],
                        note=note, values=values, machine=machine,
                        step_s={name: seconds_per_step(
                                    quantities[name].config.task_name,
                                    quantities[name].config.model_name,
                                    [r for row in rows for r in row]) for name in missing})
    reduced = scale == "cpu"
    samples = {name: m.as_sample() for name, m in values.items()}
    control_on, control_samples = {}, None
    if claim.control_seed:
        control_samples = dict(samples)
        for name in claim.control_seed:
            seed = best_trained_seed(values[name])
            control_on[name] = (seed, len(values[name].seeds))
            control_samples[name] = values[name].seed_sample(seed) if seed is not None \
                else Sample({}, Interval.point(math.nan))
    judged_on = None
    if claim.per_seed:
        verdict, note, control, tests = judge_each_seed(claim, reduced, values)
    elif claim.judge_seed:
        verdict, note, control, tests, judged_on = judge_best_seed(claim, reduced, values,
                                                                   control_samples)
    else:
        verdict, note, control, tests = judge(claim, reduced, samples, control_samples)
    separable = claim.separable.decide(samples)[0] if claim.separable is not None else None
    return Decision(claim, verdict, scale, values, machine, note=note, control=control,
                    tests=tests, separable=separable, control_on=control_on,
                    judged_on=judged_on)


def oldest_draws(rows: list[list[dict]]) -> list[list[dict]]:
    """The rows with each seed's oldest record where its records of one version disagree
    (selection keeps the newest and hangs the others on it as `_twins`)."""
    return [[min([r, *r["_twins"]], key=lambda t: t["_age"]) if r.get("_twins") else r
             for r in row] for row in rows]


def other_budgets(quantity: Quantity, rows: list[list[dict]], machine: Environment,
                  claim: str) -> dict[int, float]:
    """The quantity's value at each training budget of its config on `machine`: of the rows
    whose config is the quantity's but for trainer.max_steps (and the warm-up that goes with
    it), each budget's current version (pick), by max_steps."""
    here = [row for row in rows if environment(row[0]).machine == machine
            and row[0]["task"]["name"] == quantity.config.task_name
            and row[0]["model"]["name"] == quantity.config.model_name]
    budgets = {}
    for steps, warmup in sorted({(row[0]["trainer"]["config"].get("max_steps"),
                                  row[0]["trainer"]["config"].get("warmup_steps"))
                                 for row in here}, key=str):
        if not isinstance(steps, int) or not isinstance(warmup, int):
            continue
        trainer = replace(quantity.config.trainer, max_steps=steps, warmup_steps=warmup)
        at = replace(quantity, config=replace(quantity.config, trainer=trainer))
        found = pick(at, here)
        if found is None:
            continue
        try:
            value = measure(at, found, claim).value
        except MetricMissing:
            continue
        if math.isfinite(value):
            budgets[steps] = value
    return budgets


def decide_all(claims: list[Claim], selection: Selection) -> list[Decision]:
    """Each claim decided on the newest record of each seed; one whose records include seeds
    drawn twice with different results is decided on the oldest draws too, and where the two
    verdicts differ it is undecided: which draw is newer is no evidence. A claim not reached at
    reduced scale also gets its quantities' values at the other budgets their configs ran
    (Decision.budgets), which say whether more steps have helped so far."""
    rows = rows_of(selection)
    older = None
    decisions = []
    for claim in claims:
        decision = decide(claim, rows)
        if any(m.twins for m in decision.values.values()):
            older = oldest_draws(rows) if older is None else older
            other = decide(claim, older)
            if other.verdict == "undecided" and NO_INTERVAL in other.note:
                # older draws made before their records carried an interval the claim needs
                # give no verdict to set against the newest: not another one
                decision.note = "; ".join(filter(None, [
                    decision.note, "the oldest draws decide nothing (their records give no "
                    "interval), so the newest do"]))
            elif other.verdict != decision.verdict:
                decision = replace(decision, verdict="undecided",
                                   on_draws=(decision.verdict, other.verdict))
        if decision.verdict == "not reached at reduced scale" and decision.machine is not None:
            decision.budgets = {name: other_budgets(claim.quantities[name], rows,
                                                    decision.machine, claim.id)
                                for name in decision.values if name in claim.quantities}
        decisions.append(decision)
    return decisions


