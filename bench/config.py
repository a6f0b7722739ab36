"""Compose a run configuration from conf/ and Hydra-style `key=value` overrides.

    task=<name> model=<name> trainer=<name>   pick a file of the group (conf/<group>/<name>.yaml)
    task.<field>=<v> model.<field>=<v> ...     override a field of the chosen file
    seed=<int> out_dir=<path> ...              top-level keys of conf/config.yaml

Each group file is validated against a typed dataclass (the task or model family's `Config`,
or `TrainerConfig`): unknown keys and wrongly typed values are errors, never dropped. Every
error is a `ConfigError` whose message is one line naming the valid choices."""
from __future__ import annotations

import dataclasses
import os
import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

def _find_conf() -> Path:
    """A non-editable install carries conf/ as bench/conf (pyproject.toml); a checkout (and an
    editable install) has it at the top of the repository."""
    here = Path(__file__).resolve()
    installed = here.parent / "conf"
    return installed if installed.is_dir() else here.parents[1] / "conf"


CONF_DIR = _find_conf()
GROUPS = ("task", "model", "trainer")
BOOLEANS = ("true", "false", "yes", "no", "on", "off", "1", "0")
# The values TrainerConfig accepts (bench/checks.py checks what this machine can do with them).
ACCELERATORS = ("auto", "cpu", "gpu", "cuda")
STRATEGIES = ("auto", "ddp", "ddp_spawn", "ddp_find_unused_parameters_true")
PROCESS_GROUP_BACKENDS = ("auto", "nccl", "gloo")
PRECISIONS = ("32-true", "32", "bf16-mixed", "16-mixed", "64-true", "64")
LOGGERS = ("csv", "tensorboard", "wandb", "none")
MAX_RUNS = 1000  # a suite or sweep's most runs: refused before a single entry is composed
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # a field of a task, model or trainer config
# YAML syntax a value read as YAML (a task/model/trainer field) may not use: each means something
# other than the text written (a reference, a type, another document), never a value of ours.
YAML_SYNTAX = {yaml.AnchorToken: "a YAML anchor (&)", yaml.AliasToken: "a YAML alias (*)",
               yaml.TagToken: "a YAML tag (!)", yaml.DirectiveToken: "a YAML directive (%)",
               yaml.DocumentStartToken: "a YAML document marker (---)",
               yaml.DocumentEndToken: "a YAML document marker (...)"}
# What file systems allow when os.pathconf cannot say (Linux's NAME_MAX and PATH_MAX)
NAME_MAX, PATH_MAX = 255, 4096


class ConfigError(ValueError):
    """A user error in the configuration; its message is one line."""


class CheckFailed(ValueError):
    """A whole-run check failed; the message is one line (compose_checked turns it into
    a ConfigError)."""


def first_line(error: BaseException) -> str:
    """The first line of an error's message ("" when it has none): messages here are one line."""
    text = str(error)
    return text.splitlines()[0] if text.strip() else ""


def shown(text: str, limit: int = 80) -> str:
    """text as a message quotes it: at most `limit` characters, saying how long it was if cut."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


class UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader refusing a key given twice in one mapping: PyYAML's own loaders keep the
    last silently (a suite file with `runs:` twice would drop the first list)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<:` merges, it is no key
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node.start_mark.line)
                except TypeError:  # an unhashable key: the base class says so
                    continue
                if first != key_node.start_mark.line:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"the key '{key}' is given twice (lines {first + 1} and "
                        f"{key_node.start_mark.line + 1})", key_node.start_mark)
        return super().construct_mapping(node, deep)


def load_yaml_text(text: str):
    """A YAML document a user wrote (conf/ files, suite files, claims rules): safe types only,
    no key twice in a mapping. Raises yaml.YAMLError."""
    return yaml.load(text, Loader=UniqueKeyLoader)


def yaml_problem(error: yaml.YAMLError) -> str:
    """' (line N): what is wrong' for a message about a YAML file."""
    mark = getattr(error, "problem_mark", None)
    where = f" (line {mark.line + 1})" if mark is not None else ""
    return f"{where}: {getattr(error, 'problem', None) or first_line(error) or 'parse error'}"


def check_path(option: str, path: str, folder: bool = False) -> None:
    """A path option the file system can take: no NUL byte, no name over NAME_MAX bytes and the
    whole (absolute) path under PATH_MAX, as os.pathconf says for the nearest existing folder;
    otherwise every use fails later with OSError ENAMETOOLONG. `folder`: the path names one."""
    encoded = os.fsencode(path)
    if b"\0" in encoded:
        raise ConfigError(f"{option}: the path holds a NUL byte")
    try:
        absolute = os.path.abspath(path)
    except OSError:  # the working directory is gone
        absolute = path
    existing = os.path.dirname(absolute) or "."
    while existing and not os.path.isdir(existing) and os.path.dirname(existing) != existing:
        existing = os.path.dirname(existing)
    limits = []
    for name, default in (("PC_NAME_MAX", NAME_MAX), ("PC_PATH_MAX", PATH_MAX)):
        try:
            limits.append(os.pathconf(existing, name) or default)
        except (OSError, ValueError, AttributeError):  # no pathconf here, or no such name
            limits.append(default)
    name_max, path_max = limits
    parts = Path(path).parts
    for i, part in enumerate(parts):
        if len(os.fsencode(part)) > name_max:
            kind = "folder" if folder or i < len(parts) - 1 else "file"
            raise ConfigError(f"{option}={shown(path, 60)}: a {kind} name of "
                              f"{len(os.fsencode(part))} bytes; file systems allow {name_max}")
    if len(os.fsencode(absolute)) >= path_max:
        raise ConfigError(f"{option}={shown(path, 60)}: a path of {len(os.fsencode(absolute))} "
                          f"bytes; file systems allow {path_max - 1}")


def check_override(arg: str) -> tuple[str, str]:
    """One `key=value` of a command line, suite file or selector, before anything reads it:
    UTF-8 text of one line, a well-formed key, and for a task/model/trainer field a value whose
    YAML is closed and plain (check_value). Returns (key, value)."""
    if "=" not in arg:
        raise ConfigError(f"expected key=value, got {shown(arg)!r}")
    try:
        arg.encode("utf-8")
    except UnicodeEncodeError:  # bytes the shell could not decode arrive as lone surrogates
        raise ConfigError(f"override {shown(arg)!r} is not UTF-8 text") from None
    control = next((c for c in arg if unicodedata.category(c) == "Cc"), None)
    if control is not None:  # a NUL, newline or tab: YAML and the file system read them apart
        raise ConfigError(f"override {shown(arg)!r} holds the control character "
                          f"U+{ord(control):04X}; an override is one line of text")
    key, value = arg.split("=", 1)
    if not key or key.startswith(".") or key.endswith(".") or ".." in key or " " in key:
        raise ConfigError(f"malformed key '{shown(key)}' in '{shown(arg)}'; keys look like "
                          "task, task.<field>, seed")
    head, _, rest = key.partition(".")
    if head in GROUPS and rest:
        check_value(key, value)
    return key, value


def check_value(key: str, value: str) -> None:
    """A task/model/trainer field's value is read as YAML (OmegaConf.from_dotlist): plain text,
    'quoted text' or a [a, b] list, whole. Refused: what YAML cannot parse (an unclosed bracket,
    brace or quote), YAML's anchors, aliases, tags, directives and document markers, a `# comment`
    (YAML drops it silently) and ${...}, which OmegaConf would resolve (another key, an
    environment variable) instead of taking the value as written."""
    if "${" in value:
        raise ConfigError(f"{key}={shown(value)}: an interpolation (${{...}}) is not a value; "
                          "write the value itself")
    try:
        tokens = list(yaml.scan(value, Loader=yaml.SafeLoader))
        for _ in yaml.parse(value, Loader=yaml.SafeLoader):
            pass
    except yaml.YAMLError as error:
        problem = getattr(error, "problem", None) or first_line(error) or type(error).__name__
        raise ConfigError(f"{key}={shown(value)}: malformed value ({problem}); a value is plain "
                          "text, 'quoted text' or a list like [1, 2], its brackets and quotes "
                          "closed") from None
    what = next((YAML_SYNTAX[type(t)] for t in tokens if type(t) in YAML_SYNTAX), None)
    if what is not None:
        raise ConfigError(f"{key}={shown(value)}: {what} is YAML syntax an override does not "
                          "take; write the value itself")
    content = [t for t in tokens if not isinstance(
        t, (yaml.StreamStartToken, yaml.StreamEndToken, yaml.BlockEndToken))]
    rest = value[content[-1].end_mark.index if content else 0:].strip()
    if rest:  # with one line of text, only a comment follows the last token
        raise ConfigError(f"{key}={shown(value)}: '{shown(rest, 30)}' is a YAML comment, which "
                          "would be dropped; quote a value that holds ' #'")


# Numbers YAML 1.1 (OmegaConf's parser) reads other than a reader would: octal 010 = 8,
# sexagesimal 1:04 = 64, 0x10, 0b10. In an override they are refused, not reinterpreted.
YAML11_NUMBER = re.compile(r"[-+]?(0[0-9_]+|0[xob][0-9a-f_]+|[0-9][0-9_]*(:[0-5]?[0-9])+(\.[0-9_]*)?)",
                           re.IGNORECASE)


@dataclass
class TrainerConfig:
    max_steps: int = 800
    batch_size: int = 32  # the global batch of an optimizer step (split over ranks, micro-batches)
    # micro-batches per optimizer step: each rank's share of the batch is split into this many,
    # run one after another and their gradients summed -- less memory, the same batch
    accumulate_grad_batches: int = 1
    lr: float = 3e-3
    min_lr_ratio: float = 0.1  # cosine decays from lr to lr * min_lr_ratio
    weight_decay: float = 1e-3
    adam_beta2: float = 0.95  # AdamW's β2 (β1 = 0.9); paper 004 B.1 trains with 0.999
    recurrent_lr_ratio: float = 1.0  # lr of the state-transition parameters (models tag them) / lr; paper 002 A.5: 0.5
    warmup_steps: int = 50
    grad_clip: float = 1.0  # 0 = no clipping
    accelerator: str = "auto"  # auto | cpu | gpu (= cuda)
    devices: int = 1  # -1: all visible devices
    num_nodes: int = 1
    strategy: str = "auto"  # auto | ddp | ddp_spawn | ddp_find_unused_parameters_true
    # DDP's collectives: auto = Lightning's (nccl on GPUs, gloo on CPUs); gloo also runs over
    # CUDA tensors, e.g. several processes sharing one GPU (python -m bench gpucheck)
    process_group_backend: str = "auto"  # auto | nccl | gloo
    precision: str = "32-true"  # 32-true | bf16-mixed | 16-mixed (CUDA) | 64-true
    tf32: bool = False  # CUDA: float32 matmuls/convolutions/Triton dots on TF32 tensor cores
    compile: bool = False  # torch.compile the model (training and evaluation); README "Compile"
    eval_sequences: int = 512
    eval_batch_size: int = 128
    bootstrap: int = 2000  # bootstrap resamples for the confidence interval
    reference_cache: bool = True  # held-out set + reference scores once per task config, in out_dir/cache
    log_every: int = 10
    # optimizer steps between validations of the headline (Bayes gap; text: nats/token) on a
    # fixed sample of val_sequences held-out sequences, logged as val/*; 0 = none (README "Training logs")
    val_every: int = 0
    val_sequences: int = 64
    checkpoint_every: int = 0  # steps between checkpoints; 0 = none
    progress: bool = True
    threads: int = 0  # CPU threads for torch; 0 = torch's default (one per core). See README "Threads"
    logger: str = "csv"  # csv | tensorboard | wandb | none: training log in out_dir/logs/<run>/
    loader_workers: int = -1  # processes sampling training batches; -1: up to 4 on a GPU, 0 on CPU
    save_weights: bool = True  # final weights to out_dir/weights/<run_id>.pt (python -m bench eval)

    def __post_init__(self):
        at_least = {"max_steps": 1, "batch_size": 1, "accumulate_grad_batches": 1,
                    "eval_sequences": 2, "eval_batch_size": 1,
                    "bootstrap": 1, "log_every": 1, "val_every": 0, "val_sequences": 1,
                    "num_nodes": 1, "warmup_steps": 0,
                    "checkpoint_every": 0, "threads": 0, "loader_workers": -1}
        for name, low in at_least.items():
            if getattr(self, name) < low:
                raise ValueError(f"trainer.{name} must be >= {low}, got {getattr(self, name)}")
        if not self.lr > 0:
            raise ValueError(f"trainer.lr must be > 0, got {self.lr}")
        if not 0 < self.adam_beta2 < 1:
            raise ValueError(f"trainer.adam_beta2 must be in (0, 1), got {self.adam_beta2}")
        if not self.recurrent_lr_ratio > 0:
            raise ValueError(f"trainer.recurrent_lr_ratio must be > 0, got "
                             f"{self.recurrent_lr_ratio}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"trainer.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.weight_decay < 0 or self.grad_clip < 0:
            raise ValueError(f"trainer.weight_decay and trainer.grad_clip must be >= 0, got "
                             f"{self.weight_decay}, {self.grad_clip}")
        if self.devices == 0 or self.devices < -1:
            raise ValueError(f"trainer.devices must be >= 1, or -1 for all, got {self.devices}")
        for name, allowed in (("accelerator", ACCELERATORS), ("strategy", STRATEGIES),
                              ("process_group_backend", PROCESS_GROUP_BACKENDS),
                              ("precision", PRECISIONS), ("logger", LOGGERS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"trainer.{name} must be one of {', '.join(allowed)}, got "
                                 f"'{getattr(self, name)}'")


@dataclass
class RunConfig:
    task_name: str
    task_family: str
    task: Any
    model_name: str
    model_family: str
    model: Any
    trainer_name: str
    trainer: TrainerConfig
    seed: int = 0
    out_dir: str = "runs"  # conf/config.yaml's; suites too (out_dir=results publishes)
    name: str = ""
    resume: str = ""
    overrides: list[str] = field(default_factory=list)
    # "adhoc" (python -m bench run), "sweep" (python -m bench sweep), "suite:<name>" or "eval"
    # (python -m bench eval of saved weights)
    origin: str = "adhoc"

    def describe(self) -> dict:
        return {
            "task": {"name": self.task_name, "family": self.task_family,
                     "config": dataclasses.asdict(self.task)},
            "model": {"name": self.model_name, "family": self.model_family,
                      "config": dataclasses.asdict(self.model)},
            "trainer": {"name": self.trainer_name, "config": dataclasses.asdict(self.trainer)},
            "seed": self.seed, "name": self.name, "overrides": list(self.overrides),
            "origin": self.origin,
        }


def suite_files() -> dict[str, Path]:
    """Every suite by name: the suite's own in conf/suite/ and each paper's in
    conf/papers/<paper>/suites/ (next to that paper's claims). A suite's name is its file's
    stem and is what its records carry (`origin: suite:<name>`): two files of one name refused."""
    found: dict[str, Path] = {}
    for folder in [CONF_DIR / "suite", *sorted(CONF_DIR.glob("papers/*/suites"))]:
        for path in sorted(folder.glob("*.yaml")):
            if path.stem in found:
                raise ConfigError(f"two suites named '{path.stem}': "
                                  f"{conf_relative(found[path.stem])} and {conf_relative(path)}")
            found[path.stem] = path
    return found


def conf_relative(path: Path) -> str:
    """conf/... as a user of a checkout sees the file."""
    return f"conf/{path.relative_to(CONF_DIR).as_posix()}"


def conf_file(group: str, name: str) -> Path:
    return suite_files()[name] if group == "suite" else CONF_DIR / group / f"{name}.yaml"


def choices(group: str) -> list[str]:
    if group == "suite":
        return sorted(suite_files())
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def describe_choice(group: str, name: str) -> str:
    """The first comment line of conf/<group>/<name>.yaml (what `bench list` shows); a task or
    model file without one is described by its family's class (`description`), "" otherwise."""
    text = conf_file(group, name).read_text()
    first = text.splitlines()[0] if text.strip() else ""
    if first.startswith("#"):
        return first.lstrip("# ").strip()
    if group not in ("task", "model"):
        return ""
    values = load_yaml_text(text) or {}
    family = values.get("family", name) if isinstance(values, dict) else name
    return getattr(_families(group).get(family), "description", "")


def _load_yaml(path: Path) -> dict:
    try:
        data = load_yaml_text(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise ConfigError(f"{path} is not valid YAML{yaml_problem(error)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping")
    return data


def _families(group: str) -> dict[str, type]:
    """{family: Task or Core subclass} (imports every family module, torch with them)."""
    if group == "task":
        from tasks import task_families
        return task_families()
    from models import model_families
    return model_families()


def _config_classes(group: str) -> dict[str, type]:
    """{family: its config dataclass}, from the torch-free config modules: what composing a
    command line needs (tests/test_contracts.py checks they are the families' own)."""
    if group == "task":
        from tasks.configs import CONFIGS
        return CONFIGS
    from models.configs import CONFIGS
    return CONFIGS


def _typed(group: str, name: str, schema_cls: type, values: dict, overrides: list[str]):
    """Merge file values and overrides onto the dataclass schema; return the dataclass."""
    valid = ", ".join(f.name for f in dataclasses.fields(schema_cls))
    types = {f.name: f.type for f in dataclasses.fields(schema_cls)}
    for override in overrides:  # OmegaConf reads any integer as a bool (2 -> True): not here
        key, value = override.split("=", 1)
        if not IDENTIFIER.fullmatch(key):  # order[0], order.x, +order: no field of ours
            raise ConfigError(f"unknown key '{group}.{shown(key)}' for {group} {name}; "
                              f"valid keys: {valid}")
        check_value(f"{group}.{key}", value)
        if types.get(key) in (bool, "bool") and value.strip().lower() not in BOOLEANS:
            raise ConfigError(f"{group}.{key}: invalid value {shown(value)} (override); expected "
                              "bool (true or false)")
        odd = next((token for token in re.split(r"[\[\],\s]+", value)
                    if YAML11_NUMBER.fullmatch(token)), None)
        if odd is not None:
            raise ConfigError(f"{group}.{key}: '{odd}' is not a plain decimal number (YAML 1.1 "
                              f"reads it as {yaml.safe_load(odd)!r}); write the number you mean")
        # int('１') == 1 and YAML reads '１' as text, which OmegaConf then converts: refused
        digit = next((c for c in value if c.isdigit() and not c.isascii()), None)
        if digit is not None and types.get(key) not in (str, "str"):
            raise ConfigError(f"{group}.{key}: '{digit}' in {shown(value)} is not a digit 0-9; "
                              "write the number in plain decimal digits")
        long = max((len(run) for run in re.findall(r"[0-9]+", value)), default=0)
        if long > 4000:  # past Python's int-from-text limit (4300 digits): a ValueError
            raise ConfigError(f"{group}.{key}: a number of {long} digits; no field takes one "
                              "that long")
    schema = OmegaConf.structured(schema_cls)
    # overrides one by one: a failure names its own
    layers = [("file", values)] + [("override", [o]) for o in overrides]
    for source, layer in layers:
        try:
            layer_conf = (OmegaConf.create(layer) if isinstance(layer, dict)
                          else OmegaConf.from_dotlist(layer))
            schema = OmegaConf.merge(schema, layer_conf)
        except OmegaConfBaseException as error:
            key = str(getattr(error, "full_key", None) or getattr(error, "key", None) or "?")
            if isinstance(error, ConfigKeyError):
                raise ConfigError(f"unknown key '{group}.{key}' for {group} {name}; "
                                  f"valid keys: {valid}") from None
            field_type = {f.name: f.type for f in dataclasses.fields(schema_cls)}.get(key, "?")
            value = (repr(layer.get(key)) if isinstance(layer, dict) else
                     next((o.split("=", 1)[1] for o in layer if o.split("=", 1)[0] == key), "?"))
            raise ConfigError(f"{group}.{key}: invalid value {shown(value)} ({source}); expected "
                              f"{getattr(field_type, '__name__', field_type)}") from None
        except (yaml.YAMLError, ValueError) as error:  # past check_value (after the
            # OmegaConf errors, some of which are ValueErrors too): still one line
            if isinstance(layer, dict):
                raise ConfigError(f"{group} {name}: {shown(first_line(error), 300)}") from None
            raise ConfigError(f"{group}.{shown(layer[0], 120)}: invalid override "
                              f"({type(error).__name__}: {shown(first_line(error), 200)})") \
                from None
    check_fields(group, schema)
    try:
        obj = OmegaConf.to_object(schema)
    except (ValueError, OmegaConfBaseException) as error:
        message = shown(first_line(error) or type(error).__name__, 300)
        raise ConfigError(f"{group} {name}: {message}") from None
    return obj


def check_fields(group: str, schema) -> None:
    """NaN and infinities, which OmegaConf lets through as floats but no field of ours means, and
    integers beyond 64 bits, which torch and the samplers cannot hold (OverflowError after the
    run started); checked before the dataclass's own range checks so the message names the
    value."""
    import math
    for key, value in schema.items():
        values = value if isinstance(value, (list, tuple)) or OmegaConf.is_list(value) else [value]
        for v in values:
            if isinstance(v, float) and not math.isfinite(v):
                raise ConfigError(f"{group}.{key}: {v} is not a finite number")
            if isinstance(v, int) and not isinstance(v, bool) and not -2**63 <= v < 2**63:
                raise ConfigError(f"{group}.{key}: {v} does not fit a 64-bit integer")


def is_suite_path(name: str) -> bool:
    """`suite name=` takes a suite of the package by name, or any suite file by its path (one
    with a folder or a .yaml/.yml suffix): a researcher's own list need not live in the package."""
    return "/" in name or os.sep in name or name.endswith((".yaml", ".yml"))


def suite_label(name: str) -> str:
    """The name a suite's records carry (`origin: suite:<label>`, which claims select by): a
    package suite's name, also when given by its path; any other file's path as given."""
    if is_suite_path(name):
        try:
            path = Path(name).resolve()
        except (OSError, RuntimeError):
            return name
        package = suite_files().get(path.stem)
        if package is not None and package.resolve() == path:
            return path.stem
    return name


def load_suite(name: str) -> list[list[str]]:
    """The runs of the package's suite `name` (suite_files), or of the suite file at path `name`:
    a list of override lists. A suite holds `runs:` only, each run a list of `key=value` strings,
    at most MAX_RUNS of them and none twice; each override is checked (check_override) here,
    before any entry is composed."""
    if is_suite_path(name):
        path, shown_as = Path(name), name
        check_path("name", name)
        if not path.is_file():
            raise ConfigError(f"suite file '{name}' " + ("is not a file" if path.exists()
                                                        else "does not exist"))
    elif name in choices("suite"):
        path = suite_files()[name]
        shown_as = conf_relative(path)
    else:
        raise ConfigError(f"unknown suite '{name}'; choose one of: {', '.join(choices('suite'))}"
                          " or give a suite file's path")
    try:
        data = load_yaml_text(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"suite file {shown_as} is not UTF-8 text") from None
    except OSError as error:
        raise ConfigError(f"suite file {shown_as} cannot be read: {error.strerror or error}") \
            from None
    except yaml.YAMLError as error:
        raise ConfigError(f"suite file {shown_as} is not valid YAML{yaml_problem(error)}") \
            from None
    usage = f"{shown_as} must hold `runs:`, a list of override lists like [model=mamba, seed=0]"
    if not isinstance(data, dict) or not isinstance(data.get("runs"), list):
        raise ConfigError(usage)
    extra = sorted(map(str, set(data) - {"runs"}))
    if extra:
        raise ConfigError(f"{shown_as}: unknown key '{extra[0]}'; a suite holds `runs:` only")
    runs = data["runs"]
    if not runs:
        raise ConfigError(f"{shown_as} holds no runs")
    if len(runs) > MAX_RUNS:  # before composing: each entry costs a memory check
        raise ConfigError(f"{shown_as} holds {len(runs)} runs; a suite has at most {MAX_RUNS}: "
                          "split it into several files")
    first: dict[tuple, int] = {}
    for number, entry in enumerate(runs, 1):
        if not isinstance(entry, list):
            raise ConfigError(f"{usage}; entry {number} is {shown(repr(entry))}")
        odd = next((o for o in entry if not isinstance(o, str) or "=" not in o), None)
        if odd is not None:  # `[task.order: 1]` is a mapping in YAML, not an override
            raise ConfigError(f"{shown_as}, entry {number}: {shown(repr(odd))} is not key=value")
        keys = set()
        for override in entry:
            try:
                key, _ = check_override(override)
            except ConfigError as error:
                raise ConfigError(f"{shown_as}, entry {number}: {error}") from None
            if key in keys:
                raise ConfigError(f"{shown_as}, entry {number}: '{key}' is given twice; give "
                                  "each key once")
            keys.add(key)
        same = first.setdefault(tuple(sorted(entry)), number)
        if same != number:
            raise ConfigError(f"{shown_as}: entries {same} and {number} are the same run "
                              f"({shown(' '.join(entry) or '(defaults)')}); list each run once")
    return [list(run) for run in runs]


def entry_numbers(text: str, size: int) -> list[int]:
    """The suite entries named by `1,4-6` (1-based, as `suite` prints them), in suite order."""
    if not text.strip():  # `entries=` with nothing after it: not "every entry"
        raise ConfigError("entries is empty; give numbers and ranges like 1,4-6, or leave "
                          "entries= out for every entry")
    chosen = set()
    for part in text.split(","):
        found = re.fullmatch(r"([0-9]+)(?:-([0-9]+))?", part.strip())  # not int(): '１', '1_0'
        if found is None:
            raise ConfigError(f"entries must be numbers and ranges like 1,4-6, got "
                              f"'{shown(text)}'")
        first, last = int(found[1]), int(found[2] or found[1])
        if first > last:
            raise ConfigError(f"entries: '{part.strip()}' is a range lo-hi with lo > hi")
        if not 1 <= first <= last <= size:
            raise ConfigError(f"entries: '{part.strip()}' is not within 1-{size}, the suite's "
                              "entries")
        chosen.update(range(first, last + 1))
    return sorted(chosen)


def field_type(group: str, name: str, key: str):
    """The declared type of field `key` in the schema of conf/<group>/<name>.yaml (`int` or
    "int" as the family's module spells it); None when there is no such name or field."""
    if group not in GROUPS or name not in choices(group):
        return None
    family = ("default" if group == "trainer"
              else _load_yaml(CONF_DIR / group / f"{name}.yaml").get("family", name))
    schema = family_schema(group, family)
    if schema is None:
        return None
    return next((f.type for f in dataclasses.fields(schema) if f.name == key), None)


def family_schema(group: str, family: str | None) -> type | None:
    """The typed config dataclass of a task or model family (a record's `task.family`), or the
    trainer's; None for a family this code does not know."""
    if group == "trainer":
        return TrainerConfig
    return _config_classes(group).get(family)


def default_choices() -> dict[str, str]:
    """The task, model and trainer a run uses when the command line names none."""
    return {group: str(name) for group, name in
            dict(_load_yaml(CONF_DIR / "config.yaml")["defaults"]).items()}


def compose(argv: list[str]) -> RunConfig:
    """Parse `key=value` overrides into a validated RunConfig; every failure is a one-line
    ConfigError. The checks that need the whole configuration and this machine (hardware,
    model × task, memory, out_dir, resume) are bench.checks.compose_checked's."""
    top = _load_yaml(CONF_DIR / "config.yaml")
    selected = dict(top.pop("defaults"))
    top_keys = dict(top)
    group_overrides: dict[str, list[str]] = {g: [] for g in GROUPS}
    seen: set[str] = set()
    for arg in argv:
        key, value = check_override(arg)
        if key in seen:
            raise ConfigError(f"'{key}' is given twice; give each key once")
        seen.add(key)
        head, _, rest = key.partition(".")
        if head in GROUPS and not rest:
            selected[head] = value
        elif head in GROUPS:
            group_overrides[head].append(f"{rest}={value}")
        elif key in top_keys and not rest:
            top_keys[key] = value
        else:
            allowed = ", ".join([*GROUPS, *(f"{g}.<field>" for g in GROUPS), *top_keys])
            raise ConfigError(f"unknown key '{shown(key)}'; valid keys: {allowed}")
    for option in ("out_dir", "resume"):  # a name too long for the file system: OSError later
        if top_keys[option]:
            check_path(option, str(top_keys[option]), folder=option == "out_dir")
    seed = parse_seed(top_keys["seed"])  # before the families load: a typo fails at once
    for group in GROUPS:
        if selected[group] not in choices(group):
            raise ConfigError(f"unknown {group} '{selected[group]}'; choose one of: "
                              f"{', '.join(choices(group))}")

    built = {}
    families = {}
    for group in ("task", "model"):
        name = selected[group]
        values = _load_yaml(CONF_DIR / group / f"{name}.yaml")
        family = values.pop("family", name)
        known = _config_classes(group)
        if family not in known:
            raise ConfigError(f"conf/{group}/{name}.yaml names family '{family}', which does "
                              f"not exist; families: {', '.join(sorted(known))}")
        families[group] = family
        built[group] = _typed(group, name, known[family], values, group_overrides[group])
    trainer = _typed("trainer", selected["trainer"], TrainerConfig,
                     _load_yaml(CONF_DIR / "trainer" / f"{selected['trainer']}.yaml"),
                     group_overrides["trainer"])
    config = RunConfig(task_name=selected["task"], task_family=families["task"],
                       task=built["task"], model_name=selected["model"],
                       model_family=families["model"], model=built["model"],
                       trainer_name=selected["trainer"], trainer=trainer, seed=seed,
                       out_dir=str(top_keys["out_dir"]), name=str(top_keys["name"] or ""),
                       resume=str(top_keys["resume"] or ""), overrides=list(argv))
    return config


def parse_seed(value) -> int:
    """A seed is a non-negative integer below 2^63 in plain decimal: `1.5`, `true`, `-1` or `010`
    are errors, never silently rounded or reinterpreted, and numbers read one way everywhere."""
    text = str(value).strip()
    if not re.fullmatch(r"[0-9]+", text) or int(text) >= 2**63:  # isdigit() takes '²' too
        raise ConfigError(f"seed: invalid value '{value}'; expected an integer in [0, 2^63)")
    if YAML11_NUMBER.fullmatch(text):  # 010: as task.seq_len=010 is refused, not read as 10
        raise ConfigError(f"seed: '{text}' is not a plain decimal number (YAML 1.1 reads it as "
                          f"{yaml.safe_load(text)!r}); write the number you mean")
    return int(text)
