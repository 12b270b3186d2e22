"""Small Composer logger destinations and callbacks: JSON lines for runs to be read back by tools and tests, the
console's one line per logged step, and the lines that say what a run does (where its teacher losses come from,
each checkpoint saved)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from composer.core import Callback, State
from composer.loggers import Logger, LoggerDestination
from composer.utils import dist

from vocagno.doors.writing import append
from vocagno.shown import terminal
from vocagno.data.batch import SELECTED
from vocagno.teacher.several import TEACHER_SHARE

__all__ = ["ConsoleLine", "JSONLinesLogger", "Narration", "RunPicture", "RunRecipe", "SampleLog"]


def _rank_path(path: str) -> Path:
    return Path(path.format(rank=dist.get_global_rank()))


class JSONLinesLogger(LoggerDestination):
    """Appends ``{"step": ..., metric: value, ...}`` per ``log_metrics`` call; ``{rank}`` in the path is the rank."""

    def __init__(self, path: str):
        self.path = path

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        row = {"step": step, **{k: float(v) for k, v in metrics.items()}}
        append(_rank_path(self.path), json.dumps(row) + "\n")


# What the console line shows, in its order: (label, the metrics that give it, first one logged wins, its format).
# A key ending in "/" is a prefix: every metric under it, by the name after it (several teachers' shares).
CONSOLE_FIGURES = [
    ("loss", ("loss/train/total",), "{:.4f}"),
    ("student", ("loss/train/student_loss",), "{:.3f}"),
    ("teacher", ("loss/train/teacher_loss",), "{:.3f}"),
    ("kept", ("loss/train/kept_fraction",), "{:.3f}"),
    ("shares", (TEACHER_SHARE,), "{:.2f}"),
    ("tok/s", ("throughput/tokens_per_sec", "throughput/device/tokens_per_sec"), "{:,.0f}"),
    ("lr", ("lr-DecoupledAdamW/group0",), "{:.2e}"),
    ("held-out bits/byte", ("metrics/eval/BitsPerByte",), "{:.4f}"),
]


class ConsoleLine(LoggerDestination):
    """One line on the console per ``every`` batches (and at the last), on the first rank: the batch and the figures
    a user watches (``CONSOLE_FIGURES``: the loss, the student's and the teacher's, the kept fraction, tokens per
    second, the learning rate; with several teachers each one's share of the kept mapped tokens). An evaluation's
    held-out bits per byte joins the line of the batch it was measured at, or, where that batch's line is past (an
    evaluation at an epoch's end) or not printed, gets a line of its own.
    Every metric stays in the other loggers (``jsonl``)."""

    EVAL = "metrics/eval/BitsPerByte"

    def __init__(self, every: int):
        if not isinstance(every, int) or every < 1:
            raise ValueError(f"console_log_interval must be a number of batches (10ba), got {every!r}")
        self.every = every
        self._latest: dict[str, float] = {}
        self._past = -1  # the last batch whose line was printed or passed

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        for key, value in metrics.items():
            if isinstance(value, (int, float)) or (isinstance(value, torch.Tensor) and value.numel() == 1):
                self._latest[key] = float(value)

    def batch_checkpoint(self, state: State, logger: Logger) -> None:  # after an evaluation at the batch's end
        batch = int(state.timestamp.batch)
        last = state.max_duration is not None and state.timestamp >= state.max_duration
        if batch % self.every == 0 or last:
            self._say(self.line(state, CONSOLE_FIGURES))
        elif self.EVAL in self._latest:
            self._say(self.line(state, CONSOLE_FIGURES[-1:]))
        self._latest.pop(self.EVAL, None)
        self._past = batch

    def eval_end(self, state: State, logger: Logger) -> None:
        if int(state.timestamp.batch) == self._past and self.EVAL in self._latest:  # its batch's line is past
            self._say(self.line(state, CONSOLE_FIGURES[-1:]))
            self._latest.pop(self.EVAL)

    def _say(self, line: str) -> None:
        if dist.get_global_rank() == 0:
            print(terminal(line), flush=True)  # a teacher's name is the yaml's

    def line(self, state: State, shown: list) -> str:
        total = state.max_duration.value if state.max_duration is not None and state.max_duration.unit.value == "ba" \
            else "?"
        figures = []
        for label, keys, form in shown:
            if keys[0].endswith("/"):
                each = [f"{k.removeprefix(keys[0])} {form.format(v)}" for k, v in self._latest.items()
                        if k.startswith(keys[0])]
                if each:
                    figures.append(f"{label} {' '.join(each)}")
                continue
            value = next((self._latest[k] for k in keys if k in self._latest), None)
            if value is not None:
                figures.append(f"{label} {form.format(value)}")
        return f"[batch {int(state.timestamp.batch)}/{total}] " + " | ".join(figures)


# What the run's picture draws: (panel title, its metrics and their labels).
PICTURE_PANELS = [
    ("loss (nats per token)", {"loss/train/total": "guided loss (kept tokens)", "loss/train/student_loss": "student",
                               "loss/train/teacher_loss": "teacher"}),
    ("kept and mapped fractions", {"loss/train/kept_fraction": "kept", "loss/train/mapped_fraction": "mapped"}),
    ("held-out bits per byte", {"metrics/eval/BitsPerByte": "held-out"}),
]


class RunPicture(LoggerDestination):
    """After the run, on the first rank: a PNG at ``path`` of its loss (guided, student's, teacher's), kept fraction
    and held-out bits per byte over the batches this process trained (a resumed run: from where it resumed; the
    ``jsonl`` log holds every batch)."""

    def __init__(self, path: str):
        self.path = path
        self._series: dict[str, dict[int, float]] = {}

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        for key, value in metrics.items():
            if step is not None and any(key in drawn for _, drawn in PICTURE_PANELS):
                # A batch's training figures are logged before the batch is counted: at the number of the one before.
                batch = step + 1 if key.startswith("loss/train/") else step
                self._series.setdefault(key, {})[batch] = float(value)

    def fit_end(self, state: State, logger: Logger) -> None:
        if dist.get_global_rank() != 0 or not self._series:
            return
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        from vocagno.doors.writing import save_figure

        figure, axes = plt.subplots(1, len(PICTURE_PANELS), figsize=(4.2 * len(PICTURE_PANELS), 3.4))
        for ax, (title, drawn) in zip(axes, PICTURE_PANELS):
            for key, label in drawn.items():
                points = sorted(self._series.get(key, {}).items())
                if points:
                    ax.plot([x for x, _ in points], [y for _, y in points], marker="o" if len(points) < 12 else None,
                            label=label)
            ax.set_title(title)
            ax.set_xlabel("batch")
            ax.set_xlim(0, max(int(state.timestamp.batch), 1) + 1)
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8)
            else:
                ax.text(0.5, 0.5, "not logged in this run", ha="center", va="center", transform=ax.transAxes)
        figure.suptitle(f"{state.run_name}: {int(state.timestamp.batch)} batches")
        figure.tight_layout()
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        save_figure(figure, self.path, dpi=120)
        plt.close(figure)
        print(f"wrote {self.path}: the run's loss, kept fraction and held-out bits per byte over its batches",
              flush=True)


class Narration(Callback):
    """The lines that say what a run does, on the first rank: where its teacher losses come from (each algorithm's
    ``teacher_source``) at the start, and each checkpoint Composer's saver wrote (it goes after the saver among the
    trainer's callbacks), by its name in ``save_folder`` (an object store's too)."""

    def __init__(self, save_folder: str | None = None):
        self.save_folder = save_folder
        self._said: list[str] = []

    def fit_start(self, state: State, logger: Logger) -> None:
        self._said.extend(self._names(state))  # a resumed run's earlier ones, not said again
        if dist.get_global_rank() != 0:
            return
        for algorithm in state.algorithms:
            source = getattr(algorithm, "teacher_source", None)
            if source is not None:
                print(source(state), flush=True)

    def batch_checkpoint(self, state: State, logger: Logger) -> None:
        self._say_saved(state)

    def epoch_checkpoint(self, state: State, logger: Logger) -> None:
        self._say_saved(state)

    def fit_end(self, state: State, logger: Logger) -> None:
        self._say_saved(state)

    def saved(self) -> list[str]:
        """The checkpoints said to be saved, oldest first (each said after its save completed)."""
        return list(self._said)

    def _names(self, state: State) -> list[str]:
        """Every checkpoint Composer's saver saved in this run's life (its record keeps those it rotated away too),
        by its name in the save folder."""
        from composer.callbacks import CheckpointSaver

        names = []
        for saver in (c for c in state.callbacks if isinstance(c, CheckpointSaver)):
            for path in saver.all_saved_checkpoints_to_timestamp:
                remote = self.save_folder is not None and "://" in self.save_folder
                names.append(f"{self.save_folder.rstrip('/')}/{Path(path).name}" if remote else str(path))
        return names

    def _say_saved(self, state: State) -> None:
        for name in self._names(state):
            if name not in self._said:
                self._said.append(name)
                if dist.get_global_rank() == 0:
                    print(f"saved checkpoint {name}", flush=True)


class SampleLog(Callback):
    """Writes, per batch and rank, the first ``prefix`` student token ids of each sample: which data each rank saw;
    and, when ``VocAgnoLM`` selects over the global batch, the label positions it selected in each sample."""

    def __init__(self, path: str, prefix: int = 8):
        self.path = path
        self.prefix = prefix

    def after_dataloader(self, state: State, logger: Logger) -> None:
        row = {"batch": int(state.timestamp.batch), "samples": state.batch["input_ids"][:, : self.prefix].tolist()}
        if SELECTED in state.batch:
            row["selected"] = [torch.nonzero(kept).flatten().tolist() for kept in state.batch[SELECTED]]
        append(_rank_path(self.path), json.dumps(row) + "\n")


class RunRecipe(Callback):
    """Carries the run's yaml (``vocagno.training.config.published_yaml``) into every checkpoint (Composer saves callbacks' state), where
    ``python -m vocagno.export`` reads it for the model card. A resumed run keeps its own yaml, not the saved one."""

    def __init__(self, yaml: str):
        self.yaml = yaml

    def state_dict(self) -> dict[str, Any]:
        return {"yaml": self.yaml}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass
