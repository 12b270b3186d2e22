"""vocagno.algorithms.global_selection on one process: the selection over the global batch is select_top (or
select_random) over this process's rows, and its counts are the batch's."""

import torch

from vocagno.algorithms.global_selection import select_over_ranks
from vocagno.core.loss import select_random, select_top


def scores():
    generator = torch.Generator().manual_seed(0)
    score = torch.randn(4, 9, generator=generator)
    score[0, :3] = float("-inf")  # unmapped
    labeled = torch.ones(4, 9, dtype=torch.bool)
    labeled[3, 6:] = False  # padding: no label
    score[3, 6:] = float("-inf")
    return score, labeled


def test_one_process_selects_the_top_k_of_its_rows_and_counts_them():
    score, labeled = scores()
    chosen = select_over_ranks(score, labeled, 0.4, "include")
    assert torch.equal(chosen.selected, select_top(score, 0.4)) and chosen.samples == 4
    mapped = int(torch.isfinite(score).sum())  # 36 - 3 - 3
    assert chosen.counts["labeled"] == 33 and chosen.counts["mapped"] == mapped == 30
    assert chosen.counts["kept"] == chosen.selected.sum() + 3  # the unmapped labeled tokens are kept too
    assert select_over_ranks(score, labeled, 0.4, "exclude").counts["kept"] == chosen.selected.sum()


def test_a_random_selection_draws_what_select_random_draws_from_the_same_seed():
    score, labeled = scores()
    chosen = select_over_ranks(score, labeled, 0.4, selection="random", generator=torch.Generator().manual_seed(7))
    assert torch.equal(chosen.selected, select_random(score, 0.4, generator=torch.Generator().manual_seed(7)))
    assert chosen.selected.sum() == select_top(score, 0.4).sum()
