"""The claims files: conf/papers/<paper>/claims.yaml, one entry per claim of a paper (the paper's
suites beside it, in suites/), validated when
loaded (any problem is a ConfigError naming the file and the claim).

A claim: `id`, `section`, `claim` (one sentence), `quote` (the paper's own words), `paper_number`,
`measure` (quantity name -> {where: overrides selecting records, metric: path into the record
(default metrics.bayes_gap), suite: origin, range: [lo, hi] the metric's possible values,
exact: true for a number without sampling noise, which is compared as a point where its records
give it no interval; any other quantity without one leaves its comparisons undecided}),
`where` (overrides shared by every quantity), `rule` (what the paper says, as an expression over
the quantities), `control` (what must have held for the evidence to count: a positive control
that trained under the same protocol, e.g. "the 2-layer transformer learns"), `kind`: `trained`
(the default: a comparison or a negative claim about trained models; it needs a control),
`attainment` (a model reaches a level: at reduced scale not reaching it is no evidence — the
model is its own control), `reference` (a property of the task's references: no training) or
`construction` (a model with constructed parameters equals a predictor),
`scale` (paper | cpu: our runs are reduced versions of a claim made at GPU scale), `paper_scale`
(overrides selecting paper-scale records instead, once they exist), `command` (what makes the
records), `gpu`, `needs` (a protocol the code lacks), `contradicts_paper` (the evidence, said
plainly), `separable` (what the task must leave room for, as an expression like the rule's:
e.g. that the most in-context inference can gain on it, Bayes over the clairvoyant bound, is at
least the margin the rule asks; where it is decidedly false the verdict is "task cannot
separate", whatever the models did), `extension: true` for a claim the paper does not make (the suite's own, shown apart),
`per_seed: true` for a claim about each trained model (judged seed by seed: "k of n seeds"), and
`control_seed: <quantity>` (or a list of them) to judge the control on one seed of each: the one
whose run of that quantity ended with the lowest training loss. A positive control asks whether
the protocol can train the model at all, which one seed shows where a mean over seeds that
sometimes stall would not; the seed is chosen from the training curves, never the held-out
sequences, so its held-out interval keeps its level. Such a quantity may not appear in the rule,
which reads every seed (a comparison with a model whose seeds stall would be trivial).
`judge_seed: <quantity>` (or a list) does the same for a claim about whether the protocol trains
a model to a level, where its seeds split (some stall, some learn: a mean describes neither
group): the whole claim is judged on the seed whose run of that quantity (of any listed: the
best of a grid of widths) ended with the lowest training loss, every quantity read on that seed.
For an `attainment` (the model reaches the level), one run that gets there shows that the
protocol can; at reduced scale a seed that did not get there is no evidence against it. For a
`trained` claim that a model does not reach a level (each judged quantity compared with
references alone, joined by `and`; its control may read its own seed, `control_seed`), the
run that trained best is the one that could refute it: a mean over seeds could say "stays at
the level" while one seed left it. The row still gives every seed's verdict.
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import json
import keyword
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import yaml

from bench.config import CONF_DIR, GROUPS, ConfigError, RunConfig, choices, compose, load_yaml_text
from bench.config.commands import COMMANDS
from bench.records.store import RESULT_NEUTRAL
from bench.reports.claims.rules import FUNCTIONS, Rule

SCALES = ("paper", "cpu")
KINDS = ("trained", "attainment", "reference", "construction")
PAPERS = ("000", "002", "004")
METRIC_ROOTS = ("metrics", "per_position", "params", "state_size", "train", "eval")
CLAIM_KEYS = {"id", "section", "claim", "quote", "paper_number", "measure", "where", "rule",
              "control", "kind", "scale", "paper_scale", "command", "gpu", "needs",
              "contradicts_paper", "extension", "per_seed", "separable", "control_seed",
              "judge_seed"}
FILE_KEYS = {"paper", "title", "claims"}  # a rules file's top level
REQUIRED = ("id", "section", "claim", "paper_number", "measure", "rule", "scale", "command")
QUANTITY_KEYS = {"where", "metric", "suite", "range", "exact"}
DEFAULT_METRIC = "metrics.bayes_gap"
PATH = re.compile(r"^(?P<path>[A-Za-z_]\w*(?:\.[\w-]+)*)"  # dotted keys, then [i], [a:b] or [last]
                  r"(?:\[(?P<index>-?\d+|-?\d*:-?\d*|last)\])?$")


def default_rules() -> Path:
    return CONF_DIR / "papers"


def rules_files(path: Path) -> list[Path]:
    """The rules of a file, or of a folder: its *.yaml files and its papers' <paper>/claims.yaml."""
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise ConfigError(f"rules '{path}' does not exist")
    files = sorted(path.glob("*.yaml")) + sorted(path.glob("*/claims.yaml"))
    if not files:
        raise ConfigError(f"rules folder '{path}' holds no *.yaml or <paper>/claims.yaml file")
    return files


@dataclass
class Quantity:
    name: str
    where: list[str]
    metric: str
    suite: str | None
    config: RunConfig
    path: list[str]
    index: str | None
    range: tuple[float, float] | None = None  # the values the metric can take (a probability)
    # a number without sampling noise (a function of the trained weights alone): a point where
    # its records give no interval; a quantity that is not exact needs one to decide
    exact: bool = False


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
    control: Rule | None = None
    kind: str = "trained"
    quote: str = ""
    extension: bool = False
    gpu: bool = False
    needs: str | None = None
    contradicts: str | None = None
    source: str = ""
    per_seed: bool = False  # a claim about each trained model: judged seed by seed
    separable: Rule | None = None  # the room the task must leave for the rule to decide
    control_seed: tuple[str, ...] = ()  # judge the control on the seed each of these trained best
    judge_seed: tuple[str, ...] = ()  # judged on the seed one of these trained best


MODEL_METRICS = ("bayes_gap", "relative_gap", "l1_to_bayes", "probe", "gap_closed")


def is_reference(quantity: Quantity) -> bool:
    """Whether a quantity reads a reference's number (the same on every seed: a predictor other
    than the model, e.g. metrics.gap.unigram, per_position.loss.bayes[0])."""
    path = quantity.path
    if len(path) > 1 and path[0] == "metrics" and path[1] in MODEL_METRICS:
        return False
    return path[-1].split(".")[-1] != "model"


def compares_with_references(rule: Rule, judged, quantities: dict[str, Quantity]) -> bool:
    """Whether rule is comparisons joined by `and`, each of one judged quantity, alone on its
    side, against an expression that reads references only: a claim about each model's level
    that one seed can decide without pairing it with another trained model."""
    def fine(node) -> bool:
        if isinstance(node, ast.BoolOp):
            return isinstance(node.op, ast.And) and all(fine(v) for v in node.values)
        if not isinstance(node, ast.Compare) or len(node.ops) != 1:
            return False
        sides = (node.left, node.comparators[0])
        alone = [s for s in sides if isinstance(s, ast.Name) and s.id in judged]
        if len(alone) != 1:
            return False
        other = sides[1] if alone[0] is sides[0] else sides[0]
        return all(is_reference(quantities[n.id]) for n in ast.walk(other)
                   if isinstance(n, ast.Name) and n.id in quantities)
    return fine(rule.tree.body)


def run_key(config: RunConfig) -> str:
    """What makes records pool, seed aside: the task, the model and the trainer settings but the
    result-neutral ones. Two configs with one key make the same run."""
    trainer = {k: v for k, v in dataclasses.asdict(config.trainer).items()
               if k not in RESULT_NEUTRAL}
    return json.dumps([config.task_name, config.model_name, dataclasses.asdict(config.task),
                       dataclasses.asdict(config.model), trainer], sort_keys=True, default=str)


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
    return compose(list(selector))


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
    bounds = spec.get("range")
    if bounds is not None and not (isinstance(bounds, list) and len(bounds) == 2 and all(
            isinstance(b, (int, float)) and not isinstance(b, bool) for b in bounds)
            and bounds[0] < bounds[1]):
        raise ConfigError(f"{where}: range must be [low, high] with low < high")
    exact = spec.get("exact", False)
    if not isinstance(exact, bool):
        raise ConfigError(f"{where}: exact must be true or false")
    try:
        config = composed(tuple(selector))
    except ConfigError as error:
        raise ConfigError(f"{where}: {error}") from None
    return Quantity(name, selector, metric.strip(), str(suite) if suite else None, config, path,
                    index, tuple(float(b) for b in bounds) if bounds else None, exact)


def check_command(command, where: str) -> str:
    """A reproducing command: `python -m bench <command> ...`; a suite must exist, the overrides
    of run/references/speed must compose (tests/test_claims.py also composes every entry of the
    suites the shipped claims name)."""
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
            compose([a for a in args if not a.startswith(options)])
        except ConfigError as error:
            raise ConfigError(f"{where}: command '{command}': {error}") from None
    return command


def read_rules_text(file: Path) -> str:
    """A rules file's text, or one line naming it when it is not UTF-8."""
    try:
        return file.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"{file}: not UTF-8 text (byte {error.start}: {error.reason})") from None


def load_claims(rules: str | Path | None = None) -> list[Claim]:
    """Every claim of the rules file or folder (default conf/papers/: rules_files), validated:
    any problem is a ConfigError naming the file and the claim."""
    path = Path(rules) if rules else default_rules()
    claims, seen = [], {}
    for file in rules_files(path):
        name = file.relative_to(path).as_posix() if path.is_dir() else file.name
        try:
            data = load_yaml_text(read_rules_text(file))  # a key given twice is refused
        except yaml.YAMLError as error:
            mark = getattr(error, "problem_mark", None)
            at = f" (line {mark.line + 1})" if mark is not None else ""
            raise ConfigError(f"{file}: not valid YAML{at}: "
                              f"{getattr(error, 'problem', None) or 'parse error'}") from None
        if not isinstance(data, dict) or not isinstance(data.get("claims"), list):
            raise ConfigError(f"{file}: must hold paper: <id> and claims: <list of claims>")
        unknown = sorted(map(str, set(data) - FILE_KEYS))
        if unknown:  # a misspelt key would be dropped unread
            raise ConfigError(f"{file}: unknown key '{unknown[0]}'; valid keys: "
                              f"{', '.join(sorted(FILE_KEYS))}")
        if "title" in data and (not isinstance(data["title"], str) or not data["title"].strip()):
            raise ConfigError(f"{file}: title must be a non-empty string")
        paper = str(data.get("paper", ""))
        if paper not in PAPERS:
            raise ConfigError(f"{file}: paper must be one of {', '.join(PAPERS)}, got '{paper}'")
        if file.name == "claims.yaml" and file.parent.name != paper:
            raise ConfigError(f"{file}: paper '{paper}' in the folder of paper "
                              f"'{file.parent.name}'")
        for i, spec in enumerate(data["claims"], 1):
            claim = parse_claim(spec, paper, f"{name}: claim {i}")
            if claim.id in seen:
                raise ConfigError(f"{name}: claim id '{claim.id}' also in {seen[claim.id]}")
            seen[claim.id] = name
            claim.source = name
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
    kind = spec.get("kind", "trained")
    if kind not in KINDS:
        raise ConfigError(f"{where}: kind must be one of {', '.join(KINDS)}, got '{kind}'")
    if kind == "trained" and not spec.get("needs") and not isinstance(spec.get("control"), str):
        raise ConfigError(f"{where}: a claim about trained models needs a control: what must "
                          "have held (a positive control trained under the same protocol) for "
                          "its evidence to count")
    for key in ("needs", "contradicts_paper", "quote", "control", "separable"):  # never str()
        if spec.get(key) is not None and (not isinstance(spec[key], str) or not spec[key].strip()):
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
    control = Rule(spec["control"], quantities, f"{where}: control") \
        if spec.get("control") is not None else None
    separable = Rule(spec["separable"], quantities, f"{where}: separable") \
        if spec.get("separable") is not None else None
    commands = spec["command"] if isinstance(spec["command"], list) else [spec["command"]]
    commands = [check_command(c, where) for c in commands]
    control_seed = spec.get("control_seed", [])
    control_seed = control_seed if isinstance(control_seed, list) else [control_seed]
    if control_seed:
        if control is None or spec.get("per_seed"):
            raise ConfigError(f"{where}: control_seed needs a control, and a claim judged on "
                              "every seed (per_seed) has no seed to choose")
        for name in control_seed:
            if name not in control.used or is_reference(quantities[name]) or name in rule.used:
                raise ConfigError(f"{where}: control_seed must name a trained model's quantity "
                                  f"of the control ({', '.join(control.used)}) that the rule "
                                  f"does not read, got '{name}'")
    judge_seed = spec.get("judge_seed", [])
    judge_seed = judge_seed if isinstance(judge_seed, list) else [judge_seed]
    if judge_seed:
        if spec.get("per_seed") or (kind == "attainment" and control_seed) \
                or kind not in ("attainment", "trained"):
            raise ConfigError(f"{where}: judge_seed is for an attainment, or a trained claim that "
                              "a model does not reach a level, judged on one seed: not with "
                              "per_seed, nor an attainment's control_seed")
        for name in judge_seed:
            if name not in rule.used or is_reference(quantities[name]) or name in control_seed:
                raise ConfigError(f"{where}: judge_seed must name a trained model's quantity of the "
                                  f"rule ({', '.join(rule.used)}), got '{name}'")
        if kind == "trained" and not compares_with_references(rule, judge_seed, quantities):
            raise ConfigError(f"{where}: judge_seed on a trained claim is for a model that does not "
                              "reach a level: each comparison of its rule sets one judged "
                              "quantity against references alone, joined by and "
                              f"(`m >= 0.9 * zero`), got `{rule.text}`")
    for key in ("gpu", "extension", "per_seed"):
        if key in spec and not isinstance(spec[key], bool):
            raise ConfigError(f"{where}: {key} must be true or false")
    return Claim(id=spec["id"].strip(), paper=paper, section=spec["section"].strip(),
                 text=" ".join(spec["claim"].split()),
                 paper_number=" ".join(spec["paper_number"].split()),
                 quantities=quantities, paper_quantities=paper_quantities, rule=rule,
                 scale=spec["scale"], commands=commands, control=control, kind=kind,
                 quote=" ".join(str(spec.get("quote", "")).split()),
                 extension=bool(spec.get("extension", False)), gpu=bool(spec.get("gpu", False)),
                 per_seed=bool(spec.get("per_seed", False)), separable=separable,
                 control_seed=tuple(control_seed), judge_seed=tuple(judge_seed),
                 needs=" ".join(spec["needs"].split()) if spec.get("needs") else None,
                 contradicts=(" ".join(spec["contradicts_paper"].split())
                              if spec.get("contradicts_paper") else None))


