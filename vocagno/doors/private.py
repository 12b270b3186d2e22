"""The checked copy, in a private place: what a framework loads by path (Composer a checkpoint, transformers a model or
tokenizer folder) is a copy in a folder this process made, checked there, so nobody who can write the original's
folder can change what is loaded between the check and the load (a rename, a swap, a file planted beside it).

- ``private_folder``: a new ``0700`` folder in the temporary folder (``TMPDIR``, else ``/tmp``), which must lie where
  nobody else can rename things.
- ``copy_file``: a regular file's bytes as they are when it is opened (no link followed), copied by the kernel; a
  file of this user's that nobody else may write is hard-linked instead where it can be (no disk, no time: its
  content can't change without this user's own write, and a rename of the original leaves the link as it was).
- ``copy_folder``: a folder of regular files and folders copied so, anything else refused.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from vocagno.doors.untrusted.files import UntrustedFile, check_folder, open_regular
from vocagno.errors import Refused

__all__ = ["copy_file", "copy_folder", "private_folder"]


def private_folder(prefix: str) -> Path:
    """A new folder (``mkdtemp``: ``0700``) in the temporary folder (``TMPDIR``, else ``/tmp``), which must be one
    nobody but this user and root can rename things in: each folder on its way is this user's or root's, and
    writable by no one else unless sticky (as ``/tmp`` is). Refused (``Refused``) otherwise: someone who can rename
    the private folder can put their own in its place."""
    base = Path(tempfile.gettempdir()).resolve()
    for folder in (base, *base.parents):
        info = os.stat(folder)
        others_write = stat.S_IMODE(info.st_mode) & 0o022 and not info.st_mode & stat.S_ISVTX
        if info.st_uid not in (0, os.geteuid()) or others_write:
            why = ("another user's" if info.st_uid not in (0, os.geteuid()) else
                   "writable by others and not sticky (as /tmp is)")
            where = "the temporary folder (TMPDIR)" if folder == base else f"a folder above TMPDIR {base}"
            raise Refused(f"{folder}: {where} is {why}, so someone else could put their own folder in place of a "
                          "private copy there: set TMPDIR to a folder only you can write (with room for a checkpoint "
                          "or a model)")
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base))


def copy_file(source: str | Path, copy: str | Path, folder: str | Path | None = None) -> None:
    """The regular file ``source`` (a relative path inside ``folder`` where given, reached without following a link),
    as it is when opened, at the new path ``copy``: hard-linked where it is this user's and nobody else may write
    it, else copied by the kernel (``copy_file_range``, ``sendfile``), never through Python."""
    with open_regular(source, folder=folder) as reader:
        info = os.fstat(reader.fileno())
        if _linkable(info):
            try:  # linked by its name, then kept only if the name still led to the very file opened and checked
                os.link(Path(folder or "") / source, copy, follow_symlinks=False)
                linked = os.lstat(copy)
                if (linked.st_dev, linked.st_ino) == (info.st_dev, info.st_ino):
                    return
                os.unlink(copy)
            except OSError:  # another file system, or links not allowed: copied
                pass
        _check_room(Path(copy).parent, info.st_size, Path(folder or "") / source)
        out = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            left = info.st_size
            while left:
                try:
                    n = os.copy_file_range(reader.fileno(), out, left)
                except OSError:  # no copy_file_range between these file systems: the kernel's sendfile
                    n = os.sendfile(out, reader.fileno(), info.st_size - left, left)
                if n == 0:
                    break  # the file shrank since it was opened: the copy is checked as it is
                left -= n
        finally:
            os.close(out)


def _linkable(info: os.stat_result) -> bool:
    """Whether a file may be hard-linked rather than copied: this user's, and nobody else may write it."""
    return info.st_uid == os.geteuid() and not stat.S_IMODE(info.st_mode) & 0o022


def _check_room(folder: Path, needed: int, source: str | Path) -> None:
    """Refuse (``Refused``) a copy of ``needed`` bytes that the file system of ``folder`` has no room for: a copy of
    someone else's files (sparse ones written out whole) may not fill the temporary folder."""
    if needed == 0:
        return
    info = os.statvfs(folder)
    free = info.f_bavail * info.f_frsize
    if needed > free:
        raise Refused(f"{source}: its private copy needs {needed / 2**30:.1f} GiB and {tempfile.gettempdir()} has "
                      f"{free / 2**30:.1f} GiB free: set TMPDIR to a folder only you can write with room for it")


def copy_folder(source: str | Path, copy: str | Path) -> Path:
    """Every file of the folder ``source`` (regular files and folders only: ``check_folder``) at the same place under
    the new folder ``copy``, each by ``copy_file``. A file that is a link by the time it is copied is refused, not
    followed."""
    source, copy = Path(source), Path(copy)
    files = check_folder(source)
    infos = []
    for relative in files:
        try:
            infos.append(os.lstat(source / relative))
        except FileNotFoundError as error:
            raise UntrustedFile(f"{source / relative}: refused: it went away while it was copied") from error
    _check_room(copy.parent, sum(info.st_size for info in infos if not _linkable(info)), source)
    copy.mkdir(mode=0o700)
    for relative in files:
        (copy / relative).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            copy_file(relative, copy / relative, folder=source)
        except FileNotFoundError as error:
            raise UntrustedFile(f"{source / relative}: refused: it went away while it was copied") from error
    return copy
