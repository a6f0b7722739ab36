"""The options of a command (`key=value` it takes besides a run's overrides), each checked into
a one-line ConfigError."""
from __future__ import annotations

import re
import sys

from bench.config import ConfigError, check_path


def fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def take_option(argv: list[str], key: str, default: str | None) -> tuple[list[str], str | None]:
    """Remove a command-specific `key=value` option from argv (given at most once)."""
    rest, values = [], []
    for arg in argv:
        (values if arg.startswith(f"{key}=") else rest).append(arg)
    if len(values) > 1:
        raise ConfigError(f"'{key}' is given twice; give each key once")
    return rest, values[0].split("=", 1)[1] if values else default


def take_flag(argv: list[str], key: str) -> tuple[list[str], bool]:
    """A command's true|false option (default false), taken as take_option takes it."""
    argv, value = take_option(argv, key, "false")
    if value not in ("true", "false"):
        raise ConfigError(f"{key} must be true or false, got '{value}'")
    return argv, value == "true"


def positive_int(key: str, text: str, low: int = 1, high: int = 10 ** 9) -> int:
    """A command option's integer: plain decimal digits (not '²', which isdigit accepts, nor
    YAML 1.1's octal-looking '010') within [low, high]."""
    digits = text.strip()
    if (not re.fullmatch(r"[0-9]+", digits) or (len(digits) > 1 and digits[0] == "0")
            or int(digits) < low):
        raise ConfigError(f"{key}: invalid value '{text}'; expected an integer >= {low}")
    if int(digits) > high:
        raise ConfigError(f"{key}: {digits} is outside {low}..{high}")
    return int(digits)


def take_selection(argv: list[str]) -> tuple[list[str], tuple[int, int], str | None, bool]:
    """The options a suite and a sweep share: shard=i/n, entries=1,4-6 and rerun=true|false."""
    argv, shard = take_option(argv, "shard", "0/1")  # i/n: entries i, i+n, ... (parallel workers)
    argv, rerun = take_flag(argv, "rerun")
    argv, entries = take_option(argv, "entries", None)  # None: every entry; "": refused
    found = re.fullmatch(r"([0-9]+)/([0-9]+)", shard)  # not int(): it reads '１', ' 1', '1_0'
    if found is None or not 0 <= int(found[1]) < int(found[2]):
        raise ConfigError(f"shard must be i/n with 0 <= i < n, got '{shard}'")
    return argv, (int(found[1]), int(found[2])), entries, rerun


def check_paths(**paths: str) -> None:
    """The path options given (not empty) are paths the file system can take (check_path)."""
    for option, path in paths.items():
        if path:
            check_path(option, path, folder=option == "out_dir")
