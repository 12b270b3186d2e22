"""What each selection variant keeps of scored canary rows, measured: precision, recall, losses per kind
(``measure``)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from vocagno.core.alignment import chunk_align
from vocagno.diagnostics.canaries import CLEAN, Canaries
from vocagno.core.loss import COMBINE, next_token_cross_entropy, reference_loss
from vocagno.data.batch import ALIGN_END, ALIGN_START, TEACHER_ATTENTION_MASK, TEACHER_LOSS, teacher_key
from vocagno.diagnostics.selection.settings import BINS, CHUNKS, Settings, choose
from vocagno.diagnostics.selection.report import Report

__all__ = ["measure", "student_losses"]


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
