"""What a teacher keeps, on your own data: does it pick the useful tokens before you pay for a run?

    python -m vocagno.selection --shards shards/gsm8k_heldout_mistral_128 --teacher tiny-math-teacher --canaries 0.5
    python -m vocagno.selection --shards DIR --config yamls/tiny.yaml --student runs/tiny/ep0-ba80-rank0.pt \\
        --canaries 0.5 --json selection.json --html selection.html
    torchrun --nproc-per-node 8 -m vocagno.selection ... --work /scratch/selection   # a big teacher: ranks score

``--samples`` rows are drawn from the shards; their text, cut at document ends, is the clean text. ``--canaries F``
adds noise made from it (``vocagno.diagnostics.canaries``: words shuffled, characters scrambled), F of all documents, and the
mixture is converted as the converter converts it (the shards' tokenizers and ``seq_len``), each student token
labelled by the document it comes from. The teacher scores every row (``vocagno.score``: on each rank's GPU, as the
scoring pass does), and so does the same teacher at initialization (the control that knows nothing). The student's
loss of each token is a trained student's (``--student``: a Hugging Face name or folder, or a ``train.py``
checkpoint), or by default that of a student at initialization, ln V for every token, so that the ranking is the
teacher's alone. Each selection variant then keeps its tokens as training would (``vocagno.core.loss``: score = student
loss - aggregated teacher loss, top-k over each global batch of rows, plus the unmapped tokens when included):

    topk               the selection training makes: the yaml's (--config: its top-k ratio, aggregation, unmapped,
                       scope, selection and alignment; else top 40%, max, unmapped included, the batch scope)
    chunk_1/4/16       the paper's chunk-level alignment (Table 2's baseline as reconstructed: the chunk's mean loss)
    random             as many mapped tokens drawn at random
    untrained_teacher  topk's selection with the teacher at initialization

and is measured by its precision (the share of the mapped tokens it keeps that are clean) and recall (the share of
the clean mapped tokens it keeps), against the clean share (what a random selection gets). The report (terminal,
``--json``, ``--html``) gives also the teacher's and the student's mean loss per kind of text and, per document, the
fraction of its tokens the top-k keeps; a mean over no tokens is NaN in the terminal, null in ``--json``. With several
ranks, rank 0 alone reports and writes ``--json`` and ``--html``.

Several teachers (``vocagno.teacher.several``): ``--teacher NAME=MODEL`` (or ``MODEL``, named by its folder's name) given
several times, each folder holding its tokenizer, or ``--config`` with a ``teachers:`` section; ``--combine min|mean``
(default: the yaml's ``algorithms.vocagno.combine``, else min). They score as ``vocagno.score`` does: the first whose
vocabulary is the shards' teacher vocabulary scores the rows' teacher tokens, each other one tokens made from the
text, under its name. Every variant above selects on their combination, but ``untrained_teacher``, which is the first
teacher's control alone. The report adds each teacher's top-k alone (its own losses, the same selection) and its
share of the combination's kept mapped tokens whose reference it gave (``--json``: ``"teachers": {NAME: {"topk":
{"precision", "recall", "kept_share"}, "share"}}``, absent with one teacher), and the page can colour each token by
the teacher that gave its reference:

    python -m vocagno.selection --shards DIR --teacher math=MATH_FOLDER --teacher latex=LATEX_FOLDER --canaries 0.5
    python -m vocagno.selection --shards DIR --config yamls/tiny_two_teachers.yaml --combine mean --canaries 0.5

Several sources: ``--shards`` given several times (each source named by its folder's last part), or ``--config`` and
no ``--shards``: the streams of the yaml's ``train_loader.dataset.streams`` (their ``local`` folders, named by their
names). Every source must be made by the same tokenizers with the same ``seq_len`` (refused naming the one that
differs), and two of one name are refused. ``--samples`` rows are drawn from each source and mixed with canaries as a
run on it alone makes them; the sources' rows, one of each in turn, are scored and ranked together (every top-k over
rows of all sources, as a mixture's batch). The report adds, per source, its rows, mapped tokens, clean share and the
teacher's loss per kind, the combination's top-k over its tokens and, with several teachers, each one's alone and
share (``--json``: ``"sources": {SOURCE: {"rows", "mapped", "clean_share", "teacher_loss", "topk", "teachers": {NAME:
{"topk", "share"}}}}``, absent with one source):

    python -m vocagno.selection --shards heldout/gsm8k --shards heldout/arxiv --teacher math=M1 --teacher latex=M2
"""

from __future__ import annotations

import argparse
import html
import json
import math
import os
import pickle
import random
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from vocagno.errors import Refused
from vocagno.core.alignment import ALIGNMENT, NUM_CHUNKS, check_alignment, chunk_align
from vocagno.memory import keep_freed_memory
from vocagno.diagnostics.canaries import CLEAN, NOISE, Canaries, clean_documents, mix, pack
from vocagno.core.loss import (AGGREGATION, COMBINE, SELECTION, SELECTION_SCOPE, TOPK_RATIO, UNMAPPED, check_options,
    excess_loss, next_token_cross_entropy, reference_loss, select_random, select_top)
from vocagno.data.shards import (COLUMNS, METADATA_FILE, SHARD_HASH, TEACHER_NAME, ShardMetadata, align_column,
                            check_teacher_name, describe_tokenizer, loss_column)
from vocagno.doors.writing import make_readable, publish, remove, staging, write_atomically
from vocagno.data.batch import ALIGN_END, ALIGN_START, TEACHER_ATTENTION_MASK, TEACHER_LOSS, teacher_key

__all__ = ["Settings", "Report", "measure", "main"]

CHUNKS = (1, 4, 16)
BINS = 10  # of the per-document kept fraction's histogram



@dataclass(frozen=True)
class Settings:
    """The selection that training would make: ``VocAgnoLM``'s options, and how many rows one top-k ranks together
    (a global batch for the ``batch`` scope, a microbatch for ``microbatch``)."""

    topk_ratio: float = TOPK_RATIO
    aggregation: str = AGGREGATION
    unmapped: str = UNMAPPED
    selection_scope: str = SELECTION_SCOPE
    rows_per_selection: int = 8
    selection: str = SELECTION
    alignment: str = ALIGNMENT
    num_chunks: int = NUM_CHUNKS

    def __post_init__(self):
        check_options(self.topk_ratio, self.aggregation, self.unmapped, self.selection_scope, self.selection)
        check_alignment(self.alignment, self.num_chunks)

    @classmethod
    def from_config(cls, cfg) -> "Settings":
        """A training yaml's ``algorithms.vocagno`` settings (``VocAgnoLM``'s defaults where it says nothing)."""
        options = dict((cfg.get("algorithms") or {}).get("vocagno") or {})
        scope = options.get("selection_scope", cls.selection_scope)
        rows = cfg.global_train_batch_size if scope == "batch" else cfg.device_train_microbatch_size
        return cls(options.get("topk_ratio", cls.topk_ratio), options.get("aggregation", cls.aggregation),
                   options.get("unmapped", cls.unmapped), scope,
                   rows if isinstance(rows, int) else cls.rows_per_selection,  # "auto" microbatches: the default
                   options.get("selection", cls.selection), options.get("alignment", cls.alignment),
                   options.get("num_chunks", cls.num_chunks))

    def describe(self) -> str:
        chunks = f", chunk alignment ({self.num_chunks} chunks)" if self.alignment == "chunk" else ""
        return (f"{'top' if self.selection == 'topk' else 'random'} {self.topk_ratio:.0%}, {self.aggregation}, "
                f"unmapped {self.unmapped}d, {self.selection_scope} scope ({self.rows_per_selection} rows){chunks}")


# ------------------------------------------------------------------------------------------------- the measurement
def choose(student_loss: torch.Tensor, labels: torch.Tensor, teacher_loss, start, end, settings: Settings,
           aggregation: str, random_draw: torch.Generator | None = None, combine: str = COMBINE):
    """Which predicted tokens a selection keeps, as ``VocAgnoLM`` keeps them: ``(selected, mapped, teacher)``, each
    ``[R, N - 1]``: the top-k (or a random draw, given ``random_draw``) of the mapped tokens, over each group of
    ``rows_per_selection`` rows or per row (``sequence``); the mapped tokens; the aggregated teacher loss (with
    several teachers, ``teacher_loss``, ``start`` and ``end`` sequences, their ``combine``)."""
    score, teacher = excess_loss(student_loss, labels, teacher_loss, start, end, aggregation, combine=combine)
    selected = torch.zeros_like(score, dtype=torch.bool)
    per_sequence = settings.selection_scope == "sequence"
    for begin in range(0, score.shape[0], settings.rows_per_selection):
        group = score[begin : begin + settings.rows_per_selection]
        selected[begin : begin + len(group)] = (
            select_top(group, settings.topk_ratio, per_sequence) if random_draw is None
            else select_random(group, settings.topk_ratio, per_sequence, random_draw))
    return selected, torch.isfinite(score), teacher


@dataclass
class Report:
    """What ``measure`` found; ``table()`` for the terminal, ``as_json()``, ``page()`` for ``--html``."""

    kinds: list[str]
    settings: Settings
    teacher: str
    student: str
    rows: int
    tokens: int
    mapped: int
    clean_share: float
    canaries: float
    variants: dict[str, dict[str, Any]]
    losses: dict[str, dict[str, float]]  # who -> kind -> mean loss per token (nats)
    kept_histogram: dict[str, list[int]]  # kind -> documents per bin of the top-k's kept fraction
    unmapped_kept: int
    dropped_tokens: int
    seconds: float = 0.0
    # several teachers: each one's top-k alone and its share of the combination's kept tokens, by name
    teachers: dict[str, dict[str, Any]] = field(default_factory=dict)
    # several sources: per source, its rows, the combination's top-k and each teacher's alone, by source name
    sources: dict[str, dict[str, Any]] = field(default_factory=dict)
    page_rows: list[dict] = field(default_factory=list, repr=False)

    def as_json(self) -> dict[str, Any]:
        """The report as JSON values: a mean over no tokens (NaN) is None, as strict JSON has no NaN."""
        value = asdict(self)
        value.pop("page_rows")
        if not self.teachers:  # one teacher: the report as it has always been
            value.pop("teachers")
        if not self.sources:  # one source: the report as it has always been
            value.pop("sources")
        value["settings"] = asdict(self.settings)
        value["bins"] = [round(k / BINS, 2) for k in range(BINS + 1)]
        return _finite(value)

    def table(self) -> str:
        noise = [k for k in self.kinds if k != CLEAN]
        lines = [
            f"what the teacher keeps: {self.rows} rows, {self.tokens:,} predicted student tokens ({self.mapped:,} "
            f"mapped), {self.canaries:.0%} canary documents ({', '.join(noise) or 'none'})",
            f"teacher: {self.teacher}; student: {self.student}",
            f"clean share of the mapped tokens: {self.clean_share:.3f} (what a random selection keeps)",
            "",
            f"{'variant':<20}{'precision':>10}{'recall':>8}   kept share of each kind's mapped tokens",
            f"{'':<20}{'':>10}{'':>8}   " + "  ".join(f"{k:>20}" for k in self.kinds),
        ]
        for name, row in self.variants.items():
            shares = "  ".join(f"{row['kept_share'][k]:>20.3f}" for k in self.kinds)
            lines.append(f"{name:<20}{row['precision']:>10.3f}{row['recall']:>8.3f}   {shares}")
        if self.teachers:
            lines += ["", f"{'each teacher alone':<20}{'precision':>10}{'recall':>8}   kept share of each kind's "
                      "mapped tokens; share of the topk's kept mapped tokens whose reference it gave"]
            for name, row in self.teachers.items():
                shares = "  ".join(f"{row['topk']['kept_share'][k]:>20.3f}" for k in self.kinds)
                lines.append(f"{name:<20}{row['topk']['precision']:>10.3f}{row['topk']['recall']:>8.3f}   {shares}"
                             f"   gave {row['share']:.3f}")
        if self.sources:
            lines += ["", f"{'per source':<20}{'precision':>10}{'recall':>8}   kept share of each kind's mapped "
                      "tokens; its rows, mapped tokens and clean share" + ("; each teacher's share of the topk's kept "
                                                                           "mapped tokens" if self.teachers else "")]
            for source, row in self.sources.items():
                shares = "  ".join(f"{row['topk']['kept_share'][k]:>20.3f}" for k in self.kinds)
                lines.append(f"{source:<20}{row['topk']['precision']:>10.3f}{row['topk']['recall']:>8.3f}   {shares}"
                             f"   {row['rows']} rows, {row['mapped']:,} mapped, clean {row['clean_share']:.3f}")
                for name, alone in row.get("teachers", {}).items():
                    shares = "  ".join(f"{alone['topk']['kept_share'][k]:>20.3f}" for k in self.kinds)
                    lines.append(f"  {name + ' alone':<18}{alone['topk']['precision']:>10.3f}"
                                 f"{alone['topk']['recall']:>8.3f}   {shares}   gave {alone['share']:.3f}")
        lines += ["", f"topk: {self.settings.describe()}; it keeps {self.unmapped_kept:,} unmapped tokens besides"
                  if self.settings.unmapped == "include" else f"topk: {self.settings.describe()}", "",
                  f"{'mean loss per token (nats)':<28}" + "".join(f"{k:>22}" for k in self.kinds)]
        for who, by_kind in self.losses.items():
            lines.append(f"{who:<28}" + "".join(f"{by_kind.get(k, float('nan')):>22.3f}" for k in self.kinds))
        lines += ["", "documents by the fraction of their mapped tokens the topk keeps:"]
        edges = [f"{k / BINS:.1f}" for k in range(BINS)]
        lines.append(f"{'':<22}" + "".join(f"{e:>6}" for e in edges) + "   (bins from)")
        for kind, counts in self.kept_histogram.items():
            lines.append(f"{kind:<22}" + "".join(f"{c:>6}" for c in counts))
        if self.dropped_tokens:
            lines.append(f"({self.dropped_tokens} student tokens after the last whole row were dropped, as the "
                         "converter drops them)")
        return "\n".join(lines)

    def page(self, title: str) -> str:
        from vocagno.inspect import script_json

        data = {"kinds": self.kinds, "rows": self.page_rows,
                "variants": {k: {"precision": v["precision"], "recall": v["recall"], "kept_share": v["kept_share"]}
                             for k, v in self.variants.items()},
                "clean_share": self.clean_share, "settings": self.settings.describe(), "teachers": list(self.teachers)}
        return _PAGE.replace("__TITLE__", html.escape(title)).replace("__DATA__", script_json(data))


def _finite(value):
    """``value`` with every non-finite float in it None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _mean(values: torch.Tensor, where: torch.Tensor) -> float:
    return float(values[where].double().mean()) if bool(where.any()) else float("nan")


def measure(rows: dict[str, torch.Tensor], canaries: Canaries, teacher_losses: dict[str, torch.Tensor],
            student_loss: torch.Tensor, settings: Settings, seed: int, names: dict[str, str],
            page_rows: int = 12, pieces=None, teacher_names: list[str] | tuple = (), combine: str = COMBINE,
            sources: tuple[list[str], torch.Tensor] | None = None) -> Report:
    """The report for collated ``rows`` (``TeacherGuidedCollator``'s keys) labelled by ``canaries``, with the teacher
    losses ``{"teacher": [R, M], "untrained_teacher": [R, M]}`` and the student's ``[R, N - 1]``.

    Several teachers (``teacher_names``, the first the one whose losses are ``teacher_losses["teacher"]``; the
    others' losses and alignment in ``rows`` under ``teacher_key(NAME, ...)``): every variant but ``untrained_teacher``
    (the first teacher's) selects on their ``combine``, and ``Report.teachers`` gives each teacher's top-k alone and
    its share of the combination's kept tokens.

    Several sources (``sources``: their names and each row's source index ``[R]``): ``Report.sources`` gives, per
    source, its rows, mapped tokens and clean share, the teacher's mean loss per kind, and the figures above (the
    combination's top-k, each teacher's alone and share) over its tokens; every top-k still ranks the rows of all
    sources together, as a mixture's batch does."""

    labels = rows["labels"][:, 1:]
    kind = torch.from_numpy(np.stack(canaries.kind))[:, 1:]
    document = torch.from_numpy(np.stack(canaries.document))[:, 1:]
    lengths = rows["attention_mask"].sum(1)
    width = rows["input_ids"].shape[1]
    several = len(teacher_names) > 1
    # each teacher's losses [R, M_t], its alignment over the predicted tokens, and its tokens per row
    own = {teacher_names[0] if several else "teacher": (
        teacher_losses["teacher"], rows[ALIGN_START][:, 1:], rows[ALIGN_END][:, 1:],
        rows[TEACHER_ATTENTION_MASK].sum(1))}
    for name in teacher_names[1:]:
        loss = rows[teacher_key(name, TEACHER_LOSS)]
        own[name] = (loss, rows[teacher_key(name, ALIGN_START)][:, 1:], rows[teacher_key(name, ALIGN_END)][:, 1:],
                     _token_counts(loss))

    def aligned(chunks: int | None, who: list[str]) -> tuple[list, list, list]:
        """The losses, starts and ends of the teachers ``who``, token-aligned or in ``chunks`` chunks."""
        if chunks is None:
            return [own[w][0] for w in who], [own[w][1] for w in who], [own[w][2] for w in who]
        spans = [[x[:, 1:] for x in chunk_align(lengths, own[w][3], chunks, width)] for w in who]
        return [own[w][0] for w in who], [s for s, _ in spans], [e for _, e in spans]

    trained_as = (settings.num_chunks if settings.alignment == "chunk" else None, settings.aggregation,
                  settings.selection == "random")  # the selection training makes
    everyone = list(own)
    variants = {"topk": (everyone, *trained_as)}
    for n in CHUNKS:
        variants[f"chunk_{n}"] = (everyone, n, "mean", False)  # the reconstruction takes the chunk's mean loss
    variants["random"] = (everyone, None, settings.aggregation, True)
    variants["untrained_teacher"] = (None, *trained_as)  # the first teacher at initialization

    def selection_of(who: list[str] | None, chunks, aggregation, at_random):
        losses, starts, ends = aligned(chunks, who or everyone[:1])
        if who is None:
            losses = [teacher_losses["untrained_teacher"]]
        draw = torch.Generator().manual_seed(seed) if at_random else None
        return choose(student_loss, labels, losses, starts, ends, settings, aggregation, draw, combine)

    chosen = {name: selection_of(*variant) for name, variant in variants.items()}
    results = {name: _precision(selected, mapped, kind, canaries.kinds)
               for name, (selected, mapped, _) in chosen.items()}

    selected, mapped, teacher = chosen["topk"]
    has_label = labels != -100
    losses = {"teacher": {}, "teacher at initialization": {}, "student": {}}
    untrained = chosen["untrained_teacher"][2]
    for i, k in enumerate(canaries.kinds):
        where = (kind == i) & mapped
        losses["teacher"][k] = _mean(teacher, where)
        losses["teacher at initialization"][k] = _mean(untrained, where & torch.isfinite(untrained))
        losses["student"][k] = _mean(student_loss, (kind == i) & has_label)
    alone, gave, each_alone = {}, None, {}
    kept_mapped = selected & mapped
    if several:
        _, gave = reference_loss(*aligned(trained_as[0], everyone), settings.aggregation, combine)
        for t, name in enumerate(everyone):
            its_selected, its_mapped, its_loss = selection_of([name], *trained_as)
            each_alone[name] = (its_selected, its_mapped)
            alone[name] = {"topk": _precision(its_selected, its_mapped, kind, canaries.kinds),
                           "share": float((gave[t] & kept_mapped).sum() / kept_mapped.sum().clamp(min=1))}
            losses[f"{name} alone"] = {k: _mean(its_loss, (kind == i) & its_mapped)
                                       for i, k in enumerate(canaries.kinds)}
    per_source = {}
    for s, source in enumerate(sources[0] if sources is not None and len(sources[0]) > 1 else ()):
        ours = (sources[1] == s)[:, None].expand_as(mapped)  # this source's rows' predicted tokens
        ours_mapped = mapped & ours
        per_source[source] = {
            "rows": int((sources[1] == s).sum()), "mapped": int(ours_mapped.sum()),
            "clean_share": float(((kind == 0) & ours_mapped).sum()) / max(int(ours_mapped.sum()), 1),
            "teacher_loss": {k: _mean(teacher, (kind == i) & ours_mapped) for i, k in enumerate(canaries.kinds)},
            "topk": _precision(selected, ours_mapped, kind, canaries.kinds)}
        if several:
            ours_kept = kept_mapped & ours
            per_source[source]["teachers"] = {
                name: {"topk": _precision(its_selected, its_mapped & ours, kind, canaries.kinds),
                       "share": float((gave[t] & ours_kept).sum() / ours_kept.sum().clamp(min=1))}
                for t, (name, (its_selected, its_mapped)) in enumerate(each_alone.items())}
    histogram = {}
    kept_per_document = np.bincount(document[selected & mapped & (document >= 0)].numpy(),
                                    minlength=len(canaries.documents))
    mapped_per_document = np.bincount(document[mapped & (document >= 0)].numpy(), minlength=len(canaries.documents))
    document_kind = np.array([canaries.kinds.index(k) for k, _ in canaries.documents])
    for i, k in enumerate(canaries.kinds):
        present = (document_kind == i) & (mapped_per_document > 0)
        fraction = kept_per_document[present] / mapped_per_document[present]
        histogram[k] = np.histogram(fraction, bins=BINS, range=(0, 1))[0].tolist()
    unmapped_kept = int((has_label & ~mapped).sum()) if settings.unmapped == "include" else 0
    mapped_count = int(mapped.sum())
    report = Report(
        kinds=canaries.kinds, settings=settings, teacher=names["teacher"], student=names["student"],
        rows=len(canaries.samples), tokens=int(has_label.sum()), mapped=mapped_count,
        clean_share=float(((kind == 0) & mapped).sum()) / max(mapped_count, 1),
        canaries=sum(k != CLEAN for k, _ in canaries.documents) / max(len(canaries.documents), 1),
        variants=results, losses=losses, kept_histogram=histogram, unmapped_kept=unmapped_kept,
        dropped_tokens=canaries.dropped_tokens, teachers=alone, sources=per_source)
    givers = None if gave is None else (everyone, gave)
    report.page_rows = _page_rows(canaries, kind, teacher, student_loss, selected, mapped, has_label, settings,
                                  page_rows, pieces, givers)
    return report


def _precision(selected: torch.Tensor, mapped: torch.Tensor, kind: torch.Tensor, kinds: list[str]) -> dict[str, Any]:
    """A selection's precision and recall of the clean mapped tokens, and the share of each kind's it keeps."""
    kept = selected & mapped & (kind >= 0)
    clean = (kind == 0) & mapped
    return {
        "precision": float((kept & clean).sum() / kept.sum().clamp(min=1)),
        "recall": float((kept & clean).sum() / clean.sum().clamp(min=1)),
        "kept_share": {k: float((kept & (kind == i)).sum() / ((kind == i) & mapped).sum().clamp(min=1))
                       for i, k in enumerate(kinds)},
    }


def _token_counts(loss: torch.Tensor) -> torch.Tensor:
    """Each row's teacher tokens, of losses ``[R, M]`` padded with NaN (the first token's loss is NaN too: a row
    counts up to its last defined loss)."""
    positions = torch.arange(1, loss.shape[1] + 1)
    return (positions * ~torch.isnan(loss)).amax(1)


def _page_rows(canaries: Canaries, kind, teacher, student_loss, selected, mapped, has_label, settings, count,
               pieces, givers=None) -> list[dict]:
    """The first ``count`` rows for the page: each student token's text (or piece, for specials), kind, teacher and
    student loss, and whether the top-k keeps it (the row's first token predicts nothing: it is never kept); with
    several teachers (``givers``: their names and ``reference_loss``'s ``gave``), the teacher(s) that gave its
    reference (``by``: a name, names joined by '+' for ``mean``, or None)."""
    rows = []
    for r in range(min(count, len(canaries.samples))):
        sample = canaries.samples[r]
        offsets, text = np.asarray(sample["student_offsets"], dtype=np.int64), sample["text"]
        ids = np.asarray(sample["student_ids"], dtype=np.int64)
        names = pieces(ids.tolist()) if pieces is not None else [""] * len(ids)
        tokens = []
        for i, (s, e) in enumerate(offsets.tolist()):
            if i == 0:
                tokens.append({"t": text[s:e], "piece": names[i], "k": int(canaries.kind[r][i]), "kept": None})
                continue
            j = i - 1  # the predicted token's column
            is_mapped = bool(mapped[r, j])
            kept = bool(selected[r, j] & mapped[r, j]) or (
                settings.unmapped == "include" and bool(has_label[r, j]) and not is_mapped)
            tokens.append({
                "t": text[s:e], "piece": names[i], "k": int(kind[r, j]), "kept": kept, "mapped": is_mapped,
                "teacher": round(float(teacher[r, j]), 3) if is_mapped else None,
                "student": round(float(student_loss[r, j]), 3),
            })
            if givers is not None:
                who = [name for name, gave in zip(givers[0], givers[1][:, r, j].tolist()) if gave and is_mapped]
                tokens[-1]["by"] = "+".join(who) or None
        rows.append({"tokens": tokens})
    return rows


# --------------------------------------------------------------------------------------------------- the command
def sample_rows(shards: Path, count: int, seed: int) -> list[dict]:
    """``count`` rows drawn at random (without replacement, all when there are fewer) from a vocagno shard folder."""
    from vocagno.data.streaming import read_index
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
    from vocagno.data.streaming import read_index
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


@torch.no_grad()
def student_losses(rows: dict[str, torch.Tensor], student: torch.nn.Module | None, vocab_size: int,
                   batch_rows: int, device: str) -> torch.Tensor:
    """The student's loss of each predicted token ``[R, N - 1]``: a model's, or ln V for every token (a student at
    initialization, idealized: its loss is flat, and the ranking is the teacher's alone)."""
    labels = rows["labels"]
    if student is None:
        flat = torch.full(labels[:, 1:].shape, math.log(vocab_size))
        return flat.masked_fill(labels[:, 1:] == -100, 0.0)
    student = student.to(device).eval()
    losses = []
    progress = tqdm(total=int(rows["attention_mask"].sum()), unit="tok", unit_scale=True, desc="student",
                    dynamic_ncols=True, mininterval=1.0)
    for begin in range(0, labels.shape[0], batch_rows):
        ids = rows["input_ids"][begin : begin + batch_rows].to(device)
        mask = rows["attention_mask"][begin : begin + batch_rows].to(device)
        logits = student(input_ids=ids, attention_mask=mask, use_cache=False).logits
        losses.append(next_token_cross_entropy(logits, labels[begin : begin + batch_rows].to(device)).cpu())
        progress.update(int(mask.sum()))
    progress.close()
    return torch.cat(losses)


def run(shards: str | dict[str, str], teacher, settings: Settings, *, student: torch.nn.Module | None = None,
        student_name: str = "",
        samples: int = 64, canaries: float = 0.5, noise: tuple[str, ...] = tuple(NOISE), seed: int = 0,
        device: str = "cpu", work: str | None = None, batch_tokens: int = 16384, rank: int = 0, world: int = 1,
        page_rows: int = 12, combine: str = COMBINE) -> Report | None:
    """Measure what ``teacher`` (a ``vocagno.teacher.scoring.Teacher``, or a list of several, each with its
    ``set_name``, selecting on their ``combine``) keeps of ``shards`` with canaries; None on ranks other than 0 (rank 0
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
    metadata = _same_sources({name: ShardMetadata.read(folder) for name, folder in sources.items()})
    teachers = _reader_first(teacher if isinstance(teacher, (list, tuple)) else [teacher], metadata)
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
                  "noise": list(noise), "seed": seed, "teacher": teachers[0].scored_by}
        if len(teachers) > 1:
            wanted["teachers"] = {t.set_name: t.scored_by for t in teachers}
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
                previous, scored_into = scored_into, f"{scored_into}+{each.set_name}"
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
        several = [t.set_name for t in teachers] if len(teachers) > 1 else []
        names = {"teacher": " + ".join(f"{t.set_name} ({t.scored_by['name']})" for t in teachers) + f", {combine}"
                 if several else teachers[0].scored_by["name"],
                 "student": student_name or f"at initialization (ln {metadata.student.vocab_size:,} per token)"}
        report = measure(rows, made, losses, student_loss, settings, seed, names, page_rows,
                         student_tok.convert_ids_to_tokens, several, combine,
                         (list(sources), torch.tensor(source_of)) if len(sources) > 1 else None)
        report.seconds = round(time.perf_counter() - begin, 1)
        return report
    finally:
        if temporary:
            remove(folder)


def _same_sources(metadata: dict[str, ShardMetadata]) -> ShardMetadata:
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


def _reader_first(teachers: list, metadata: ShardMetadata) -> list:
    """``teachers`` with the first whose vocabulary is the shards' teacher vocabulary (it scores their teacher
    tokens) first; refused when none is, or when several lack distinct names."""
    if len(teachers) == 1:
        return teachers
    names = [t.set_name for t in teachers]
    if None in names or len({n.lower() for n in names}) < len(names):
        raise Refused(f"several teachers need distinct names, got {names}")
    for i, each in enumerate(teachers):
        if each.tokenizer is None or metadata.teacher.same_vocabulary(each.tokenizer_info()):
            return [each, *teachers[:i], *teachers[i + 1:]]
    raise Refused(f"none of the teachers {', '.join(names)} reads the shards' teacher tokens (tokenizer "
                  f"{metadata.teacher.name!r}): one of the set must have that vocabulary")


def _wait_for(path: Path, timeout: float = 3600) -> None:
    deadline = time.time() + timeout
    while not path.exists():
        if time.time() > deadline:
            raise Refused(f"{path} did not appear within {timeout:.0f} s: did rank 0 fail?")
        time.sleep(1.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vocagno.selection", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 2)[2])
    parser.add_argument("--shards", action="append",
                        help="vocagno shards (the converter's, scored or not); several times for several sources, "
                             "each named by its folder's name (default with --config: the streams of its "
                             "train_loader.dataset)")
    teacher = parser.add_mutually_exclusive_group(required=True)
    teacher.add_argument("--teacher", action="append",
                         help="a Hugging Face name or folder, or a shipped model (tiny-math-teacher); several times "
                              "for several teachers: NAME=MODEL or MODEL (named by its folder's name), each MODEL's "
                              "folder holding its tokenizer")
    teacher.add_argument("--config", help="a training yaml: its teacher: (or teachers:) section and its "
                                          "algorithms.vocagno settings")
    parser.add_argument("overrides", nargs="*", help="key=value overrides of --config's yaml")
    parser.add_argument("--teacher-tokenizer", help="the --teacher's tokenizer, when its folder has none (one teacher)")
    parser.add_argument("--combine", choices=("min", "mean"),
                        help="several teachers: how their losses make a token's reference (default: the yaml's, "
                             "else min)")
    parser.add_argument("--dtype", default="bfloat16", help="the --teacher's dtype (a yaml's says its own)")
    parser.add_argument("--student", help="a Hugging Face name or folder, or a train.py checkpoint (.pt); unset, a "
                                          "student at initialization (a flat loss)")
    parser.add_argument("--samples", type=int, default=64, help="rows drawn from the shards")
    parser.add_argument("--canaries", type=float, help="add noise documents, this fraction of all, in (0, 1)")
    parser.add_argument("--noise", default=",".join(NOISE), help=f"kinds of noise, of {', '.join(NOISE)}")
    parser.add_argument("--seed", type=int, default=0, help="the rows drawn, the noise, the random control")
    parser.add_argument("--json", help="write the report as JSON here")
    parser.add_argument("--html", help="write a page of the first rows here: tokens coloured by teacher loss")
    parser.add_argument("--html-rows", type=int, default=12, help="rows on the --html page")
    parser.add_argument("--work", help="a folder for the rows and their scores (needed with several ranks)")
    parser.add_argument("--batch-tokens", type=int, default=16384, help="padded teacher tokens per scoring batch")
    parser.add_argument("--device", help="default: this rank's GPU (LOCAL_RANK), else the CPU")
    args = parser.parse_args(argv)
    report = _main(args)
    if report is None:
        return 0
    print(report.table())
    print(f"({report.seconds:.0f} s)")
    if args.json:
        write_atomically(args.json, json.dumps(report.as_json(), indent=1, allow_nan=False) + "\n")
        print(f"wrote {args.json}")
    if args.html:
        write_atomically(args.html, report.page(f"What the teacher keeps: {', '.join(args.shards or report.sources)}"))
        print(f"wrote {args.html}")
    return 0


def _main(args: argparse.Namespace) -> Report | None:
    from vocagno.teacher.scoring import Teacher, rank_and_world
    from vocagno.teacher.model import check_teacher_reads, load_teacher
    from vocagno.core.tokenization import load_tokenizer

    if args.samples < 1:
        raise Refused(f"--samples must be at least 1, got {args.samples}")
    if args.canaries is not None and not 0 < args.canaries < 1:
        raise Refused(f"--canaries is the fraction of noise documents, in (0, 1), got {args.canaries}")
    noise = tuple(k for k in args.noise.split(",") if k)
    if not noise or set(noise) - set(NOISE):
        raise Refused(f"--noise takes kinds of {', '.join(NOISE)}, got {args.noise!r}")
    if args.overrides and not args.config:
        raise Refused(f"overrides {args.overrides} need --config")
    rank, world = rank_and_world()
    if world > 1 and args.work is None:
        raise Refused(f"{world} ranks need one --work folder they all reach")
    cfg = None
    if args.config:
        from vocagno.training.config import load_config

        try:
            cfg = load_config(args.config, args.overrides)
        except (ValueError, OSError, KeyError) as error:
            raise Refused(f"{error.__class__.__name__}: {str(error).splitlines()[0] if str(error) else ''}") from error
    sources = _sources(args.shards, cfg, args.config)
    metadata = _same_sources({name: _read_shards(folder, name if len(sources) > 1 else None)
                              for name, folder in sources.items()})
    try:
        combine = args.combine or "min"
        if cfg is not None:
            settings = Settings.from_config(cfg)
            chosen = config_teachers(cfg, args.config)
            if isinstance(chosen, list):
                chosen = _reader_first(chosen, metadata)
                combine = args.combine or ((cfg.get("algorithms") or {}).get("vocagno") or {}).get("combine", "min")
                teacher_tokenizer = chosen[0].tokenizer
            else:
                teacher_tokenizer = cfg.teacher.tokenizer
        elif len(args.teacher) > 1:
            if args.teacher_tokenizer:
                raise Refused("--teacher-tokenizer is for one --teacher: several take each one's folder's tokenizer")
            settings = Settings()
            named = _named_teachers(args.teacher)
            chosen = _reader_first([Teacher(load_teacher(model, args.dtype), model, args.dtype, 1024, model, name)
                                    for name, model in named.items()], metadata)
            teacher_tokenizer = chosen[0].tokenizer
        else:
            settings = Settings()
            model = _split_teacher(args.teacher[0])[1]
            chosen = Teacher(load_teacher(model, args.dtype), model, args.dtype, 1024)
            teacher_tokenizer = args.teacher_tokenizer or model
        reader = chosen[0] if isinstance(chosen, list) else chosen  # the teacher of the shards' teacher tokens
        check_teacher_reads(reader.scorer.model, metadata, load_tokenizer(teacher_tokenizer))
        for other in chosen[1:] if isinstance(chosen, list) else ():  # each reads its own tokens, made from the text
            own = metadata if other.tokenizer is None else replace(metadata, teacher=other.tokenizer_info())
            try:
                check_teacher_reads(other.scorer.model, own)
            except ValueError as error:
                raise Refused(f"teacher {other.set_name!r}: {error}") from None
        student, student_name = None, ""
        if args.student:
            from vocagno.training.checkpoint import BadCheckpoint
            from vocagno.training.models import load_model

            try:
                student, tokenizer = load_model(args.student, "cpu")
            except BadCheckpoint as error:  # it names the file and what is wrong with it
                raise Refused(f"--student {error}") from error
            metadata.check_tokenizers(student=describe_tokenizer(tokenizer, "student"))
            student_name = args.student
    except (ValueError, OSError, KeyError, RuntimeError, pickle.UnpicklingError) as error:
        raise Refused(f"{error.__class__.__name__}: {str(error).splitlines()[0] if str(error) else ''}") from error
    device = args.device or (f"cuda:{os.environ.get('LOCAL_RANK', 0)}" if torch.cuda.is_available() else "cpu")
    if device == "cpu":  # the models' logits and log-softmax reused, not faulted in again each batch
        keep_freed_memory()
    return run({name: str(folder) for name, folder in sources.items()}, chosen, settings, student=student,
               student_name=student_name, samples=args.samples, canaries=args.canaries or 0.0, noise=noise,
               seed=args.seed, device=device, work=args.work,
               batch_tokens=args.batch_tokens, rank=rank, world=world, page_rows=args.html_rows, combine=combine)


def config_teachers(cfg, source: str):
    """A training config's teacher (``vocagno.teacher.scoring.Teacher``), or its ``teachers:`` as a list."""
    from vocagno.teacher.scoring import Teacher

    if cfg.get("teachers") is not None:
        return [Teacher.from_config(cfg, source, name) for name in cfg.teachers]
    return Teacher.from_config(cfg, source)


def _split_teacher(value: str) -> tuple[str | None, str]:
    """A ``--teacher`` value as (its NAME or None, its MODEL): ``NAME=MODEL`` only where NAME is a teacher's name (a
    path may hold "=": ``/ckpt/lr=3e-4/teacher``)."""
    name, _, model = value.partition("=")
    return (name, model) if model and TEACHER_NAME.fullmatch(name) else (None, value)


def _named_teachers(values: list[str]) -> dict[str, str]:
    """``--teacher`` values (``NAME=MODEL`` or ``MODEL``, named by its last path part) as name -> model, each name
    checked and given once."""
    named = {}
    for value in values:
        name, model = _split_teacher(value)
        name = name or Path(model.rstrip("/")).name
        try:
            check_teacher_name(name, "--teacher")
        except ValueError as error:
            raise Refused(f"{error} (give it one: --teacher NAME={model})") from error
        if name.lower() in {n.lower() for n in named}:
            raise Refused(f"two teachers are named {name!r}: name them apart (--teacher NAME=MODEL)")
        named[name] = model
    return named


def _sources(shards: list[str] | None, cfg, config: str | None) -> dict[str, Path]:
    """The sources, name -> folder: each ``--shards`` folder, named by its last path part, or without ``--shards``
    the streams of ``--config``'s ``train_loader.dataset.streams`` (each its ``local``, and ``split`` under it),
    named by their names; refused without either, or when two share a name."""
    if shards:
        named = [(Path(folder.rstrip("/")).name or folder, Path(folder)) for folder in shards]
    else:
        streams = None if cfg is None else ((cfg.get("train_loader") or {}).get("dataset") or {}).get("streams")
        if not streams:
            raise Refused("--shards is needed" + (f": {config} has no train_loader.dataset.streams to take as sources"
                                                    if config else ""))
        named = []
        for name, stream in streams.items():
            if not stream or not stream.get("local"):
                raise Refused(f"{config}: stream {name!r} has no local folder to read (download it, or give --shards)")
            named.append((str(name), Path(stream.local) / stream.split if stream.get("split") else Path(stream.local)))
    sources = {}
    for name, folder in named:
        same = [n for n in sources if n.lower() == name.lower()]
        if same:
            raise Refused(f"two sources are named {name!r} ({sources[same[0]]} and {folder}): each --shards source is "
                          "named by its folder's last part: give folders of distinct names")
        sources[name] = folder
    return sources


def _read_shards(folder: Path, source: str | None = None) -> ShardMetadata:
    """The shards' metadata, refusing a folder that holds no vocagno shards with offsets (naming its ``source``)."""
    if source is not None:
        try:
            return _read_shards(folder)
        except Refused as error:
            raise Refused(f"source {source!r}: {error}") from None
    if not (folder / "index.json").exists():
        raise Refused(f"--shards {folder} holds no index.json: not a shard folder")
    if not (folder / METADATA_FILE).exists():
        raise Refused(f"--shards {folder} holds no {METADATA_FILE}: not vocagno shards (a token MDS has no text or "
                      "offsets to align; convert the corpus with conversion/convert_dataset.py)")
    from vocagno.data.streaming import read_index

    index = read_index(folder)  # every count and name checked before the shards are read
    missing = sorted(set(COLUMNS) - {c for info in index["shards"][:1] for c in info.get("column_names", [])})
    if missing or not index["shards"]:
        raise Refused(f"--shards {folder}: its shards lack the columns {', '.join(missing) or 'of any sample'}: "
                      "convert the corpus with conversion/convert_dataset.py")
    try:
        return ShardMetadata.read(folder)
    except ValueError as error:
        raise Refused(str(error)) from error


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>__TITLE__</title>
<style>
body { font: 15px/1.5 system-ui, sans-serif; margin: 2em; max-width: 75em; color: #222; }
h1 { font-size: 1.2em; } h2 { font-size: 1em; margin: 1.2em 0 .3em; color: #555; }
table { border-collapse: collapse; } td, th { padding: 2px 10px; text-align: right; border-bottom: 1px solid #e5e7eb; }
th:first-child, td:first-child { text-align: left; }
.row { white-space: pre-wrap; font-family: ui-monospace, monospace; line-height: 2.2; word-break: break-all;
       border-left: 3px solid #cbd5e1; padding-left: .6em; margin-bottom: 1em; }
.tok { border-radius: 3px; padding: 1px 0; cursor: default; }
.dropped { opacity: .35; }
.kept { outline: 1px solid #111; }
.canary { text-decoration: underline wavy; text-decoration-thickness: 2px; }
.k1 { text-decoration-color: #7c3aed; } .k2 { text-decoration-color: #dc2626; } .k3 { text-decoration-color: #0891b2; }
.special { background: #444 !important; color: #fff; font-size: .75em; padding: 1px 3px; margin: 0 1px; }
.legend span { display: inline-block; padding: 0 .5em; margin-right: .5em; border-radius: 3px; }
.chart td { text-align: left; min-width: 14em; } .chart th { text-align: left; }
.bar { display: inline-block; height: .9em; vertical-align: middle; margin-right: .4em; border-radius: 2px; }
.k0bar { background: #16a34a; } .k1bar { background: #7c3aed; }
.k2bar { background: #dc2626; } .k3bar { background: #0891b2; }
#info { position: sticky; top: 0; background: #f8fafc; border: 1px solid #cbd5e1; padding: .4em .8em; min-height: 1.5em; }
</style></head><body>
<h1>__TITLE__</h1>
<div id="summary"></div>
<h2>what each variant keeps of each kind of text (its share of the kind's mapped tokens)</h2>
<div id="chart"></div>
<h2>legend</h2>
<div class="legend" id="legend"></div>
<div id="info">Hover a token: its kind, the teacher's loss (aggregated over its teacher tokens), the student's, kept or dropped.</div>
<h2>rows</h2>
<div id="rows"></div>
<script>
const data = __DATA__;
const maxLoss = Math.max(1, ...data.rows.flatMap(r => r.tokens.map(t => t.teacher || 0)));
const colour = loss => loss === null || loss === undefined ? "#e5e7eb" :
  `hsl(${Math.round(120 * (1 - Math.min(loss / maxLoss, 1)))}, 70%, 78%)`;
function summary() {
  let rows = Object.entries(data.variants).map(([name, v]) =>
    `<tr><td>${name}</td><td>${v.precision.toFixed(3)}</td><td>${v.recall.toFixed(3)}</td></tr>`).join("");
  const box = document.getElementById("summary");
  box.innerHTML = `<p>topk: ${data.settings}. Clean share of the mapped tokens: ${data.clean_share.toFixed(3)}
    (what a random selection keeps).</p><table><tr><th>variant</th><th>precision</th><th>recall</th></tr></table>`;
  box.querySelector("table").insertAdjacentHTML("beforeend", rows);
  const legend = document.getElementById("legend");
  [["low teacher loss", colour(0)], ["high teacher loss", colour(maxLoss)], ["no teacher loss (unmapped)", colour(null)]]
    .forEach(([label, c]) => { const s = document.createElement("span"); s.style.background = c; s.textContent = label;
                               legend.appendChild(s); });
  const kept = document.createElement("span"); kept.className = "kept"; kept.textContent = "kept (outlined)";
  const dropped = document.createElement("span"); dropped.className = "dropped"; dropped.textContent = "dropped (faded)";
  legend.append(kept, dropped);
  data.kinds.slice(1).forEach((kind, i) => { const s = document.createElement("span");
    s.className = `canary k${i + 1}`; s.textContent = `canary: ${kind}`; legend.appendChild(s); });
  if (data.teachers.length) {  // several teachers: a toggle colours tokens by the one that gave their reference
    const label = document.createElement("label"), box = document.createElement("input");
    box.type = "checkbox"; box.id = "byTeacher"; box.onchange = () => { document.getElementById("rows").innerHTML = "";
      render(); };
    label.append(box, " colour by the teacher that gave the reference:");
    legend.appendChild(label);
    data.teachers.forEach((name, i) => { const s = document.createElement("span"); s.textContent = name;
      s.style.background = teacherColour(name); legend.appendChild(s); });
  }
}
const teacherColour = by => by === null || by === undefined ? "#e5e7eb" : by.includes("+") ? "#d4d4d8" :
  `hsl(${(data.teachers.indexOf(by) * 137) % 360}, 70%, 80%)`;
const byTeacher = () => { const box = document.getElementById("byTeacher"); return box !== null && box.checked; };
function render() {
  const box = document.getElementById("rows");
  data.rows.forEach((row, r) => {
    const div = document.createElement("div"); div.className = "row";
    row.tokens.forEach(t => {
      const span = document.createElement("span");
      span.className = "tok";
      if (t.t === "") { span.classList.add("special"); span.textContent = t.piece; }
      else { span.textContent = t.t; span.style.background = byTeacher() ? teacherColour(t.by) : colour(t.teacher); }
      if (t.kept === true) span.classList.add("kept");
      if (t.kept === false) span.classList.add("dropped");
      if (t.k > 0) span.classList.add("canary", "k" + t.k);
      span.onmouseenter = () => {
        const kind = t.k >= 0 ? data.kinds[t.k] : "special";
        const teacher = t.teacher === null || t.teacher === undefined ? "none" : t.teacher.toFixed(3);
        const state = t.kept === null ? "predicts nothing (a row's first token)" : t.kept ? "kept" : "dropped";
        document.getElementById("info").textContent = `row ${r}  ${JSON.stringify(t.piece)}  ${kind}  ` +
          `teacher loss ${teacher}${t.by ? " (" + t.by + ")" : ""}  ` +
          `student loss ${t.student === undefined ? "-" : t.student.toFixed(3)}  ${state}`;
      };
      div.appendChild(span);
    });
    box.appendChild(div);
  });
}
function chart() {  // each variant's kept share of each kind's mapped tokens, as bars: clean high, canaries low
  const head = data.kinds.map((kind, i) => `<th><span class="bar k${i}bar" style="width:1em"></span>${kind}</th>`);
  const rows = Object.entries(data.variants).map(([name, v]) => `<tr><td>${name}</td>` + data.kinds.map((kind, i) =>
    `<td><span class="bar k${i}bar" style="width:${(100 * v.kept_share[kind]).toFixed(1) / 10}em"></span>` +
    `${v.kept_share[kind].toFixed(3)}</td>`).join("") + "</tr>").join("");
  document.getElementById("chart").innerHTML =
    `<table class="chart"><tr><th>variant</th>${head.join("")}</tr>${rows}</table>`;
}
summary(); chart(); render();
</script></body></html>
"""


if __name__ == "__main__":
    from vocagno import entry

    entry.run(main)
