"""A real tokenizer made to panic: the Rust side of ``tokenizers`` panics (pyo3's ``PanicException``, a
``BaseException``) where Oniguruma gives up on its pre-tokenizer's pattern."""

import json

from vocagno.core.tokenization import shipped_tokenizer_dir


def backtracking_tokenizer(folder):
    """Qwen2.5's tokenizer folder with an alternative that backtracks exponentially put first in its pre-tokenizer's
    Split pattern: on 40 letters and no "!", Oniguruma hits its retry limit and the Rust side panics."""
    shipped = shipped_tokenizer_dir("qwen2.5")
    folder.mkdir()
    spec = json.loads((shipped / "tokenizer.json").read_text())
    split = spec["pre_tokenizer"]["pretokenizers"][0]["pattern"]
    split["Regex"] = "(\\p{L}|\\p{L})*!|" + split["Regex"]
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    (folder / "tokenizer_config.json").write_bytes((shipped / "tokenizer_config.json").read_bytes())
    return folder


PANIC_FIX = "(Oniguruma's retry limit: its tokenizer.json's pre-tokenizer pattern backtracks without bound on such " \
    "text; use a tokenizer whose pattern does not)"

