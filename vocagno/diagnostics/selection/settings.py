"""The selection a run makes (``VocAgnoLM``'s options), as the report measures it: ``Settings`` and ``choose``."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vocagno.core.alignment import ALIGNMENT, NUM_CHUNKS, check_alignment
from vocagno.core.loss import (AGGREGATION, COMBINE, SELECTION, SELECTION_SCOPE, TOPK_RATIO, UNMAPPED, check_options,
    excess_loss, select_random, select_top)

__all__ = ["BINS", "CHUNKS", "Settings", "choose"]


CHUNKS = (1, 4, 16)  # the chunk-level variants' numbers of chunks
BINS = 10  # of the per-document kept fraction's histogram


@dataclass(frozen=True)
class Settings:
    """The selection that training would make: ``VocAgnoLM``'s options, and how many rows one top-k ranks together
    (a global batch for the ``batch`` scope, a microbatch for ``microbatch``)."""

    topk_ratio: float = TOPK_RATIO
    aggregation: str = AGGREGATION
    unmapped: str = UNMAPPED
    selection_scope: str = SELECTION_SCOPE
    rows_per_selection: int = 8
    selection: str = SELECTION
    alignment: str = ALIGNMENT
    num_chunks: int = NUM_CHUNKS

    def __post_init__(self):
        check_options(self.topk_ratio, self.aggregation, self.unmapped, self.selection_scope, self.selection)
        check_alignment(self.alignment, self.num_chunks)

    @classmethod
    def from_config(cls, cfg) -> "Settings":
        """A training yaml's ``algorithms.vocagno`` settings (``VocAgnoLM``'s defaults where it says nothing)."""
        options = dict((cfg.get("algorithms") or {}).get("vocagno") or {})
        scope = options.get("selection_scope", cls.selection_scope)
        rows = cfg.global_train_batch_size if scope == "batch" else cfg.device_train_microbatch_size
        return cls(options.get("topk_ratio", cls.topk_ratio), options.get("aggregation", cls.aggregation),
                   options.get("unmapped", cls.unmapped), scope,
                   rows if isinstance(rows, int) else cls.rows_per_selection,  # "auto" microbatches: the default
                   options.get("selection", cls.selection), options.get("alignment", cls.alignment),
                   options.get("num_chunks", cls.num_chunks))

    def describe(self) -> str:
        chunks = f", chunk alignment ({self.num_chunks} chunks)" if self.alignment == "chunk" else ""
        return (f"{'top' if self.selection == 'topk' else 'random'} {self.topk_ratio:.0%}, {self.aggregation}, "
                f"unmapped {self.unmapped}d, {self.selection_scope} scope ({self.rows_per_selection} rows){chunks}")


# ------------------------------------------------------------------------------------------------- the measurement
def choose(student_loss: torch.Tensor, labels: torch.Tensor, teacher_loss, start, end, settings: Settings,
           aggregation: str, random_draw: torch.Generator | None = None, combine: str = COMBINE):
    """Which predicted tokens a selection keeps, as ``VocAgnoLM`` keeps them: ``(selected, mapped, teacher)``, each
    ``[R, N - 1]``: the top-k (or a random draw, given ``random_draw``) of the mapped tokens, over each group of
    ``rows_per_selection`` rows or per row (``sequence``); the mapped tokens; the aggregated teacher loss (with
    several teachers, ``teacher_loss``, ``start`` and ``end`` sequences, their ``combine``)."""
    score, teacher = excess_loss(student_loss, labels, teacher_loss, start, end, aggregation, combine=combine)
    selected = torch.zeros_like(score, dtype=torch.bool)
    per_sequence = settings.selection_scope == "sequence"
    for begin in range(0, score.shape[0], settings.rows_per_selection):
        group = score[begin : begin + settings.rows_per_selection]
        selected[begin : begin + len(group)] = (
            select_top(group, settings.topk_ratio, per_sequence) if random_draw is None
            else select_random(group, settings.topk_ratio, per_sequence, random_draw))
    return selected, torch.isfinite(score), teacher
