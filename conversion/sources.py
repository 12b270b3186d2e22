"""Reading a corpus: local files (.jsonl, .json, .parquet, .txt, any of them gzip- or zstd-compressed) or a Hugging
Face dataset, as ``Source`` objects that yield ``Record``s, with a fingerprint of each file for resumption.

Nothing read aborts a conversion: a bad record is a ``Record`` with a ``problem`` (counted by reason), and a file
that can't be read at all (a corrupt .parquet or .gz) ends in one such record and is named in
``Source.error``, for the summary and a non-zero exit.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

__all__ = ["Record", "Source", "LOCAL_SUFFIXES", "sources_of", "hub_sources", "parse_jsonl_line"]

LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet", ".txt")  # in any case, optionally followed by .gz or .zst
COMPRESSED_SUFFIXES = (".gz", ".zst", ".zstd")
_GZIP_MAGIC, _ZSTD_MAGIC = b"\x1f\x8b", b"\x28\xb5\x2f\xfd"
_BOM = b"\xef\xbb\xbf"


@dataclass
class Record:
    """A document as read, or the reason it can't be one."""

    text: str | None
    problem: str | None = None  # why text is None (skipped), or what was repaired while reading


class Source:
    """One input file (or one shard of a Hugging Face dataset): the unit that jobs split and parts are made of."""

    def __init__(self, name: str, read: Callable[[], Iterator], fingerprint: Callable[[], dict]):
        self.name = name
        self._read = read
        self._fingerprint = fingerprint
        self.error: str | None = None  # why the file could not be read (to its end), once it was read

    def records(self) -> Iterator[Record | bytes]:
        self.error = None
        try:
            yield from self._read()
        except Exception as error:  # the file's own problem (corrupt, truncated, unsupported): name it, go on
            self.error = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            yield Record(None, "unreadable file (named in the summary)")

    def fingerprint(self) -> dict:
        """What the samples made from this source depend on: a changed file is refused when a conversion resumes."""
        return self._fingerprint()


def file_fingerprint(path: Path) -> dict:
    """Size and content hash (compared), and modification time (recorded) of a file."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
    stat = path.stat()
    return {"bytes": stat.st_size, "mtime": stat.st_mtime, "sha256": digest.hexdigest()}


def _record_from_object(obj, text_field: str) -> Record:
    if not isinstance(obj, dict):
        return Record(None, "not a JSON object")
    if text_field not in obj:
        return Record(None, f"missing text field {text_field!r}")
    text = obj[text_field]
    if not isinstance(text, str):
        return Record(None, f"text field is {type(text).__name__}, not a string")
    return Record(text)


def _decode(raw: bytes) -> Record:
    try:
        return Record(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return Record(raw.decode("utf-8", errors="replace"), "invalid UTF-8 replaced by U+FFFD")


def _open(path: Path):
    """The file's bytes, decompressed as they are read when it is gzip- or zstd-compressed, whatever its name says."""
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic.startswith(_GZIP_MAGIC):
        return gzip.open(path, "rb")
    if magic == _ZSTD_MAGIC:
        import zstandard

        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), closefd=True))
    return open(path, "rb")


def _read_jsonl(path: Path) -> Iterator[bytes]:
    """The raw lines: workers parse them (``parse_jsonl_line``), so the reading process stays light."""
    with _open(path) as f:
        for number, raw in enumerate(f):
            if number == 0 and raw.startswith(_BOM):  # a UTF-8 byte order mark is no part of the first document
                raw = raw[len(_BOM):]
            if raw.strip():  # a blank line is no document
                yield raw


def parse_jsonl_line(raw: bytes, text_field: str) -> Record:
    line = _decode(raw)
    try:
        record = _record_from_object(json.loads(line.text), text_field)
    except json.JSONDecodeError:
        return Record(None, "invalid JSON line")
    except RecursionError:
        return Record(None, "JSON nested too deeply")
    if record.text is not None and line.problem:
        record.problem = line.problem
    return record


def _read_bytes(path: Path) -> bytes:
    with _open(path) as f:
        data = f.read()
    return data[len(_BOM):] if data.startswith(_BOM) else data


def _read_json(path: Path, text_field: str) -> Iterator[Record | bytes]:
    try:
        rows = json.loads(_decode(_read_bytes(path)).text)
    except json.JSONDecodeError:
        yield from _read_jsonl(path)  # JSON lines under a .json name
        return
    if not isinstance(rows, list):
        yield Record(None, "a .json file that is not a list of objects")
        return
    for row in rows:
        yield _record_from_object(row, text_field)


def _read_parquet(path: Path, text_field: str) -> Iterator[Record]:
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(path)
    if text_field not in parquet.schema_arrow.names:
        for _ in range(parquet.metadata.num_rows):
            yield Record(None, f"missing text field {text_field!r}")
        return
    for batch in parquet.iter_batches(columns=[text_field], batch_size=1024):
        for text in batch.column(0).to_pylist():
            yield Record(text) if isinstance(text, str) else Record(None, "text field is not a string")


def _read_txt(path: Path) -> Iterator[Record]:
    yield _decode(_read_bytes(path))


def _format(path: Path) -> str | None:
    """The reader a file name asks for (``.JSONL``, ``.jsonl.gz``, ``.jsonl.zst``: ``.jsonl``), or None."""
    name, compression = os.path.splitext(path.name.lower())
    if compression not in COMPRESSED_SUFFIXES:
        name = path.name.lower()
    suffix = os.path.splitext(name)[1]
    return suffix if suffix in LOCAL_SUFFIXES else None


def local_sources(inputs: list[str], text_field: str) -> list[Source]:
    files: list[Path] = []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file())
            ignored = [p for p in found if _format(p) is None]
            if ignored:
                names = ", ".join(str(p.relative_to(path)) for p in ignored[:10])
                print(f"{path}: ignored {len(ignored)} file(s) that are not {'/'.join(LOCAL_SUFFIXES)}[.gz/.zst]: {names}"
                      + (", ..." if len(ignored) > 10 else ""))
            if len(ignored) == len(found):
                raise SystemExit(f"error: {path} holds no {', '.join(LOCAL_SUFFIXES)} files (or .gz/.zst of them)")
            files += [p for p in found if _format(p) is not None]
        elif path.is_file():
            if _format(path) is None:
                raise SystemExit(f"error: {path}: unsupported file type (use {', '.join(LOCAL_SUFFIXES)}, or .gz/.zst)")
            files.append(path)
        else:
            raise SystemExit(f"error: input {item} does not exist")
    readers = {
        ".jsonl": lambda p: lambda: _read_jsonl(p),
        ".json": lambda p: lambda: _read_json(p, text_field),
        ".parquet": lambda p: lambda: _read_parquet(p, text_field),
        ".txt": lambda p: lambda: _read_txt(p),
    }
    return [Source(str(p), readers[_format(p)](p), lambda p=p: file_fingerprint(p)) for p in files]


def hub_sources(name: str, split: str, text_field: str) -> list[Source]:
    """A Hugging Face dataset, streamed (nothing lands on disk first), one source per file shard."""
    import datasets

    dataset = datasets.load_dataset(name, split=split, streaming=True)

    def reader(index: int):
        return lambda: (
            _record_from_object(row, text_field) for row in dataset.shard(num_shards=dataset.n_shards, index=index)
        )

    return [
        Source(f"{name}[{split}] shard {i}", reader(i), lambda i=i: {"dataset": name, "split": split, "shard": i})
        for i in range(dataset.n_shards)
    ]


def sources_of(inputs: list[str], split: str, text_field: str) -> list[Source]:
    """Local files when any input names one (a missing one is then an error), else one Hugging Face dataset."""
    if any(Path(item).exists() for item in inputs) or len(inputs) > 1:
        return local_sources(inputs, text_field)
    if _format(Path(inputs[0])) is not None:
        raise SystemExit(f"error: input {inputs[0]} does not exist")
    try:
        return hub_sources(inputs[0], split, text_field)
    except Exception as error:  # datasets raises many kinds: offline, no such repo, no such split
        raise SystemExit(
            f"error: input {inputs[0]} is no local file or folder, and as a Hugging Face dataset it could not be "
            f"loaded: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        ) from error
