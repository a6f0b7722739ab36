"""The on-disk token cache: a split tokenized once into a read-only memory-mapped file
(<cache_dir>/<corpus.key>/<tokenizer.key>/<split>.bin) with a JSON sidecar that says it is
complete and holds the tokens' sha256.

`tqdm` and `pyarrow` are imported inside the functions that need them.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np

from tasks.corpora.errors import CorpusError, MissingSplit
from tasks.corpora.sources import Corpus, _hash_file, _tag_cache_dir, document_texts
from tasks.corpora.tokenizers import TextTokenizer
from tasks.files import write_atomic

CACHE_FORMAT = 2  # 2: the sidecar holds the tokens' sha256


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
    except (OSError, ValueError, RecursionError):
        return None
    ok = (isinstance(meta, dict) and meta.get("format") == CACHE_FORMAT
          and meta.get("tokenizer_identity") == tokenizer.identity
          and meta.get("dtype") == dtype.name
          and isinstance(meta.get("n_tokens"), int) and meta["n_tokens"] > 0
          and size == meta["n_tokens"] * dtype.itemsize)
    return meta if ok else None


def _file_sha256(path: Path) -> str:
    return _hash_file(hashlib.sha256(), path).hexdigest()


def _build_cache(corpus: Corpus, split: str, tokenizer: TextTokenizer, bin_path: Path,
                 meta_path: Path, dtype: np.dtype, progress: bool, batch_bytes: int,
                 cache_dir: Path) -> dict:
    from tqdm.auto import tqdm

    if split not in corpus:
        raise MissingSplit(f"{corpus.name} has no {split} split: found {', '.join(corpus.splits)}")
    _tag_cache_dir(cache_dir)
    bin_path.parent.mkdir(parents=True, exist_ok=True)
    dataset = corpus[split]
    document = corpus.sample_by == "document" and tokenizer.eod_id is not None
    eod = np.array([tokenizer.eod_id if document else 0], dtype=dtype)
    n_tokens = n_bytes = n_texts = rows_done = 0
    written = hashlib.sha256()  # of the tokens as written: checked on every later load
    start = time.perf_counter()
    total = len(dataset) if hasattr(dataset, "__len__") else None
    bar = tqdm(total=total, unit="row", disable=not progress,
               desc=f"tokenizing {corpus.name} {split} ({tokenizer.name})")

    def write_tokens(temporary: str) -> None:
        nonlocal rows_done  # the counts flush() adds to are the enclosing function's
        with open(temporary, "wb") as out:
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
        if n_tokens == 0:  # raised before the rename: no empty cache is left
            raise CorpusError(f"the {split} split of {corpus.name} ({corpus.description}) "
                              f"has no text")

    # The tokens first, then the meta that vouches for them (a reader trusts a .bin only with
    # its meta), each written whole (tasks.files.write_atomic).
    try:
        write_atomic(bin_path, write_tokens)
    finally:
        bar.close()
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
    text = json.dumps(meta, indent=1) + "\n"
    write_atomic(meta_path, lambda temporary: Path(temporary).write_text(text))
    return meta
