"""The teacher side of a batch that has only student tokens: text from the student ids, the teacher's tokens of it.

For recipes whose loaders give student ``input_ids`` and nothing else (llm-foundry's ``text`` loader on a token MDS,
any Composer recipe), ``TeacherSide`` turns such a batch into what ``vocagno.data.dataset.TeacherGuidedCollator`` gives from
shards, on the CPU:

1. **Text with offsets** (``StudentText``): each student id stands for bytes (SentencePiece pieces with "▁" as a
   space and ``<0xNN>`` byte pieces; byte-level BPE through its byte-to-unicode table); a row's bytes, decoded,
   are its text, and each token spans the characters its bytes touch (the four byte pieces of an emoji all span
   it, as a fast tokenizer's offsets do). Specials (BOS, EOS, pad) are no text: empty spans, unmapped. The "▁"
   a SentencePiece tokenizer puts before a document's first word is its dummy prefix, not text: dropped after a
   special. Bytes that are no whole UTF-8 character (a row cut inside one) are no text either: tokens made only
   of them get empty spans.
2. **The teacher's tokens** of the text between the student's specials, each piece on its own, in the converter's
   row layout: the teacher's BOS first (when it adds one), its end-of-text token where the student's EOS ends a
   document, its BOS where the student's BOS starts one. Text after a student special starts a document; the text
   at the row's start goes on from the document the row was cut from (a SentencePiece teacher tokenizes it without
   its dummy prefix).
3. **Alignment** and the rest of the batch: the collator's, on these rows.

Where the result differs from the converter's for the same text: the converter tokenizes whole documents, so at a
row's two ends its teacher tokens run past the row's characters; here the teacher sees only the row's text (a word
cut at the row's end is tokenized as cut). A character cut by the row's edge is no text here; the converter has
the whole character. And a BOS starts a document here, as in llm-foundry's concatenated rows, while the converter
starts every row with the student's BOS mid-document: read here, such a row's first "▁" would be a dummy prefix.
Shards made by the converter stay the faster path: tokenized once, not at every step.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import torch
from transformers.models.gpt2.tokenization_gpt2 import bytes_to_unicode

from vocagno.data.dataset import TeacherGuidedCollator
from vocagno.data.shards import document_separator, tokenizer_info, vocabulary
from vocagno.core.tokenization import described, has_dummy_prefix, panics_refused, text_tokenizers
from vocagno.data.batch import (ALIGN_END, ALIGN_START, SPECIAL_TOKENS, TEACHER_ATTENTION_MASK, TEACHER_INPUT_IDS,
    TOKEN_BYTES)

__all__ = ["StudentText", "TeacherSide", "WithTeacherSide", "unpack_teacher_side"]


class StudentText:
    """What text each id of a fast tokenizer's vocabulary stands for, and the text of a row of ids.

    Args:
        tokenizer: a Hugging Face fast tokenizer with a SentencePiece-style (``▁``, byte fallback) or a byte-level
            decoder; anything else is refused, naming the tokenizer.
    """

    def __init__(self, tokenizer):
        backend = tokenizer.backend_tokenizer
        decoder = {} if backend.decoder is None else json.loads(backend.decoder.__getstate__())  # not the whole 7 MB
        kinds = {d.get("type") for d in decoder.get("decoders", [decoder])}
        vocab, _ = vocabulary(tokenizer)
        self.token_bytes: list[bytes] = [b""] * (max(vocab.values()) + 1)
        self.special = np.zeros(len(self.token_bytes), dtype=bool)
        if "ByteLevel" in kinds:
            alphabet = {char: byte for byte, char in bytes_to_unicode().items()}  # GPT-2's byte-to-unicode table
            for piece, i in vocab.items():
                self.token_bytes[i] = bytes(alphabet[c] for c in piece) if all(c in alphabet for c in piece) else b""
        elif "ByteFallback" in kinds or "Replace" in kinds:
            for piece, i in vocab.items():
                is_byte = len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">")
                self.token_bytes[i] = bytes([int(piece[3:5], 16)]) if is_byte else piece.replace("▁", " ").encode()
        else:
            raise ValueError(
                f"tokenizer {tokenizer.name_or_path!r}: its decoder ({', '.join(sorted(map(str, kinds)))}) is neither "
                "SentencePiece-style nor byte-level, so the text of its tokens can't be read back"
            )
        for added in tokenizer.added_tokens_decoder.items():
            i, token = added
            if i < len(self.token_bytes):
                self.token_bytes[i] = b"" if token.special else token.content.encode()
                self.special[i] = token.special
        self.dummy_prefix = has_dummy_prefix(backend)
        self.eos_id = tokenizer.convert_tokens_to_ids(document_separator(tokenizer))
        self.bos_id = tokenizer.bos_token_id

    def row(self, ids: np.ndarray) -> tuple[str, np.ndarray]:
        """The text of a row of ids and each token's ``[s, e)`` character span in it (empty for specials)."""
        special = self.special[ids]
        pieces = [self.token_bytes[i] for i in ids]
        if self.dummy_prefix:  # a document's first word: its "▁" is the dummy prefix, not a space of the text
            for k in np.flatnonzero(special[:-1]) + 1:
                if pieces[k].startswith(b" "):
                    pieces[k] = pieces[k][1:]
        lengths = np.fromiter(map(len, pieces), np.int64, len(pieces))
        byte_end = np.cumsum(lengths)
        byte_start = byte_end - lengths
        chars = b"".join(pieces).decode("utf-8", "surrogateescape")
        codes = np.frombuffer(chars.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        broken = (codes >= 0xDC80) & (codes <= 0xDCFF)  # a byte of no whole UTF-8 character, escaped
        sizes = np.where(broken, 1, 1 + (codes >= 0x80) + (codes >= 0x800) + (codes >= 0x10000))
        char_start = np.cumsum(sizes) - sizes
        start = np.searchsorted(char_start, byte_start, side="right") - 1  # the character holding the first byte
        end = np.searchsorted(char_start, byte_end, side="left")  # characters begun before the last byte ends
        empty = lengths == 0
        start[empty] = end[empty]
        if broken.any():  # drop them from the text; a token holding only such bytes spans nothing
            kept_before = np.concatenate([[0], np.cumsum(~broken)])
            start, end = kept_before[start], kept_before[end]
            chars = "".join(c for c, bad in zip(chars, broken) if not bad)
        return chars, np.stack([start, end], axis=1)


class TeacherSide:
    """Makes a batch of student ``input_ids`` (``attention_mask`` optional, right padding) into a
    ``TeacherGuidedCollator`` batch: the module docstring says how. Keys the batch has (``labels``, ...) are kept.

    Args:
        student_tokenizer, teacher_tokenizer: Hugging Face fast tokenizers.
        teacher_seq_len: as ``TeacherGuidedCollator``'s.
    """

    def __init__(self, student_tokenizer, teacher_tokenizer, teacher_seq_len: int | None = None):
        self.student = StudentText(student_tokenizer)
        self.teacher = text_tokenizers(teacher_tokenizer.backend_tokenizer)  # (document start, continuing)
        self.teacher_name = teacher_tokenizer.name_or_path  # what a refusal names
        info = tokenizer_info(teacher_tokenizer, teacher_tokenizer.name_or_path)
        self.teacher_eot, self.teacher_bos = info.separator_id, info.bos_id
        pad = teacher_tokenizer.pad_token_id
        self.collator = TeacherGuidedCollator(
            student_pad_id=0, teacher_pad_id=info.separator_id if pad is None else pad, teacher_seq_len=teacher_seq_len)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        ids = batch["input_ids"].cpu()
        if ids.numel() and (int(ids.max()) >= len(self.student.token_bytes) or int(ids.min()) < 0):
            raise ValueError(f"student input_ids from {int(ids.min())} to {int(ids.max())}, but the student tokenizer "
                             f"has {len(self.student.token_bytes)} ids: the loader's tokens are not this tokenizer's")
        mask = batch["attention_mask"].cpu().bool() if "attention_mask" in batch else torch.ones_like(ids, dtype=bool)
        lengths = mask.sum(1)
        if not torch.equal(mask, torch.arange(ids.shape[1]) < lengths[:, None]):
            raise ValueError("VocAgnoLM makes teacher tokens for right-padded rows only; this batch is padded left")
        made = self.collator([self.sample(row[:n].numpy()) for row, n in zip(ids, lengths.tolist())])
        out = dict(batch)
        for key, value in made.items():
            if key in ("input_ids", "attention_mask") or key in batch:  # the batch's own (labels with its masking)
                continue
            if not key.startswith("teacher_"):  # student-side: as wide as the batch, even when every row is padded
                value = _pad_to(value, ids.shape[1], -100 if key == "labels" else 0)
            out[key] = value.to(batch["input_ids"].device)
        return out

    def sample(self, ids: np.ndarray) -> dict[str, Any]:
        """One row as a ``TeacherGuidedDataset`` sample: student ids and offsets, teacher ids and offsets, text."""
        text, offsets = self.student.row(ids)
        teacher_ids: list[np.ndarray] = []
        teacher_offsets: list[np.ndarray] = []

        def special(token: int, at: int) -> None:
            teacher_ids.append(np.array([token]))
            teacher_offsets.append(np.array([[at, at]]))

        if self.teacher_bos is not None:
            special(self.teacher_bos, 0)
        # The text between the student's specials, piece by piece, each followed by the teacher's special for the
        # student's. A piece after a special starts a document; the first piece goes on from the document the row
        # was cut from.
        specials = np.flatnonzero(self.student.special[ids])
        bounds = [0, *(int(offsets[k, 0]) for k in specials), len(text)]
        encodings = self._encode([(text[a:b], n > 0) for n, (a, b) in enumerate(zip(bounds, bounds[1:]))])
        for n, encoding in enumerate(encodings):
            if encoding is not None:
                teacher_ids.append(np.asarray(encoding.ids, dtype=np.int64))
                teacher_offsets.append(np.asarray(encoding.offsets, dtype=np.int64).reshape(-1, 2) + bounds[n])
            if n < len(specials):
                token, at = int(ids[specials[n]]), bounds[n + 1]
                if token == self.student.eos_id:
                    special(self.teacher_eot, at)
                elif token == self.student.bos_id and self.teacher_bos is not None and n > 0:
                    special(self.teacher_bos, at)
        return {
            "text": text,
            "student_ids": torch.from_numpy(ids.astype(np.int64)),
            "student_offsets": torch.from_numpy(offsets),
            "teacher_ids": torch.from_numpy(np.concatenate(teacher_ids) if teacher_ids else np.zeros(0, np.int64)),
            "teacher_offsets": torch.from_numpy(
                np.concatenate(teacher_offsets) if teacher_offsets else np.zeros((0, 2), np.int64)),
        }

    def _encode(self, pieces: list[tuple[str, bool]]) -> list:
        out: list = [None] * len(pieces)
        for starts_document in (True, False):
            chosen = [i for i, (text, starts) in enumerate(pieces) if text and starts == starts_document]
            if chosen:
                tokenizer = self.teacher[0 if starts_document else 1]
                texts = [pieces[i][0] for i in chosen]
                with panics_refused(self.teacher_name, described(texts)):
                    encodings = tokenizer.encode_batch(texts, add_special_tokens=False)
                for i, encoding in zip(chosen, encodings):
                    out[i] = encoding
        return out


def _pad_to(tensor: torch.Tensor, width: int, value: int) -> torch.Tensor:
    padded = tensor.new_full((tensor.shape[0], width), value)
    padded[:, : tensor.shape[1]] = tensor
    return padded


class WithTeacherSide:
    """A loader's ``collate_fn`` that adds the teacher side to its batches of student tokens, in the loader's worker
    processes: ``VocAgnoLM`` puts it on a training loader with workers at FIT_START, so the training process no
    longer makes it. Batches that have a teacher side (``teacher_input_ids``) pass as they are.

    Args:
        collate_fn: the loader's own.
        teacher_side: a ``TeacherSide``.
        loader: the loader's name in errors (its dataset's class).
    """

    def __init__(self, collate_fn, teacher_side: TeacherSide, loader: str):
        self.collate_fn, self.teacher_side, self.loader = collate_fn, teacher_side, loader

    def __call__(self, samples: list) -> dict[str, Any]:
        batch = self.collate_fn(samples)
        if not isinstance(batch, dict) or TEACHER_INPUT_IDS in batch:
            return batch
        if "input_ids" not in batch:
            raise ValueError(f"the training loader ({self.loader}) gives batches with {sorted(batch)}: VocAgnoLM "
                             "needs the student's input_ids")
        try:
            made = self.teacher_side(batch)
        except ValueError as error:
            raise ValueError(f"the training loader ({self.loader}): {error}") from None
        return _pack(made) if torch.utils.data.get_worker_info() is not None else made


# A worker sends each tensor of a batch to the training process on its own (a shared-memory segment and a file
# descriptor each, ~0.25 ms apiece on a CPU): the teacher side's tensors travel as one, row-aligned (every row of
# each has the batch's rows), and ``unpack_teacher_side`` makes them views again at AFTER_DATALOADER.
PACKED = "vocagno_teacher_side"
PACKED_KEYS = (ALIGN_START, ALIGN_END, TOKEN_BYTES, SPECIAL_TOKENS, TEACHER_INPUT_IDS,
               TEACHER_ATTENTION_MASK)


def _pack(batch: dict[str, Any]) -> dict[str, Any]:
    """The ``PACKED_KEYS`` tensors of ``batch`` as one int64 tensor ``[rows, 2 x keys + widths]``: each key's width
    (-1: not in the batch) and whether it is bool, then the tensors side by side."""
    keys = [key for key in PACKED_KEYS if key in batch]
    rows = batch["input_ids"].shape[0]
    header = torch.tensor([[batch[key].shape[1] if key in batch else -1 for key in PACKED_KEYS] +
                           [int(key in batch and batch[key].dtype == torch.bool) for key in PACKED_KEYS]])
    packed = torch.cat([header.expand(rows, -1), *(batch[key].to(torch.int64) for key in keys)], dim=1)
    return {**{k: v for k, v in batch.items() if k not in keys}, PACKED: packed}


def unpack_teacher_side(batch: dict[str, Any]) -> dict[str, Any]:
    """A batch whose teacher side a loader worker packed, with its tensors as the collator made them."""
    if PACKED not in batch:
        return batch
    packed = batch.pop(PACKED)
    widths, is_bool = packed[0, : len(PACKED_KEYS)].tolist(), packed[0, len(PACKED_KEYS) : 2 * len(PACKED_KEYS)]
    begin = 2 * len(PACKED_KEYS)
    for key, width, flag in zip(PACKED_KEYS, widths, is_bool.tolist()):
        if width >= 0:
            part = packed[:, begin : begin + width]
            batch[key] = part.bool() if flag else part
            begin += width
    return batch
