"""Loading the shipped tokenizers offline, and refusing tokenizers that can't give offsets."""

import errno
import json
import os

import pytest

from panicking import PANIC_FIX, backtracking_tokenizer

from vocagno.core.tokenization import SHIPPED_TOKENIZERS, encode_with_offsets, load_tokenizer, shipped_tokenizer_dir

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


def test_a_job_that_loses_the_unpacking_race_takes_the_winners_folder_and_leaves_no_staging(tmp_path, monkeypatch):
    """Jobs of a node unpacking the same shipped files at once: the one whose rename finds the folder in place takes
    that folder as it is and removes its own staging copy; a fill that fails with no folder in place raises."""
    from vocagno.core.tokenization import _unpacked_once

    monkeypatch.setenv("VOCAGNO_CACHE", str(tmp_path))
    target = tmp_path / "models" / "x-abc"

    def another_job_wins(folder):
        (folder / "mine").write_text("loser")
        target.mkdir()
        (target / "theirs").write_text("winner")

    assert _unpacked_once("models", "x", "abc", another_job_wins) == target
    assert [p.name for p in target.iterdir()] == ["theirs"]
    assert [p.name for p in (tmp_path / "models").iterdir()] == ["x-abc"]

    def full_disk(folder):
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match="No space left on device"):
        _unpacked_once("models", "y", "abc", full_disk)
    assert [p.name for p in (tmp_path / "models").iterdir()] == ["x-abc"]


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


def test_the_shipped_teacher_is_a_hugging_face_folder_that_has_learned_gsm8k_text(tokenizers):
    """tiny-math-teacher (experiments/tiny_teacher.py) unpacks into a folder AutoModelForCausalLM and AutoTokenizer load;
    on GSM8K problems it never trained on it beats its own architecture at initialization by far."""
    import torch
    from transformers import AutoModelForCausalLM

    from vocagno.training.metrics import bits_per_byte
    from vocagno.teacher.model import load_teacher
    from vocagno.core.tokenization import shipped_model_dir

    folder = shipped_model_dir("tiny-math-teacher")
    assert shipped_model_dir("tiny-math-teacher") == folder and (folder / "tokenizer.json").exists()
    assert load_tokenizer("tiny-math-teacher").get_vocab() == tokenizers["mistral"].get_vocab()
    teacher = load_teacher("tiny-math-teacher", "float32")
    assert teacher.config.model_type == "mistral" and teacher.num_parameters() * 2 <= 8 * 2**20  # <= 8 MB in bf16
    heldout = [json.loads(line)["text"] for line in open(os.path.join(os.path.dirname(__file__), "..", "..", "vocagno",
                                                                      "assets", "text", "gsm8k_heldout_100.jsonl"))]
    torch.manual_seed(0)
    untrained = AutoModelForCausalLM.from_config(teacher.config)
    trained_bpb = bits_per_byte(teacher, tokenizers["mistral"], heldout[:30])
    untrained_bpb = bits_per_byte(untrained, tokenizers["mistral"], heldout[:30])
    assert trained_bpb < 2.0 < 5.0 < untrained_bpb, (trained_bpb, untrained_bpb)


def test_vocabulary_fingerprints_stay_what_existing_shards_record(tokenizers):
    """The fingerprint shards record of each tokenizer (sha256 of its sorted token -> id pairs as JSON) stays the
    same however it is computed: shards converted before are still read."""
    from vocagno.data.shards import tokenizer_info

    assert {name: tokenizer_info(tokenizer, name).fingerprint for name, tokenizer in tokenizers.items()} == {
        "llama2": "a255706a2929068e", "codellama": "6bafdfb83eca97be", "mistral": "fc11e3a10805a88b",
        "qwen2.5": "0bcfe76c695a7b4b", "deepseek-llm": "e2903b87c944f85e"}


def test_a_tokenizers_description_follows_tokens_added_to_it():
    """vocagno.data.shards.tokenizer_info keeps a tokenizer's vocabulary digest between calls: a token added since
    changes the size and fingerprint it reports, as a tokenizer loaded afresh does."""
    from vocagno.data import shards
    from vocagno.data.shards import tokenizer_info

    tokenizer = load_tokenizer("mistral")
    before = tokenizer_info(tokenizer, "mistral")
    assert tokenizer_info(tokenizer, "mistral") == before == tokenizer_info(load_tokenizer("mistral"), "mistral")
    tokenizer.add_tokens(["<step>"])
    after = tokenizer_info(tokenizer, "mistral")
    assert after.vocab_size == before.vocab_size + 1 and after.fingerprint != before.fingerprint
    fresh = load_tokenizer("mistral")
    fresh.add_tokens(["<step>"])
    shards._by_content.cache_clear()  # computed afresh, not taken from `after`
    assert after == tokenizer_info(fresh, "mistral")


@pytest.mark.slow
def test_a_tokenizer_loaded_again_takes_the_vocabulary_of_the_same_content_and_not_of_another():
    """A tokenizer loaded again (a new object) is described from what was computed for the same content, not by
    reading and hashing its 151K tokens again; one whose content differs (a token added) is read."""
    from helpers import reached

    from vocagno.data.shards import vocabulary

    vocab, digest = vocabulary(load_tokenizer("qwen2.5"))
    again = load_tokenizer("qwen2.5")
    again.get_vocab = reached  # not read
    assert vocabulary(again) == (vocab, digest)
    changed = load_tokenizer("qwen2.5")
    changed.add_tokens(["<step>"])
    changed_vocab, changed_digest = vocabulary(changed)
    assert changed_vocab == {**vocab, "<step>": len(vocab)} and changed_digest != digest


def test_a_vocabulary_with_two_tokens_of_one_id_or_a_component_that_cant_be_saved_is_read_whole(tmp_path):
    """A tokenizer.json may give two tokens one id: its serialization keeps one of them, so a copy saved from it
    serializes the same with a token less, and each is described by its own vocabulary, whichever comes first. One
    with a component defined in Python, which can't be serialized, is read too."""
    from tokenizers import pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from vocagno.data.shards import vocabulary

    spec = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
            "pre_tokenizer": None, "post_processor": None, "decoder": None,
            "model": {"type": "WordLevel", "vocab": {"a": 0, "b": 0, "c": 1, "[UNK]": 2}, "unk_token": "[UNK]"}}
    (tmp_path / "two.json").write_text(json.dumps(spec))

    def load(name):
        return PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / f"{name}.json"))

    (tmp_path / "one.json").write_text(load("two").backend_tokenizer.to_str())

    def two_serialized_as_one():  # which of "a" and "b" the serialization keeps changes from one load to the next
        for _ in range(64):
            two = load("two")
            if two.backend_tokenizer.to_str() == (tmp_path / "one.json").read_text():
                return two
        pytest.fail("64 loads of two.json, none serialized as one.json")

    for order in ("two first", "one first"):
        two, one = two_serialized_as_one(), load("one")
        for tokenizer in (two, one) if order == "two first" else (one, two):
            assert sorted(vocabulary(tokenizer)[0]) == sorted(tokenizer.get_vocab()), order
        assert (len(vocabulary(two)[0]), len(vocabulary(one)[0])) == (4, 3)

    class Whole:
        def pre_tokenize(self, pretokenized):
            pass

    custom = load_tokenizer("mistral")
    custom.backend_tokenizer.pre_tokenizer = pre_tokenizers.PreTokenizer.custom(Whole())
    assert vocabulary(custom)[0] == load_tokenizer("mistral").get_vocab()


@pytest.mark.parametrize("name", SHIPPED_TOKENIZERS)
def test_a_copy_without_the_dummy_prefix_differs_only_there(tokenizers, name):
    """SentencePiece tokenizers (Llama-2's, Mistral's) prepend a "▁" to every text; their copy for pieces that go on
    from a document prepends none and tokenizes the rest as they do. Byte-level ones have no copy."""
    from vocagno.core.tokenization import has_dummy_prefix, without_dummy_prefix

    backend = tokenizers[name].backend_tokenizer
    copy = without_dummy_prefix(backend)
    assert has_dummy_prefix(backend) == (copy is not None) == (name in ("llama2", "codellama", "mistral"))
    if copy is None:
        return
    text = "x = 3 apples\n  and 4½ pears </s>"
    ours, theirs = backend.encode(text, add_special_tokens=False), copy.encode(text, add_special_tokens=False)
    assert ours.tokens[0] == "▁x" and theirs.tokens[0] == "x" and ours.tokens[1:] == theirs.tokens[1:]
    spec, copied = json.loads(backend.to_str()), json.loads(copy.to_str())
    assert {key for key in spec if spec[key] != copied[key]} <= {"normalizer", "pre_tokenizer"}
    assert not has_dummy_prefix(copy)


def test_a_copy_without_the_dummy_prefix_reads_special_tokens_as_its_tokenizer_does():
    # Whether a tokenizer reads "</s>" as text is not in its serialization: the copy read it as the special token.
    from vocagno.core.tokenization import without_dummy_prefix

    backend = load_tokenizer("mistral").backend_tokenizer
    for splitting in (False, True):
        backend.encode_special_tokens = splitting
        copy = without_dummy_prefix(backend)
        assert copy.encode_special_tokens == splitting
        ours, theirs = (tokenizer.encode("x 4 pears </s>", add_special_tokens=False).tokens
                        for tokenizer in (backend, copy))
        assert ours[0] == "▁" + theirs[0] and ours[1:] == theirs[1:] and ("</s>" in ours) == (not splitting)


def test_text_copies_of_a_tokenizer_are_made_once_per_content_and_leave_the_tokenizer_as_it_was():
    # Copying a 151K vocabulary's tokenizer (twice: as it is, without the dummy prefix) took about a second and a
    # half: every conversion, part and Encoder paid it again for the same tokenizer file.
    from vocagno.conversion.packer import Encoder
    from vocagno.core.tokenization import text_tokenizers

    first, second = load_tokenizer("qwen2.5"), load_tokenizer("qwen2.5")
    assert first.backend_tokenizer is not second.backend_tokenizer
    copies = text_tokenizers(first.backend_tokenizer)
    assert text_tokenizers(second.backend_tokenizer) is copies
    assert not first.backend_tokenizer.encode_special_tokens and copies[0].encode_special_tokens
    assert "<|endoftext|>" not in copies[0].encode("a <|endoftext|>").tokens  # text stays text
    assert "<|endoftext|>" in first.backend_tokenizer.encode("a <|endoftext|>").tokens  # the tokenizer is untouched

    llama = load_tokenizer("llama2")
    assert Encoder(first, second).same and not Encoder(llama, first).same
    second.add_tokens(["<vocagno_new>"])  # another content: copies of its own, which know the added token
    assert text_tokenizers(second.backend_tokenizer) is not copies
    assert "<vocagno_new>" in text_tokenizers(second.backend_tokenizer)[0].encode("x <vocagno_new>").tokens


@pytest.mark.slow
def test_text_copies_are_kept_for_the_latest_tokenizers_only():
    # A process that converts with many tokenizers (a notebook, a sweep) would otherwise hold two copies of each.
    from vocagno.core.tokenization import _text_copies, text_tokenizers

    first, later = load_tokenizer("llama2"), load_tokenizer("llama2")
    copies = text_tokenizers(first.backend_tokenizer)
    assert text_tokenizers(later.backend_tokenizer) is copies
    kept = _text_copies.cache_info().maxsize
    for i in range(kept):  # as many other contents as are kept
        later.add_tokens([f"<vocagno_{i}>"])
        text_tokenizers(later.backend_tokenizer)
    assert _text_copies.cache_info().currsize == kept == 4
    assert text_tokenizers(later.backend_tokenizer) is text_tokenizers(later.backend_tokenizer)  # the latest kept
    assert text_tokenizers(first.backend_tokenizer) is not copies  # the first was let go: made again


def test_the_vocabulary_cache_keeps_no_tokenizer_alive():
    """The cache by content keeps vocabularies, not the tokenizers they were read from (a 151K tokenizer is large)."""
    import gc
    import weakref

    from vocagno.data.shards import _by_content, vocabulary

    _by_content.cache_clear()
    tokenizer = load_tokenizer("qwen2.5")
    vocabulary(tokenizer)
    assert _by_content.cache_info().currsize == 1
    gone = weakref.ref(tokenizer)
    del tokenizer
    gc.collect()
    assert gone() is None


def test_a_vocabulary_with_two_tokens_of_one_id_is_read_for_its_tokenizer_and_kept_for_no_other():
    """Two tokens of one id: the tokenizer's serialization keeps one of them, so its content does not identify the
    vocabulary. It is read for the tokenizer asked about, and another tokenizer of that content reads its own."""
    from vocagno.data.shards import _by_content, vocabulary

    _by_content.cache_clear()
    odd = load_tokenizer("mistral")
    read = odd.get_vocab()
    odd.get_vocab = lambda: {**read, "<twin>": 5}  # a second token of id 5
    vocab, _ = vocabulary(odd)
    assert vocab["<twin>"] == 5 and _by_content.cache_info().currsize == 0
    plain, _ = vocabulary(load_tokenizer("mistral"))
    assert "<twin>" not in plain and _by_content.cache_info().currsize == 1


def test_a_tokenizer_whose_pattern_panics_on_a_text_is_refused_in_one_line(tmp_path):
    """A Rust panic is a ``BaseException`` (pyo3's ``PanicException``) that no ``except Exception`` takes: it is
    refused as what it is, naming the tokenizer, the text and the fix."""
    from vocagno.errors import Refused

    folder = backtracking_tokenizer(tmp_path / "backtracking")
    tokenizer = load_tokenizer(str(folder))
    assert encode_with_offsets(tokenizer, "one two!")[0].tolist() == encode_with_offsets(
        load_tokenizer("qwen2.5"), "one two!")[0].tolist()  # what does not backtrack encodes as before
    with pytest.raises(Refused) as refused:
        encode_with_offsets(tokenizer, "a" * 40 + " and more")
    assert str(refused.value) == (
        f"tokenizer {str(folder)!r}: refused: it panicked encoding a text of 49 characters beginning "
        f"{'a' * 32!r} (PanicException: Onig: Regex search error: retry-limit-in-match over) {PANIC_FIX}")
