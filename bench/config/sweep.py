"""`python -m bench sweep`: comma lists and integer ranges on the command line expand to a grid
of runs, which then runs as a suite does (bench/cli/main.py: one runner for both).

    model=mamba,transformer task.order=1,2,3 seed=0-4   ->  2 x 3 x 5 = 30 runs

A value splits at its commas outside brackets and quotes, so `task.gd_steps=[1,2]` and
`"name='a,b'"` are one value. `lo-hi` (0 <= lo <= hi) is a range only for `seed` and for
fields declared `int` in every chosen task/model/trainer: `task.eval_rho=-1`, `trainer.lr=1e-3`
or a string `2024-05` are values as written. out_dir, name and resume are never split."""
from __future__ import annotations

import itertools
import math
import re

from bench.config import (GROUPS, MAX_RUNS, ConfigError, check_override, default_choices,
                          field_type, shown)

# MAX_RUNS (bench.config, shared with suite files): a typo like seed=0-99999 is refused before
# anything is composed
LITERAL_KEYS = ("out_dir", "name", "resume")  # paths and tags: a comma there is the user's
RANGE = re.compile(r"([0-9]+)-([0-9]+)")


def split_top_level(value: str) -> list[str] | None:
    """value cut at the commas outside brackets, braces and quotes; None when those do not
    balance (the value is then taken whole, and composing it says what is wrong)."""
    parts, depth, quote, start = [], 0, "", 0
    for i, char in enumerate(value):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
            if depth < 0:
                return None
        elif char == "," and depth == 0:
            parts.append(value[start:i])
            start = i + 1
    if depth or quote:
        return None
    return [*parts, value[start:]]


def integer_key(key: str, chosen: dict[str, list[str]]) -> bool:
    """Whether key takes integers for every task/model/trainer the sweep may choose: seed, or a
    field declared int in each of them that has it."""
    if key == "seed":
        return True
    group, _, name = key.partition(".")
    if group not in GROUPS or not name or "." in name:
        return False
    types = [field_type(group, choice, name) for choice in chosen[group]]
    found = [t for t in types if t is not None]
    return bool(found) and all(t in (int, "int") for t in found)


def axes(argv: list[str]) -> list[tuple[str, list[str], bool]]:
    """(key, values, swept) for every key=value of argv, in command-line order; values as
    written, a range lo-hi as the integers it spans; swept: written as a list or a range."""
    pairs = []
    for arg in argv:
        if "=" not in arg:
            raise ConfigError(f"expected key=value, got '{shown(arg)}'")
        key, value = arg.split("=", 1)
        if key in (k for k, _ in pairs):
            raise ConfigError(f"'{key}' is given twice; list its values once: {key}=a,b,c")
        parts = None if key in LITERAL_KEYS else split_top_level(value)
        for part in parts or [value]:  # each value as a run gets it; unbalanced: the whole
            check_override(f"{key}={part}")
        pairs.append((key, [value] if parts is None else parts))
    chosen = {group: [name] for group, name in default_choices().items()}
    for key, values in pairs:
        if key in GROUPS:
            chosen[key] = values
    result = []
    for key, values in pairs:
        if len(values) > 1 and "" in values:
            raise ConfigError(f"{key}={shown(','.join(values))}: an empty value in the list; "
                              f"write {key}=a,b,c")
        expanded, swept = [], len(values) > 1
        for value in values:
            found = RANGE.fullmatch(value)
            if found and integer_key(key, chosen):
                swept = True
                low, high = int(found[1]), int(found[2])
                if low > high:
                    raise ConfigError(f"{key}={value}: a range lo-hi needs lo <= hi")
                expanded += map(str, range(low, min(high, low + MAX_RUNS) + 1))
            else:
                expanded.append(value)
            if len(expanded) > MAX_RUNS:
                raise ConfigError(f"{key}: more than {MAX_RUNS} values; a sweep has at most "
                                  f"{MAX_RUNS} runs")
        seen: set[str] = set()
        for value in expanded:
            if value in seen:
                raise ConfigError(f"{key}: the value {value} is listed twice")
            seen.add(value)
        result.append((key, expanded, swept))
    return result


def grid(argv: list[str]) -> tuple[list[list[str]], list[str]]:
    """The sweep's entries (the varying key=value of each run, the first key slowest, as
    itertools.product orders them) and the overrides every run shares."""
    found = axes(argv)
    varying = [(key, values) for key, values, swept in found if swept]
    shared = [f"{key}={values[0]}" for key, values, swept in found if not swept]
    if not varying:
        raise ConfigError("nothing to sweep: give a comma list or a range, e.g. "
                          "model=mamba,transformer seed=0-4 (python -m bench run runs one config)")
    size = math.prod(len(values) for _, values in varying)
    if size > MAX_RUNS:
        shape = " x ".join(str(len(values)) for _, values in varying)
        raise ConfigError(f"the sweep has {size} runs ({shape}); at most {MAX_RUNS}: narrow a "
                          "list or split the sweep")
    keys = [key for key, _ in varying]
    entries = [[f"{key}={value}" for key, value in zip(keys, combo)]
               for combo in itertools.product(*(values for _, values in varying))]
    return entries, shared
