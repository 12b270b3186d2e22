"""Convert a text corpus into vocagno MDS shards: raw text, both tokenizations and both offset arrays per sample.

    python conversion/convert_dataset.py --out-root shards/owm                       # OpenWebMath from the hub
    python conversion/convert_dataset.py --input data/ more.jsonl --out-root shards/mine --workers 8
    python conversion/convert_dataset.py --out-root s3://bucket/owm --num-jobs 64 --job-index $SLURM_ARRAY_TASK_ID

The input is split into parts (``--docs-per-part`` documents of one source file each); every part is converted on
its own into ``OUT_ROOT/part-SSSSS-BBBBBB/`` and renamed into place only when complete, so an interrupted run (Ctrl-C,
``kill -9``) finishes when the same command is run again: complete parts are kept, unfinished ones redone. Parts do
not depend on ``--workers``, so any number of workers gives the same samples in the same order. ``--num-jobs K
--job-index i`` converts the source files ``f`` with ``f % K == i`` (a Slurm array, say); when the last job ends,
it merges the parts' indexes with Streaming's ``merge_index`` and writes ``vocagno.json``. Until then the root has
no ``index.json`` and never reads as a complete dataset. ``--merge-only`` repeats that final step. A remote
``--out-root`` (any Streaming supports) is written through a local working folder; each part is uploaded when it is
complete, its ``part.json`` last, so a rerun anywhere skips exactly the finished parts.

Every document that is not converted is counted by reason in the summary, and repairs (invalid UTF-8, lone
surrogates, documents split for length) are counted too.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import copy
import itertools
import json
import logging
import multiprocessing
import os
import re
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

# One core per worker: --workers is the parallelism, and tokenizers' own threads would blur it.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
from streaming import MDSWriter  # noqa: E402
from streaming.base.util import merge_index  # noqa: E402
from tqdm import tqdm  # noqa: E402

from vocagno.shards import (  # noqa: E402
    COLUMNS, METADATA_FILE, EncodedDocuments, Packer, ShardMetadata, TokenizerInfo, tokenizer_info,
)
from vocagno.tokenization import load_tokenizer  # noqa: E402

DEFAULT_INPUT = "open-web-math/open-web-math"
LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet", ".txt")
CONFIG_FILE = "conversion.json"
PART_STATS = "part.json"
MERGE_LOCK = "merge.lock"
TAIL = "student tokens dropped at parts' ends (< seq-len)"
FOLDED = "characters under student tokens that the teacher's normalizer folded away"
SPECIAL_STRINGS = "kept: special-token strings in documents, tokenized as text"
ENCODE_BATCH = 64  # documents per encode_batch call


# ----------------------------------------------------------------------------------------------------------- reading
@dataclass
class Record:
    """A document as read, or the reason it can't be one."""

    text: str | None
    problem: str | None = None  # why text is None (skipped), or what was repaired while reading


class Source:
    """One input file (or one shard of a Hugging Face dataset): the unit that jobs split and parts belong to."""

    def __init__(self, name: str, read: Callable[[], Iterator]):
        self.name = name
        self._read = read

    def records(self) -> Iterator[Record | bytes]:
        return self._read()


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


def _read_jsonl(path: Path) -> Iterator[bytes]:
    """The raw lines: workers parse them (``parse_jsonl_line``), so the reading process stays light."""
    with open(path, "rb") as f:
        for raw in f:
            if raw.strip():  # a blank line is no document
                yield raw


def parse_jsonl_line(raw: bytes, text_field: str) -> Record:
    line = _decode(raw)
    try:
        record = _record_from_object(json.loads(line.text), text_field)
    except json.JSONDecodeError:
        return Record(None, "invalid JSON line")
    if record.text is not None and line.problem:
        record.problem = line.problem
    return record


def _read_json(path: Path, text_field: str) -> Iterator[Record | bytes]:
    try:
        rows = json.loads(_decode(path.read_bytes()).text)
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
    yield _decode(path.read_bytes())


def local_sources(inputs: list[str], text_field: str) -> list[Source]:
    files: list[Path] = []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in LOCAL_SUFFIXES)
            if not found:
                raise SystemExit(f"error: {path} holds no {', '.join(LOCAL_SUFFIXES)} files")
            files += found
        elif path.is_file():
            if path.suffix not in LOCAL_SUFFIXES:
                raise SystemExit(f"error: {path}: unsupported file type (use {', '.join(LOCAL_SUFFIXES)})")
            files.append(path)
        else:
            raise SystemExit(f"error: input {item} does not exist")
    readers = {
        ".jsonl": lambda p: lambda: _read_jsonl(p),
        ".json": lambda p: lambda: _read_json(p, text_field),
        ".parquet": lambda p: lambda: _read_parquet(p, text_field),
        ".txt": lambda p: lambda: _read_txt(p),
    }
    return [Source(str(p), readers[p.suffix](p)) for p in files]


def hub_sources(name: str, split: str, text_field: str) -> list[Source]:
    """A Hugging Face dataset, streamed (nothing lands on disk first), one source per file shard."""
    import datasets

    dataset = datasets.load_dataset(name, split=split, streaming=True)

    def reader(index: int):
        return lambda: (
            _record_from_object(row, text_field) for row in dataset.shard(num_shards=dataset.n_shards, index=index)
        )

    return [Source(f"{name}[{split}] shard {i}", reader(i)) for i in range(dataset.n_shards)]


def sources_of(inputs: list[str], split: str, text_field: str) -> list[Source]:
    """Local files when any input names one (a missing one is then an error), else one Hugging Face dataset."""
    if any(Path(item).exists() for item in inputs) or len(inputs) > 1:
        return local_sources(inputs, text_field)
    if Path(inputs[0]).suffix in LOCAL_SUFFIXES:
        raise SystemExit(f"error: input {inputs[0]} does not exist")
    try:
        return hub_sources(inputs[0], split, text_field)
    except Exception as error:  # datasets raises many kinds: offline, no such repo, no such split
        raise SystemExit(
            f"error: input {inputs[0]} is no local file or folder, and as a Hugging Face dataset it could not be "
            f"loaded: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        ) from error


# ------------------------------------------------------------------------------------------------------- converting
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def clean(record: Record, max_doc_chars: int, stats: Counter) -> list[str]:
    """The pieces of text to tokenize for a record (several when it is very long); [] when it is skipped.

    Skips and repairs are counted in ``stats`` under ``skipped: ...`` and ``repaired: ...``.
    """
    if record.text is None:
        stats[f"skipped: {record.problem}"] += 1
        return []
    text = record.text
    if record.problem:
        stats[f"repaired: {record.problem}"] += 1
    if _LONE_SURROGATE.search(text):
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
        if stop < len(text):  # cut after the last whitespace of the piece's final 1000 characters, if there is one
            space = max(text.rfind(" ", stop - 1000, stop), text.rfind("\n", stop - 1000, stop))
            stop = space + 1 if space > begin else stop
        pieces.append(text[begin:stop])
        begin = stop
    return pieces


class Encoder:
    """Both tokenizers, encoding a batch of documents (each a list of pieces) into ``EncodedDocuments``.

    Document text is text: a special token's string in a document ("</s>", "<|endoftext|>") is tokenized as the
    characters it is, never as the special token (which would get a real id with a non-empty span, and end a
    document inside a document). ``special_strings`` counts such strings, for the summary.
    """

    def __init__(self, student, teacher):  # fast tokenizers, as load_tokenizer gives them
        self.student = copy.deepcopy(student.backend_tokenizer)
        self.teacher = copy.deepcopy(teacher.backend_tokenizer)
        self.student.encode_special_tokens = self.teacher.encode_special_tokens = True
        specials = {str(t) for tok in (student, teacher) for t in tok.added_tokens_decoder.values() if t.special}
        self._special = re.compile("|".join(map(re.escape, sorted(specials, key=len, reverse=True))))

    def special_strings(self, docs: list[list[str]]) -> int:
        return sum(len(self._special.findall(piece)) for doc in docs for piece in doc)

    def encode(self, docs: list[list[str]]) -> EncodedDocuments:
        pieces = [piece for doc in docs for piece in doc]
        piece_chars = np.array([len(p) for p in pieces], dtype=np.int64)
        piece_starts = np.cumsum(piece_chars) - piece_chars  # where each piece begins in the joined text
        first_piece = np.cumsum([0] + [len(doc) for doc in docs])[:-1]
        s_ids, s_offsets, s_lengths = _encode(self.student, pieces, piece_starts)
        t_ids, t_offsets, t_lengths = _encode(self.teacher, pieces, piece_starts)
        return EncodedDocuments(
            text="".join(pieces),
            doc_ends=np.add.reduceat(piece_chars, first_piece).cumsum(),
            student_ids=s_ids,
            student_offsets=s_offsets,
            student_lengths=np.add.reduceat(s_lengths, first_piece),
            teacher_ids=t_ids,
            teacher_offsets=t_offsets,
            teacher_lengths=np.add.reduceat(t_lengths, first_piece),
        )


def _encode(tokenizer, texts: list[str], starts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Ids, offsets into the joined texts, and token counts per text; one numpy conversion for the whole batch."""
    encodings = tokenizer.encode_batch(texts, add_special_tokens=False)
    ids = [e.ids for e in encodings]
    lengths = np.array([len(i) for i in ids], dtype=np.int64)
    total = int(lengths.sum())
    flat_ids = np.fromiter(itertools.chain.from_iterable(ids), np.int64, total)
    offsets = np.fromiter(
        itertools.chain.from_iterable(itertools.chain.from_iterable(e.offsets for e in encodings)), np.int64, 2 * total
    ).reshape(total, 2)
    return flat_ids, offsets + np.repeat(starts, lengths)[:, None], lengths


@dataclass
class Config:
    """What the samples depend on: a resumed run must use the same, and the parts record it."""

    inputs: list[str]
    split: str
    text_field: str
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
    """Load the tokenizers in a spawned worker (a forked one inherits the parent's encoder)."""
    global _encoder
    if _encoder is None:
        _encoder = Encoder(load_tokenizer(student), load_tokenizer(teacher))


def convert_part(
    records: list[Record | bytes], part_dir: str, config: dict, tokenizers: tuple[TokenizerInfo, TokenizerInfo]
) -> dict:
    """Convert one part's records (raw JSON lines are parsed here) into an MDS folder, written beside it and renamed
    into place when complete."""
    final = Path(part_dir)
    staging = final.with_name(f".tmp-{final.name}")
    shutil.rmtree(staging, ignore_errors=True)
    stats: Counter = Counter()
    packer = Packer(config["seq_len"], *tokenizers)
    begin = time.perf_counter()
    with MDSWriter(out=str(staging), columns=COLUMNS, compression=config["compression"], size_limit=1 << 26) as out:
        for batch_begin in range(0, len(records), ENCODE_BATCH):
            batch = records[batch_begin : batch_begin + ENCODE_BATCH]
            parsed = (parse_jsonl_line(r, config["text_field"]) if isinstance(r, bytes) else r for r in batch)
            docs = [pieces for pieces in (clean(r, config["max_doc_chars"], stats) for r in parsed) if pieces]
            if not docs:
                continue
            encoded = _encoder.encode(docs)
            stats[SPECIAL_STRINGS] += _encoder.special_strings(docs)
            stats["documents converted"] += len(docs)
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
    (staging / PART_STATS).write_text(json.dumps(dict(stats), indent=1))
    if final.exists():  # a complete part from an earlier run that we were asked to redo
        shutil.rmtree(final)
    os.rename(staging, final)
    return dict(stats)


def parts_of(sources: list[tuple[int, Source]], docs_per_part: int) -> Iterator[tuple[str, list[Record | bytes]]]:
    """(part name, records) for every part of the given sources, in order."""
    for source_index, source in sources:
        block, records = 0, []
        for record in source.records():
            records.append(record)
            if len(records) == docs_per_part:
                yield f"part-{source_index:05d}-{block:06d}", records
                block, records = block + 1, []
        if records or block == 0:
            yield f"part-{source_index:05d}-{block:06d}", records


# ----------------------------------------------------------------------------------------------------------- output
class Output:
    """Where the dataset goes: a local folder, or any remote Streaming supports (s3://, gs://, ...) through a local
    working folder. A part is complete when its ``part.json`` is there; for a remote it is uploaded after the part's
    shards, so a run on another machine sees exactly the parts that are done."""

    def __init__(self, out_root: str, local_root: str | None):
        remote = "://" in out_root or local_root is not None
        self.remote = out_root if remote else None
        if remote and local_root is None:
            local_root = Path(tempfile.gettempdir()) / "vocagno-convert" / re.sub(r"[^\w.-]+", "_", out_root)
        self.local = Path(local_root if remote else out_root)
        self.local.mkdir(parents=True, exist_ok=True)
        self._uploader = None
        if remote:
            from streaming.base.storage import CloudUploader

            self._uploader = CloudUploader.get((str(self.local), self.remote), keep_local=True, exist_ok=True)

    def __str__(self) -> str:
        return self.remote or str(self.local)

    def fetch(self, relative: str) -> bool:
        """Whether ``relative`` exists, fetched into the local folder first when the output is remote."""
        path = self.local / relative
        if path.exists() or self.remote is None:
            return path.exists()
        from streaming.base.storage import CloudDownloader

        try:
            CloudDownloader.direct_download(f"{self.remote.rstrip('/')}/{relative}", str(path))
        except FileNotFoundError:
            return False
        return path.exists()

    def publish(self, *relatives: str) -> None:
        """Upload local files, in this order, when the output is remote."""
        for relative in relatives if self._uploader else ():
            if "://" not in self.remote:  # Streaming's local uploader does not make folders
                (Path(self.remote) / relative).parent.mkdir(parents=True, exist_ok=True)
            self._uploader.upload_file(relative)

    def publish_part(self, name: str) -> None:
        files = sorted(f.name for f in (self.local / name).iterdir() if f.name != PART_STATS)
        self.publish(*(f"{name}/{f}" for f in files), f"{name}/{PART_STATS}")


# ----------------------------------------------------------------------------------------------------------- driver
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    output = Output(args.out_root, args.local_root)
    if not args.merge_only:
        convert(args, output)
    if args.merge_only or all_jobs_done(output, args.num_jobs):
        merge(output, force=args.merge_only)
    else:
        print(f"job {args.job_index} of {args.num_jobs} done; the last job to finish merges the parts")
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python conversion/convert_dataset.py",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--input", nargs="+", default=[DEFAULT_INPUT],
        help="a Hugging Face dataset name (streamed), or local .jsonl/.json/.parquet/.txt files or folders of them",
    )
    parser.add_argument("--split", default="train", help="the Hugging Face dataset's split")
    parser.add_argument("--text-field", default="text", help="the field holding each document's text (.txt: the file)")
    parser.add_argument("--student-tokenizer", default="TinyLlama/TinyLlama_v1.1",
                        help="HF name, local folder or shipped name (llama2, qwen2.5, ...)")
    parser.add_argument("--teacher-tokenizer", default="Qwen/Qwen2.5-Math-7B-Instruct",
                        help="HF name, local folder or shipped name")
    parser.add_argument("--seq-len", type=int, default=2048, help="student tokens per sample")
    parser.add_argument("--out-root", required=True,
                        help="the output: a local folder or a remote Streaming supports (s3://bucket/path, gs://, ...)")
    parser.add_argument("--local-root", default=None,
                        help="with a remote --out-root: the local working folder (unset: one under the temp dir)")
    parser.add_argument("--compression", default="zstd", help="MDS shard compression ('none' for none)")
    parser.add_argument("--workers", type=int, default=1, help="processes converting parts in parallel")
    parser.add_argument("--num-jobs", type=int, default=1, help="independent jobs the source files are split among")
    parser.add_argument("--job-index", type=int, default=0, help="which of the --num-jobs jobs this is")
    parser.add_argument("--docs-per-part", type=int, default=5000,
                        help="documents per part (the unit of resumption; each part drops its last < seq-len tokens)")
    parser.add_argument("--max-doc-chars", type=int, default=1_000_000,
                        help="longer documents are tokenized in pieces of at most this many characters")
    parser.add_argument("--merge-only", action="store_true", help="only merge the finished parts' indexes")
    args = parser.parse_args(argv)
    if not 0 <= args.job_index < args.num_jobs:
        parser.error(f"--job-index must be in [0, {args.num_jobs}), got {args.job_index}")
    for flag in ("seq_len", "workers", "docs_per_part", "max_doc_chars"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be positive")
    args.compression = None if args.compression == "none" else args.compression
    return args


def convert(args: argparse.Namespace, output: Output) -> None:
    student_tok, teacher_tok = load_tokenizer(args.student_tokenizer), load_tokenizer(args.teacher_tokenizer)
    student = tokenizer_info(student_tok, args.student_tokenizer)
    teacher = tokenizer_info(teacher_tok, args.teacher_tokenizer)
    config = Config(
        inputs=args.input, split=args.split, text_field=args.text_field,
        student_tokenizer=args.student_tokenizer, teacher_tokenizer=args.teacher_tokenizer,
        student_fingerprint=student.fingerprint, teacher_fingerprint=teacher.fingerprint,
        seq_len=args.seq_len, docs_per_part=args.docs_per_part, max_doc_chars=args.max_doc_chars,
        compression=args.compression,
    )
    check_or_write_config(output, config, student, teacher)
    for stale in output.local.glob(".tmp-part-*"):  # unfinished parts of an interrupted run
        shutil.rmtree(stale)

    sources = sources_of(args.input, args.split, args.text_field)
    mine = [(i, s) for i, s in enumerate(sources) if i % args.num_jobs == args.job_index]
    print(f"{len(sources)} source file(s); this job (#{args.job_index} of {args.num_jobs}) converts {len(mine)}")
    tokenizers = (student, teacher)
    config_dict = config.__dict__
    done_parts, totals = [], Counter()
    progress = tqdm(unit="doc", desc="converting", dynamic_ncols=True, mininterval=1.0)
    begin = time.perf_counter()

    def finished(name: str, stats: dict, converted_now: bool = True) -> None:
        if converted_now:
            output.publish_part(name)
        done_parts.append(name)
        _add_part_stats(totals, stats)
        progress.update(stats["documents read"])
        elapsed = max(time.perf_counter() - begin, 1e-9)
        rate = totals["student tokens"] / elapsed
        progress.set_postfix_str(f"{rate:,.0f} student tok/s, {totals['samples']} samples")

    def todo() -> Iterator[tuple[str, list[Record | bytes]]]:
        for name, records in parts_of(mine, args.docs_per_part):
            if output.fetch(f"{name}/{PART_STATS}"):  # complete from an earlier run
                finished(name, json.loads((output.local / name / PART_STATS).read_text()), converted_now=False)
                continue
            yield name, records

    global _encoder
    _encoder = Encoder(student_tok, teacher_tok)
    if args.workers == 1:
        for name, records in todo():
            finished(name, convert_part(records, str(output.local / name), config_dict, tokenizers))
    else:
        # fork where there is one: workers start at once, with the modules already imported.
        context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
        with concurrent.futures.ProcessPoolExecutor(
            args.workers, mp_context=context, initializer=_worker_init,
            initargs=(args.student_tokenizer, args.teacher_tokenizer),
        ) as pool:
            pending: dict = {}
            for name, records in todo():
                pending[pool.submit(convert_part, records, str(output.local / name), config_dict, tokenizers)] = name
                if len(pending) >= 2 * args.workers:  # bounded read-ahead: the corpus never sits in memory
                    _collect(pending, finished, concurrent.futures.FIRST_COMPLETED)
            _collect(pending, finished, concurrent.futures.ALL_COMPLETED)
    progress.close()
    marker = f"job-{args.job_index:04d}-of-{args.num_jobs:04d}.json"
    (output.local / marker).write_text(json.dumps({"parts": sorted(done_parts)}, indent=1))
    output.publish(marker)
    if args.num_jobs > 1:
        print_summary(f"job {args.job_index} of {args.num_jobs}", totals, output, sorted(done_parts))


def _add_part_stats(totals: Counter, stats: dict) -> None:
    totals.update({k: v for k, v in stats.items() if k != "seconds"})  # counts add up; a part's seconds don't


def _collect(pending: dict, finished, return_when) -> None:
    done, _ = concurrent.futures.wait(pending, return_when=return_when)
    for future in done:
        finished(pending.pop(future), future.result())


def check_or_write_config(output: Output, config: Config, student: TokenizerInfo, teacher: TokenizerInfo) -> None:
    wanted = {**config.__dict__, "student": student.__dict__, "teacher": teacher.__dict__}
    if output.fetch(CONFIG_FILE):
        earlier = json.loads((output.local / CONFIG_FILE).read_text())
        changed = sorted(k for k in set(wanted) | set(earlier) if wanted.get(k) != earlier.get(k))
        if changed:
            raise SystemExit(
                f"error: {output} holds a conversion made with other settings ({', '.join(changed)} differ); "
                "use another --out-root, or delete it to start over"
            )
        return
    (output.local / CONFIG_FILE).write_text(json.dumps(wanted, indent=1, ensure_ascii=False))
    output.publish(CONFIG_FILE)


def all_jobs_done(output: Output, num_jobs: int) -> bool:
    return all(output.fetch(f"job-{i:04d}-of-{num_jobs:04d}.json") for i in range(num_jobs))


def merge(output: Output, force: bool = False) -> None:
    """Join the finished parts into one dataset: vocagno.json, then index.json (last, so the root reads as complete
    only now). Jobs that end together merge once: the first takes a lock, ``force`` (--merge-only) ignores it."""
    lock = output.local / MERGE_LOCK
    try:
        os.close(os.open(lock, os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        if not force:
            print(f"another job is merging {output} ({lock} exists; --merge-only merges regardless)")
            return
    try:
        _merge(output)
    finally:
        lock.unlink(missing_ok=True)


def _merge(output: Output) -> None:
    root = output.local
    if not output.fetch(CONFIG_FILE):
        raise SystemExit(f"error: cannot merge {output}: no conversion was started there")
    config = json.loads((root / CONFIG_FILE).read_text())
    job_files = sorted(root.glob("job-*-of-*.json"))
    parts = sorted({p for f in job_files for p in json.loads(f.read_text())["parts"]})
    missing = [p for p in parts if not (output.fetch(f"{p}/{PART_STATS}") and output.fetch(f"{p}/index.json"))]
    if not job_files or missing:
        raise SystemExit(f"error: cannot merge {output}: parts not finished: {missing or 'no job has finished'}")
    (root / "index.json").unlink(missing_ok=True)
    totals = Counter()
    for part in parts:
        _add_part_stats(totals, json.loads((root / part / PART_STATS).read_text()))
    metadata = ShardMetadata(
        student=TokenizerInfo(**config["student"]),
        teacher=TokenizerInfo(**config["teacher"]),
        seq_len=config["seq_len"],
        totals=dict(totals),
    )
    metadata.write(root)
    logging.getLogger().setLevel(logging.ERROR)  # merge_index warns about its temporary folder
    merge_index([str(root / p / "index.json") for p in parts], str(root), keep_local=True)
    output.publish(METADATA_FILE, "index.json")
    print_summary("dataset", totals, output, parts, merged=True)


def print_summary(title: str, totals: Counter, output: Output, parts: list[str], merged: bool = False) -> None:
    shard_bytes = 0
    for part in parts:
        for shard in json.loads((output.local / part / "index.json").read_text())["shards"]:
            shard_bytes += (shard.get("zip_data") or shard["raw_data"])["bytes"]
    tokens = totals["student tokens"]
    lines = [
        f"--- summary: {title} ({len(parts)} parts) ---",
        f"documents read:        {totals['documents read']:,}",
        f"documents converted:   {totals['documents converted']:,}",
    ]
    lines += [f"  {k}: {v:,}" for k, v in sorted(totals.items()) if k.split(":")[0] in ("skipped", "repaired", "kept")]
    lines += [
        f"samples:               {totals['samples']:,}",
        f"student tokens:        {tokens:,}",
        f"teacher tokens:        {totals['teacher tokens']:,}",
        f"{TAIL}: {totals[TAIL]:,}",
        f"{FOLDED}: {totals[FOLDED]:,}",
        f"bytes on disk (shards): {shard_bytes:,}"
        + (f" = {shard_bytes / tokens:.2f} bytes per student token" if tokens else ""),
    ]
    if merged:
        lines.append(f"complete: {output} (index.json, vocagno.json)")
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    sys.exit(main())
