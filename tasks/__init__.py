"""Task families. Each module here defines one family (a `Task` subclass with a `family` name);
they are discovered on first use, so adding a family means adding a module and a YAML file."""
from __future__ import annotations

import importlib
import pkgutil

from tasks.base import Batch, Reference, Task

__all__ = ["Batch", "Reference", "Task", "task_families"]


def task_families() -> dict[str, type[Task]]:
    """{family name: Task subclass} for every module of this package."""
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
