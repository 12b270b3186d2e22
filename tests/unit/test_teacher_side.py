"""The teacher side made from student tokens alone (vocagno.teacher.side), against the converter and real tokenizers."""

import numpy as np
import pytest
import torch
from streaming import StreamingDataset

from vocagno.conversion.convert import main as convert_main
from vocagno.core.alignment import align
from vocagno.data.dataset import TeacherGuidedCollator
from vocagno.teacher.side import StudentText, TeacherSide
from vocagno.core.tokenization import ASSETS, SHIPPED_TOKENIZERS, encode_with_offsets

TEXT = "Hello world 😀 ∫x²dx = x³/3, 中文\n\n  two  spaces\tand a tab. </s> <|endoftext|> stay text."


@pytest.mark.parametrize("name", SHIPPED_TOKENIZERS)
def test_the_text_of_a_row_of_ids_is_the_text_they_were_made_from(tokenizers, name):
    """Byte-level tokenizers give the text and the fast tokenizer's offsets exactly; SentencePiece ones give it after
    a space (a row's first "▁" is taken as the space before a word cut from a document), offsets one further on."""
    tokenizer = tokenizers[name]
    ids, offsets = encode_with_offsets(tokenizer, TEXT)
    reader = StudentText(tokenizer)
    text, spans = reader.row(ids)
    if reader.dummy_prefix:
        assert text == " " + TEXT
        assert np.array_equal(spans[1:], offsets[1:] + 1) and spans[0].tolist() == [0, offsets[0, 1] + 1]
    else:
        assert text == TEXT and np.array_equal(spans, offsets)


@pytest.mark.parametrize("name", ["llama2", "qwen2.5"])
def test_a_row_cut_inside_a_character_leaves_its_bytes_unmapped(tokenizers, name):
    tokenizer = tokenizers[name]
    ids, offsets = encode_with_offsets(tokenizer, "ab 🦜 cd")
    emoji = np.flatnonzero((offsets[:, 0] <= 3) & (offsets[:, 1] > 3))
    assert len(emoji) >= 3, "the emoji is in several tokens"
    reader = StudentText(tokenizer)
    text, spans = reader.row(ids)
    assert all(text[slice(*spans[k])].endswith("🦜") for k in emoji)  # each token holding its bytes spans it
    cut = ids[emoji[-1]:]  # the row starts inside the emoji: its last bytes are no character
    text, spans = reader.row(cut)
    assert "🦜" not in text and text.endswith(" cd") and spans[0, 0] == spans[0, 1]
    assert (spans[1:, 1] > spans[1:, 0]).all()


def test_documents_ended_by_eos_are_the_teachers_documents(tokenizers):
    """A row as llm-foundry concatenates documents (BOS doc EOS BOS doc EOS ...): the teacher gets each document on
    its own, its end-of-text token where the student's EOS is, and its own BOS where the student's starts one."""
    student = tokenizers["llama2"]
    docs = ["Question: 2+2?\nAnswer: 4", "Sum: 7 apples.", "∫x dx"]
    ids = np.concatenate([np.r_[student.bos_token_id, encode_with_offsets(student, d)[0], student.eos_token_id]
                          for d in docs])
    for teacher_name in ("qwen2.5", "mistral"):
        teacher = tokenizers[teacher_name]
        side = TeacherSide(student, teacher)
        sample = side.sample(ids)
        eot = teacher.convert_tokens_to_ids("<|endoftext|>" if teacher_name == "qwen2.5" else "</s>")
        bos = [] if teacher_name == "qwen2.5" else [teacher.bos_token_id]
        want = []
        for doc in docs:
            want += bos + encode_with_offsets(teacher, doc)[0].tolist() + [eot]
        assert sample["teacher_ids"].tolist() == want, teacher_name
        assert sample["text"] == "".join(docs)  # the dummy prefix of each document is no text


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    def convert(student, teacher):
        root = tmp_path_factory.mktemp(f"{student}-{teacher}")
        unicode_docs = root / "unicode.jsonl"
        unicode_docs.write_text("".join(
            f'{{"text": "{line}"}}\n' for line in (ASSETS / "text" / "demo.txt").read_text().replace('"', "'").split("\n")
            if line.strip()), encoding="utf-8")
        convert_main(["--input", str(ASSETS / "text" / "gsm8k_heldout_100.jsonl"), str(unicode_docs),
                      "--student-tokenizer", student, "--teacher-tokenizer", teacher, "--seq-len", "128",
                      "--out-root", str(root / "shards")])
        dataset = StreamingDataset(local=str(root / "shards"), shuffle=False)
        return [dict(dataset[i]) for i in range(len(dataset))]
    return convert


@pytest.mark.parametrize("student, teacher", [("llama2", "qwen2.5"), ("qwen2.5", "mistral")])
def test_the_teacher_side_equals_the_converters_inside_each_row(tokenizers, converted, student, teacher):
    """Where they may differ (module docstring): at a row's two ends, where the converter's teacher tokens run past
    the row's characters, and where a document starts exactly at a row's start. The converter's rows start with the
    student's BOS mid-document; without it they are rows as llm-foundry cuts them."""
    samples = converted(student, teacher)
    side = TeacherSide(tokenizers[student], tokenizers[teacher])
    bos = tokenizers[student].bos_token_id if student == "llama2" else None
    identical = 0
    for sample in samples:
        ids = np.asarray(sample["student_ids"], np.int64)
        s_offsets = np.asarray(sample["student_offsets"], np.int64)
        if bos is not None:
            assert ids[0] == bos
            ids, s_offsets = ids[1:], s_offsets[1:]
        t_ids, t_offsets = np.asarray(sample["teacher_ids"], np.int64), np.asarray(sample["teacher_offsets"], np.int64)
        made = side.sample(ids)
        made_ids = made["teacher_ids"].numpy()
        want = [tuple(t_ids[a:b]) for a, b in zip(*align(s_offsets, t_offsets))]
        got = [tuple(made_ids[a:b]) for a, b in zip(*align(made["student_offsets"].numpy(),
                                                             made["teacher_offsets"].numpy()))]
        assert want[3:-3] == got[3:-3]
        identical += np.array_equal(t_ids, made_ids)
    assert len(samples) > 100 and identical / len(samples) > 0.75, f"{identical} of {len(samples)} rows identical"


def test_a_batch_of_student_tokens_becomes_a_collator_batch(tokenizers, converted):
    samples = converted("llama2", "qwen2.5")[:4]
    collator = TeacherGuidedCollator(tokenizers["llama2"].eos_token_id, tokenizers["qwen2.5"].pad_token_id)
    want = collator([{k: torch.from_numpy(np.asarray(v, np.int64)) if k != "text" else v for k, v in s.items()}
                     for s in samples])
    ids = want["input_ids"].clone()
    mask = torch.ones_like(ids)
    mask[1, 100:] = 0  # a right-padded row
    labels = torch.where(mask.bool(), ids, -100)
    side = TeacherSide(tokenizers["llama2"], tokenizers["qwen2.5"])
    made = side({"input_ids": ids, "attention_mask": mask, "labels": labels})
    assert set(made) == set(want)
    assert made["labels"] is labels  # the batch's own labels stay
    for key in ("align_start", "align_end", "token_bytes", "special_tokens"):
        assert torch.equal(made[key][[0, 2, 3], 3:-3], want[key][[0, 2, 3], 3:-3]), key
        assert (made[key][1, 100:] == 0).all(), key
    with pytest.raises(ValueError, match="padded left"):
        side({"input_ids": ids, "attention_mask": mask.flip(1)})


def test_a_packed_teacher_side_unpacks_to_the_same_tensors_an_empty_one_included():
    from vocagno.teacher.side import PACKED, _pack, unpack_teacher_side

    batch = {"input_ids": torch.arange(6).reshape(2, 3), "align_start": torch.ones(2, 3, dtype=torch.long),
             "special_tokens": torch.tensor([[True, False, False], [False, False, True]]),
             "teacher_input_ids": torch.zeros(2, 0, dtype=torch.long), "labels": torch.full((2, 3), -100)}
    packed = _pack(batch)
    assert set(packed) == {"input_ids", "labels", PACKED} and packed[PACKED].shape[0] == 2
    unpacked = unpack_teacher_side(packed)
    assert unpacked.keys() == batch.keys()
    for key, value in batch.items():
        assert unpacked[key].dtype == value.dtype and torch.equal(unpacked[key], value), key


def test_a_teacher_tokenizer_that_panics_on_a_rows_text_is_refused_in_one_line(tokenizers, tmp_path):
    """The teacher tokenizer of a yaml may be a folder from elsewhere: a Rust panic on a row's text (Oniguruma's
    retry limit in its pre-tokenizer pattern) is refused naming the tokenizer, the text and the fix."""
    from panicking import PANIC_FIX, backtracking_tokenizer

    from vocagno.core.tokenization import load_tokenizer
    from vocagno.errors import Refused

    folder = backtracking_tokenizer(tmp_path / "teacher")
    side = TeacherSide(tokenizers["llama2"], load_tokenizer(str(folder)))
    ids = encode_with_offsets(tokenizers["llama2"], "(" + "a" * 40 + ")")[0]  # the row's text: " (aaa...)"
    with pytest.raises(Refused) as refused:
        side({"input_ids": torch.from_numpy(ids)[None]})
    assert str(refused.value).startswith(f"tokenizer {str(folder)!r}: refused: it panicked encoding a text of 43 "
                                         f"characters beginning {' (' + 'a' * 30!r} (PanicException: Onig: ")
    assert str(refused.value).endswith(PANIC_FIX)
