"""Token-level lexical alignment between two tokenizations of the same text.

Offsets are character spans ``[s, e)`` (Python ``str`` indices), one row per token, as HF fast tokenizers return
them with ``return_offsets_mapping=True``. Student token ``i`` maps to the teacher tokens ``start[i]:end[i]``: the
contiguous run of teacher tokens whose spans overlap its span. ``start[i] == end[i]`` (always ``0, 0``) means
*unmapped*: the token has an empty span (BOS/EOS, other specials, padding) or overlaps no teacher token (a character
that the teacher's normalizer folded away, such as a combining mark under Qwen's NFC).

Valid offsets: integers, ``0 <= s <= e``, and over the tokens with non-empty spans both the starts and the ends are
non-decreasing (tokens come in text order; several tokens may share one span, as byte pieces of one character do).
Empty spans may stand anywhere: specials get ``(0, 0)`` from HF tokenizers wherever they are.

Two implementations of one algorithm: ``align`` (numpy, one sequence, for data loaders) and ``align_batch`` (torch,
padded batches, on the training device). ``align_reference`` is the definition in plain Python that both are tested
against.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

__all__ = [
    "align",
    "align_batch",
    "align_reference",
    "alignment_quality",
    "check_alignment",
    "check_offsets",
    "chunk_align",
    "chunk_overlap",
    "uncovered_characters",
    "VocabOverlap",
    "vocab_overlap",
]


_NO_START = np.iinfo(np.int64).max


def _columns(offsets, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Check offsets; return starts and ends, and the sorted columns the searches run on.

    An empty span would break the order binary search needs, so in the sorted columns it takes the running max of the
    ends before it and the running min of the starts after it: no search ever stops on one. Offsets are sorted exactly
    when every non-empty span keeps its own values there.
    """
    offsets = np.asarray(offsets)
    if offsets.size == 0:
        offsets = offsets.reshape(0, 2).astype(np.int64)  # the offsets of empty text: [] from a tokenizer
    if offsets.ndim != 2 or offsets.shape[1] != 2:
        raise ValueError(f"{name}: offsets must have shape (n, 2), got {offsets.shape}")
    if offsets.dtype.kind not in "iu":
        raise ValueError(f"{name}: offsets must be integers, got dtype {offsets.dtype}")
    starts, ends = np.ascontiguousarray(offsets.T, dtype=np.int64)
    if len(starts) and (starts.min() < 0 or (ends - starts).min() < 0):
        if (starts < 0).any():
            raise ValueError(f"{name}: negative offset at token {int(np.argmax(starts < 0))}")
        i = int(np.argmax(starts > ends))
        raise ValueError(f"{name}: span start > end at token {i}: {[int(starts[i]), int(ends[i])]}")
    empty = starts == ends
    sorted_ends = np.maximum.accumulate(np.where(empty, 0, ends))
    sorted_starts = np.minimum.accumulate(np.where(empty, _NO_START, starts)[::-1])[::-1]
    if (((sorted_ends != ends) | (sorted_starts != starts)) & ~empty).any():
        raise ValueError(f"{name}: offsets are not sorted: non-empty spans must come in text order")
    return starts, ends, sorted_starts, sorted_ends


def check_offsets(offsets, name: str = "offsets") -> None:
    """Raise ``ValueError`` unless ``offsets`` are what ``align`` takes: ``(n, 2)`` integers, each span
    ``start <= end``, none negative, the non-empty ones in text order."""
    _columns(offsets, name)


def align(student_offsets, teacher_offsets) -> tuple[np.ndarray, np.ndarray]:
    """Map each student token to the range of teacher tokens overlapping it; O(N log M).

    Returns int64 arrays ``start, end`` of shape (N,); unmapped tokens get ``start == end == 0``.
    """
    s, e, _, _ = _columns(student_offsets, "student_offsets")
    _, _, sorted_starts, sorted_ends = _columns(teacher_offsets, "teacher_offsets")
    start = np.searchsorted(sorted_ends, s, side="right")  # first teacher token ending after s
    end = np.searchsorted(sorted_starts, e, side="left")  # one past the last teacher token starting before e
    mapped = (s < e) & (start < end)
    return np.where(mapped, start, 0), np.where(mapped, end, 0)


def align_batch(student_offsets: torch.Tensor, teacher_offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``align`` for padded batches on any device: ``[B, N, 2]`` and ``[B, M, 2]`` -> ``start, end`` of ``[B, N]``.

    Padding is any empty span (``(0, 0)`` is usual). Row ``b`` equals ``align(student[b], teacher[b])``.
    """
    if student_offsets.dim() == 3 and teacher_offsets.dim() == 3 and len(student_offsets) != len(teacher_offsets):
        raise ValueError(f"batch sizes differ: student {len(student_offsets)}, teacher {len(teacher_offsets)}")
    s, e, _, _ = _columns_batch(student_offsets, "student_offsets")
    _, _, sorted_starts, sorted_ends = _columns_batch(teacher_offsets, "teacher_offsets")
    start = torch.searchsorted(sorted_ends, s, right=True)
    end = torch.searchsorted(sorted_starts, e, right=False)
    mapped = (s < e) & (start < end)
    zero = torch.zeros_like(start)
    return torch.where(mapped, start, zero), torch.where(mapped, end, zero)


def _columns_batch(offsets: torch.Tensor, name: str) -> tuple[torch.Tensor, ...]:
    """``_columns`` for ``[B, n, 2]`` tensors, with one host sync for all the checks."""
    if offsets.dim() != 3 or offsets.shape[-1] != 2:
        raise ValueError(f"{name}: offsets must have shape (batch, n, 2), got {tuple(offsets.shape)}")
    if offsets.is_floating_point() or offsets.is_complex() or offsets.dtype == torch.bool:
        raise ValueError(f"{name}: offsets must be integers, got dtype {offsets.dtype}")
    starts, ends = offsets.long().unbind(-1)
    starts, ends = starts.contiguous(), ends.contiguous()
    if offsets.shape[1] == 0:
        return starts, ends, starts, ends
    empty = starts == ends
    sorted_ends = torch.cummax(ends.masked_fill(empty, 0), dim=1).values
    sorted_starts = torch.cummin(starts.masked_fill(empty, _NO_START).flip(1), dim=1).values.flip(1)
    unsorted = ((sorted_ends != ends) | (sorted_starts != starts)) & ~empty
    checks = torch.stack([(starts < 0).any(), (starts > ends).any(), unsorted.any()])
    negative, reversed_span, unsorted = checks.tolist()
    if negative:
        raise ValueError(f"{name}: negative offset")
    if reversed_span:
        raise ValueError(f"{name}: span start > end")
    if unsorted:
        raise ValueError(f"{name}: offsets are not sorted: non-empty spans must come in text order")
    return starts, ends, sorted_starts.contiguous(), sorted_ends


def align_reference(student_offsets, teacher_offsets) -> tuple[list[int], list[int]]:
    """The definition, in plain Python, O(N * M): the first and one-past-last teacher token overlapping each
    student token's span; ``(0, 0)`` where none does or the student span is empty."""
    starts, ends = [], []
    for s, e in student_offsets:
        hits = [j for j, (ts, te) in enumerate(teacher_offsets) if ts < te and ts < e and s < te] if s < e else []
        starts.append(hits[0] if hits else 0)
        ends.append(hits[-1] + 1 if hits else 0)
    return starts, ends


def alignment_quality(student_offsets, teacher_offsets, start, end) -> tuple[np.ndarray, np.ndarray]:
    """Per student token: IoU and IoS of its characters with the characters of its teacher tokens.

    IoS (intersection over the student token's characters) is 1 when the teacher tokens cover every character of
    the student token. Both are NaN for unmapped tokens.
    """
    s, e, _, _ = _columns(student_offsets, "student_offsets")
    t_start, t_end, _, nonempty_ends = _columns(teacher_offsets, "teacher_offsets")
    start, end = np.asarray(start, dtype=np.int64), np.asarray(end, dtype=np.int64)
    n_chars = int(max(e.max(initial=0), t_end.max(initial=0)))
    # Every teacher token over a character of a student token lies in that token's range, so counting the characters
    # under any teacher token counts the intersection exactly.
    covered = np.concatenate([[0], np.cumsum(_coverage(t_start, t_end, n_chars))])
    intersection = covered[e] - covered[s]
    # Union length of the spans of teacher tokens a..b-1: spans are sorted, so token j adds what reaches past the
    # furthest end before it.
    furthest_before = np.concatenate([[0], nonempty_ends[:-1]]) if len(t_end) else t_end
    fresh = np.maximum(0, t_end - np.maximum(t_start, furthest_before))
    fresh_prefix = np.concatenate([[0], np.cumsum(fresh)])
    mapped = start < end
    a = np.where(mapped, start, 0)
    first_len = (t_end[a] - t_start[a]) if len(t_end) else np.zeros_like(a)
    teacher_chars = first_len + fresh_prefix[np.where(mapped, end, 0)] - fresh_prefix[np.minimum(a + 1, len(t_end))]
    student_chars = e - s
    with np.errstate(invalid="ignore", divide="ignore"):
        iou = intersection / (student_chars + teacher_chars - intersection)
        ios = intersection / student_chars
    return np.where(mapped, iou, np.nan), np.where(mapped, ios, np.nan)


def uncovered_characters(student_offsets, teacher_offsets) -> int:
    """How many characters under student tokens no teacher token covers: what the teacher's normalizer folded away
    (a combining mark under Qwen's NFC, say). 0 for tokenizers that keep every character."""
    s, e, _, _ = _columns(student_offsets, "student_offsets")
    t_start, t_end, _, _ = _columns(teacher_offsets, "teacher_offsets")
    n_chars = int(max(e.max(initial=0), t_end.max(initial=0)))
    return int((_coverage(s, e, n_chars) & ~_coverage(t_start, t_end, n_chars)).sum())


def _coverage(starts: np.ndarray, ends: np.ndarray, n_chars: int) -> np.ndarray:
    """Boolean mask of the characters ``0 .. n_chars - 1`` that lie under at least one span."""
    delta = np.bincount(starts, minlength=n_chars + 1) - np.bincount(ends, minlength=n_chars + 1)
    return np.cumsum(delta)[:-1] > 0


@dataclass(frozen=True)
class VocabOverlap:
    shared: int
    teacher_vocab_size: int

    @property
    def fraction(self) -> float:
        return self.shared / self.teacher_vocab_size

    def __str__(self) -> str:
        return f"{self.shared:,} / {self.teacher_vocab_size:,} = {self.fraction:.2%} of the teacher's vocabulary"


def vocab_overlap(student_tokenizer, teacher_tokenizer) -> VocabOverlap:
    """Share of the teacher's raw vocabulary strings (its model vocabulary, added and special tokens aside) that are
    also strings of the student's vocabulary. Qwen2.5 vs Llama-2: 9,587 / 151,643 = 6.32%."""
    student = _model_vocab(student_tokenizer)
    teacher = _model_vocab(teacher_tokenizer)
    return VocabOverlap(shared=len(teacher & student), teacher_vocab_size=len(teacher))


def _model_vocab(tokenizer) -> set[str]:
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)  # a transformers fast tokenizer or a raw one
    return set(backend.get_vocab(with_added_tokens=False))


# ------------------------------------------------------------------------------------------------------ chunk level
# The paper's Table 2 baseline, as reconstructed in ../shared/reference/baselines-and-evaluation.md §4.3 (not the
# paper's text): each side of a row is cut into n chunks by token count, chunk k paired with chunk k. Only a cut by
# token count, done on each side on its own, lets the overlap fall as n grows, as the paper's Figures 3 and 6 show.


def _chunk_size(length, num_chunks: int):
    """Tokens per chunk when ``length`` tokens are cut into ``num_chunks`` chunks (the last one shorter)."""
    return (length + num_chunks - 1) // num_chunks


ALIGNMENTS = ("token", "chunk")  # student tokens to teacher tokens by their text, or chunk to chunk (Table 2)
ALIGNMENT, NUM_CHUNKS = "token", 1  # the defaults


def check_alignment(alignment: str, num_chunks: int) -> None:
    """Refuse alignment options ``VocAgnoLM`` doesn't know (``token``; ``chunk``, in ``num_chunks``), naming them."""
    if alignment not in ALIGNMENTS:
        raise ValueError(f"alignment must be 'token' or 'chunk', got {alignment!r}")
    if isinstance(num_chunks, bool) or not isinstance(num_chunks, int) or num_chunks < 1:
        raise ValueError(f"num_chunks must be a positive integer, got {num_chunks!r}")


def chunk_align(
    student_lengths: torch.Tensor, teacher_lengths: torch.Tensor, num_chunks: int, width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunk-level ``start, end`` ``[B, width]``: a row's ``N`` student tokens in chunks of ``ceil(N / n)``, its ``M``
    teacher tokens in chunks of ``ceil(M / n)``; every student token of chunk k gets teacher chunk k's range.
    Positions past a row's length are unmapped (``0, 0``)."""
    if num_chunks < 1:
        raise ValueError(f"num_chunks must be at least 1, got {num_chunks}")
    positions = torch.arange(width, device=student_lengths.device).unsqueeze(0)
    n, m = student_lengths.long().unsqueeze(1), teacher_lengths.long().unsqueeze(1)
    chunk = positions // _chunk_size(n, num_chunks).clamp(min=1)
    start = torch.minimum(chunk * _chunk_size(m, num_chunks), m)
    end = torch.minimum((chunk + 1) * _chunk_size(m, num_chunks), m)
    inside = positions < n
    return torch.where(inside, start, 0), torch.where(inside, end, 0)


def chunk_overlap(student_offsets, teacher_offsets, num_chunks: int) -> tuple[float, float]:
    """Mean IoU and IoS over the chunks of one sequence cut as ``chunk_align`` cuts it: the characters under a
    student chunk's tokens against those under its teacher chunk's (IoS: over the student chunk's). Chunks whose
    student tokens cover no character are left out."""
    s_offsets, t_offsets = np.asarray(student_offsets, np.int64), np.asarray(teacher_offsets, np.int64)
    n_chars = int(max(s_offsets[:, 1].max(initial=0), t_offsets[:, 1].max(initial=0)))
    s_size, t_size = _chunk_size(len(s_offsets), num_chunks), _chunk_size(len(t_offsets), num_chunks)

    def characters(offsets: np.ndarray) -> np.ndarray:
        covered = np.zeros(n_chars + 1, np.int64)
        np.add.at(covered, offsets[:, 0], 1)
        np.add.at(covered, offsets[:, 1], -1)
        return np.cumsum(covered)[:n_chars] > 0

    ious, ioss = [], []
    for k in range(_chunk_size(len(s_offsets), max(s_size, 1))):
        student = characters(s_offsets[k * s_size : (k + 1) * s_size])
        teacher = characters(t_offsets[k * t_size : (k + 1) * t_size])
        if student.any():
            ious.append((student & teacher).sum() / (student | teacher).sum())
            ioss.append((student & teacher).sum() / student.sum())
    return float(np.mean(ious)), float(np.mean(ioss))
