"""Text corpora for the language-modelling tasks: finding the data, tokenizers, an on-disk token
cache, the windows a text task trains and evaluates on, and n-gram baselines.

Pipeline (every step is a plain function; the task module wires them together):

    corpus = load_splits("wikitext-103", data_dir=...)      # local files first, then the hub
    tok = make_tokenizer("gpt2", path=..., corpus=corpus, cache_dir=...)
    train = cached_tokens(corpus, "train", tok, cache_dir)    # (read-only uint16 memmap, meta)
    x = training_windows(train.tokens, n, seq_len, generator) # (n, seq_len + 1) LongTensor
    inputs, targets, mask = evaluation_windows(test.tokens, seq_len)
    unigram = fit_unigram(train.tokens, tok.vocab_size); unigram.nll(inputs, targets, mask)

Errors a user can fix (no data, a missing split, no tokenizer file) are `CorpusError`s whose
message is one line; the caller turns them into exit code 2.

`datasets`, `tokenizers` and `tqdm` are imported inside the functions that need them, so
importing this module is cheap and works without the `text` extra.
"""
from __future__ import annotations

import abc
import codecs
import contextlib
import hashlib
import json
import math
import os
import re
import socket
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Iterable, Iterator, Literal, Mapping, NamedTuple, Sequence
from urllib.parse import urlparse

import numpy as np
import torch
from torch import Tensor

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
EOT = "<|endoftext|>"
CACHE_FORMAT = 2  # 2: the sidecar holds the tokens' sha256
# A cache directory carries this tag (https://bford.info/cachedir/), so backup tools skip it and
# the data-file search below never mistakes a cached sidecar for a data file.
CACHEDIR_TAG = "CACHEDIR.TAG"
_CACHEDIR_SIGNATURE = "Signature: 8a477f597d28d172789f06886806bc55\n"


class CorpusError(ValueError):
    """A problem the user fixes by providing data or files; the message is one line."""


class CorpusNotFound(CorpusError):
    """Neither local files nor the hub provided the corpus."""


class MissingSplit(CorpusError):
    """The corpus was found but lacks a split that is needed."""


class TokenizerNotFound(CorpusError):
    """No tokenizer file locally and no hub to fetch it from."""


# --------------------------------------------------------------------------------------------
# Finding the data
# --------------------------------------------------------------------------------------------

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
    checked = Path(content_cache) / "files-checked"  # this content was read through once
    if not checked.is_file():
        problem = next(filter(None, map(_unreadable, all_files)), None)
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
            raise CorpusError(next(filter(None, map(_unreadable, paths)), None) or
                              f"{builder} files {', '.join(map(str, paths))} could not be read: "
                              f"{type(error).__name__}: {error}".splitlines()[0]) from None
    corpus = Corpus(source, {s: loaded[s] for s in files}, sample_by, description, identity)
    for split in files:
        dataset = corpus[split]
        if text_field in dataset.column_names and not any(  # lazily: stops at the first text
                str(text).strip() for rows in dataset.select_columns([text_field]).iter(1024)
                for text in rows[text_field]):
            raise CorpusError(no_text(split, description))
    with contextlib.suppress(OSError):  # only saves the next load the reading
        checked.touch()
    return corpus


def _unreadable(path: Path) -> str | None:
    """Why a local data file cannot be read as its type says, naming it and where; None when
    it reads (text: UTF-8 without NUL bytes; .jsonl: a JSON object a line)."""
    if _suffix(path) == ".parquet":  # binary by design: datasets reads and checks it
        return None
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
                    problem = _not_a_json_object(line)
                    if problem:
                        return f"{path}:{line_number}: {problem}"
    if _suffix(path) == ".jsonl" and pending.strip():
        problem = _not_a_json_object(pending)
        if problem:
            return f"{path}:{line_number + 1}: {problem}"
    return None


def _not_a_json_object(line: str) -> str | None:
    if not line.strip():
        return None
    try:
        value = json.loads(line)
    except json.JSONDecodeError as error:
        return f"not JSON ({error.msg} at column {error.colno})"
    return None if isinstance(value, dict) else f"a JSON {type(value).__name__}, not an object"


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


# --------------------------------------------------------------------------------------------
# Tokenizers
# --------------------------------------------------------------------------------------------

class TextTokenizer(abc.ABC):
    """What the cache and the task need from a tokenizer. Counters: texts_encoded and
    bytes_encoded (UTF-8 bytes of all text encoded so far; bits per byte divides by it)."""

    name: str
    vocab_size: int
    eod_id: int | None  # placed between documents; None: documents are simply concatenated
    identity: str  # changes whenever the mapping text -> ids could change

    def __init__(self):
        self.texts_encoded = 0
        self.bytes_encoded = 0

    def encode(self, text: str) -> np.ndarray:
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        self.texts_encoded += len(texts)
        self.bytes_encoded += sum(len(t.encode("utf-8")) for t in texts)
        return self._encode_batch(texts)

    @abc.abstractmethod
    def _encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """The ids of each text (the counters are encode_batch's)."""

    @abc.abstractmethod
    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """The text of ids."""

    @property
    def key(self) -> str:
        return f"{_slug(self.name)}-{self.vocab_size}-{self.identity[-12:]}"


class ByteTokenizer(TextTokenizer):
    """The UTF-8 bytes of the text: 256 symbols, no files, no hub. There is no end-of-document
    id (eod_id None): documents are concatenated as they are, so a split of n bytes is exactly
    n tokens and bits per byte = nats per token / ln 2."""

    name = "byte"
    vocab_size = 256
    eod_id = None
    identity = "byte-utf8"

    def _encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts]

    def decode(self, ids) -> str:
        return bytes(np.asarray(ids, dtype=np.uint8).tobytes()).decode("utf-8", errors="replace")


class HFTokenizer(TextTokenizer):
    """A `tokenizers.Tokenizer` (GPT-2's or a trained byte-level BPE). Text that happens to
    contain "<|endoftext|>" is encoded as ordinary text; the end-of-document id is only placed
    between documents by the cache."""

    def __init__(self, tokenizer, name: str, path: str | None = None):
        super().__init__()
        self.tokenizer = tokenizer
        tokenizer.encode_special_tokens = True
        self.name = name
        self.path = path
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self.eod_id = tokenizer.token_to_id(EOT)
        self.identity = hashlib.sha256(tokenizer.to_str().encode()).hexdigest()

    def _encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        encode = getattr(self.tokenizer, "encode_batch_fast", self.tokenizer.encode_batch)
        encodings = encode(list(texts), add_special_tokens=False)  # _fast (>= 0.21): no offsets
        return [np.asarray(e.ids, dtype=np.int64) for e in encodings]

    def decode(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)


def make_tokenizer(name: str, *, path: str | os.PathLike | None = None,
                   vocab_size: int | None = None, corpus: Corpus | None = None,
                   cache_dir: str | os.PathLike | None = None, hub: bool | None = None,
                   hub_name: str = "gpt2", train_chars: int | None = 1 << 30,
                   progress: bool = True) -> TextTokenizer:
    """A tokenizer by name.

    byte: UTF-8 bytes, 256 symbols, always available.
    gpt2: GPT-2's byte-level BPE (50257 ids, <|endoftext|> = 50256) from the tokenizer.json at
      `path` when it exists, else from the hub repo `hub_name` (or HF's local cache); else
      TokenizerNotFound. hub: as in load_splits.
    bpe: a byte-level BPE with `vocab_size` ids (>= 257: 256 bytes + <|endoftext|>) trained on
      the train split of `corpus` (its first `train_chars` characters; None: all of it), saved
      as <cache_dir>/<corpus.key>/bpe-<vocab_size>/tokenizer.json (or at `path`) and loaded,
      not retrained, when that file exists.
    """
    if name == "byte":
        return ByteTokenizer()
    if name == "gpt2":
        return _gpt2_tokenizer(path, hub, hub_name)
    if name == "bpe":
        if vocab_size is None or vocab_size < 257:
            raise ValueError(f"the bpe tokenizer needs vocab_size >= 257, not {vocab_size}")
        cached = path is None  # ours to rebuild when it is damaged; a given file is the user's
        if path is None:
            if corpus is None or cache_dir is None:
                raise ValueError("the bpe tokenizer needs corpus and cache_dir (or path)")
            path = Path(cache_dir) / corpus.key / f"bpe-{vocab_size}" / "tokenizer.json"
        return _bpe_tokenizer(Path(path), vocab_size, corpus, train_chars, progress, cache_dir,
                              cached)
    raise ValueError(f"unknown tokenizer {name!r}; choose byte, gpt2 or bpe")


def _gpt2_tokenizer(path, hub: bool | None, hub_name: str) -> HFTokenizer:
    from tokenizers import Tokenizer

    if path is not None and Path(path).is_file():
        return HFTokenizer(read_tokenizer(Path(path)), "gpt2", str(path))
    online = hub_reachable() if hub is None else hub
    try:
        from huggingface_hub import hf_hub_download

        with _hub_mode(online):
            file = hf_hub_download(hub_name, "tokenizer.json")
        return HFTokenizer(Tokenizer.from_file(file), "gpt2", file)
    except Exception as error:  # any failure of the hub path ends in the same one-line advice
        why = f"{type(error).__name__}"
        where = (f"at {Path(path).resolve()}" if path is not None
                 else "at a path passed as the tokenizer path (none given)")
        hub_part = "the hub failed" if online else "the hub is unreachable"
        raise TokenizerNotFound(f"no GPT-2 tokenizer: put GPT-2's tokenizer.json {where}, or make "
                                f"the hub reachable ({hub_name}; {hub_part}: {why})") from None


def read_tokenizer(path: Path):
    """A tokenizers Tokenizer from a tokenizer.json, or TokenizerNotFound naming the file."""
    from tokenizers import Tokenizer
    try:
        return Tokenizer.from_file(str(path))
    except Exception as error:  # tokenizers raises a bare Exception for a malformed file
        raise TokenizerNotFound(f"{path}: not a tokenizer.json the tokenizers library can read "
                                f"({str(error).splitlines()[0] if str(error) else type(error).__name__})"
                                ) from None


TRAIN_PIECE = 1 << 20  # characters: BPE training holds ~140 bytes a character of one text


def training_pieces(text: str, size: int = TRAIN_PIECE):
    """A text for BPE training in pieces of at most `size` characters, cut at whitespace where
    there is some: a 50 MB line trained whole peaked at 7 GB; pieces only move the merges'
    counts at a few cuts."""
    start = 0
    while len(text) - start > size:
        cut = text.rfind(" ", start + size // 2, start + size)
        cut = cut + 1 if cut > start else start + size
        yield text[start:cut]
        start = cut
    yield text[start:]


def _bpe_tokenizer(path: Path, vocab_size: int, corpus: Corpus | None, train_chars: int | None,
                   progress: bool, cache_dir, cached: bool = False) -> HFTokenizer:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if path.is_file():
        try:
            return HFTokenizer(read_tokenizer(path), "bpe", str(path))
        except TokenizerNotFound:
            if not cached:
                raise  # a damaged cached one is trained again below and replaced
            print(f"warning: the cached tokenizer {path} cannot be read; training it again",
                  file=sys.stderr)
    if corpus is None:
        raise TokenizerNotFound(f"no bpe tokenizer at {path} and no corpus to train one on")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=[EOT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=progress)
    texts = (piece for batch in document_texts(corpus["train"], corpus.sample_by,
                                               max_chars=train_chars)
             for text in batch for piece in training_pieces(text))
    tokenizer.train_from_iterator(texts, trainer=trainer)
    path.parent.mkdir(parents=True, exist_ok=True)
    if cache_dir is not None:
        _tag_cache_dir(Path(cache_dir))
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        tokenizer.save(str(tmp))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return HFTokenizer(Tokenizer.from_file(str(path)), "bpe", str(path))


# --------------------------------------------------------------------------------------------
# Token cache
# --------------------------------------------------------------------------------------------

class TokenSplit(NamedTuple):
    """A tokenized split: tokens is a read-only numpy.memmap (uint16 or uint32); meta the
    sidecar's contents (n_tokens, n_bytes, tokenizer, vocab_size, dtype, source, ...)."""

    tokens: np.memmap
    meta: dict


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def cache_paths(corpus: Corpus, split: str, tokenizer: TextTokenizer,
                cache_dir: str | os.PathLike) -> tuple[Path, Path]:
    """(<cache_dir>/<corpus.key>/<tokenizer.key>/<split>.bin, the same with .json)."""
    folder = Path(cache_dir) / corpus.key / tokenizer.key
    return folder / f"{split}.bin", folder / f"{split}.json"


def cached_tokens(corpus: Corpus, split: str, tokenizer: TextTokenizer,
                  cache_dir: str | os.PathLike, *, progress: bool = True,
                  batch_bytes: int = 1 << 20) -> TokenSplit:
    """The split tokenized, from the cache when it holds it, else tokenized once and cached.

    Documents stream through in batches of about batch_bytes characters (a tokenizers batch
    holds ~50 bytes per character of text while it is encoded) and their ids are appended to a
    temporary file, so memory stays bounded by the batch or the longest document; the
    temporary file becomes <split>.bin by an atomic rename and the sidecar <split>.json is
    written (atomically) last, so a cache with a sidecar is complete. On any error the
    temporary files are removed. Ranks that build the same cache at once each write their own
    temporary file; the renames leave one complete copy."""
    bin_path, meta_path = cache_paths(corpus, split, tokenizer, cache_dir)
    dtype = token_dtype(tokenizer.vocab_size)
    meta = _read_meta(meta_path, bin_path, tokenizer, dtype)
    if meta is not None and _file_sha256(bin_path) != meta.get("sha256"):
        meta = None  # damaged on disk (a flipped byte would be a wrong token): built again
        print(f"warning: the token cache {bin_path} does not match the digest it was written "
              f"with; tokenizing the {split} split again", file=sys.stderr)
    if meta is None:
        meta = _build_cache(corpus, split, tokenizer, bin_path, meta_path, dtype, progress,
                            batch_bytes, Path(cache_dir))
    tokens = np.memmap(bin_path, dtype=dtype, mode="r", shape=(meta["n_tokens"],))
    return TokenSplit(tokens, meta)


def cached_meta(corpus: Corpus, split: str, tokenizer: TextTokenizer,
                cache_dir: str | os.PathLike) -> dict | None:
    """The sidecar of the split's token cache when the cache is complete, else None; tokenizes
    nothing."""
    bin_path, meta_path = cache_paths(corpus, split, tokenizer, cache_dir)
    return _read_meta(meta_path, bin_path, tokenizer, token_dtype(tokenizer.vocab_size))


def split_tokens_bound(corpus: Corpus, split: str) -> int:
    """An upper bound on the tokens of a split before it is tokenized: every tokenizer here is
    byte-level (bytes, GPT-2's BPE, a trained byte-level BPE), so a token covers at least one
    UTF-8 byte, and joining rows adds at most two tokens a row (document_texts, the end-of-document
    id). Counted on the Arrow column, without reading the text into Python."""
    import pyarrow.compute as pc
    dataset = corpus[split]
    text_bytes = pc.sum(pc.binary_length(dataset.data.column("text"))).as_py() or 0
    return int(text_bytes) + 2 * len(dataset)


def _read_meta(meta_path: Path, bin_path: Path, tokenizer: TextTokenizer,
               dtype: np.dtype) -> dict | None:
    """The sidecar if it describes a complete cache made by this tokenizer, else None."""
    try:
        meta = json.loads(meta_path.read_text())
        size = bin_path.stat().st_size
    except (OSError, ValueError):
        return None
    ok = (meta.get("format") == CACHE_FORMAT
          and meta.get("tokenizer_identity") == tokenizer.identity
          and meta.get("dtype") == dtype.name
          and isinstance(meta.get("n_tokens"), int) and meta["n_tokens"] > 0
          and size == meta["n_tokens"] * dtype.itemsize)
    return meta if ok else None


def _file_sha256(path: Path) -> str:
    return _hash_file(hashlib.sha256(), path).hexdigest()


def _tag_cache_dir(cache_dir: Path) -> None:
    cache_dir.mkdir(parents=True, exist_ok=True)
    tag = cache_dir / CACHEDIR_TAG
    if not tag.exists():
        tag.write_text(_CACHEDIR_SIGNATURE + "# icl-bench token cache; safe to delete.\n")


def _build_cache(corpus: Corpus, split: str, tokenizer: TextTokenizer, bin_path: Path,
                 meta_path: Path, dtype: np.dtype, progress: bool, batch_bytes: int,
                 cache_dir: Path) -> dict:
    from tqdm.auto import tqdm

    if split not in corpus:
        raise MissingSplit(f"{corpus.name} has no {split} split: found {', '.join(corpus.splits)}")
    _tag_cache_dir(cache_dir)
    bin_path.parent.mkdir(parents=True, exist_ok=True)
    dataset = corpus[split]
    suffix = f".{os.getpid()}.{uuid.uuid4().hex}.tmp"
    tmp_bin = bin_path.with_name("." + bin_path.name + suffix)
    tmp_meta = meta_path.with_name("." + meta_path.name + suffix)
    document = corpus.sample_by == "document" and tokenizer.eod_id is not None
    eod = np.array([tokenizer.eod_id if document else 0], dtype=dtype)
    n_tokens = n_bytes = n_texts = 0
    written = hashlib.sha256()  # of the tokens as written: checked on every later load
    start = time.perf_counter()
    total = len(dataset) if hasattr(dataset, "__len__") else None
    bar = tqdm(total=total, unit="row", disable=not progress,
               desc=f"tokenizing {corpus.name} {split} ({tokenizer.name})")
    try:
        with open(tmp_bin, "wb") as out:
            pending: list[str] = []
            pending_size = 0

            def flush():
                nonlocal n_tokens, n_bytes, n_texts, pending, pending_size
                before = tokenizer.bytes_encoded
                for ids in tokenizer.encode_batch(pending):
                    if document and n_texts:
                        out.write(eod.tobytes())
                        written.update(eod.tobytes())
                        n_tokens += 1
                    if len(ids) and int(ids.max()) >= tokenizer.vocab_size:
                        raise ValueError(f"{tokenizer.name} produced id {int(ids.max())} >= its "
                                         f"vocab size {tokenizer.vocab_size}")
                    chunk = np.asarray(ids, dtype=dtype).tobytes()
                    out.write(chunk)
                    written.update(chunk)
                    n_tokens += len(ids)
                    n_texts += 1
                n_bytes += tokenizer.bytes_encoded - before
                pending, pending_size = [], 0
                bar.set_postfix(tokens=n_tokens, refresh=False)

            rows_done = 0
            for texts in document_texts(dataset, corpus.sample_by):
                for text in texts:
                    pending.append(text)
                    pending_size += len(text)
                    if pending_size >= batch_bytes:
                        flush()
                rows_done += len(texts)
                bar.update(len(texts))
            if pending:
                flush()
            out.flush()
            os.fsync(out.fileno())
        if n_tokens == 0:
            raise CorpusError(f"the {split} split of {corpus.name} ({corpus.description}) "
                              f"has no text")
        seconds = time.perf_counter() - start
        meta = {
            "format": CACHE_FORMAT, "corpus": corpus.name, "corpus_identity": corpus.identity,
            "source": corpus.description, "split": split, "sample_by": corpus.sample_by,
            "tokenizer": tokenizer.name, "tokenizer_identity": tokenizer.identity,
            "vocab_size": tokenizer.vocab_size, "eod_id": tokenizer.eod_id if document else None,
            "dtype": dtype.name, "n_tokens": n_tokens, "n_bytes": n_bytes,
            "sha256": written.hexdigest(),
            "n_documents": n_texts if document else None, "rows": rows_done,
            "seconds": round(seconds, 3), "tokens_per_second": round(n_tokens / max(seconds, 1e-9)),
        }
        os.replace(tmp_bin, bin_path)
        tmp_meta.write_text(json.dumps(meta, indent=1) + "\n")
        os.replace(tmp_meta, meta_path)
        return meta
    finally:
        bar.close()
        tmp_bin.unlink(missing_ok=True)
        tmp_meta.unlink(missing_ok=True)


# --------------------------------------------------------------------------------------------
# Windows
# --------------------------------------------------------------------------------------------

def training_windows(tokens: np.ndarray, n: int, seq_len: int,
                     generator: torch.Generator) -> Tensor:
    """(n, seq_len + 1) int64 CPU tensor of windows tokens[s : s + seq_len + 1], with starts s
    uniform on [0, len(tokens) - seq_len - 1] drawn from `generator` (on its own device), so the
    caller's (seed, rank, step) generator makes batches reproducible and resumable. Only the
    windows are read from the memmap. inputs = w[:, :-1], targets = w[:, 1:]."""
    high = len(tokens) - seq_len
    if high < 1:
        raise ValueError(f"a split of {len(tokens)} tokens has no window of {seq_len + 1} tokens")
    starts = torch.randint(high, (n,), generator=generator, device=generator.device).cpu().numpy()
    index = starts[:, None] + np.arange(seq_len + 1)
    return torch.from_numpy(np.asarray(tokens[index], dtype=np.int64))


def evaluation_starts(n_tokens: int, seq_len: int, stride: int | None = None,
                      max_windows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(starts, first_scored): the evaluation windows of a split of n_tokens tokens.

    Window i reads tokens[starts[i] : starts[i] + seq_len + 1] and scores its target positions
    p >= first_scored[i]. Windows advance by stride (default seq_len: non-overlapping); the first
    scores all seq_len targets, later ones their last `stride` (strided perplexity). The tail the
    strided windows miss is scored once by a last window that ends at the split's last token
    (so it is full length and scores only the new targets). Every one of the n_tokens - 1
    targets is scored exactly once. A split shorter than seq_len + 1 tokens gives one padded
    window (windows_at masks the padding). max_windows keeps that many windows evenly spaced
    over the split (still no target twice, but no longer all of them)."""
    stride = seq_len if stride is None else stride
    if not 1 <= stride <= seq_len:
        raise ValueError(f"stride must be in [1, seq_len={seq_len}], not {stride}")
    n_targets = n_tokens - 1
    if n_targets < 1:
        raise ValueError(f"a split of {n_tokens} tokens has nothing to predict")
    if n_targets <= seq_len:
        starts, first = np.zeros(1, np.int64), np.zeros(1, np.int64)
    else:
        starts = np.arange(0, n_targets - seq_len + 1, stride, dtype=np.int64)
        first = np.full(len(starts), seq_len - stride, dtype=np.int64)
        first[0] = 0
        covered = int(starts[-1]) + seq_len
        if covered < n_targets:
            tail = n_targets - seq_len
            starts = np.append(starts, tail)
            first = np.append(first, covered - tail)
    if max_windows is not None and max_windows < len(starts):
        keep = np.unique(np.linspace(0, len(starts) - 1, max_windows).round().astype(np.int64))
        starts, first = starts[keep], first[keep]
    return starts, first


def evaluation_window_count(n_tokens: int, seq_len: int, stride: int | None = None,
                            max_windows: int | None = None) -> int:
    """len(evaluation_starts(...)[0]) without building them: the memory estimate counts the
    windows of a split that may not be tokenized yet."""
    stride = seq_len if stride is None else stride
    n_targets = n_tokens - 1
    if n_targets <= seq_len:
        return 1
    count = (n_targets - seq_len) // stride + 1
    if (count - 1) * stride + seq_len < n_targets:  # the tail window
        count += 1
    return count if max_windows is None else min(count, max_windows)


def windows_at(tokens: np.ndarray, starts: np.ndarray, first_scored: np.ndarray,
               seq_len: int) -> tuple[Tensor, Tensor, Tensor]:
    """(inputs, targets, loss_mask), each (len(starts), seq_len), for the given windows;
    positions past the split's end are padded with 0 and unscored."""
    n_tokens = len(tokens)
    starts = np.asarray(starts, dtype=np.int64)
    index = starts[:, None] + np.arange(seq_len + 1)
    valid = index < n_tokens
    window = np.where(valid, np.asarray(tokens[np.minimum(index, n_tokens - 1)], dtype=np.int64), 0)
    position = np.arange(seq_len)
    mask = (position >= np.asarray(first_scored)[:, None]) & valid[:, 1:]
    window = torch.from_numpy(window)
    return window[:, :-1].contiguous(), window[:, 1:].contiguous(), torch.from_numpy(mask)


def evaluation_windows(tokens: np.ndarray, seq_len: int, stride: int | None = None,
                       max_windows: int | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """(inputs, targets, loss_mask) of all evaluation windows (see evaluation_starts); for a
    large split build them batch by batch with evaluation_starts + windows_at instead."""
    starts, first = evaluation_starts(len(tokens), seq_len, stride, max_windows)
    return windows_at(tokens, starts, first, seq_len)


# --------------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------------

def nats_per_token(nll_sum: float, count: int) -> float:
    """Mean negative log-likelihood in nats over `count` scored tokens."""
    return float(nll_sum) / count


def perplexity(nll_sum: float, count: int) -> float:
    """exp(mean NLL per token)."""
    return math.exp(nats_per_token(nll_sum, count))


def bits_per_byte(nll_sum: float, n_bytes: int) -> float:
    """Total NLL in bits per UTF-8 byte of the text scored: nll_sum / (ln 2 · n_bytes). For a
    whole split n_bytes is meta["n_bytes"]; for part of it, scale by scored tokens / n_tokens."""
    return float(nll_sum) / (math.log(2) * n_bytes)


# --------------------------------------------------------------------------------------------
# Baselines: n-gram models fit on the training split. nll() returns per-position negative
# log-likelihoods (float64, 0 where loss_mask is False), never (B, T, V) distributions.
# --------------------------------------------------------------------------------------------

def _as_numpy(x) -> np.ndarray:
    if isinstance(x, Tensor):
        return x.detach().cpu().numpy().astype(np.int64, copy=False)
    return np.asarray(x, dtype=np.int64)


def _masked(nll: np.ndarray, loss_mask) -> Tensor:
    out = torch.from_numpy(nll)
    if loss_mask is not None:
        out = out.masked_fill(~torch.as_tensor(loss_mask, dtype=torch.bool).cpu(), 0.0)
    return out


@dataclass
class UnigramModel:
    """p(w) = (c(w) + δ) / (N + δV): add-δ smoothed training-split frequencies (δ = 1 is
    add-one); every token, seen or not, has positive probability."""

    counts: np.ndarray  # (V,) int64
    delta: float = 1.0
    name: str = "unigram"

    def __post_init__(self):
        total = self.counts.sum() + self.delta * len(self.counts)
        self.log_p = np.log((self.counts + self.delta) / total)

    @property
    def description(self) -> str:
        return f"unigram frequencies of the training split, add-{self.delta:g} smoothing"

    def probs(self) -> np.ndarray:
        return np.exp(self.log_p)

    def nll(self, inputs, targets, loss_mask=None) -> Tensor:
        return _masked(-self.log_p[_as_numpy(targets)], loss_mask)


def fit_unigram(tokens: np.ndarray, vocab_size: int, delta: float = 1.0,
                chunk: int = 1 << 22) -> UnigramModel:
    """Token counts of the split, read in chunks of the memmap."""
    if delta <= 0:
        raise ValueError("the unigram smoothing delta must be > 0")
    counts = np.zeros(vocab_size, dtype=np.int64)
    for begin in range(0, len(tokens), chunk):
        counts += np.bincount(np.asarray(tokens[begin:begin + chunk]), minlength=vocab_size)
    return UnigramModel(counts, delta)


@dataclass
class BigramModel:
    """Interpolated absolute discounting (Ney, Essen & Kneser 1994):

        p(w | v) = max(c(v, w) − D, 0) / c(v) + D · n(v) / c(v) · p_uni(w),

    c(v, w) the training-split count of the pair, c(v) = Σ_w c(v, w), n(v) the number of distinct
    w seen after v, p_uni the add-δ unigram; p(w | v) = p_uni(w) when v never precedes a token.
    With 0 < D ≤ 1 it sums to 1 over w. Pair counts are sparse: sorted int64 keys v·V + w."""

    keys: np.ndarray  # sorted unique v * V + w
    counts: np.ndarray  # c(v, w) for each key
    vocab_size: int
    unigram: UnigramModel
    discount: float = 0.75
    name: str = "bigram"

    def __post_init__(self):
        prev = self.keys // self.vocab_size
        self.context_count = np.bincount(prev, weights=self.counts, minlength=self.vocab_size)
        self.distinct = np.bincount(prev, minlength=self.vocab_size)

    @property
    def description(self) -> str:
        return (f"bigram of the training split, interpolated absolute discounting "
                f"D={self.discount:g} with the add-{self.unigram.delta:g} unigram")

    def pair_counts(self, prev: np.ndarray, nxt: np.ndarray) -> np.ndarray:
        key = prev * self.vocab_size + nxt
        at = np.searchsorted(self.keys, key)
        at_ok = np.minimum(at, len(self.keys) - 1)
        found = (at < len(self.keys)) & (self.keys[at_ok] == key) if len(self.keys) else \
            np.zeros(key.shape, bool)
        return np.where(found, self.counts[at_ok] if len(self.keys) else 0, 0)

    def _prob(self, prev: np.ndarray, nxt: np.ndarray) -> np.ndarray:
        c_vw = self.pair_counts(prev, nxt)
        c_v = self.context_count[prev]
        seen = c_v > 0
        safe = np.where(seen, c_v, 1.0)
        p_uni = np.exp(self.unigram.log_p[nxt])
        p = np.maximum(c_vw - self.discount, 0) / safe + \
            self.discount * self.distinct[prev] / safe * p_uni
        return np.where(seen, p, p_uni)

    def probs(self, prev: int) -> np.ndarray:
        """The full next-token distribution after token prev (V,)."""
        return self._prob(np.full(self.vocab_size, prev, np.int64), np.arange(self.vocab_size))

    def nll(self, inputs, targets, loss_mask=None) -> Tensor:
        return _masked(-np.log(self._prob(_as_numpy(inputs), _as_numpy(targets))), loss_mask)


def _merge_counts(keys: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sum counts of equal keys; keys come out sorted and unique."""
    order = np.argsort(keys, kind="stable")  # timsort: linear on concatenated sorted runs
    keys, counts = keys[order], counts[order]
    if len(keys) == 0:
        return keys, counts
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    return keys[starts], np.add.reduceat(counts, starts)


def fit_bigram(tokens: np.ndarray, vocab_size: int, discount: float = 0.75,
               unigram: UnigramModel | None = None, chunk: int = 1 << 22) -> BigramModel:
    """Pair counts of consecutive tokens, read in chunks of the memmap (each chunk's pairs
    counted with np.unique and merged into the running sorted counts): memory grows with the
    number of distinct pairs, never V²."""
    if not 0 < discount <= 1:
        raise ValueError("the bigram discount D must be in (0, 1]")
    unigram = unigram or fit_unigram(tokens, vocab_size)
    keys = np.zeros(0, np.int64)
    counts = np.zeros(0, np.int64)
    for begin in range(0, len(tokens) - 1, chunk):
        piece = np.asarray(tokens[begin:begin + chunk + 1], dtype=np.int64)
        chunk_keys, chunk_counts = np.unique(piece[:-1] * vocab_size + piece[1:],
                                             return_counts=True)
        keys, counts = _merge_counts(np.concatenate([keys, chunk_keys]),
                                     np.concatenate([counts, chunk_counts.astype(np.int64)]))
    return BigramModel(keys, counts, vocab_size, unigram, discount)


@dataclass
class CacheModel:
    """An in-context unigram cache (Kuhn & De Mori 1990): at position t of a window,

        p(w) = (1 − λ) · p_uni(w) + λ · n_t(w) / (t + 1),

    n_t(w) the number of times w occurs in inputs[0..t] of the same window (everything the model
    has seen when predicting targets[t]); causal, and positive wherever p_uni is."""

    unigram: UnigramModel
    lam: float = 0.1
    name: str = "unigram_cache"

    def __post_init__(self):
        if not 0 <= self.lam < 1:
            raise ValueError("the cache weight lambda must be in [0, 1)")

    @property
    def description(self) -> str:
        return (f"in-context unigram cache: {1 - self.lam:g} x training unigram + {self.lam:g} x "
                f"frequencies of the tokens seen so far in the window")

    def probs(self, context) -> np.ndarray:
        """The full next-token distribution after the window's inputs `context` (1-D)."""
        context = _as_numpy(context)
        seen = np.bincount(context, minlength=len(self.unigram.counts)) / len(context)
        return (1 - self.lam) * self.unigram.probs() + self.lam * seen

    def nll(self, inputs, targets, loss_mask=None) -> Tensor:
        inputs, targets = _as_numpy(inputs), _as_numpy(targets)
        seen = occurrences_so_far(inputs, targets)
        length = np.arange(1, inputs.shape[-1] + 1)
        p = (1 - self.lam) * np.exp(self.unigram.log_p[targets]) + self.lam * seen / length
        return _masked(-np.log(p), loss_mask)


def occurrences_so_far(inputs: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """n[b, t] = #{s ≤ t : inputs[b, s] == targets[b, t]} in O(B·T log(B·T)): inputs and targets
    become events sorted by (row, value, time, inputs before targets at equal time); a target's
    count is the number of input events before it in its (row, value) group."""
    rows, length = inputs.shape
    if rows == 0 or length == 0:
        return np.zeros(inputs.shape, np.int64)
    row = np.repeat(np.arange(rows), length)
    t = np.tile(np.arange(length), rows)
    values = np.concatenate([inputs.ravel(), targets.ravel()])
    groups = np.concatenate([row, row]) * (values.max() + 1) + values
    times = np.concatenate([2 * t, 2 * t + 1])  # an input at time t precedes the target at t
    order = np.lexsort((times, groups))
    is_input = (np.arange(2 * rows * length) < rows * length)[order]
    before = np.cumsum(is_input) - is_input  # input events strictly before, over all groups
    g = groups[order]
    group_start = np.r_[True, g[1:] != g[:-1]]
    start_index = np.maximum.accumulate(np.where(group_start, np.arange(len(g)), 0))
    count = before - before[start_index]
    out = np.empty(2 * rows * length, np.int64)
    out[order] = count
    return out[rows * length:].reshape(rows, length)


def fit_baselines(tokens: np.ndarray, vocab_size: int, *, delta: float = 1.0,
                  discount: float = 0.75, cache_lambda: float = 0.1
                  ) -> dict[str, UnigramModel | BigramModel | CacheModel]:
    """{name: model} of the three baselines fit on the training split's tokens."""
    unigram = fit_unigram(tokens, vocab_size, delta)
    return {"unigram": unigram, "bigram": fit_bigram(tokens, vocab_size, discount, unigram),
            "unigram_cache": CacheModel(unigram, cache_lambda)}
