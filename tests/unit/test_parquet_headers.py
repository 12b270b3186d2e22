"""The reader of .parquet page headers (Thrift's compact protocol) that the converter runs before pyarrow decodes a page
(``vocagno.conversion.columnar``): a header of every value type reads to its sizes; hostile bytes are refused, naming
what is wrong, without reading past the column chunk or recursing without bound."""

import struct
from types import SimpleNamespace

import pytest

from vocagno.conversion.columnar import _page_sizes, _Thrift

STOP = b"\x00"


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def zigzag(value: int) -> bytes:
    return varint((value << 1) ^ (value >> 63))


def field(delta: int, kind: int) -> bytes:
    return bytes([delta << 4 | kind])


def reads(data: bytes) -> tuple[dict, int]:
    reader = _Thrift(memoryview(data), 0, len(data))
    return reader.struct(), reader.at


def test_a_header_of_every_value_type_reads_its_integers_and_structs_and_skips_the_rest():
    header = b"".join([
        field(1, 5), zigzag(5),  # 1: i32
        field(1, 1),  # 2: true
        field(1, 3), b"\x07",  # 3: byte
        field(1, 7), struct.pack("<d", 2.5),  # 4: double
        field(1, 8), varint(3), b"abc",  # 5: binary
        field(1, 9), bytes([2 << 4 | 5]), zigzag(1), zigzag(-1),  # 6: list of 2 i32
        field(1, 9), bytes([3 << 4 | 1]), b"\x01\x02\x01",  # 7: list of 3 booleans, a byte each
        field(1, 9), bytes([0xF0 | 6]), varint(16), zigzag(0) * 16,  # 8: list of 16 i64 (its size after)
        field(1, 10), bytes([1 << 4 | 8]), varint(1), b"x",  # 9: set of 1 binary
        field(1, 11), varint(1), bytes([5 << 4 | 8]), zigzag(2), varint(1), b"y",  # 10: map i32 -> binary
        field(1, 11), varint(0),  # 11: empty map
        field(1, 12), field(1, 6), zigzag(-3), STOP,  # 12: struct {1: -3}
        field(1, 9), bytes([1 << 4 | 12]), field(1, 5), zigzag(9), STOP,  # 13: list of 1 struct
        field(0, 5), zigzag(100), zigzag(7),  # 100: i32, its id written whole
        field(1, 2),  # 101: false
        field(1, 4), zigzag(-7),  # 102: i16
        field(1, 6), zigzag(1 << 40),  # 103: i64
        STOP,
    ])
    fields, at = reads(header + b"page bytes")
    assert fields == {1: 5, 12: {1: -3}, 100: 7, 102: -7, 103: 1 << 40}
    assert at == len(header)


@pytest.mark.parametrize("data, why", [
    (field(1, 13) + STOP, "a page header holds a value of unknown type 13"),
    (field(1, 5) + b"\xff" * 10 + STOP, "a page header's number runs over 64 bits"),
    (field(1, 5) + b"\x80", "a page header runs past its column chunk"),  # a number cut short
    (field(1, 7) + b"\x00" * 4, "a page header runs past its column chunk"),  # 4 of a double's 8 bytes
    (field(1, 8) + varint(1 << 40) + b"abc", "a page header runs past its column chunk"),  # a binary's size
    (field(1, 9) + bytes([1 << 4 | 9]) * 18 + STOP, "a page header nested too deeply"),  # lists in lists
    (field(1, 12) * 18 + STOP, "a page header nested too deeply"),  # structs in structs
])
def test_a_hostile_header_is_refused_naming_what_is_wrong(data, why):
    with pytest.raises(ValueError) as refused:
        reads(data)
    assert str(refused.value) == why


def chunk(begin: int, size: int) -> SimpleNamespace:
    return SimpleNamespace(data_page_offset=begin, has_dictionary_page=False, dictionary_page_offset=None,
                           total_compressed_size=size)


def page(decoded: int, compressed: int, values: int) -> bytes:
    """A data page's header (a PageHeader: 1 type, 2 decoded size, 3 compressed size, 5 its DataPageHeader with
    1 the number of values), and its ``compressed`` bytes."""
    return (field(1, 5) + zigzag(0) + field(1, 5) + zigzag(decoded) + field(1, 5) + zigzag(compressed)
            + field(2, 12) + field(1, 5) + zigzag(values) + STOP + STOP + b"\x00" * compressed)


def test_a_column_chunk_reads_each_pages_sizes_and_one_past_its_file_or_a_page_without_sizes_is_refused():
    pages = page(1000, 10, 4) + page(300, 3, 2)
    assert list(_page_sizes(memoryview(b"PAR1" + pages), chunk(4, len(pages)))) == [(1000, 4), (300, 2)]
    with pytest.raises(ValueError, match="^a column chunk at bytes 4 to 1,004 of a file of 8$"):
        list(_page_sizes(memoryview(b"PAR1" + b"\x00" * 4), chunk(4, 1000)))
    sizeless = field(1, 5) + zigzag(0) + STOP
    with pytest.raises(ValueError, match="^a page header at byte 0 without its sizes$"):
        list(_page_sizes(memoryview(sizeless), chunk(0, len(sizeless))))
