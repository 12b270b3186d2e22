"""The keys of a batch, defined once: ``TeacherGuidedCollator`` writes them; the algorithms, metrics, loggers and
diagnostics read them. ``input_ids``, ``attention_mask`` and ``labels`` are Hugging Face's own.

    ALIGN_START, ALIGN_END     [B, N]  teacher positions aligned to student token i (start == end: unmapped)
    TOKEN_BYTES                [B, N]  UTF-8 bytes of the text each student token is the first to cover
    SPECIAL_TOKENS             [B, N]  True at specials (BOS, separators: empty spans), which hold no text
    TEACHER_INPUT_IDS, TEACHER_ATTENTION_MASK  [B, M]  the teacher's tokens
    TEACHER_LOSS               [B, M]  the teacher's loss of each of its tokens: from scored shards (the column of
                                       that name; NaN: none), or put there by ``VocAgnoLM``'s global-batch selection
    TOPK_IDS, TOPK_PROBS       [B, M, K]  shards scored with ``--top-k K``: at teacher position m, the ids and
                                       probabilities of the teacher's K most probable next tokens (sorted, decreasing;
                                       0 at padding), also their columns' names (``vocagno.data.shards``)
    TOPK_REST                  [B, M]  the probability mass outside them
    STARTS_TOGETHER            [B, N]  True where student token i's first character is the first of teacher token
                                       ``ALIGN_START[i]``: the two tokenizers cut the text there alike
    STREAM                     [B]     a mixture's: the stream each row was drawn from
    SELECTED                   [B, N - 1]  the student tokens the global-batch selection kept

A further teacher of a set keeps its side under ``teacher_key(NAME, ...)``: ``input_ids``, ``attention_mask``,
``ALIGN_START``, ``ALIGN_END`` and ``TEACHER_LOSS``.
"""

from __future__ import annotations

__all__ = ["ALIGN_END", "ALIGN_START", "SELECTED", "SPECIAL_TOKENS", "STARTS_TOGETHER", "STREAM",
           "TEACHER_ATTENTION_MASK", "TEACHER_INPUT_IDS", "TEACHER_LOSS", "TOKEN_BYTES", "TOPK_IDS", "TOPK_PROBS",
           "TOPK_REST", "teacher_key"]

ALIGN_START, ALIGN_END = "align_start", "align_end"
TOKEN_BYTES, SPECIAL_TOKENS = "token_bytes", "special_tokens"
TEACHER_INPUT_IDS, TEACHER_ATTENTION_MASK = "teacher_input_ids", "teacher_attention_mask"
TEACHER_LOSS = "teacher_loss"  # also the name of its column in scored shards (vocagno.data.shards)
TOPK_IDS, TOPK_PROBS, TOPK_REST = "teacher_topk_ids", "teacher_topk_probs", "teacher_topk_rest"
STARTS_TOGETHER = "starts_together"
STREAM = "stream"
SELECTED = "vocagno_selected"


def teacher_key(name: str, what: str) -> str:
    """Where teacher ``name`` of a set (``vocagno.teacher.several``) keeps ``what`` of its side in a batch."""
    return f"teachers.{name}.{what}"
