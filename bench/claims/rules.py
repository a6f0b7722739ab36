"""The rule language of claims: a boolean expression over a claim's quantity names, parsed and
checked once (anything outside the language is a ConfigError naming the claim), evaluated on
*intervals*, in three-valued logic.

Each quantity enters as its 95% interval (across seeds, or its record's own; a point where it
has none). Arithmetic is interval arithmetic, and a comparison is decided only when the
intervals are apart: `a < b` is True when a lies wholly below b, False when wholly at or above
it, and None — undecided — when they overlap. and/or/not are Kleene's (False and None is False,
True or None is True). So a comparison of two means that their noise could reverse never
decides a claim, and a quantity that is not a number (NaN) makes what depends on it undecided,
never false."""
from __future__ import annotations

import ast
import math
from dataclasses import dataclass

from bench.config import ConfigError

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
        """True, False, or None when the intervals do not decide (or a value is not a number)."""
        points = {name: value if isinstance(value, Interval) else Interval.point(float(value))
                  for name, value in values.items()}
        return self._eval(self.tree.body, points)

    def _eval(self, node, values):
        if isinstance(node, ast.BoolOp):
            parts = (self._eval(v, values) for v in node.values)
            return _and(parts) if isinstance(node.op, ast.And) else _or(parts)
        if isinstance(node, ast.UnaryOp):
            operand = self._eval(node.operand, values)
            return (_not(operand) if isinstance(node.op, ast.Not)
                    else -operand if isinstance(node.op, ast.USub) else operand)
        if isinstance(node, ast.Compare):
            left, results = self._eval(node.left, values), []
            for op, right_node in zip(node.ops, node.comparators):
                right = self._eval(right_node, values)
                results.append(_COMPARE[type(op)](left, right))
                left = right
            return _and(results)
        if isinstance(node, ast.BinOp):
            left, right = self._eval(node.left, values), self._eval(node.right, values)
            try:
                return _ARITH[type(node.op)](left, right)
            except RuleUndefined as error:
                raise RuleUndefined(f"{error} in '{ast.unparse(node)}'") from None
        if isinstance(node, ast.Constant):
            return Interval.point(float(node.value))
        if isinstance(node, ast.Name):
            return values[node.id]
        if isinstance(node, ast.Call):
            args = [self._eval(a, values) for a in node.args]
            if node.func.id == "abs":
                return abs(args[0])
            pick = min if node.func.id == "min" else max
            return Interval(pick(a.lo for a in args), pick(a.hi for a in args))
        raise AssertionError(f"unchecked node {type(node).__name__}")  # _kind refused it
