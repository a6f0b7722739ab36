"""Writing files whole: the one atomic-write helper of the project, at the lowest layer (tasks/;
bench imports tasks, never the reverse) so that tasks/ (the text corpora's caches) and bench/
(reports, logs, weights, the reference cache) both use it; and files that carry a digest of
their bytes beside them (checkpoints, weights: write_with_digest, check_digest). Standard
library only."""
from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
import tempfile
from pathlib import Path

DIGEST_SUFFIX = ".sha256"  # <file>.sha256 beside <file>, in `sha256sum`'s format


def shared_mode() -> int:
    """The mode a file created the ordinary way would get (0644 under the usual umask 022):
    mkstemp's 0600 would hide records and reports from the other users of a shared machine."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def write_atomic(path: Path, write) -> None:
    """Call write(temporary path) and rename the result onto path, so readers see the old file
    or the new one, never half of one; the temporary file (hidden, `.tmp-<name>.*`) is removed
    if anything fails. Every file but a run record (bench.records.store.write_record, which never
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


class DamagedFile(ValueError):
    """A file whose bytes cannot be trusted (check_digest): one line saying why. `missing`: it
    has no digest at all (written before digests existed, or copied without it)."""

    def __init__(self, message: str, missing: bool = False):
        super().__init__(message)
        self.missing = missing


def digest_path(path: str | os.PathLike) -> Path:
    """Where the sha256 of `path`'s bytes is kept: <file>.sha256 beside the file (beside the file
    a link leads to, so that linking a checkpoint keeps its digest)."""
    return Path(os.path.realpath(path) + DIGEST_SUFFIX)


def file_sha256(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def write_with_digest(path: Path, write) -> None:
    """write_atomic(path, write), then the sha256 of the bytes written into digest_path(path),
    also whole. The old digest goes before the new file takes its place: a crash in between
    leaves a file without a digest (refused as such), never a digest that does not fit, so a
    mismatch always means the file changed after it was written. A digest that cannot be
    written takes the file with it: a file is kept with its digest or not at all."""
    sidecar = Path(str(path) + DIGEST_SUFFIX)
    digest: list[str] = []

    def write_and_hash(temporary: str) -> None:
        write(temporary)
        digest.append(file_sha256(temporary))  # the bytes the rename puts in place
        with contextlib.suppress(FileNotFoundError):
            os.unlink(sidecar)

    write_atomic(path, write_and_hash)
    try:
        write_atomic(sidecar, lambda temporary: Path(temporary).write_text(
            f"{digest[0]}  {path.name}\n", encoding="ascii"))
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise


def _kind(mode: int) -> str:
    return ("a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "a device" if stat.S_ISCHR(mode)
            or stat.S_ISBLK(mode) else "not a regular file")


def check_digest(path: str | os.PathLike) -> None:
    """Raise DamagedFile unless `path` is a regular file whose bytes hash to the sha256 written
    beside it (write_with_digest, or `sha256sum FILE > FILE.sha256`). Read before the file is
    unpickled: a flipped byte in a tensor loads without complaint (nothing else checks it)."""
    try:
        mode = os.stat(path).st_mode
    except OSError as error:
        raise DamagedFile(f"cannot be read: {error.strerror or error}") from None
    if not stat.S_ISREG(mode):
        raise DamagedFile(f"is {_kind(mode)}, not a regular file")
    sidecar = digest_path(path)
    try:
        sidecar_mode = os.stat(sidecar).st_mode
    except FileNotFoundError:
        raise DamagedFile(f"has no digest ({sidecar} is missing)", missing=True) from None
    except OSError as error:
        raise DamagedFile(f"its digest {sidecar} cannot be read: {error.strerror or error}") \
            from None
    if not stat.S_ISREG(sidecar_mode):  # a FIFO would block the read below
        raise DamagedFile(f"its digest {sidecar} is {_kind(sidecar_mode)}, not a regular file")
    try:
        with open(sidecar, "rb") as file:
            words = file.read(4096).split()
    except OSError as error:
        raise DamagedFile(f"its digest {sidecar} cannot be read: {error.strerror or error}") \
            from None
    expected = words[0].decode("latin-1").lower() if words else ""
    if not re.fullmatch(r"[0-9a-f]{64}", expected):
        raise DamagedFile(f"its digest {sidecar} holds no sha256 (64 hexadecimal digits)")
    try:
        actual = file_sha256(path)
    except OSError as error:
        raise DamagedFile(f"cannot be read: {error.strerror or error}") from None
    if actual != expected:
        raise DamagedFile(f"does not match its digest {sidecar} (sha256 {actual[:12]}..., "
                          f"written {expected[:12]}...): it changed after it was written "
                          "(damaged, truncated or edited)")
