"""A part of a conversion: a run of documents converted on its own into an MDS folder, the unit of resumption.

``parts_of`` cuts a job's sources into parts (``--docs-per-part`` documents, fewer where they would hold more than
``PART_BYTES``, taken in order across the job's files). ``convert_part`` converts one (in a worker process, or in the
converting one): each record cleaned (``clean``: skips and repairs counted), its pieces encoded and packed a group at a
time (``piece_groups``, ``vocagno.conversion.packer``), the samples written as MDS shards in a fresh private folder
published by rename, with the part's counts and the fingerprints of its files in ``part.json``; ``part_stats`` reads
those back from the out-root (a file from elsewhere).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Iterator

from streaming import MDSWriter

from vocagno.conversion.packer import Encoder, Packer
from vocagno.conversion.records import LONE_SURROGATE, Record, TextOf
from vocagno.conversion.sources import Source, parse_jsonl_line
from vocagno.core.tokenization import load_tokenizer
from vocagno.data.outroots import PART_STATS, Output
from vocagno.data.shards import COLUMNS, SHARD_HASH, TokenizerInfo
from vocagno.doors.untrusted import UntrustedFile, read_json
from vocagno.doors.writing import make_readable, publish, staging, write_atomically
from vocagno.errors import Refused
from vocagno.memory import return_freed_memory

__all__ = ["clean", "piece_groups", "set_encoder", "worker_init", "convert_part", "held_bytes", "parts_of",
           "part_stats"]

TAIL = "student tokens dropped at parts' ends (< seq-len)"
FOLDED = "characters under student tokens that the teacher's normalizer folded away"
SPECIAL_STRINGS = "kept: special-token strings in documents, tokenized as text"
ENCODE_BATCH = 64  # documents read and cleaned at a time
ENCODE_CHARS = 1 << 21  # characters encoded and packed at a time (``piece_groups``): bounds a worker's memory
SHARD_BYTES = 1 << 26  # an MDS shard's size limit: a bigger part is written as several shards
# What a part's documents may hold in memory (``held_bytes``) besides --docs-per-part: the converting process holds
# the part it reads and up to twice --workers parts pending, each worker the part it converts, so memory is bounded
# by the parts' bytes whatever the documents are (an honest part of 5,000 OpenWebMath documents of ~10 KB is ~50 MB
# as str, 100 MB where each holds a character past Latin-1, so it still ends at its 5,000 documents).
PART_BYTES = 1 << 28
# The fields of the records skipped for lacking the text's field, counted by set of fields (at most FIELD_SETS sets a
# part: a corpus's records may each have others), so a refusal names what --text-field could be.
FIELDS = "fields of records skipped for lacking one: "
FIELD_SETS = 4
OTHER_FIELDS = FIELDS + "(other sets)"
NOT_COUNTS = ("seconds", "sources")  # part.json entries that don't add up over parts


def clean(record: Record, max_doc_chars: int, stats: Counter) -> list[str]:
    """The pieces of text to tokenize for a record (several when it is very long); [] when it is skipped.

    Skips and repairs are counted in ``stats`` under ``skipped: ...`` and ``repaired: ...``.
    """
    if record.text is None:
        stats[f"skipped: {record.problem}"] += 1
        if record.fields is not None:
            fields = FIELDS + record.fields
            if fields not in stats and sum(k.startswith(FIELDS) and k != OTHER_FIELDS for k in stats) >= FIELD_SETS:
                fields = OTHER_FIELDS
            stats[fields] += 1
        return []
    text = record.text
    if record.problem:
        stats[f"repaired: {record.problem}"] += 1
    if LONE_SURROGATE.search(text):
        # Lone surrogates (from JSON escapes like "\ud800") can't be encoded; pairs are joined, lone ones replaced.
        text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        stats["repaired: lone surrogates replaced by U+FFFD"] += 1
    if not text or text.isspace():
        stats["skipped: empty or whitespace-only"] += 1
        return []
    if "\x00" in text:
        stats["kept: contains NUL characters"] += 1
    if len(text) <= max_doc_chars:
        return [text]
    stats[f"repaired: longer than {max_doc_chars:,} characters, tokenized in pieces"] += 1
    pieces, begin = [], 0
    while begin < len(text):
        stop = min(begin + max_doc_chars, len(text))
        if stop < len(text):  # cut before the last whitespace of the piece's final 1000 characters, if there is one
            window = max(begin, stop - 1000)  # a negative start would count from the end of the text
            space = max(text.rfind(" ", window, stop), text.rfind("\n", window, stop))
            stop = space if space > begin else stop
        pieces.append(text[begin:stop])
        begin = stop
    return pieces


def piece_groups(docs: list[list[str]]) -> Iterator[tuple[list[list[str]], bool, bool]]:
    """The documents' pieces in groups of at most ``ENCODE_CHARS`` characters (or one piece), as ``Encoder.encode``'s
    arguments: a long document goes through encoding and packing a group at a time, so a worker's memory is bounded
    by ``ENCODE_CHARS``, not by the longest document."""
    group: list[list[str]] = []
    characters, continues_first = 0, False
    for doc in docs:
        for k, piece in enumerate(doc):
            if group and characters + len(piece) > ENCODE_CHARS:
                yield group, continues_first, k > 0
                group, characters, continues_first = [], 0, k > 0
            if k == 0 or not group:
                group.append([])
            group[-1].append(piece)
            characters += len(piece)
    if group:
        yield group, continues_first, False


_encoder: Encoder | None = None


def set_encoder(student, teacher) -> None:
    """Encode this process's parts with the (student, teacher) tokenizers: set before the workers fork, which inherit
    it."""
    global _encoder
    _encoder = Encoder(student, teacher)


def worker_init(student: str, teacher: str) -> None:
    """Load the tokenizers in a spawned worker (a forked one inherits the parent's encoder), and make the worker
    exit when the converting process is gone (``kill -9`` leaves no orphans holding gigabytes)."""
    global _encoder
    return_freed_memory()
    if _encoder is None:
        _encoder = Encoder(load_tokenizer(student), load_tokenizer(teacher))
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()


def _exit_with_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)


def convert_part(
    records: list[Record | bytes], part_dir: str, config: dict, tokenizers: tuple[TokenizerInfo, TokenizerInfo],
    sources: dict[str, dict],
) -> dict:
    """Convert one part's records (raw JSON lines are parsed here) into an MDS folder, built in a fresh private
    folder beside it (``vocagno.doors.writing.staging``: never a name something else may already stand at, so a link
    planted there is not written through) and renamed into place when complete. ``sources``: the fingerprints of the
    files the records come from, kept in part.json."""
    final = Path(part_dir)
    built = staging(final)
    stats: Counter = Counter()
    packer = Packer(config["seq_len"], *tokenizers)
    text_of = TextOf(config["text_field"], config["text_template"])
    begin = time.perf_counter()
    with MDSWriter(out=str(built), columns=COLUMNS, compression=config["compression"], hashes=[SHARD_HASH],
                   size_limit=SHARD_BYTES) as out:
        for batch_begin in range(0, len(records), ENCODE_BATCH):
            batch = records[batch_begin : batch_begin + ENCODE_BATCH]
            parsed = (parse_jsonl_line(r, text_of) if isinstance(r, bytes) else r for r in batch)
            docs = [pieces for pieces in (clean(r, config["max_doc_chars"], stats) for r in parsed) if pieces]
            stats[SPECIAL_STRINGS] += _encoder.special_strings(docs)
            stats["documents converted"] += len(docs)
            for group, continues_first, open_last in piece_groups(docs):
                try:
                    encoded = _encoder.encode(group, continues_first, open_last)
                except Refused as error:  # a tokenizer that panics on a document: which part, from which files
                    files = ", ".join(list(sources)[:3]) + (", ..." if len(sources) > 3 else "")
                    raise Refused(f"{error} (part {final.name}, from {files})") from None
                stats["student tokens"] += len(encoded.student_ids)
                stats["teacher tokens"] += len(encoded.teacher_ids)
                for sample in packer.add(encoded):
                    out.write(sample)
                    stats["samples"] += 1
        packer.finish()
    stats["documents read"] = len(records)
    stats[TAIL] = packer.tail_tokens
    stats[FOLDED] = packer.folded_characters
    stats["seconds"] = round(time.perf_counter() - begin, 3)
    write_atomically(built / PART_STATS, json.dumps({**stats, "sources": sources}, indent=1))
    make_readable(built)
    publish(built, final, replace=True)  # replaces a complete part of an earlier run that we were asked to redo
    return dict(stats)


def held_bytes(record: Record | bytes) -> int:
    """What a record's document holds in memory (``sys.getsizeof``): a raw .jsonl line's bytes, or a text as Python
    stores it (1, 2 or 4 bytes a character); 0 for a record without text (a skipped document's reason)."""
    if isinstance(record, bytes):
        return sys.getsizeof(record)
    return 0 if record.text is None else sys.getsizeof(record.text)


def parts_of(sources: list[tuple[int, Source]], docs_per_part: int) -> Iterator[tuple[str, list, list[Source]]]:
    """(part name, records, the sources they come from) for every part of the given sources, in order.

    A part takes the next ``docs_per_part`` records, crossing into the next file when one ends, so many small files
    still make samples (each part drops its last < seq-len tokens); it ends sooner, before the record that would take
    its documents over ``PART_BYTES`` (``held_bytes``; a record alone is a part), so it holds at most that, whatever
    the documents are. It is named by the source it starts in and its place in the job: the same input always gives
    the same parts.
    """
    records: list = []
    spanned: list[Source] = []
    block, first, held = 0, None, 0
    for source_index, source in sources:
        for record in source.records():
            size = held_bytes(record)
            if records and held + size > PART_BYTES:
                yield f"part-{first:05d}-{block:06d}", records, spanned
                block, records, spanned, first, held = block + 1, [], [], None, 0
            if first is None:
                first = source_index
            if not spanned or spanned[-1] is not source:
                spanned.append(source)
            records.append(record)
            held += size
            if len(records) == docs_per_part:
                yield f"part-{first:05d}-{block:06d}", records, spanned
                block, records, spanned, first, held = block + 1, [], [], None, 0
    if records or block == 0:
        yield f"part-{first if first is not None else 0:05d}-{block:06d}", records, spanned


def part_stats(output: Output, part: str) -> dict:
    """A finished part's ``part.json``, as its local copy holds it (a file from elsewhere: no link, within the
    ``json_bytes`` cap), refused unless it is a JSON object of counts and the sources it was made from."""
    stats = read_json(f"{part}/{PART_STATS}", folder=output.local)
    if not (isinstance(stats, dict) and isinstance(stats.get("documents read"), int)
            and isinstance(stats.get("sources", {}), dict)
            and all(isinstance(made_from, dict) and isinstance(made_from.get("bytes", 0), int)
                    for made_from in stats.get("sources", {}).values())
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for k, v in stats.items()
                    if k != "sources")):
        raise UntrustedFile(f"{output.local / part / PART_STATS}: refused: not a part's counts and sources")
    return stats
