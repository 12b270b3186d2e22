"""The teacher guided loss: Rho-1's selective language modeling with a reference model of any vocabulary.

Plain torch, no training framework. Shapes: ``B`` sequences, ``N`` student positions, ``M`` teacher positions,
``V`` vocabulary. Student tensors are already shifted (logits at ``i`` predict ``labels[i]``) and ``start, end``
give, per student label token, the range of teacher positions whose tokens overlap it (``vocagno.core.alignment``).
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.nn.functional as F

__all__ = [
    "AGGREGATION", "AGGREGATIONS", "CHUNK_SIZE", "COMBINE", "COMBINES", "SELECTION", "SELECTION_SCOPE",
    "SELECTION_SCOPES", "SELECTIONS", "TOPK_RATIO", "UNMAPPED", "check_options", "token_cross_entropy",
    "next_token_cross_entropy", "teacher_token_loss", "aggregate_ranges", "reference_loss", "excess_loss", "select_top",
    "select_random", "guided_loss",
]

AGGREGATIONS = ("max", "mean", "sum", "min")
# How several teachers' aggregated losses make a student token's reference: the best teacher's (lowest), or their mean.
COMBINES = ("min", "mean")
# Over which tokens the top-k is taken: the whole global batch (every rank and microbatch), each microbatch on each
# rank, or each sequence.
SELECTION_SCOPES = ("batch", "microbatch", "sequence")
# Which tokens are kept: the top-k by score, or (a control) as many drawn uniformly at random among the mapped ones.
SELECTIONS = ("topk", "random")

# The defaults of every option above, the paper's: VocAgnoLM, the selection report and the functions here take them
# from these names.
TOPK_RATIO = 0.4  # the share of mapped student tokens kept by score
AGGREGATION = "max"
UNMAPPED = "include"  # student tokens without teacher tokens (specials) are trained on
SELECTION_SCOPE = "batch"
SELECTION = "topk"
COMBINE = "min"
CHUNK_SIZE = 1024  # teacher tokens per chunk of an LM head and its cross-entropy: its logits are never held whole


def check_options(
    topk_ratio: float = TOPK_RATIO, aggregation: str = AGGREGATION, unmapped: str = UNMAPPED,
    selection_scope: str = SELECTION_SCOPE,
    selection: str = SELECTION, combine: str = COMBINE,
) -> None:
    """Refuse options ``guided_loss`` doesn't know, naming the option (callers check them before training starts)."""
    if combine not in COMBINES:
        raise ValueError(f"combine must be one of {COMBINES}, got {combine!r}")
    if selection not in SELECTIONS:
        raise ValueError(f"selection must be one of {SELECTIONS}, got {selection!r}")
    if selection_scope not in SELECTION_SCOPES:
        raise ValueError(f"selection_scope must be one of {SELECTION_SCOPES}, got {selection_scope!r}")
    if not 0.0 <= topk_ratio <= 1.0:
        raise ValueError(f"topk_ratio must be in [0, 1], got {topk_ratio}")
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
    if unmapped not in ("include", "exclude"):
        raise ValueError(f"unmapped must be 'include' or 'exclude', got {unmapped!r}")


def token_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Per-token cross-entropy in fp32: ``[..., V]``, ``[...]`` -> ``[...]``, 0 where ``targets == ignore_index``."""
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), ignore_index=ignore_index, reduction="none"
    ).view(targets.shape)


def next_token_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Per-token cross-entropy ``[B, N - 1]`` of logits per input position (position i predicts label i + 1, Hugging
    Face's convention). The labels move left, not the logits: slicing them would copy all B x N x V."""
    targets = F.pad(labels[:, 1:], (0, 1), value=ignore_index)
    return token_cross_entropy(logits, targets, ignore_index)[:, :-1]


@torch.no_grad()
def teacher_token_loss(
    hidden_states: torch.Tensor,
    output_layer: Callable[[torch.Tensor], torch.Tensor],
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    chunk_size: int = CHUNK_SIZE,
    linear_cross_entropy: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """Loss of each teacher token given the tokens before it: ``[B, M]`` fp32, NaN where undefined.

    ``hidden_states`` are the teacher's last hidden states ``[B, M, H]`` and ``output_layer`` its LM head (for an HF
    model, ``model.get_output_embeddings()``). Logits are computed ``chunk_size`` tokens at a time, so fp32 logits over
    the whole vocabulary never exist for the whole batch (4 x 2048 tokens x 152K x 4 bytes would be 5 GB).
    ``linear_cross_entropy`` (hidden ``[T, H]``, targets ``[T]`` -> losses ``[T]``), when given, does the LM head and
    the cross-entropy at once instead (``vocagno.core.kernels.fused_token_loss``).
    Undefined: position 0 (nothing precedes it) and padding (``attention_mask == 0``) or a token after padding.
    """
    batch, length = input_ids.shape
    loss = torch.full((batch, length), float("nan"), device=input_ids.device, dtype=torch.float32)
    if length < 2:
        return loss
    predicted = input_ids[:, 1:]
    if attention_mask is not None:
        # Left padding is allowed: a token is defined when it and the one predicting it are real tokens.
        real = attention_mask.bool()
        predicted = predicted.masked_fill(~(real[:, 1:] & real[:, :-1]), -100)
    hidden = hidden_states[:, :-1].reshape(-1, hidden_states.shape[-1])
    targets = predicted.reshape(-1)
    if linear_cross_entropy is not None:
        flat = linear_cross_entropy(hidden, targets)
    else:
        flat = torch.empty(targets.shape, device=input_ids.device, dtype=torch.float32)
        for begin in range(0, targets.numel(), chunk_size):
            chunk = slice(begin, begin + chunk_size)
            flat[chunk] = token_cross_entropy(output_layer(hidden[chunk]), targets[chunk])
    flat = flat.masked_fill(targets == -100, float("nan"))
    loss[:, 1:] = flat.view(batch, length - 1)
    return loss


def aggregate_ranges(values: torch.Tensor, start: torch.Tensor, end: torch.Tensor,
                     how: str = AGGREGATION) -> torch.Tensor:
    """Reduce ``values[b, start[b, i]:end[b, i]]`` for every ``(b, i)``, ignoring NaN: ``[B, M]`` -> ``[B, N]``.

    NaN where the range is empty or holds no defined value. Vectorized with no host sync and no shape that depends
    on the data: ``sum``/``mean`` by prefix sums (fp64), ``max``/``min`` by a sparse table (log2 M levels,
    two lookups per range).
    """
    check_options(aggregation=how)
    if values.dim() != 2 or start.shape != end.shape or start.dim() != 2 or start.shape[0] != values.shape[0]:
        raise ValueError(
            f"expected values [B, M] and start, end [B, N]; got {tuple(values.shape)}, "
            f"{tuple(start.shape)}, {tuple(end.shape)}"
        )
    start, end = start.long(), end.long()
    defined = ~torch.isnan(values)
    nan = float("nan")  # a Python scalar: torch.tensor(nan, device=...) would copy it to the device and wait
    if how in ("sum", "mean"):
        sums = F.pad(torch.where(defined, values, 0).double().cumsum(-1), (1, 0))
        counts = F.pad(defined.long().cumsum(-1), (1, 0))
        total = sums.gather(-1, end) - sums.gather(-1, start)
        count = counts.gather(-1, end) - counts.gather(-1, start)
        out = total if how == "sum" else total / count.clamp(min=1)
        return torch.where(count > 0, out.to(values.dtype), nan)

    length = values.shape[1]
    if length == 0:
        return torch.full(start.shape, float("nan"), device=values.device, dtype=values.dtype)
    reduce = torch.maximum if how == "max" else torch.minimum
    fill = float("-inf") if how == "max" else float("inf")
    # levels[k][b, j] = reduction over values[b, j : j + 2**k] (filled past the end).
    levels = [torch.where(defined, values, fill)]
    while 2 ** len(levels) <= length:
        width = 2 ** (len(levels) - 1)
        previous = levels[-1]
        levels.append(reduce(previous, F.pad(previous[:, width:], (0, width), value=fill)))
    table = torch.stack(levels)  # [K, B, M]
    span = end - start
    powers = 2 ** torch.arange(len(levels), device=values.device)
    level = (torch.searchsorted(powers, span, right=True) - 1).clamp(min=0)  # floor(log2(span))
    rows = torch.arange(values.shape[0], device=values.device).unsqueeze(-1).expand_as(start)
    # Unmapped ranges (span 0) look up a clamped position; their result is discarded below.
    first = start.clamp(max=length - 1)
    last = (end - powers[level]).clamp(min=0, max=length - 1)
    out = reduce(table[level, rows, first], table[level, rows, last])
    return torch.where((span > 0) & torch.isfinite(out), out, nan)


def reference_loss(
    losses: Sequence[torch.Tensor],
    starts: Sequence[torch.Tensor],
    ends: Sequence[torch.Tensor],
    aggregation: str = AGGREGATION,
    combine: str = COMBINE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each student token's reference loss from one or several teachers, and which teachers gave it.

    Teacher t's losses ``[B, M_t]`` are aggregated over its own ranges ``starts[t], ends[t]`` ``[B, N]``
    (``aggregate_ranges``); the teachers that map a token combine into its reference: ``min`` (the best teacher's) or
    ``mean``. NaN where no teacher maps the token. Returns the reference ``[B, N]`` and ``gave`` ``[T, B, N]``: for
    ``min``, the one teacher whose loss is the reference (the first on ties), for ``mean`` every teacher that maps it.
    """
    check_options(aggregation=aggregation, combine=combine)
    if not len(losses) == len(starts) == len(ends) or not losses:
        raise ValueError(f"expected as many teacher losses, starts and ends (at least one), got "
                         f"{len(losses)}, {len(starts)}, {len(ends)}")
    each = torch.stack([aggregate_ranges(loss.detach().float(), start, end, aggregation)
                        for loss, start, end in zip(losses, starts, ends)])
    maps = ~torch.isnan(each)
    if len(each) == 1:
        return each[0], maps
    if combine == "mean":
        reference = torch.where(maps, each, 0).sum(0) / maps.sum(0)  # 0/0: NaN where no teacher maps the token
        return reference, maps
    best = torch.where(maps, each, float("inf")).argmin(0)
    gave = (torch.arange(len(each), device=each.device)[:, None, None] == best) & maps.any(0)
    return torch.where(maps.any(0), each.gather(0, best[None])[0], float("nan")), gave


def excess_loss(
    student_loss: torch.Tensor,
    labels: torch.Tensor,
    teacher_loss: torch.Tensor | Sequence[torch.Tensor],
    start: torch.Tensor | Sequence[torch.Tensor],
    end: torch.Tensor | Sequence[torch.Tensor],
    aggregation: str = AGGREGATION,
    ignore_index: int = -100,
    combine: str = COMBINE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The score that selection ranks, and the reference loss of each student token: both ``[B, N]``.

    score = student loss - the reference: the teacher losses over the token's range, aggregated; with several
    teachers (``teacher_loss``, ``start`` and ``end`` sequences, one entry per teacher), their combination
    (``reference_loss``). ``-inf`` where the token is not *mapped* (no label, or no defined teacher loss in its
    range), so a token is mapped exactly when its score is finite.
    """
    reference, _ = reference_loss(*_per_teacher(teacher_loss, start, end), aggregation, combine)
    mapped = (labels != ignore_index) & ~torch.isnan(reference)
    return torch.where(mapped, student_loss.detach() - reference, float("-inf")), reference


def _per_teacher(teacher_loss, start, end) -> tuple[list, list, list]:
    """One teacher's tensors, or several teachers' sequences, as sequences."""
    if isinstance(teacher_loss, torch.Tensor):
        return [teacher_loss], [start], [end]
    return list(teacher_loss), list(start), list(end)


def select_top(score: torch.Tensor, ratio: float, per_sequence: bool = False) -> torch.Tensor:
    """Mask of the ``ceil(ratio * count)`` highest finite scores, over the whole tensor or per row (``per_sequence``);
    ties go to the earlier position (row-major). No host sync."""
    eligible = torch.isfinite(score)
    flat_score = score if per_sequence else score.reshape(1, -1)
    flat_eligible = eligible if per_sequence else eligible.reshape(1, -1)
    order = torch.sort(flat_score, dim=-1, descending=True, stable=True).indices
    positions = torch.arange(order.shape[-1], device=order.device).expand_as(order)
    rank = torch.empty_like(order).scatter_(-1, order, positions)
    # fp64 and a hair below: 0.4 * 10 must give 4, not 5.
    budget = torch.ceil(flat_eligible.sum(-1, keepdim=True).double() * ratio - 1e-9)
    return (rank < budget).view(score.shape) & eligible


def select_random(
    score: torch.Tensor, ratio: float, per_sequence: bool = False, generator: torch.Generator | None = None
) -> torch.Tensor:
    """As many tokens as ``select_top`` keeps (``ceil(ratio * count)`` of the finite scores, over the tensor or per
    row), drawn uniformly at random among them: the control that tells selection by score from selection at all."""
    noise = torch.rand(score.shape, generator=generator, device=score.device)
    return select_top(torch.where(torch.isfinite(score), noise, float("-inf")), ratio, per_sequence)


def guided_loss(
    student_logits: torch.Tensor,
    labels: torch.Tensor,
    teacher_loss: torch.Tensor | Sequence[torch.Tensor],
    start: torch.Tensor | Sequence[torch.Tensor],
    end: torch.Tensor | Sequence[torch.Tensor],
    *,
    topk_ratio: float = TOPK_RATIO,
    aggregation: str = AGGREGATION,
    unmapped: str = UNMAPPED,
    combine: str = COMBINE,
    per_sequence: bool = False,
    selection: str = SELECTION,
    generator: torch.Generator | None = None,
    selected: torch.Tensor | None = None,
    token_counts: dict[str, torch.Tensor] | None = None,
    row_counts: bool = False,
    ignore_index: int = -100,
) -> dict[str, torch.Tensor]:
    """Train only on the student tokens the teacher says are worth learning.

    score = student loss - teacher loss aggregated over the teacher tokens aligned to the student token (no gradient
    through the score; ``excess_loss``). Of the *mapped* tokens (a label and an aggregated teacher loss), the
    ``ceil(topk_ratio * count)`` with the highest scores are kept, over the whole batch or per sequence
    (``per_sequence``); ties go to the earlier position. ``selection="random"`` keeps as many mapped tokens drawn at
    random instead (``select_random``, from ``generator``). Unmapped tokens with a label are kept (``"include"``) or
    dropped (``"exclude"``).

    A caller that trains a larger batch in pieces (microbatches, ranks) selects over the whole batch itself
    (``select_top`` on every piece's ``excess_loss``) and passes each piece's part as ``selected``, with
    ``token_counts``: the ``labeled``, ``mapped`` and ``kept`` token counts to divide by instead of this piece's own,
    so that the pieces' results add up to the whole batch's means.

    Several teachers: ``teacher_loss``, ``start`` and ``end`` are sequences (one entry per teacher, each with its
    own teacher positions) and a token's reference is their ``combine`` (``reference_loss``); the result has also
    ``teacher_counts`` ``[T + 1]``: the kept mapped tokens whose reference teacher t gave (``reference_loss``'s
    ``gave``), then all kept mapped tokens.

    Returns ``total`` (mean student cross-entropy over the kept tokens, the loss to train on) and detached statistics:
    ``kept_fraction`` and ``mapped_fraction`` (of tokens with a label), ``student_loss`` (mean over tokens with a
    label), ``teacher_loss`` and ``score`` (means over mapped tokens). With ``row_counts``, also ``row_counts``
    ``[B, 2]``: each row's tokens with a label and kept ones, for a caller that reports per group of rows (a mixture's
    streams); not a scalar, so not for a trainer to log as it is (nor is ``teacher_counts``).
    """
    check_options(topk_ratio, aggregation, unmapped, selection=selection, combine=combine)
    losses, starts, ends = _per_teacher(teacher_loss, start, end)
    for start, end in zip(starts, ends):
        if student_logits.shape[:-1] != labels.shape or labels.shape != start.shape or start.shape != end.shape:
            raise ValueError(
                "expected student_logits [B, N, V] and labels, start, end [B, N]; got "
                f"{tuple(student_logits.shape)}, {tuple(labels.shape)}, {tuple(start.shape)}, {tuple(end.shape)}"
            )
    for loss in losses:
        if loss.dim() != 2 or loss.shape[0] != labels.shape[0]:
            raise ValueError(f"expected teacher_loss [B, M], got {tuple(loss.shape)}")
    if selected is not None and selected.shape != labels.shape:
        raise ValueError(f"expected selected {tuple(labels.shape)}, got {tuple(selected.shape)}")

    student_loss = token_cross_entropy(student_logits, labels, ignore_index)
    has_label = labels != ignore_index
    reference, gave = reference_loss(losses, starts, ends, aggregation, combine)
    mapped = has_label & ~torch.isnan(reference)
    score = torch.where(mapped, student_loss.detach() - reference, float("-inf"))
    if selected is None:
        selected = (select_top(score, topk_ratio, per_sequence) if selection == "topk"
                    else select_random(score, topk_ratio, per_sequence, generator))
    kept = mapped & selected
    if unmapped == "include":
        kept = kept | (has_label & ~mapped)

    kept_f, labeled_f, mapped_f = kept.float(), has_label.float(), mapped.float()
    if token_counts is None:
        token_counts = {"labeled": labeled_f.sum(), "mapped": mapped_f.sum(), "kept": kept_f.sum()}
    n_labeled, n_mapped, n_kept = (token_counts[k].clamp(min=1) for k in ("labeled", "mapped", "kept"))
    rows = {"row_counts": torch.stack([labeled_f.sum(1), kept_f.sum(1)], dim=1)} if row_counts else {}
    if len(losses) > 1:
        kept_mapped = kept & mapped
        rows["teacher_counts"] = torch.cat([(gave & kept_mapped).flatten(1).sum(1), kept_mapped.sum()[None]]).float()
    return {
        "total": (student_loss * kept_f).sum() / n_kept,
        "kept_fraction": kept_f.sum() / n_labeled,
        "mapped_fraction": mapped_f.sum() / n_labeled,
        "student_loss": (student_loss.detach() * labeled_f).sum() / n_labeled,
        "teacher_loss": torch.where(mapped, reference, 0).sum() / n_mapped,
        "score": torch.where(mapped, score, 0).sum() / n_mapped,
        **rows,
    }
