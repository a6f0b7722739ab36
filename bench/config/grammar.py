"""The grammar of what a user types: one `key=value` override, a value read as YAML, a path the
file system can take, a seed, suite entry numbers, and YAML files read strictly (no key twice).
Every failure is a one-line ConfigError."""
from __future__ import annotations

import copy
import functools
import os
import re
import unicodedata
from pathlib import Path

import yaml

from bench.config.errors import ConfigError, first_line, shown

GROUPS = ("task", "model", "trainer")
BOOLEANS = ("true", "false", "yes", "no", "on", "off", "1", "0")
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # a field of a task, model or trainer config
# YAML syntax a value read as YAML (a task/model/trainer field) may not use: each means something
# other than the text written (a reference, a type, another document), never a value of ours.
YAML_SYNTAX = {yaml.AnchorToken: "a YAML anchor (&)", yaml.AliasToken: "a YAML alias (*)",
               yaml.TagToken: "a YAML tag (!)", yaml.DirectiveToken: "a YAML directive (%)",
               yaml.DocumentStartToken: "a YAML document marker (---)",
               yaml.DocumentEndToken: "a YAML document marker (...)"}
# What file systems allow when os.pathconf cannot say (Linux's NAME_MAX and PATH_MAX)
NAME_MAX, PATH_MAX = 255, 4096


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
    no key twice in a mapping. Raises yaml.YAMLError, also for a document nested too deeply
    for the parser's recursion (`[[[...]]]` 20,000 deep)."""
    return copy.deepcopy(_parsed(text))  # a copy: callers pop and add keys


@functools.lru_cache(maxsize=256)
def _parsed(text: str):
    """load_yaml_text's parse, once per text: composing a run reads four conf files, and a suite
    or `claims` composes hundreds of runs from the same few."""
    try:
        return yaml.load(text, Loader=UniqueKeyLoader)
    except RecursionError:
        raise yaml.YAMLError("nested too deeply") from None


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
# And 1_0 = 10, which a reader takes for a typo.
YAML11_NUMBER = re.compile(r"[-+]?(0[0-9_]+|0[xob][0-9a-f_]+|[0-9][0-9_]*(:[0-5]?[0-9])+(\.[0-9_]*)?"
                           r"|[0-9]+_[0-9_]*(\.[0-9_]*)?)", re.IGNORECASE)


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
