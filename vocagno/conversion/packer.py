"""Documents packed into samples of the shard format (``vocagno.data.shards``): both tokenizations of each document,
concatenated with the tokenizers' separators, cut into rows of exactly ``seq_len`` student tokens.

``Encoder`` tokenizes documents with both tokenizers (each document once; a special token's string in a document is
tokenized as text, never as the special token); ``Packer`` cuts them into samples, each row started as its tokenizer
starts a text (with its BOS when it adds one). The converter (``vocagno.conversion.parts``) and the canaries
(``vocagno.diagnostics.canaries``) pack with them, so both make the rows training reads.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

import numpy as np

from vocagno.core.alignment import align, uncovered_characters
from vocagno.data.shards import TokenizerInfo, compact

__all__ = ["EncodedDocuments", "Encoder", "Packer"]


@dataclass
class EncodedDocuments:
    """Documents tokenized by both tokenizers (each once), concatenated with no separators yet.

    Offsets index into ``text``, the documents joined; ``doc_ends[d]`` is the character where document ``d`` ends, and
    ``student_lengths[d]`` / ``teacher_lengths[d]`` are its token counts. ``open_last``: the last document goes on in
    the next ``EncodedDocuments`` (a long document, fed in pieces cut at whitespace), so no separator follows it yet.
    """

    text: str
    doc_ends: np.ndarray
    student_ids: np.ndarray
    student_offsets: np.ndarray
    student_lengths: np.ndarray
    teacher_ids: np.ndarray
    teacher_offsets: np.ndarray
    teacher_lengths: np.ndarray
    open_last: bool = False


class Encoder:
    """Both tokenizers, encoding a batch of documents (each a list of pieces) into ``EncodedDocuments``.

    Document text is text: a special token's string in a document ("</s>", "<|endoftext|>") is tokenized as the
    characters it is, never as the special token (which would get a real id with a non-empty span, and end a
    document inside a document). ``special_strings`` counts such strings, for the summary.

    A piece that continues a document (``clean`` cut it for length, before a whitespace) is encoded without
    SentencePiece's dummy prefix, so the pieces give the tokens of the whole document, not an extra "▁" per cut.
    """

    def __init__(self, student, teacher):  # fast tokenizers, as load_tokenizer gives them
        from vocagno.core.tokenization import text_tokenizers

        self.names = (student.name_or_path, teacher.name_or_path)  # what a refusal names
        self.student = text_tokenizers(student.backend_tokenizer)
        self.teacher = text_tokenizers(teacher.backend_tokenizer)
        # One tokenizer on both sides (a Rho-1 reference model): tokenize once. The same content, the same copies.
        self.same = self.student is self.teacher
        specials = {str(t) for tok in (student, teacher) for t in tok.added_tokens_decoder.values() if t.special}
        self._special = re.compile("|".join(map(re.escape, sorted(specials, key=len, reverse=True))))

    def special_strings(self, docs: list[list[str]]) -> int:
        return sum(len(self._special.findall(piece)) for doc in docs for piece in doc)

    def encode(self, docs: list[list[str]], continues_first: bool = False, open_last: bool = False) -> EncodedDocuments:
        """``continues_first``: the first piece goes on from the last ``encode`` call's document; ``open_last``: the
        last document goes on in the next call (``piece_groups``). A tokenizer that panics on the pieces is refused
        (``panics_refused``)."""
        from vocagno.core.tokenization import described, panics_refused

        pieces = [piece for doc in docs for piece in doc]
        continues = [k > 0 or (d == 0 and continues_first) for d, doc in enumerate(docs) for k in range(len(doc))]
        piece_chars = np.array([len(p) for p in pieces], dtype=np.int64)
        piece_starts = np.cumsum(piece_chars) - piece_chars  # where each piece begins in the joined text
        first_piece = np.cumsum([0] + [len(doc) for doc in docs])[:-1]
        with panics_refused(self.names[0], described(pieces)):
            s_ids, s_offsets, s_lengths = _encode(self.student, pieces, continues, piece_starts)
        if self.same:
            t_ids, t_offsets, t_lengths = s_ids, s_offsets, s_lengths
        else:
            with panics_refused(self.names[1], described(pieces)):
                t_ids, t_offsets, t_lengths = _encode(self.teacher, pieces, continues, piece_starts)
        return EncodedDocuments(
            text="".join(pieces),
            doc_ends=np.add.reduceat(piece_chars, first_piece).cumsum(),
            student_ids=s_ids,
            student_offsets=s_offsets,
            student_lengths=np.add.reduceat(s_lengths, first_piece),
            teacher_ids=t_ids,
            teacher_offsets=t_offsets,
            teacher_lengths=np.add.reduceat(t_lengths, first_piece),
            open_last=open_last,
        )


def _encode(tokenizers, texts: list[str], continues: list[bool], starts: np.ndarray):
    """Ids, offsets into the joined texts, and token counts per text: ``tokenizers[1]`` for pieces that continue a
    document, ``tokenizers[0]`` for the others."""
    ids: list = [np.zeros(0, np.int64)] * len(texts)
    offsets: list = [np.zeros((0, 2), np.int64)] * len(texts)
    for continuing in (False, True):
        chosen = [i for i in range(len(texts)) if continues[i] == continuing]
        if not chosen:
            continue
        encodings = tokenizers[continuing].encode_batch([texts[i] for i in chosen], add_special_tokens=False)
        lengths = np.array([len(e.ids) for e in encodings], dtype=np.int64)
        total = int(lengths.sum())
        flat_ids = np.fromiter(itertools.chain.from_iterable(e.ids for e in encodings), np.int64, total)
        flat_offsets = np.fromiter(itertools.chain.from_iterable(
            itertools.chain.from_iterable(e.offsets for e in encodings)), np.int64, 2 * total).reshape(total, 2)
        bounds = np.cumsum(lengths)[:-1]
        for i, piece_ids, piece_offsets in zip(chosen, np.split(flat_ids, bounds), np.split(flat_offsets, bounds)):
            ids[i], offsets[i] = piece_ids, piece_offsets + starts[i]
    return np.concatenate(ids), np.concatenate(offsets), np.array([len(x) for x in ids], dtype=np.int64)


_NONE = np.iinfo(np.int64).max


class Packer:
    """Concatenate documents, each followed by the student's and the teacher's separator, and cut them into samples of
    exactly ``seq_len`` student tokens; each row starts with its tokenizer's BOS when it adds one
    (``TokenizerInfo.bos``).

    A sample's teacher tokens are those aligned to its student tokens (a student separator is aligned to the teacher
    separator of the same document), so a teacher token that straddles two samples' boundary is in both, and the
    sample's text reaches far enough to hold it. Student tokens left over at the end (fewer than ``seq_len``) are
    dropped and counted in ``tail_tokens`` once ``finish`` is called.
    """

    def __init__(self, seq_len: int, student: TokenizerInfo, teacher: TokenizerInfo):
        if seq_len < 2:
            raise ValueError(f"seq_len must be at least 2, got {seq_len}")
        self.seq_len = seq_len
        self.student_separator_id = student.separator_id
        self.teacher_separator_id = teacher.separator_id
        self.student_bos_id, self.teacher_bos_id = student.bos_id, teacher.bos_id
        self.tokens_per_row = seq_len - (student.bos_id is not None)  # student tokens of the text in each row
        self.folded_characters = 0  # characters under student tokens that no teacher token covers
        self.tail_tokens = 0
        # Where each sample's text begins in the documents added so far (all their text, joined): for a caller that
        # knows what each character is (vocagno.selection labels canary documents' tokens by it).
        self.text_starts: list[int] = []
        self._dropped_characters = 0
        self._text = ""
        self._s_ids = np.zeros(0, np.int64)
        self._s_offsets = np.zeros((0, 2), np.int64)
        self._s_first = np.zeros(0, np.int64)  # first aligned teacher token (index into the pending teacher tokens)
        self._s_last = np.zeros(0, np.int64)  # one past the last
        self._t_ids = np.zeros(0, np.int64)
        self._t_offsets = np.zeros((0, 2), np.int64)

    def add(self, docs: EncodedDocuments) -> list[dict]:
        """Append documents; return the samples they complete. Aligns them in one call, not one per document."""
        char_base, teacher_base = len(self._text), len(self._t_ids)
        closed = len(docs.doc_ends) - docs.open_last  # documents that end here: a separator follows each
        s_ids, s_offsets, s_seps = self._with_separators(
            docs.student_ids, docs.student_offsets, docs.student_lengths[:closed], docs.doc_ends[:closed],
            self.student_separator_id)
        t_ids, t_offsets, t_seps = self._with_separators(
            docs.teacher_ids, docs.teacher_offsets, docs.teacher_lengths[:closed], docs.doc_ends[:closed],
            self.teacher_separator_id)
        start, end = align(s_offsets, t_offsets)
        self.folded_characters += uncovered_characters(s_offsets, t_offsets)
        # Unmapped student tokens (folded characters) constrain no teacher range: they get (NONE, -1).
        first = np.where(start < end, start + teacher_base, _NONE)
        last = np.where(start < end, end + teacher_base, -1)
        first[s_seps], last[s_seps] = t_seps + teacher_base, t_seps + teacher_base + 1
        self._text += docs.text
        self._s_ids = np.concatenate([self._s_ids, s_ids])
        self._s_offsets = np.concatenate([self._s_offsets, s_offsets + char_base])
        self._s_first = np.concatenate([self._s_first, first])
        self._s_last = np.concatenate([self._s_last, last])
        self._t_ids = np.concatenate([self._t_ids, t_ids])
        self._t_offsets = np.concatenate([self._t_offsets, t_offsets + char_base])
        return self._emit()

    @staticmethod
    def _with_separators(ids, offsets, lengths, doc_ends, separator_id):
        """Insert a separator (an empty span where its document ends) after each document; return where they are."""
        at = np.cumsum(lengths)
        ids = np.insert(ids, at, separator_id)
        offsets = np.insert(offsets, at, np.stack([doc_ends, doc_ends], axis=1), axis=0)
        return ids, offsets, at + np.arange(len(at))

    def finish(self) -> None:
        self.tail_tokens = len(self._s_ids)

    def _emit(self) -> list[dict]:
        width = self.tokens_per_row
        n_samples = len(self._s_ids) // width
        if n_samples == 0:
            return []
        cut = n_samples * width
        firsts = self._s_first[:cut].reshape(n_samples, width).min(1)
        lasts = self._s_last[:cut].reshape(n_samples, width).max(1)
        samples = []
        for k in range(n_samples):
            tokens = slice(k * width, (k + 1) * width)
            first, last = (int(firsts[k]), int(lasts[k])) if lasts[k] >= 0 else (0, 0)
            s_offsets, t_offsets = self._s_offsets[tokens], self._t_offsets[first:last]
            begin = min(s_offsets[0, 0], t_offsets[0, 0]) if last > first else s_offsets[0, 0]
            stop = max(s_offsets[-1, 1], t_offsets[-1, 1]) if last > first else s_offsets[-1, 1]
            self.text_starts.append(self._dropped_characters + int(begin))
            s_ids, s_offsets = _start_row(self.student_bos_id, self._s_ids[tokens], s_offsets - begin)
            t_ids, t_offsets = _start_row(self.teacher_bos_id, self._t_ids[first:last], t_offsets - begin)
            samples.append(
                {
                    "text": self._text[begin:stop],
                    "student_ids": compact(s_ids),
                    "student_offsets": compact(s_offsets),
                    "teacher_ids": compact(t_ids),
                    "teacher_offsets": compact(t_offsets),
                }
            )
        self._drop(cut)
        return samples

    def _drop(self, n_tokens: int) -> None:
        """Forget the first ``n_tokens`` student tokens and all that only they needed."""
        rest_first = self._s_first[n_tokens:]
        keep_teacher = int(rest_first.min()) if len(rest_first) else len(self._t_ids)
        keep_teacher = min(keep_teacher, len(self._t_ids))
        keep_char = len(self._text)
        if len(rest_first):
            keep_char = min(keep_char, int(self._s_offsets[n_tokens, 0]))
        if keep_teacher < len(self._t_ids):
            keep_char = min(keep_char, int(self._t_offsets[keep_teacher, 0]))
        self._text = self._text[keep_char:]
        self._dropped_characters += keep_char
        self._s_ids = self._s_ids[n_tokens:]
        self._s_offsets = self._s_offsets[n_tokens:] - keep_char
        self._s_first = np.where(rest_first == _NONE, _NONE, rest_first - keep_teacher)
        self._s_last = np.where(self._s_last[n_tokens:] < 0, -1, self._s_last[n_tokens:] - keep_teacher)
        self._t_ids = self._t_ids[keep_teacher:]
        self._t_offsets = self._t_offsets[keep_teacher:] - keep_char


def _start_row(bos_id: int | None, ids: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The row with ``bos_id`` first (an empty span at the row's first character), or as it is without one."""
    if bos_id is None:
        return ids, offsets
    return np.concatenate([[bos_id], ids]), np.concatenate([np.zeros((1, 2), offsets.dtype), offsets])
