"""Compose a run configuration from conf/ and Hydra-style `key=value` overrides.

    task=<name> model=<name> trainer=<name>   pick a file of the group (conf/<group>/<name>.yaml)
    task.<field>=<v> model.<field>=<v> ...     override a field of the chosen file
    seed=<int> out_dir=<path> ...              top-level keys of conf/config.yaml

Each group file is validated against a typed dataclass (the task or model family's `Config`,
or `TrainerConfig`): unknown keys and wrongly typed values are errors, never dropped. Every
error is a `ConfigError` whose message is one line naming the valid choices."""
from __future__ import annotations

import copy
import dataclasses
import math
import re
from collections import OrderedDict

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from bench.config import conf
from bench.config.conf import choices, conf_file, load_conf_yaml
from bench.config.errors import ConfigError, first_line, shown
from bench.config.grammar import (BOOLEANS, GROUPS, IDENTIFIER, YAML11_NUMBER, check_override,
                                  check_path, check_value, load_yaml_text, parse_seed)
from bench.config.run import RunConfig, TrainerConfig
from models import model_families
from models.configs import CONFIGS as MODEL_CONFIGS
from tasks import task_families
from tasks.configs import CONFIGS as TASK_CONFIGS


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
    return getattr(families(group).get(family), "description", "")


def families(group: str) -> dict[str, type]:
    """{family: Task or Core subclass} (imports every family module, torch with them)."""
    return task_families() if group == "task" else model_families()


def _config_classes(group: str) -> dict[str, type]:
    """{family: its config dataclass}, from the torch-free config modules: what composing a
    command line needs (tests/test_contracts.py checks they are the families' own)."""
    return TASK_CONFIGS if group == "task" else MODEL_CONFIGS


# _typed's dataclasses by their inputs: OmegaConf's merges cost 14 ms a group, and `claims`
# composes 254 runs from 133 distinct groups (a suite, one per entry from a few)
_TYPED: OrderedDict[tuple, object] = OrderedDict()


def _typed(group: str, name: str, schema_cls: type, values: dict, overrides: list[str]):
    """Merge file values and overrides onto the dataclass schema; return the dataclass (a copy
    of the one these inputs gave before, where they did: callers may change it)."""
    key = (group, name, schema_cls, repr(values), tuple(overrides))
    if key not in _TYPED:
        _TYPED[key] = _merged(group, name, schema_cls, values, overrides)
        if len(_TYPED) > 1024:
            _TYPED.popitem(last=False)
    return copy.deepcopy(_TYPED[key])


def _merged(group: str, name: str, schema_cls: type, values: dict, overrides: list[str]):
    """_typed's dataclass, merged by OmegaConf (every failure a one-line ConfigError)."""
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
    for key, value in schema.items():
        values = value if isinstance(value, (list, tuple)) or OmegaConf.is_list(value) else [value]
        for v in values:
            if v is not value and (OmegaConf.is_config(v) or isinstance(v, (list, tuple, dict))):
                # no field holds nested lists; its own range check would fail on list < int
                raise ConfigError(f"{group}.{key}: {shown(str(OmegaConf.to_object(value)))} "
                                  "holds a list or mapping; give a flat list of numbers")
            if isinstance(v, float) and not math.isfinite(v):
                raise ConfigError(f"{group}.{key}: {v} is not a finite number")
            if isinstance(v, int) and not isinstance(v, bool) and not -2**63 <= v < 2**63:
                raise ConfigError(f"{group}.{key}: {v} does not fit a 64-bit integer")


def field_type(group: str, name: str, key: str):
    """The declared type of field `key` in the schema of conf/<group>/<name>.yaml (`int` or
    "int" as the family's module spells it); None when there is no such name or field."""
    if group not in GROUPS or name not in choices(group):
        return None
    family = ("default" if group == "trainer"
              else load_conf_yaml(conf.CONF_DIR / group / f"{name}.yaml").get("family", name))
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


def compose(argv: list[str]) -> RunConfig:
    """Parse `key=value` overrides into a validated RunConfig; every failure is a one-line
    ConfigError. The checks that need the whole configuration and this machine (hardware,
    model × task, memory, out_dir, resume) are bench.training.checks.compose_checked's."""
    top = load_conf_yaml(conf.CONF_DIR / "config.yaml")
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
        values = load_conf_yaml(conf.CONF_DIR / group / f"{name}.yaml")
        family = values.pop("family", name)
        known = _config_classes(group)
        if family not in known:
            raise ConfigError(f"conf/{group}/{name}.yaml names family '{family}', which does "
                              f"not exist; families: {', '.join(sorted(known))}")
        families[group] = family
        built[group] = _typed(group, name, known[family], values, group_overrides[group])
    trainer = _typed("trainer", selected["trainer"], TrainerConfig,
                     load_conf_yaml(conf.CONF_DIR / "trainer" / f"{selected['trainer']}.yaml"),
                     group_overrides["trainer"])
    config = RunConfig(task_name=selected["task"], task_family=families["task"],
                       task=built["task"], model_name=selected["model"],
                       model_family=families["model"], model=built["model"],
                       trainer_name=selected["trainer"], trainer=trainer, seed=seed,
                       out_dir=str(top_keys["out_dir"]), name=str(top_keys["name"] or ""),
                       resume=str(top_keys["resume"] or ""), overrides=list(argv))
    return config
