"""Finding and loading a text corpus: local files first (a folder of split-named files, explicit
data files, or a `save_to_disk` folder), then the HF hub; and the rows of a split as the text a
tokenizer reads (`document_texts`).

`datasets` is imported inside the functions that need it, so importing this module is cheap and
works without the `text` extra.
"""
from __future__ import annotations

import codecs
import contextlib
import hashlib
import json
import os
import re
import socket
import threading
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Iterable, Iterator, Literal, Mapping, Sequence
from urllib.parse import urlparse

from tasks.corpora.errors import CorpusError, CorpusNotFound, MissingSplit

SampleBy = Literal["document", "line", "paragraph"]

SPLITS = ("train", "validation", "test")
# The words that name a split in a file or folder name, as in HF datasets' data-files inference.
SPLIT_KEYWORDS = {
    "train": ("train", "training"),
    "validation": ("validation", "valid", "dev", "val"),
    "test": ("test", "testing", "eval", "evaluation"),
}
# File suffix -> the `datasets` builder that reads it. WikiText's wiki.*.raw files are text.
BUILDERS = {".txt": "text", ".raw": "text", ".parquet": "parquet", ".jsonl": "json",
            ".json": "json"}
# A cache directory carries this tag (https://bford.info/cachedir/), so backup tools skip it and
# the data-file search below never mistakes a cached sidecar for a data file.
CACHEDIR_TAG = "CACHEDIR.TAG"
_CACHEDIR_SIGNATURE = "Signature: 8a477f597d28d172789f06886806bc55\n"


def _tag_cache_dir(cache_dir: Path) -> None:
    cache_dir.mkdir(parents=True, exist_ok=True)
    tag = cache_dir / CACHEDIR_TAG
    if not tag.exists():
        tag.write_text(_CACHEDIR_SIGNATURE + "# icl-bench token cache; safe to delete.\n")



@dataclass(frozen=True)
class CorpusSpec:
    """Defaults for a known corpus: where the hub has it, what its rows are, and the files a user
    puts in data_dir instead (named in the error when neither is there)."""

    title: str
    hub_name: str | None
    hub_config: str | None
    sample_by: SampleBy
    files: tuple[str, ...] = ()
    text_field: str = "text"


CORPORA: dict[str, CorpusSpec] = {
    # One row per line of the raw file (the hub copy has the same rows).
    "wikitext-103": CorpusSpec("WikiText-103", "Salesforce/wikitext", "wikitext-103-raw-v1",
                               "line", ("wiki.train.raw", "wiki.valid.raw", "wiki.test.raw")),
    "wikitext-2": CorpusSpec("WikiText-2", "Salesforce/wikitext", "wikitext-2-raw-v1", "line",
                             ("wiki.train.raw", "wiki.valid.raw", "wiki.test.raw")),
    # One row per book. deepmind/pg19 is a loading script, which datasets >= 4 no longer runs;
    # emozilla/pg19 is a parquet copy with the same train/validation/test splits.
    "pg19": CorpusSpec("PG-19", "emozilla/pg19", None, "document",
                       ("train/*.txt", "validation/*.txt", "test/*.txt")),
}


@dataclass
class Corpus:
    """The splits of a text corpus: {split: datasets.Dataset with one column "text"}.

    sample_by says what a row is ("document", "line" or "paragraph"); it decides how rows are
    joined when tokenized (`document_texts`). identity is a hash of where the data came from
    (files with sizes and modification times, or hub name/config/row counts): the token cache
    is keyed by it. key is the cache folder name."""

    name: str
    splits: dict[str, Any]
    sample_by: SampleBy
    description: str
    identity: str

    def __getitem__(self, split: str):
        return self.splits[split]

    def __contains__(self, split: str) -> bool:
        return split in self.splits

    @property
    def key(self) -> str:
        return f"{_slug(self.name)}-{self.identity[:12]}"


PathLike = str | os.PathLike


def load_splits(source: str, *, data_dir: PathLike | None = None,
                data_files: Mapping[str, PathLike | Sequence[PathLike]] | None = None,
                hub_name: str | None = None, hub_config: str | None = None,
                text_field: str | None = None, sample_by: SampleBy | None = None,
                splits: Sequence[str] = SPLITS, hub: bool | None = None,
                hf_cache_dir: str | os.PathLike | None = None) -> Corpus:
    """The splits of corpus `source`: from local files when data_dir/data_files hold any, else
    from the hub.

    source: a name in CORPORA ("wikitext-103", "wikitext-2", "pg19"), which supplies hub name,
      config, sample_by and the file names the error asks for; or any other label, then
      data_dir/data_files or hub_name say where the data is.
    data_dir: a folder of .txt/.raw/.parquet/.jsonl/.json files whose split is named in the file
      or folder name (train | valid, validation, val, dev | test, as HF datasets infers them),
      or a `save_to_disk` folder (dataset_dict.json, or one state.json folder per split).
    data_files: {split: file or files}, explicit instead of inferred.
    sample_by: what a row of a .txt file is: "document" (a whole file, e.g. a PG-19 book),
      "line" (WikiText) or "paragraph"; for parquet/jsonl/hub rows it says what a row is.
    splits: the splits that must be there (MissingSplit otherwise).
    hub: None probes the hub (a few seconds at most, honours HF_HUB_OFFLINE); False uses only
      HF's local cache; True goes online without probing.
    hf_cache_dir: where `datasets` keeps its Arrow copies (default: its own cache).
    """
    spec = CORPORA.get(source)
    title = spec.title if spec else f"corpus '{source}'"
    hub_name = hub_name or (spec.hub_name if spec else None)
    hub_config = hub_config or (spec.hub_config if spec else None)
    text_field = text_field or (spec.text_field if spec else "text")
    sample_by = sample_by or (spec.sample_by if spec else "document")
    if sample_by not in ("document", "line", "paragraph"):
        raise ValueError(f"sample_by must be document, line or paragraph, not {sample_by!r}")
    cache_dir = None if hf_cache_dir is None else str(hf_cache_dir)

    corpus = None
    if data_files:
        files = {split: [Path(f) for f in ([paths] if isinstance(paths, (str, os.PathLike))
                                           else paths)]
                 for split, paths in data_files.items()}
        missing = [str(f) for fs in files.values() for f in fs if not f.is_file()]
        if missing:
            raise CorpusNotFound(f"no {title} found: data_files names missing files: "
                                 f"{', '.join(missing)}")
        corpus = _load_files(source, files, text_field, sample_by, cache_dir,
                             _describe_files(f for fs in files.values() for f in fs))
    elif data_dir is not None and Path(data_dir).is_dir():
        corpus = _load_dir(source, Path(data_dir), text_field, sample_by, cache_dir)
    elif data_dir is not None and Path(data_dir).is_file():
        path = Path(data_dir)
        corpus = _load_files(source, {_split_of(PurePosixPath(path.name)) or "train": [path]},
                             text_field, sample_by, cache_dir, f"local file {path}")

    if corpus is None and hub_name:
        online = hub_reachable() if hub is None else hub
        corpus, why = _load_hub(source, hub_name, hub_config, text_field, sample_by, cache_dir,
                                online)
        if corpus is None and online:
            raise CorpusNotFound(f"no {title} found: loading {_hub_label(hub_name, hub_config)} "
                                 f"from the hub failed ({why})" + _where_local(spec, data_dir))
    if corpus is None:
        raise CorpusNotFound(_not_found_message(title, spec, data_dir, hub_name, hub_config))

    missing = [s for s in splits if s not in corpus.splits]
    if missing:
        found = ", ".join(corpus.splits) or "none"
        raise MissingSplit(f"{title} ({corpus.description}) has no {', '.join(missing)} split: "
                           f"found {found}; name files or folders after the split "
                           f"(train | valid, validation, val, dev | test)")
    for split, dataset in corpus.splits.items():
        corpus.splits[split] = _text_column(dataset, text_field, title, split)
    return corpus


def _describe_files(files: Iterable[Path]) -> str:
    files = [f.resolve() for f in files]
    if len(files) <= 3:
        return "local files " + ", ".join(str(f) for f in files)
    return f"{len(files)} local files under {os.path.commonpath(files)}"


def _not_found_message(title: str, spec: CorpusSpec | None, data_dir, hub_name, hub_config) -> str:
    files = ", ".join(spec.files) + " (or " if spec and spec.files else ""
    files += "train/validation/test .txt/.parquet/.jsonl files"
    files += ")" if spec and spec.files else ""
    where = f"in {Path(data_dir).resolve()}" if data_dir is not None \
        else "in a folder and pass it as data_dir (none given)"
    hub = f", or make the hub reachable ({_hub_label(hub_name, hub_config)})" if hub_name else ""
    return f"no {title} found: put {files} {where}{hub}"


def _where_local(spec: CorpusSpec | None, data_dir) -> str:
    files = ", ".join(spec.files) if spec and spec.files else "train/validation/test files"
    where = Path(data_dir).resolve() if data_dir is not None else "a folder passed as data_dir"
    return f"; or put {files} in {where}"


def _hub_label(name: str | None, config: str | None) -> str:
    return f"{name}, config {config}" if config else str(name)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "corpus"


def _split_of(relpath: PurePosixPath) -> str | None:
    """The split a data file belongs to: a keyword in its file name, else in its nearest folder
    name; a keyword counts when delimited by one of - . _ space digit or the name's ends."""
    for part in (relpath.name, *reversed(relpath.parent.parts)):
        found = {split for split, words in SPLIT_KEYWORDS.items()
                 if any(re.search(rf"(^|[-._ 0-9]){word}([-._ 0-9]|$)", part.lower())
                        for word in words)}
        if len(found) > 1:
            raise CorpusError(f"{relpath} names more than one split ({', '.join(sorted(found))})")
        if found:
            return found.pop()
    return None


def _suffix(path: Path) -> str:
    return path.suffix.lower()


def _data_files_in(folder: Path) -> list[Path]:
    """Supported data files under folder, skipping hidden (., _) names and tagged cache dirs."""
    found = []
    for root, dirs, files in os.walk(folder):
        if CACHEDIR_TAG in files and Path(root) != folder:
            dirs[:] = []
            continue
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))
        for name in sorted(files):
            path = Path(root) / name
            if not name.startswith((".", "_")) and _suffix(path) in BUILDERS:
                found.append(path)
    return found


def _load_dir(source: str, folder: Path, text_field: str, sample_by: SampleBy,
              cache_dir: str | None) -> Corpus | None:
    import datasets

    if (folder / "dataset_dict.json").is_file() or (folder / "state.json").is_file():
        loaded = datasets.load_from_disk(str(folder))
        if isinstance(loaded, datasets.Dataset):
            split = _split_of(PurePosixPath(folder.name)) or "train"
            loaded = {split: loaded}
        return Corpus(source, dict(loaded), sample_by, f"save_to_disk folder {folder}",
                      _files_identity(folder, sorted(p for p in folder.rglob("*") if p.is_file()),
                                      text_field, sample_by))
    saved = {}
    for sub in sorted(p for p in folder.iterdir() if (p / "state.json").is_file()):
        split = _split_of(PurePosixPath(sub.name))
        if split:
            saved[split] = sub
    if saved:
        return Corpus(source, {s: datasets.load_from_disk(str(p)) for s, p in saved.items()},
                      sample_by, f"save_to_disk folders in {folder}",
                      _files_identity(folder, sorted(f for p in saved.values()
                                                     for f in p.rglob("*") if f.is_file()),
                                      text_field, sample_by))
    files = _data_files_in(folder)
    if not files:
        return None
    by_split: dict[str, list[Path]] = {}
    unnamed = []
    for path in files:
        split = _split_of(PurePosixPath(path.relative_to(folder).as_posix()))
        (by_split.setdefault(split, []) if split else unnamed).append(path)
    if not by_split:  # no file names a split: all of them are training data (as HF does)
        by_split = {"train": unnamed}
    return _load_files(source, by_split, text_field, sample_by, cache_dir, f"local folder {folder}",
                       base=folder)


def _load_files(source: str, files: dict[str, list[Path]], text_field: str, sample_by: SampleBy,
                cache_dir: str | None, description: str, base: Path | None = None) -> Corpus:
    import datasets

    by_builder: dict[str, dict[str, list[str]]] = {}
    for split, paths in files.items():
        builders = {BUILDERS.get(_suffix(p)) for p in paths}
        if None in builders:
            bad = next(p for p in paths if _suffix(p) not in BUILDERS)
            raise CorpusError(f"{bad}: unsupported file type; use .txt, .raw, .parquet, .jsonl "
                              f"or .json")
        if len(builders) > 1:
            examples = ", ".join(next(p.name for p in paths if BUILDERS[_suffix(p)] == b)
                                 for b in sorted(builders))
            raise CorpusError(f"the {split} split mixes file types ({examples}); keep one type "
                              f"per split")
        by_builder.setdefault(builders.pop(), {})[split] = [str(p) for p in paths]
    all_files = sorted(p for paths in files.values() for p in paths)
    identity = _files_identity(base, all_files, text_field, sample_by)
    # datasets keys its Arrow copy of a local file by path and modification time: a file edited
    # at the same size with its mtime restored (cp -p, rsync -t) would load stale. A cache folder
    # per content digest cannot be stale.
    content_cache = os.path.join(cache_dir or datasets.config.HF_DATASETS_CACHE, "icl-bench",
                                 identity[:20])
    # this content was read through once, the text field of every .jsonl row and parquet
    # schema included (a marker of a reader that did not check them, "files-checked", is not
    # this one: their check must not be skipped)
    checked = Path(content_cache) / "files-checked-text-fields"
    if not checked.is_file():
        problem = next(filter(None, (_unreadable(p, text_field) for p in all_files)), None)
        if problem:
            raise CorpusError(problem)
    for split, paths in files.items():
        if all(path.stat().st_size == 0 for path in paths):
            raise CorpusError(no_text(split, description))
    loaded = {}
    for builder, data_files in by_builder.items():
        options = dict(sample_by=sample_by, keep_linebreaks=True) if builder == "text" else {}
        try:
            with _hub_mode(online=False):  # local files never need the hub
                loaded.update(datasets.load_dataset(builder, data_files=data_files,
                                                    cache_dir=content_cache, **options))
        except Exception as error:  # datasets names no file: find the one it could not read
            paths = [Path(p) for split_paths in data_files.values() for p in split_paths]
            raise CorpusError(next(filter(None, (_unreadable(p, text_field) for p in paths)),
                                   None) or
                              f"{builder} files {', '.join(map(str, paths))} could not be read: "
                              f"{type(error).__name__}: {error}".splitlines()[0]) from None
    corpus = Corpus(source, {s: loaded[s] for s in files}, sample_by, description, identity)
    for split in files:
        dataset = corpus[split]
        problem = _not_a_text_column(dataset, text_field)
        if problem:  # a parquet or .json column of numbers: an Arrow error, or read as text
            raise CorpusError(f"{', '.join(map(str, files[split]))}: {problem}")
        if text_field in dataset.column_names and not any(  # lazily: stops at the first text
                str(text).strip() for rows in dataset.select_columns([text_field]).iter(1024)
                for text in rows[text_field]):
            raise CorpusError(no_text(split, description))
    with contextlib.suppress(OSError):  # only saves the next load the reading
        checked.touch()
    return corpus


def _unreadable(path: Path, text_field: str | None = None) -> str | None:
    """Why a local data file cannot be read as its type says, naming it and where; None when
    it reads (text: UTF-8 without NUL bytes; .jsonl: a JSON object a line, with a string at
    `text_field` when given: datasets read {"text": 123} as the text "123", or failed with an
    Arrow error naming no file)."""
    if _suffix(path) == ".parquet":  # binary by design: datasets reads the rest and checks it
        return _not_a_text_parquet(path, text_field) if text_field is not None else None
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset, line_number, pending = 0, 0, ""
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            nul = block.find(b"\0")
            if nul >= 0:
                return f"{path}: a NUL byte at offset {offset + nul}: a binary file, not text"
            try:
                text = decoder.decode(block)
            except UnicodeDecodeError as error:
                return (f"{path}: not UTF-8 at byte {offset + error.start} ({error.reason}); "
                        "convert it to UTF-8 (for Latin-1: iconv -f latin1 -t utf-8)")
            offset += len(block)
            if _suffix(path) == ".jsonl":
                lines = (pending + text).split("\n")
                pending = lines.pop()
                for line in lines:
                    line_number += 1
                    problem = _not_a_json_object(line, text_field)
                    if problem:
                        return f"{path}:{line_number}: {problem}"
    if _suffix(path) == ".jsonl" and pending.strip():
        problem = _not_a_json_object(pending, text_field)
        if problem:
            return f"{path}:{line_number + 1}: {problem}"
    return None


def _not_a_json_object(line: str, text_field: str | None = None) -> str | None:
    if not line.strip():
        return None
    try:
        value = json.loads(line)
    except json.JSONDecodeError as error:
        return f"not JSON ({error.msg} at column {error.colno})"
    if not isinstance(value, dict):
        return f"a JSON {type(value).__name__}, not an object"
    if text_field is None:
        return None
    if text_field not in value:
        fields = ", ".join(repr(key) for key in list(value)[:8]) or "none"
        return (f"no field {text_field!r} (its fields: {fields}); every row needs its text "
                "there (set text_field)")
    text = value[text_field]
    if not isinstance(text, str):
        shown = json.dumps(text)
        shown = "" if text is None else f" ({shown if len(shown) <= 40 else shown[:37] + '...'})"
        return (f"the field {text_field!r} is {_JSON_KINDS.get(type(text), 'not a string')}"
                f"{shown}, not a string")
    return None


def _not_a_text_parquet(path: Path, text_field: str) -> str | None:
    """Why a parquet file has no text column `text_field` (its schema, read without the data);
    datasets would cast a column of numbers to the other files' strings without a word."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    try:
        schema = pq.read_schema(path)
    except Exception as error:  # pyarrow's errors name no file
        return f"{path}: not a parquet file ({type(error).__name__}: {str(error)[:200]})" \
            .splitlines()[0]
    if text_field not in schema.names:
        columns = ", ".join(repr(name) for name in schema.names[:8]) or "none"
        return f"{path}: no column {text_field!r} (its columns: {columns}); set text_field"
    kind = schema.field(text_field).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        return f"{path}: the column {text_field!r} holds {kind}, not text (strings)"
    return None


_JSON_KINDS = {bool: "a boolean", int: "a number", float: "a number", list: "an array",
               dict: "an object", type(None): "null"}


def _not_a_text_column(dataset, text_field: str) -> str | None:
    """Why a loaded split's text column is not text (None when it is, or absent: load_splits
    names a missing column)."""
    import datasets
    feature = dataset.features.get(text_field)
    if feature is None or (isinstance(feature, datasets.Value)
                           and feature.dtype in ("string", "large_string")):
        return None
    kind = feature.dtype if isinstance(feature, datasets.Value) else type(feature).__name__
    return f"the column {text_field!r} holds {kind}, not text (strings)"


def no_text(split: str, description: str) -> str:
    return (f"the {split} split of {description} holds no text (empty or only whitespace); "
            "nothing to train on or score")


def _files_identity(base: Path | None, files: Iterable[Path], *extra: str) -> str:
    """A digest of the files' names and contents (not their size and mtime, which an edit can
    keep: cp -p, rsync -t, touch -r), and of `extra`: the key of every cache made from them."""
    digest = hashlib.sha256(json.dumps(extra).encode())
    for path in files:
        name = path.relative_to(base).as_posix() if base else path.resolve().as_posix()
        digest.update(f"{name}\0".encode())
        _hash_file(digest, path)
        digest.update(b"\n")
    return digest.hexdigest()


def _hash_file(digest, path: Path):
    """digest updated with the file's bytes, read in blocks; returns digest."""
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 22), b""):
            digest.update(block)
    return digest


def _text_column(dataset, text_field: str, title: str, split: str):
    columns = dataset.column_names
    if text_field not in columns:
        raise CorpusError(f"the {split} split of {title} has no column {text_field!r} "
                          f"(columns: {', '.join(columns)}); set text_field")
    problem = _not_a_text_column(dataset, text_field)
    if problem:  # the hub's or a save_to_disk folder's (local files are named when loaded)
        raise CorpusError(f"the {split} split of {title}: {problem}")
    if columns != ["text"]:
        dataset = dataset.select_columns([text_field])
        if text_field != "text":
            dataset = dataset.rename_column(text_field, "text")
    return dataset


def _truthy(value: str | None) -> bool:
    return (value or "").strip().upper() in ("1", "ON", "YES", "TRUE")


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the HF hub (HF_ENDPOINT, or the HTTPS proxy when one is set) accepts a TCP
    connection within `timeout` seconds; False at once when HF_HUB_OFFLINE or
    HF_DATASETS_OFFLINE is set. Name resolution runs in a daemon thread, so a resolver that hangs
    costs `timeout`, not minutes (datasets itself retries an unreachable hub for ~25 s)."""
    if _truthy(os.environ.get("HF_HUB_OFFLINE")) or _truthy(os.environ.get("HF_DATASETS_OFFLINE")):
        return False
    proxy = next((os.environ[k] for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")
                  if os.environ.get(k)), None)
    url = urlparse(proxy or os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    if not url.hostname:
        return False
    port = url.port or (443 if url.scheme == "https" else 80)
    done, reached = threading.Event(), []

    def probe():
        try:
            socket.create_connection((url.hostname, port), timeout=timeout).close()
            reached.append(True)
        except OSError:
            pass
        finally:
            done.set()

    threading.Thread(target=probe, daemon=True).start()
    done.wait(timeout)
    return bool(reached)


@contextlib.contextmanager
def _hub_mode(online: bool):
    """Within: `datasets` and `huggingface_hub` are offline unless `online` (they read the flag
    at call time; the environment variable is read only once, at their import)."""
    import datasets.config
    import huggingface_hub.constants as hub_constants

    saved = (datasets.config.HF_HUB_OFFLINE, datasets.config.HF_DATASETS_OFFLINE,
             hub_constants.HF_HUB_OFFLINE)
    offline = not online or saved[2]
    datasets.config.HF_HUB_OFFLINE = datasets.config.HF_DATASETS_OFFLINE = offline
    hub_constants.HF_HUB_OFFLINE = offline
    try:
        yield
    finally:
        (datasets.config.HF_HUB_OFFLINE, datasets.config.HF_DATASETS_OFFLINE,
         hub_constants.HF_HUB_OFFLINE) = saved


def _load_hub(source: str, name: str, config: str | None, text_field: str, sample_by: SampleBy,
              cache_dir: str | None, online: bool) -> tuple[Corpus | None, str]:
    """(corpus, "") from the hub, or from HF's local cache when offline; (None, why) if not."""
    import datasets

    try:
        with _hub_mode(online):
            loaded = datasets.load_dataset(name, config, cache_dir=cache_dir)
    except Exception as error:  # whatever went wrong, the caller reports it in one line
        return None, f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    rows = {split: len(ds) for split, ds in loaded.items()}
    identity = hashlib.sha256(json.dumps([name, config, text_field, sample_by, rows],
                                         sort_keys=True).encode()).hexdigest()
    return Corpus(source, dict(loaded), sample_by, f"hub {_hub_label(name, config)}",
                  identity), ""


def document_texts(dataset, sample_by: SampleBy, batch_rows: int | None = None,
                   max_chars: int | None = None) -> Iterator[list[str]]:
    """Batches of the split's text as it is tokenized: rows of a "line" corpus end with "\\n"
    (added where a row lacks it, e.g. the hub's empty WikiText lines), rows of a "paragraph"
    corpus are joined by a blank line, and "document" rows are left as they are (the tokenizer
    puts its end-of-document id between them). Empty documents are skipped. Stops after
    max_chars characters' worth of rows when given. dataset: a datasets.Dataset with a "text"
    column, or any iterable of strings. batch_rows: rows read at a time (default 16 documents,
    e.g. books, or 4096 lines/paragraphs)."""
    batch_rows = batch_rows or (16 if sample_by == "document" else 4096)
    if hasattr(dataset, "iter"):
        batches = (batch["text"] for batch in dataset.iter(batch_size=batch_rows))
    else:
        batches = _chunked(dataset, batch_rows)
    first, seen = True, 0
    for batch in batches:
        if sample_by == "line":
            out = [row if row.endswith("\n") else row + "\n" for row in batch]
        elif sample_by == "paragraph":
            out = [row if i == 0 and first else "\n\n" + row for i, row in enumerate(batch)]
        else:
            out = [row for row in batch if row]
        first = False
        if max_chars is not None:
            for i, text in enumerate(out):
                seen += len(text)
                if seen >= max_chars:
                    yield out[:i + 1]
                    return
        yield out


def _chunked(items: Iterable[str], size: int) -> Iterator[list[str]]:
    batch = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch
