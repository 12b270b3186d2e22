"""Convert a text corpus into vocagno MDS shards: raw text, both tokenizations and both offset arrays per sample.

    python conversion/convert_dataset.py --out-root shards/owm                       # OpenWebMath from the hub
    python conversion/convert_dataset.py --input data/ more.jsonl --out-root shards/mine --workers 8
    python conversion/convert_dataset.py --out-root s3://bucket/owm --num-jobs 64 --job-index $SLURM_ARRAY_TASK_ID

The input (``vocagno.conversion.sources``: files, local or in an object store, compressed or not, a ``save_to_disk``
folder, or a Hugging Face dataset; each document's text one field or a ``--text-template``) is split into parts of
``--docs-per-part`` documents (fewer where they would hold more than ``PART_BYTES``), taken in order from the job's
source files (a part may span several small files);
every part is converted on its own into ``OUT_ROOT/part-SSSSS-BBBBBB/`` and renamed into place only when complete,
so an interrupted run (Ctrl-C, ``kill -9``) finishes when the same command is run again: complete parts are kept,
unfinished ones redone, and a source file that changed since its parts were made is refused by name. Parts do not
depend on ``--workers``, so any number of workers gives the same samples in the same order. ``--num-jobs K
--job-index i`` converts the source files ``f`` with ``f % K == i`` (a Slurm array, say); when the last job ends, it
merges the parts (``vocagno/data/outroots.py``: every shard verified on the out-root, ``vocagno.json`` and ``index.json``
written atomically). Until then the root has no ``index.json`` and never reads as a complete dataset.
``--merge-only`` repeats that final step, and refuses while a job has not finished unless ``--allow-partial``.

Every document that is not converted is counted by reason in the summary, and repairs (invalid UTF-8, lone
surrogates, documents split for length) are counted too; documents over the document cap are named by file and line
as well. The run exits non-zero when it made no sample, when fewer than ``--min-converted`` of the documents read
were converted, or when a file could not be read.

The corpus and the out-root's own files (settings, locks, job markers, parts' ``part.json`` and ``index.json``) may be
someone else's: they are read through ``vocagno.doors.untrusted`` (``vocagno.conversion``, ``vocagno/data/outroots.py``),
and a part is built in a fresh private folder (``vocagno.doors.writing.staging``) published by rename.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import os
import re
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

# One core per worker: --workers is the parallelism, and tokenizers' own threads would blur it.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if not __package__:  # run as the script it is (python conversion/convert_dataset.py): `conversion` is not installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from streaming import MDSWriter  # noqa: E402
from tqdm import tqdm  # noqa: E402

from vocagno.errors import Refused
from vocagno.data.outroots import (  # noqa: E402
    PART_STATS, OwnedLock, Output, all_jobs_done, check_or_write_settings, job_marker, merge_once, part_index,
    publish_dataset, unfinished_parts,
)
from vocagno.conversion.records import LONE_SURROGATE, Record, TextOf  # noqa: E402
from vocagno.conversion.sources import Source, parse_jsonl_line, sources_of  # noqa: E402
from vocagno.conversion.packer import Encoder, Packer  # noqa: E402
from vocagno.data.shards import (  # noqa: E402
    COLUMNS, METADATA_FILE, SHARD_HASH, ShardMetadata, TokenizerInfo, tokenizer_info,
)
from vocagno.core.tokenization import load_tokenizer  # noqa: E402
from vocagno.shown import terminal  # noqa: E402
from vocagno.doors.untrusted import UntrustedFile, plain_name, read_json  # noqa: E402
from vocagno.entry import Parser, run  # noqa: E402
from vocagno.doors.writing import make_readable, publish, remove, staging, write_atomically  # noqa: E402
from vocagno.memory import return_freed_memory  # noqa: E402

DEFAULT_INPUT = "open-web-math/open-web-math"
CONFIG_FILE = "conversion.json"
TAIL = "student tokens dropped at parts' ends (< seq-len)"
FOLDED = "characters under student tokens that the teacher's normalizer folded away"
SPECIAL_STRINGS = "kept: special-token strings in documents, tokenized as text"
ENCODE_BATCH = 64  # documents read and cleaned at a time
ENCODE_CHARS = 1 << 21  # characters encoded and packed at a time (``piece_groups``): bounds a worker's memory
SHARD_BYTES = 1 << 26  # an MDS shard's size limit: a bigger part is written as several shards
# What a part's documents may hold in memory (``held_bytes``) besides --docs-per-part: the converting process holds
# the part it reads and up to twice --workers parts pending, each worker the part it converts, so memory is bounded
# by the parts' bytes whatever the documents are (an honest part of 5,000 OpenWebMath documents of ~10 KB is ~50 MB
# as str, 100 MB where each holds a character past Latin-1, so it ends at 5,000 documents as ever).
PART_BYTES = 1 << 28
# The fields of the records skipped for lacking the text's field, counted by set of fields (at most FIELD_SETS sets a
# part: a corpus's records may each have others), so a refusal names what --text-field could be.
FIELDS = "fields of records skipped for lacking one: "
FIELD_SETS = 4
OTHER_FIELDS = FIELDS + "(other sets)"
NOT_COUNTS = ("seconds", "sources")  # part.json entries that don't add up over parts
NAMED = 20  # documents over the cap named in a summary (a job's marker names them all)
# A part's unfinished folder: built under a staging name (``.part-SSSSS-BBBBBB.staging-XXXX``), or an earlier
# version's ``.tmp-part-SSSSS-BBBBBB``; SSSSS is the source file the part starts in (what says which job's it is).
# What a conversion writes on its out-root besides CONFIG_FILE: its parts and its jobs' markers; and what its last
# merge left when it published nothing.
CONVERSION_FILE = re.compile(r"part-\d{5,}-\d{6,}|job-\d{4,}-of-\d{4,}\.json")
REFUSED_FILE = "refused.json"
STALE_PART = re.compile(r"\.(?:part-(?P<source>\d{5,})-\d{6,}\.staging-.+|tmp-part-(?P<old>\d{5,})-\d{6,}(?:\..*)?)")


# ------------------------------------------------------------------------------------------------------- converting


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


@dataclass
class Config:
    """What the samples depend on: a resumed run must use the same, and the parts record it."""

    inputs: list[str]
    split: str
    subset: str | None
    data_files: list[str] | None
    text_field: str
    text_template: str | None
    student_tokenizer: str
    teacher_tokenizer: str
    student_fingerprint: str
    teacher_fingerprint: str
    seq_len: int
    docs_per_part: int
    max_doc_chars: int
    compression: str | None


_encoder: Encoder | None = None


def _worker_init(student: str, teacher: str) -> None:
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


# ----------------------------------------------------------------------------------------------------------- driver
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Tokenizers before the out-root is made: a misspelled tokenizer leaves no folder behind.
    tokenizers = None if args.merge_only else (load_tokenizer(args.student_tokenizer),
                                               load_tokenizer(args.teacher_tokenizer))
    output = Output(args.out_root, args.local_root)
    unreadable = {} if args.merge_only else convert(args, output, tokenizers)
    if args.merge_only or all_jobs_done(output, args.num_jobs):
        return merge(output, args)
    print(f"job {args.job_index} of {args.num_jobs} done; the last job to finish merges the parts")
    return 1 if unreadable else 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = Parser(
        prog="python conversion/convert_dataset.py",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--input", nargs="+", default=[DEFAULT_INPUT],
        help="a Hugging Face dataset name (streamed), or .jsonl/.json/.parquet/.arrow/.txt files (any case, gzip or "
             "zstd or not) or folders of them (links to folders inside the folder given followed; links to folders "
             "outside it, links to files, FIFOs and devices in them listed, never read; a datasets save_to_disk "
             "folder among them), local or in an object store Streaming reaches (s3://bucket/corpus/, "
             "gs://bucket/corpus/*.jsonl.zst, ...)",
    )
    parser.add_argument("--split", default="train", help="the Hugging Face dataset's split (or a saved DatasetDict's)")
    parser.add_argument("--subset", default=None,
                        help="the Hugging Face dataset's configuration (FineWeb-Edu's sample-10BT, ...)")
    parser.add_argument("--data-files", nargs="+", default=None,
                        help="the Hugging Face dataset's files to read (patterns as datasets takes them)")
    parser.add_argument("--text-field", default="text", help="the field holding each document's text (.txt: the file)")
    parser.add_argument("--text-template", default=None,
                        help='the text made of several fields instead: "{title}\\n\\n{body}" ({a.b}: nested)')
    parser.add_argument("--student-tokenizer", default="TinyLlama/TinyLlama_v1.1",
                        help="HF name, local folder or shipped name (llama2, qwen2.5, ...)")
    parser.add_argument("--teacher-tokenizer", default="Qwen/Qwen2.5-Math-7B-Instruct",
                        help="HF name, local folder or shipped name")
    parser.add_argument("--seq-len", type=int, default=2048, help="student tokens per sample")
    parser.add_argument("--out-root", required=True,
                        help="the output: a local folder or a remote Streaming supports (s3://bucket/path, gs://, ...)")
    parser.add_argument("--local-root", default=None,
                        help="with a remote --out-root: the local working folder (unset: a private one under the temp "
                             "dir, vocagno-convert-UID); with a local --out-root: a working folder, whose files are "
                             "copied there (a folder shared with other machines)")
    parser.add_argument("--compression", default="zstd", help="MDS shard compression ('none' for none)")
    parser.add_argument("--workers", type=int, default=1, help="processes converting parts in parallel")
    parser.add_argument("--num-jobs", type=int, default=1, help="independent jobs the source files are split among")
    parser.add_argument("--job-index", type=int, default=0, help="which of the --num-jobs jobs this is")
    parser.add_argument("--docs-per-part", type=int, default=5000,
                        help="documents per part, fewer where they would hold more than 256 MiB (the unit of "
                             "resumption; each part drops its last < seq-len tokens)")
    parser.add_argument("--max-doc-chars", type=int, default=1_000_000,
                        help="longer documents are tokenized in pieces of at most this many characters")
    parser.add_argument("--min-converted", type=float, default=0.5,
                        help="fail (exit 2, nothing published) when a smaller fraction of the documents read converts")
    parser.add_argument("--merge-only", action="store_true", help="only merge the finished parts")
    parser.add_argument("--allow-partial", action="store_true",
                        help="merge even though some jobs have not finished (vocagno.json records which did)")
    args = parser.parse_args(argv)
    if not 0 <= args.job_index < args.num_jobs:
        parser.error(f"--job-index must be in [0, {args.num_jobs}), got {args.job_index}")
    for flag in ("workers", "docs_per_part", "max_doc_chars"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be positive")
    if args.seq_len < 2:
        parser.error(f"--seq-len must be at least 2 (a token and the one it predicts), got {args.seq_len}")
    if not 0 <= args.min_converted <= 1:
        parser.error(f"--min-converted is a fraction in [0, 1], got {args.min_converted}")
    args.compression = None if args.compression == "none" else args.compression
    return args


def convert(args: argparse.Namespace, output: Output, tokenizers: tuple) -> dict[str, str]:
    """Convert this job's parts that are not done on the out-root with the (student, teacher) ``tokenizers``; return
    the files that could not be read."""
    student_tok, teacher_tok = tokenizers
    student = tokenizer_info(student_tok, args.student_tokenizer)
    teacher = tokenizer_info(teacher_tok, args.teacher_tokenizer)
    config = Config(
        inputs=args.input, split=args.split, subset=args.subset, data_files=args.data_files,
        text_field=args.text_field, text_template=args.text_template,
        student_tokenizer=args.student_tokenizer, teacher_tokenizer=args.teacher_tokenizer,
        student_fingerprint=student.fingerprint, teacher_fingerprint=teacher.fingerprint,
        seq_len=args.seq_len, docs_per_part=args.docs_per_part, max_doc_chars=args.max_doc_chars,
        compression=args.compression,
    )
    # Listed first: an input that can't be read leaves nothing on the out-root.
    sources = sources_of(args.input, args.split, TextOf(args.text_field, args.text_template), args.subset,
                         args.data_files)
    marker = job_marker(args.job_index, args.num_jobs)
    lock = OwnedLock(output.local / f"{marker}.lock", f"job {args.job_index} of {args.num_jobs} into {output}")
    if not lock.acquire():
        raise Refused(f"another conversion is running job {args.job_index} into {output}: wait for it, "
                      "or give this one another --out-root")
    try:
        settings = {**config.__dict__, "student": student.__dict__, "teacher": teacher.__dict__}
        _start_afresh_after_a_refusal(output, args, settings)
        check_or_write_settings(output, CONFIG_FILE, settings, "vocagno conversion", "--out-root")
        for stale in output.local.iterdir():
            # This job's unfinished parts of an interrupted run (.tmp-part-*: of an earlier version), removed as they
            # stand: a link is unlinked, never followed. Any other name is not one of a part's, and is left alone.
            found = STALE_PART.fullmatch(stale.name)
            if found and int(found["source"] or found["old"]) % args.num_jobs == args.job_index:
                remove(stale)
        mine = [(i, s) for i, s in enumerate(sources) if i % args.num_jobs == args.job_index]
        print(f"{len(sources)} source file(s); this job (#{args.job_index} of {args.num_jobs}) converts {len(mine)}")
        global _encoder
        _encoder = Encoder(student_tok, teacher_tok)
        return_freed_memory()  # before the workers fork: they inherit it
        done_parts = _convert_parts(args, output, mine, config.__dict__, (student, teacher))
        unreadable = {s.name: s.error for _, s in mine if s.error}
        write_atomically(output.local / f"{marker}.json",
                         json.dumps({"parts": sorted(done_parts), "unreadable": unreadable,
                                     "over_cap": _over_cap(mine)}, indent=1))
        output.publish(f"{marker}.json")
    finally:
        lock.release()
    for name, error in unreadable.items():
        print(terminal(f"error: could not read {name}: {error}"), file=sys.stderr)
    return unreadable


def _start_afresh_after_a_refusal(output: Output, args: argparse.Namespace, settings: dict) -> None:
    """A single job's local out-root whose last merge published nothing (``REFUSED_FILE``: too little converted) and
    that a run with other settings finds: that conversion's files (its settings, parts and job markers) are of no use
    to this one, and are removed, saying so. Anything else stays, and ``check_or_write_settings`` decides."""
    root = output.local
    if output.remote is not None or args.num_jobs != 1 or not (root / REFUSED_FILE).is_file() or \
            (root / "index.json").exists() or (root / METADATA_FILE).exists() or not (root / CONFIG_FILE).is_file():
        return
    refused, earlier = read_json(REFUSED_FILE, folder=root), read_json(CONFIG_FILE, folder=root)
    # Only the refusal of the single job whose settings the out-root holds, and no other job's files or locks.
    others = [p.name for p in root.iterdir() if re.fullmatch(r"job-\d{4,}-of-\d{4,}\.(json|lock)", p.name)
              and p.name not in (f"{job_marker(0, 1)}.json", f"{job_marker(0, 1)}.lock")]
    if not (isinstance(refused, dict) and refused.get("num_jobs") == 1 and isinstance(earlier, dict)
            and refused.get("settings") == earlier) or others:
        return
    changed = sorted(k for k in set(settings) | set(earlier) if settings.get(k) != earlier.get(k))
    if not changed:
        return
    print(f"starting afresh in {output}: its earlier conversion published nothing and had other settings "
          f"({', '.join(changed)} differ)")
    for entry in root.iterdir():
        if entry.name in (CONFIG_FILE, REFUSED_FILE) or CONVERSION_FILE.fullmatch(entry.name):
            remove(entry)


def _over_cap(sources: list[tuple[int, Source]]) -> list[str]:
    """The documents of ``sources`` skipped as over the document cap, by file and place (once they are read)."""
    return [where for _, source in sources for where in source.over_cap]


def _convert_parts(args, output: Output, mine: list[tuple[int, Source]], config: dict, tokenizers) -> list[str]:
    done_parts, totals = [], Counter()
    sizes = [source.size for _, source in mine]
    # Over the input's bytes where every file's size is known (local files, objects once fetched are not), read as
    # the parts are made (a .jsonl file a line at a time); else the documents, with no total.
    in_bytes = bool(sizes) and all(size is not None for size in sizes)
    progress = tqdm(total=sum(sizes) if in_bytes else None, unit="B" if in_bytes else "doc", unit_scale=in_bytes,
                    desc="converting", dynamic_ncols=True, mininterval=1.0)
    begin = time.perf_counter()
    fingerprints: dict[str, dict] = {}

    def fingerprint(spanned: list[Source]) -> dict[str, dict]:
        for source in spanned:
            if source.name not in fingerprints:
                fingerprints[source.name] = source.fingerprint()
        return {source.name: fingerprints[source.name] for source in spanned}

    def finished(name: str, stats: dict, converted_now: bool = True) -> None:
        if converted_now:
            output.publish_part(name)
        done_parts.append(name)
        _add_part_stats(totals, stats)
        progress.update(sum(source.read_bytes() for _, source in mine) - progress.n if in_bytes
                        else stats["documents read"])
        elapsed = max(time.perf_counter() - begin, 1e-9)
        rate = totals["student tokens"] / elapsed
        progress.set_postfix_str(f"{totals['documents read']:,} docs, {rate:,.0f} student tok/s, "
                                 f"{totals['samples']} samples")

    def todo() -> Iterator[tuple[str, list, dict]]:
        for name, records, spanned in parts_of(mine, args.docs_per_part):
            sources = fingerprint(spanned)
            done_there = output.pull(f"{name}/{PART_STATS}")
            if done_there or (output.local / name / PART_STATS).exists():
                stats = _part_stats(output, name)
                _check_same_sources(output, name, stats.get("sources", {}), sources)
                if stats["documents read"] != len(records):  # the same files cut otherwise (another PART_BYTES)
                    raise Refused(f"{name} in {output} holds {stats['documents read']:,} documents, but the same part "
                                  f"of the input is now {len(records):,} (its documents are cut into parts "
                                  "otherwise): convert into a new --out-root")
                if not done_there:  # finished here, but its upload broke off: upload it again
                    output.publish_part(name)
                finished(name, stats, converted_now=False)
                continue
            yield name, records, sources

    if args.workers == 1:
        for name, records, sources in todo():
            finished(name, convert_part(records, str(output.local / name), config, tokenizers, sources))
    else:
        # fork where there is one: workers start at once, with the modules already imported.
        context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
        with concurrent.futures.ProcessPoolExecutor(
            args.workers, mp_context=context, initializer=_worker_init,
            initargs=(args.student_tokenizer, args.teacher_tokenizer),
        ) as pool:
            pending: dict = {}
            for name, records, sources in todo():
                future = pool.submit(convert_part, records, str(output.local / name), config, tokenizers, sources)
                pending[future] = name
                if len(pending) >= 2 * args.workers:  # bounded read-ahead: the corpus never sits in memory
                    _collect(pending, finished, concurrent.futures.FIRST_COMPLETED)
            _collect(pending, finished, concurrent.futures.ALL_COMPLETED)
    if in_bytes:  # every file read to its end: a part that filled at a file's end was counted before it was done
        progress.update(sum(source.read_bytes() for _, source in mine) - progress.n)
    progress.close()
    _bound_field_sets(totals)
    if args.num_jobs > 1:
        print_summary(f"job {args.job_index} of {args.num_jobs}", totals, output, sorted(done_parts),
                      over_cap=_over_cap(mine))
    return done_parts


def _part_stats(output: Output, part: str) -> dict:
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


def _job(output: Output, marker: str) -> dict:
    """A finished job's marker (its parts, the files it could not read, its documents over the cap), refused unless
    it holds those as a converting job writes them."""
    where = f"{output}/{marker}"
    job = read_json(marker, folder=output.local)
    if not (isinstance(job, dict) and isinstance(job.get("parts"), list)
            and isinstance(job.get("unreadable", {}), dict) and isinstance(job.get("over_cap", []), list)
            and all(isinstance(v, str) for v in [*job.get("unreadable", {}).values(), *job.get("over_cap", [])])):
        raise UntrustedFile(f"{where}: refused: not a job's record of its parts")
    job["parts"] = [plain_name(p, where, "part name") for p in job["parts"]]
    return job


def _check_same_sources(output: Output, part: str, made_from: dict, now: dict) -> None:
    """Refuse to resume when a part's source files are not what they were when it was made."""
    def same(a: dict, b: dict) -> bool:  # the content; a file copied elsewhere keeps it, and a new mtime
        return {k: v for k, v in a.items() if k != "mtime"} == {k: v for k, v in b.items() if k != "mtime"}

    if made_from.keys() != now.keys():
        raise Refused(
            f"the input changed: {part} in {output} was made from {sorted(made_from)}, but the same part is "
            f"now {sorted(now)} (files added, removed or reordered); convert into a new --out-root"
        )
    def size(fingerprint: dict) -> str:  # a file that could not be read, or a hub shard, has no size
        return f"{fingerprint['bytes']:,} bytes" if isinstance(fingerprint.get("bytes"), int) else "no size"

    for name, earlier in made_from.items():
        if not same(earlier, now[name]):
            raise Refused(
                f"{name} changed since {part} in {output} was made from it ({size(earlier)} then, "
                f"{size(now[name])} now, or other content): restore it, or convert into a new --out-root"
            )


def _add_part_stats(totals: Counter, stats: dict) -> None:
    totals.update({k: v for k, v in stats.items() if k not in NOT_COUNTS})  # counts add up; a part's seconds don't


def _bound_field_sets(totals: Counter) -> None:
    """At most ``FIELD_SETS`` sets of fields kept of all the parts' (the most frequent), the others' records counted
    together, so a corpus whose records each have other fields keeps the summary, the refusal and vocagno.json small
    (the parts' own, FIELD_SETS each, are added up first)."""
    sets = sorted((k for k in totals if k.startswith(FIELDS)), key=lambda k: (k == OTHER_FIELDS, -totals[k], k))
    for key in [k for k in sets if k != OTHER_FIELDS][FIELD_SETS:]:
        totals[OTHER_FIELDS] += totals.pop(key)


def _collect(pending: dict, finished, return_when) -> None:
    done, _ = concurrent.futures.wait(pending, return_when=return_when)
    for future in done:
        finished(pending.pop(future), future.result())


def merge(output: Output, args: argparse.Namespace) -> int:
    """Join the finished parts into one dataset. Jobs that end together merge once: the first takes the lock."""
    merged = merge_once(output, lambda: _merge(output, args))
    return 0 if merged is None else merged  # None: a live job is merging: it publishes the dataset


def _merge(output: Output, args: argparse.Namespace) -> int:
    root = output.local
    if not output.fetch(CONFIG_FILE):
        raise Refused(f"cannot merge {output}: no conversion was started there")
    config = read_json(CONFIG_FILE, folder=root)
    if not (isinstance(config, dict) and isinstance(config.get("seq_len"), int)
            and all(isinstance(config.get(side), dict) for side in ("student", "teacher"))):
        raise UntrustedFile(f"{output}/{CONFIG_FILE}: refused: not the settings a vocagno conversion records")
    markers = {i: f"{job_marker(i, args.num_jobs)}.json" for i in range(args.num_jobs)}
    done = [i for i, marker in markers.items() if output.pull(marker)]
    unfinished = [i for i in markers if i not in done]
    if not done or (unfinished and not args.allow_partial):
        raise Refused(
            f"cannot merge {output}: job(s) {unfinished} of {args.num_jobs} have not finished; run them (the "
            "same command with their --job-index), or add --allow-partial to publish what the others made"
        )
    jobs = {markers[i]: _job(output, markers[i]) for i in done}
    parts = sorted({p for job in jobs.values() for p in job["parts"]})
    unreadable = {name: error for job in jobs.values() for name, error in job.get("unreadable", {}).items()}
    over_cap = [where for job in jobs.values() for where in job.get("over_cap", [])]
    missing = unfinished_parts(output, parts)
    if missing:
        raise Refused(f"cannot merge {output}: parts not finished there: {missing}")
    totals = Counter()
    for part in parts:
        _add_part_stats(totals, _part_stats(output, part))
    _bound_field_sets(totals)
    totals["unreadable files"] = len(unreadable)
    too_little = _too_little(totals, args.min_converted, config["seq_len"])
    if too_little:
        print_summary("dataset (not published)", totals, output, parts, unreadable=unreadable, over_cap=over_cap)
        if output.fetch("index.json"):  # a dataset published before stays as it is
            raise Refused(f"nothing merged into {output}: {too_little}; its published dataset stays")
        # Recorded with the settings and jobs it refused: a single job's rerun there with other options starts
        # afresh; one with the same options (a lower --min-converted) merges these parts.
        fresh = output.remote is None and args.num_jobs == 1
        if fresh:
            write_atomically(root / REFUSED_FILE, json.dumps({"why": too_little, "num_jobs": args.num_jobs,
                                                              "settings": config}))
        rerun = ("the same command with corrected options starts afresh there (a corrected input file: delete "
                 f"{output} first)" if fresh else
                 f"its parts stay on {output}: delete them, or give another --out-root, to convert with other options")
        raise Refused(f"nothing published to {output}: {too_little}; {rerun}")
    metadata = ShardMetadata(
        student=TokenizerInfo(**config["student"]),
        teacher=TokenizerInfo(**config["teacher"]),
        seq_len=config["seq_len"],
        totals=dict(totals),
        partial={"jobs_done": done, "num_jobs": args.num_jobs} if unfinished else None,
    )
    publish_dataset(output, parts, metadata)
    if (root / REFUSED_FILE).exists():  # an earlier merge's refusal of the same parts, now published
        remove(root / REFUSED_FILE)
    print_summary("dataset", totals, output, parts, merged=True, unreadable=unreadable, over_cap=over_cap)
    if unfinished:
        print(f"PARTIAL: jobs {unfinished} of {args.num_jobs} had not finished (--allow-partial; vocagno.json says so)")
    return 1 if unreadable else 0


def _too_little(totals: Counter, min_converted: float, seq_len: int) -> str | None:
    """Why the converted data is too little to publish, or None."""
    read, converted = totals["documents read"], totals["documents converted"]
    skipped = ", ".join(f"{k.removeprefix('skipped: ')}: {v:,}" for k, v in totals.most_common() if k.startswith("skipped"))
    if read == 0:
        return "the input holds no documents"
    if converted < min_converted * read:
        hint = ("; --text-field NAME names the field holding the text (--text-template joins several)"
                if any(k.startswith("skipped: missing ") for k in totals) else "")
        fields = "; ".join(f"{k.removeprefix(FIELDS)}: {v:,}" for k, v in totals.most_common() if k.startswith(FIELDS))
        fields = f" (the records without it have the fields: {fields})" if fields else ""
        return (f"only {converted:,} of {read:,} documents converted (--min-converted {min_converted}); skipped: "
                f"{skipped or 'none'}{fields}{hint}")
    if totals["samples"] == 0:
        return (f"{converted:,} documents converted, but their {totals['student tokens']:,} student tokens make no "
                f"sample of --seq-len {seq_len} (fewer than that per part)")
    return None


def print_summary(title: str, totals: Counter, output: Output, parts: list[str], merged: bool = False,
                  unreadable: dict[str, str] | None = None, over_cap: list[str] | None = None) -> None:
    """The counts of ``totals``, the files that could not be read and the documents skipped as over the document
    cap (by file and line: the first ``NAMED``, then how many more)."""
    shard_bytes = 0
    for part in parts:
        for shard in part_index(output.local, part, output)["shards"]:
            shard_bytes += (shard.get("zip_data") or shard["raw_data"])["bytes"]
    tokens = totals["student tokens"]
    lines = [
        f"--- summary: {title} ({len(parts)} parts) ---",
        f"documents read:        {totals['documents read']:,}",
        f"documents converted:   {totals['documents converted']:,}",
    ]
    lines += [f"  {k}: {v:,}" for k, v in sorted(totals.items()) if k.split(":")[0] in ("skipped", "repaired", "kept")]
    lines += [f"    {k}: {v:,}" for k, v in totals.most_common() if k.startswith(FIELDS)][:NAMED]
    over_cap = over_cap or []
    lines += [f"    skipped, over the document cap: {where}" for where in over_cap[:NAMED]]
    if len(over_cap) > NAMED:
        lines.append(f"    ... and {len(over_cap) - NAMED:,} more (all named in the job-*.json files on the out-root)")
    lines += [
        f"samples:               {totals['samples']:,}",
        f"student tokens:        {tokens:,}",
        f"teacher tokens:        {totals['teacher tokens']:,}",
        f"{TAIL}: {totals[TAIL]:,}",
        f"{FOLDED}: {totals[FOLDED]:,}",
        f"bytes on disk (shards): {shard_bytes:,}"
        + (f" = {shard_bytes / tokens:.2f} bytes per student token" if tokens else ""),
    ]
    lines += [f"UNREADABLE: {name}: {error}" for name, error in (unreadable or {}).items()]
    if merged:
        lines.append(f"complete: {output} (index.json, vocagno.json)"
                     + (f", without the {len(unreadable)} unreadable file(s) above" if unreadable else ""))
    print("\n".join(terminal(line) for line in lines), flush=True)  # file names and errors: a corpus's


if __name__ == "__main__":
    run(main)
