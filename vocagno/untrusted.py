"""Files someone else wrote (a checkpoint in a shared bucket, a corpus folder, shards on an out-root): the one place
that decides what of them is trusted.

- A name read from such a file (a tokenizer file's key, a shard's name in ``.metadata`` or ``index.json``, an object
  key, an archive member) becomes a path only through ``inside``: a relative path of plain names, never ``..``, an
  absolute path, a backslash or a NUL, so nothing is read or written outside the folder it belongs to.
- A sharded checkpoint's ``.metadata`` (a pickle) is read by ``read_dcp_metadata``: only the exact ``(module, name)``
  pairs ``torch.distributed.checkpoint`` writes there are resolved, never a dotted name.
- A whole checkpoint (and every object in a sharded one's shards) is read by ``load_torch``: ``torch.load`` with
  ``weights_only=True`` and the few types a Composer checkpoint holds (``CHECKPOINT_GLOBALS``).
"""

from __future__ import annotations

import datetime
import io
import pickle
import pickletools
import shutil
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import torch
from torch.torch_version import TorchVersion

__all__ = ["CHECKPOINT_GLOBALS", "UntrustedFile", "inside", "load_torch", "plain_name", "read_dcp_metadata", "remove"]


class UntrustedFile(ValueError):
    """A file from elsewhere that is refused; the message names it and says why, in one line."""


def plain_name(name: object, source: str, what: str = "name") -> str:
    """``name``, read from ``source``, if it is one plain file name: a non-empty string without ``/``, ``\\`` or NUL
    that is not ``.`` or ``..``."""
    if (not isinstance(name, str) or name in ("", ".", "..") or any(c in name for c in "/\\\0")
            or len(name.encode("utf-8", "surrogatepass")) > 255):
        raise UntrustedFile(f"{source}: refused: its {what} {name!r} is not a plain file name (a path outside its "
                            "folder, or no name at all)")
    return name


def inside(folder: str | Path, name: object, source: str, what: str = "name") -> Path:
    """``folder / name`` for a ``name`` read from ``source`` that must stay inside ``folder``: a relative path whose
    every part is a ``plain_name`` (``part-00001/shard.00000.mds`` passes; ``../x``, ``/tmp/x``, ``a//b`` don't)."""
    if not isinstance(name, str) or not name:
        plain_name(name, source, what)
    parts = name.split("/")
    for part in parts:
        try:
            plain_name(part, source, what)
        except UntrustedFile:
            raise UntrustedFile(f"{source}: refused: its {what} {name!r} is not a relative path inside its folder "
                                "(an absolute path, '..', an empty part, a backslash or a NUL)") from None
    return Path(folder).joinpath(*PurePosixPath(name).parts)


def remove(path: Path) -> None:
    """Remove what stands at ``path``, a scratch or staging name of ours in a folder others can write: a link planted
    there is removed, never followed (``shutil.rmtree`` refuses a link, and with ``ignore_errors`` left it in place
    for the next write to go through)."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


# What torch.distributed.checkpoint pickles into a sharded checkpoint's .metadata (torch 2.6-2.7, as Composer's
# sharded save writes it): its metadata dataclasses and memory-format enum, the filesystem writer's storage info,
# torch.Size, dtypes and layouts (``_get_layout`` looks a layout up by its name, nothing else). Exact pairs: pickle
# resolves a dotted name (``torch.ctypes.util.subprocess.Popen``) by walking attributes from the module, so a module
# prefix, or "any class of that module", would let a crafted file reach anything torch imports.
_DCP_METADATA = "torch.distributed.checkpoint.metadata"
DCP_METADATA_GLOBALS = frozenset({
    *((_DCP_METADATA, name) for name in (
        "Metadata", "MetadataIndex", "StorageMeta", "TensorStorageMetadata", "BytesStorageMetadata",
        "ChunkStorageMetadata", "TensorProperties", "_MEM_FORMAT_ENCODING")),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),  # StorageMeta.checkpoint_id: the folder it was saved to
    *(("torch", name) for name in (
        "float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
        "complex64", "complex128", "float8_e4m3fn", "float8_e5m2")),
})


class _DCPMetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) not in DCP_METADATA_GLOBALS:
            raise pickle.UnpicklingError(f"{module}.{name} is not part of torch.distributed.checkpoint's metadata")
        return super().find_class(module, name)


def read_dcp_metadata(path: Path, max_bytes: int = 1 << 30):
    """A sharded checkpoint's ``.metadata``, refused (``UntrustedFile``) unless it holds only what
    torch.distributed.checkpoint writes there; every shard name it gives is checked by ``inside``."""
    from torch.distributed.checkpoint.metadata import Metadata

    size = path.stat().st_size
    if size > max_bytes:
        raise UntrustedFile(f"{path}: refused: {size:,} bytes, more than a checkpoint's metadata ever needs")
    with open(path, "rb") as f:
        try:
            metadata = _DCPMetadataUnpickler(f).load()
        except Exception as error:  # a truncated or crafted pickle raises anything; all mean "not DCP's metadata"
            reason = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise UntrustedFile(f"{path}: refused to load: not torch.distributed.checkpoint's metadata ({reason})"
                                ) from error
    if not isinstance(metadata, Metadata) or not isinstance(getattr(metadata, "storage_data", None), dict):
        raise UntrustedFile(f"{path}: refused to load: not torch.distributed.checkpoint's metadata (it holds a "
                            f"{type(metadata).__name__})")
    # Each item names its shard file: a few names, each checked once (a tokenizer in the state is an item a token).
    checked = set()
    for info in metadata.storage_data.values():
        name = getattr(info, "relative_path", None)
        if not isinstance(name, str) or name not in checked:  # a name that is no string is refused here
            inside(path.parent, name, str(path), "shard name")
            checked.add(name)
    return metadata


# What a Composer checkpoint holds besides tensors and plain containers (its timestamps, the numpy RNG state, the
# torch version): unpickling allows these and nothing else, so a crafted checkpoint can't run code when loaded.
CHECKPOINT_GLOBALS = [
    datetime.timedelta, TorchVersion, np.ndarray, np.dtype, np.ndarray.__reduce__(np.zeros(1))[0],
    *{type(np.dtype(t)) for t in ("uint32", "int64", "float64")},
]


def load_torch(source: Any, name: str, mmap: bool = False) -> Any:
    """What ``torch.save`` wrote to ``source`` (a path or a file object, named ``name``), refused
    (``UntrustedFile``) where it holds anything but tensors, containers and ``CHECKPOINT_GLOBALS``. ``mmap``: the
    tensors are mapped from the file, not read (a check of a large checkpoint's pickle costs next to nothing)."""
    if isinstance(source, io.BytesIO):  # an object of a sharded checkpoint: most are one string or number each
        plain = _plain_data(source)
        if plain is not _NOT_PLAIN:
            return plain
    with torch.serialization.safe_globals(CHECKPOINT_GLOBALS):
        try:
            return torch.load(source, map_location="cpu", weights_only=True, mmap=mmap)
        except pickle.UnpicklingError as error:
            # torch's message starts with advice to load with weights_only=False; what was refused comes after.
            lines = [line.strip() for line in str(error).splitlines() if line.strip()]
            refused = next((line for line in lines if "Unsupported" in line or "WeightsUnpickler" in line), lines[0])
            raise UntrustedFile(
                f"{name}: refused to load: it holds objects that are not tensors, containers or the few types a "
                f"Composer checkpoint needs, and unpickling them could run code ({refused})"
            ) from error


# What torch.save writes besides its pickle for an object that holds no tensor (torch 2.x): any other record (a
# tensor's storage under data/, TorchScript's constants.pkl) and the archive goes to torch.load.
_PLAIN_RECORDS = frozenset({".format_version", ".storage_alignment", "byteorder", "version", ".data/version",
                            ".data/serialization_id"})
# The opcodes of plain data (strings, numbers, booleans, None, lists, tuples, dicts), each one that torch's
# weights_only unpickler takes too: no global, call, build or persistent id, so nothing but those types is made.
_PLAIN_OPCODES = frozenset({
    "PROTO", "STOP", "MARK", "EMPTY_LIST", "APPEND", "APPENDS", "EMPTY_DICT", "SETITEM", "SETITEMS", "EMPTY_TUPLE",
    "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "NONE", "NEWTRUE", "NEWFALSE", "BININT", "BININT1", "BININT2", "LONG1",
    "BINFLOAT", "BINUNICODE", "SHORT_BINSTRING", "BINGET", "LONG_BINGET", "BINPUT", "LONG_BINPUT",
})
_NOT_PLAIN = object()


def _plain_data(source: io.BytesIO) -> Any:
    """What ``torch.save`` wrote to ``source``, where it is a zip archive of plain data only, read as torch.load's zip
    path reads it; else ``_NOT_PLAIN``, for ``torch.load`` to read or refuse. The result of torch's weights_only
    unpickler, built by Python's own: a sharded checkpoint holds a Composer run's tokenizer as an object a token, and
    torch's, which runs in Python, took most of the seconds a check or an export of one spends."""
    if source.tell() != 0:
        return _NOT_PLAIN
    try:
        if source.read(4) != b"PK\x03\x04":  # torch.load's test for its zip path (not a copy of the whole buffer)
            return _NOT_PLAIN
        source.seek(0)
        archive = torch._C.PyTorchFileReader(source)
        records = set(archive.get_all_records())
        if "data.pkl" not in records or not records - {"data.pkl"} <= _PLAIN_RECORDS:
            return _NOT_PLAIN
        if "byteorder" in records and archive.get_record("byteorder") not in (b"little", b"big"):
            return _NOT_PLAIN
        if ".storage_alignment" in records:
            int(archive.get_record(".storage_alignment"))  # as torch.load reads it, whatever the archive holds
        data = archive.get_record("data.pkl")
        memo, previous = 0, None  # pickle numbers what it keeps 0, 1, ...: a larger one makes Python's unpickler grow
        for position, (opcode, argument, _) in enumerate(pickletools.genops(data)):
            if opcode.name not in _PLAIN_OPCODES or (opcode.name == "PROTO" and position > 0):
                return _NOT_PLAIN
            if opcode.name == "APPENDS" and previous == "MARK":  # nothing to add: Python's adds it to anything
                return _NOT_PLAIN
            if opcode.name in ("BINPUT", "LONG_BINPUT"):
                if argument != memo:
                    return _NOT_PLAIN
                memo += 1
            previous = opcode.name
        return pickle.loads(data, encoding="utf-8")  # torch.load's encoding (for SHORT_BINSTRING)
    except Exception:  # not torch's zip, or a pickle it would refuse: torch.load says what is wrong
        return _NOT_PLAIN
    finally:
        source.seek(0)
