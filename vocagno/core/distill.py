"""The paper's logit-distillation baselines as plain functions: ULD (any two vocabularies) and KLD (one vocabulary).

Definitions and what is confirmed: ``../shared/reference/baselines-and-evaluation.md`` §1 (ULD) and §2 (KLD).
Both take the student's logits per input position (position i predicts token i + 1, Hugging Face's convention) and
the teacher's last hidden states with its LM head, whose logits are made ``chunk_size`` positions at a time: the
teacher's fp32 logits over its whole vocabulary never exist for the whole batch.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from vocagno.core.loss import CHUNK_SIZE, next_token_cross_entropy

__all__ = ["uld_loss", "kld_loss"]


def _student_ce(student_logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean cross-entropy over the labeled next tokens (Hugging Face's loss), and where they are ``[B, N - 1]``."""
    labeled = labels[:, 1:] != -100
    ce = next_token_cross_entropy(student_logits, labels)
    return (ce * labeled).sum() / labeled.sum().clamp(min=1), labeled


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
        if aligned_teacher_positions is None:  # by position, up to the shorter side
            size = min(int(labeled[b].sum()) - int(skip_student_eos), int(teacher_mask[b].sum()) - 1)
            student_at = teacher_at = torch.arange(max(size, 0), device=labels.device)
        else:
            student_at = (labeled[b] & (aligned_teacher_positions[b] >= 0)).nonzero().squeeze(1)
            teacher_at = aligned_teacher_positions[b, student_at]
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
