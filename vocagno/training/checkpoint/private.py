"""The checkpoint a run loads, as the copy vocagno checked: fetched from its store, or copied from its folder, into a
folder this process made and only its user can enter, checked there, and only then named to Composer.

Composer finds and loads checkpoints by itself (autoresume's latest link, a store's keys, the local copy it looks for
before it downloads) and unpickles what it finds with ``torch.load(weights_only=False)``. A check of the file it
will find is a check of another file as soon as someone who can write the folder or the bucket renames one, swaps one
in between the check and the load, or plants one where Composer looks first. So vocagno alone resolves which
checkpoint a run loads (``resolve`` and the store's latest link, read once), and Composer is handed only the private
copy: a path it opens as it is, under a name vocagno chose (``checkpoint.pt``, or the folder ``checkpoint``), so no
suffix of someone else's makes it untar or decompress anything either.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from vocagno.doors.untrusted import open_regular
from vocagno.errors import Refused
from vocagno.training.checkpoint.files import (
    METADATA, BadCheckpoint, _SHARD_FILE, _check_saved, _fetch_remote, _reason, _untrusted, fetch, resolve,
)
from vocagno.training.checkpoint.state import check_objects

__all__ = ["WHOLE_COPY", "SHARDED_COPY", "private_folder", "take"]

WHOLE_COPY = "checkpoint.pt"  # the name of a whole checkpoint's copy
SHARDED_COPY = "checkpoint"  # the name of a sharded checkpoint's copy (a folder)


def private_folder(prefix: str = "vocagno-checkpoint-") -> Path:
    """A new folder (``mkdtemp``: ``0700``) in the temporary folder (``TMPDIR``, else ``/tmp``), which must be one
    nobody but this user and root can rename things in: each folder on its way is this user's or root's, and
    writable by no one else unless sticky (as ``/tmp`` is). Refused (``Refused``) otherwise: someone who can rename
    the private folder can put their own in its place."""
    base = Path(tempfile.gettempdir()).resolve()
    for folder in (base, *base.parents):
        info = os.stat(folder)
        others_write = stat.S_IMODE(info.st_mode) & 0o022 and not info.st_mode & stat.S_ISVTX
        if info.st_uid not in (0, os.geteuid()) or others_write:
            raise Refused(f"{folder}: the temporary folder {base} lies in a folder others can rename things in, so a "
                          "private copy of a checkpoint there is not private: set TMPDIR to a folder only you can "
                          "write (with room for a checkpoint)")
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base))


def take(location: str, into: Path) -> Path:
    """The checkpoint at ``location`` (a whole ``.pt``, a sharded folder, a save folder or its latest link; local, or
    in an object store) as a copy inside ``into`` (a folder of ``private_folder``), checked there as every checkpoint
    is (``fetch``'s checks and ``check_objects``): what a framework may then load by path. Anything wrong raises
    ``BadCheckpoint`` (``IncompleteCheckpoint`` for a save cut short) naming ``location``."""
    into = Path(into)
    if "://" in location:
        fetched = _fetch_remote(location, into / "fetched")
        copy = into / (SHARDED_COPY if fetched.is_dir() else WHOLE_COPY)
        os.rename(fetched, copy)
        source = location
    else:
        source = resolve(location)
        copy = into / (SHARDED_COPY if source.is_dir() else WHOLE_COPY)
        try:
            _copy_folder(source, copy) if source.is_dir() else _untrusted(_copy_file, source, copy)
        except OSError as error:
            raise BadCheckpoint(_reason(error, source)) from error
    try:
        if copy.is_dir():
            _check_saved(copy)
        else:
            fetch(str(copy), os.devnull)
        check_objects(copy)
    except OSError as error:
        raise BadCheckpoint(_reason(error, Path(location))) from error
    except BadCheckpoint as error:  # named as the user knows it, not by its copy
        raise type(error)(str(error).replace(str(copy), str(source))) from error
    return copy


def _copy_file(source: Path, copy: Path, folder: Path | None = None) -> None:
    """The bytes of the regular file ``source`` (inside ``folder`` when given, reached without following a link) as
    they are when it is opened, into the new file ``copy``: by the kernel (``copy_file_range``, which shares the
    blocks on a file system that can: a reflink), without passing through Python."""
    with open_regular(source, folder=folder) as reader:
        size = os.fstat(reader.fileno()).st_size
        out = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            left = size
            while left:
                try:
                    n = os.copy_file_range(reader.fileno(), out, left)
                except OSError:  # no copy_file_range between these file systems: the kernel's sendfile
                    n = os.sendfile(out, reader.fileno(), size - left, left)
                if n == 0:
                    break  # the file shrank since it was opened: the copy is checked as it is
                left -= n
        finally:
            os.close(out)


def _copy_folder(source: Path, copy: Path) -> None:
    """A sharded checkpoint's files (its ``.metadata`` and shards; nothing else, no link, no folder) copied into the
    new folder ``copy``."""
    names = sorted(os.listdir(source))
    others = [name for name in names if name != METADATA and not _SHARD_FILE.fullmatch(name)]
    if others:
        raise BadCheckpoint(f"{source}: a checkpoint folder holding files a sharded save does not write: "
                            f"{', '.join(others[:3])}")
    copy.mkdir(mode=0o700)
    for name in names:
        _untrusted(_copy_file, Path(name), copy / name, source)
