"""Loading the shipped tokenizers offline, and refusing tokenizers that can't give offsets."""

import json
import os

import pytest

from vocagno.tokenization import SHIPPED_TOKENIZERS, encode_with_offsets, load_tokenizer, shipped_tokenizer_dir

# The sizes the shipped copies must have (shared/assets/README.md): the real tokenizers, not stand-ins.
VOCAB_SIZES = {"llama2": 32000, "codellama": 32016, "mistral": 32000, "qwen2.5": 151665, "deepseek-llm": 100015}


@pytest.mark.parametrize("name", SHIPPED_TOKENIZERS)
def test_shipped_tokenizers_load_offline(tokenizers, name):
    tok = tokenizers[name]
    assert tok.is_fast
    assert len(tok) == VOCAB_SIZES[name]
    ids, offsets = encode_with_offsets(tok, "The probability is 3/4.")
    assert ids.dtype == offsets.dtype and offsets.shape == (len(ids), 2)
    assert tok.decode(ids.tolist()) == "The probability is 3/4."


def test_specials_get_empty_spans(tokenizers):
    ids, offsets = encode_with_offsets(tokenizers["llama2"], "hi", add_special_tokens=True)
    assert ids[0] == tokenizers["llama2"].bos_token_id
    assert offsets[0].tolist() == [0, 0]


def test_unpacking_is_cached_and_keyed_by_content():
    first = shipped_tokenizer_dir("qwen2.5")
    assert first.name.startswith("qwen2.5-") and (first / "tokenizer.json").stat().st_size > 5_000_000
    assert str(first).startswith(os.environ["VOCAGNO_CACHE"])
    assert shipped_tokenizer_dir("qwen2.5") == first


def test_unknown_shipped_name_is_refused():
    with pytest.raises(ValueError, match="no shipped tokenizer named 'llama3'"):
        shipped_tokenizer_dir("llama3")


def test_slow_tokenizer_is_refused(tmp_path):
    # CTRL has no fast tokenizer: without tokenizer.json there are no offsets to align.
    (tmp_path / "vocab.json").write_text(json.dumps({"a": 0, "b": 1, "ab": 2, "<unk>": 3}))
    (tmp_path / "merges.txt").write_text("#version: 0.2\na b\n")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "CTRLTokenizer"}))
    with pytest.raises(ValueError, match="slow CTRLTokenizer: character offsets need a fast tokenizer"):
        load_tokenizer(str(tmp_path))


def test_a_misspelled_tokenizer_name_says_what_is_shipped():
    with pytest.raises(ValueError, match="tokenizer 'qwen2': no such folder or shipped tokenizer \\(did you mean "
                                         "'qwen2.5'\\?\\); shipped: llama2, codellama"):
        load_tokenizer("qwen2")
