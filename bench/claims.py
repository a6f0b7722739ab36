"""claims.md from run records: one row per claim of the three source papers, each decided by the
rule written next to it in conf/claims/<paper>.yaml.

A claim names its *quantities*. Each quantity is a record selector plus a metric path:
- the selector is a list of overrides in the command-line syntax (`task=markov`,
  `model.conv=false`, `trainer.max_steps=1000`); it is composed like a run (bench.config.compose,
  without the hardware checks), so a typo is a config error, and a record matches when its task,
  model and trainer configs equal the composed ones (result-neutral trainer keys aside; a field
  that a record predates counts as its default). `suite: <name>` also requires that origin;
- the metric path is a dotted path into the record (`metrics.bayes_gap`, `metrics.gap.gd1`,
  `metrics.accuracy.clairvoyant`, `metrics.perplexity.model`, `per_position.accuracy.model`,
  `metrics.task.excess_over_bayes.erm`), with `[i]` (one element), `[a:b]` (the mean of a slice;
  None entries skipped) or `[last]` (the last non-None element) for lists.
Matching records are pooled as on the leaderboard (bench.leaderboard.select_runs): one
environment (records.environment), one code version (the newest that has the config), each seed
once (its newest record), and all quantities of a claim from one machine (`on_one_machine`);
several seeds give the mean and a 95% t-interval across seeds, one seed its record's own interval
where the record has one (`<name>_ci` beside the value, or ±1.96 × `<name>_stderr`).

The rule is a boolean expression over the quantity names, evaluated on the means by a small
evaluator that walks the parsed tree itself and allows only names, numbers, comparisons,
and/or/not, + - * /, abs/min/max (anything else is a config error naming the claim).

Verdicts: `not measured` when a quantity has no record (or the claim `needs` a protocol the code
lacks); otherwise the rule decides `holds` or `fails`. A claim made at a scale we cannot run here
declares `scale: cpu`: its rule holding on our records gives `holds at CPU scale only`, unless
`paper_scale:` overrides (e.g. `trainer=paper`) select records at the paper's scale for every
quantity, which are then preferred."""
from __future__ import annotations

import ast
import dataclasses
import functools
import keyword
import math
import re
import shlex
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from bench.config import (CONF_DIR, GROUPS, ConfigError, RunConfig, choices, compose,
                          load_suite)
from bench.leaderboard import (Selection, across_seeds, code_label, commit_of, output_path,
                               plural, write_atomic)
from bench.records import RESULT_NEUTRAL, Environment, environment, record_matches

VERDICTS = ("holds", "holds at CPU scale only", "fails", "not measured")
SCALES = ("paper", "cpu")
PAPERS = ("000", "002", "004")
METRIC_ROOTS = ("metrics", "per_position", "params", "state_size", "train", "eval")
CLAIM_KEYS = {"id", "section", "claim", "paper_number", "measure", "where", "rule", "scale",
              "paper_scale", "command", "gpu", "needs", "contradicts_paper"}
REQUIRED = ("id", "section", "claim", "paper_number", "measure", "rule", "scale", "command")
QUANTITY_KEYS = {"where", "metric", "suite"}
DEFAULT_METRIC = "metrics.bayes_gap"
PATH = re.compile(r"^(?P<path>[A-Za-z_]\w*(?:\.[\w-]+)*)"  # dotted keys, then [i], [a:b] or [last]
                  r"(?:\[(?P<index>-?\d+|-?\d*:-?\d*|last)\])?$")
FUNCTIONS = {"abs": (1, 1), "min": (2, None), "max": (2, None)}
ALLOWED = ("quantity names, numbers, comparisons (< <= > >= == !=), and/or/not, + - * /, "
           "abs/min/max")


def default_rules() -> Path:
    return CONF_DIR / "claims"


# ---------------------------------------------------------------- the rule language

class RuleUndefined(ArithmeticError):
    """A rule that cannot be evaluated on these numbers (a division by zero)."""


_COMPARE = {ast.Lt: lambda a, b: a < b, ast.LtE: lambda a, b: a <= b,
            ast.Gt: lambda a, b: a > b, ast.GtE: lambda a, b: a >= b,
            ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b}
_ARITH = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
          ast.Mult: lambda a, b: a * b, ast.Div: lambda a, b: a / b}


class Rule:
    """A parsed, checked rule: `Rule(text, names, where)` refuses anything outside the language
    (a ConfigError whose message starts with `where`); `evaluate(values)` gives True or False."""

    def __init__(self, text: str, names, where: str):
        self.text, self.names, self.where = text, set(names), where
        if not isinstance(text, str) or not text.strip():
            raise ConfigError(f"{where}: rule must be a non-empty expression")
        try:
            self.tree = ast.parse(text.strip(), mode="eval")
        except SyntaxError as error:
            raise ConfigError(f"{where}: rule '{text}' is not an expression "
                              f"({error.msg})") from None
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

    def evaluate(self, values: dict[str, float]) -> bool:
        return bool(self._eval(self.tree.body, values))

    def _eval(self, node, values):
        if isinstance(node, ast.BoolOp):
            if isinstance(node.op, ast.And):
                return all(self._eval(v, values) for v in node.values)
            return any(self._eval(v, values) for v in node.values)
        if isinstance(node, ast.UnaryOp):
            operand = self._eval(node.operand, values)
            return (not operand if isinstance(node.op, ast.Not)
                    else -operand if isinstance(node.op, ast.USub) else +operand)
        if isinstance(node, ast.Compare):
            left = self._eval(node.left, values)
            for op, right_node in zip(node.ops, node.comparators):
                right = self._eval(right_node, values)
                if not _COMPARE[type(op)](left, right):
                    return False
                left = right
            return True
        if isinstance(node, ast.BinOp):
            left, right = self._eval(node.left, values), self._eval(node.right, values)
            if isinstance(node.op, ast.Div) and right == 0:
                raise RuleUndefined(f"division by zero in '{ast.unparse(node)}'")
            return _ARITH[type(node.op)](left, right)
        if isinstance(node, ast.Constant):
            return float(node.value)
        if isinstance(node, ast.Name):
            return float(values[node.id])
        if isinstance(node, ast.Call):
            args = [self._eval(a, values) for a in node.args]
            return {"abs": lambda: abs(args[0]), "min": lambda: min(args),
                    "max": lambda: max(args)}[node.func.id]()
        raise AssertionError(f"unchecked node {type(node).__name__}")  # _kind refused it


# ---------------------------------------------------------------- the claims files

@dataclass
class Quantity:
    name: str
    where: list[str]
    metric: str
    suite: str | None
    config: RunConfig
    path: list[str]
    index: str | None


@dataclass
class Claim:
    id: str
    paper: str
    section: str
    text: str
    paper_number: str
    quantities: dict[str, Quantity]
    paper_quantities: dict[str, Quantity] | None
    rule: Rule
    scale: str
    commands: list[str]
    gpu: bool = False
    needs: str | None = None
    contradicts: str | None = None
    source: str = ""


def merge(base: list[str], layer: list[str], drop_groups: bool = False) -> list[str]:
    """base with layer's overrides: a key of layer replaces the same key of base; with
    drop_groups, a group choice of layer (`trainer=paper`) also drops base's fields of that group
    (`trainer.max_steps=...`)."""
    keys = {arg.split("=", 1)[0] for arg in layer}
    groups = {key for key in keys if key in GROUPS} if drop_groups else set()
    kept = [arg for arg in base if arg.split("=", 1)[0] not in keys
            and arg.split("=", 1)[0].split(".", 1)[0] not in groups]
    return kept + list(layer)


def overrides(value, where: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, (str, int, float, bool))
                                              for v in value):
        raise ConfigError(f"{where} must be a list of key=value overrides")
    out = []
    for item in value:
        text = str(item).strip()
        key = text.split("=", 1)[0]
        if "=" not in text:
            raise ConfigError(f"{where}: expected key=value, got '{text}'")
        if key.split(".", 1)[0] not in GROUPS:
            raise ConfigError(f"{where}: '{text}': a selector names task, model and trainer keys "
                              "only (records of every seed are pooled)")
        out.append(text)
    return out


def parse_metric(metric, where: str) -> tuple[list[str], str | None]:
    if not isinstance(metric, str) or not PATH.match(metric.strip()):
        raise ConfigError(f"{where}: metric '{metric}' is not a path like metrics.gap.gd1, "
                          "per_position.accuracy.model[200:] or metrics.task.x[-1]")
    found = PATH.match(metric.strip())
    parts = found.group("path").split(".")
    if parts[0] not in METRIC_ROOTS:
        raise ConfigError(f"{where}: unknown metric path '{metric}': it must start with one of "
                          f"{', '.join(METRIC_ROOTS)}")
    return parts, found.group("index")


@functools.lru_cache(maxsize=None)
def composed(selector: tuple[str, ...]) -> RunConfig:
    """The run configuration a selector (or a suite entry) composes to, without the hardware
    checks; cached: many quantities share one selector."""
    return compose(list(selector), check=False)


def make_quantity(name: str, spec, base: list[str], layer: list[str], claim: str) -> Quantity:
    where = f"{claim}, quantity {name}"
    if not name.isidentifier() or keyword.iskeyword(name) or name in FUNCTIONS:
        raise ConfigError(f"{where}: a quantity name must be an identifier other than "
                          "abs/min/max and Python keywords")
    if not isinstance(spec, dict):
        raise ConfigError(f"{where}: expected a mapping with where, metric (and suite)")
    unknown = set(spec) - QUANTITY_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown key '{sorted(unknown)[0]}'; valid keys: "
                          f"{', '.join(sorted(QUANTITY_KEYS))}")
    selector = merge(merge(base, overrides(spec.get("where"), f"{where}: where")), layer,
                     drop_groups=True)
    metric = spec.get("metric", DEFAULT_METRIC)
    path, index = parse_metric(metric, where)
    suite = spec.get("suite")
    if suite is not None and str(suite) not in choices("suite"):
        raise ConfigError(f"{where}: unknown suite '{suite}'; suites: "
                          f"{', '.join(choices('suite'))}")
    try:
        config = composed(tuple(selector))
    except ConfigError as error:
        raise ConfigError(f"{where}: {error}") from None
    return Quantity(name, selector, metric.strip(), str(suite) if suite else None, config, path,
                    index)


def check_command(command, where: str) -> str:
    """A reproducing command: `python -m bench <command> ...`; a suite must exist, the overrides
    of run/references/speed must compose (tests/test_claims.py also composes every entry of the
    suites the shipped claims name)."""
    from bench.__main__ import COMMANDS
    if not isinstance(command, str):
        raise ConfigError(f"{where}: command must be a string")
    try:
        words = shlex.split(command)
    except ValueError as error:
        raise ConfigError(f"{where}: command '{command}': {error}") from None
    if words[:3] != ["python", "-m", "bench"] or len(words) < 4 or words[3] not in COMMANDS:
        raise ConfigError(f"{where}: command '{command}' must be python -m bench <command> with "
                          f"a command of {', '.join(COMMANDS)}")
    args = words[4:]
    if words[3] == "suite":
        names = [a.split("=", 1)[1] for a in args if a.startswith("name=")]
        if len(names) != 1 or names[0] not in choices("suite"):
            raise ConfigError(f"{where}: command '{command}' names no existing suite; suites: "
                              f"{', '.join(choices('suite'))}")
    elif words[3] in ("run", "references", "speed"):
        options = ("n=", "steps=", "kernels=", "precisions=", "compile=", "out=")
        try:
            compose([a for a in args if not a.startswith(options)], check=False)
        except ConfigError as error:
            raise ConfigError(f"{where}: command '{command}': {error}") from None
    return command


def load_claims(rules: str | Path | None = None) -> list[Claim]:
    """Every claim of the rules file or of the *.yaml files of the rules folder (default
    conf/claims/), validated: any problem is a ConfigError naming the file and the claim."""
    path = Path(rules) if rules else default_rules()
    if path.is_dir():
        files = sorted(path.glob("*.yaml"))
        if not files:
            raise ConfigError(f"rules folder '{path}' holds no *.yaml file")
    elif path.is_file():
        files = [path]
    else:
        raise ConfigError(f"rules '{path}' does not exist")
    claims, seen = [], {}
    for file in files:
        try:
            data = yaml.safe_load(file.read_text())
        except yaml.YAMLError as error:
            mark = getattr(error, "problem_mark", None)
            at = f" (line {mark.line + 1})" if mark is not None else ""
            raise ConfigError(f"{file}: not valid YAML{at}: "
                              f"{getattr(error, 'problem', None) or 'parse error'}") from None
        if not isinstance(data, dict) or not isinstance(data.get("claims"), list):
            raise ConfigError(f"{file}: must hold paper: <id> and claims: <list of claims>")
        paper = str(data.get("paper", ""))
        if paper not in PAPERS:
            raise ConfigError(f"{file}: paper must be one of {', '.join(PAPERS)}, got '{paper}'")
        for i, spec in enumerate(data["claims"], 1):
            claim = parse_claim(spec, paper, f"{file.name}: claim {i}")
            if claim.id in seen:
                raise ConfigError(f"{file.name}: claim id '{claim.id}' also in {seen[claim.id]}")
            seen[claim.id] = file.name
            claim.source = file.name
            claims.append(claim)
    return claims


def parse_claim(spec, paper: str, where: str) -> Claim:
    if not isinstance(spec, dict):
        raise ConfigError(f"{where}: expected a mapping")
    if isinstance(spec.get("id"), str):
        where = f"{where.split(':')[0]}: claim {spec['id']}"
    missing = [key for key in REQUIRED if key not in spec]
    if missing:
        raise ConfigError(f"{where}: missing {', '.join(missing)}")
    unknown = set(spec) - CLAIM_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown key '{sorted(unknown)[0]}'; valid keys: "
                          f"{', '.join(sorted(CLAIM_KEYS))}")
    for key in ("id", "section", "claim", "paper_number", "rule"):
        if not isinstance(spec[key], str) or not spec[key].strip():
            raise ConfigError(f"{where}: {key} must be a non-empty string")
    if spec["scale"] not in SCALES:
        raise ConfigError(f"{where}: scale must be one of {', '.join(SCALES)}, got "
                          f"'{spec['scale']}'")
    measure = spec["measure"]
    if not isinstance(measure, dict) or not measure:
        raise ConfigError(f"{where}: measure must map quantity names to selectors")
    base = overrides(spec.get("where"), f"{where}: where")
    quantities = {str(name): make_quantity(str(name), q, base, [], where)
                  for name, q in measure.items()}
    paper_quantities = None
    if spec.get("paper_scale") is not None:
        if spec["scale"] != "cpu":
            raise ConfigError(f"{where}: paper_scale only goes with scale: cpu")
        layer = overrides(spec["paper_scale"], f"{where}: paper_scale")
        paper_quantities = {str(name): make_quantity(str(name), q, base, layer, where)
                            for name, q in measure.items()}
    rule = Rule(spec["rule"], quantities, where)
    commands = spec["command"] if isinstance(spec["command"], list) else [spec["command"]]
    commands = [check_command(c, where) for c in commands]
    for key in ("gpu",):
        if key in spec and not isinstance(spec[key], bool):
            raise ConfigError(f"{where}: {key} must be true or false")
    for key in ("needs", "contradicts_paper"):
        if spec.get(key) is not None and (not isinstance(spec[key], str) or not spec[key].strip()):
            raise ConfigError(f"{where}: {key} must be a non-empty string")
    return Claim(id=spec["id"].strip(), paper=paper, section=spec["section"].strip(),
                 text=" ".join(spec["claim"].split()),
                 paper_number=" ".join(spec["paper_number"].split()),
                 quantities=quantities, paper_quantities=paper_quantities, rule=rule,
                 scale=spec["scale"], commands=commands, gpu=bool(spec.get("gpu", False)),
                 needs=" ".join(spec["needs"].split()) if spec.get("needs") else None,
                 contradicts=(" ".join(spec["contradicts_paper"].split())
                              if spec.get("contradicts_paper") else None))


# ---------------------------------------------------------------- records → quantities

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
        if index == "last":
            present = [v for v in items if v is not None]
            if not present:
                raise MetricMissing(f"'{quantity.metric}' has no number")
            return present[-1], None
        if ":" in index:
            lo, hi = (int(x) if x else None for x in index.split(":"))
            chosen = [v for v in items[lo:hi] if v is not None]
            if not chosen:
                raise MetricMissing(f"'{quantity.metric}' selects no number")
            return sum(chosen) / len(chosen), None
        i = int(index)
        if not -len(items) <= i < len(items) or items[i] is None:
            raise MetricMissing(f"'{quantity.metric}': no number at index {i} of {len(items)}")
        parent = lookup(record, keys[:-2] + [keys[-2] + "_stderr", keys[-1]]) \
            if len(keys) >= 2 else None
        if parent is not None and isinstance(parent[0], list) and len(parent[0]) == len(items):
            se = number(parent[0][i])
            if se is not None and math.isfinite(se):
                interval = (items[i] - 1.96 * se, items[i] + 1.96 * se)
        return items[i], interval
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


def pick(quantity: Quantity, rows: list[list[dict]]) -> list[dict] | None:
    """The records of quantity among rows: of the rows (each one code version in one
    environment) matching its selector (and suite), the newest; None when no record matches."""
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
    return max(matching, key=lambda row: max(r["_age"] for r in row))


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


def measure(quantity: Quantity, row: list[dict], claim: str) -> Measured:
    """The quantity pooled over the seeds of row (one code version in one environment)."""
    try:
        read = [read_metric(record, quantity) for record in row]
    except MetricMissing as error:
        raise ConfigError(f"claim {claim}, quantity {quantity.name}: unknown metric path: "
                          f"{error}") from None
    values = [v for v, _ in read]
    mean, half = across_seeds(values)
    if half is not None:
        interval = (mean - half, mean + half)
    else:
        interval = read[0][1]
    return Measured(mean, interval, sorted(r["seed"] for r in row),
                    code_label(*commit_of(row[-1])), half is not None, environment(row[0]).kernel)


@dataclass
class Decision:
    claim: Claim
    verdict: str
    scale: str | None = None  # the scale of the records used: paper or cpu
    values: dict[str, Measured] = field(default_factory=dict)
    machine: Environment | None = None  # where the records used ran
    missing: list[str] = field(default_factory=list)
    note: str = ""


def rows_of(selection: Selection) -> list[list[dict]]:
    return [runs for section in selection.sections for runs in section.rows.values()]


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
    values = {name: measure(quantities[name], found[name], claim.id)
              for name in quantities if name in found}
    if missing:
        note = "needs a GPU" if claim.gpu else ""
        return Decision(claim, "not measured", missing=missing, note=note, values=values,
                        machine=machine)
    bad = [name for name in claim.rule.used if not math.isfinite(values[name].value)]
    if bad:
        return Decision(claim, "fails", scale, values, machine,
                        note=f"not a finite number: {', '.join(bad)}")
    try:
        ok = claim.rule.evaluate({name: m.value for name, m in values.items()})
    except RuleUndefined as error:
        return Decision(claim, "fails", scale, values, machine, note=f"rule undefined: {error}")
    verdict = ("holds" if scale == "paper" else "holds at CPU scale only") if ok else "fails"
    return Decision(claim, verdict, scale, values, machine)


def decide_all(claims: list[Claim], selection: Selection) -> list[Decision]:
    rows = rows_of(selection)
    return [decide(claim, rows) for claim in claims]


# ---------------------------------------------------------------- claims.md

def num(x: float, like: float | None = None) -> str:
    """Four significant digits (of `like`, when given: an interval's ends follow its value)."""
    if x is None or not math.isfinite(x):
        return str(x)
    ref = abs(like if like is not None and like != 0 else x)
    if ref == 0:
        return "0"
    if ref < 1e-4 or ref >= 1e6:
        return f"{x:.3g}"
    decimals = max(0, 3 - math.floor(math.log10(ref)))
    return f"{x:.{decimals}f}"


def seeds_text(seeds: list[int]) -> str:
    if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"seeds {seeds[0]}–{seeds[-1]}"
    return ("seed " if len(seeds) == 1 else "seeds ") + ", ".join(map(str, seeds))


def measured_text(name: str, m: Measured) -> str:
    ci = ""
    if m.interval is not None and m.interval[0] != m.interval[1]:
        ci = f" [{num(m.interval[0], m.value)}, {num(m.interval[1], m.value)}]"
    return f"`{name}` = {num(m.value)}{ci} ({seeds_text(m.seeds)})"


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def why_not(decision: Decision) -> str:
    """Why a claim is not measured: the protocol it needs, or the quantities without records."""
    if decision.claim.needs:
        return decision.note
    return ("no record of " + ", ".join(f"`{n}`" for n in decision.missing)
            + (f" — {decision.note}" if decision.note else ""))


def ours_cell(decision: Decision) -> str:
    """Our numbers, the scale and code version they come from, and where they ran (machine and
    SSD kernel) unless on the CPU."""
    parts = [measured_text(name, decision.values[name]) for name in decision.claim.quantities
             if name in decision.values]
    machine, ran = decision.machine, []
    if machine is not None and not machine.default and parts:
        kernels = sorted({m.kernel for m in decision.values.values()} - {None})
        ran = [f"trained on [{machine.name}]"
               + (f" with SSD kernel {', '.join(kernels)}" if kernels else "")]
    if decision.verdict == "not measured":
        return "<br>".join([f"*not measured: {why_not(decision)}*", *parts,
                            *(f"*{text}*" for text in ran)])
    codes = sorted({m.code for m in decision.values.values()})
    scale = "paper scale" if decision.scale == "paper" else "CPU scale"
    tail = f"*{', '.join([scale, 'code ' + ', '.join(codes), *ran])}*" + (
        f"; {decision.note}" if decision.note else "")
    return "<br>".join([*parts, tail])


def header(selection: Selection, rules: Path, claims: list[Claim],
           decisions: list[Decision]) -> list[str]:
    counts = {v: sum(d.verdict == v for d in decisions) for v in VERDICTS}
    command = f"python -m bench claims out_dir={selection.out_dir}" + (
        " include=all" if selection.include == "all" else "")
    scope = "suite and ad-hoc records" if selection.include == "all" else "suite records only"
    files = sorted({c.source for c in claims})
    where = rules.as_posix() if not rules.is_absolute() else rules.name
    notes = selection.notes()
    return ["# Claims", "",
            f"Generated by `{command}` from {plural(selection.runs, 'run')} ({scope}"
            + "".join(f"; {n}" for n in notes) + f") with the rules in `{where}` "
            f"({', '.join(files)}): **{plural(len(decisions), 'claim')}** — "
            + ", ".join(f"{counts[v]} {v}" for v in VERDICTS) + ".", "",
            "Each claim of the three papers is one row: where the paper makes it, the claim in a "
            "sentence, the paper's number, our number(s), the verdict, the rule that decided it "
            "and the command that produces its records. A rule is a boolean expression over the "
            "claim's quantities; each quantity is a record selector (overrides as on the command "
            "line, composed like a run; a record matches when its task, model and trainer "
            "configs equal them) and a metric path. Records are pooled as on the leaderboard: "
            "one environment (device, SSD kernel, precision, compile, TF32), one code version "
            "(the newest that ran the config), each seed once, and all quantities of a claim from "
            "one machine (device and TF32: CPU and GPU runs are never compared or pooled; the "
            "machine where most quantities have records, then the most seeds, then the newest; "
            "named in the row unless the CPU); several seeds "
            "show the mean and a 95% t-interval across seeds, one seed its record's bootstrap "
            "interval (or ±1.96 standard errors; per-position slices have none). Rules use the "
            "means.", "",
            "Verdicts: **holds** — the rule holds on records at the paper's scale (or the claim "
            "does not depend on scale, e.g. a property of the task's references); **holds at "
            "CPU scale only** — the rule holds, but on CPU-sized runs of a claim the paper made "
            "at GPU scale; **fails** — records exist and the rule does not hold (numbers shown); "
            "**not measured** — a quantity has no record yet (the row says which and what to "
            "run; *needs a GPU* where it cannot run on a CPU), or the claim needs a protocol "
            "the code does not have yet.", ""]


def paper_titles(rules: Path) -> dict[str, str]:
    titles = {}
    for file in (sorted(rules.glob("*.yaml")) if rules.is_dir() else [rules]):
        data = yaml.safe_load(file.read_text()) or {}
        if isinstance(data, dict) and data.get("title"):
            titles[str(data.get("paper"))] = str(data["title"])
    return titles


def evidence(decision: Decision) -> str:
    claim = decision.claim
    numbers = "; ".join(measured_text(n, decision.values[n]) for n in claim.quantities
                        if n in decision.values)
    measured = (f" Measured ({decision.verdict}, rule `{claim.rule.text}`): {numbers}."
                if decision.verdict != "not measured"
                else f" From records: not measured yet ({why_not(decision)}).")
    return f"- **{claim.id}** ({claim.section}): {claim.contradicts}{measured}"


def same_run(a: RunConfig, b: RunConfig) -> bool:
    """Whether two configurations would make records that pool (seed aside)."""
    return (a.task_name == b.task_name and a.model_name == b.model_name
            and dataclasses.asdict(a.task) == dataclasses.asdict(b.task)
            and dataclasses.asdict(a.model) == dataclasses.asdict(b.model)
            and {k: v for k, v in dataclasses.asdict(a.trainer).items() if k not in RESULT_NEUTRAL}
            == {k: v for k, v in dataclasses.asdict(b.trainer).items() if k not in RESULT_NEUTRAL})


@functools.lru_cache(maxsize=None)
def suite_configs(name: str) -> list[RunConfig]:
    return [composed(tuple(entry)) for entry in load_suite(name)]


def producing(command: str, quantity: Quantity) -> bool:
    """Whether command (a suite) has an entry that makes records of quantity; a command that is
    not a suite is taken at its word."""
    words = shlex.split(command)
    if words[3] != "suite":
        return True
    name = next(a.split("=", 1)[1] for a in words[4:] if a.startswith("name="))
    return any(same_run(config, quantity.config) for config in suite_configs(name))


def commands_for(decision: Decision) -> list[str]:
    """The claim's commands that would make its missing records (all of them for a claim that
    needs a protocol first, or when none is found to match)."""
    claim = decision.claim
    if claim.needs or not decision.missing:
        return claim.commands
    found = [c for c in claim.commands
             if any(producing(c, claim.quantities[name]) for name in decision.missing)]
    return found or claim.commands


def to_measure(decisions: list[Decision]) -> list[str]:
    """The commands that would decide the claims not measured yet, with the suite's header."""
    by_command: dict[str, list[Decision]] = {}
    for d in decisions:
        if d.verdict == "not measured":
            for command in commands_for(d):
                by_command.setdefault(command, []).append(d)
    if not by_command:
        return []
    lines = ["## To measure the rest", "",
             "| command | claims | runs on | what it is |", "|---|---|---|---|"]
    for command, ds in sorted(by_command.items()):
        words = shlex.split(command)
        about = ""
        if words[3] == "suite":
            name = next(a.split("=", 1)[1] for a in words[4:] if a.startswith("name="))
            first = (CONF_DIR / "suite" / f"{name}.yaml").read_text().splitlines()
            about = " ".join(l.lstrip("# ").strip() for l in first[:2] if l.startswith("#"))
        gpu = any(d.claim.gpu for d in ds)
        blocked = [d.claim.id for d in ds if d.claim.needs]
        where = "a GPU" if gpu else "a CPU"
        if blocked:
            where += f" ({', '.join(blocked)}: not before the protocol it needs exists)"
        lines.append(f"| `{command}` | {', '.join(d.claim.id for d in ds)} | {where} | "
                     f"{cell(about)} |")
    return lines + [""]


def render(selection: Selection, rules: Path, claims: list[Claim],
           decisions: list[Decision]) -> str:
    lines = header(selection, rules, claims, decisions)
    titles = paper_titles(rules)
    for paper in PAPERS:
        ds = [d for d in decisions if d.claim.paper == paper]
        if not ds:
            continue
        counts = ", ".join(f"{n} {v}" for v in VERDICTS
                           if (n := sum(d.verdict == v for d in ds)))
        lines += [f"## {paper} — {titles.get(paper, 'paper ' + paper)}", "",
                  f"{plural(len(ds), 'claim')}: {counts}.", "",
                  "| id | section | claim | paper | ours | verdict | rule | reproduce |",
                  "|---|---|---|---|---|---|---|---|"]
        for d in ds:
            c = d.claim
            verdict = f"**{d.verdict}**" if d.verdict in ("fails",) else d.verdict
            commands = "<br>".join(f"`{x}`" for x in c.commands)
            lines.append("| " + " | ".join(cell(x) for x in (
                c.id, c.section, c.text, c.paper_number, ours_cell(d), verdict,
                f"`{c.rule.text}`", commands)) + " |")
        # the evidence stands beside a claim the records contradict, or one not measured yet
        # (its note then says where its numbers come from); a claim that now holds drops it
        against = [d for d in ds if d.claim.contradicts and d.verdict in ("fails", "not measured")]
        if against:
            lines += ["", "**Evidence against the paper**", ""]
            lines += [evidence(d) for d in against]
        lines.append("")
    return "\n".join(lines + to_measure(decisions))


def write_claims(selection: Selection, out: str = "claims.md", rules: str | Path | None = None,
                 claims: list[Claim] | None = None) -> tuple[Path, list[Decision]]:
    """Decide every claim from selection's records and write out atomically; refuse, leaving
    out as it was, when the rules are bad, no record is usable or out cannot be written."""
    out_path = output_path(out)
    rules_path = Path(rules) if rules else default_rules()
    claims = load_claims(rules_path) if claims is None else claims
    if not selection.runs:
        notes = selection.notes()
        why = f" ({'; '.join(notes)})" if notes else f" in {selection.out_dir.rstrip('/')}/"
        raise ConfigError(f"no usable run record{why}; {out} not written")
    decisions = decide_all(claims, selection)
    shown = rules_path
    try:
        shown = rules_path.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        pass
    text = render(selection, shown, claims, decisions)
    write_atomic(out_path, lambda tmp: Path(tmp).write_text(text))
    return out_path, decisions
