"""The conf/ folder: each group's files (task, model, trainer), the defaults, and the suites (their
own in conf/suite/, each paper's in conf/papers/<paper>/suites/), read and checked."""
from __future__ import annotations

import os
from pathlib import Path

import yaml

from bench.config.errors import ConfigError, shown
from bench.config.grammar import check_override, check_path, load_yaml_text, yaml_problem

MAX_RUNS = 1000  # a suite or sweep's most runs: refused before a single entry is composed


def _find_conf() -> Path:
    """A non-editable install carries conf/ as bench/conf (pyproject.toml); a checkout (and an
    editable install) has it at the top of the repository."""
    bench = Path(__file__).resolve().parents[1]
    installed = bench / "conf"
    return installed if installed.is_dir() else bench.parent / "conf"


CONF_DIR = _find_conf()


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


def load_conf_yaml(path: Path) -> dict:
    try:
        data = load_yaml_text(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise ConfigError(f"{path} is not valid YAML{yaml_problem(error)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping")
    return data


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


def default_choices() -> dict[str, str]:
    """The task, model and trainer a run uses when the command line names none."""
    return {group: str(name) for group, name in
            dict(load_conf_yaml(CONF_DIR / "config.yaml")["defaults"]).items()}
