"""Compose a run configuration from conf/ and Hydra-style `key=value` overrides.

    task=<name> model=<name> trainer=<name>   pick a file of the group (conf/<group>/<name>.yaml)
    task.<field>=<v> model.<field>=<v> ...     override a field of the chosen file
    seed=<int> out_dir=<path> ...              top-level keys of conf/config.yaml

Each group file is validated against a typed dataclass (the task or model family's `Config`,
or `TrainerConfig`): unknown keys and wrongly typed values are errors, never dropped. Every
error is a `ConfigError` whose message is one line naming the valid choices."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
GROUPS = ("task", "model", "trainer")


class ConfigError(ValueError):
    """A user error in the configuration; its message is one line."""


@dataclass
class TrainerConfig:
    max_steps: int = 800
    batch_size: int = 32
    lr: float = 3e-3
    min_lr_ratio: float = 0.1  # cosine decays from lr to lr * min_lr_ratio
    weight_decay: float = 1e-3
    warmup_steps: int = 50
    grad_clip: float = 1.0
    accelerator: str = "auto"  # cpu | gpu | auto
    devices: int = 1  # -1: all visible devices
    num_nodes: int = 1
    strategy: str = "auto"  # auto | ddp
    precision: str = "32-true"
    eval_sequences: int = 512
    eval_batch_size: int = 128
    bootstrap: int = 2000  # bootstrap resamples for the confidence interval
    log_every: int = 10
    checkpoint_every: int = 0  # steps between checkpoints; 0 = none
    progress: bool = True
    threads: int = 0  # CPU threads for torch; 0 = torch default. Use 1 per process when several share the cores

    def __post_init__(self):
        if self.max_steps < 1 or self.batch_size < 1 or self.eval_sequences < 2:
            raise ValueError("trainer needs max_steps >= 1, batch_size >= 1, eval_sequences >= 2")


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
    out_dir: str = "results"
    name: str = ""
    resume: str = ""
    overrides: list[str] = field(default_factory=list)
    origin: str = "adhoc"  # "adhoc" (python -m bench run) or "suite:<name>" (python -m bench suite)

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


def choices(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def describe_choice(group: str, name: str) -> str:
    """The first comment line of conf/<group>/<name>.yaml."""
    first = (CONF_DIR / group / f"{name}.yaml").read_text().splitlines()[0]
    return first.lstrip("# ").strip() if first.startswith("#") else ""


def _load_yaml(path: Path) -> dict:
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping")
    return data


def _families(group: str) -> dict[str, type]:
    if group == "task":
        from tasks import task_families
        return task_families()
    from models import model_families
    return model_families()


def _typed(group: str, name: str, schema_cls: type, values: dict, overrides: list[str]):
    """Merge file values and overrides onto the dataclass schema; return the dataclass."""
    valid = ", ".join(f.name for f in dataclasses.fields(schema_cls))
    schema = OmegaConf.structured(schema_cls)
    for source, layer in (("file", values), ("override", overrides)):
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
            raise ConfigError(f"{group}.{key}: invalid value {value} ({source}); expected "
                              f"{getattr(field_type, '__name__', field_type)}") from None
    try:
        return OmegaConf.to_object(schema)
    except (ValueError, OmegaConfBaseException) as error:
        message = str(error).splitlines()[0]
        raise ConfigError(f"{group} {name}: {message}") from None


def load_suite(name: str) -> list[list[str]]:
    """The runs of conf/suite/<name>.yaml: a list of override lists."""
    if name not in choices("suite"):
        raise ConfigError(f"unknown suite '{name}'; choose one of: {', '.join(choices('suite'))}")
    runs = _load_yaml(CONF_DIR / "suite" / f"{name}.yaml").get("runs")
    if not isinstance(runs, list) or not all(isinstance(r, list) for r in runs):
        raise ConfigError(f"conf/suite/{name}.yaml must hold `runs:`, a list of override lists")
    return [[str(o) for o in run] for run in runs]


def compose(argv: list[str], allowed_top: tuple[str, ...] | None = None) -> RunConfig:
    """Parse `key=value` overrides into a validated RunConfig."""
    top = _load_yaml(CONF_DIR / "config.yaml")
    selected = dict(top.pop("defaults"))
    top_keys = dict(top)
    group_overrides: dict[str, list[str]] = {g: [] for g in GROUPS}
    for arg in argv:
        if "=" not in arg:
            raise ConfigError(f"expected key=value, got '{arg}'")
        key, value = arg.split("=", 1)
        head, _, rest = key.partition(".")
        if head in GROUPS and not rest:
            selected[head] = value
        elif head in GROUPS:
            group_overrides[head].append(f"{rest}={value}")
        elif key in top_keys and not rest:
            top_keys[key] = yaml.safe_load(value) if value else ""
        else:
            allowed = ", ".join([*GROUPS, *(f"{g}.<field>" for g in GROUPS), *top_keys])
            raise ConfigError(f"unknown key '{key}'; valid keys: {allowed}")
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
        known = _families(group)
        if family not in known:
            raise ConfigError(f"conf/{group}/{name}.yaml names family '{family}', which does "
                              f"not exist; families: {', '.join(known)}")
        families[group] = family
        built[group] = _typed(group, name, known[family].Config, values, group_overrides[group])
    trainer = _typed("trainer", selected["trainer"], TrainerConfig,
                     _load_yaml(CONF_DIR / "trainer" / f"{selected['trainer']}.yaml"),
                     group_overrides["trainer"])
    try:
        seed = int(top_keys["seed"])
    except (TypeError, ValueError):
        raise ConfigError(f"seed: invalid value '{top_keys['seed']}'; expected int") from None
    return RunConfig(task_name=selected["task"], task_family=families["task"], task=built["task"],
                     model_name=selected["model"], model_family=families["model"],
                     model=built["model"], trainer_name=selected["trainer"], trainer=trainer,
                     seed=seed, out_dir=str(top_keys["out_dir"]), name=str(top_keys["name"]),
                     resume=str(top_keys["resume"] or ""), overrides=list(argv))
