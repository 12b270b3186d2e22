"""ULD and KLD (vocagno.core.distill) against slow references written from their definitions (reference doc §1, §2)."""

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
