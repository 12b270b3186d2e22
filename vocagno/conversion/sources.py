"""Reading a corpus: files (.jsonl, .json, .parquet, .arrow, .txt, any of them gzip- or zstd-compressed, and
folders of them at any depth, links to folders inside the folder given followed, a ``datasets`` ``save_to_disk``
folder among them), local or in an object store (``s3://``, ...), or a Hugging Face dataset (a configuration, data
files), as ``Source`` objects that yield ``Record``s, with a fingerprint of each file for resumption. A record's text
is one field (``--text-field``) or a template of fields (``--text-template "{title}\\n\\n{body}"``): ``TextOf``.

Nothing read aborts a conversion: a bad record is a ``Record`` with a ``problem`` (counted by reason), and a file
that can't be read at all (a corrupt .parquet or .gz) ends in one such record and is named in
``Source.error``, for the summary and a non-zero exit.

A corpus is files from elsewhere (``vocagno.doors.untrusted``): every file is opened by ``open_regular`` (a regular file,
never through a link at its own name, never more bytes than its size said), so a link in a corpus folder to
``/proc/self/environ`` or a FIFO is never read: it is listed as a path that can't be read, with why. A link to a
folder outside the folder given is listed the same way, not read. A file in a folder is opened below the folder
given, one folder at a time and through no link (``CorpusFile``): a link to a folder inside is resolved when the
folder is listed, so a subfolder swapped for a link later leads nowhere, and the file is named as one that can't be
read. What is read is bounded whatever the file holds: a document (a .jsonl line, a .txt file, a record's text) of
more than ``cap("document_bytes")`` bytes is skipped without being held whole (a line is read up to the cap, the
rest of it discarded block by block; a .parquet or .arrow value is measured by pyarrow before it becomes a Python
string), counted, and named by file and line (``Source.over_cap``, the summary); a .json file is read whole only up
to ``cap("json_bytes")`` (a larger JSON array is refused, one of JSON lines read line by line). .parquet and .arrow
files are read within bounds of their own (``vocagno.conversion.columnar``).
"""

from __future__ import annotations

import contextlib
import fnmatch
import gzip
import hashlib
import io
import json
import os
import stat
from pathlib import Path
from typing import Callable, Iterator

from vocagno.errors import Refused
from vocagno.doors.untrusted import UntrustedFile, cap, plain_name
from vocagno.shown import terminal
from vocagno.conversion.columnar import read_arrow, read_parquet
from vocagno.conversion.records import CorpusFile, Record, TextOf, decoded, numbered, over_cap_record, repaired

__all__ = ["CorpusFile", "LOCAL_SUFFIXES", "Reading", "Source", "hub_sources", "local_sources", "parse_jsonl_line",
           "sources_of"]

LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet", ".arrow", ".txt")  # in any case, optionally followed by .gz or .zst
# What datasets' save_to_disk writes beside its .arrow files: its metadata, no documents.
SAVE_TO_DISK_METADATA = ("dataset_info.json", "state.json", "dataset_dict.json")
COMPRESSED_SUFFIXES = (".gz", ".zst", ".zstd")
_GZIP_MAGIC, _ZSTD_MAGIC = b"\x1f\x8b", b"\x28\xb5\x2f\xfd"
_BOM = b"\xef\xbb\xbf"


class Source:
    """One input file (or one shard of a Hugging Face dataset): the unit that jobs split and parts are made of."""

    def __init__(self, name: str, read: Callable[[], Iterator], fingerprint: Callable[[], dict],
                 size: int | None = None, reading: Reading | None = None):
        self.name = name
        self._read = read
        self._fingerprint = fingerprint
        self.size = size  # the file's bytes as listed (None: not known before it is read, a hub dataset's shard)
        self._reading = reading  # where the read of a local file is, within it
        self._done = False
        self.error: str | None = None  # why the file could not be read (to its end), once it was read
        self.over_cap: list[str] = []  # its documents skipped as over the cap, by name and place, once it was read

    def read_bytes(self) -> int:
        """How much of the file has been read: its size once read to its end, the reader's place in it while it is
        read (.jsonl files, compressed or not, a line at a time; other formats when done), 0 before."""
        if self._done or self.size is None:
            return self.size or 0
        return min(self._reading.at() if self._reading is not None else 0, self.size)

    def records(self) -> Iterator[Record | bytes]:
        self.error, self.over_cap, self._done = None, [], False
        try:
            for record in self._read():
                if isinstance(record, Record) and record.where is not None:
                    self.over_cap.append(f"{self.name} {record.where}")
                yield record
        except Exception as error:  # the file's own problem (corrupt, truncated, unsupported): name it, go on
            self.error = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            yield Record(None, "unreadable file (named in the summary)")
        self._done = True

    def fingerprint(self) -> dict:
        """What the samples made from this source depend on: a changed file is refused when a conversion resumes.
        A file that can no longer be opened as it was listed (gone, or a folder on its way swapped for a link) is
        named as a file that can't be read (``error``), and its fingerprint says so."""
        try:
            return self._fingerprint()
        except (OSError, UntrustedFile) as error:
            why = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            self.error = self.error or why
            return {"unreadable": why}


class Reading:
    """Where the read of a local file is: the bytes of the file (as it lies, compressed or not) read so far."""

    def __init__(self):
        self.raw = None

    def at(self) -> int:
        try:
            return self.raw.tell() if self.raw is not None and not self.raw.closed else 0
        except (OSError, ValueError):
            return 0


def file_fingerprint(path: CorpusFile) -> dict:
    """Size and content hash (compared), and modification time (recorded) of a file, as opened to be read."""
    digest = hashlib.sha256()
    with path.open() as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
        size, mtime = f.raw.size, os.fstat(f.fileno()).st_mtime
    return {"bytes": size, "mtime": mtime, "sha256": digest.hexdigest()}


@contextlib.contextmanager
def _open(path: CorpusFile, reading: Reading | None = None) -> Iterator[io.BufferedIOBase]:
    """The file's bytes (``open_regular``: a regular file, not a link, no more than its size said), decompressed as
    they are read when it is gzip- or zstd-compressed, whatever its name says; ``reading`` follows the place in it."""
    with path.open() as raw:
        if reading is not None:
            reading.raw = raw
        magic = raw.peek(4)[:4]
        if magic.startswith(_GZIP_MAGIC):
            with gzip.GzipFile(fileobj=raw, mode="rb") as f:
                yield f
        elif magic == _ZSTD_MAGIC:
            import zstandard

            with zstandard.ZstdDecompressor().stream_reader(raw, closefd=False) as reader:
                yield io.BufferedReader(reader)
        else:
            yield raw


_BLOCK = 1 << 20  # what is read at a time of a line over the cap, to discard it


def _lines(f, limit: int) -> Iterator[tuple[int, bytes | None]]:
    """(number from 1, line) for each line of ``f``; None for a line of more than ``limit`` bytes (its newline not
    counted), which is never held whole: read up to the cap, the rest discarded a block at a time."""
    number = 0
    while True:
        line = f.readline(limit + 1)
        if not line:
            return
        number += 1
        if len(line) <= limit or line.endswith(b"\n"):
            yield number, line
            continue
        while True:  # over the cap: skip to the next newline
            rest = f.readline(_BLOCK)
            if not rest or rest.endswith(b"\n"):
                break
        yield number, None


def _read_jsonl(path: CorpusFile, reading: Reading | None = None) -> Iterator[bytes | Record]:
    """The raw lines: workers parse them (``parse_jsonl_line``), so the reading process stays light. A line over the
    ``document_bytes`` cap is a skipped record that names it."""
    with _open(path, reading) as f:
        for number, raw in _lines(f, cap("document_bytes")):
            if raw is None:
                yield over_cap_record(f"line {number:,}")
                continue
            if number == 1 and raw.startswith(_BOM):  # a UTF-8 byte order mark is no part of the first document
                raw = raw[len(_BOM):]
            if raw.strip():  # a blank line is no document
                yield raw


def parse_jsonl_line(raw: bytes, text_of: TextOf) -> Record:
    line = decoded(raw)
    try:
        record = text_of(json.loads(line.text))
    except json.JSONDecodeError:
        return Record(None, "invalid JSON line")
    except RecursionError:
        return Record(None, "JSON nested too deeply")
    if record.text is not None and line.problem:
        record.problem = line.problem
    return record


def _read_bytes(path: CorpusFile, limit: int) -> bytes | None:
    """The file's content (decompressed, without a BOM), or None when it holds more than ``limit`` bytes (no more
    than ``limit + 1`` of them are read)."""
    with _open(path) as f:
        data = f.read(limit + len(_BOM) + 1)
    data = data[len(_BOM):] if data.startswith(_BOM) else data
    return None if len(data) > limit else data


def _read_json(path: CorpusFile, text_of: TextOf) -> Iterator[Record | bytes]:
    """A JSON array of records, read whole within the ``json_bytes`` cap; a larger array is refused (the file is
    named as one that can't be read). JSON lines under a .json name are read as a .jsonl file is, of any length."""
    limit = cap("json_bytes")
    data = _read_bytes(path, limit)
    if data is None:
        with _open(path) as f:
            array = f.read(4096).removeprefix(_BOM).lstrip().startswith(b"[")
        if not array:  # JSON lines under a .json name
            yield from _read_jsonl(path)
            return
        raise UntrustedFile(f"{path}: refused: a JSON array of more than {limit:,} bytes, more than the "
                            "json_bytes cap allows a file read whole (raise VOCAGNO_MAX_JSON_BYTES if it is right, "
                            "or write it as JSON lines)")
    # Bytes that are not UTF-8 stay lone surrogates through the parse, so each document whose text holds some is
    # repaired and counted as a .jsonl line is; only the rows are kept while the file's documents are read.
    text = data.decode("utf-8", "surrogateescape")
    del data
    try:
        rows = json.loads(text)
    except json.JSONDecodeError:
        del text
        yield from _read_jsonl(path)  # JSON lines under a .json name
        return
    del text
    if not isinstance(rows, list):
        yield Record(None, "a .json file that is not a list of objects")
        return
    yield from map(repaired, numbered(map(text_of, rows), "record"))


def _read_txt(path: CorpusFile) -> Iterator[Record]:
    """The file as one document; one over the ``document_bytes`` cap is skipped after reading no more than it."""
    data = _read_bytes(path, cap("document_bytes"))
    yield over_cap_record("(the whole file, one document)") if data is None else decoded(data)


def _format(path: Path | CorpusFile) -> str | None:
    """The reader a file name asks for (``.JSONL``, ``.jsonl.gz``, ``.jsonl.zst``: ``.jsonl``), or None."""
    name, compression = os.path.splitext(path.name.lower())
    if compression not in COMPRESSED_SUFFIXES:
        name = path.name.lower()
    suffix = os.path.splitext(name)[1]
    return suffix if suffix in LOCAL_SUFFIXES else None


def local_sources(inputs: list[str], text_of: TextOf, split: str = "train") -> list[Source]:
    files: list[tuple[Path, CorpusFile]] = []  # (the name it is known by, where it is read from)
    for item in inputs:
        path = Path(item)
        if path.is_dir() and (path / "dataset_dict.json").is_file():  # save_to_disk of a DatasetDict: the split's
            if not (path / split).is_dir():
                splits = sorted(p.name for p in path.iterdir() if p.is_dir())
                raise Refused(f"{path} (a saved DatasetDict) has no split {split!r}; --split one of "
                              f"{', '.join(splits)}")
            path = path / split
        if path.is_dir():
            given = path.resolve()
            below, unreadable = _files_under(path)
            found = [p for p in below if not (p.name in SAVE_TO_DISK_METADATA and any(path.glob("*.arrow")))]
            ignored = [p for p in found if _format(p) is None]
            for count, what, names in ((len(unreadable), "path(s) that can't be read", unreadable),
                                       (len(ignored), f"file(s) that are not {'/'.join(LOCAL_SUFFIXES)}[.gz/.zst]",
                                        [str(p.relative_to(path)) for p in ignored])):
                if count:
                    print(terminal(f"{path}: ignored {count} {what}: {', '.join(names[:10])}"
                                   + (", ..." if count > 10 else "")))
            if len(ignored) == len(found):
                raise Refused(f"{path} holds no {', '.join(LOCAL_SUFFIXES)} files (or .gz/.zst of them)")
            files += [(p, CorpusFile(below[p], given)) for p in found if _format(p) is not None]
        elif path.exists():  # a file named on the command line: a link to one is followed (it is the user's)
            kind = _kind(os.stat(path).st_mode)
            if kind is not None:
                raise UntrustedFile(f"{path}: refused: {kind}: only regular files are read (the input named)")
            if _format(path) is None:
                raise Refused(f"{path}: unsupported file type (use {', '.join(LOCAL_SUFFIXES)}, or .gz/.zst)")
            files.append((path, CorpusFile(Path(os.path.realpath(path)))))
        else:
            raise Refused(f"input {item} does not exist")
    sources = []
    for p, r in files:
        reading = Reading()
        sources.append(Source(str(p), lambda r=r, reading=reading: _read(r, text_of, reading),
                              lambda r=r: file_fingerprint(r), size=_size(r), reading=reading))
    return sources


def _size(path: CorpusFile) -> int | None:
    """The bytes of the file as it is listed (None where it can't be reached now: named when it is read)."""
    try:
        return os.stat(path.relative if path.folder is None else path.folder / path.relative).st_size
    except OSError:
        return None


def _kind(mode: int) -> str | None:
    """What a file that is not a regular one is (None for a regular file)."""
    if stat.S_ISREG(mode):
        return None
    for test, kind in ((stat.S_ISLNK, "a link"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISDIR, "a folder")):
        if test(mode):
            return kind
    return "not a regular file"


def _files_under(folder: Path) -> tuple[dict[Path, Path], list[str]]:
    """The regular files under ``folder`` at any depth, through links to folders inside it too, sorted by the path
    they are listed at, each with its real path relative to the resolved ``folder`` (every link on its way resolved
    now, so that it is opened there through no link), and what can't be read, by name and why: a link to nothing, a
    link to a file (a file is read only as itself: a link to ``/proc/self/environ`` would publish the converter's
    environment), a link to a folder outside ``folder`` (no link leads out of the folder given: a folder elsewhere is
    an input of its own), a link back to a folder already read (a loop, or a second link to one), a folder that can't
    be listed, a FIFO, a socket or a device."""
    files: dict[Path, Path] = {}
    unreadable: list[str] = []
    given = folder.resolve()
    seen = {given}

    def cannot_list(error: OSError) -> None:
        unreadable.append(f"{Path(error.filename).relative_to(folder)} (can't be listed: {error.strerror})")

    for top, folders, names in os.walk(folder, onerror=cannot_list, followlinks=True):
        top = Path(top)
        here = top.resolve()
        if here != given and given not in here.parents:  # swapped for a link to elsewhere while it was listed
            folders.clear()
            unreadable.append(f"{top.relative_to(folder)} (a link to a folder outside {folder})")
            continue
        folders.sort()  # which of two links to one folder reads it: always the same
        for name in list(folders):
            real = (top / name).resolve()
            if real != given and given not in real.parents:
                folders.remove(name)
                unreadable.append(f"{(top / name).relative_to(folder)} (a link to a folder outside {folder}: give "
                                  "it as an input of its own)")
                continue
            if real in seen:
                folders.remove(name)
                why = "a loop: a link to a folder it is in" if real == here or real in here.parents else \
                    "a link to a folder already read"
                unreadable.append(f"{(top / name).relative_to(folder)} ({why})")
            seen.add(real)
        for name in names:
            path = top / name
            try:
                kind = _kind(os.lstat(path).st_mode)
            except OSError as error:  # gone since it was listed
                unreadable.append(f"{path.relative_to(folder)} (can't be read: {error.strerror})")
                continue
            if kind is None:
                files[path] = (here / name).relative_to(given)
                continue
            if kind == "a link":
                kind = "a link to a file: only regular files are read" if path.exists() else "a link to nothing"
            else:
                kind += ": only regular files are read"
            unreadable.append(f"{path.relative_to(folder)} ({kind})")
    return dict(sorted(files.items())), sorted(unreadable)


def _read(path: CorpusFile, text_of: TextOf, reading: Reading | None = None) -> Iterator[Record | bytes]:
    """A local file's records, by the reader its name asks for (a .jsonl file's with ``reading`` at its place)."""
    readers = {".jsonl": _read_jsonl, ".json": _read_json, ".parquet": read_parquet, ".arrow": read_arrow,
               ".txt": _read_txt}
    reader = readers[_format(path)]
    if reader is _read_jsonl:
        return reader(path, reading)
    return reader(path) if reader is _read_txt else reader(path, text_of)


def remote_sources(pattern: str, text_of: TextOf) -> list[Source]:
    """Files in an object store: ``s3://bucket/corpus/`` (its files, at any depth; ``s3://bucket``: the whole
    bucket's), one file, or a glob matched as a shell matches paths, a part between ``/`` at a time
    (``s3://bucket/corpus/*.jsonl.zst``: not those in its sub-folders), listed and read through Streaming's clients
    (boto3 for S3), as the out-root is written. A file is downloaded when its records are first read, into a
    temporary folder, and deleted when they are all read: one file on local disk at a time, never the corpus. Its
    fingerprint is its content's."""
    import tempfile

    from streaming.base.storage import CloudUploader

    scheme, _, rest = pattern.partition("://")
    bucket, _, key = rest.partition("/")
    globbed = any(c in key for c in "*?[")
    prefix = key[: min((key.index(c) for c in "*?[" if c in key), default=len(key))]
    try:
        with tempfile.TemporaryDirectory() as scratch:
            keys = CloudUploader.get((scratch, f"{scheme}://{bucket}"), exist_ok=True).list_objects(prefix) or []
    except Exception as error:  # each client raises its own errors: all mean the store can't be read
        raise Refused(f"input {pattern}: the object store can't be read: {type(error).__name__}: "
                      f"{str(error).splitlines()[0] if str(error) else ''}") from error
    if globbed:
        keys = [k for k in keys if _glob_matches(k, key)]
    elif key in keys:
        keys = [key]
    elif key.strip("/"):
        keys = [k for k in keys if k.startswith(key.rstrip("/") + "/")]
    chosen = sorted(k for k in keys if _format(Path(k)) is not None)
    ignored = sorted(set(keys) - set(chosen))
    if ignored:
        print(terminal(f"{pattern}: ignored {len(ignored)} object(s) that are not "
                       f"{'/'.join(LOCAL_SUFFIXES)}[.gz/.zst]: {', '.join(ignored[:10])}"
                       + (", ..." if len(ignored) > 10 else "")))
    if not chosen:
        raise Refused(f"input {pattern}: no {', '.join(LOCAL_SUFFIXES)} files (or .gz/.zst of them) there")
    return [_remote_source(f"{scheme}://{bucket}/{k}", text_of) for k in chosen]


def _glob_matches(key: str, pattern: str) -> bool:
    """Whether an object key matches a glob as a shell matches a path: part by part, so ``*`` takes no ``/``."""
    parts, pattern_parts = key.split("/"), pattern.split("/")
    return len(parts) == len(pattern_parts) and all(map(fnmatch.fnmatchcase, parts, pattern_parts))


def _remote_source(url: str, text_of: TextOf) -> Source:
    import tempfile

    from streaming.base.storage import CloudDownloader

    content: dict = {}
    name = plain_name(url.rsplit("/", 1)[1], url, "object key's last part")  # the name it is downloaded under

    def fetched(scratch: str) -> CorpusFile:
        local = CorpusFile(Path(scratch) / name)
        CloudDownloader.direct_download(url, str(local))
        content.update({k: v for k, v in file_fingerprint(local).items() if k != "mtime"})
        return local

    def read() -> Iterator[Record | bytes]:
        with tempfile.TemporaryDirectory(prefix="vocagno-input-") as scratch:
            yield from _read(fetched(scratch), text_of)

    def fingerprint() -> dict:
        if not content:  # not read yet: fetched for its fingerprint alone
            with tempfile.TemporaryDirectory(prefix="vocagno-input-") as scratch:
                fetched(scratch)
        return dict(content)

    return Source(url, read, fingerprint)


def hub_sources(name: str, split: str, text_of: TextOf, subset: str | None = None,
                data_files: list[str] | None = None) -> list[Source]:
    """A Hugging Face dataset (its configuration ``subset``, its ``data_files``), streamed (nothing lands on disk
    first), one source per file shard."""
    import datasets

    try:
        dataset = datasets.load_dataset(name, subset, split=split, data_files=data_files, streaming=True)
    except ValueError as error:
        if subset is None or "BuilderConfig" not in str(error):
            raise
        raise ValueError(f"no configuration {subset!r}; --subset one of: {', '.join(_configurations(name))}") from None

    def reader(index: int):
        return lambda: numbered(map(text_of, dataset.shard(num_shards=dataset.n_shards, index=index)), "record")

    label = f"{name}{f' ({subset})' if subset else ''}[{split}]"
    return [
        Source(f"{label} shard {i}", reader(i), lambda i=i: {"dataset": name, "subset": subset, "split": split,
                                                             "data_files": data_files, "shard": i})
        for i in range(dataset.n_shards)
    ]


def _configurations(name: str) -> list[str]:
    import datasets

    try:
        return datasets.get_dataset_config_names(name)
    except Exception:  # offline and not cached: nothing to list
        return ["(the hub can't be reached to list them)"]


def sources_of(inputs: list[str], split: str, text_of: TextOf, subset: str | None = None,
               data_files: list[str] | None = None) -> list[Source]:
    """Local files when any input names one (a missing one is then an error), else one Hugging Face dataset; with
    ``subset`` or ``data_files``, always a Hugging Face dataset (a hub name, or a local dataset folder)."""
    hub = subset is not None or data_files is not None
    if not hub and any("://" in item for item in inputs):  # files in object stores, and local ones beside them
        return [source for item in inputs for source in (
            remote_sources(item, text_of) if "://" in item else local_sources([item], text_of, split))]
    if not hub and (any(Path(item).exists() for item in inputs) or len(inputs) > 1):
        return local_sources(inputs, text_of, split)
    if len(inputs) > 1:
        raise Refused("--subset and --data-files name one Hugging Face dataset: give one --input")
    if not hub and _format(Path(inputs[0])) is not None:
        raise Refused(f"input {inputs[0]} does not exist")
    try:
        return hub_sources(inputs[0], split, text_of, subset, data_files)
    except Exception as error:  # datasets raises many kinds: offline, no such repo, no such split
        raise Refused(
            f"input {inputs[0]} is no local file or folder, and as a Hugging Face dataset it could not be "
            f"loaded: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        ) from error
