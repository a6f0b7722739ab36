"""The rule language of claims: a boolean expression over a claim's quantity names, parsed and
checked once (anything outside the language is a ConfigError naming the claim), evaluated on
*intervals*, in three-valued logic.

Each quantity enters as its 95% interval (across seeds, or its record's own; a point where it
has none). Arithmetic is interval arithmetic, and a comparison is decided only when the
intervals are apart: `a < b` is True when a lies wholly below b, False when wholly at or above
it, and None — undecided — when they overlap. and/or/not are Kleene's (False and None is False,
True or None is True). So a comparison of two means that their noise could reverse never
decides a claim, and a quantity that is not a number (NaN) makes what depends on it undecided,
never false.

A comparison is decided on its *difference*: `left op right` on the interval of left − right
against 0. Where the quantities it names were measured on the same seeds, the difference is
taken seed by seed (the models of one seed saw the same training batches, and every model is
scored on the same held-out sequences) and its 95% t-interval across those seeds, widened by
the held-out set's noise that every seed shares (a paired bootstrap over the sequences where the
records keep per-sequence values, else the quantities' own intervals, unpaired), decides: the
paired comparison. On one common seed, the records' per-sequence values, where they carry them,
give a paired bootstrap over the held-out sequences. Only where neither exists are the
quantities' own intervals combined (unpaired), and the test says so. `abs(E) <= F` is an
equivalence test (two one-sided tests, TOST): it holds
when E - F and -E - F are both below 0, i.e. the interval of E lies within ±F."""
from __future__ import annotations

import ast
import hashlib
import math
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import lru_cache, reduce
from typing import Callable, Union

import torch
from torch import Tensor

from bench.config import ConfigError
from tasks.stats import across_seeds

FUNCTIONS = {"abs": (1, 1), "min": (2, None), "max": (2, None)}
ALLOWED = ("quantity names, numbers, comparisons (< <= > >= == !=), and/or/not, + - * /, "
           "abs/min/max")


@dataclass(frozen=True)
class Interval:
    """[lo, hi]; a NaN end makes it undefined (every comparison with it is undecided)."""

    lo: float
    hi: float

    @classmethod
    def point(cls, x: float) -> "Interval":
        return cls(x, x)

    @property
    def defined(self) -> bool:
        return not (math.isnan(self.lo) or math.isnan(self.hi))

    def __add__(self, other: "Interval") -> "Interval":
        return Interval(self.lo + other.lo, self.hi + other.hi)

    def __sub__(self, other: "Interval") -> "Interval":
        return Interval(self.lo - other.hi, self.hi - other.lo)

    def __mul__(self, other: "Interval") -> "Interval":
        ends = [a * b for a in (self.lo, self.hi) for b in (other.lo, other.hi)]
        return Interval(min(ends), max(ends))

    def __truediv__(self, other: "Interval") -> "Interval":
        if other.lo <= 0 <= other.hi:
            raise RuleUndefined("a division by an interval that holds 0")
        return self * Interval(1 / other.hi, 1 / other.lo)

    def __neg__(self) -> "Interval":
        return Interval(-self.hi, -self.lo)

    def __abs__(self) -> "Interval":
        if self.lo >= 0:
            return self
        if self.hi <= 0:
            return -self
        return Interval(0.0, max(-self.lo, self.hi))


def _less(a: Interval, b: Interval, strict: bool) -> bool | None:
    """a < b (strict) or a <= b, decided only where the intervals are apart."""
    if not (a.defined and b.defined):
        return None
    if a.hi < b.lo or (not strict and a.hi <= b.lo):
        return True
    if a.lo > b.hi or (strict and a.lo >= b.hi):
        return False
    return None


def _equal(a: Interval, b: Interval) -> bool | None:
    if not (a.defined and b.defined):
        return None
    if a.lo == a.hi == b.lo == b.hi:
        return True
    if a.hi < b.lo or b.hi < a.lo:
        return False
    return None


def _not(x: bool | None) -> bool | None:
    return None if x is None else not x


_COMPARE = {ast.Lt: lambda a, b: _less(a, b, True), ast.LtE: lambda a, b: _less(a, b, False),
            ast.Gt: lambda a, b: _less(b, a, True), ast.GtE: lambda a, b: _less(b, a, False),
            ast.Eq: _equal, ast.NotEq: lambda a, b: _not(_equal(a, b))}
_ARITH = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
          ast.Mult: lambda a, b: a * b, ast.Div: lambda a, b: a / b}


def _and(values) -> bool | None:
    values = list(values)
    if any(v is False for v in values):
        return False
    return True if all(v is True for v in values) else None


def _or(values) -> bool | None:
    values = list(values)
    if any(v is True for v in values):
        return True
    return False if all(v is False for v in values) else None


@dataclass(frozen=True, eq=False)
class SequenceStatistic:
    """A quantity that is a function of means over the held-out sequences rather than one such
    mean (a standard deviation of pooled values): the per-sequence vectors whose means it takes
    (`columns`, each one value per sequence) and the function (`of_means`) of those means. A
    bootstrap resamples the sequences of every column together, and of every other quantity
    compared with it: paired."""

    columns: tuple[Tensor, ...]
    of_means: Callable[..., Tensor]

    def __len__(self) -> int:
        return len(self.columns[0])

    def value(self) -> float:
        return float(self.of_means(*(column.mean() for column in self.columns)))

    def resampled(self) -> Tensor:
        """Its value on each of the bootstrap's resamples (_resamples)."""
        return self.of_means(*(_resampled_means(column) for column in self.columns))


# What a quantity's per-sequence values are: a vector whose mean it is (a mean loss), or a
# statistic of several vectors' means
PerSequence = Union[Tensor, SequenceStatistic]


def _point_value(values: PerSequence) -> float:
    return values.value() if isinstance(values, SequenceStatistic) else float(values.mean())


def _resampled_value(values: PerSequence) -> Tensor:
    return values.resampled() if isinstance(values, SequenceStatistic) \
        else _resampled_means(values)


@dataclass(frozen=True)
class Sample:
    """A quantity as a comparison sees it: its value on each seed; where the records carry them,
    the per-sequence values behind a seed's value (the held-out set's digest and one value per
    sequence: their mean is the seed's value); and its 95% interval, for an unpaired comparison."""

    per_seed: dict[int, float]
    interval: Interval
    sequences: dict[int, tuple[str, PerSequence]] = field(default_factory=dict)
    # False where the interval is a point only because the records give the quantity none
    # (no bootstrap interval, standard error or spread across seeds): its noise is unknown
    measured_noise: bool = True
    # seed -> the half-width of that seed's record's own (held-out) interval, where it has one:
    # the held-out noise of a quantity whose records keep no per-sequence values
    own_halves: dict[int, float] = field(default_factory=dict)

    @property
    def defined(self) -> bool:
        return self.interval.defined and all(not math.isnan(v) for v in self.per_seed.values())


@dataclass(frozen=True)
class Test:
    """One comparison as it was decided: `text` (left op right), the difference left − right and
    its 95% interval, how it was paired ("5 seeds", "512 sequences of seed 0", or "" where the
    quantities' own intervals were combined), and the outcome (None: undecided, `why`)."""

    text: str
    difference: float
    interval: tuple[float, float]
    paired: str
    outcome: bool | None
    why: str = ""
    names: tuple[str, ...] = ()  # the quantities it compares
    # paired across seeds: how many, and the two parts of the interval's half-width (the seeds'
    # t-interval, which more seeds narrow; the held-out set's, which they do not)
    seeds: int = 0
    seed_half: float = math.nan
    held_out_half: float = 0.0
    note: str = ""  # an unpaired comparison's: the quantities whose noise it leaves out


NO_INTERVAL = "no interval: its records give "  # a Test's why, when no quantity has noise
BOOTSTRAP_RESAMPLES = 2000  # of the held-out sequences, for a comparison on one seed
# Values this close (relative to the largest) are one number: records of two code versions
# give a reference on the one held-out set values ~1e-15 apart, trained seeds ~1e-6 or more.
SAME_NUMBER = 1e-12


def same_on_every_seed(values) -> bool:
    """Whether the seeds' values are one number up to rounding (a reference scored on the one
    held-out set every seed shares): their spread across seeds says nothing of its noise."""
    values = list(values)
    if not all(math.isfinite(v) for v in values):
        return len(set(values)) == 1
    largest = max((abs(v) for v in values), default=0.0)
    return max(values, default=0.0) - min(values, default=0.0) <= SAME_NUMBER * largest


class RuleUndefined(ArithmeticError):
    """A rule that cannot be evaluated on these numbers (a division by zero)."""


MAX_RULE = 2000  # characters: the longest shipped rule is ~200


class Rule:
    """A parsed, checked rule: `Rule(text, names, where)` refuses anything outside the language
    (a ConfigError whose message starts with `where`); `evaluate(values)` gives True, False or
    None (undecided) on values that are Intervals or plain numbers (points)."""

    def __init__(self, text: str, names, where: str):
        self.text, self.names, self.where = text, set(names), where
        if not isinstance(text, str) or not text.strip():
            raise ConfigError(f"{where}: rule must be a non-empty expression")
        if len(text) > MAX_RULE:  # parsing and evaluating recurse by the expression's depth
            raise ConfigError(f"{where}: rule of {len(text)} characters; at most {MAX_RULE}")
        try:
            self.tree = ast.parse(text.strip(), mode="eval")
        except (SyntaxError, RecursionError, MemoryError) as error:
            raise ConfigError(f"{where}: rule '{text[:60]}' is not an expression "
                              f"({getattr(error, 'msg', None) or 'nested too deeply'})") from None
        if self._kind(self.tree.body) != "bool":
            raise ConfigError(f"{where}: rule '{text}' must be a comparison or an and/or/not of "
                              "comparisons, not a number")
        self.used = sorted({n.id for n in ast.walk(self.tree)
                            if isinstance(n, ast.Name) and n.id not in FUNCTIONS})

    def _refuse(self, why: str):
        raise ConfigError(f"{self.where}: rule '{self.text}': {why}; rules use {ALLOWED}")

    def _kind(self, node) -> str:
        """'bool' or 'number': checks every node and the types of operands."""
        if isinstance(node, ast.BoolOp) and isinstance(node.op, (ast.And, ast.Or)):
            for value in node.values:
                self._expect(value, "bool", "and/or")
            return "bool"
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            self._expect(node.operand, "bool", "not")
            return "bool"
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            self._expect(node.operand, "number", "a sign")
            return "number"
        if isinstance(node, ast.Compare):
            if not all(type(op) in _COMPARE for op in node.ops):
                self._refuse("only the comparisons < <= > >= == != are allowed (no in, is)")
            for operand in (node.left, *node.comparators):
                self._expect(operand, "number", "a comparison")
            return "bool"
        if isinstance(node, ast.BinOp):
            if type(node.op) not in _ARITH:
                self._refuse(f"the operator {type(node.op).__name__} is not allowed")
            self._expect(node.left, "number", "arithmetic")
            self._expect(node.right, "number", "arithmetic")
            return "number"
        if isinstance(node, ast.Constant):
            if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
                self._refuse(f"the constant {node.value!r} is not a number")
            return "number"
        if isinstance(node, ast.Name):
            if node.id in FUNCTIONS:
                self._refuse(f"'{node.id}' must be called")
            if node.id not in self.names:
                raise ConfigError(f"{self.where}: rule '{self.text}' names '{node.id}', which is "
                                  f"not one of its quantities ({', '.join(sorted(self.names))})")
            return "number"
        if isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else None
            if name not in FUNCTIONS:
                what = ast.unparse(node.func)
                self._refuse(f"calls other than abs, min, max are not allowed ('{what}')")
            if node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
                self._refuse(f"{name}() takes plain positional arguments")
            low, high = FUNCTIONS[name]
            if len(node.args) < low or (high is not None and len(node.args) > high):
                self._refuse(f"{name}() takes {low if high == low else f'{low} or more'} "
                             "arguments")
            for arg in node.args:
                self._expect(arg, "number", f"{name}()")
            return "number"
        if isinstance(node, ast.Attribute):
            self._refuse(f"attribute access ('{ast.unparse(node)}') is not allowed")
        self._refuse(f"{type(node).__name__} ('{ast.unparse(node)}') is not allowed")

    def _expect(self, node, kind: str, context: str) -> None:
        got = self._kind(node)
        if got != kind:
            self._refuse(f"{context} needs {'a number' if kind == 'number' else 'a comparison'}, "
                         f"got '{ast.unparse(node)}'")

    def evaluate(self, values: dict) -> bool | None:
        """True, False, or None when the intervals do not decide (or a value is not a number),
        on values that are Intervals or plain numbers: every comparison unpaired."""
        samples = {name: Sample({}, value if isinstance(value, Interval)
                                else Interval.point(float(value)))
                   for name, value in values.items()}
        return self.decide(samples)[0]

    def decide(self, samples: dict[str, Sample]) -> tuple[bool | None, list[Test]]:
        """The outcome on the quantities' samples, each comparison decided on its paired
        difference where it can be (the module's docstring), and the tests that decided it."""
        tests: list[Test] = []
        return self._decide(self.tree.body, samples, tests), tests

    def _decide(self, node, samples, tests) -> bool | None:
        if isinstance(node, ast.BoolOp):
            parts = [self._decide(v, samples, tests) for v in node.values]
            return _and(parts) if isinstance(node.op, ast.And) else _or(parts)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return _not(self._decide(node.operand, samples, tests))
        assert isinstance(node, ast.Compare)  # _kind: a bool is and/or/not or a comparison
        results, left = [], node.left
        for op, right in zip(node.ops, node.comparators):
            every, pieces = _pieces(left, op, right)
            outcomes = [self._test(piece, samples, tests) for piece in pieces]
            results.append(_and(outcomes) if every else _or(outcomes))
            left = right
        return _and(results)

    def _test(self, piece, samples: dict[str, Sample], tests: list[Test]) -> bool | None:
        """One `left op right` decided on the interval of left − right."""
        left, op, right = piece
        text = f"{ast.unparse(left)} {_SYMBOL[type(op)]} {ast.unparse(right)}"
        names = sorted({n.id for side in (left, right) for n in ast.walk(side)
                        if isinstance(n, ast.Name) and n.id not in FUNCTIONS})
        common = sorted(set.intersection(*(set(samples[n].per_seed) for n in names))) \
            if names else []
        paired, why, note, seeds, seed_half, held_out = "", "", "", 0, math.nan, 0.0
        # quantities that differ between seeds: a comparison of references alone (the same on
        # every seed) has no seed-to-seed spread, only the held-out set's
        varying = [n for n in names
                   if not same_on_every_seed(samples[n].per_seed[seed] for seed in common)]
        if len(common) >= 2 and varying:
            differences = [_value(left, env) - _value(right, env) for env in
                           ({n: samples[n].per_seed[seed] for n in names} for seed in common)]
            if all(math.isfinite(d) for d in differences):
                mean, seed_half = across_seeds(differences)
                held_out, how = _held_out_half(left, right, names, varying, samples, common)
                half = math.hypot(seed_half, held_out)
                difference, interval = mean, (mean - half, mean + half)
            else:
                difference, interval, how = math.nan, (math.nan, math.nan), ""
            paired, seeds = f"{len(common)} seeds{how}", len(common)
        elif common and (on_seed := _sequences(names, samples, common[0])) is not None:
            sequences = on_seed[1]
            difference, interval = _bootstrap(left, right, sequences)
            paired = f"{len(next(iter(sequences.values())))} sequences of seed {common[0]}"
        else:
            values = {n: samples[n].interval for n in names}
            try:
                d = _interval_value(left, values) - _interval_value(right, values)
            except RuleUndefined as error:
                tests.append(Test(text, math.nan, (math.nan, math.nan), "", None,
                                  f"undefined: {error}", tuple(names)))
                return None
            difference, interval = (d.lo + d.hi) / 2, (d.lo, d.hi)
            unknown = [n for n in names if not samples[n].measured_noise]
            if unknown and len(unknown) == len(names):
                # no noise counted at all: a point difference that no interval could overturn
                tests.append(Test(text, difference, interval, "", None, NO_INTERVAL
                                  + ", ".join(unknown) + " none", tuple(names)))
                return None
            if unknown:
                note = "; the held-out noise of " + ", ".join(unknown) + " not counted (its " \
                    "records give it no interval)"
        outcome = _sign_decides(type(op), Interval(*interval))
        if outcome is None:
            why = "not a number" if math.isnan(interval[0] + interval[1]) else \
                "the interval of the difference holds 0"
        tests.append(Test(text, difference, interval, paired, outcome, why, tuple(names), seeds,
                          seed_half, held_out, note))
        return outcome


_SYMBOL = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}
_FLIP = {ast.Lt: ast.Gt, ast.LtE: ast.GtE, ast.Gt: ast.Lt, ast.GtE: ast.LtE}


def _is_abs(node) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
        and node.func.id == "abs"


def _pieces(left, op, right) -> tuple[bool, list[tuple]]:
    """A comparison as one-sided pieces (left, op, right), and whether every piece must hold
    (True) or one (False). `abs(E) <= F` is E <= F and -E <= F — the two one-sided tests of an
    equivalence within ±F — and `abs(E) >= F` is E >= F or -E >= F; `F >= abs(E)` reads as
    `abs(E) <= F`."""
    kind = type(op)
    if _is_abs(right) and not _is_abs(left) and kind in _FLIP:
        left, right, kind = right, left, _FLIP[kind]
    if _is_abs(left) and kind in _FLIP:
        inner = left.args[0]
        negated = ast.UnaryOp(op=ast.USub(), operand=inner)
        return kind in (ast.Lt, ast.LtE), [(inner, kind(), right), (negated, kind(), right)]
    return True, [(left, op, right)]


def _sign_decides(kind, d: Interval) -> bool | None:
    """left op right from the interval d of left − right: decided only when d is clear of 0."""
    if not d.defined:
        return None
    zero = Interval.point(0.0)
    if kind in (ast.Eq, ast.NotEq):
        equal = _equal(d, zero)
        return equal if kind is ast.Eq else _not(equal)
    return _COMPARE[kind](d, zero)


def _value(node, env: dict):
    """A number expression on floats (one seed's values) or tensors (bootstrap resamples); a
    division by zero is NaN (undecided)."""
    if isinstance(node, ast.BinOp):
        left, right = _value(node.left, env), _value(node.right, env)
        if isinstance(node.op, ast.Div) and not isinstance(right, Tensor) and right == 0:
            return math.nan
        return _ARITH[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp):
        operand = _value(node.operand, env)
        return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.Constant):
        return float(node.value)
    if isinstance(node, ast.Name):
        return env[node.id]
    args = [_value(a, env) for a in node.args]
    if node.func.id == "abs":
        return abs(args[0])
    if any(isinstance(a, Tensor) for a in args):
        pick = torch.minimum if node.func.id == "min" else torch.maximum
        return reduce(pick, [torch.as_tensor(a, dtype=torch.float64) for a in args])
    return (min if node.func.id == "min" else max)(args)


def _sequences(names: list[str], samples: dict[str, Sample], seed: int,
               constant: tuple[str, ...] = ()) -> tuple[str, dict[str, PerSequence]] | None:
    """(the held-out set's digest, each quantity's per-sequence values on seed), when all of
    them have them on one held-out set (one digest, one length); None otherwise. A `constant`
    quantity (one number on every seed: a reference) whose record of seed lacks them takes
    another seed's: the same sequences scored the same way, where the digests agree."""
    found = [samples[n].sequences.get(seed) if n not in constant or seed in samples[n].sequences
             else next(iter(samples[n].sequences.values()), None) for n in names]
    if any(f is None for f in found) or len({(d, len(v)) for d, v in found}) != 1:
        return None
    return found[0][0], {n: v for n, (_, v) in zip(names, found)}


def _held_out_half(left, right, names, varying, samples, seeds) -> tuple[float, str]:
    """The half-width that the held-out set's sampling adds to a difference paired across
    seeds (the seeds' t-interval is conditional on the one held-out set every model is scored
    on: more seeds never narrow this part), and how it was found: a bootstrap over the
    sequences of the seed-averaged per-sequence values, where the records carry them — of the
    seeds whose records do, where older records of some seeds do not (an average over fewer
    seeds varies more from sequence to sequence: the estimate errs wide); else the quantities'
    own intervals, combined unpaired: a reference's (the same on every seed), and a model's the
    mean of its seeds' half-widths around its seed mean (the held-out noise of a mean over seeds
    scored on one set is at most the mean of theirs). Unpaired, the bound is wider than the
    difference's own noise (what two models share on the held-out set cancels in a paired
    difference), so it can keep open what per-sequence values would decide, never the reverse;
    a quantity whose records give no interval adds nothing, and the test says so. NaN where
    undefined."""
    constant = tuple(n for n in names if n not in varying)
    found = [on_seed for seed in seeds
             if (on_seed := _sequences(names, samples, seed, constant)) is not None]
    if found and len({digest for digest, _ in found}) == 1:
        averaged = {n: _seed_average([sequences[n] for _, sequences in found]) for n in names}
        _, (lo, hi) = _bootstrap(left, right, averaged)
        some = f" of {len(found)} of the seeds" if len(found) < len(seeds) else ""
        return (hi - lo) / 2, f" and {len(averaged[names[0]])} held-out sequences{some}"
    values, counted, uncounted = {}, [], []
    for n in names:
        if n in constant:
            values[n] = samples[n].interval
            (counted if samples[n].interval.hi > samples[n].interval.lo else uncounted).append(n)
            continue
        mean = sum(samples[n].per_seed[s] for s in seeds) / len(seeds)
        halves = [samples[n].own_halves.get(s) for s in seeds]
        if all(h is not None and math.isfinite(h) for h in halves):
            half = sum(halves) / len(halves)
            values[n] = Interval(mean - half, mean + half)
            if half > 0:  # an exact quantity (no sampling noise) has none to count
                counted.append(n)
        else:
            values[n] = Interval.point(mean)
            uncounted.append(n)
    try:
        d = _interval_value(left, values) - _interval_value(right, values)
    except RuleUndefined:
        return math.nan, ""
    how = ""
    if counted:
        how += "; the held-out noise of " + ", ".join(counted) + \
            (" from its own interval" if len(counted) == 1 else
             " from their own intervals, unpaired")
    if uncounted:
        how += "; the held-out noise of " + ", ".join(uncounted) + " not counted (its " \
            "records give it no interval)"
    return (d.hi - d.lo) / 2, how


def _seed_average(per_seed: list[PerSequence]) -> PerSequence:
    """The per-sequence values of a quantity's mean over seeds: of a mean, the mean vector; of a
    statistic, the statistic averaged over the seeds on every resample (it is not linear in its
    means, so averaging their vectors first would be another quantity)."""
    if not any(isinstance(values, SequenceStatistic) for values in per_seed):
        return torch.stack(per_seed).mean(0)
    statistics = [values if isinstance(values, SequenceStatistic)
                  else SequenceStatistic((values,), lambda mean: mean) for values in per_seed]
    columns = tuple(column for statistic in statistics for column in statistic.columns)
    widths = [len(statistic.columns) for statistic in statistics]

    def of_means(*means: Tensor) -> Tensor:
        values, start = [], 0
        for statistic, width in zip(statistics, widths):
            values.append(statistic.of_means(*means[start:start + width]))
            start += width
        return torch.stack(values).mean(0)
    return SequenceStatistic(columns, of_means)


def _interval_value(node, values: dict[str, Interval]) -> Interval:
    """A number expression in interval arithmetic."""
    if isinstance(node, ast.BinOp):
        left, right = _interval_value(node.left, values), _interval_value(node.right, values)
        try:
            return _ARITH[type(node.op)](left, right)
        except RuleUndefined as error:
            raise RuleUndefined(f"{error} in '{ast.unparse(node)}'") from None
    if isinstance(node, ast.UnaryOp):
        operand = _interval_value(node.operand, values)
        return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.Constant):
        return Interval.point(float(node.value))
    if isinstance(node, ast.Name):
        return values[node.id]
    args = [_interval_value(a, values) for a in node.args]
    if node.func.id == "abs":
        return abs(args[0])
    pick = min if node.func.id == "min" else max
    return Interval(pick(a.lo for a in args), pick(a.hi for a in args))


def _bootstrap(left, right, sequences: dict[str, PerSequence]
               ) -> tuple[float, tuple[float, float]]:
    """left − right on the quantities from the sequences' means, and its 95% percentile interval
    resampling the held-out sequences (one resample for every quantity: paired)."""
    means = {n: _point_value(v) for n, v in sequences.items()}
    estimate = _value(left, means) - _value(right, means)
    resampled = {n: _resampled_value(v) for n, v in sequences.items()}  # once for both sides
    d = _value(left, resampled) - _value(right, resampled)
    if not torch.isfinite(d).all():
        return math.nan, (math.nan, math.nan)
    lo, hi = torch.quantile(d, torch.tensor([0.025, 0.975], dtype=d.dtype))
    return estimate, (float(lo), float(hi))


@lru_cache(maxsize=4)
def _resamples(count: int) -> Tensor:
    """The bootstrap's resamples of a held-out set of `count` sequences: each comparison draws
    the same ones (seed 0), so they are drawn once per size (10 s of `claims` at 4,096)."""
    generator = torch.Generator().manual_seed(0)
    return torch.randint(count, (BOOTSTRAP_RESAMPLES, count), generator=generator)


# Resampled means by the values' bytes: one model's per-sequence losses enter many comparisons
# (a third of `claims`' 890 resamplings are new), and a gather of 2,000 resamples of 4,096
# sequences costs 60 ms. At most 512 entries of 2,000 numbers.
_RESAMPLED: OrderedDict[tuple, Tensor] = OrderedDict()


def _resampled_means(values: Tensor) -> Tensor:
    """The mean of `values` on each of _resamples' resamples, `values[index].mean(1)` bitwise
    (each row is reduced alone), read from _RESAMPLED where the same values were resampled."""
    key = (values.dtype, len(values),
           hashlib.blake2b(values.contiguous().numpy().tobytes(), digest_size=16).digest())
    if key in _RESAMPLED:
        _RESAMPLED.move_to_end(key)
    else:
        index = _resamples(len(values))
        rows = max(64, 2 ** 20 // len(values))  # a block in cache, 8 MB: 4× faster than all
        _RESAMPLED[key] = torch.cat([torch.take(values, index[i:i + rows]).mean(1)
                                     for i in range(0, len(index), rows)])
        if len(_RESAMPLED) > 512:
            _RESAMPLED.popitem(last=False)
    return _RESAMPLED[key]
