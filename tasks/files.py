"""Writing files whole: the one atomic-write helper of the project, at the lowest layer (tasks/;
bench imports tasks, never the reverse) so that tasks/ (the text corpora's caches) and bench/
(reports, logs, weights, the reference cache) both use it. Standard library only."""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def shared_mode() -> int:
    """The mode a file created the ordinary way would get (0644 under the usual umask 022):
    mkstemp's 0600 would hide records and reports from the other users of a shared machine."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def write_atomic(path: Path, write) -> None:
    """Call write(temporary path) and rename the result onto path, so readers see the old file
    or the new one, never half of one; the temporary file (hidden, `.tmp-<name>.*`) is removed
    if anything fails. Every file but a run record (bench.records.write_record, which never
    replaces one) is written this way."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".tmp-{path.name}.", suffix=path.suffix)
    os.close(fd)
    try:
        os.chmod(tmp, shared_mode())
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
