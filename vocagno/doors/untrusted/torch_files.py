"""What ``torch.save`` wrote, from elsewhere: a whole checkpoint (and every object in a sharded one's shards) is read
by ``load_torch``: ``torch.load`` with ``weights_only=True`` and the few types a Composer checkpoint holds
(``CHECKPOINT_GLOBALS``), after ``check_torch_zip`` found its zip one torch reads as it is.
"""

from __future__ import annotations

import datetime
import io
import os
import pickle
import pickletools
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.torch_version import TorchVersion

from vocagno.doors.untrusted.files import UntrustedFile, open_regular, reason

__all__ = ["CHECKPOINT_GLOBALS", "check_torch_zip", "load_torch"]


# What a Composer checkpoint holds besides tensors and plain containers (its timestamps, the numpy RNG state, the
# torch version): unpickling allows these and nothing else, so a crafted checkpoint can't run code when loaded.
CHECKPOINT_GLOBALS = [
    datetime.timedelta, TorchVersion, np.ndarray, np.dtype, np.ndarray.__reduce__(np.zeros(1))[0],
    *{type(np.dtype(t)) for t in ("uint32", "int64", "float64")},
]


def check_torch_zip(source: Any, name: str) -> bool:
    """Whether ``source`` (a path or a file object) is a zip, as torch tells (its first bytes); refused where it is one
    Python's zipfile can't read, or holds a compressed record, or a record larger than the file: torch.save stores its
    records as they are, and torch unpacks a record (its pickle) whole before it reads it, so a few MB deflated could
    take gigabytes. A file that is no zip (torch's legacy format) is left to torch.load."""
    import zipfile

    opened = open_regular(source) if isinstance(source, (str, Path)) else None
    f = opened or source
    start = f.tell()
    try:
        size = f.seek(0, os.SEEK_END)
        f.seek(start)
        if f.read(4) != b"PK\x03\x04":  # torch's own test of a zip: anything else is its legacy format
            return False
        f.seek(start)
        try:
            members = zipfile.ZipFile(f).infolist()
        except Exception as error:  # zipfile raises BadZipFile, ValueError, NotImplementedError, ... on a crafted one
            raise UntrustedFile(f"{name}: refused: a zip Python's zipfile can't read, where torch's reader might "
                                f"({reason(error)})") from None
        for info in members:
            if info.compress_type != zipfile.ZIP_STORED or info.file_size != info.compress_size or \
                    info.file_size > size:
                raise UntrustedFile(f"{name}: refused: its record {info.filename[:80]!r} is compressed or larger than "
                                    "the file (torch.save stores its records as they are)")
        return True
    finally:
        if opened is not None:
            opened.close()
        else:
            f.seek(start)


def load_torch(source: Any, name: str, mmap: bool = False) -> Any:
    """What ``torch.save`` wrote to ``source`` (a path or a file object, named ``name``), refused
    (``UntrustedFile``) where it holds anything but tensors, containers and ``CHECKPOINT_GLOBALS``. ``mmap``: the
    tensors are mapped from the file, not read (a check of a large checkpoint's pickle costs next to nothing)."""
    if isinstance(source, io.BytesIO):  # an object of a sharded checkpoint: most are one string or number each
        plain = _plain_data(source)
        if plain is not _NOT_PLAIN:
            return plain
    if isinstance(source, (str, Path)):  # opened once: the bytes checked are the bytes torch reads
        with open_regular(source) as opened:
            # mmap maps a file by its name: this one's, through its descriptor, not whatever the name holds by then
            return _load_torch(f"/proc/self/fd/{opened.fileno()}" if mmap else opened, opened, name, mmap)
    return _load_torch(source, source, name, mmap)


def _load_torch(source: Any, checked: Any, name: str, mmap: bool) -> Any:
    check_torch_zip(checked, name)
    with torch.serialization.safe_globals(CHECKPOINT_GLOBALS):
        try:
            return torch.load(source, map_location="cpu", weights_only=True, mmap=mmap)
        except UntrustedFile:  # the file grew while torch read it (open_regular)
            raise
        except (RuntimeError, EOFError, ValueError) as error:  # torch's reader: a zip or legacy file it can't read
            raise UntrustedFile(f"{name}: refused: not a checkpoint torch can read ({reason(error)})") from error
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
