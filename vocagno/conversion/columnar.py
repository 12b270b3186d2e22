"""Reading .parquet and .arrow files (formats read by seeking) within bounds: a .parquet file's pages are sized from
their headers before pyarrow decodes one (``_largest_pages``), an .arrow file's compressed record batches and
dictionaries from their buffers' declared lengths before pyarrow decompresses one (``_check_decompressed``), and
rows become Python objects ``PYTHON_BYTES`` at a time (``_batch_records``). ``sources`` hands a file here by its
name."""

from __future__ import annotations

from typing import Iterator

from vocagno.doors.untrusted import UntrustedFile, cap
from vocagno.conversion.records import CorpusFile, Record, TextOf, numbered, over_cap_record

__all__ = ["ARROW_BATCH_ROWS", "BATCH_BYTES", "PAGE_BYTES", "PYTHON_BYTES", "page_bytes", "read_arrow", "read_parquet"]


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


def _lacking(text_of: TextOf, names: list[str]) -> Record | None:
    """The skipped record every row is, where the file's columns (``names``) lack one the text is made of: a column
    the file lacks, every row lacks; counted per row, naming the file's columns."""
    absent = [name for _, name in text_of.parts if name and name.split(".")[0] not in names]
    return text_of.missing(absent[0], names) if absent else None


def _batch_records(batch, text_of: TextOf) -> Iterator[Record]:
    """The records of a pyarrow record batch's rows, from the columns the text is made of. A row whose values there
    hold more than the ``document_bytes`` cap (as pyarrow measures them, ``_value_bytes``) is skipped as over the
    cap without being made a Python object; the others are made Python objects ``PYTHON_BYTES`` at a time."""
    lacking = _lacking(text_of, batch.schema.names)
    if lacking is not None:
        yield from (Record(None, lacking.problem, fields=lacking.fields) for _ in range(batch.num_rows))
        return
    columns = text_of.columns
    batch = batch.select(columns)
    sizes = sum(_value_bytes(batch.column(c)) for c in columns)
    limit, begin = cap("document_bytes"), 0
    while begin < batch.num_rows:
        if sizes[begin] > limit:
            yield over_cap_record()
            begin += 1
            continue
        end, held = begin + 1, int(sizes[begin])
        while end < batch.num_rows and sizes[end] <= limit and held + sizes[end] <= PYTHON_BYTES:
            held += int(sizes[end])
            end += 1
        yield from map(text_of, batch.slice(begin, end - begin).to_pylist())
        begin = end


def read_parquet(path: CorpusFile, text_of: TextOf) -> Iterator[Record]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = _mapped(path)
    parquet = pq.ParquetFile(pa.BufferReader(data))
    lacking = _lacking(text_of, parquet.schema_arrow.names)
    if lacking is not None:  # no row is read
        yield from (Record(None, lacking.problem, fields=lacking.fields) for _ in range(parquet.metadata.num_rows))
        return
    columns = text_of.columns
    largest = _largest_pages(memoryview(data), parquet, columns, path)
    # A value lies in one page: a batch of n rows decodes to at most n times the largest page of each column read.
    leaves = sum(column.path.split(".")[0] in columns for column in parquet.schema)
    batches = (batch for group, page in enumerate(largest) for batch in parquet.iter_batches(
        columns=columns, row_groups=[group],
        batch_size=max(1, min(ARROW_BATCH_ROWS, BATCH_BYTES // max(page * leaves, 1)))))
    yield from numbered((record for batch in batches for record in _batch_records(batch, text_of)), "row")


def read_arrow(path: CorpusFile, text_of: TextOf) -> Iterator[Record]:
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

    yield from numbered((record for batch in batches for record in _batch_records(batch, text_of)), "row")
