"""ULD and KLD (vocagno.core.distill) against slow references written from their definitions (reference doc §1, §2)."""

import pytest
import torch
import torch.nn.functional as F

from vocagno.core.distill import kld_loss, uld_loss


def batch(student_vocab, teacher_vocab):
    torch.manual_seed(0)
    student_logits = torch.randn(2, 6, student_vocab, requires_grad=True)
    teacher_logits = torch.randn(2, 5, teacher_vocab)
    labels = torch.randint(0, student_vocab, (2, 6))
    labels[1, 4:] = -100  # a padded row: 3 labeled next tokens
    teacher_mask = torch.ones(2, 5, dtype=torch.long)
    teacher_mask[1, 3:] = 0
    return student_logits, teacher_logits, labels, teacher_mask


def test_uld_is_the_sorted_padded_l1_between_positionally_paired_distributions():
    """Different vocabularies (7 and 11): sort each distribution, zero-pad the smaller, L1 over the vocabulary, mean
    over the pairs (the shorter side, the student's less its last, EOS-skipped), mean over rows; plus the CE."""
    student_logits, teacher_logits, labels, teacher_mask = batch(7, 11)
    out = uld_loss(student_logits, labels, teacher_logits, torch.nn.Identity(), teacher_mask, chunk_size=2,
                   student_temperature=2.0)
    rows = []
    for b in range(2):
        student_positions = int((labels[b, 1:] != -100).sum()) - 1
        teacher_positions = int(teacher_mask[b].sum()) - 1
        size = min(student_positions, teacher_positions)
        pairs = []
        for t in range(size):
            p_s = sorted(F.softmax(student_logits[b, t] / 2.0, -1).tolist(), reverse=True) + [0.0] * 4
            p_t = sorted(F.softmax(teacher_logits[b, t], -1).tolist(), reverse=True)
            pairs.append(sum(abs(x - y) for x, y in zip(p_s, p_t)))
        rows.append(sum(pairs) / size)
    targets = labels[:, 1:]
    ce = F.cross_entropy(student_logits[:, :-1].reshape(-1, 7), targets.reshape(-1), ignore_index=-100)
    torch.testing.assert_close(out["uld"], torch.tensor(sum(rows) / 2), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out["total"], ce + 1.5 * out["uld"], rtol=1e-5, atol=1e-6)
    out["total"].backward()
    assert student_logits.grad.abs().sum() > 0


def test_kld_is_miniplms_mix_of_ce_and_soft_ce_over_the_shared_ids():
    """The teacher has 4 more ids than the student: its logits are cut to the student's 7 before the softmax. Soft CE
    = KL(p_T || p_S) + H(p_T), the KL as F.kl_div computes it."""
    student_logits, teacher_logits, labels, _ = batch(7, 11)
    teacher_logits = torch.randn(2, 6, 11)
    out = kld_loss(student_logits, labels, teacher_logits, torch.nn.Identity(), chunk_size=3)
    labeled = (labels[:, 1:] != -100).reshape(-1)
    log_s = F.log_softmax(student_logits[:, :-1].reshape(-1, 7)[labeled], -1)
    p_t = F.softmax(teacher_logits[:, :-1, :7].reshape(-1, 7)[labeled], -1)
    count = int(labeled.sum())
    kl = F.kl_div(log_s, p_t, reduction="sum") / count
    entropy = -(p_t * p_t.log()).sum() / count
    ce = F.cross_entropy(student_logits[:, :-1].reshape(-1, 7), labels[:, 1:].reshape(-1), ignore_index=-100)
    torch.testing.assert_close(out["kl"], kl, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out["soft_ce"], kl + entropy, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out["total"], 0.5 * ce + 0.5 * (kl + entropy), rtol=1e-5, atol=1e-6)


def test_uld_paired_through_the_alignment_compares_the_positions_it_names():
    """The variant: student position i against the teacher position the alignment gives (-1: unpaired), at every
    labeled student position, however the two sides' lengths differ."""
    student_logits, teacher_logits, labels, teacher_mask = batch(7, 11)
    aligned = torch.tensor([[0, 0, 2, -1, 3], [1, 2, 2, -1, -1]])  # row 1: its 4th label is padding anyway
    out = uld_loss(student_logits, labels, teacher_logits, torch.nn.Identity(), teacher_mask,
                   aligned_teacher_positions=aligned, chunk_size=2)
    rows = []
    for b in range(2):
        pairs = []
        for i in range(5):
            if labels[b, i + 1] == -100 or aligned[b, i] < 0:
                continue
            p_s = sorted(F.softmax(student_logits[b, i], -1).tolist(), reverse=True) + [0.0] * 4
            p_t = sorted(F.softmax(teacher_logits[b, aligned[b, i]], -1).tolist(), reverse=True)
            pairs.append(sum(abs(x - y) for x, y in zip(p_s, p_t)))
        rows.append(sum(pairs) / len(pairs))
    torch.testing.assert_close(out["uld"], torch.tensor(sum(rows) / 2), rtol=1e-5, atol=1e-6)


def cached(teacher_logits, top_k, dtype=torch.float32):
    """What the scoring pass stores of these logits: the top-k's probabilities and the rest, rounded to ``dtype``."""
    from vocagno.core.distill import teacher_top_k

    mask = torch.ones(teacher_logits.shape[:2], dtype=torch.long)
    ids, probs, rest = teacher_top_k(teacher_logits, torch.nn.Identity(), mask, top_k, chunk_size=3)
    return ids, probs.to(dtype).float(), rest.to(dtype).float()


def test_cached_uld_with_the_whole_vocabulary_is_live_uld_and_with_fewer_lies_within_its_bound():
    """k = the teacher's vocabulary: the live loss (its pairs, by position and through the alignment); smaller k: the
    live loss within min(S, r) per pair, the bound cached_uld_loss reports, however the vocabularies compare."""
    from vocagno.core.distill import cached_uld_loss

    for student_vocab, teacher_vocab in ((7, 11), (11, 7), (9, 9)):
        student_logits, teacher_logits, labels, teacher_mask = batch(student_vocab, teacher_vocab)
        teacher_logits = teacher_logits * 3  # peaked, as a trained teacher's: a small rest at small k
        aligned = torch.tensor([[0, 0, 2, -1, 3], [1, 2, 2, -1, -1]])
        for pairing in (None, aligned):
            live = uld_loss(student_logits, labels, teacher_logits, torch.nn.Identity(), teacher_mask,
                            aligned_teacher_positions=pairing, chunk_size=2)
            for k in range(1, teacher_vocab + 1):
                _, probs, rest = cached(teacher_logits, k)
                out = cached_uld_loss(student_logits, labels, probs, rest, teacher_mask,
                                      aligned_teacher_positions=pairing, chunk_size=2)
                assert abs(float(out["uld"] - live["uld"])) <= float(out["uld_bound"]) + 1e-6, (k, pairing)
                if k == teacher_vocab:
                    torch.testing.assert_close(out["uld"], live["uld"], rtol=1e-6, atol=1e-6)
                    torch.testing.assert_close(out["total"], live["total"], rtol=1e-6, atol=1e-6)
                    assert float(out["uld_bound"]) <= 1e-6
            _, probs, rest = cached(teacher_logits, 2)
            assert float(cached_uld_loss(student_logits, labels, probs, rest, teacher_mask)["uld_bound"]) > 0.01
    # float16 storage: within the rounding's 2^-11 of the float32 cache
    student_logits, teacher_logits, labels, teacher_mask = batch(7, 11)
    exact, rounded = (cached_uld_loss(student_logits, labels, *cached(teacher_logits, 11, dtype)[1:], teacher_mask)
                      for dtype in (torch.float32, torch.float16))
    assert 0 < abs(float(exact["uld"] - rounded["uld"])) <= 2**-11 + 12 * 2**-25
    rounded["total"].backward()
    assert student_logits.grad.abs().sum() > 0


def test_a_cached_id_stored_with_probability_zero_leaves_its_student_id_in_the_bucket():
    """float16 stores a probability under ~3e-8 as 0: such an id gives its student id nothing, so by the rule that
    student id is in the bucket (every student id the projection gave nothing), as it is when the id is not cached."""
    from vocagno.core.distill import projected_kd_loss

    torch.manual_seed(0)
    logits = torch.randn(1, 3, 6)
    labels = torch.tensor([[1, 2, 3]])
    vocabulary_map = torch.tensor([0, 1, 2, 3, 4, -1])
    rest = torch.tensor([[0.1]])

    def soft_ce(ids, probs):
        return float(projected_kd_loss(logits, labels, torch.tensor([[ids]]), torch.tensor([[probs]]), rest,
                                       torch.tensor([[0, -1]]), vocabulary_map, kd_ratio=1.0)["soft_ce"])

    # The rule written out: student ids 0 and 1 get 0.7 and 0.2; the 0.1 outside goes to ids 2-5 together.
    log_student = torch.log_softmax(logits[0, 0].double(), -1)
    expected = -(0.7 * log_student[0] + 0.2 * log_student[1]) - 0.1 * log_student[2:].logsumexp(-1)
    assert soft_ce([0, 1, 2], [0.7, 0.2, 0.0]) == pytest.approx(float(expected), rel=1e-6)
    assert soft_ce([0, 1, 2], [0.7, 0.2, 0.0]) == pytest.approx(soft_ce([0, 1, 5], [0.7, 0.2, 0.0]), rel=1e-6)
