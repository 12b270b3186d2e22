"""The teacher guided loss: hand-computed cases, loop references, Rho-1 as the special case, gradients."""

import math

import pytest
import torch
import torch.nn.functional as F

from vocagno.core.loss import (
    AGGREGATIONS, aggregate_ranges, guided_loss, select_random, select_top, teacher_token_loss, token_cross_entropy,
)

NAN = float("nan")


def logits_with_losses(losses, labels, vocab=5):
    """Logits [1, N, V] whose cross-entropy at token i is exactly losses[i]: 0 everywhere but x at the label, where
    CE = log(e^x + V - 1) - x, solved for x."""
    logits = torch.zeros(1, len(losses), vocab, dtype=torch.float64)
    for i, (loss, label) in enumerate(zip(losses, labels)):
        logits[0, i, label] = math.log((vocab - 1) / (math.exp(loss) - 1))
    return logits


def test_token_cross_entropy_matches_torch():
    logits = torch.randn(2, 6, 11, dtype=torch.bfloat16)
    targets = torch.randint(0, 11, (2, 6))
    targets[0, 2] = -100
    loss = token_cross_entropy(logits, targets)
    assert loss.dtype == torch.float32 and loss.shape == (2, 6)
    assert loss[0, 2] == 0
    want = F.cross_entropy(logits.float().view(-1, 11), targets.view(-1), reduction="none", ignore_index=-100)
    torch.testing.assert_close(loss.view(-1), want)


def test_teacher_token_loss_chunked_equals_full_logits():
    torch.manual_seed(0)
    hidden = torch.randn(3, 9, 8)
    head = torch.nn.Linear(8, 50, bias=False)
    ids = torch.randint(0, 50, (3, 9))
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[1, 6:] = 0  # right padding
    mask[2, :2] = 0  # left padding
    loss = teacher_token_loss(hidden, head, ids, mask, chunk_size=5)
    full = F.cross_entropy(head(hidden[:, :-1]).reshape(-1, 50), ids[:, 1:].reshape(-1), reduction="none").view(3, 8)
    assert torch.isnan(loss[:, 0]).all()
    torch.testing.assert_close(loss[0, 1:], full[0])
    torch.testing.assert_close(loss[1, 1:6], full[1, :5])
    assert torch.isnan(loss[1, 6:]).all()
    assert torch.isnan(loss[2, :3]).all()  # a token after padding has no real context
    torch.testing.assert_close(loss[2, 3:], full[2, 2:])
    assert not loss.requires_grad


def test_aggregate_hand_cases():
    values = torch.tensor([[NAN, 1.0, 4.0, 2.0, NAN, 3.0]])
    start = torch.tensor([[0, 1, 1, 3, 4, 2, 0]])
    end = torch.tensor([[1, 2, 4, 6, 5, 2, 6]])
    want = {
        "max": [NAN, 1.0, 4.0, 3.0, NAN, NAN, 4.0],
        "min": [NAN, 1.0, 1.0, 2.0, NAN, NAN, 1.0],
        "sum": [NAN, 1.0, 7.0, 5.0, NAN, NAN, 10.0],
        "mean": [NAN, 1.0, 7 / 3, 2.5, NAN, NAN, 2.5],
    }
    for how, expected in want.items():
        torch.testing.assert_close(
            aggregate_ranges(values, start, end, how), torch.tensor([expected]), equal_nan=True, msg=how
        )


def aggregate_loop(values, start, end, how):
    out = torch.full(start.shape, NAN, dtype=values.dtype)
    for b in range(start.shape[0]):
        for i in range(start.shape[1]):
            chunk = [v for v in values[b, start[b, i] : end[b, i]].tolist() if not math.isnan(v)]
            if chunk:
                out[b, i] = {"max": max, "min": min, "sum": sum, "mean": lambda c: sum(c) / len(c)}[how](chunk)
    return out


def random_ranges(batch, n, m, generator):
    start = torch.randint(0, m, (batch, n), generator=generator)
    length = torch.randint(0, 9, (batch, n), generator=generator)
    end = (start + length).clamp(max=m)
    unmapped = torch.rand(batch, n, generator=generator) < 0.1
    return start.masked_fill(unmapped, 0), end.masked_fill(unmapped, 0)


@pytest.mark.parametrize("how", AGGREGATIONS)
def test_aggregate_equals_loop(how):
    g = torch.Generator().manual_seed(1)
    for m in (1, 2, 7, 64, 100):
        values = torch.rand(3, m, generator=g) * 10
        values[torch.rand(3, m, generator=g) < 0.2] = NAN
        start, end = random_ranges(3, 40, m, g)
        torch.testing.assert_close(
            aggregate_ranges(values, start, end, how), aggregate_loop(values, start, end, how), equal_nan=True
        )


def test_guided_loss_hand_case():
    # Five labeled tokens, one without a teacher range (an unmapped special), one ignored position.
    student = [2.0, 1.0, 3.0, 0.5, 4.0, 1.5]
    labels = torch.tensor([[1, 2, 3, 4, 0, -100]])
    logits = logits_with_losses(student, [1, 2, 3, 4, 0, 0])
    teacher = torch.tensor([[NAN, 0.5, 2.9, 0.1, 0.3, 9.0]])
    start = torch.tensor([[1, 2, 3, 4, 0, 5]])
    end = torch.tensor([[2, 3, 5, 5, 0, 6]])
    # Scores (max aggregation): 2-0.5=1.5, 1-2.9=-1.9, 3-max(0.1,0.3)=2.7, 0.5-0.3=0.2; token 4 is unmapped.
    # 40% of 4 mapped -> ceil(1.6) = 2 kept: tokens 2 and 0; include adds token 4.
    out = guided_loss(logits, labels, teacher, start, end, topk_ratio=0.4)
    assert out["total"].item() == pytest.approx((3.0 + 2.0 + 4.0) / 3)
    assert out["kept_fraction"].item() == pytest.approx(3 / 5)
    assert out["mapped_fraction"].item() == pytest.approx(4 / 5)
    assert out["student_loss"].item() == pytest.approx((2 + 1 + 3 + 0.5 + 4) / 5)
    assert out["teacher_loss"].item() == pytest.approx((0.5 + 2.9 + 0.3 + 0.3) / 4)
    assert out["score"].item() == pytest.approx((1.5 - 1.9 + 2.7 + 0.2) / 4)

    out = guided_loss(logits, labels, teacher, start, end, topk_ratio=0.4, unmapped="exclude", row_counts=True)
    assert out["total"].item() == pytest.approx((3.0 + 2.0) / 2)
    assert out["row_counts"].tolist() == [[5, 2]]  # the row's tokens with a label, and kept ones
    # 75% of 4 -> 3 kept: token 3 (score 0.2) joins.
    out = guided_loss(logits, labels, teacher, start, end, topk_ratio=0.75, unmapped="exclude")
    assert out["total"].item() == pytest.approx((3.0 + 2.0 + 0.5) / 3)
    # min aggregation: token 2 scores 3 - 0.1 = 2.9, still above token 0's 1.5; 25% of 4 -> 1 kept.
    out = guided_loss(logits, labels, teacher, start, end, topk_ratio=0.25, aggregation="min", unmapped="exclude")
    assert out["total"].item() == pytest.approx(3.0)
    out = guided_loss(logits, labels, teacher, start, end, topk_ratio=0.0)
    assert out["total"].item() == pytest.approx(4.0)  # only the unmapped token
    out = guided_loss(logits, labels, teacher, start, end, topk_ratio=1.0, unmapped="exclude")
    assert out["total"].item() == pytest.approx((2 + 1 + 3 + 0.5) / 4)


def test_aggregation_changes_the_selection():
    # One token's teacher range holds an easy and a hard teacher token: max sees the hard one, min the easy one.
    student = [2.0, 2.0]
    labels = torch.tensor([[1, 1]])
    logits = logits_with_losses(student, [1, 1])
    teacher = torch.tensor([[NAN, 1.5, 0.2, 2.5]])
    start, end = torch.tensor([[1, 2]]), torch.tensor([[2, 4]])
    # Token 0 scores 2 - 1.5 = 0.5 under every aggregation; token 1 scores 2 - 2.5 = -0.5 (max), 2 - 0.2 = 1.8
    # (min), 2 - 1.35 = 0.65 (mean), 2 - 2.7 = -0.7 (sum). Half is kept: the higher scorer.
    token1_score = {"max": -0.5, "min": 1.8, "mean": 0.65, "sum": -0.7}
    for how, score in token1_score.items():
        leaf = logits.clone().requires_grad_(True)
        out = guided_loss(leaf, labels, teacher, start, end, topk_ratio=0.5, aggregation=how, unmapped="exclude")
        assert out["score"].item() == pytest.approx((0.5 + score) / 2), how
        out["total"].backward()
        kept_token = 1 if score > 0.5 else 0
        assert (leaf.grad[0].abs().sum(-1) > 0).tolist() == [kept_token == 0, kept_token == 1], how


def test_per_sequence_selection_differs_from_batch_selection():
    # Row 0 holds all the high scores: over the batch it takes every kept slot; per sequence each row keeps one.
    student = [5.0, 4.0, 1.0, 0.5]
    logits = torch.cat([logits_with_losses(student[:2], [1, 1]), logits_with_losses(student[2:], [1, 1])])
    labels = torch.ones(2, 2, dtype=torch.long)
    teacher = torch.tensor([[NAN, 0.0, 0.0], [NAN, 0.0, 0.0]])
    start, end = torch.tensor([[1, 2], [1, 2]]), torch.tensor([[2, 3], [2, 3]])
    batch = guided_loss(logits, labels, teacher, start, end, topk_ratio=0.5)
    per_row = guided_loss(logits, labels, teacher, start, end, topk_ratio=0.5, per_sequence=True)
    assert batch["total"].item() == pytest.approx((5 + 4) / 2)
    assert per_row["total"].item() == pytest.approx((5 + 1) / 2)


def guided_loss_loop(logits, labels, teacher, start, end, ratio, how, unmapped, per_sequence):
    """The loss written as plain loops over tokens."""
    student = F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), labels.clamp(min=0).view(-1), reduction="none")
    student = student.view(labels.shape).tolist()
    agg = aggregate_loop(teacher, start, end, how).tolist()
    groups = [[(b, i) for i in range(labels.shape[1])] for b in range(labels.shape[0])]
    if not per_sequence:
        groups = [[p for g in groups for p in g]]
    kept = []
    for group in groups:
        labeled = [(b, i) for b, i in group if labels[b, i] != -100]
        mapped = [(b, i) for b, i in labeled if not math.isnan(agg[b][i])]
        ranked = sorted(mapped, key=lambda p: -(student[p[0]][p[1]] - agg[p[0]][p[1]]))
        kept += ranked[: math.ceil(len(mapped) * ratio - 1e-9)]
        if unmapped == "include":
            kept += [p for p in labeled if p not in mapped]
    return sum(student[b][i] for b, i in kept) / max(len(kept), 1)


@pytest.mark.parametrize("how", AGGREGATIONS)
@pytest.mark.parametrize("unmapped", ["include", "exclude"])
@pytest.mark.parametrize("per_sequence", [False, True])
def test_guided_loss_equals_loop(how, unmapped, per_sequence):
    g = torch.Generator().manual_seed(7)
    batch, n, m, vocab = 3, 30, 45, 17
    logits = torch.randn(batch, n, vocab, generator=g)
    labels = torch.randint(0, vocab, (batch, n), generator=g)
    labels[torch.rand(batch, n, generator=g) < 0.1] = -100
    teacher = torch.rand(batch, m, generator=g) * 5
    teacher[:, 0] = NAN
    start, end = random_ranges(batch, n, m, g)
    for ratio in (0.4, 0.1, 0.77):
        out = guided_loss(logits, labels, teacher, start, end, topk_ratio=ratio, aggregation=how, unmapped=unmapped,
                          per_sequence=per_sequence)
        want = guided_loss_loop(logits, labels, teacher, start, end, ratio, how, unmapped, per_sequence)
        assert out["total"].item() == pytest.approx(want, rel=1e-5)


def test_identity_alignment_is_rho1():
    """Same tokenizer for student and reference: guided loss with ranges (i+1, i+2) is Rho-1's selective LM loss."""
    torch.manual_seed(3)
    batch, length, vocab = 4, 33, 29
    ids = torch.randint(0, vocab, (batch, length))
    student_logits = torch.randn(batch, length, vocab)
    reference_logits = torch.randn(batch, length, vocab)
    # Shift as a trainer does: logits at i predict token i + 1.
    labels = ids[:, 1:]
    reference_hidden = reference_logits  # an identity head turns hidden states into these logits
    reference_loss = teacher_token_loss(reference_hidden, torch.nn.Identity(), ids)
    positions = torch.arange(1, length).expand(batch, -1)
    out = guided_loss(student_logits[:, :-1], labels, reference_loss, positions, positions + 1, topk_ratio=0.6)

    # Rho-1: excess loss = student CE - reference CE per token; train on the top 60% of the batch's tokens.
    student_ce = F.cross_entropy(student_logits[:, :-1].reshape(-1, vocab), labels.reshape(-1), reduction="none")
    reference_ce = F.cross_entropy(reference_logits[:, :-1].reshape(-1, vocab), labels.reshape(-1), reduction="none")
    k = math.ceil(0.6 * student_ce.numel())
    top = torch.topk(student_ce - reference_ce, k).indices
    torch.testing.assert_close(out["total"], student_ce[top].mean())
    assert out["mapped_fraction"].item() == 1.0
    assert out["kept_fraction"].item() == pytest.approx(k / student_ce.numel())


def test_gradients_reach_only_the_kept_student_logits():
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(2, 12, 9, generator=g, requires_grad=True)
    labels = torch.randint(0, 9, (2, 12), generator=g)
    teacher = (torch.rand(2, 20, generator=g) * 3).requires_grad_(True)
    start, end = random_ranges(2, 12, 20, g)
    out = guided_loss(logits, labels, teacher, start, end, topk_ratio=0.4)
    out["total"].backward()
    assert teacher.grad is None  # no gradient through the score
    for key, value in out.items():
        assert key == "total" or not value.requires_grad, key
    touched = logits.grad.abs().sum(-1) > 0
    mapped = ~torch.isnan(aggregate_ranges(teacher.detach(), start, end))
    n_mapped = int(mapped.sum())
    assert int((touched & mapped).sum()) == math.ceil(0.4 * n_mapped)
    assert (touched | mapped).all()  # every unmapped labeled token is trained on ("include")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"topk_ratio": 1.5}, "topk_ratio must be in"),
        ({"aggregation": "median"}, "aggregation must be one of"),
        ({"unmapped": "drop"}, "unmapped must be"),
        ({"selection": "best"}, "selection must be one of"),
    ],
)
def test_bad_options_are_refused(kwargs, message):
    logits, labels = torch.zeros(1, 2, 3), torch.zeros(1, 2, dtype=torch.long)
    start = end = torch.zeros(1, 2, dtype=torch.long)
    with pytest.raises(ValueError, match=message):
        guided_loss(logits, labels, torch.zeros(1, 4), start, end, **kwargs)


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="expected student_logits"):
        guided_loss(torch.zeros(1, 3, 5), torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 4),
                    torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="expected teacher_loss"):
        guided_loss(torch.zeros(2, 2, 5), torch.zeros(2, 2, dtype=torch.long), torch.zeros(1, 4),
                    torch.zeros(2, 2, dtype=torch.long), torch.zeros(2, 2, dtype=torch.long))


@pytest.mark.parametrize("per_sequence", [False, True])
def test_random_selection_keeps_as_many_mapped_tokens_as_the_top_k(per_sequence):
    torch.manual_seed(0)
    score = torch.randn(4, 50)
    score[score < -1] = float("-inf")  # unmapped or unlabeled
    top = select_top(score, 0.4, per_sequence)
    draws = [select_random(score, 0.4, per_sequence, torch.Generator().manual_seed(seed)) for seed in (0, 0, 1)]
    for drawn in draws:
        assert torch.equal(drawn.sum(-1 if per_sequence else None), top.sum(-1 if per_sequence else None))
        assert not (drawn & ~torch.isfinite(score)).any()
    assert torch.equal(draws[0], draws[1]) and not torch.equal(draws[0], draws[2])
    assert not torch.equal(draws[0], top)
    # Over many draws every mapped token is kept about 40% of the time, whatever its score.
    rate = torch.stack([select_random(score, 0.4, per_sequence, torch.Generator().manual_seed(s))
                        for s in range(400)]).float().mean(0)
    mapped = torch.isfinite(score)
    assert (rate[mapped] - 0.4).abs().max() < 0.12 and (rate[~mapped] == 0).all()
