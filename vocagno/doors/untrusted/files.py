"""Names, caps and files: what every reader of a file from elsewhere goes through first.

- A name read from such a file (a tokenizer file's key, a shard's name in ``.metadata`` or ``index.json``, an object
  key, an archive member) becomes a path only through ``inside``: a relative path of plain names, never ``..``, an
  absolute path, a backslash or a NUL, so nothing is read or written outside the folder it belongs to.
- A file is opened by ``open_regular`` (``read_bytes``, ``read_json``): a regular file only (no device, FIFO or
  socket), never through a link, never more bytes than its size said when it was opened (a ``/proc`` file says 0),
  and within a size cap (``cap``) checked before anything is read; a folder handed whole to a library by
  ``check_folder``.
- A number from such a file that becomes an allocation or a loop bound is checked against the bytes that hold it
  and a cap. Caps (``CAPS``) are raised per job with the environment variable ``VOCAGNO_MAX_<NAME>``
  (docs/files-from-elsewhere.md).
- What a refusal quotes of an error a crafted file made a library raise is ``reason``'s one line.
"""

from __future__ import annotations

import errno
import io
import json
import os
import stat
from pathlib import Path, PurePosixPath
from typing import Any

from vocagno.errors import Refused

__all__ = ["CAPS", "BadCap", "UntrustedFile", "cap", "check_folder", "inside", "open_regular", "plain_name",
           "read_bytes", "read_json", "reason"]


class UntrustedFile(Refused):
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


# ---- caps: the most of each thing a file from elsewhere may make vocagno read, hold or loop over ----

# name -> (default, what it bounds). Raised for one job by VOCAGNO_MAX_<NAME> (an integer).
CAPS = {
    "json_bytes": (256 << 20, "a JSON file: index.json, vocagno.json, a part's or job's state, a model's config; and "
                              "a model or tokenizer folder's .json, .txt and .model files (tokenizer.json, ...)"),
    "shard_bytes": (1 << 30, "one shard, compressed or not (the converter writes at most 64 MiB)"),
    "shards": (1_000_000, "shards in one index.json"),
    "samples": (200_000_000, "samples in one index.json (Streaming keeps a few int64 numbers per sample)"),
    "document_bytes": (64 << 20, "one document of a corpus (a .jsonl line, a .txt file, a record's text)"),
    "file_bytes": (64 << 30, "any other single file: a corpus file, a checkpoint, a model's weights"),
    "layers": (1024, "layers, experts or blocks one model config makes transformers build (num_hidden_layers, ...)"),
}


class BadCap(UntrustedFile):
    """A cap set in the environment that is no positive whole number: refused where the file it bounds is read."""


def cap(name: str) -> int:
    """The cap ``name`` of ``CAPS``: its default, or ``VOCAGNO_MAX_<NAME>`` where the environment sets it."""
    default, _ = CAPS[name]
    variable = f"VOCAGNO_MAX_{name.upper()}"
    value = os.environ.get(variable)
    if value is None:
        return default
    try:
        number = int(value.replace("_", ""))
    except ValueError:
        number = -1
    if number < 1:
        raise BadCap(f"{variable}={value!r}: a positive whole number of "
                         f"{'bytes' if name.endswith('bytes') else name} (unset, {default:,})")
    return number


def reason(error: BaseException) -> str:
    """What a one-line refusal quotes of an error that a crafted file made a library raise: its type and the first
    line of its message (at most 120 characters), or its type alone."""
    text = str(error).splitlines()[0][:120] if str(error).strip() else ""
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _over_cap(source: object, size: int, name: str) -> UntrustedFile:
    return UntrustedFile(f"{source}: refused: {size:,} bytes, more than the {cap(name):,} allowed for "
                         f"{CAPS[name][1].split(':')[0]} (raise VOCAGNO_MAX_{name.upper()} if it is right)")


def _whole(value: object, low: int, high: int) -> bool:
    """Whether ``value``, read from a file, is a whole number (not a bool) from ``low`` to ``high``."""
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


# ---- files: regular ones, inside their folder, never more than they said ----

_KINDS = {stat.S_IFDIR: "a folder", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket", stat.S_IFLNK: "a symbolic link"}


def _kind(mode: int) -> str:
    return _KINDS.get(stat.S_IFMT(mode), "not a regular file")


class _Sized(io.RawIOBase):
    """A file read up to the size ``fstat`` gave when it was opened, and refused if more is there: a file under
    ``/proc`` says it has 0 bytes and reads as many as it likes, and a file that grows while read is not the one
    checked."""

    def __init__(self, fd: int, size: int, name: str):
        self._file = os.fdopen(fd, "rb", buffering=0)
        self.size, self.name, self._left = size, name, size

    def readable(self) -> bool:
        return True

    def fileno(self) -> int:  # for a reader that maps the file (pyarrow): ``size`` is what it may map
        return self._file.fileno()

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_END:  # the end is where fstat said, not where the file may have grown to
            offset, whence = self.size + offset, io.SEEK_SET
        position = self._file.seek(offset, whence)
        self._left = max(self.size - position, 0)
        return position

    def tell(self) -> int:
        return self._file.tell()

    def readinto(self, buffer) -> int:
        if self._left == 0:
            if self._file.read(1):
                raise UntrustedFile(f"{self.name}: refused: it holds more than the {self.size:,} bytes its size "
                                    "says (a file of /proc or /sys, or one that grew while read)")
            return 0
        view = memoryview(buffer)[: self._left]
        n = self._file.readinto(view)
        self._left -= n or 0
        return n

    def close(self) -> None:
        self._file.close()
        super().close()


def open_regular(path: str | Path, max_bytes: int | None = None, folder: str | Path | None = None,
                 cap_name: str = "file_bytes"):
    """A binary file object of the regular file at ``path``, refused (``UntrustedFile``) where it is a link, a
    device, a FIFO or a socket, or larger than ``max_bytes`` (the size stated for it, else the cap ``cap_name``).
    ``folder``: ``path`` is a relative path inside it, opened one part after the other without following a link (a
    linked subfolder leads out). It reads the bytes ``fstat`` counted when it was opened, and no more."""
    limit = cap(cap_name) if max_bytes is None else max_bytes
    name = str(Path(folder) / path) if folder is not None else str(path)
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    opened: list[int] = []
    try:
        if folder is None:
            fd = os.open(path, flags)
        else:
            parts = inside("", str(path), name, "path").parts
            opened.append(os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
            for part in parts[:-1]:
                opened.append(os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                                      dir_fd=opened[-1]))
            fd = os.open(parts[-1], flags, dir_fd=opened[-1])
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
            if os.path.islink(name):
                kind = "a symbolic link"
            elif folder is not None and not any(os.path.islink(Path(folder).joinpath(*parts[:i]))
                                                for i in range(1, len(parts))):
                raise FileNotFoundError(errno.ENOENT, "a file stands where its path needs a folder", name) from None
            else:
                kind = "a path through a link"
            raise UntrustedFile(f"{name}: refused: {kind}: vocagno reads regular files only, and follows no link "
                                "(copy the file itself there)") from None
        raise
    finally:
        for descriptor in opened:
            os.close(descriptor)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
        os.close(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UntrustedFile(f"{name}: refused: {_kind(info.st_mode)}: vocagno reads regular files only")
        if max_bytes is not None and max_bytes < cap(cap_name):  # the size that was stated for it, not the cap
            raise UntrustedFile(f"{name}: refused: {info.st_size:,} bytes, more than the {max_bytes:,} expected")
        raise _over_cap(name, info.st_size, cap_name)
    os.set_blocking(fd, True)
    return io.BufferedReader(_Sized(fd, info.st_size, name))


def read_bytes(path: str | Path, max_bytes: int | None = None, folder: str | Path | None = None,
               cap_name: str = "file_bytes") -> bytes:
    """The whole content of a regular file, as ``open_regular`` allows it."""
    with open_regular(path, max_bytes, folder, cap_name) as f:
        return f.read()


def read_json(path: str | Path, folder: str | Path | None = None) -> Any:
    """A JSON file from elsewhere, within the ``json_bytes`` cap; refused in one line when it is not JSON."""
    data = read_bytes(path, folder=folder, cap_name="json_bytes")
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as error:
        where = Path(folder) / path if folder is not None else path
        raise UntrustedFile(f"{where}: refused: not JSON ({str(error).splitlines()[0][:120]})") from None


def check_folder(folder: str | Path, max_bytes: int | None = None, cap_name: str = "file_bytes") -> list[Path]:
    """Every file under ``folder`` (sorted, relative), each a regular file within the cap, no link, device or FIFO
    anywhere inside: for a folder handed whole to a library that opens it itself (a model or tokenizer folder)."""
    folder = Path(folder)
    limit = cap(cap_name) if max_bytes is None else max_bytes
    files = []
    for where, folders, names in os.walk(folder, followlinks=False):
        for entry in sorted(folders + names):
            path = Path(where) / entry
            try:
                info = os.lstat(path)
            except FileNotFoundError:
                raise UntrustedFile(f"{path}: refused: it went away while {folder} was checked") from None
            if stat.S_ISDIR(info.st_mode):
                continue
            if not stat.S_ISREG(info.st_mode):
                raise UntrustedFile(f"{path}: refused: {_kind(info.st_mode)} in {folder}: vocagno reads regular files "
                                    "only, and follows no link (copy the file itself there)")
            if info.st_size > limit:
                raise _over_cap(path, info.st_size, cap_name)
            files.append(path.relative_to(folder))
    return sorted(files)
