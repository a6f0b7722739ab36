"""Task families. Each module here defines one family (a `Task` subclass with a `family` name);
they are discovered on first use, so adding a family means a module, its config in
tasks/configs.py and a YAML file."""
from __future__ import annotations

import importlib
import pkgutil

CONTRACT = ("Batch", "Reference", "Task")
__all__ = [*CONTRACT, "task_families"]


def __getattr__(name: str):
    """The contract's names (tasks.base) load on first use: it imports torch and Lightning, which
    the package's light modules (files, used by every report writer) must not pull in."""
    if name in CONTRACT:
        return getattr(importlib.import_module("tasks.base"), name)
    raise AttributeError(f"module 'tasks' has no attribute {name!r}")


def task_families() -> dict[str, type]:
    """{family name: Task subclass} for every module of this package."""
    from tasks.base import Task
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
    found: dict[str, type[Task]] = {}
    stack = list(Task.__subclasses__())
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        if "family" in cls.__dict__:
            found[cls.family] = cls
    return dict(sorted(found.items()))
