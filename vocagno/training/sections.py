"""The training yaml's other sections and its top-level settings, typed, each default written once here (the model
sections' are ``vocagno.teacher.config``'s): ``OptimizerConfig``, ``SchedulerConfig``, ``LoaderConfig`` (a
``train_loader:`` or ``eval_loader:``), ``SelectionReportConfig`` and ``RunConfig`` (the top-level keys that have a
default). ``vocagno.training.config.SCHEMA`` takes their keys; the builders read them through these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vocagno.teacher.config import Section

__all__ = ["OPTIMIZER_KERNELS", "LoaderConfig", "OptimizerConfig", "RunConfig", "SchedulerConfig",
           "SelectionReportConfig"]

# optimizer.kernels: Composer's DecoupledAdamW, or vocagno.training.optimizers' multi-tensor or fused update.
OPTIMIZER_KERNELS = ("composer", "foreach", "fused")


@dataclass(frozen=True)
class OptimizerConfig(Section):
    """``optimizer:``: Composer's ``DecoupledAdamW``, whose decay is not scaled by the learning rate
    (``vocagno.training.config.MAX_DECOUPLED_DECAY``). ``lr`` is required. ``kernels``: ``composer`` (Composer's,
    one tensor at a time), or the same update in ``foreach`` (multi-tensor) or ``fused`` kernels
    (``vocagno.training.optimizers.MultiTensorDecoupledAdamW``); ``master_weights`` (with those): a float32 master copy
    of each bfloat16 or float16 weight in the optimizer, for a student held in its matmuls' dtype (``model.dtype``).
    Both stay Composer's until a GPU has measured them."""

    name: str = "decoupled_adamw"
    lr: float | None = None
    betas: tuple = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.0
    kernels: str = "composer"
    master_weights: bool = False

    def __post_init__(self):
        # The one place these are checked: load_config types the section, and so does the builder.
        if self.kernels not in OPTIMIZER_KERNELS:
            raise ValueError(f"optimizer.kernels must be {' or '.join(OPTIMIZER_KERNELS)}, got {self.kernels!r}")
        if self.master_weights and self.kernels == "composer":
            raise ValueError("optimizer.master_weights needs optimizer.kernels: foreach or fused (their "
                             "DecoupledAdamW keeps the master weights)")


@dataclass(frozen=True)
class SchedulerConfig(Section):
    """``scheduler:``: a cosine decay after a linear warm-up of ``t_warmup`` (required), to ``alpha_f`` of the
    learning rate."""

    name: str = "cosine_with_warmup"
    t_warmup: Any = None
    alpha_f: float = 0.0


@dataclass(frozen=True)
class LoaderConfig(Section):
    """``train_loader:`` or ``eval_loader:``: ``dataset`` (``TeacherGuidedDataset``'s keywords), and ``teacher_seq_len``
    (unset: the shards'), ``convert_if_missing`` (a conversion of ``input`` into ``dataset.local`` where it holds no
    shards)."""

    dataset: Any = None
    drop_last: bool = True
    num_workers: int = 0
    teacher_seq_len: int | None = None
    convert_if_missing: Any = None


@dataclass(frozen=True)
class SelectionReportConfig(Section):
    """``selection_report:``: what the teacher keeps of held-out ``shards`` (unset: the eval loader's) with
    ``canaries`` (the share of noise documents, in [0, 1): 0, none), after training (``vocagno.selection``)."""

    shards: str | None = None
    samples: int = 64
    canaries: float = 0.5


@dataclass(frozen=True)
class RunConfig(Section):
    """The top-level keys that have a default (llm-foundry's names, Composer's meanings)."""

    eval_interval: Any = 1
    eval_subset_num_batches: int = -1
    save_interval: Any = "1ep"
    save_num_checkpoints_to_keep: int = -1
    save_overwrite: bool = False
    autoresume: bool = False
    console_log_interval: str = "1ba"
    dist_timeout: float = 600

    @classmethod
    def of(cls, section: Any, where: str = ""):
        """The whole yaml's values of these keys (any other key is another section's), typed."""
        if isinstance(section, cls):
            return section
        return super().of({key: section.get(key) for key in cls.keys()}, where)
