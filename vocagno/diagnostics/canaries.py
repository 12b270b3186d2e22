"""Canaries: clean documents mixed with noise made from them, converted as the converter converts, every student
token labelled with the document and the kind of text it comes from.

``python -m vocagno.selection`` asks of a teacher "does it keep the clean text and drop the noise?": the answer needs
text whose every token is known to be clean or noise. The clean documents are the text of sampled rows of the user's
shards (cut at their document separators); each noise document is one of them made useless in a way a corpus holds:

- ``shuffled_words``: the same words in a random order (the miniature's junk: right words, no sense);
- ``scrambled_characters``: each word's characters in a random order (OCR or encoding garbage: no words at all).

Documents are packed into rows exactly as the converter packs them (``vocagno.conversion.packer``: ``Encoder`` and
``Packer``, the shards' tokenizers and ``seq_len``), so the rows are the training rows this corpus would give.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from vocagno.conversion.packer import Encoder, Packer
from vocagno.data.shards import ShardMetadata

__all__ = ["NOISE", "CLEAN", "Canaries", "clean_documents", "mix", "pack"]


def shuffled_words(text: str, rng: random.Random) -> str:
    words = text.split()
    rng.shuffle(words)
    return " ".join(words)


def scrambled_characters(text: str, rng: random.Random) -> str:
    return " ".join("".join(rng.sample(word, len(word))) for word in text.split())


NOISE = {"shuffled_words": shuffled_words, "scrambled_characters": scrambled_characters}
CLEAN = "clean"


def clean_documents(sample: dict, separator_id: int) -> list[str]:
    """The text of a shard row cut where the row's student separators (end-of-document tokens) stand: the pieces of
    the documents the row holds, without merging two documents into one."""
    ids, offsets, text = sample["student_ids"], sample["student_offsets"], sample["text"]
    cuts = [int(offsets[i, 0]) for i in range(len(ids)) if ids[i] == separator_id and offsets[i, 0] == offsets[i, 1]]
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    return [piece for piece in pieces if piece.strip()]


def mix(clean: list[str], fraction: float, kinds: list[str], seed: int) -> list[tuple[str, str]]:
    """``(kind, text)`` documents: ``clean`` plus noise made from them, ``fraction`` of all documents (each noise
    document from a clean one drawn at random, the kinds taking turns), in a random order."""
    rng = random.Random(seed)
    count = round(len(clean) * fraction / (1 - fraction))
    noise = [(kinds[k % len(kinds)], NOISE[kinds[k % len(kinds)]](rng.choice(clean), rng)) for k in range(count)]
    documents = [(CLEAN, text) for text in clean] + noise
    rng.shuffle(documents)
    return documents


@dataclass
class Canaries:
    """Rows as the converter writes them (``samples``), and per row and student token the index of its document
    (``document``) and of that document's kind in ``kinds`` (``kind``); -1 for specials, which hold no text."""

    samples: list[dict]
    document: list[np.ndarray]
    kind: list[np.ndarray]
    kinds: list[str]  # kinds[0] is CLEAN
    documents: list[tuple[str, str]]
    dropped_tokens: int  # student tokens left over at the end (fewer than a row), as the converter drops them


def pack(documents: list[tuple[str, str]], student, teacher, metadata: ShardMetadata) -> Canaries:
    """Convert ``documents`` with the tokenizers (fast, as ``load_tokenizer`` gives them) and settings of the shards
    ``metadata`` describes, and label each row's student tokens."""
    kinds = [CLEAN, *(k for k in NOISE if any(kind == k for kind, _ in documents))]
    encoded = Encoder(student, teacher).encode([[text] for _, text in documents])
    packer = Packer(metadata.seq_len, metadata.student, metadata.teacher)
    samples = packer.add(encoded)
    packer.finish()
    # Every character of the joined documents: its document. A token's first character says where it comes from.
    lengths = np.array([len(text) for _, text in documents], dtype=np.int64)
    document_of = np.repeat(np.arange(len(documents)), lengths)
    kind_of = np.array([kinds.index(kind) for kind, _ in documents], dtype=np.int64)[document_of]
    rows_document, rows_kind = [], []
    for sample, start in zip(samples, packer.text_starts):
        offsets = np.asarray(sample["student_offsets"], dtype=np.int64)
        text = offsets[:, 0] < offsets[:, 1]
        at = np.where(text, offsets[:, 0] + start, 0)
        rows_document.append(np.where(text, document_of[at], -1))
        rows_kind.append(np.where(text, kind_of[at], -1))
    return Canaries(samples, rows_document, rows_kind, kinds, documents, packer.tail_tokens)
