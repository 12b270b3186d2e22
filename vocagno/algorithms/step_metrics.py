"""What ``VocAgnoLM`` logs of a step besides its loss, summed over the step's microbatches and every rank: a mixture's
rows, labeled and kept tokens per stream, and each teacher's share of the kept mapped tokens. Counted on the batch's
device (no sync per microbatch), reduced over the ranks once a step."""

from __future__ import annotations

import torch
from composer.core import State
from composer.loggers import Logger
from composer.utils import dist

from vocagno.teacher.several import teacher_shares

__all__ = ["StepMetrics"]


class StepMetrics:
    def __init__(self):
        self.stream_count = 0  # a mixture's streams, counted this step (0: none)
        self.streams: torch.Tensor | None = None  # per stream: rows, labeled tokens, kept tokens
        self.teachers: torch.Tensor | None = None  # per teacher: kept mapped tokens it gave

    def start(self, state: State) -> None:
        """At BEFORE_TRAIN_BATCH (also before each retry of a batch): counts from zero; per stream when the loader
        is a mixture whose batches name each row's stream."""
        names = getattr(getattr(state.train_dataloader, "dataset", None), "stream_names", None)
        self.teachers = self.streams = None
        self.stream_count = len(names) if "stream" in state.batch and names else 0

    @property
    def per_stream(self) -> bool:
        """Whether the guided loss should count its rows (``row_counts``) for this step."""
        return self.stream_count > 0

    def add(self, stream: torch.Tensor | None, loss: dict[str, torch.Tensor]) -> None:
        """A microbatch's counts, taken out of its guided loss's dict (``row_counts``, ``teacher_counts``), added
        where they are: on the microbatch's device (the whole batch, at ``start``, is still on the host)."""
        if self.per_stream:
            row_counts = loss.pop("row_counts")
            counts = torch.cat([torch.ones_like(row_counts[:, :1]), row_counts], dim=1)
            if self.streams is None:
                self.streams = torch.zeros(self.stream_count, 3, device=row_counts.device)
            self.streams.index_add_(0, stream.long(), counts.detach().float())
        if "teacher_counts" in loss:
            counts = loss.pop("teacher_counts")
            self.teachers = counts if self.teachers is None else self.teachers + counts

    def log(self, state: State, logger: Logger, teacher_names: list[str]) -> None:
        """At AFTER_TRAIN_BATCH: a mixture's share of the global batch per stream (``vocagno/stream_share/NAME``) and
        the share of each stream's labeled tokens the selection kept (``vocagno/kept_fraction/NAME``); each teacher's
        share of the kept mapped tokens (``vocagno.teacher.several.teacher_shares``)."""
        if self.streams is not None:
            dist.all_reduce(self.streams, reduce_operation="SUM")
            per_stream = self.streams.tolist()
            all_rows = max(sum(rows for rows, _, _ in per_stream), 1)
            metrics = {}
            for name, (rows, labeled, kept) in zip(state.train_dataloader.dataset.stream_names, per_stream):
                metrics[f"vocagno/stream_share/{name}"] = rows / all_rows
                if labeled:
                    metrics[f"vocagno/kept_fraction/{name}"] = kept / labeled
            logger.log_metrics(metrics)
            self.streams = None
        if self.teachers is not None:
            dist.all_reduce(self.teachers, reduce_operation="SUM")
            logger.log_metrics(teacher_shares(teacher_names, self.teachers.tolist()))
            self.teachers = None
