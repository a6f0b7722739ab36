"""Text corpora for the language-modelling tasks: finding the data, tokenizers, an on-disk token
cache, the windows a text task trains and evaluates on, and n-gram baselines.

Pipeline (every step is a plain function; the task module wires them together):

    corpus = load_splits("wikitext-103", data_dir=...)      # local files first, then the hub
    tok = make_tokenizer("gpt2", path=..., corpus=corpus, cache_dir=...)
    train = cached_tokens(corpus, "train", tok, cache_dir)    # (read-only uint16 memmap, meta)
    x = training_windows(train.tokens, n, seq_len, generator) # (n, seq_len + 1) LongTensor
    inputs, targets, mask = evaluation_windows(test.tokens, seq_len)
    unigram = fit_unigram(train.tokens, tok.vocab_size); unigram.nll(inputs, targets, mask)

One module a job, each importing only the layers below it:

    errors.py       CorpusError and its kinds
    sources.py      finding and loading the data (CorpusSpec, Corpus, load_splits, the hub)
    tokenizers.py   byte, GPT-2 and trained BPE tokenizers (BPE training reads sources)
    token_cache.py  the memory-mapped token cache (reads sources, uses tokenizers)
    windows.py      training and evaluation windows of a split's tokens
    metrics.py      nats per token, perplexity, bits per byte
    baselines.py    n-gram baselines fit on the training split

This package re-exports their public names for reading (`from tasks import corpora`). To
monkeypatch a function, patch it in the submodule that looks it up, not here.

Errors a user can fix (no data, a missing split, no tokenizer file) are `CorpusError`s whose
message is one line; the caller turns them into exit code 2.

`datasets`, `tokenizers` and `tqdm` are imported inside the functions that need them, so
importing this package is cheap and works without the `text` extra.
"""
from tasks.corpora.baselines import (BigramModel, CacheModel, UnigramModel, fit_baselines,
                                     fit_bigram, fit_unigram, occurrences_so_far)
from tasks.corpora.errors import CorpusError, CorpusNotFound, MissingSplit, TokenizerNotFound
from tasks.corpora.metrics import bits_per_byte, nats_per_token, perplexity
from tasks.corpora.sources import (BUILDERS, CACHEDIR_TAG, CORPORA, SPLIT_KEYWORDS, SPLITS,
                                   Corpus, CorpusSpec, PathLike, SampleBy, document_texts,
                                   hub_reachable, load_splits, no_text)
from tasks.corpora.token_cache import (CACHE_FORMAT, TokenSplit, cache_paths, cached_meta,
                                       cached_tokens, split_tokens_bound, token_dtype)
from tasks.corpora.tokenizers import (EOT, TRAIN_PIECE, ByteTokenizer, HFTokenizer,
                                      TextTokenizer, make_tokenizer, read_tokenizer,
                                      training_pieces)
from tasks.corpora.windows import (evaluation_starts, evaluation_window_count,
                                   evaluation_windows, training_windows, windows_at)

__all__ = [
    # errors
    "CorpusError", "CorpusNotFound", "MissingSplit", "TokenizerNotFound",
    # sources
    "BUILDERS", "CACHEDIR_TAG", "CORPORA", "SPLIT_KEYWORDS", "SPLITS", "Corpus", "CorpusSpec",
    "PathLike", "SampleBy", "document_texts", "hub_reachable", "load_splits", "no_text",
    # tokenizers
    "EOT", "TRAIN_PIECE", "ByteTokenizer", "HFTokenizer", "TextTokenizer", "make_tokenizer",
    "read_tokenizer", "training_pieces",
    # token cache
    "CACHE_FORMAT", "TokenSplit", "cache_paths", "cached_meta", "cached_tokens",
    "split_tokens_bound", "token_dtype",
    # windows
    "evaluation_starts", "evaluation_window_count", "evaluation_windows", "training_windows",
    "windows_at",
    # metrics
    "bits_per_byte", "nats_per_token", "perplexity",
    # baselines
    "BigramModel", "CacheModel", "UnigramModel", "fit_baselines", "fit_bigram", "fit_unigram",
    "occurrences_so_far",
]
