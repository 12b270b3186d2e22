"""The top-k over a global batch: every rank's scores gathered, one selection made alike on every rank, and the
global batch's token counts that make each microbatch's loss a share of the global mean (``VocAgnoLM``'s ``batch``
scope). On one process it is ``select_top`` (or ``select_random``) over that process's rows."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from composer.utils import dist

from vocagno.core.loss import SELECTION, TOPK_RATIO, UNMAPPED, select_random, select_top

__all__ = ["GlobalSelection", "select_over_ranks"]


@dataclass(frozen=True)
class GlobalSelection:
    """This rank's ``selected`` ``[rows, N - 1]``, the global batch's ``counts`` (labeled, mapped and kept tokens)
    and its number of ``samples``."""

    selected: torch.Tensor
    counts: dict[str, torch.Tensor]
    samples: int


@torch.no_grad()
def select_over_ranks(score: torch.Tensor, labeled: torch.Tensor, topk_ratio: float = TOPK_RATIO,
                      unmapped: str = UNMAPPED, selection: str = SELECTION,
                      generator: torch.Generator | None = None) -> GlobalSelection:
    """Select over the scores ``[rows, N - 1]`` of every rank (``-inf``: unmapped or unlabeled, never selected;
    ``labeled``: which predicted tokens have a label). Ranks may hold different numbers of rows: each is padded to the
    longest with ``-inf``. A random selection draws alike on every rank from ``generator``, seeded alike."""
    size, alone = score.shape[0], dist.get_world_size() == 1  # alone: no collective (also where a group of one is up)
    sizes = _rows_of_every_rank(size, score.device)
    rows = max(sizes)
    padded = torch.full((rows, score.shape[1]), float("-inf"), device=score.device)
    padded[:size] = score
    everything = padded if alone else torch.cat(list(dist.all_gather(padded)))  # every rank's scores, in rank order
    rank = dist.get_global_rank()
    chosen = (select_top(everything, topk_ratio) if selection == "topk"
              else select_random(everything, topk_ratio, generator=generator))
    selected = chosen[rank * rows : rank * rows + size]

    mapped = torch.isfinite(score)
    counts = torch.stack([labeled.sum(), mapped.sum(), selected.sum()])
    if not alone:
        dist.all_reduce(counts, reduce_operation="SUM")
    n_labeled, n_mapped, n_selected = counts.float()
    kept = n_selected + (n_labeled - n_mapped if unmapped == "include" else 0)
    return GlobalSelection(selected, {"labeled": n_labeled, "mapped": n_mapped, "kept": kept}, sum(sizes))


def _rows_of_every_rank(size: int, device: torch.device) -> list[int]:
    """Every rank's number of rows, on the host (they shape the gather). On one process its own: nothing to wait
    for; over several, one all-reduce read on the host once a step."""
    world = dist.get_world_size()
    if world == 1:
        return [size]
    sizes = torch.where(torch.arange(world, device=device) == dist.get_global_rank(), size, 0)
    dist.all_reduce(sizes, reduce_operation="SUM")
    return sizes.tolist()
