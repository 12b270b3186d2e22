"""align / align_batch against the plain-Python definition, hand cases, input checks and IoU/IoS."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vocagno.core.alignment import align, align_batch, align_reference, alignment_quality, chunk_align


@st.composite
def offset_sequences(draw, n_chars):
    """Valid offsets over a text of n_chars characters, in the shapes real tokenizers produce: pieces in text order,
    runs of tokens sharing one span (byte pieces of a character), gaps (characters a normalizer dropped), a token
    reaching back to the previous token's start (Qwen's 'ĠâĪ' (36, 38) then '«' (37, 38)), and empty spans anywhere,
    at (0, 0) like HF specials or at their place in the text."""
    cuts = sorted(draw(st.sets(st.integers(1, max(n_chars - 1, 1)), max_size=max(n_chars - 1, 0))))
    bounds = [0] + [c for c in cuts if c < n_chars] + [n_chars] if n_chars else [0]
    offsets, previous_start = [], 0
    for s, e in zip(bounds[:-1], bounds[1:]):
        kind = draw(st.sampled_from(["plain", "plain", "repeat", "gap", "reach_back"]))
        if kind == "gap":
            continue
        if kind == "reach_back" and offsets:
            s = previous_start
        offsets += [(s, e)] * (draw(st.integers(2, 4)) if kind == "repeat" else 1)
        previous_start = s
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, n_chars))
        position = draw(st.integers(0, len(offsets)))
        offsets.insert(position, (0, 0) if draw(st.booleans()) else (at, at))
    return np.array(offsets, dtype=np.int64).reshape(-1, 2)


@st.composite
def offset_pairs(draw):
    n_chars = draw(st.integers(0, 40))
    return draw(offset_sequences(n_chars)), draw(offset_sequences(n_chars))


def test_empty_spans_sit_anywhere_and_stay_unmapped():
    # BOS at the start, a pad at the end, a special at its place in the middle: none of them maps or breaks the order.
    student = np.array([[0, 0], [0, 3], [3, 5], [5, 5], [5, 9], [0, 0]])
    teacher = np.array([[0, 0], [0, 2], [2, 4], [4, 4], [4, 9], [0, 0]])
    start, end = align(student, teacher)
    assert start.tolist() == [0, 1, 2, 0, 4, 0]
    assert end.tolist() == [0, 3, 5, 0, 5, 0]  # (3, 5) overlaps teacher 2 and 4; the empty teacher 3 lies between


def test_hand_cases():
    # Student "▁probability" (3, 15) over teacher "Ġprob" "ability"; byte pieces sharing one character's span.
    student = np.array([[0, 3], [3, 15], [15, 16], [15, 16], [15, 16], [16, 17]])
    teacher = np.array([[0, 3], [3, 8], [8, 15], [15, 16], [16, 18]])
    start, end = align(student, teacher)
    assert list(zip(start.tolist(), end.tolist())) == [(0, 1), (1, 3), (3, 4), (3, 4), (3, 4), (4, 5)]
    # A student character that no teacher token covers is unmapped.
    start, end = align([[0, 1], [1, 2], [2, 3]], [[0, 1], [2, 3]])
    assert list(zip(start.tolist(), end.tolist())) == [(0, 1), (0, 0), (1, 2)]


@settings(max_examples=400, deadline=None)
@given(offset_pairs())
def test_align_equals_reference(pair):
    student, teacher = pair
    start, end = align(student, teacher)
    ref_start, ref_end = align_reference(student.tolist(), teacher.tolist())
    assert start.tolist() == ref_start
    assert end.tolist() == ref_end


@settings(max_examples=150, deadline=None)
@given(st.lists(offset_pairs(), min_size=1, max_size=4))
def test_align_batch_equals_align_row_by_row(pairs):
    n = max(len(s) for s, _ in pairs)
    m = max(len(t) for _, t in pairs)
    students = torch.zeros(len(pairs), n, 2, dtype=torch.int32)  # padding: empty spans
    teachers = torch.zeros(len(pairs), m, 2, dtype=torch.int32)
    for b, (s, t) in enumerate(pairs):
        students[b, : len(s)] = torch.from_numpy(s)
        teachers[b, : len(t)] = torch.from_numpy(t)
    start, end = align_batch(students, teachers)
    assert start.dtype == end.dtype == torch.int64
    for b, (s, t) in enumerate(pairs):
        row_start, row_end = align(s, t)
        assert start[b, : len(s)].tolist() == row_start.tolist()
        assert end[b, : len(s)].tolist() == row_end.tolist()
        assert (start[b, len(s) :] == end[b, len(s) :]).all()  # student padding is unmapped


def _brute_quality(student, teacher, start, end):
    ious, ioss = [], []
    for (s, e), a, b in zip(student.tolist(), start.tolist(), end.tolist()):
        if a == b:
            ious.append(np.nan)
            ioss.append(np.nan)
            continue
        mine = set(range(s, e))
        theirs = set().union(*(set(range(ts, te)) for ts, te in teacher[a:b].tolist()))
        ious.append(len(mine & theirs) / len(mine | theirs))
        ioss.append(len(mine & theirs) / len(mine))
    return np.array(ious), np.array(ioss)


@settings(max_examples=300, deadline=None)
@given(offset_pairs())
def test_quality_equals_set_arithmetic(pair):
    student, teacher = pair
    start, end = align(student, teacher)
    iou, ios = alignment_quality(student, teacher, start, end)
    want_iou, want_ios = _brute_quality(student, teacher, start, end)
    np.testing.assert_allclose(iou, want_iou, equal_nan=True)
    np.testing.assert_allclose(ios, want_ios, equal_nan=True)


def test_quality_hand_case():
    # Student "abcd" (0, 4) over teacher "ab" (0, 2) + "cdef" (2, 6): 4 shared characters of 6, all of the student's.
    student, teacher = np.array([[0, 4]]), np.array([[0, 2], [2, 6]])
    iou, ios = alignment_quality(student, teacher, *align(student, teacher))
    assert iou.tolist() == [4 / 6] and ios.tolist() == [1.0]


@pytest.mark.parametrize(
    "student, teacher, message",
    [
        (np.zeros((3, 3), dtype=int), np.zeros((3, 2), dtype=int), "student_offsets: offsets must have shape"),
        (np.zeros((3, 2), dtype=int), np.zeros(4, dtype=int), "teacher_offsets: offsets must have shape"),
        (np.array([[0, 1], [-1, 2]]), np.array([[0, 2]]), "student_offsets: negative offset"),
        (np.array([[0, 2]]), np.array([[0, 1], [3, 2]]), r"teacher_offsets: span start > end at token 1: \[3, 2\]"),
        (np.array([[2, 3], [0, 1]]), np.array([[0, 3]]), "student_offsets: offsets are not sorted"),
        (np.array([[0, 3]]), np.array([[0, 3], [1, 2]]), "teacher_offsets: offsets are not sorted"),
        (np.array([[0.0, 1.0]]), np.array([[0, 1]]), "student_offsets: offsets must be integers"),
    ],
)
def test_bad_offsets_are_refused(student, teacher, message):
    with pytest.raises(ValueError, match=message):
        align(student, teacher)
    if student.ndim == 2 and teacher.ndim == 2 and student.shape[1] == teacher.shape[1] == 2:
        with pytest.raises(ValueError, match=message.split(":")[0]):
            align_batch(torch.from_numpy(student)[None], torch.from_numpy(teacher)[None])


def test_bad_batches_are_refused():
    with pytest.raises(ValueError, match="batch sizes differ"):
        align_batch(torch.zeros(2, 3, 2, dtype=torch.long), torch.zeros(1, 3, 2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"shape \(batch, n, 2\)"):
        align_batch(torch.zeros(3, 2, dtype=torch.long), torch.zeros(1, 3, 2, dtype=torch.long))


def test_empty_inputs():
    start, end = align([], [[0, 3]])
    assert start.shape == end.shape == (0,)
    start, end = align([[0, 3]], [])
    assert start.tolist() == end.tolist() == [0]


def test_chunk_alignment_pairs_the_kth_chunks_cut_by_token_count():
    """10 student and 7 teacher tokens in 3 chunks: 4, 4, 2 student tokens against 3, 3, 1 teacher tokens; a padded
    row's positions past its length are unmapped; one chunk maps everything to everything."""
    start, end = chunk_align(torch.tensor([10, 5]), torch.tensor([7, 4]), 3, 12)
    assert start[0].tolist() == [0] * 4 + [3] * 4 + [6] * 2 + [0] * 2
    assert end[0].tolist() == [3] * 4 + [6] * 4 + [7] * 2 + [0] * 2
    assert list(zip(start[1].tolist(), end[1].tolist()))[:6] == [(0, 2), (0, 2), (2, 4), (2, 4), (4, 4), (0, 0)]
    start, end = chunk_align(torch.tensor([10]), torch.tensor([7]), 1, 10)
    assert (start == 0).all() and (end == 7).all()
    with pytest.raises(ValueError, match="num_chunks"):
        chunk_align(torch.tensor([10]), torch.tensor([7]), 0, 10)
