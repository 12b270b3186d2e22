"""A teacher's vocabulary projected onto a student's: which student token stands for the same text as each teacher
token, the rule cross-vocabulary KD (``vocagno.core.distill.projected_kd_loss``) moves the teacher's probabilities by.

The rule: teacher token t goes to the student token whose bytes are t's bytes, each token read as the text it stands
for (``vocagno.teacher.side.StudentText``: SentencePiece's "▁" is a space and its ``<0xNN>`` pieces one byte each;
byte-level BPE through GPT-2's byte-to-unicode table, so Qwen2.5's "Ġthe" is Llama-2's "▁the"), as TRL's GOLD matches
two vocabularies by their tokens' text. Where the student has several tokens of those bytes (Llama-2's "▁" and its
byte piece ``<0x20>`` are both a space), the one its tokenizer writes is taken: a piece over a byte piece, then the
lowest id. Specials (BOS, EOS, pad: no text) and teacher tokens of bytes no student token has go nowhere (-1).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from vocagno.core.tokenization import as_tokenizer
from vocagno.teacher.side import StudentText

__all__ = ["VocabularyMap", "vocabulary_map"]


@dataclass(frozen=True)
class VocabularyMap:
    """``student_ids[t]``: the student id of teacher id t, or -1; ``matched``: how many teacher ids have one."""

    student_ids: torch.Tensor
    matched: int

    def __str__(self) -> str:
        size = self.student_ids.numel()
        return f"{self.matched:,} of the teacher's {size:,} tokens have a student token of the same text"


def _byte_pieces(tokenizer) -> set[int]:
    """The ids of SentencePiece's byte pieces (``<0x20>``), which its tokenizer writes only for bytes no piece has."""
    return {i for piece, i in tokenizer.get_vocab().items()
            if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">")}


def vocabulary_map(teacher_tokenizer, student_tokenizer) -> VocabularyMap:
    """Each teacher id's student id by the module's rule (tokenizers as objects, names or folders)."""
    teacher_tok, student_tok = as_tokenizer(teacher_tokenizer), as_tokenizer(student_tokenizer)
    teacher, student = StudentText(teacher_tok), StudentText(student_tok)
    byte_pieces = _byte_pieces(student_tok)
    by_bytes: dict[bytes, int] = {}
    # Byte pieces first, then pieces in decreasing id order: the last written wins, a piece over a byte piece and
    # then the lowest id.
    order = sorted(range(len(student.token_bytes)), key=lambda i: (i not in byte_pieces, -i))
    for i in order:
        if student.token_bytes[i] and not student.special[i]:
            by_bytes[student.token_bytes[i]] = i
    ids = np.full(len(teacher.token_bytes), -1, dtype=np.int64)
    for t, text in enumerate(teacher.token_bytes):
        if text and not teacher.special[t]:
            ids[t] = by_bytes.get(text, -1)
    return VocabularyMap(torch.from_numpy(ids), int((ids >= 0).sum()))
