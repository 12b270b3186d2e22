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
import re
from pathlib import Path

from vocagno.doors.private import copy_file, private_folder as _private_folder
from vocagno.training.checkpoint.files import (
    METADATA, BadCheckpoint, _SHARD_FILE, _check_saved, _fetch_remote, _shard_names, _untrusted, fetch, resolve,
)
from vocagno.training.checkpoint.state import check_objects

__all__ = ["WHOLE_COPY", "SHARDED_COPY", "private_folder", "take"]

WHOLE_COPY = "checkpoint.pt"  # the name of a whole checkpoint's copy
SHARDED_COPY = "checkpoint"  # the name of a sharded checkpoint's copy (a folder)


def private_folder() -> Path:
    """A new private folder for a checkpoint's copy (``vocagno.doors.private.private_folder``)."""
    return _private_folder("vocagno-checkpoint-")


def take(location: str, into: Path) -> Path:
    """The checkpoint at ``location`` (a whole ``.pt``, a sharded folder, a save folder or its latest link; local, or
    in an object store) as a copy inside ``into`` (a folder of ``private_folder``), checked there as every checkpoint
    is (``fetch``'s checks and ``check_objects``): what a framework may then load by path. Anything wrong raises
    ``BadCheckpoint`` (``IncompleteCheckpoint`` for a save cut short) naming ``location``, never the copy."""
    into = Path(into)
    try:
        copy = _taken(location, into)
        if copy.is_dir():
            _check_saved(copy)
        else:
            fetch(str(copy), os.devnull)
        check_objects(copy)
        return copy
    except BadCheckpoint as error:  # named as the user knows it, not by its copy (nor where it was fetched to)
        raise type(error)(re.sub(re.escape(str(into)) + r"[^:\s]*", lambda _: location, str(error))) from error
    except OSError as error:  # a store's object gone between its listing and its download, a disk full, ...
        raise BadCheckpoint(f"{location}: can't be read: {getattr(error, 'strerror', None) or error}") from error


def _taken(location: str, into: Path) -> Path:
    if "://" in location:
        fetched = _fetch_remote(location, into / "fetched")
        copy = into / (SHARDED_COPY if fetched.is_dir() else WHOLE_COPY)
        os.rename(fetched, copy)
        return copy
    source = resolve(location)
    copy = into / (SHARDED_COPY if source.is_dir() else WHOLE_COPY)
    if source.is_dir():
        _copy_folder(source, copy)
    else:
        _untrusted(copy_file, source, copy)
    return copy


def _copy_folder(source: Path, copy: Path) -> None:
    """A sharded checkpoint's ``.metadata``, then the shards the copy of it names, into the new folder ``copy``:
    nothing else of the folder (no link, no folder, no file its save does not write)."""
    names = sorted(os.listdir(source))
    others = [name for name in names if name != METADATA and not _SHARD_FILE.fullmatch(name)]
    if others:
        raise BadCheckpoint(f"{source}: a checkpoint folder holding files a sharded save does not write: "
                            f"{', '.join(others[:3])}")
    if METADATA not in names:
        _check_saved(source)  # raises: shards without the .metadata written last, or nothing
    copy.mkdir(mode=0o700)
    _untrusted(copy_file, Path(METADATA), copy / METADATA, source)
    for name in sorted(_shard_names(copy / METADATA)):
        if name in names:  # one missing is named by the copy's check
            _untrusted(copy_file, Path(name), copy / name, source)
