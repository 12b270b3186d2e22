"""Loading tokenizers (HF names, local folders, or the copies shipped in the package) and encoding with offsets; the
shipped model's folder."""

from __future__ import annotations

import contextlib
import copy
import difflib
import hashlib
import functools
import json
import lzma
import os
import shutil
from pathlib import Path

import numpy as np
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from vocagno.doors.untrusted import from_pretrained, reason
from vocagno.doors.writing import publish, remove, staging
from vocagno.errors import Refused

__all__ = [
    "SHIPPED_TOKENIZERS", "SHIPPED_MODELS", "ASSETS", "load_tokenizer", "as_tokenizer", "shipped_tokenizer_dir",
    "shipped_model_dir", "resolve_shipped", "encode_with_offsets", "panics_refused", "described",
    "text_tokenizers", "has_dummy_prefix", "without_dummy_prefix",
]

ASSETS = Path(__file__).parent.parent / "assets"

# Real tokenizers of the paper's models, shipped so that tests and the embedded default run offline.
# Provenance and licenses: vocagno/assets/README.md.
SHIPPED_TOKENIZERS = ("llama2", "codellama", "mistral", "qwen2.5", "deepseek-llm")
# Small teachers (experiments/tiny_teacher.py), each with the shipped tokenizer it reads: one has learned GSM8K text,
# the other MATH problems in LaTeX.
SHIPPED_MODELS = {"tiny-math-teacher": "mistral", "tiny-latex-teacher": "deepseek-llm"}


def shipped_tokenizer_dir(name: str) -> Path:
    """A folder ``AutoTokenizer.from_pretrained`` can load for shipped tokenizer ``name``.

    The package holds ``tokenizer.json`` xz-compressed; it is unpacked once into ``$VOCAGNO_CACHE`` (default
    ``~/.cache/vocagno``), under a name that changes with the file, and atomically, so concurrent ranks are safe.
    """
    if name not in SHIPPED_TOKENIZERS:
        raise ValueError(f"no shipped tokenizer named {name!r}; shipped: {', '.join(SHIPPED_TOKENIZERS)}")
    source = ASSETS / "tokenizers" / name
    packed = (source / "tokenizer.json.xz").read_bytes()

    def fill(folder: Path) -> None:
        (folder / "tokenizer.json").write_bytes(lzma.decompress(packed))
        for extra in source.glob("*.json"):
            shutil.copy(extra, folder / extra.name)

    return _unpacked_once("tokenizers", name, hashlib.sha256(packed).hexdigest()[:12], fill)


def shipped_model_dir(name: str) -> Path:
    """A Hugging Face folder (config, bf16 safetensors and the tokenizer) for shipped model ``name``.

    The package holds the model's config and weights (``assets/models/NAME``); the tokenizer it reads is a shipped one
    (``SHIPPED_MODELS``), unpacked beside them once into ``$VOCAGNO_CACHE``, as tokenizers are."""
    if name not in SHIPPED_MODELS:
        raise ValueError(f"no shipped model named {name!r}; shipped: {', '.join(SHIPPED_MODELS)}")
    source = ASSETS / "models" / name
    digest = hashlib.sha256()
    for path in sorted(source.iterdir()):
        digest.update(path.name.encode() + path.read_bytes())
    tokenizer = shipped_tokenizer_dir(SHIPPED_MODELS[name])

    def fill(folder: Path) -> None:
        for path in (*source.iterdir(), *tokenizer.iterdir()):
            shutil.copy(path, folder / path.name)

    return _unpacked_once("models", name, digest.hexdigest()[:12], fill)


def _unpacked_once(kind: str, name: str, digest: str, fill) -> Path:
    """``$VOCAGNO_CACHE/KIND/NAME-DIGEST``, filled by ``fill(folder)`` in a staging folder renamed into place."""
    cache = Path(os.environ.get("VOCAGNO_CACHE", Path.home() / ".cache" / "vocagno"))
    target = cache / kind / f"{name}-{digest}"
    if target.is_dir() and not target.is_symlink():
        return target
    built = staging(target)
    try:
        fill(built)
        publish(built, target, replace=target.is_symlink())  # a link planted there is replaced, not followed
    except OSError:
        if not target.is_dir():  # not just another process that won the race
            raise
    finally:
        if built.exists():
            remove(built)
    return target


def resolve_shipped(name_or_path: str) -> str:
    """A local folder as it is; a shipped model's or tokenizer's name as its unpacked folder; anything else (a Hugging
    Face name) as it is."""
    path = str(name_or_path)
    if Path(path).is_dir():
        return path
    if path in SHIPPED_MODELS:
        return str(shipped_model_dir(path))
    if path in SHIPPED_TOKENIZERS:
        return str(shipped_tokenizer_dir(path))
    return path


def load_tokenizer(name_or_path: str) -> PreTrainedTokenizerFast:
    """A fast tokenizer from a local folder, a shipped name (``llama2``, ``qwen2.5``, ...) or a Hugging Face name.

    Alignment needs character offsets, which only fast (Rust) tokenizers give: anything else is refused.
    """
    path = resolve_shipped(name_or_path)
    try:
        tokenizer = from_pretrained(AutoTokenizer, path, use_fast=True)  # trust_remote_code off; a folder checked
    except OSError as error:  # neither a folder nor a shipped name, and the hub has no such repo or is out of reach
        if Path(path).is_dir():
            raise
        close = difflib.get_close_matches(path, SHIPPED_TOKENIZERS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(
            f"tokenizer {path!r}: no such folder or shipped tokenizer{hint}; shipped: {', '.join(SHIPPED_TOKENIZERS)}. "
            f"As a Hugging Face name it could not be loaded either: {str(error).splitlines()[0]}"
        ) from error
    tokenizer.name_or_path = str(name_or_path)  # messages name what the user named, not the unpacked cache folder
    if not tokenizer.is_fast:
        raise ValueError(
            f"tokenizer {name_or_path!r} is a slow {type(tokenizer).__name__}: character offsets need a fast "
            "tokenizer (a folder with tokenizer.json)"
        )
    return tokenizer


def as_tokenizer(tokenizer):
    """A tokenizer given as itself, or as a name or folder (loaded with ``load_tokenizer``)."""
    return load_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer


def encode_with_offsets(
    tokenizer: PreTrainedTokenizerFast, text: str, add_special_tokens: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Token ids (int64, shape (n,)) and character spans (int64, shape (n, 2)) of ``text``.

    Specials the tokenizer adds get empty spans, so alignment leaves them unmapped. A special token's string in the
    text ("</s>") stays text (``split_special_tokens``): text never turns into a special token.
    """
    with panics_refused(tokenizer.name_or_path, described([text])):
        encoding = tokenizer(
            text, add_special_tokens=add_special_tokens, return_offsets_mapping=True, return_attention_mask=False,
            split_special_tokens=True,
        )
    ids = np.asarray(encoding["input_ids"], dtype=np.int64)
    offsets = np.asarray(encoding["offset_mapping"], dtype=np.int64).reshape(-1, 2)
    return ids, offsets


def _is_panic(error: BaseException) -> bool:
    """Whether ``error`` is a panic of a Rust library raised through pyo3 (``pyo3_runtime.PanicException``: a
    ``BaseException``, which no ``except Exception`` takes, and a type no module exports by name)."""
    kind = type(error)
    return kind.__name__ == "PanicException" and kind.__module__ == "pyo3_runtime"


def described(texts: list[str]) -> str:
    """The texts a tokenizer was given, as a refusal names them: how many, how long, how the first begins."""
    if len(texts) == 1:
        return f"a text of {len(texts[0]):,} characters beginning {texts[0][:32]!r}"
    return f"one of {len(texts):,} texts ({sum(map(len, texts)):,} characters) beginning {texts[0][:32]!r}"


@contextlib.contextmanager
def panics_refused(tokenizer: str, what: str):
    """Encoding with ``tokenizer`` (a name or folder) in it: a panic of its Rust side is raised as ``Refused``, one line
    naming the tokenizer, ``what`` it was encoding (``described``) and the fix. A tokenizer.json from elsewhere can
    hold a pre-tokenizer pattern on which Oniguruma gives up (its retry limit), and the library panics."""
    try:
        yield
    except BaseException as error:
        if not _is_panic(error):
            raise
        fix = "(Oniguruma's retry limit: its tokenizer.json's pre-tokenizer pattern backtracks without bound on " \
            "such text; use a tokenizer whose pattern does not)" if "Onig" in str(error) else \
            "(a panic of the Rust tokenizers library on this text: use another tokenizer)"
        raise Refused(f"tokenizer {str(tokenizer)!r}: refused: it panicked encoding {what} ({reason(error)}) "
                      f"{fix}") from None


def text_tokenizers(backend) -> tuple:
    """Copies of a backend tokenizer that tokenize special tokens' strings as text: as it is, and without the dummy
    prefix for pieces that continue a document (the same object where it has no dummy prefix). Text is text: a
    "</s>" in a document is the characters it is, never the special token.

    The same copies for the same tokenizer content (its serialization), made once a process for the latest four:
    copying a 151K vocabulary's tokenizer took about a second and a half, and every conversion, part and
    ``Encoder`` asked again. They are only encoded with."""
    return _text_copies(backend.to_str())


@functools.lru_cache(maxsize=4)  # a process that converts with many tokenizers (a sweep) keeps the latest few
def _text_copies(spec: str) -> tuple:
    from tokenizers import Tokenizer

    plain = Tokenizer.from_str(spec)  # the copy, from the serialization the key already made
    plain.encode_special_tokens = True
    continuing = without_dummy_prefix(plain)
    if continuing is not None:
        continuing.encode_special_tokens = True
    return plain, continuing or plain


def has_dummy_prefix(backend) -> bool:
    """Whether a backend tokenizer prepends a "▁" to a text (SentencePiece's dummy prefix)."""
    return _dummy_prefix_stripped(backend) is not None


def without_dummy_prefix(backend):
    """A copy of a backend tokenizer that prepends no "▁" to a text (SentencePiece's dummy prefix: a ``Prepend``
    normalizer in Llama-2's tokenizer.json, a ``Metaspace`` pre-tokenizer's prepend scheme in Mistral's), or None
    when it has none (byte-level BPE). The copy reads special tokens' strings as the tokenizer does."""
    from tokenizers import Tokenizer

    stripped = _dummy_prefix_stripped(backend)
    if stripped is None:
        return None
    made = Tokenizer.from_str(backend.to_str())
    made.encode_special_tokens = backend.encode_special_tokens  # not in the serialization
    # Only the two components change: set them on the copy, not through a JSON round trip of the whole tokenizer
    # (that took three times as long as the copy itself for Llama-2's).
    for key, part in stripped.items():
        component = None
        if part is not None:
            component = copy.deepcopy(getattr(backend, key))
            component.__setstate__(json.dumps(part).encode())
        setattr(made, key, component)
    return made


def _dummy_prefix_stripped(backend) -> dict | None:
    """The backend's normalizer and pre-tokenizer (as JSON) with the dummy prefix taken out, or None when it has none.
    The two components alone: serializing the whole tokenizer (7 MB for a 151K vocabulary) only to find nothing to
    strip took most of a conversion's start."""

    def strip(node):
        if not isinstance(node, dict):
            return node
        if node.get("type") == "Prepend":
            return None
        if node.get("type") == "Metaspace":
            node["prepend_scheme"] = "never"
        for key in ("normalizers", "pretokenizers"):
            if key in node:
                node[key] = [n for n in map(strip, node[key]) if n is not None]
        return node

    parts = {key: None if part is None else json.loads(part.__getstate__())
             for key, part in (("normalizer", backend.normalizer), ("pre_tokenizer", backend.pre_tokenizer))}
    stripped = {key: strip(copy.deepcopy(part)) for key, part in parts.items()}
    changed = {key: part for key, part in stripped.items() if part != parts[key]}
    return changed or None
