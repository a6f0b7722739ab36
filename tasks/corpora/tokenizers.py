"""Tokenizers of text corpora: UTF-8 bytes, GPT-2's byte-level BPE, and a byte-level BPE trained
on a corpus's train split (and cached as its tokenizer.json).

`tokenizers` and `huggingface_hub` are imported inside the functions that need them.
"""
from __future__ import annotations

import abc
import hashlib
import os
import sys
from pathlib import Path
from typing import Sequence

import numpy as np

from tasks.corpora.errors import TokenizerNotFound
from tasks.corpora.sources import (Corpus, _hub_mode, _slug, _tag_cache_dir, document_texts,
                                   hub_reachable)
from tasks.files import write_atomic

EOT = "<|endoftext|>"


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
    write_atomic(path, lambda temporary: tokenizer.save(str(temporary)))
    return HFTokenizer(Tokenizer.from_file(str(path)), "bpe", str(path))
