"""The errors a user fixes by providing data or files (no data, a missing split, no tokenizer
file): `CorpusError`s whose message is one line; the caller turns them into exit code 2."""
from __future__ import annotations


class CorpusError(ValueError):
    """A problem the user fixes by providing data or files; the message is one line."""


class CorpusNotFound(CorpusError):
    """Neither local files nor the hub provided the corpus."""


class MissingSplit(CorpusError):
    """The corpus was found but lacks a split that is needed."""


class TokenizerNotFound(CorpusError):
    """No tokenizer file locally and no hub to fetch it from."""
