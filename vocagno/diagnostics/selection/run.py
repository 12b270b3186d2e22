"""A selection run: rows drawn and mixed with canaries, scored by the teachers (as the scoring pass scores),
measured (``run``)."""

from __future__ import annotations

import os
import random
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from vocagno.errors import Refused
from vocagno.diagnostics.canaries import CLEAN, NOISE, Canaries, clean_documents, mix, pack
from vocagno.core.loss import COMBINE
from vocagno.data.shards import COLUMNS, SHARD_HASH, ShardMetadata, align_column, describe_tokenizer, loss_column
from vocagno.doors.writing import make_readable, publish, remove, staging
from vocagno.data.batch import TEACHER_LOSS
from vocagno.teacher.scoring import BATCH_TOKENS
from vocagno.teacher.several import reader_first
from vocagno.diagnostics.selection.settings import Settings
from vocagno.diagnostics.selection.report import FLAT_STUDENT, Report
from vocagno.diagnostics.selection.measure import measure, student_losses

__all__ = ["read_scored", "run", "same_sources", "sample_rows", "write_rows"]


# --------------------------------------------------------------------------------------------------- the command
def sample_rows(shards: Path, count: int, seed: int) -> list[dict]:
    """``count`` rows drawn at random (without replacement, all when there are fewer) from a vocagno shard folder."""
    from vocagno.data.shard_index import read_index
    from vocagno.teacher.scoring import read_shard

    index = read_index(shards)
    sizes = [info["samples"] for info in index["shards"]]
    chosen = sorted(random.Random(seed).sample(range(sum(sizes)), min(count, sum(sizes))))
    rows, first = [], 0
    for i, info in enumerate(index["shards"]):
        wanted = [k - first for k in chosen if first <= k < first + sizes[i]]
        if wanted:
            samples = read_shard(shards, info)
            rows += [samples[k] for k in wanted]
        first += sizes[i]
    return rows


def write_rows(canaries: Canaries, metadata: ShardMetadata, folder: Path) -> None:
    """The canary rows as vocagno shards (for the scoring pass), written beside ``folder`` and renamed into it."""
    from dataclasses import replace

    from streaming import MDSWriter

    if os.path.lexists(folder):  # rows are written once, by a run that then finds their index.json
        raise Refused(f"{folder}: something stands there that no selection finished (no index.json): remove it, "
                      "or give another --work")
    built = staging(folder)  # a fresh private folder: nothing planted at a known name is written through
    try:
        # Small shards: the scoring pass gives each rank whole shards.
        with MDSWriter(out=str(built), columns=COLUMNS, hashes=[SHARD_HASH], size_limit=1 << 17) as writer:
            for sample in canaries.samples:
                writer.write(sample)
        # Rows made anew: none of the source's losses, of its reading teacher or of any other.
        replace(metadata, totals={"samples": len(canaries.samples)}, partial=None, scored_by=None,
                also_scored_by=None).write(built)
        make_readable(built)
        publish(built, folder)
    finally:
        remove(built)  # gone once published; its private outer folder goes either way


def read_scored(folder: Path) -> list[dict]:
    """The scored rows of ``folder``, in order, as ``TeacherGuidedDataset`` hands samples to the collator."""
    from vocagno.data.shard_index import read_index
    from vocagno.teacher.scoring import read_shard

    rows = []
    for info in read_index(folder)["shards"]:
        for sample in read_shard(folder, info):
            row = {name: torch.from_numpy(np.array(sample[name], dtype=np.int64))
                   for name in ("student_ids", "student_offsets", "teacher_ids", "teacher_offsets")}
            others = {name: np.array(value) for name, value in sample.items()  # other teachers of a set
                      if name.startswith((loss_column(""), align_column("")))}
            rows.append({**row, **others, "text": sample["text"],
                         "teacher_loss": torch.from_numpy(np.array(sample["teacher_loss"], dtype=np.float32))})
    return rows


def run(shards: str | dict[str, str], teacher, settings: Settings, *, student: torch.nn.Module | None = None,
        student_name: str = "",
        samples: int = 64, canaries: float = 0.5, noise: tuple[str, ...] = tuple(NOISE), seed: int = 0,
        device: str = "cpu", work: str | None = None, batch_tokens: int = BATCH_TOKENS, rank: int = 0, world: int = 1,
        page_rows: int = 12, combine: str = COMBINE) -> Report | None:
    """Measure what ``teacher`` (a ``vocagno.teacher.teacher.Teacher``, or a list of several, each with its
    ``name``, selecting on their ``combine``) keeps of ``shards`` with canaries; None on ranks other than 0 (rank 0
    waits for the others' scores and reports). ``work`` holds the rows and their scores; unset, a temporary folder (one
    process only). Several teachers score as ``vocagno.score`` does: the first whose vocabulary is the shards' teacher
    vocabulary into ``teacher_loss`` (``work/teacher``), each other one the previous output under its name
    (``work/teacher+NAME``, ``work/teacher+NAME+NAME2``, ...); the control at initialization is the first's.

    ``shards``: one folder, or several sources ``{NAME: folder}`` made by the same tokenizers with the same
    ``seq_len``: ``samples`` rows are drawn from each (as a run on it alone draws them) and mixed with canaries on
    their own, their rows interleaved (one row of each source in turn) and scored together; the report gives each
    source's figures (``Report.sources``)."""
    from vocagno.data.outroots import Output, check_or_write_settings
    from vocagno.teacher.scoring import score
    from vocagno.core.tokenization import load_tokenizer

    begin = time.perf_counter()
    sources = {name: Path(folder) for name, folder in shards.items()} if isinstance(shards, dict) else {
        Path(shards).name: Path(shards)}
    metadata = same_sources({name: ShardMetadata.read(folder) for name, folder in sources.items()})
    teachers = reader_first(teacher if isinstance(teacher, (list, tuple)) else [teacher], metadata)
    try:  # the canaries are converted with the shards' own tokenizers: by the names they were made with
        student_tok, teacher_tok = load_tokenizer(metadata.student.name), load_tokenizer(metadata.teacher.name)
        metadata.check_tokenizers(describe_tokenizer(student_tok, "student"),
                                  describe_tokenizer(teacher_tok, "teacher"))
    except (ValueError, OSError) as error:
        raise Refused(f"the shards' tokenizers ({metadata.student.name}, {metadata.teacher.name}) can't be loaded "
                      f"as they were made: {str(error).splitlines()[0]}") from error
    temporary = work is None
    folder = Path(tempfile.mkdtemp(prefix="vocagno-selection-") if temporary else work)
    try:
        where = {name: str(folder.resolve()) for name, folder in sources.items()}
        wanted = {"shards": next(iter(where.values())) if len(where) == 1 else where, "samples": samples,
                  "canaries": canaries,
                  "noise": list(noise), "seed": seed, "teacher": teachers[0].scored_by()}
        if len(teachers) > 1:
            wanted["teachers"] = {t.name: t.scored_by() for t in teachers}
        check_or_write_settings(Output(str(folder), None), "selection.json", wanted, "selection run", "--work")
        parts = []
        for name, source in sources.items():  # each source as a run on it alone draws, mixes and packs it
            clean = [doc for row in sample_rows(source, samples, seed)
                     for doc in clean_documents(row, metadata.student.separator_id)]
            parts.append(pack(mix(clean, canaries, list(noise), seed), student_tok, teacher_tok, metadata))
            if not parts[-1].samples:
                of = f" of source {name!r}" if len(sources) > 1 else ""
                raise Refused(f"the {samples} sampled rows{of} and their canaries make no row of {metadata.seq_len} "
                              "tokens: raise --samples")
        made, source_of = _interleave(parts)
        if rank == 0 and not (folder / "rows" / "index.json").exists():
            write_rows(made, metadata, folder / "rows")
        _wait_for(folder / "rows" / "index.json")
        scored_into, previous = "teacher", "rows"
        for i, each in enumerate(teachers):  # each teacher of a set scores the previous one's output
            if i:
                _wait_for(folder / scored_into / "index.json")  # published by the rank that finished it last
                previous, scored_into = scored_into, f"{scored_into}+{each.name}"
            score(str(folder / previous), Output(str(folder / scored_into), None), each, device, batch_tokens,
                  rank, world)
        untrained = teachers[0].at_initialization(seed)
        score(str(folder / "rows"), Output(str(folder / "untrained"), None), untrained, device, batch_tokens, rank,
              world)
        if rank != 0:
            return None  # rank 0 reports: one report, and one writer of --json and --html
        for done in (scored_into, "untrained"):  # published by the rank that finishes scoring last
            _wait_for(folder / done / "index.json")
        scored = {"teacher": read_scored(folder / scored_into), "untrained": read_scored(folder / "untrained")}
        from vocagno.data.dataset import TeacherGuidedCollator

        collate = TeacherGuidedCollator(student_pad_id=metadata.student.separator_id,
                                        teacher_pad_id=metadata.teacher.separator_id)
        rows = collate(scored["teacher"])
        losses = {"teacher": rows[TEACHER_LOSS],
                  "untrained_teacher": collate(scored["untrained"])[TEACHER_LOSS]}
        student_loss = student_losses(rows, student, metadata.student.vocab_size, 16, device)
        several = [t.name for t in teachers] if len(teachers) > 1 else []
        names = {"teacher": " + ".join(f"{t.name} ({t.label})" for t in teachers) + f", {combine}"
                 if several else teachers[0].label,
                 "student": student_name or f"{FLAT_STUDENT} (ln {metadata.student.vocab_size:,} per token)"}
        report = measure(rows, made, losses, student_loss, settings, seed, names, page_rows,
                         student_tok.convert_ids_to_tokens, several, combine,
                         (list(sources), torch.tensor(source_of)) if len(sources) > 1 else None)
        report.seconds = round(time.perf_counter() - begin, 1)
        return report
    finally:
        if temporary:
            remove(folder)


def same_sources(metadata: dict[str, ShardMetadata]) -> ShardMetadata:
    """The first source's metadata, every other source checked against it: the same tokenizers and ``seq_len``
    (their rows are converted, scored and ranked together); refused naming the source that differs."""
    (first, one), *others = metadata.items()
    for name, other in others:
        for side in ("student", "teacher"):
            if not getattr(one, side).same_vocabulary(getattr(other, side)):
                raise Refused(f"source {name!r} was made with the {side} tokenizer {getattr(other, side).name!r}, "
                              f"source {first!r} with {getattr(one, side).name!r}: every source must share the "
                              "tokenizers")
        if other.seq_len != one.seq_len:
            raise Refused(f"source {name!r} holds samples of {other.seq_len} student tokens, source {first!r} of "
                          f"{one.seq_len}: convert every source with the same --seq-len")
    return one


def _interleave(parts: list[Canaries]) -> tuple[Canaries, list[int]]:
    """The rows of several sources' canaries as one, a row of each source in turn (as a mixture's batches mix
    them), their documents and kinds renumbered; and each row's source. One source: its canaries as they are."""
    if len(parts) == 1:
        return parts[0], [0] * len(parts[0].samples)
    kinds = [CLEAN, *(k for k in NOISE if any(k in part.kinds for part in parts))]
    first_document = np.cumsum([0] + [len(part.documents) for part in parts])
    made = Canaries([], [], [], kinds, [d for part in parts for d in part.documents],
                    sum(part.dropped_tokens for part in parts))
    source_of = []
    for r in range(max(len(part.samples) for part in parts)):
        for s, part in enumerate(parts):
            if r >= len(part.samples):
                continue
            renumber = np.array([kinds.index(k) for k in part.kinds], dtype=np.int64)
            document, kind = np.asarray(part.document[r]), np.asarray(part.kind[r])
            made.samples.append(part.samples[r])
            made.document.append(np.where(document >= 0, document + first_document[s], -1).astype(document.dtype))
            made.kind.append(np.where(kind >= 0, renumber[np.maximum(kind, 0)], -1).astype(kind.dtype))
            source_of.append(s)
    return made, source_of


def _wait_for(path: Path, timeout: float = 3600) -> None:
    deadline = time.time() + timeout
    while not path.exists():
        if time.time() > deadline:
            raise Refused(f"{path} did not appear within {timeout:.0f} s: did rank 0 fail?")
        time.sleep(1.0)
