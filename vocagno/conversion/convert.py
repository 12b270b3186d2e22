"""Convert a text corpus into vocagno MDS shards: raw text, both tokenizations and both offset arrays per sample.

    python conversion/convert_dataset.py --out-root shards/owm                       # OpenWebMath from the hub
    python conversion/convert_dataset.py --input data/ more.jsonl --out-root shards/mine --workers 8
    python conversion/convert_dataset.py --out-root s3://bucket/owm --num-jobs 64 --job-index $SLURM_ARRAY_TASK_ID

This module is the command (``main``, ``parse_args``; ``conversion/convert_dataset.py`` runs it) and a job's run:
its parts are made by ``vocagno.conversion.parts`` (documents cleaned, encoded and packed by
``vocagno.conversion.packer``) and joined into the dataset by ``vocagno.conversion.merge``.

The input (``vocagno.conversion.sources``: files, local or in an object store, compressed or not, a ``save_to_disk``
folder, or a Hugging Face dataset; each document's text one field or a ``--text-template``) is split into parts of
``--docs-per-part`` documents (fewer where they would hold more than ``parts.PART_BYTES``), taken in order from the
job's source files (a part may span several small files);
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
import time
from collections import Counter
from dataclasses import dataclass
from typing import Iterator

# One core per worker: --workers is the parallelism, and tokenizers' own threads would blur it.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from tqdm import tqdm  # noqa: E402

from vocagno.conversion.merge import (  # noqa: E402
    CONFIG_FILE, REFUSED_FILE, add_part_stats, bound_field_sets, merge, print_summary,
)
from vocagno.conversion.parts import convert_part, part_stats, parts_of, set_encoder, worker_init  # noqa: E402
from vocagno.conversion.records import TextOf  # noqa: E402
from vocagno.conversion.sources import Source, sources_of  # noqa: E402
from vocagno.core.tokenization import load_tokenizer  # noqa: E402
from vocagno.data.outroots import (  # noqa: E402
    PART_STATS, OwnedLock, Output, all_jobs_done, check_or_write_settings, job_marker,
)
from vocagno.data.shards import METADATA_FILE, tokenizer_info  # noqa: E402
from vocagno.doors.untrusted import read_json  # noqa: E402
from vocagno.doors.writing import remove, write_atomically  # noqa: E402
from vocagno.entry import Parser  # noqa: E402
from vocagno.errors import Refused  # noqa: E402
from vocagno.memory import return_freed_memory  # noqa: E402
from vocagno.shown import terminal  # noqa: E402

__all__ = ["main", "parse_args", "convert", "Config"]

DEFAULT_INPUT = "open-web-math/open-web-math"
# What a conversion writes on its out-root besides CONFIG_FILE: its parts and its jobs' markers.
CONVERSION_FILE = re.compile(r"part-\d{5,}-\d{6,}|job-\d{4,}-of-\d{4,}\.json")
# A part's unfinished folder: built under a staging name (``.part-SSSSS-BBBBBB.staging-XXXX``), or an earlier
# version's ``.tmp-part-SSSSS-BBBBBB``; SSSSS is the source file the part starts in (what says which job's it is).
STALE_PART = re.compile(r"\.(?:part-(?P<source>\d{5,})-\d{6,}\.staging-.+|tmp-part-(?P<old>\d{5,})-\d{6,}(?:\..*)?)")


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
        set_encoder(student_tok, teacher_tok)
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
        add_part_stats(totals, stats)
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
                stats = part_stats(output, name)
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
            args.workers, mp_context=context, initializer=worker_init,
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
    bound_field_sets(totals)
    if args.num_jobs > 1:
        print_summary(f"job {args.job_index} of {args.num_jobs}", totals, output, sorted(done_parts),
                      over_cap=_over_cap(mine))
    return done_parts


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


def _collect(pending: dict, finished, return_when) -> None:
    done, _ = concurrent.futures.wait(pending, return_when=return_when)
    for future in done:
        finished(pending.pop(future), future.result())
