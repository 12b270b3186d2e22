"""The names a yaml gives its algorithms, loggers and callbacks, and the classes they stand for: llm-foundry's names
for Composer's loggers and callbacks (its registries) and vocagno's own, algorithms by llm-foundry's entry-point group.
"""

from __future__ import annotations

import difflib
import importlib
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from vocagno.training.loggers import JSONLinesLogger, RunPicture, SampleLog

__all__ = ["ALGORITHM_GROUP", "CALLBACKS", "LOGGERS", "OWN_ALGORITHMS", "TEACHER_ALGORITHMS", "algorithm", "build",
           "known"]

ALGORITHM_GROUP = "llmfoundry_algorithms"  # the entry points llm-foundry's registry reads; vocagno registers there
# vocagno's own entry points (pyproject.toml's), found also where the package runs from a checkout pip never installed
# (on PYTHONPATH, as on the GPU image of ../shared/gpu/README.md): no entry point is registered there.
OWN_ALGORITHMS = {"vocagno": "vocagno.algorithms.vocagno_lm:VocAgnoLM", "uld": "vocagno.algorithms.baselines:ULD",
                  "kld": "vocagno.algorithms.baselines:KLD", "cross_kd": "vocagno.algorithms.baselines:CrossVocabKD"}
# The algorithms that take the teacher: section (``teacher=``, a ``Teacher``; algorithms.vocagno also teachers:).
TEACHER_ALGORITHMS = ("vocagno", "uld", "kld", "cross_kd")
# llm-foundry's names for Composer's loggers and callbacks (its registries), and vocagno's own.
LOGGERS: dict[str, Any] = {
    "wandb": "WandBLogger", "mlflow": "MLFlowLogger", "tensorboard": "TensorboardLogger", "inmemory": "InMemoryLogger",
    "jsonl": JSONLinesLogger, "picture": RunPicture,
}
CALLBACKS: dict[str, Any] = {
    "speed_monitor": "SpeedMonitor", "lr_monitor": "LRMonitor", "memory_monitor": "MemoryMonitor",
    "memory_snapshot": "MemorySnapshot", "runtime_estimator": "RuntimeEstimator",
    "optimizer_monitor": "OptimizerMonitor", "nan_monitor": "NaNMonitor", "system_metrics_monitor": "SystemMetricsMonitor",
    "early_stopper": "EarlyStopper", "oom_observer": "OOMObserver", "generate_callback": "Generate",
    "load_checkpoint": "LoadCheckpoint",
    "sample_log": SampleLog,
}


def algorithm(name: str):
    """The class registered as algorithm ``name``: vocagno's own (over what an install's metadata may still name), or
    an entry point of llm-foundry's group."""
    available = {ep.name: ep for ep in entry_points(group=ALGORITHM_GROUP)}
    available.update({name: EntryPoint(name, value, ALGORITHM_GROUP) for name, value in OWN_ALGORITHMS.items()})
    if name not in available:
        close = difflib.get_close_matches(name, list(available), n=1)
        hint = f" (did you mean algorithms.{close[0]}?)" if close else ""
        raise ValueError(f"unknown algorithm algorithms.{name}{hint}; registered ({ALGORITHM_GROUP}): "
                         f"{', '.join(available)}")
    return available[name].load()


def build(section: str, name: str, kwargs: dict[str, Any] | None):
    """Logger or callback ``name`` of ``section`` made with the yaml's ``kwargs``; wrong ones name it."""
    made = known(section, name)
    try:
        return made(**kwargs)
    except TypeError as error:
        raise ValueError(f"{section}.{name}: {error}") from error


def known(section: str, name: str):
    """The class of logger or callback ``name`` (``section``: loggers or callbacks) by llm-foundry's name."""
    registered = LOGGERS if section == "loggers" else CALLBACKS
    if name not in registered:
        close = difflib.get_close_matches(name, list(registered) + ["console"] * (section == "loggers"), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        names = ", ".join(sorted(list(registered) + ["console"] * (section == "loggers")))
        raise ValueError(f"unknown {section[:-1]} {section}.{name}{hint}; known: {names}")
    made = registered[name]
    if isinstance(made, str):  # Composer's class of that name, imported when asked for (wandb, mlflow: optional)
        made = getattr(importlib.import_module(f"composer.{section}"), made)
    return made

