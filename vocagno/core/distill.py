"""The paper's logit-distillation baselines as plain functions: ULD (any two vocabularies) and KLD (one vocabulary);
and the teacher's distributions cached (``teacher_top_k``: what ``python -m vocagno.score --top-k`` stores), with
ULD from them (``cached_uld_loss``) and a cross-vocabulary KD from them projected onto the student's vocabulary
(``projected_kd_loss``).

Definitions and what is confirmed: ``../shared/reference/baselines-and-evaluation.md`` §1 (ULD) and §2 (KLD).
Both take the student's logits per input position (position i predicts token i + 1, Hugging Face's convention) and
the teacher's last hidden states with its LM head, whose logits are made ``chunk_size`` positions at a time: the
teacher's fp32 logits over its whole vocabulary never exist for the whole batch.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from vocagno.core.loss import CHUNK_SIZE, next_token_cross_entropy

__all__ = ["cached_uld_loss", "kld_loss", "projected_kd_loss", "teacher_top_k", "uld_loss"]


def _student_ce(student_logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean cross-entropy over the labeled next tokens (Hugging Face's loss), and where they are ``[B, N - 1]``."""
    labeled = labels[:, 1:] != -100
    ce = next_token_cross_entropy(student_logits, labels)
    return (ce * labeled).sum() / labeled.sum().clamp(min=1), labeled


def _uld_pairs(b: int, labeled: torch.Tensor, teacher_mask: torch.Tensor, skip_student_eos: bool,
               aligned: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Row ``b``'s ULD pairs: student positions and the teacher positions they are compared with (``uld_loss``)."""
    if aligned is None:  # by position, up to the shorter side
        size = min(int(labeled[b].sum()) - int(skip_student_eos), int(teacher_mask[b].sum()) - 1)
        at = torch.arange(max(size, 0), device=labeled.device)
        return at, at
    student_at = (labeled[b] & (aligned[b] >= 0)).nonzero().squeeze(1)
    return student_at, aligned[b, student_at]


def uld_loss(
    student_logits: torch.Tensor,
    labels: torch.Tensor,
    teacher_hidden: torch.Tensor,
    teacher_head: Callable[[torch.Tensor], torch.Tensor],
    teacher_mask: torch.Tensor,
    *,
    weight: float = 1.5,
    student_temperature: float = 1.0,
    teacher_temperature: float = 1.0,
    skip_student_eos: bool = True,
    aligned_teacher_positions: torch.Tensor | None = None,
    chunk_size: int = CHUNK_SIZE,
) -> dict[str, torch.Tensor]:
    """Universal Logit Distillation (Boizard et al.), as the reference code computes it, applied to pretraining rows.

    Per row b: the student's next-token distributions at its labeled positions and the teacher's at its real
    positions (``teacher_mask``; the last predicts nothing), each at its temperature, are paired by position (student
    position i with teacher position i: ULD has no alignment) up to the shorter side, the student's shortened by one
    (``skip_student_eos``, the code's default). ``ULD_b`` = mean over the pairs of the L1 distance between the two
    distributions sorted in decreasing order, the smaller vocabulary zero-padded to the larger. Total = CE (the
    student's, over all its labeled tokens) + ``weight`` x mean over rows of ``ULD_b`` (the code's defaults: weight
    1.5, temperatures 1). The rows' labeled positions must come first (no labels before the text starts: pretraining).

    ``aligned_teacher_positions`` ``[B, N - 1]`` pairs through the token alignment instead, a variant none of the
    references has: student position i with the teacher position given there (the one predicting the first teacher
    token aligned to student token i + 1; -1: unpaired), at every labeled student position.
    """
    ce, labeled = _student_ce(student_logits, labels)
    with torch.no_grad():
        vocab = max(student_logits.shape[-1], teacher_head(teacher_hidden[:1, :1]).shape[-1])
    per_row = []
    for b in range(student_logits.shape[0]):
        student_at, teacher_at = _uld_pairs(b, labeled, teacher_mask, skip_student_eos, aligned_teacher_positions)
        distance = student_logits.new_zeros((), dtype=torch.float32)
        for begin in range(0, len(student_at), chunk_size):
            chunk = slice(begin, begin + chunk_size)
            student = F.softmax(student_logits[b, student_at[chunk]].float() / student_temperature, dim=-1)
            with torch.no_grad():
                teacher = F.softmax(teacher_head(teacher_hidden[b, teacher_at[chunk]]).float() / teacher_temperature,
                                    dim=-1)
                teacher = F.pad(teacher.sort(dim=-1, descending=True).values, (0, vocab - teacher.shape[-1]))
            student = F.pad(student.sort(dim=-1, descending=True).values, (0, vocab - student.shape[-1]))
            distance = distance + (student - teacher).abs().sum()
        per_row.append(distance / max(len(student_at), 1))
    uld = torch.stack(per_row).mean()
    return {"total": ce + weight * uld, "ce": ce.detach(), "uld": uld.detach()}


def kld_loss(
    student_logits: torch.Tensor,
    labels: torch.Tensor,
    teacher_hidden: torch.Tensor,
    teacher_head: Callable[[torch.Tensor], torch.Tensor],
    *,
    kd_ratio: float = 0.5,
    chunk_size: int = CHUNK_SIZE,
) -> dict[str, torch.Tensor]:
    """Same-vocabulary logit distillation, MiniPLM's pretraining recipe: ``(1 - kd_ratio) x CE + kd_ratio x soft CE``
    against the teacher (- sum_v p_T log p_S, temperature 1), both means over the labeled next tokens. The teacher
    reads the student's token ids. A teacher with more ids than the student (Llemma's 32,016 over TinyLlama's
    32,000: the first 32,000 are the same pieces) has its logits cut to the student's ids before its softmax
    (renormalized over the shared ids: the reference's option (a)). Also returns ``kl``: KL(p_T || p_S) = soft CE
    minus the teacher's entropy (reported, not trained on; the entropy is constant in the student's weights).
    """
    ce, labeled = _student_ce(student_logits, labels)
    vocab = student_logits.shape[-1]
    positions = labeled.reshape(-1).nonzero().squeeze(1)
    student_flat = student_logits[:, :-1].reshape(-1, vocab)
    hidden_flat = teacher_hidden[:, :-1].reshape(-1, teacher_hidden.shape[-1])
    soft_ce = student_logits.new_zeros((), dtype=torch.float32)
    entropy = torch.zeros((), device=student_logits.device)
    for begin in range(0, positions.numel(), chunk_size):
        chosen = positions[begin : begin + chunk_size]
        log_student = F.log_softmax(student_flat[chosen].float(), dim=-1)
        with torch.no_grad():
            log_teacher = F.log_softmax(teacher_head(hidden_flat[chosen])[:, :vocab].float(), dim=-1)
            entropy = entropy - (log_teacher.exp() * log_teacher).sum()
        soft_ce = soft_ce - (log_teacher.exp() * log_student).sum()
    count = max(positions.numel(), 1)
    soft_ce = soft_ce / count
    return {
        "total": (1 - kd_ratio) * ce + kd_ratio * soft_ce,
        "ce": ce.detach(),
        "soft_ce": soft_ce.detach(),
        "kl": (soft_ce - entropy / count).detach(),
    }


@torch.no_grad()
def teacher_top_k(
    hidden: torch.Tensor,
    head: Callable[[torch.Tensor], torch.Tensor],
    attention_mask: torch.Tensor,
    top_k: int,
    chunk_size: int = CHUNK_SIZE,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The teacher's next-token distribution at each real position, truncated: ``ids`` ``[B, M, K]`` and ``probs``
    ``[B, M, K]`` (fp32, the softmax of its logits at temperature 1, sorted, most probable first) of its ``top_k``
    most probable next tokens, and ``rest`` ``[B, M]``: the mass outside them (``1 - probs.sum(-1)``, at least 0).
    Position m's distribution is the one that predicts token m + 1 (the row's last predicts past it). Padding
    (``attention_mask == 0``) gets zeros. The logits are made ``chunk_size`` positions at a time."""
    batch, length = attention_mask.shape
    ids = torch.zeros(batch, length, top_k, dtype=torch.long, device=hidden.device)
    probs = torch.zeros(batch, length, top_k, dtype=torch.float32, device=hidden.device)
    rest = torch.zeros(batch, length, dtype=torch.float32, device=hidden.device)
    real = attention_mask.bool().reshape(-1).nonzero().squeeze(1)
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])
    flat_ids, flat_probs, flat_rest = ids.view(-1, top_k), probs.view(-1, top_k), rest.view(-1)
    for begin in range(0, real.numel(), chunk_size):
        at = real[begin : begin + chunk_size]
        distribution = F.softmax(head(flat_hidden[at]).float(), dim=-1)
        if top_k > distribution.shape[-1]:
            raise ValueError(f"top_k {top_k} is more than the teacher's {distribution.shape[-1]} logits")
        top = distribution.topk(top_k, dim=-1, sorted=True)
        flat_ids[at], flat_probs[at] = top.indices, top.values
        flat_rest[at] = (1 - top.values.sum(-1)).clamp(min=0)
    return ids, probs, rest


def cached_uld_loss(
    student_logits: torch.Tensor,
    labels: torch.Tensor,
    topk_probs: torch.Tensor,
    rest: torch.Tensor,
    teacher_mask: torch.Tensor,
    *,
    weight: float = 1.5,
    student_temperature: float = 1.0,
    skip_student_eos: bool = True,
    aligned_teacher_positions: torch.Tensor | None = None,
    chunk_size: int = CHUNK_SIZE,
) -> dict[str, torch.Tensor]:
    """``uld_loss`` (teacher temperature 1) from the teacher's cached distributions: ``topk_probs`` ``[B, M, K]``, its
    K largest probabilities at each position, sorted, and ``rest`` ``[B, M]``, the mass outside them
    (``teacher_top_k``, as scored shards store them). The pairs are ``uld_loss``'s, by position or through
    ``aligned_teacher_positions``.

    ULD's distance at a pair is ``sum_i |s_i - t_i|`` over the two distributions sorted in decreasing order (the
    shorter zero-padded). The first K terms are known exactly; past them the teacher's sorted probabilities are
    unknown but sum to ``r`` (``rest``), and the student's to ``S`` (its mass past its K largest), so their part
    ``T = sum_{i>=K} |s_i - t_i|`` lies in ``[|S - r|, S + r]``. It is taken as the middle, ``max(S, r)``, so that

        |cached ULD - live ULD| <= min(S, r) <= r       at each pair, hence over the mean of the pairs too,

    plus what storing the probabilities rounds (float16: at most 2^-11 of each value, so 2^-11 in all, and 2^-25 a
    value below float16's normal range; float32: 2^-24). With K the teacher's whole vocabulary, ``r`` is 0 and the two
    are equal. Returns ``total``, ``ce``, ``uld`` and ``uld_bound``: the mean over rows of the mean ``min(S, r)`` over
    the pairs, the bound on ``uld``'s truncation error."""
    ce, labeled = _student_ce(student_logits, labels)
    k = topk_probs.shape[-1]
    per_row, bounds = [], []
    for b in range(student_logits.shape[0]):
        student_at, teacher_at = _uld_pairs(b, labeled, teacher_mask, skip_student_eos, aligned_teacher_positions)
        distance = student_logits.new_zeros((), dtype=torch.float32)
        bound = torch.zeros((), device=student_logits.device)
        for begin in range(0, len(student_at), chunk_size):
            chunk = slice(begin, begin + chunk_size)
            student = F.softmax(student_logits[b, student_at[chunk]].float() / student_temperature, dim=-1)
            teacher, r = topk_probs[b, teacher_at[chunk]].float(), rest[b, teacher_at[chunk]].float()
            if k >= student.shape[-1]:  # the student's whole distribution within the known part
                top = F.pad(student.sort(dim=-1, descending=True).values, (0, k - student.shape[-1]))
                tail = torch.zeros_like(r)
            else:
                top = student.topk(k, dim=-1, sorted=True).values
                tail = 1 - top.sum(-1)
            distance = distance + (top - teacher).abs().sum() + torch.maximum(tail, r).sum()
            bound = bound + torch.minimum(tail.detach().clamp(min=0), r).sum()
        per_row.append(distance / max(len(student_at), 1))
        bounds.append(bound / max(len(student_at), 1))
    uld = torch.stack(per_row).mean()
    return {"total": ce + weight * uld, "ce": ce.detach(), "uld": uld.detach(),
            "uld_bound": torch.stack(bounds).mean()}


def projected_kd_loss(
    student_logits: torch.Tensor,
    labels: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_probs: torch.Tensor,
    rest: torch.Tensor,
    teacher_positions: torch.Tensor,
    vocabulary_map: torch.Tensor,
    *,
    kd_ratio: float = 0.5,
    chunk_size: int = CHUNK_SIZE,
) -> dict[str, torch.Tensor]:
    """Cross-vocabulary KD from the teacher's cached distributions, projected onto the student's vocabulary:
    ``(1 - kd_ratio) x CE + kd_ratio x soft CE``, the CE over every labeled next token, the soft CE's mean over the
    covered ones.

    ``teacher_positions`` ``[B, N - 1]``: for student position i (predicting token i + 1), the teacher position whose
    distribution predicts the teacher token that starts where token i + 1 starts, or -1 (not covered: the
    tokenizers cut the text there otherwise). ``vocabulary_map`` ``[V_T]``: each teacher id's student id, -1 where
    none (``vocagno.teacher.projection.vocabulary_map``; ids past it are unmatched). The target at a covered position
    gives each student id the teacher probability of the cached ids mapped to it, and the rest of the teacher's mass
    (its unmapped cached ids and the mass outside its top K, ``u``) to one bucket: every student id it gave nothing.
    The soft CE is ``- sum_s p(s) log p_S(s) - u log p_S(bucket)``, where ``p_S(bucket)`` is the student's probability
    of those ids together (a bucket that is empty takes nothing). Also returns ``coverage`` (covered over labeled
    positions) and ``mapped_mass`` (the mean teacher mass mapped at a covered position)."""
    ce, labeled = _student_ce(student_logits, labels)
    vocab = student_logits.shape[-1]
    covered = (labeled & (teacher_positions >= 0)).nonzero()
    student_flat = student_logits[:, :-1].reshape(-1, vocab)
    flat = covered[:, 0] * (student_logits.shape[1] - 1) + covered[:, 1]
    teacher_at = teacher_positions[covered[:, 0], covered[:, 1]]
    soft_ce = student_logits.new_zeros((), dtype=torch.float32)
    mapped_mass = torch.zeros((), device=student_logits.device)
    for begin in range(0, len(flat), chunk_size):
        chunk = slice(begin, begin + chunk_size)
        rows, at = covered[chunk, 0], teacher_at[chunk]
        ids, probs, r = topk_ids[rows, at], topk_probs[rows, at].float(), rest[rows, at].float()
        inside = ids < vocabulary_map.numel()
        student_ids = torch.where(inside, vocabulary_map[ids.clamp(max=vocabulary_map.numel() - 1)], -1)
        mapped = student_ids >= 0
        logits = student_flat[flat[chunk]].float()
        log_student = F.log_softmax(logits, dim=-1)
        soft_ce = soft_ce - (probs * log_student.gather(-1, student_ids.clamp(min=0)) * mapped).sum()
        given = torch.zeros(len(rows), vocab + 1, dtype=torch.bool, device=logits.device)
        # An id stored with probability 0 (float16's underflow) gives its student id nothing: that id stays in the bucket.
        given.scatter_(1, torch.where(mapped & (probs > 0), student_ids, vocab), True)
        bucket = logits.masked_fill(given[:, :vocab], float("-inf")).logsumexp(-1) - logits.logsumexp(-1)
        unmapped = r + (probs * ~mapped).sum(-1)
        takes = (unmapped > 0) & torch.isfinite(bucket)
        soft_ce = soft_ce - torch.where(takes, unmapped * bucket, 0).sum()
        mapped_mass = mapped_mass + (probs * mapped).sum()
    count = max(len(flat), 1)
    soft_ce = soft_ce / count
    return {
        "total": (1 - kd_ratio) * ce + kd_ratio * soft_ce,
        "ce": ce.detach(),
        "soft_ce": soft_ce.detach(),
        "coverage": torch.tensor(len(flat) / max(int(labeled.sum()), 1), device=student_logits.device),
        "mapped_mass": mapped_mass / count,
    }
