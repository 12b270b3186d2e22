"""The MDS shard format shared by the converter and the dataset: the samples' columns, ``vocagno.json``, tokenizers.

A sample holds exactly ``seq_len`` student tokens and the teacher tokens over the same characters, with the raw text:

    text             str                   the sample's characters; offsets index into it
    student_ids      ndarray (n,)          student token ids
    student_offsets  ndarray (n, 2)        [s, e) character spans; specials (BOS, separators) have empty spans
    teacher_ids      ndarray (m,)
    teacher_offsets  ndarray (m, 2)

Each row starts as its tokenizer starts a text: with the tokenizer's BOS when it adds one by default (Llama-2,
Mistral, CodeLlama/Llemma, DeepSeek: rows start mid-document, and a frozen Llama-family teacher needs its BOS there;
the student reads its rows the way evaluation prompts start). Documents end with the tokenizer's end-of-text token
(``document_separator``). Document text is tokenized as text: a "</s>" written in a document is three text tokens,
never the special token (``vocagno.conversion.packer`` packs documents into samples).

Arrays are stored at the smallest unsigned dtype that holds them (uint16 for a 32K vocabulary or a text under 64K
characters, else uint32), so the MDS columns are plain ``ndarray`` with the dtype recorded per sample.

Beside Streaming's ``index.json``, a dataset root holds ``vocagno.json``: the tokenizers that made it (name, a
fingerprint of the vocabulary, size, separator and BOS tokens), the sequence length, and totals. Training refuses
shards whose fingerprints differ from its tokenizers'.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import weakref
from dataclasses import asdict, dataclass, field
from json.encoder import encode_basestring
from pathlib import Path
from typing import Any

import numpy as np

from vocagno.data.batch import TOPK_IDS, TOPK_PROBS, TOPK_REST
from vocagno.doors.writing import write_atomically

__all__ = [
    "COLUMNS",
    "SCORED_COLUMNS",
    "METADATA_FILE",
    "SHARD_HASH",
    "FORMAT_VERSION",
    "TokenizerInfo",
    "ShardMetadata",
    "tokenizer_info",
    "document_separator",
    "describe_tokenizer",
    "compact",
    "check_teacher_name",
    "check_columns",
    "loss_column",
    "align_column",
    "DISTRIBUTION_COLUMNS",
    "DISTRIBUTION_DTYPES",
    "Distribution",
    "distribution_of",
]

COLUMNS = {
    "text": "str",
    "student_ids": "ndarray",
    "student_offsets": "ndarray",
    "teacher_ids": "ndarray",
    "teacher_offsets": "ndarray",
}
# Shards scored by ``python -m vocagno.score`` add each teacher token's loss (float16, NaN where undefined).
SCORED_COLUMNS = {**COLUMNS, "teacher_loss": "ndarray"}
# ``python -m vocagno.score --top-k K`` adds, at each teacher position m (the distribution of teacher token m + 1),
# the teacher's top-k next-token distribution: its ids ``[M, K]`` (uint16 when the vocabulary fits, else uint32), their
# probabilities ``[M, K]`` (sorted, decreasing) and the mass left outside them ``[M]`` (both float16, or float32).
DISTRIBUTION_COLUMNS = {TOPK_IDS: "ndarray", TOPK_PROBS: "ndarray", TOPK_REST: "ndarray"}
DISTRIBUTION_DTYPES = ("float16", "float32")
# A set of teachers (vocagno.teacher.several): the other teachers' losses and alignment, scored, are columns named
# after them.
TEACHER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
METADATA_FILE = "vocagno.json"
SHARD_HASH = "xxh3_64"  # every shard's hash in index.json: the merge checks it on the out-root, readers when they read
FORMAT_VERSION = 2  # 2: a BOS starts each row (tokenizers that add one), end-of-text separators
# Tokens that end a document in pretraining. A chat model's EOS ends a turn instead (Qwen2.5-Math-7B-Instruct's is
# <|im_end|>), so these come first when the vocabulary has them.
END_OF_TEXT_TOKENS = ("<|endoftext|>", "<|end_of_text|>")


def check_teacher_name(name: Any, where: str = "teachers") -> str:
    """A teacher's name, checked: it becomes batch keys, shard columns and metric names (and comes from files)."""
    if not isinstance(name, str) or not TEACHER_NAME.fullmatch(name):
        raise ValueError(f"{where}: a teacher's name must be letters, digits, '_' or '-' (at most 64), got {name!r}")
    return name


def check_columns(columns: dict[str, str], where: Any) -> None:
    """Refuse shards with a column vocagno does not write as ``str`` or ``ndarray``: Streaming decodes every column of
    a sample it reads, a ``pkl`` one by unpickling it, and shards come from elsewhere."""
    for name, encoding in columns.items():
        if encoding not in ("str", "ndarray"):
            raise ValueError(f"{where}: column {name!r} is stored as {encoding!r}: vocagno shards hold str and ndarray "
                             "columns only (any other would be decoded, a pkl one unpickled, when read)")


def loss_column(name: str) -> str:
    """The column of teacher ``name``'s token losses (float16, over its tokens as ``TeacherSide`` makes them)."""
    return f"teacher_loss.{name}"


def align_column(name: str) -> str:
    """The column of teacher ``name``'s alignment: per student token, its ``[start, end)`` teacher positions."""
    return f"align.{name}"


def compact(array: np.ndarray) -> np.ndarray:
    """The array as uint16 when its values fit, else uint32 (ids and offsets are never negative)."""
    return array.astype(np.uint16 if array.size == 0 or array.max() < 2**16 else np.uint32)


@dataclass(frozen=True)
class Distribution:
    """What scored shards record of their distribution columns (``scored_by["distribution"]``): the ``top_k`` most
    probable of the teacher's ``logits`` next tokens at each teacher position (its LM head's size, which may pass its
    tokenizer's: Qwen2.5's 152,064 rows for 151,665 tokens), their probabilities and the remaining mass as ``dtype``."""

    top_k: int
    logits: int
    dtype: str = "float16"

    def bytes_per_token(self) -> int:
        """The bytes the three columns hold per teacher token (the MDS headers aside)."""
        ids = 2 if self.logits <= 2**16 else 4
        value = 2 if self.dtype == "float16" else 4
        return self.top_k * (ids + value) + value

    def recorded(self) -> dict:
        return {"top_k": self.top_k, "logits": self.logits, "dtype": self.dtype}

    def __str__(self) -> str:
        return f"the top {self.top_k} of {self.logits:,} in {self.dtype}"


def distribution_of(metadata: "ShardMetadata | None") -> Distribution | None:
    """The teacher distribution scored shards carry (checked when ``vocagno.json`` was read), or None."""
    recorded = ((getattr(metadata, "scored_by", None) or {}).get("distribution"))
    return None if recorded is None else Distribution(recorded["top_k"], recorded["logits"], recorded["dtype"])


@dataclass(frozen=True)
class TokenizerInfo:
    name: str
    fingerprint: str  # sha256 of the vocabulary (token -> id, added tokens included), first 16 hex digits
    vocab_size: int
    separator: str  # the token that follows every document
    separator_id: int
    bos: str | None = None  # the token that starts every row: the BOS, when the tokenizer adds one by default
    bos_id: int | None = None

    def same_vocabulary(self, other: "TokenizerInfo") -> bool:
        # The size too: read from elsewhere, it sizes what the shards' checks let through (a distribution's logits).
        return self.fingerprint == other.fingerprint and self.vocab_size == other.vocab_size


_VOCABULARIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def vocabulary(tokenizer) -> tuple[dict[str, int], str]:
    """A tokenizer's vocabulary (added tokens included) and its SHA-256, computed once per tokenizer content and again
    when tokens are added. A 151K vocabulary takes a third of a second, its tokenizer's serialization a tenth: every
    dataset and scorer asks."""
    backend = tokenizer.backend_tokenizer
    added = dict(backend.get_added_tokens_decoder())  # the only part that can grow (add_tokens)
    known = _VOCABULARIES.get(tokenizer)
    if known is None or known[0] != added:
        try:
            content = hashlib.sha256(backend.to_str().encode()).hexdigest(), backend.get_vocab_size()
        except Exception:  # a component defined in Python can't be serialized: read the vocabulary itself
            content = None
        try:
            computed = _by_content(_Content(content, tokenizer)) if content else _read_vocabulary(tokenizer)
        except _Ambiguous as ambiguous:  # read for this tokenizer, and not kept for others of its content
            computed = ambiguous.read
        known = _VOCABULARIES[tokenizer] = (added, *computed)
    return known[1], known[2]


class _Content:
    """A tokenizer keyed by its content (the SHA-256 of its backend's serialization, its vocabulary's size): each load
    of a tokenizer is a new object, and a process that converts or scores again loads the same one again."""

    def __init__(self, content: tuple[str, int], tokenizer):
        self.content, self.tokenizer = content, tokenizer

    def __eq__(self, other) -> bool:
        return isinstance(other, _Content) and other.content == self.content

    def __hash__(self) -> int:
        return hash(self.content)


class _Ambiguous(Exception):
    """A vocabulary in which two tokens share an id: its tokenizer's serialization keeps one of them, so its content
    does not tell such vocabularies apart. Raised out of the cache (which keeps no exception) with what was read."""

    def __init__(self, read: tuple[dict[str, int], str]):
        super().__init__("two tokens share an id")
        self.read = read


@functools.lru_cache(maxsize=4)
def _by_content(key: _Content) -> tuple[dict[str, int], str]:
    """``_read_vocabulary`` of the latest few contents."""
    read = _read_vocabulary(key.tokenizer)
    key.tokenizer = None  # the cache keeps this key: its vocabulary, not the whole tokenizer
    if len(set(read[0].values())) < len(read[0]):
        raise _Ambiguous(read)
    return read


def _read_vocabulary(tokenizer) -> tuple[dict[str, int], str]:
    """The vocabulary and its SHA-256."""
    vocab = tokenizer.get_vocab()
    # json.dumps(sorted(vocab.items()), ensure_ascii=False), built in a third less time: tokens are unique, so sorting
    # them alone sorts the pairs.
    pairs = ", ".join([f"[{encode_basestring(token)}, {vocab[token]}]" for token in sorted(vocab)])
    return vocab, hashlib.sha256(f"[{pairs}]".encode("utf-8")).hexdigest()


def document_separator(tokenizer) -> str:
    """The token that ends a document: an end-of-text token of the vocabulary, else the EOS, else the BOS."""
    vocab, _ = vocabulary(tokenizer)
    separator = next((t for t in END_OF_TEXT_TOKENS if t in vocab), None) or tokenizer.eos_token or tokenizer.bos_token
    if separator is None:
        raise ValueError(f"tokenizer {tokenizer.name_or_path!r} has no end-of-text, EOS or BOS token to end documents")
    return separator


def tokenizer_info(tokenizer, name: str) -> TokenizerInfo:
    """Describe a fast tokenizer: its vocabulary, document separator and the BOS it starts texts with (if any)."""
    vocab, digest = vocabulary(tokenizer)
    separator = document_separator(tokenizer)
    adds_bos = tokenizer.bos_token_id is not None and tokenizer("x")["input_ids"][:1] == [tokenizer.bos_token_id]
    return TokenizerInfo(
        name=name,
        fingerprint=digest[:16],
        vocab_size=len(vocab),
        separator=separator,
        separator_id=int(tokenizer.convert_tokens_to_ids(separator)),
        bos=tokenizer.bos_token if adds_bos else None,
        bos_id=int(tokenizer.bos_token_id) if adds_bos else None,
    )


def describe_tokenizer(tokenizer, role: str) -> TokenizerInfo | None:
    """``TokenizerInfo`` of a tokenizer given as an object, a name or folder (loaded), or already described."""
    if tokenizer is None or isinstance(tokenizer, TokenizerInfo):
        return tokenizer
    if isinstance(tokenizer, str):
        from vocagno.core.tokenization import load_tokenizer

        return tokenizer_info(load_tokenizer(tokenizer), tokenizer)
    return tokenizer_info(tokenizer, getattr(tokenizer, "name_or_path", role))


@dataclass
class ShardMetadata:
    student: TokenizerInfo
    teacher: TokenizerInfo
    seq_len: int
    totals: dict = field(default_factory=dict)
    partial: dict | None = None  # set when published before every job finished (--allow-partial): which did
    scored_by: dict | None = None  # python -m vocagno.score: the teacher whose token losses the samples carry
    # python -m vocagno.score --name NAME: the other teachers of a set whose losses and alignment the samples carry
    # (columns teacher_loss.NAME and align.NAME), by NAME
    also_scored_by: dict | None = None
    format_version: int = FORMAT_VERSION

    def write(self, root: str | Path) -> None:
        write_atomically(Path(root) / METADATA_FILE, json.dumps(asdict(self), indent=2, ensure_ascii=False) + "\n")

    @classmethod
    def read(cls, root: str | Path) -> "ShardMetadata":
        path = Path(root) / METADATA_FILE
        if not path.exists():
            if not Path(root).is_dir() or not any(Path(root).iterdir()):
                raise FileNotFoundError(
                    f"{root} holds no shards: convert a corpus into it first (python conversion/convert_dataset.py "
                    f"--input FILE --out-root {root} ...: docs/conversion.md)")
            raise FileNotFoundError(
                f"{path} is missing: {root} is not a vocagno shard folder, or its conversion has not finished "
                "(run the same conversion command again to finish it)"
            )
        from vocagno.doors.untrusted import read_json  # a regular file within its cap: shards come from elsewhere

        raw = read_json(path)
        if isinstance(raw, dict) and raw.get("format_version") not in (FORMAT_VERSION, None) \
                and isinstance(raw.get("format_version"), int):
            raise ValueError(
                f"{path}: format version {raw.get('format_version')}, this vocagno reads {FORMAT_VERSION}: convert the "
                "corpus again (conversion/convert_dataset.py) into a new --out-root"
            )
        _check_metadata(raw, path)
        return cls(
            student=TokenizerInfo(**raw["student"]),
            teacher=TokenizerInfo(**raw["teacher"]),
            seq_len=raw["seq_len"],
            totals=raw.get("totals") or {},
            partial=raw.get("partial"),
            scored_by=raw.get("scored_by"),
            also_scored_by=_checked_names(raw.get("also_scored_by"), path),
        )

    def check_tokenizers(self, student: TokenizerInfo | None = None, teacher: TokenizerInfo | None = None) -> None:
        """Refuse shards made by other tokenizers than the ones given, naming both."""
        for role, made_by, wanted in (("student", self.student, student), ("teacher", self.teacher, teacher)):
            if wanted is not None and not made_by.same_vocabulary(wanted):
                raise ValueError(
                    f"the shards' {role} tokenizer is {made_by.name!r} (vocabulary {made_by.fingerprint}, "
                    f"{made_by.vocab_size} tokens), but this run's {role} tokenizer is {wanted.name!r} (vocabulary "
                    f"{wanted.fingerprint}, {wanted.vocab_size} tokens): convert the corpus again with the run's tokenizers"
                )


_MOST_TOKENS = 1 << 24  # no tokenizer has more: ids and sizes beyond are no vocabulary's
_TOKENIZER_FIELDS = {"name": str, "fingerprint": str, "vocab_size": int, "separator": str, "separator_id": int,
                     "bos": (str, type(None)), "bos_id": (int, type(None))}
_TOKENIZER_REQUIRED = {"name", "fingerprint", "vocab_size", "separator", "separator_id"}


def _check_metadata(raw: Any, path: Path) -> None:
    """``vocagno.json`` as read from elsewhere: the fields ``ShardMetadata`` is made of, of their types, ids within
    their vocabulary, a sample length of at least 2 tokens; refused (``UntrustedFile``) in one line otherwise."""
    from vocagno.doors.untrusted import UntrustedFile

    def refuse(why: str) -> UntrustedFile:
        return UntrustedFile(f"{path}: refused: {why}: not the vocagno.json a conversion writes")

    if not isinstance(raw, dict) or raw.get("format_version") != FORMAT_VERSION:
        raise refuse(f"no format_version {FORMAT_VERSION}")
    for role in ("student", "teacher"):
        info = raw.get(role)
        if not (isinstance(info, dict) and _TOKENIZER_REQUIRED <= set(info) <= set(_TOKENIZER_FIELDS)
                and all(isinstance(value, _TOKENIZER_FIELDS[key]) and not isinstance(value, bool)
                        for key, value in info.items())):
            raise refuse(f"its {role} is not a tokenizer's description ({', '.join(_TOKENIZER_FIELDS)})")
        size = info["vocab_size"]
        if not 0 < size <= _MOST_TOKENS or not all(
                ident is None or 0 <= ident < size for ident in (info["separator_id"], info.get("bos_id"))):
            raise refuse(f"its {role} tokenizer's size or ids are out of range ({size}, {info['separator_id']}, "
                         f"{info.get('bos_id')})")
    seq_len = raw.get("seq_len")
    if not isinstance(seq_len, int) or isinstance(seq_len, bool) or not 2 <= seq_len <= _MOST_TOKENS:
        raise refuse(f"seq_len {seq_len!r}")
    for key in ("totals", "partial", "scored_by"):
        if raw.get(key) is not None and not isinstance(raw[key], dict):
            raise refuse(f"its {key} is not a mapping")
    scored_by = raw.get("scored_by")
    if scored_by is not None and not isinstance(scored_by.get("name"), str):
        raise refuse("its scored_by names no teacher")
    distribution = (scored_by or {}).get("distribution")
    if distribution is not None:  # its numbers size every sample's columns: whole numbers, k within the logits
        k, logits, dtype = (distribution.get(key) if isinstance(distribution, dict) else None
                            for key in ("top_k", "logits", "dtype"))
        if not (all(isinstance(n, int) and not isinstance(n, bool) for n in (k, logits))
                and 1 <= k <= logits <= _MOST_TOKENS and dtype in DISTRIBUTION_DTYPES
                and set(distribution) == {"top_k", "logits", "dtype"}):
            raise refuse(f"its scored_by's distribution {distribution!r} is not a top_k of 1 to its logits (at most "
                         f"{_MOST_TOKENS:,}) and a dtype of {', '.join(DISTRIBUTION_DTYPES)}")
        # k and the logits size each batch's columns: a model's logits pad its tokenizer's vocabulary a little
        # (Qwen2.5: 152,064 for 151,665 tokens), never to twice it.
        vocab = raw["teacher"]["vocab_size"]
        if logits > 2 * vocab:
            raise refuse(f"its scored_by's distribution has {logits:,} logits, more than twice its teacher "
                         f"tokenizer's {vocab:,} tokens")


def _checked_names(scored: Any, path: Path) -> dict | None:
    """``also_scored_by`` as read: its names become batch keys and metric names, so each is checked."""
    if scored is None:
        return None
    if not isinstance(scored, dict):
        raise ValueError(f"{path}: also_scored_by must be a mapping of teacher name -> scorer")
    for name, by in scored.items():
        check_teacher_name(name, f"{path}: also_scored_by")
        if not (isinstance(by, dict) and isinstance(by.get("name"), str) and isinstance(by.get("fingerprint"), str)
                and isinstance(by.get("tokenizer"), dict) and isinstance(by["tokenizer"].get("fingerprint"), str)):
            raise ValueError(f"{path}: also_scored_by[{name!r}] must record the scorer's name, fingerprint and "
                             "tokenizer")
    return scored
