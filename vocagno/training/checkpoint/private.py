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
from pathlib import Path

from vocagno.doors.private import copy_file, private_folder as _private_folder
from vocagno.training.checkpoint.files import (
    METADATA, BadCheckpoint, _SHARD_FILE, _check_saved, _fetch_remote, _reason, _untrusted, fetch, resolve,
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
            _copy_folder(source, copy) if source.is_dir() else _untrusted(copy_file, source, copy)
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
        _untrusted(copy_file, Path(name), copy / name, source)
