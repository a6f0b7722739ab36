"""Language modelling on a text corpus: WikiText-103, PG-19, or any local text (paper 000 §5.2,
Tables 1, 4, 5).

Training windows of seq_len + 1 tokens are drawn at uniform positions of the training split's
token cache, from the (seed, rank, step) generator like every task's batches; the held-out set
is the evaluation split (task.eval_split) cut into windows (non-overlapping by default, strided
with task.eval_stride), every token scored once. There is no Bayes predictor for text: the
references are labelled baselines fit on the training split (unigram, bigram, an in-context
unigram cache), the record reports perplexity, nats per token and bits per byte, and the
leaderboard shows perplexity for these sections.

The corpus is found, tokenized and cached by the tasks/corpora/ package. Finding it happens
when the task is built (so a missing corpus is a one-line configuration error before anything
runs); tokenizing happens once, in `prepare_data` (rank 0) or on first use, into a
memory-mapped cache under task.cache_dir."""
from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import sys
from pathlib import Path

import torch

from tasks import corpora as text_corpus
from tasks.base import Batch, Reference, Task
from tasks.configs import PYDOC, TextConfig
from tasks.files import write_atomic

TOKENIZER_VOCAB = {"gpt2": 50257, "byte": 256}
# Corpora found in this process, by what finds them: a suite's entries and the checks made
# before a run share one load instead of reading the files again.
_FOUND: dict[tuple, text_corpus.Corpus] = {}


class TextTask(Task):
    family = "text"
    kind = "tokens"
    scoring = "perplexity"
    Config = TextConfig
    description = "language modelling on a text corpus (WikiText-103, PG-19, local files); perplexity"
    eval_size_option = "task.eval_windows"  # the split decides the held-out size, not n

    def __init__(self, config: TextConfig | None = None, *, batch_size: int = 32, seed: int = 0):
        super().__init__(config, batch_size=batch_size, seed=seed)
        require_text_packages()
        self.corpus = find_corpus(self.config)  # a CorpusError (a ValueError) when there is none
        self._tokenizer = None
        self._tokens: dict[str, text_corpus.TokenSplit] = {}
        self._baselines = None
        self.progress = True  # progress bars while tokenizing (the runner sets trainer.progress)
        # Cheap to load: a missing or unreadable file is found now, not after the run has started
        # (a bpe tokenizer without its file is trained, later, and saved there).
        given = self.config.tokenizer_file
        if self.config.tokenizer != "bpe" or (given and Path(given).is_file()):
            self.tokenizer()
        self._check_enough_tokens()

    def _check_enough_tokens(self, exact_below: int = 16) -> None:
        """A split too short to use is a configuration error before the start, not a failed
        record after it, nor an `ok` record whose perplexity rests on a few tokens (check_split).
        Counted exactly when the tokenizer is loaded and the split is within `exact_below`
        windows of the limit, or task.eval_windows asks for a number of windows (tokenized now,
        into the cache the run reuses); else bounded by the split's bytes (split_tokens_bound).
        Only a bpe tokenizer still to be trained leaves the exact count to the run: `setup`
        checks it, on every rank, before the first step."""
        c = self.config
        for split in ("train", c.eval_split):
            bound = text_corpus.split_tokens_bound(self.corpus, split)
            count, exact = bound, False
            if self._tokenizer is not None and (
                    bound < exact_below * (c.seq_len + 1) or (split == c.eval_split
                                                              and c.eval_windows > 0)):
                try:
                    count = len(text_corpus.cached_tokens(self.corpus, split, self._tokenizer,
                                                          self.cache_dir(), progress=False).tokens)
                    exact = True
                except OSError:  # a cache that cannot be written: the run will say so
                    pass
            self.check_split(split, count, exact)

    def check_split(self, split: str, n_tokens: int, exact: bool = True) -> None:
        """CorpusError unless a split of n_tokens tokens (at most that many when not `exact`)
        is enough: training needs one window of seq_len + 1 tokens; evaluation one whole window
        too (a shorter split scored, padded, as an `ok` record: a headline perplexity of 2
        tokens), and at least the task.eval_windows windows asked for (fewer would be scored
        without a word). trainer.eval_sequences does not size a text task's held-out set: the
        split does (capped by task.eval_windows)."""
        c = self.config
        has = f"the {split} split of {self.corpus.description} has " \
              f"{'' if exact else 'at most '}{n_tokens:,} tokens"
        window = c.seq_len + 1
        if n_tokens < window:
            what = "training" if split == "train" else "evaluation"
            raise text_corpus.CorpusError(
                f"{has}, fewer than one {what} window of task.seq_len + 1 = {window} tokens; "
                "lower task.seq_len or give it more text")
        if split == c.eval_split and c.eval_windows > 0:
            windows = text_corpus.evaluation_window_count(n_tokens, c.seq_len,
                                                          c.eval_stride or None)
            if windows < c.eval_windows:
                stride = f", stride {c.eval_stride}" if c.eval_stride else ""
                raise text_corpus.CorpusError(
                    f"{has}: {windows} evaluation window(s) of task.seq_len={c.seq_len}{stride}, "
                    f"fewer than task.eval_windows={c.eval_windows}; lower task.eval_windows "
                    "(0 scores the whole split) or give it more text")

    # --- sizes ---------------------------------------------------------------------------
    @property
    def input_dim(self) -> int:
        # bpe learns at most bpe_vocab_size ids (fewer on a small corpus): the embedding has
        # room for all of them
        return TOKENIZER_VOCAB.get(self.config.tokenizer, self.config.bpe_vocab_size)

    @property
    def output_dim(self) -> int:
        return self.input_dim

    @property
    def held_out_from_prior(self) -> bool:
        return False  # there is no prior; nothing can "beat Bayes"

    # --- data ----------------------------------------------------------------------------
    def cache_dir(self) -> Path:
        if self.config.cache_dir:
            return Path(self.config.cache_dir)
        if self.config.data_dir and Path(self.config.data_dir).is_dir():
            return Path(self.config.data_dir) / "cache"
        return Path(os.path.expanduser("~/.cache/icl-bench/text/cache"))

    def tokenizer(self) -> text_corpus.TextTokenizer:
        if self._tokenizer is None:
            c = self.config
            self._tokenizer = text_corpus.make_tokenizer(
                c.tokenizer, path=c.tokenizer_file or None, vocab_size=c.bpe_vocab_size,
                corpus=self.corpus, cache_dir=self.cache_dir(), progress=self.progress)
            if self._tokenizer.vocab_size > self.input_dim:
                raise ValueError(f"the {c.tokenizer} tokenizer has {self._tokenizer.vocab_size} "
                                 f"ids, more than the model's vocabulary {self.input_dim}")
        return self._tokenizer

    def split_tokens(self, split: str) -> text_corpus.TokenSplit:
        """The split's tokens (a read-only memmap) and its cache sidecar; tokenized on first use."""
        if split not in self._tokens:
            self._tokens[split] = text_corpus.cached_tokens(
                self.corpus, split, self.tokenizer(), self.cache_dir(),
                progress=self.progress)
        return self._tokens[split]

    def prepare_data(self) -> None:
        """Lightning calls this on one process per node before the others start: tokenize the
        splits a run needs there, once, instead of on every rank at the same time."""
        for split in ("train", self.config.eval_split):
            self.split_tokens(split)

    def setup(self, stage: str) -> None:
        """Lightning calls this on every rank after prepare_data, before the first step: the
        exact sizes of the splits, which the checks could only bound when the bpe tokenizer was
        still to be trained (a failed record then, never a short split scored as `ok`)."""
        for split in ("train", self.config.eval_split):
            self.check_split(split, len(self.split_tokens(split).tokens))

    def sample(self, n: int, generator: torch.Generator) -> Batch:
        windows = text_corpus.training_windows(self.split_tokens("train").tokens, n,
                                               self.config.seq_len, generator)
        windows = windows.to(generator.device)
        inputs, targets = windows[:, :-1], windows[:, 1:]
        return Batch(inputs, targets, torch.ones_like(inputs, dtype=torch.bool))

    def held_out(self, n: int, split: int = 0) -> Batch:
        """The evaluation split in windows (every token scored once); `n` does not apply: the
        split decides the number of windows (task.eval_windows caps it)."""
        c = self.config
        tokens = self.split_tokens(c.eval_split).tokens
        starts, first = text_corpus.evaluation_starts(
            len(tokens), c.seq_len, c.eval_stride or None, c.eval_windows or None)
        inputs, targets, mask = text_corpus.windows_at(tokens, starts, first, c.seq_len)
        return Batch(inputs, targets, mask)

    def held_out_size(self, n: int) -> int:
        """The number of windows held_out scores (`n` does not apply), without tokenizing: from the
        split's token cache when it is there, else from a bound on its tokens."""
        c = self.config
        meta = (text_corpus.cached_meta(self.corpus, c.eval_split, self._tokenizer, self.cache_dir())
                if self._tokenizer is not None else None)
        n_tokens = meta["n_tokens"] if meta else text_corpus.split_tokens_bound(self.corpus,
                                                                                c.eval_split)
        return text_corpus.evaluation_window_count(n_tokens, c.seq_len, c.eval_stride or None,
                                                   c.eval_windows or None)

    def latent_floats(self) -> int:
        """The n-gram baselines' scoring workspace, per window: CacheModel.nll sorts events of
        every position, ~20 int64 arrays of the held-out set's size (164 bytes a position,
        measured on pydoc); 24 floats a position."""
        return 24 * self.seq_len

    def bytes_per_token(self) -> float:
        """UTF-8 bytes of the evaluation split's text per token: bits per byte = nats per token
        / ln 2 / bytes_per_token."""
        meta = self.split_tokens(self.config.eval_split).meta
        return meta["n_bytes"] / max(1, meta["n_tokens"])

    def cache_identity(self) -> dict:
        """What the reference cache's key needs beyond the config: the corpus's files (names,
        sizes, times) and the tokenizer's mapping."""
        return {"corpus": self.corpus.identity, "tokenizer": self.tokenizer().identity}

    # --- references: n-gram baselines fit on the training split --------------------------
    def references(self) -> dict[str, Reference]:
        def nll(name):
            return lambda batch: self.baselines()[name].nll(batch.inputs, batch.targets,
                                                           batch.loss_mask)
        descriptions = {
            "unigram": "unigram of the training split, add-one smoothing",
            "bigram": "bigram of the training split, interpolated absolute discounting (D = "
                      "0.75) with the unigram",
            "unigram_cache": f"in-context unigram cache: {1 - self.config.cache_lambda:g} x "
                             f"training unigram + {self.config.cache_lambda:g} x the window's "
                             "counts so far"}
        return {name: Reference(name, "baseline", text, loss=nll(name))
                for name, text in descriptions.items()}

    def baselines(self) -> dict:
        if self._baselines is None:
            self._baselines = text_corpus.fit_baselines(
                self.split_tokens("train").tokens, self.input_dim,
                cache_lambda=self.config.cache_lambda)
        return self._baselines

    def summarize(self, batch: Batch, losses: dict, scores: dict | None = None) -> dict:
        return {"corpus": portable(self.corpus.description), "corpus_key": self.corpus.key,
                "tokenizer": self.config.tokenizer, "eval_split": self.config.eval_split,
                "bytes_per_token": self.bytes_per_token()}


def portable(description: str) -> str:
    """A corpus description without this machine's directories: every absolute path by its last
    component ("local folder pydoc-topics-py3.11"); corpus_key (name and content identity)
    says which data it was."""
    return re.sub(r"(?<![\w.])/(?:[^\s/]+/)*([^\s/]+)", r"\1", description)


def pydoc_corpus_dir() -> Path:
    """Python's own help texts (`pydoc_data.topics`, ~460 KB of English) written as
    train/validation/test .txt files under the user's cache, once: topics in key order, every
    10th (from the 9th) to validation, every 10th (from the 10th) to test, the rest to train."""
    from pydoc_data.topics import topics
    folder = Path(os.path.expanduser("~/.cache/icl-bench/text")) / \
        f"{PYDOC}-py{sys.version_info.major}.{sys.version_info.minor}"
    if all((folder / f"{split}.txt").is_file() for split in text_corpus.SPLITS):
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    parts = {split: [] for split in text_corpus.SPLITS}
    for i, key in enumerate(sorted(topics)):
        parts[{8: "validation", 9: "test"}.get(i % 10, "train")].append(topics[key])
    for split, texts in parts.items():
        text = "\n\n".join(texts)
        write_atomic(folder / f"{split}.txt",
                     lambda temporary: Path(temporary).write_text(text, encoding="utf-8"))
    return folder


TEXT_PACKAGES = ("datasets", "tokenizers")  # dependencies of the package (pyproject.toml)


def require_text_packages() -> None:
    """A CorpusError naming the install command when an install left out what reads and
    tokenizes corpora (`pip install --no-deps`, a hand-made environment)."""
    missing = [name for name in TEXT_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        raise text_corpus.CorpusError(
            f"text tasks need {' and '.join(missing)}: pip install {' '.join(missing)}")


@contextlib.contextmanager
def quiet_datasets():
    """Without `datasets`' per-split progress bars: they would print around a one-line error, and
    reading local files takes seconds at most (the tokenizer's own bar shows the long part)."""
    import datasets
    was_enabled = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if was_enabled:
            datasets.enable_progress_bars()


def find_corpus(config: TextConfig) -> text_corpus.Corpus:
    key = (config.corpus, config.data_dir, config.hub_name, config.hub_config, config.text_field,
           config.sample_by, config.eval_split)
    found = _FOUND.get(key)
    if found is None:
        data_dir = config.data_dir or (str(pydoc_corpus_dir()) if config.corpus == PYDOC else None)
        with quiet_datasets():
            found = text_corpus.load_splits(
                config.corpus, data_dir=data_dir, hub_name=config.hub_name or None,
                hub_config=config.hub_config or None, text_field=config.text_field,
                sample_by=config.sample_by or None, splits=("train", config.eval_split))
        _FOUND[key] = found
    return found
