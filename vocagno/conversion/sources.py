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
to ``cap("json_bytes")`` (a larger JSON array is refused, one of JSON lines read line by line). A .parquet file's
pages are sized from their headers before pyarrow decodes one (``_largest_pages``): a page over ``page_bytes()``, or
of more than the document cap a value, is refused, and rows are read in batches that decode to at most
``BATCH_BYTES`` (or one row). An .arrow file's compressed record batches and dictionaries are sized from their
buffers' declared lengths before pyarrow decompresses one (``_check_decompressed``): a batch, or the dictionaries
together, over ``page_bytes()`` is refused.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from vocagno.errors import Refused
from vocagno.doors.untrusted import UntrustedFile, cap, open_regular, plain_name
from vocagno.shown import terminal

__all__ = ["Record", "Source", "TextOf", "LOCAL_SUFFIXES", "sources_of", "hub_sources", "parse_jsonl_line"]

LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet", ".arrow", ".txt")  # in any case, optionally followed by .gz or .zst
# What datasets' save_to_disk writes beside its .arrow files: its metadata, no documents.
SAVE_TO_DISK_METADATA = ("dataset_info.json", "state.json", "dataset_dict.json")
COMPRESSED_SUFFIXES = (".gz", ".zst", ".zstd")
_GZIP_MAGIC, _ZSTD_MAGIC = b"\x1f\x8b", b"\x28\xb5\x2f\xfd"
_BOM = b"\xef\xbb\xbf"


@dataclass
class Record:
    """A document as read, or the reason it can't be one."""

    text: str | None
    problem: str | None = None  # why text is None (skipped), or what was repaired while reading
    where: str | None = None  # where in its file a document over the cap is ("line 7"), for the summary to name it
    fields: str | None = None  # a record skipped for lacking a field: the fields it has (``field_names``)


def over_cap() -> str:
    """The reason a document over the ``document_bytes`` cap is skipped, as the summary counts it."""
    return f"over the document cap of {cap('document_bytes'):,} bytes (VOCAGNO_MAX_DOCUMENT_BYTES)"


def _over_cap(where: str | None = None) -> Record:
    return Record(None, over_cap(), where)


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


@dataclass(frozen=True)
class CorpusFile:
    """A local file of the corpus: ``relative`` below ``folder`` (a folder given as an input, resolved when it was
    listed), opened there one folder at a time and through no link, so a subfolder swapped for a link after the
    listing does not lead out; or, with no ``folder``, the file at the path ``relative`` (a file named as an input,
    or an object downloaded to a temporary folder)."""

    relative: Path
    folder: Path | None = None

    @property
    def name(self) -> str:
        return self.relative.name

    def __str__(self) -> str:
        return str(self.relative if self.folder is None else self.folder / self.relative)

    def open(self) -> io.BufferedReader:
        return open_regular(self.relative, folder=self.folder)


def file_fingerprint(path: CorpusFile) -> dict:
    """Size and content hash (compared), and modification time (recorded) of a file, as opened to be read."""
    digest = hashlib.sha256()
    with path.open() as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
        size, mtime = f.raw.size, os.fstat(f.fileno()).st_mtime
    return {"bytes": size, "mtime": mtime, "sha256": digest.hexdigest()}


class TextOf:
    """A record's text: its field ``field``, or ``template`` with each ``{name}`` replaced by that field (dotted names
    for nested ones: ``{meta.title}``; ``\\n``, ``\\t`` written out in the template are a newline and a tab; numbers
    are written as text). A record without a field it names is counted by that reason."""

    def __init__(self, field: str = "text", template: str | None = None):
        self.field, self.template = field, template
        if template is None:
            self.parts = [("", field)]
            return
        import string

        unescaped = template.replace("\\n", "\n").replace("\\t", "\t")
        try:
            self.parts = [(literal, name) for literal, name, _, _ in string.Formatter().parse(unescaped)]
        except ValueError as error:
            raise Refused(f"--text-template {template!r}: {error}") from error
        if not any(name for _, name in self.parts):
            raise Refused(f"--text-template {template!r} names no field: write fields as {{name}}")

    @property
    def columns(self) -> list[str]:
        """The top-level fields the text is made of (the columns a .parquet or .arrow file is read for)."""
        return sorted({name.split(".")[0] for _, name in self.parts if name})

    def missing(self, name: str, fields) -> Record:
        """A record skipped for lacking the field ``name``, its reason naming the fields it has (``fields``: the keys
        where ``name`` was looked up, or a file's columns), so the summary shows what ``--text-field`` could be."""
        what = "text field" if self.template is None else "field of the text template"
        return Record(None, f"missing {what} {name!r}", fields=field_names(fields))

    def __call__(self, obj) -> Record:
        if not isinstance(obj, dict):
            return Record(None, "not a JSON object")
        what = "text field" if self.template is None else "field of the text template"
        pieces = []
        for literal, name in self.parts:
            pieces.append(literal)
            if not name:
                continue
            value = holder = obj
            for key in name.split("."):
                if not isinstance(value, dict) or key not in value:  # the fields of the nearest record holding it
                    return self.missing(name, value if isinstance(value, dict) else holder)
                holder, value = value, value[key]
            if self.template is None:
                if not isinstance(value, str):
                    return Record(None, f"text field is {_kind_of(value)}, not a string")
            elif value is None:  # how .parquet and .arrow rows hold a field their record lacks
                return self.missing(name, [k for k, v in holder.items() if v is not None])
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                value = str(value)
            elif not isinstance(value, str):
                return Record(None, f"{what} {name!r} is {_kind_of(value)}, not a string")
            pieces.append(value)
        text = "".join(pieces)
        limit = cap("document_bytes")
        if len(text) > limit or (4 * len(text) > limit and len(text.encode("utf-8", "surrogatepass")) > limit):
            return _over_cap()
        return Record(text)


SHOWN_FIELDS, SHOWN_FIELD_CHARS = 8, 40  # of a record's fields, how many a reason names, and of each name's characters


def _kind_of(value) -> str:
    """What a record's value is, in the words of the file (JSON's and Arrow's), not Python's type names."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, (list, tuple)):
        return "a list"
    return "binary" if isinstance(value, (bytes, bytearray)) else f"a {type(value).__name__} value"


def field_names(fields) -> str:
    """``fields`` (a record's keys) as a reason names them: the first ``SHOWN_FIELDS``, each cut at
    ``SHOWN_FIELD_CHARS`` characters (a corpus's names are anyone's; the summary shows them through ``terminal``)."""
    names = [str(f) if len(str(f)) <= SHOWN_FIELD_CHARS else str(f)[:SHOWN_FIELD_CHARS] + "..."
             for f in list(fields)[:SHOWN_FIELDS + 1]]
    if not names:
        return "none"
    return ", ".join(names[:SHOWN_FIELDS]) + (", ..." if len(names) > SHOWN_FIELDS else "")


def _numbered(records: Iterator[Record], what: str) -> Iterator[Record]:
    """``records`` with a document over the cap named by its place (``record 3``), counting from 1."""
    for number, record in enumerate(records, 1):
        if record.text is None and record.problem == over_cap():
            record.where = f"{what} {number}"
        yield record


def _decode(raw: bytes) -> Record:
    try:
        return Record(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return Record(raw.decode("utf-8", errors="replace"), "invalid UTF-8 replaced by U+FFFD")


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
                yield _over_cap(f"line {number:,}")
                continue
            if number == 1 and raw.startswith(_BOM):  # a UTF-8 byte order mark is no part of the first document
                raw = raw[len(_BOM):]
            if raw.strip():  # a blank line is no document
                yield raw


def parse_jsonl_line(raw: bytes, text_of: TextOf) -> Record:
    line = _decode(raw)
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
    try:
        rows = json.loads(_decode(data).text)
    except json.JSONDecodeError:
        yield from _read_jsonl(path)  # JSON lines under a .json name
        return
    if not isinstance(rows, list):
        yield Record(None, "a .json file that is not a list of objects")
        return
    yield from _numbered(map(text_of, rows), "record")


def _mapped(path: CorpusFile):
    """A .parquet or .arrow file (formats read by seeking) as a pyarrow buffer: a read-only memory map of the file
    ``open_regular`` opened and checked, of the size it said (pages are read as pyarrow reaches them)."""
    import mmap

    import pyarrow as pa

    with path.open() as f:
        if f.raw.size == 0:
            return pa.py_buffer(b"")
        # The descriptor open_regular checked (its raw file object is the one it read through).
        return pa.py_buffer(mmap.mmap(f.fileno(), f.raw.size, access=mmap.ACCESS_READ))


ARROW_BATCH_ROWS = 64  # rows pyarrow decodes at a time from a .parquet file
PYTHON_BYTES = 1 << 24  # bytes of a batch's values made Python objects at a time (one value over it: alone)
# The most a .parquet page may decode to (a larger document cap raises it to the cap): writers cut a page at about
# 1 MiB only after each 1,024 values, so an honest page of 1,024 documents of 300 KB is 300 MB.
PAGE_BYTES = 1 << 30
BATCH_BYTES = 1 << 28  # what a batch of a .parquet file's rows may decode to, sized by its largest page: 64 rows, fewer


def page_bytes() -> int:
    """The most pyarrow may decode whole of a file: one page of a .parquet file's text columns, one compressed record
    batch of an .arrow file (or all its dictionaries): ``PAGE_BYTES``, or the document cap where that is larger (a
    page holds at least one value; writers cut pages at about 1 MiB)."""
    return max(PAGE_BYTES, cap("document_bytes"))


class _Thrift:
    """A reader of Thrift's compact protocol, as much of it as skipping a .parquet page header takes: each value read
    from ``data`` at ``at``, never past ``end``, nested no deeper than 16."""

    def __init__(self, data: memoryview, at: int, end: int):
        self.data, self.at, self.end = data, at, end

    def byte(self) -> int:
        if self.at >= self.end:
            raise ValueError("a page header runs past its column chunk")
        self.at += 1
        return self.data[self.at - 1]

    def varint(self) -> int:
        value = shift = 0
        while True:
            b = self.byte()
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7
            if shift > 63:
                raise ValueError("a page header's number runs over 64 bits")

    def integer(self) -> int:  # zigzag
        value = self.varint()
        return (value >> 1) ^ -(value & 1)

    def skip(self, kind: int, depth: int = 0) -> None:
        if depth > 16:
            raise ValueError("a page header nested too deeply")
        if kind in (1, 2):  # booleans: in a field's header (in a list, a byte)
            return
        if kind == 3:
            self.byte()
        elif kind in (4, 5, 6):
            self.varint()
        elif kind == 7:
            self.at += 8
        elif kind == 8:
            size = self.varint()  # read before ``at`` is: it moves it
            self.at += size
        elif kind in (9, 10):
            head = self.byte()
            size = head >> 4 if head >> 4 != 15 else self.varint()
            for _ in range(size):
                self.byte() if head & 15 in (1, 2) else self.skip(head & 15, depth + 1)
        elif kind == 11:
            size = self.varint()
            kinds = self.byte() if size else 0
            for _ in range(size):
                self.skip(kinds >> 4, depth + 1)
                self.skip(kinds & 15, depth + 1)
        elif kind == 12:
            self.struct(depth + 1)
        else:
            raise ValueError(f"a page header holds a value of unknown type {kind}")
        if self.at > self.end:
            raise ValueError("a page header runs past its column chunk")

    def struct(self, depth: int = 0) -> dict[int, int | dict]:
        """The struct's integer and struct fields by id (the others skipped)."""
        fields: dict[int, int | dict] = {}
        field = 0
        while True:
            head = self.byte()
            if head == 0:
                return fields
            field = field + (head >> 4) if head >> 4 else self.integer()
            if head & 15 in (4, 5, 6):
                fields[field] = self.integer()
            elif head & 15 == 12:
                if depth > 16:
                    raise ValueError("a page header nested too deeply")
                fields[field] = self.struct(depth + 1)
            else:
                self.skip(head & 15, depth)


def _page_sizes(data: memoryview, chunk) -> Iterator[tuple[int, int]]:
    """The decoded size and the number of values of each page of a .parquet column chunk (``chunk``, pyarrow's
    metadata of it), as its page header says before the page is read (Thrift: a ``PageHeader``'s field 2, and field
    1 of its data, dictionary or data v2 page header): where the column chunk says it starts, one page after the
    other for the compressed bytes it says it holds."""
    begin = chunk.data_page_offset
    if chunk.has_dictionary_page and chunk.dictionary_page_offset:
        begin = min(begin, chunk.dictionary_page_offset)
    end = begin + chunk.total_compressed_size
    if begin < 0 or chunk.total_compressed_size < 0 or end > len(data):
        raise ValueError(f"a column chunk at bytes {begin:,} to {end:,} of a file of {len(data):,}")
    at = begin
    while at < end:
        reader = _Thrift(data, at, end)
        header = reader.struct()
        decoded, compressed = header.get(2, -1), header.get(3, -1)
        if decoded < 0 or compressed < 0:
            raise ValueError(f"a page header at byte {at:,} without its sizes")
        kind = next((header[k] for k in (5, 7, 8) if isinstance(header.get(k), dict)), {})
        values = kind.get(1, 0)
        yield decoded, values if isinstance(values, int) and values > 0 else 0
        at = reader.at + compressed


def _largest_pages(data: memoryview, parquet, columns: list[str], path: CorpusFile) -> list[int]:
    """The decoded size of the largest page of the text's ``columns`` in each row group of a .parquet file, read from
    the page headers before pyarrow reads a page; refused (``UntrustedFile``) where one is over ``page_bytes()``, or
    holds more than the document cap a value (so one of its values is over it): a dictionary page of a few KiB that
    holds a value of gigabytes is never decoded."""
    limit, document, metadata, largest = page_bytes(), cap("document_bytes"), parquet.metadata, []
    for group in range(metadata.num_row_groups):
        row_group = metadata.row_group(group)
        largest.append(0)
        for i in range(row_group.num_columns):
            chunk = row_group.column(i)
            if chunk.path_in_schema.split(".")[0] not in columns:
                continue
            for decoded, values in _page_sizes(data, chunk):
                where = f"{path}: refused: row group {group + 1} of its column {chunk.path_in_schema!r} holds a page"
                if decoded > document * max(values, 1):
                    raise UntrustedFile(
                        f"{where} of {values:,} value(s) that decodes to {decoded:,} bytes: a value over the document "
                        f"cap of {document:,} bytes, which pyarrow would decode whole (raise "
                        "VOCAGNO_MAX_DOCUMENT_BYTES if it is right)")
                if decoded > limit:
                    raise UntrustedFile(
                        f"{where} that decodes to {decoded:,} bytes, more than the {limit:,} a page may (pyarrow "
                        "decodes a page whole: write the file with smaller pages)")
                largest[-1] = max(largest[-1], decoded)
    return largest


class _Flat:
    """A reader of FlatBuffers tables, as much of them as sizing an Arrow IPC message takes: ``data`` (a message's
    metadata, or a file's footer), every position checked against its end."""

    def __init__(self, data: bytes):
        self.data = data

    def integer(self, at: int, size: int, signed: bool = True) -> int:
        if at < 0 or at + size > len(self.data):
            raise ValueError("an Arrow message's metadata points past its end")
        return int.from_bytes(self.data[at:at + size], "little", signed=signed)

    def root(self) -> int:
        return self.integer(0, 4, signed=False)

    def field(self, table: int, index: int) -> int | None:
        """Where field ``index`` of the table at ``table`` is, None when the table leaves it out."""
        vtable = table - self.integer(table, 4)
        if 4 + 2 * index + 2 > self.integer(vtable, 2, signed=False):
            return None
        offset = self.integer(vtable + 4 + 2 * index, 2, signed=False)
        return table + offset if offset else None

    def table(self, table: int, index: int) -> int | None:
        """Where the table (or vector) that field ``index`` refers to is, None when there is none."""
        at = self.field(table, index)
        return None if at is None else at + self.integer(at, 4, signed=False)

    def structs(self, table: int, index: int, size: int) -> list[int]:
        """Where each struct of ``size`` bytes of the vector field ``index`` is."""
        at = self.table(table, index)
        if at is None:
            return []
        count = self.integer(at, 4, signed=False)
        if at + 4 + count * size > len(self.data):
            raise ValueError("an Arrow message's vector runs past its metadata")
        return [at + 4 + i * size for i in range(count)]


def _decompressed_bytes(message) -> int:
    """What pyarrow allocates to decompress an Arrow IPC record batch or dictionary batch ``message``: each of its
    compressed buffers' first 8 bytes (little-endian) say what it decompresses to (-1: stored as it is, its length
    less those 8). 0 for an uncompressed message (its buffers are the mapped file's own bytes) or another kind; read
    from the metadata and the body, decompressing nothing (``Message``: Schema.fbs, Message.fbs)."""
    flat, body = _Flat(message.metadata.to_pybytes()), message.body
    header = flat.table(flat.root(), 2)  # Message: version, header_type, header, bodyLength, custom_metadata
    if header is None:
        return 0
    if message.type == "dictionary":  # DictionaryBatch: id, data (a RecordBatch), isDelta
        header = flat.table(header, 1)
    if message.type not in ("record batch", "dictionary") or header is None or flat.table(header, 3) is None:
        return 0  # RecordBatch: length, nodes, buffers, compression (absent: uncompressed)
    total = 0
    for at in flat.structs(header, 2, 16):  # Buffer: offset, length (int64 each), within the body
        offset, length = flat.integer(at, 8), flat.integer(at + 8, 8)
        if length == 0:
            continue
        if offset < 0 or length < 8 or offset + length > body.size:
            raise ValueError(f"an Arrow buffer at bytes {offset:,} to {offset + length:,} of a body of {body.size:,}")
        size = int.from_bytes(body.slice(offset, 8).to_pybytes(), "little", signed=True)
        if size < -1:
            raise ValueError(f"an Arrow buffer that says it decompresses to {size:,} bytes")
        total += length - 8 if size == -1 else size
    return total


def _arrow_messages(data) -> Iterator:
    """The messages of an Arrow IPC file (``data``, mapped) that pyarrow reads, each read (zero-copy) but not decoded:
    those the file format's footer points at (dictionaries first), or the stream format's, one after the other."""
    import pyarrow as pa

    if data.size >= 10 and data.slice(0, 6).to_pybytes() == b"ARROW1":
        if data.slice(data.size - 6).to_pybytes() != b"ARROW1":
            raise ValueError("an Arrow IPC file without its footer")
        size = int.from_bytes(data.slice(data.size - 10, 4).to_pybytes(), "little", signed=True)
        if not 0 < size <= data.size - 18:
            raise ValueError(f"an Arrow IPC file's footer of {size:,} bytes in a file of {data.size:,}")
        footer = _Flat(data.slice(data.size - 10 - size, size).to_pybytes())
        root = footer.root()
        for at in footer.structs(root, 2, 24) + footer.structs(root, 3, 24):  # Footer: dictionaries, recordBatches
            offset, length = footer.integer(at, 8), footer.integer(at + 8, 4) + footer.integer(at + 16, 8)
            if offset < 8 or length < 0 or offset + length > data.size:
                raise ValueError(f"an Arrow block at bytes {offset:,} to {offset + length:,} of a file of "
                                 f"{data.size:,}")
            yield pa.ipc.read_message(data.slice(offset, length))
        return
    reader = pa.ipc.MessageReader.open_stream(pa.BufferReader(data))
    while True:
        try:
            yield reader.read_next_message()
        except StopIteration:
            return


def _check_decompressed(data, path: CorpusFile) -> None:
    """Refuse (``UntrustedFile``) an .arrow file of compressed buffers that pyarrow would decompress to more than
    ``page_bytes()`` at once: a record batch (decompressed whole when it is read), or its dictionaries (all held
    while its batches are read), sized before pyarrow decompresses any (``_decompressed_bytes``)."""
    limit, dictionaries, batch = page_bytes(), 0, 0
    for message in _arrow_messages(data):
        size = _decompressed_bytes(message)
        if message.type == "dictionary":
            dictionaries += size
            if dictionaries > limit:
                raise UntrustedFile(
                    f"{path}: refused: its dictionaries decompress to {dictionaries:,} bytes or more, more than the "
                    f"{limit:,} they may (pyarrow holds them whole: write the file uncompressed, or without "
                    "dictionary-encoding)")
        elif message.type == "record batch":
            batch += 1
            if size > limit:
                raise UntrustedFile(
                    f"{path}: refused: its record batch {batch:,} decompresses to {size:,} bytes, more than the "
                    f"{limit:,} a batch may (pyarrow decompresses a batch whole: write the file uncompressed, or in "
                    "smaller record batches)")


def _value_bytes(array):
    """The bytes each value of the pyarrow ``array`` holds (a string's or a binary's length, what a list or a struct
    holds, summed), measured by pyarrow on its offsets: no value is made a Python object, or copied."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    n, kind = len(array), array.type
    if pa.types.is_dictionary(kind):
        sizes = _value_bytes(array.dictionary)
        if not len(sizes):
            return np.zeros(n, np.int64)
        valid = array.indices.is_valid().to_numpy(zero_copy_only=False)
        return np.where(valid, sizes[array.indices.fill_null(0).to_numpy(zero_copy_only=False)], 0)
    if pa.types.is_struct(kind):
        return sum((_value_bytes(child) for child in array.flatten()), np.zeros(n, np.int64))
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        parents = pc.list_parent_indices(array).to_numpy(zero_copy_only=False)
        return np.bincount(parents, weights=_value_bytes(pc.list_flatten(array)), minlength=n).astype(np.int64)
    try:
        return pc.binary_length(array).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    except (pa.ArrowNotImplementedError, pa.ArrowTypeError):  # not a string or a binary
        pass
    try:
        return np.full(n, max(kind.bit_width // 8, 1), np.int64)
    except ValueError:  # neither of fixed width (a map, a union): measured a value at a time
        return np.array([array.slice(i, 1).nbytes for i in range(n)], np.int64)


def _batch_records(batch, text_of: TextOf) -> Iterator[Record]:
    """The records of a pyarrow record batch's rows, from the columns the text is made of. A row whose values there
    hold more than the ``document_bytes`` cap (as pyarrow measures them, ``_value_bytes``) is skipped as over the
    cap without being made a Python object; the others are made Python objects ``PYTHON_BYTES`` at a time."""
    absent = [name for _, name in text_of.parts if name and name.split(".")[0] not in batch.schema.names]
    if absent:  # a column the file lacks, every row lacks: counted per record, naming the file's columns
        record = text_of.missing(absent[0], batch.schema.names)
        yield from (Record(None, record.problem, fields=record.fields) for _ in range(batch.num_rows))
        return
    columns = text_of.columns
    batch = batch.select(columns)
    sizes = sum(_value_bytes(batch.column(c)) for c in columns)
    limit, begin = cap("document_bytes"), 0
    while begin < batch.num_rows:
        if sizes[begin] > limit:
            yield _over_cap()
            begin += 1
            continue
        end, held = begin + 1, int(sizes[begin])
        while end < batch.num_rows and sizes[end] <= limit and held + sizes[end] <= PYTHON_BYTES:
            held += int(sizes[end])
            end += 1
        yield from map(text_of, batch.slice(begin, end - begin).to_pylist())
        begin = end


def _read_parquet(path: CorpusFile, text_of: TextOf) -> Iterator[Record]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = _mapped(path)
    parquet = pq.ParquetFile(pa.BufferReader(data))
    names = parquet.schema_arrow.names
    absent = [name for _, name in text_of.parts if name and name.split(".")[0] not in names]
    if absent:  # a column the file lacks, every row lacks: counted per row, naming the file's columns, none read
        missing = text_of.missing(absent[0], names)
        yield from (Record(None, missing.problem, fields=missing.fields) for _ in range(parquet.metadata.num_rows))
        return
    columns = text_of.columns
    largest = _largest_pages(memoryview(data), parquet, columns, path)
    # A value lies in one page: a batch of n rows decodes to at most n times the largest page of each column read.
    leaves = sum(column.path.split(".")[0] in columns for column in parquet.schema)
    batches = (batch for group, page in enumerate(largest) for batch in parquet.iter_batches(
        columns=columns, row_groups=[group],
        batch_size=max(1, min(ARROW_BATCH_ROWS, BATCH_BYTES // max(page * leaves, 1)))))
    yield from _numbered((record for batch in batches for record in _batch_records(batch, text_of)), "row")


def _read_arrow(path: CorpusFile, text_of: TextOf) -> Iterator[Record]:
    """An Arrow IPC file: ``datasets``' ``save_to_disk`` and cache write the stream format, others the file format."""
    import pyarrow as pa

    data = _mapped(path)
    _check_decompressed(data, path)
    try:
        reader = pa.ipc.open_stream(pa.BufferReader(data))
    except pa.ArrowInvalid:
        reader = pa.ipc.open_file(pa.BufferReader(data))
        batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
    else:
        batches = iter(reader)

    yield from _numbered((record for batch in batches for record in _batch_records(batch, text_of)), "row")


def _read_txt(path: CorpusFile) -> Iterator[Record]:
    """The file as one document; one over the ``document_bytes`` cap is skipped after reading no more than it."""
    data = _read_bytes(path, cap("document_bytes"))
    yield _over_cap("(the whole file, one document)") if data is None else _decode(data)


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
    readers = {".jsonl": _read_jsonl, ".json": _read_json, ".parquet": _read_parquet, ".arrow": _read_arrow,
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
        return lambda: _numbered(map(text_of, dataset.shard(num_shards=dataset.n_shards, index=index)), "record")

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
