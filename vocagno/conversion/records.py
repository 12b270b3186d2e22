"""What every format's reader (``sources``, ``columnar``) shares: a document as read (``Record``), what a record's
text is made of (``TextOf``), a corpus file as it is opened (``CorpusFile``), and the words a skipped record is
counted by."""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from vocagno.errors import Refused
from vocagno.doors.untrusted import cap, open_regular

__all__ = ["LONE_SURROGATE", "CorpusFile", "Record", "TextOf", "field_names", "numbered", "over_cap", "over_cap_record"]

# Half of a UTF-16 pair, as a JSON escape ("\\ud800") gives it: no character, so it has no UTF-8 bytes.
LONE_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass
class Record:
    """A document as read, or the reason it can't be one."""

    text: str | None
    problem: str | None = None  # why text is None (skipped), or what was repaired while reading
    where: str | None = None  # where in its file a document over the cap is ("line 7"), for the summary to name it
    fields: str | None = None  # a record skipped for lacking a field: the fields it has (``field_names``)


INVALID_UTF8 = "invalid UTF-8 replaced by U+FFFD"  # the repair's name in the summary, for .jsonl, .txt and .json alike


def decoded(raw: bytes) -> Record:
    """``raw`` as UTF-8 text; invalid UTF-8 replaced by U+FFFD, and said so."""
    try:
        return Record(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return Record(raw.decode("utf-8", errors="replace"), INVALID_UTF8)


_ESCAPED_BYTES = re.compile("[\udc80-\udcff]+")  # bytes that decoding with "surrogateescape" kept undecoded


def repaired(record: Record) -> Record:
    """``record``, read from text decoded with "surrogateescape": each run of undecodable bytes in its text replaced
    as ``decode(errors="replace")`` replaces it, and said so."""
    if record.text is not None and _ESCAPED_BYTES.search(record.text):
        record.text = _ESCAPED_BYTES.sub(
            lambda run: run.group().encode("utf-8", "surrogateescape").decode("utf-8", "replace"), record.text)
        record.problem = INVALID_UTF8
    return record


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


def over_cap() -> str:
    """The reason a document over the ``document_bytes`` cap is skipped, as the summary counts it."""
    return f"over the document cap of {cap('document_bytes'):,} bytes (VOCAGNO_MAX_DOCUMENT_BYTES)"


def over_cap_record(where: str | None = None) -> Record:
    return Record(None, over_cap(), where)


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
            return over_cap_record()
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


def numbered(records: Iterator[Record], what: str) -> Iterator[Record]:
    """``records`` with a document over the cap named by its place (``record 3``), counting from 1."""
    for number, record in enumerate(records, 1):
        if record.text is None and record.problem == over_cap():
            record.where = f"{what} {number}"
        yield record
