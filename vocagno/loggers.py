"""Small Composer logger destinations and callbacks that write JSON lines, for runs to be read back by tools and tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from composer.core import Callback, State
from composer.loggers import Logger, LoggerDestination
from composer.utils import dist

from vocagno.writing import append

__all__ = ["JSONLinesLogger", "RunRecipe", "SampleLog"]


def _rank_path(path: str) -> Path:
    return Path(path.format(rank=dist.get_global_rank()))


class JSONLinesLogger(LoggerDestination):
    """Appends ``{"step": ..., metric: value, ...}`` per ``log_metrics`` call; ``{rank}`` in the path is the rank."""

    def __init__(self, path: str):
        self.path = path

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        row = {"step": step, **{k: float(v) for k, v in metrics.items()}}
        append(_rank_path(self.path), json.dumps(row) + "\n")


class SampleLog(Callback):
    """Writes, per batch and rank, the first ``prefix`` student token ids of each sample: which data each rank saw;
    and, when ``VocAgnoLM`` selects over the global batch, the label positions it selected in each sample."""

    def __init__(self, path: str, prefix: int = 8):
        self.path = path
        self.prefix = prefix

    def after_dataloader(self, state: State, logger: Logger) -> None:
        row = {"batch": int(state.timestamp.batch), "samples": state.batch["input_ids"][:, : self.prefix].tolist()}
        if "vocagno_selected" in state.batch:
            row["selected"] = [torch.nonzero(kept).flatten().tolist() for kept in state.batch["vocagno_selected"]]
        append(_rank_path(self.path), json.dumps(row) + "\n")


class RunRecipe(Callback):
    """Carries the run's resolved yaml into every checkpoint (Composer saves callbacks' state), where
    ``python -m vocagno.export`` reads it for the model card. A resumed run keeps its own yaml, not the saved one."""

    def __init__(self, yaml: str):
        self.yaml = yaml

    def state_dict(self) -> dict[str, Any]:
        return {"yaml": self.yaml}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass
