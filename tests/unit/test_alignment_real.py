"""Alignment with the real tokenizers of the paper's models on real math text and adversarial unicode."""

import itertools
import unicodedata

import numpy as np
import pytest

from vocagno.core.alignment import align, align_reference, alignment_quality, vocab_overlap
from vocagno.core.tokenization import SHIPPED_TOKENIZERS, encode_with_offsets

PAIRS = list(itertools.permutations(SHIPPED_TOKENIZERS, 2))

# Written to break offset conventions: leading and repeated spaces, tabs and newlines, CJK, emoji (ZWJ sequences,
# flags, skin tones), scripts with combining marks, LaTeX, math symbols, fullwidth forms, ligatures, a BOM.
ADVERSARIAL = [
    "   leading spaces, then  two  and\tone tab\n\n\nand newlines\r\nCRLF",
    " x",
    "\n",
    "日本語のテキストと中文混合 with English 한국어 문장",
    "Emoji: 😀 👨‍👩‍👧‍👦 🇫🇷 👍🏽 ❤️ 1️⃣",
    "LaTeX: $\\int_0^\\infty e^{-x^2}\\,dx = \\frac{\\sqrt{\\pi}}{2}$ and \\(\\sum_{k=1}^{n} k^2\\)",
    "∀ε>0 ∃δ>0: |x−a|<δ ⇒ |f(x)−f(a)|<ε; ∑∏√∞≤≥≠≈ℝℕℤ𝔼𝕏",
    "Ｆｕｌｌｗｉｄｔｈ ＡＢＣ １２３ and ligatures ﬁ ﬂ ﬀ",
    "\ufeffBOM at the start, zero\u200bwidth space, soft\u00adhyphen",
    "العربية من اليمين إلى اليسار עברית हिन्दी देवनागरी",
    "Ünïcödé àçcèñts précomposed",
]

# Characters a teacher's normalizer may fold away (NFC composes them into the character before): the student tokens
# over them overlap no teacher token. These are the cases we know; test_unmapped_only_where_normalizer_folds checks
# no other unmapped token appears.
FOLDED = [
    "Cafe\u0301 and re\u0301sume\u0301 with combining acute accents",
    "Hangul jamo \u1100\u1161\u11a8 composes under NFC",
    "A\u030a is Å, o\u0308 is ö",
]


@pytest.fixture(scope="module")
def encoded(tokenizers, math_texts):
    """Every text encoded once by every tokenizer, with its own specials (BOS where it adds one)."""
    texts = math_texts + ADVERSARIAL + FOLDED
    return texts, {
        name: [encode_with_offsets(tok, text, add_special_tokens=True) for text in texts]
        for name, tok in tokenizers.items()
    }


def _teacher_coverage(teacher_offsets, n_chars):
    covered = np.zeros(n_chars, dtype=bool)
    for s, e in teacher_offsets.tolist():
        covered[s:e] = True
    return covered


@pytest.mark.parametrize("student_name, teacher_name", PAIRS)
def test_real_text_maps_every_token_with_ios_one(encoded, math_texts, student_name, teacher_name):
    texts, by_tokenizer = encoded
    n_tokens = 0
    for i, text in enumerate(texts[: len(math_texts)] + ADVERSARIAL):
        (_, student), (_, teacher) = by_tokenizer[student_name][i], by_tokenizer[teacher_name][i]
        start, end = align(student, teacher)
        nonempty = student[:, 0] < student[:, 1]
        assert (start < end)[nonempty].all(), f"unmapped student token in text {i}: {text[:60]!r}"
        assert (start == end)[~nonempty].all()  # specials stay unmapped
        iou, ios = alignment_quality(student, teacher, start, end)
        assert (ios[nonempty] == 1).all(), f"IoS < 1 in text {i}"
        assert ((iou[nonempty] > 0) & (iou[nonempty] <= 1)).all()
        for (s, e), a, b in zip(student[nonempty].tolist(), start[nonempty], end[nonempty]):
            spans = teacher[a:b]
            assert ((spans[:, 0] < e) & (spans[:, 1] > s)).all(), "a teacher token in the range misses the student's"
        if i < 40:  # the O(N * M) definition on a slice
            assert (start.tolist(), end.tolist()) == align_reference(student.tolist(), teacher.tolist())
        n_tokens += int(nonempty.sum())
    assert n_tokens > 40_000


@pytest.mark.parametrize("student_name, teacher_name", PAIRS)
def test_unmapped_only_where_normalizer_folds(tokenizers, encoded, student_name, teacher_name):
    """A student token is unmapped exactly when the teacher's tokens cover none of its characters, and that only
    happens where the teacher's normalizer changes the text (Qwen's NFC); never for teachers without one."""
    texts, by_tokenizer = encoded
    normalizer = tokenizers[teacher_name].backend_tokenizer.normalizer
    for i in range(len(texts) - len(ADVERSARIAL) - len(FOLDED), len(texts)):
        text = texts[i]
        (_, student), (_, teacher) = by_tokenizer[student_name][i], by_tokenizer[teacher_name][i]
        start, end = align(student, teacher)
        covered = _teacher_coverage(teacher, len(text))
        for (s, e), mapped in zip(student.tolist(), (start < end).tolist()):
            if s < e:
                assert mapped == covered[s:e].any()
        folds = normalizer is not None and normalizer.normalize_str(text) != text
        if not folds:
            nonempty = student[:, 0] < student[:, 1]
            assert (start < end)[nonempty].all(), f"{teacher_name} folds nothing, yet {text!r} has unmapped tokens"


def test_nfc_folding_is_reported_for_qwen(tokenizers):
    """Qwen's NFC joins 'e' + U+0301 into one token spanning only the 'e': Llama's token over the combining mark
    overlaps no Qwen token, so it is unmapped; the other direction stays mapped."""
    text = "Cafe\u0301"
    s_ids, student = encode_with_offsets(tokenizers["llama2"], text)
    _, teacher = encode_with_offsets(tokenizers["qwen2.5"], text)
    start, end = align(student, teacher)
    unmapped = [text[s:e] for (s, e), a, b in zip(student.tolist(), start, end) if a == b]
    assert unmapped == ["\u0301"]
    assert teacher[:, 1].max() == len(text) - 1  # Qwen's last token ends before the mark
    back_start, back_end = align(teacher, student)
    assert (back_start < back_end).all()
    _, ios = alignment_quality(teacher, student, back_start, back_end)
    assert (ios == 1).all()
    # DeepSeek has no normalizer: the same text maps fully.
    _, deepseek = encode_with_offsets(tokenizers["deepseek-llm"], text)
    start, end = align(student, deepseek)
    assert (start < end).all()
    assert unicodedata.normalize("NFC", text) != text


def test_offset_conventions_of_the_real_tokenizers(tokenizers):
    """The shapes the alignment must handle do occur: SentencePiece byte fallback (several tokens, one character),
    byte-level BPE splitting one character, '▁' pieces spanning the space before a word."""
    text = "x ∫ 😀"
    _, llama = encode_with_offsets(tokenizers["llama2"], text)
    _, deepseek = encode_with_offsets(tokenizers["deepseek-llm"], text)
    assert llama.tolist().count([4, 5]) == 4  # 😀 as four <0x..> byte pieces
    assert deepseek.tolist().count([2, 3]) == 2  # ∫ as two byte-level pieces
    ids, offsets = encode_with_offsets(tokenizers["llama2"], "a probability")
    assert tokenizers["llama2"].convert_ids_to_tokens(int(ids[-1])) == "▁probability"
    assert offsets[-1].tolist() == [1, 13]  # the '▁' covers the space


def test_vocab_overlap_matches_the_paper(tokenizers):
    overlap = vocab_overlap(tokenizers["llama2"], tokenizers["qwen2.5"])
    assert (overlap.shared, overlap.teacher_vocab_size) == (9587, 151643)
    assert f"{overlap.fraction:.2%}" == "6.32%"
    same = vocab_overlap(tokenizers["llama2"], tokenizers["llama2"])
    assert same.fraction == 1.0


def test_chunk_overlap_falls_as_chunks_get_finer_while_token_level_ios_is_one(tokenizers, math_texts):
    """Figures 3 and 6 of the paper, redrawn on real text: chunks cut by token count on each side cover less and
    less of each other's characters as n grows; token-level alignment covers every mapped student character."""
    from vocagno.core.alignment import chunk_overlap

    text = "\n\n".join(math_texts[:20])
    s_offsets = encode_with_offsets(tokenizers["llama2"], text)[1]
    t_offsets = encode_with_offsets(tokenizers["qwen2.5"], text)[1]
    overlap = {n: chunk_overlap(s_offsets, t_offsets, n) for n in (1, 4, 16, 64, 256)}
    ios = [overlap[n][1] for n in (1, 4, 16, 64, 256)]
    assert ios[0] > 0.99 and ios[-1] < 0.5 and all(a >= b for a, b in zip(ios, ios[1:])), overlap
    assert all(overlap[n][0] <= overlap[n][1] for n in overlap)  # IoU <= IoS
    start, end = align(s_offsets, t_offsets)
    _, token_ios = alignment_quality(s_offsets, t_offsets, start, end)
    assert np.nanmin(token_ios) == 1.0
