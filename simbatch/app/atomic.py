"""Files and folders that appear whole or not at all, and the cleaning up of what a killed writer left.

Everything simbatch writes goes first to a hidden sibling named ``.<name>.partial-<pid>@<host>-<random>``
and is renamed into place once complete: a crash, a full disk or Ctrl-C leaves no file that looks
like a result. An error or an interruption removes the partial file itself; only a kill (SIGKILL,
a power cut) leaves one behind, and its name says which process on which machine was writing it.
:func:`remove_leftovers` deletes those of this machine's processes that no longer exist, and nothing
else: a name without that owner, another machine's (a shared file system), or a live process's
stays, and a symbolic link is removed as a link, never followed.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path

_HOST = f"{zlib.crc32(socket.gethostname().encode()):08x}"
_OWNER = re.compile(r"^\..*\.partial-(\d+)@([0-9a-f]{8})-")


def umask() -> int:
    """The process's umask (reading it means setting it: set it straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def partial_prefix(name: str, pid: int | None = None) -> str:
    """How a partial file or folder for ``name`` starts: hidden, and owned by ``pid`` (this process) here."""
    return f".{name}.partial-{os.getpid() if pid is None else pid}@{_HOST}-"


def _alive(pid: int) -> bool:
    if pid <= 0:
        return True  # not a process of its own (0 would signal our group): never judged dead
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's process: it exists
    return True


def remove_leftovers(parent: Path) -> list[Path]:
    """Remove, from ``parent``, the partial files and folders of this machine's processes that are gone;
    return what was removed. Errors (another run cleaning at the same moment) are ignored."""
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return []
    removed = []
    for entry in entries:
        owner = _OWNER.match(entry.name)
        if owner is None or owner[2] != _HOST or _alive(int(owner[1])):
            continue
        with contextlib.suppress(OSError):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
            removed.append(Path(entry.path))
    return removed


def partial_folder(folder: Path) -> Path:
    """A new, empty partial folder beside ``folder`` (made private by mkdtemp; the caller gives it its modes)."""
    return Path(tempfile.mkdtemp(prefix=partial_prefix(folder.name), dir=folder.parent))


@contextlib.contextmanager
def atomic_file(path: Path) -> Iterator[Path]:
    """Yield a partial file's path beside ``path`` to write; on success it is renamed to ``path`` with
    the modes the umask gives a new file, on any error or interruption removed. The partial name has no
    extension of its own: say the format where a writer would infer it (``savefig(..., format="png")``).
    An OSError names ``path``."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=partial_prefix(path.name))
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~umask())
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.filename is None:
            raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from None
        raise


def write_text(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` all at once (:func:`atomic_file`)."""
    with atomic_file(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
