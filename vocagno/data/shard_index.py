"""A shard folder's ``index.json``, read and checked before anything is allocated or read from it."""

from __future__ import annotations

import os

from vocagno.compat.streaming import INDEX_FILE
from vocagno.data.shards import SHARD_HASH
from vocagno.doors.untrusted import check_index, read_json

__all__ = ["read_index"]


def read_index(folder: str | os.PathLike, source: str | None = None) -> dict:
    """A shard folder's ``index.json``, read through the one way in (``untrusted.read_json``: a regular file within
    the ``json_bytes`` cap) and checked by ``untrusted.check_index`` (names inside the folder, counts and sizes its
    bytes can hold, a ``SHARD_HASH`` hash for every file) before Streaming or vocagno allocates anything from it."""
    return check_index(read_json(INDEX_FILE, folder), source or os.path.join(folder, INDEX_FILE), SHARD_HASH)
