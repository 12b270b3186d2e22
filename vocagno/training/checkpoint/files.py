"""Where a checkpoint is and whether its save finished: a whole file, a sharded folder or a save folder's latest,
local or in an object store (fetched to a local folder first), and the errors that name what is wrong."""

from __future__ import annotations

import os
import re
import zipfile
from pathlib import Path
from typing import Callable

from vocagno.errors import Refused
from vocagno.doors.untrusted import (
    UntrustedFile, check_folder, inside, load_torch, open_regular, plain_name, read_bytes, read_dcp_metadata,
)


LATEST = "latest-rank0.pt"  # Composer's latest_filename for rank 0, the rank that saves a sharded run's symlink
METADATA = ".metadata"  # torch.distributed.checkpoint's index of a sharded checkpoint, written after every shard
WHOLE = re.compile(r"ep(\d+)-ba(\d+)-rank(\d+)\.pt")  # Composer's default save_filename
SHARDED = re.compile(r"ep(\d+)-ba(\d+)")  # its folder for a sharded checkpoint (sharded_ckpt_prefix_dir)


class BadCheckpoint(Refused):
    """A location that holds no usable checkpoint; the message names it and says what is wrong, in one line."""


class IncompleteCheckpoint(BadCheckpoint):
    """A checkpoint whose save was positively cut short (the file or index written last is missing): the one kind
    autoresume's ``repair`` removes."""


def _first_line(error: Exception) -> str:
    """An error's first line (empty for an error without a message): what a one-line refusal quotes of it."""
    lines = str(error).strip().splitlines()
    return lines[0] if lines else ""


def _untrusted(call: Callable, *args):
    """``call(*args)``, a reader of ``vocagno.doors.untrusted``, with what it refuses as a ``BadCheckpoint``."""
    try:
        return call(*args)
    except UntrustedFile as error:
        raise BadCheckpoint(str(error)) from error


def load_checkpoint(path: str) -> dict:
    """A whole Composer checkpoint, unpickled with ``weights_only=True`` and ``CHECKPOINT_GLOBALS`` allowed."""
    return _untrusted(load_torch, path, path)


def is_checkpoint(location: str) -> bool:
    """Whether ``location`` names a checkpoint or a save folder rather than a Hugging Face name or folder."""
    path = Path(location)
    return ("://" in location or location.endswith(".pt") or (path / METADATA).exists() or (path / LATEST).exists()
            or (path.is_dir() and any(path.glob("*.distcp"))))


def resolve(location: str) -> Path:
    """The local checkpoint ``location`` names: a whole file or a sharded folder where it is one, a save folder's
    latest (or a latest link) followed one hop to the checkpoint beside it. The one resolution of local names: what
    it returns is what is checked, and what is copied for a framework to load."""
    path = Path(location)
    if path.is_symlink() and re.fullmatch(r"latest-rank\d+\.pt", path.name):  # Composer's link beside its target
        return resolve(str(_latest_target(path)))
    if not path.exists():
        raise BadCheckpoint(f"{location}: no such file or folder")
    if path.is_dir() and not (path / METADATA).exists():
        if (path / LATEST).exists():
            return resolve(str(_latest_target(path / LATEST)))
        if not any(path.glob("*.distcp")):
            raise BadCheckpoint(f"{location}: not a checkpoint: a folder without {METADATA} (a sharded checkpoint) or "
                                f"{LATEST} (a save folder)")
    return path


def has_latest(folder: str) -> bool:
    """Whether a save folder (local, or in an object store) has a latest checkpoint link for autoresume to follow."""
    if "://" in folder:
        store, prefix = _store(folder)
        return f"{prefix}/{LATEST}.symlink" in set(_listing(store, folder, f"{prefix}/{LATEST}"))
    return os.path.lexists(Path(folder) / LATEST)


def fetch(location: str, into: str) -> Path:
    """The checkpoint at ``location`` as a local path: a local one where it is (``resolve``), a remote one downloaded
    into the folder ``into``. Nothing but a complete checkpoint is returned; a save cut short raises
    ``IncompleteCheckpoint``, anything else wrong ``BadCheckpoint``."""
    if "://" in location:
        return _fetch_remote(location, Path(into))
    path = resolve(location)
    if path.is_dir():
        _untrusted(check_folder, path)  # torch's reader opens its files itself: regular files only, no link
        _check_saved(path)
        return path
    try:
        cut_short = _untrusted(_zip_cut_short, path)
    except OSError as error:
        raise BadCheckpoint(f"{path}: can't be read: {error.strerror or error}") from error
    if cut_short:
        raise IncompleteCheckpoint(f"{path}: an incomplete checkpoint: torch.save's zip without the directory "
                                   "it writes last (its save was interrupted)")
    if not zipfile.is_zipfile(path):
        raise BadCheckpoint(f"{path}: not a checkpoint: torch.save writes a zip file, and this is not one")
    if _untrusted(_pickle_missing, path):
        raise IncompleteCheckpoint(f"{path}: an incomplete checkpoint: torch.save's zip closed before its "
                                   "data.pkl was written (its save was interrupted)")
    return path


def _pickle_missing(path: Path) -> bool:
    """Whether a zip is a ``torch.save`` interrupted while pickling: torch's writer closes its zip on the way out of
    the interruption, holding the records it writes first (``version``, ``byteorder``) and no ``data.pkl``. A zip
    holding neither is no checkpoint (``BadCheckpoint``)."""
    try:
        with open_regular(path) as f, zipfile.ZipFile(f) as archive:
            names = [name.split("/", 1)[-1] for name in archive.namelist()]
    except (zipfile.BadZipFile, NotImplementedError, ValueError) as error:
        raise BadCheckpoint(f"{path}: not a checkpoint: a zip Python's zipfile can't read ({error})") from None
    if "data.pkl" in names:
        return False
    if not {"version", "byteorder", ".format_version"} & set(names):
        raise BadCheckpoint(f"{path}: not a checkpoint: a zip without the data.pkl torch.save writes")
    return True


def _latest_target(latest: Path) -> Path:
    """What a save folder's ``latest-rank{r}.pt`` names: itself where it is a file, else its link's target, which
    must be a checkpoint's plain name in the same folder (Composer links it so)."""
    if not latest.is_symlink():
        return latest
    name = os.readlink(latest)
    target = latest.parent / _untrusted(plain_name, name, str(latest), "link target")
    if target.is_symlink():  # one hop: a latest names a checkpoint, never another link (a loop of them included)
        raise BadCheckpoint(f"{latest}: refused: its link target {name!r} is itself a link: Composer's latest names "
                            "a checkpoint beside it")
    return target


# What a sharded save writes into its folder: each rank's shards, then .metadata (through a .tmp file it renames).
_SHARD_FILE = re.compile(r"__\d+_\d+\.distcp|\.metadata\.tmp")


def _only_shards(names) -> bool:
    return all(_SHARD_FILE.fullmatch(name) for name in names)


def _zip_cut_short(path: Path) -> bool:
    """Whether a file is positively a ``torch.save`` cut short: empty, or a zip begun (its first local header) whose
    end-of-central-directory record, written last, is missing. An ``OSError`` proves nothing and is raised; a link, a
    device or a FIFO is refused (``UntrustedFile``)."""
    with open_regular(path) as f:
        head = f.read(4)
        if not head:
            return True
        if head != b"PK\x03\x04":
            return False
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - (22 + 0xFFFF)))  # the record is 22 bytes and a comment of at most 64 KiB
        return b"PK\x05\x06" not in f.read()


def _shard_names(metadata_file: Path) -> set[str]:
    """The shard files a sharded checkpoint's ``.metadata`` names (every tensor and object points into one), each
    checked to be a plain name inside its folder."""
    return {info.relative_path for info in _untrusted(read_dcp_metadata, metadata_file).storage_data.values()}


def _missing_shards(metadata_file: Path, present: Callable[[str], bool]) -> list[str]:
    """The shards ``.metadata`` names that are not ``present`` (on disk, or in a store's listing), sorted."""
    return sorted(name for name in _shard_names(metadata_file) if not present(name))


def _store(uri: str):
    from composer.utils import maybe_create_object_store_from_uri, parse_uri

    try:
        store = maybe_create_object_store_from_uri(uri)
    except (NotImplementedError, ValueError, ImportError) as error:
        raise BadCheckpoint(f"{uri}: no object store for it: {str(error).splitlines()[0]}") from error
    return store, parse_uri(uri)[2].rstrip("/")


def _listing(store, uri: str, prefix: str) -> list[str]:
    try:
        return store.list_objects(prefix)
    except Exception as error:  # each store raises its own client's errors: all mean "can't read it"
        raise BadCheckpoint(f"{uri}: the object store can't be read: {type(error).__name__}: "
                            f"{_first_line(error)}") from error


def resolve_remote(uri: str) -> str:
    """The checkpoint ``uri`` names in its store: itself where it is a whole checkpoint's object or a sharded one's
    prefix, else the checkpoint its save folder's latest link names (``latest_key``, read once). The one resolution
    of remote names, as ``resolve`` is of local ones."""
    store, key = _store(uri)
    names = set(_listing(store, uri, key))
    scheme, _, rest = uri.partition("://")
    if key in names or f"{key}/{METADATA}" in names:
        return uri
    link = next((name for name in (f"{key}.symlink", f"{key}/{LATEST}.symlink") if name in names), None)
    if link is None:
        raise BadCheckpoint(f"{uri}: no checkpoint there: no such object, nor {METADATA} (a sharded checkpoint) or "
                            f"{LATEST}.symlink (a save folder) under it")
    import tempfile

    bucket = f"{scheme}://{rest.split('/', 1)[0]}"
    with tempfile.TemporaryDirectory(prefix="vocagno-latest-") as tmp:
        return f"{bucket}/{latest_key(store, link, Path(tmp) / 'latest.symlink', bucket)}"


def _fetch_remote(uri: str, into: Path, follow_latest: bool = True) -> Path:
    store, key = _store(uri)
    names = set(_listing(store, uri, key))
    if key in names:  # a whole checkpoint
        local = into / _untrusted(plain_name, Path(key).name, uri, "object name")
        into.mkdir(parents=True, exist_ok=True)
        store.download_object(key, str(local))
        return fetch(str(local), str(into))
    if follow_latest and f"{key}/{METADATA}" not in names:  # a save folder's latest: resolve_remote reads it
        # One hop: a latest names a checkpoint, never another latest (nor itself).
        return _fetch_remote(resolve_remote(uri), into, follow_latest=False)
    if f"{key}/{METADATA}" in names:  # a sharded checkpoint: its index, then every shard it names
        folder = into / _untrusted(plain_name, Path(key).name, uri, "object name")
        folder.mkdir(parents=True, exist_ok=True)
        store.download_object(f"{key}/{METADATA}", str(folder / METADATA))
        missing = _missing_shards(folder / METADATA, lambda name: f"{key}/{name}" in names)
        if missing:
            raise BadCheckpoint(f"{uri}: a sharded checkpoint with shards missing: {', '.join(missing)}")
        for name in sorted(_shard_names(folder / METADATA)):  # parsed again: small next to the shards' download
            store.download_object(f"{key}/{name}", str(_untrusted(inside, folder, name, uri, "shard name")))
        return folder
    raise BadCheckpoint(f"{uri}: no checkpoint there: no such object, nor {METADATA} (a sharded checkpoint) or "
                        f"{LATEST}.symlink (a save folder) under it")


def latest_key(store, link: str, local: Path, bucket: str) -> str:
    """The key a store's latest link (Composer's ``latest-rank0.pt.symlink``: a text object holding exactly one key of
    the same bucket) names, downloaded to ``local`` and read once: the one reading of it. Refused where it is
    anything but one key as Composer writes it (UTF-8, no space or control character at its ends or inside)."""
    local.parent.mkdir(parents=True, exist_ok=True)
    store.download_object(link, str(local))
    data = read_bytes(local, cap_name="json_bytes")
    try:
        key = data.decode("utf-8")
    except UnicodeDecodeError:
        key = None
    if not key or re.search(r"[\s\x00-\x1f\x7f-\x9f]", key) or key.startswith("/"):
        raise BadCheckpoint(f"{bucket}/{link}: refused: a latest link holds one key as Composer writes it, and this "
                            f"holds {data[:80]!r}: delete or rewrite it to resume")
    return key


def _check_saved(path: Path) -> None:
    """Raise ``IncompleteCheckpoint`` where the save at ``path`` (a save folder's whole file or sharded folder) was
    positively cut short, ``BadCheckpoint`` where it is wrong otherwise; judged by what the save itself writes, no
    link inside it followed."""
    if path.is_file():
        fetch(str(path), os.devnull)
        return
    names = [p.name for p in path.iterdir()]
    if METADATA not in names:
        if _only_shards(names):  # nothing, or shards alone: .metadata is written last
            raise IncompleteCheckpoint(f"{path}: an incomplete sharded checkpoint: "
                                       f"{'empty' if not names else 'shards without ' + METADATA}, which is "
                                       "written last")
        raise BadCheckpoint(f"{path}: a checkpoint folder without {METADATA}, holding files a sharded save does not "
                            "write")
    missing = _missing_shards(path / METADATA, lambda name: (path / name).is_file())
    if missing:  # not a save cut short: .metadata is written after every shard
        raise BadCheckpoint(f"{path}: a sharded checkpoint with shards missing: {', '.join(missing)}")


def _reason(error: Exception, path: Path) -> str:
    """An error's one line, naming ``path`` (a ``BadCheckpoint`` names its file already)."""
    if isinstance(error, BadCheckpoint):
        return str(error)
    return f"{path}: can't be read: {getattr(error, 'strerror', None) or error}"
