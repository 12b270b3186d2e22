"""The scoring pass: shards written again with a teacher's loss of each of its tokens (``python -m vocagno.score``
is its command line).

How it runs, as the converter does (``vocagno/data/outroots.py``):
- Each input shard becomes one part (``part-NNNNN/``, one shard of the same samples in the same order), so the
  scored dataset has the input's shards, sample for sample: a shuffled run sees the samples in the same order.
- Rank r of W (``RANK``/``WORLD_SIZE``, as ``torchrun`` and ``composer`` set them) scores the parts i with
  i % W == r on its own GPU; no process group is needed. Within a part, samples are scored in batches of similar
  length (sorted by teacher tokens, ``--batch-tokens`` per batch) and written in their order.
- A part is written beside its place and renamed into it when complete: after a kill, the same command scores only
  what is missing. Settings that change the losses (input, teacher, chunk size) must be the same to resume.
- ``top_k`` (``--top-k K``) stores, beside the losses and from the same forward, the teacher's next-token distribution
  at each of its positions, truncated to its K most probable tokens (``vocagno.core.distill.teacher_top_k``: columns
  ``vocagno.data.shards.DISTRIBUTION_COLUMNS``, recorded as ``scored_by["distribution"]``), for ULD and KD from the
  cache (``vocagno.algorithms.baselines``). Only the teacher whose tokens the shards hold stores one.
- ``--out`` may be a remote Streaming can write (``s3://...``), through ``--local-root``. The last rank to finish
  verifies every shard there and publishes ``vocagno.json`` and ``index.json``, ``index.json`` last.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from tqdm import tqdm

from vocagno.memory import keep_freed_memory
from vocagno.errors import Refused
from vocagno.data.outroots import (
    PART_STATS, OwnedLock, Output, all_jobs_done, check_or_write_settings, job_marker, merge_once, publish_dataset,
    unfinished_parts,
)
from vocagno.teacher.model import TeacherScorer
from vocagno.teacher.teacher import Teacher
from vocagno.data.shards import (DISTRIBUTION_COLUMNS, DISTRIBUTION_DTYPES, SCORED_COLUMNS, SHARD_HASH, Distribution,
    ShardMetadata, align_column, check_columns, compact, loss_column)
from vocagno.doors.untrusted import UntrustedFile, check_mds, decompress, inside, read_bytes
from vocagno.doors.writing import make_readable, publish, remove, staging, write_atomically
from vocagno.data.batch import ALIGN_END, ALIGN_START, TOPK_IDS, TOPK_PROBS, TOPK_REST, teacher_key

__all__ = ["BATCH_TOKENS", "scoring_device", "length_batches", "rank_and_world", "read_shard", "score"]

SETTINGS_FILE = "score.json"
PAD_TO = 64  # rows padded to a multiple of 64 tokens, as the training collator pads them
BATCH_TOKENS = 16384  # padded teacher tokens per scoring batch: 8 rows of 2048


def rank_and_world() -> tuple[int, int]:
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def scoring_device(device: str | None = None) -> str:
    """Where a scoring job runs: ``device``, else this rank's GPU (``LOCAL_RANK``), else the CPU. On the CPU its
    batches' logits and log-softmax are kept when freed, not faulted in again for the next (``vocagno.memory``)."""
    chosen = device or (f"cuda:{os.environ.get('LOCAL_RANK', 0)}" if torch.cuda.is_available() else "cpu")
    if chosen == "cpu":
        keep_freed_memory()
    return chosen


def score(shards: str, output: Output, teacher: Teacher, device: str, batch_tokens: int = BATCH_TOKENS,
          rank: int = 0, world: int = 1, top_k: int | None = None, top_k_dtype: str = "float16") -> int:
    """Score this rank's parts of ``shards`` into ``output``; the last rank to finish publishes the dataset.
    Return the number of samples this rank has scored (now or in an earlier, interrupted run). ``top_k``: store the
    teacher's distributions too, truncated to its ``top_k`` most probable tokens, their probabilities and the rest
    as ``top_k_dtype`` (float16 or float32)."""
    from vocagno.data.shard_index import read_index

    shards_root = Path(shards)
    index = read_index(shards_root)  # every count and name checked before anything is allocated or read from it
    metadata = ShardMetadata.read(shards_root)
    column = teacher.column(metadata, shards)
    distribution = _distribution(teacher, top_k, top_k_dtype, column)
    # A resumed pass must score as the interrupted one did: the same input shards (by their index: names, sizes and
    # hashes, wherever the folder is now), teacher, chunk size, kernels and compiling (either changes the losses'
    # last bits); a further teacher's tokenizer too (it makes its tokens and alignment).
    settings = {"input_index": _digest(index), **teacher.scoring_settings(), "column": column}
    if column is not None:
        settings["tokenizer"] = asdict(teacher.tokenizer_info())
    if distribution is not None:  # no key without one, as before there was a choice
        settings["distribution"] = distribution.recorded()
    check_or_write_settings(output, SETTINGS_FILE, settings, "scoring pass", "--out")
    side = None if column is None else teacher.student_side(metadata)
    marker = job_marker(rank, world)
    lock = OwnedLock(output.local / f"{marker}.lock", f"rank {rank} of {world} scoring into {output}")
    if not lock.acquire():
        raise Refused(f"another scoring pass is running rank {rank} of {world} into {output}")
    try:
        mine = [i for i in range(len(index["shards"])) if i % world == rank]
        for i in mine:  # what a kill left unfinished (earlier versions' names too)
            for stale in [*output.local.glob(f".{_part(i)}.staging-*"), output.local / f".tmp-{_part(i)}",
                          output.local / f".scratch-{_part(i)}"]:
                remove(stale)
        scorer = teacher.scorer().to(device)
        progress = tqdm(total=sum(index["shards"][i]["samples"] for i in mine), unit="sample", desc="scoring",
                        dynamic_ncols=True, mininterval=1.0, disable=rank != 0)
        begin, tokens, samples = time.perf_counter(), 0, 0

        def scored(rows: int, teacher_tokens: int) -> None:  # a batch's: the bar moves within a part
            nonlocal tokens
            tokens += teacher_tokens
            progress.update(rows)
            progress.set_postfix_str(f"{tokens / (time.perf_counter() - begin):,.0f} teacher tok/s per device")

        for i in mine:
            name = _part(i)
            done_there = output.pull(f"{name}/{PART_STATS}")
            if not done_there and not (output.local / name / PART_STATS).exists():
                _score_part(shards_root, index["shards"][i], output.local / name, scorer, device, batch_tokens,
                            column, side, scored, distribution)
            else:  # scored before this run
                progress.update(index["shards"][i]["samples"])
            if not done_there:  # scored now, or scored here before an upload broke off
                output.publish_part(name)
            samples += index["shards"][i]["samples"]
        progress.close()
        write_atomically(output.local / f"{marker}.json", json.dumps({"parts": [_part(i) for i in mine]}))
        output.publish(f"{marker}.json")
    finally:
        lock.release()
    if all_jobs_done(output, world):
        parts = [_part(i) for i in range(len(index["shards"]))]
        by = teacher.scored_by() if distribution is None else {**teacher.scored_by(),
                                                                "distribution": distribution.recorded()}
        scored = replace(metadata, scored_by=by) if column is None else replace(
            metadata, also_scored_by={**(metadata.also_scored_by or {}), column: teacher.recorded()})
        merge_once(output, lambda: _merge(output, parts, scored, teacher.label))
    else:
        print(f"rank {rank} of {world} done; the last rank to finish publishes {output}")
    return samples


def _distribution(teacher: Teacher, top_k: int | None, dtype: str, column: str | None) -> Distribution | None:
    """What ``top_k`` and ``dtype`` ask the pass to store, checked against the teacher (its logits) before a part is
    scored."""
    if top_k is None:
        return None
    if column is not None:
        raise Refused(f"--top-k: distributions are stored by the pass of the teacher whose tokens the shards hold (the "
                      f"first); {teacher.called} scores its own tokens, and its pass stores its losses alone")
    if dtype not in DISTRIBUTION_DTYPES:
        raise Refused(f"--top-k-dtype must be one of {', '.join(DISTRIBUTION_DTYPES)}, got {dtype!r}")
    logits = teacher.load().get_output_embeddings().weight.shape[0]
    if not isinstance(top_k, int) or not 1 <= top_k <= logits:
        raise Refused(f"--top-k must be 1 to the teacher's {logits:,} logits, got {top_k!r}")
    return Distribution(top_k, logits, dtype)


def _part(i: int) -> str:
    return f"part-{i:05d}"


def _digest(value: dict) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def read_shard(shards_root: Path, info: dict) -> list[dict]:
    """The samples of one input shard of ``shards_root``, in order; ``info`` is its entry of the index as
    ``vocagno.data.shard_index.read_index`` checked it. The shard is read through the one way in (a regular file,
    reached through no link, of the size the index says), checked against its hash, decompressed into exactly the raw
    size the index says (``untrusted.decompress``), and decoded in memory: the input folder is only read, and nothing
    is written. A shard that is not what its index says is refused (``UntrustedFile``)."""
    from streaming.base.format import reader_from_json
    from streaming.base.hashing import get_hash

    index = str(shards_root / "index.json")
    try:
        check_columns(dict(zip(info["column_names"], info["column_encodings"])), index)
    except ValueError as error:
        raise Refused(str(error)) from None
    stored = info.get("zip_data") or info["raw_data"]
    path = inside(shards_root, stored["basename"], index, "shard name")
    data = read_bytes(stored["basename"], stored["bytes"], shards_root, "shard_bytes")
    if len(data) != stored["bytes"]:
        raise UntrustedFile(f"{path}: refused: {len(data):,} bytes, its index says {stored['bytes']:,}")
    if get_hash(SHARD_HASH, data) != stored["hashes"][SHARD_HASH]:
        raise Refused(f"{path} does not match its {SHARD_HASH} hash")
    if info.get("zip_data"):
        data = decompress(info["compression"], data, info["raw_data"]["bytes"], str(path))
    samples = info["samples"]
    offsets = check_mds(data, samples, len(data), str(path))
    reader = reader_from_json(str(shards_root), None, info)
    return [reader.decode_sample(data[offsets[i]:offsets[i + 1]]) for i in range(samples)]


def _padded(length: int) -> int:
    return -(-length // PAD_TO) * PAD_TO


def length_batches(lengths: list[int], batch_tokens: int) -> list[list[int]]:
    """Sample indices in batches of similar length: sorted by length, each batch as many as fit ``batch_tokens``
    padded tokens (at least one)."""
    batches: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        padded = _padded(lengths[i])  # the longest so far: sorted
        if batches and (len(batches[-1]) + 1) * padded <= batch_tokens:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def _other_teacher_rows(samples: list[dict], side) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """A further teacher's tokens of each sample, and its alignment ``[N, 2]``, made by ``side`` from the student's
    tokens exactly as training makes them (``vocagno.teacher.several.made_side``)."""
    from vocagno.teacher.several import made_side

    rows, aligns = [], []
    for sample in samples:
        ids = torch.from_numpy(np.asarray(sample["student_ids"], dtype=np.int64))[None]
        made = made_side(side, "scored", {"input_ids": ids})
        row, start, end = (made[teacher_key("scored", what)][0] for what in ("input_ids", ALIGN_START, ALIGN_END))
        rows.append(row[: int(made[teacher_key("scored", "attention_mask")].sum())].numpy())
        aligns.append(torch.stack([start, end], 1).numpy())
    return rows, aligns


@torch.no_grad()
def _score_part(shards_root: Path, info: dict, final: Path, scorer: TeacherScorer, device: str,
                batch_tokens: int, column: str | None = None, side=None,
                scored_batch: Callable[[int, int], None] = lambda rows, tokens: None,
                distribution: Distribution | None = None) -> int:
    """Score one input shard into the part ``final``; return its teacher tokens. ``column``: a further teacher of a
    set, whose tokens ``side`` makes (``vocagno.teacher.teacher.Teacher.column``). ``scored_batch(rows, teacher
    tokens)`` after each batch (the progress bar). ``distribution``: the truncated distributions to store too."""
    from streaming import MDSWriter

    begin = time.perf_counter()
    samples = read_shard(shards_root, info)
    if column is None:
        rows = [np.asarray(sample["teacher_ids"], dtype=np.int64) for sample in samples]
    else:
        rows, aligns = _other_teacher_rows(samples, side)
    losses: list[np.ndarray] = [np.empty(0)] * len(rows)
    stored: list[dict[str, np.ndarray]] = [{} for _ in rows]
    for batch in length_batches([len(row) for row in rows], batch_tokens):
        width = _padded(max(len(rows[i]) for i in batch))
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for b, i in enumerate(batch):
            ids[b, : len(rows[i])] = torch.from_numpy(rows[i])
            mask[b, : len(rows[i])] = 1
        if distribution is None:
            scored = scorer(ids.to(device), mask.to(device)).float().cpu().numpy()
        else:
            scored, *top = scorer(ids.to(device), mask.to(device), distribution.top_k)
            scored = scored.float().cpu().numpy()
            top_ids, top_probs, rest = (each.cpu().numpy() for each in top)
            ids_dtype = np.uint16 if distribution.logits <= 2**16 else np.uint32
        for b, i in enumerate(batch):
            losses[i] = scored[b, : len(rows[i])].astype(np.float16)
            if distribution is not None:
                length = len(rows[i])
                stored[i] = {TOPK_IDS: top_ids[b, :length].astype(ids_dtype),
                             TOPK_PROBS: top_probs[b, :length].astype(distribution.dtype),
                             TOPK_REST: rest[b, :length].astype(distribution.dtype)}
        scored_batch(len(batch), sum(len(rows[i]) for i in batch))
    # One shard per part (no size limit): the scored dataset's shards hold the input's samples, shard for shard.
    kept = dict(zip(info["column_names"], info["column_encodings"]))  # earlier passes' columns too (checked)
    columns = {**kept, **(SCORED_COLUMNS if column is None else {loss_column(column): "ndarray",
                                                                 align_column(column): "ndarray"})}
    if distribution is not None:
        columns.update(DISTRIBUTION_COLUMNS)
    built = staging(final)  # a fresh private folder: nothing planted at a known name is written through
    try:
        with MDSWriter(out=str(built), columns=columns, compression=info.get("compression"), hashes=[SHARD_HASH],
                       size_limit=None) as writer:
            for i, (sample, loss) in enumerate(zip(samples, losses)):
                scored = {"teacher_loss": loss} if column is None else {loss_column(column): loss,
                                                                        align_column(column): compact(aligns[i])}
                writer.write({**{name: sample[name] for name in kept}, **scored, **stored[i]})
        stats = {"samples": len(samples), "teacher tokens": int(sum(map(len, rows))),
                 "seconds": round(time.perf_counter() - begin, 3)}
        write_atomically(built / PART_STATS, json.dumps(stats))
        make_readable(built)
        publish(built, final, replace=True)  # a part no run finished (its part.json) is scored again
    finally:
        remove(built)  # gone once published; its private outer folder goes either way
    return stats["teacher tokens"]


def _merge(output: Output, parts: list[str], metadata: ShardMetadata, scorer: str) -> None:
    missing = unfinished_parts(output, parts)
    if missing:
        raise Refused(f"cannot merge {output}: parts not scored there: {missing}")
    publish_dataset(output, parts, metadata)
    print(f"complete: {output} ({len(parts)} parts, scored by {scorer})", flush=True)
