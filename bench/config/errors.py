"""The errors a configuration raises: each message is one line (the CLI prints it and exits 2)."""
from __future__ import annotations


class ConfigError(ValueError):
    """A user error in the configuration; its message is one line."""


class CheckFailed(ValueError):
    """A whole-run check failed; the message is one line (compose_checked turns it into
    a ConfigError)."""


def first_line(error: BaseException) -> str:
    """The first line of an error's message ("" when it has none): messages here are one line."""
    text = str(error)
    return text.splitlines()[0] if text.strip() else ""


def shown(text: str, limit: int = 80) -> str:
    """text as a message quotes it: at most `limit` characters, saying how long it was if cut."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"
