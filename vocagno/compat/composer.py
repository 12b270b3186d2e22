"""Every work-around of Composer's internals, in one module behind the exact pin on mosaicml (``COMPOSER``).

- ``per_node_signal_files``: each node's file-based waits get a signal file of their own (mosaicml/llm-foundry#1736).
- ``cpu_model_from_proc``: the CPU's model, which Composer records in every checkpoint, read from /proc/cpuinfo and
  not from a py-cpuinfo subprocess at the start of every rank (no upstream issue: a cost, not a bug).
- ``causal_lm_model``: Composer's ``HuggingFaceModel`` made without importing every causal-LM class transformers has
  to ask a question whose answer is given (no upstream issue: a cost).
- ``promptly_linked``: the checkpoint saver looks every second, not every 30 s, whether a checkpoint reached its
  object store before it points the latest link at it (no public setting; no upstream issue).

Each relies on a private name of Composer 0.32.1; ``tests/unit/test_compat_composer.py`` fails when the installed Composer
is another version or no longer has what a work-around relies on. ``install`` puts the process-wide ones in place
once, however often a run starts in one process.
"""

from __future__ import annotations

import functools
import re
from unittest import mock

from composer.callbacks import CheckpointSaver
from composer.models import HuggingFaceModel
from composer.utils import collect_env, dist

__all__ = ["COMPOSER", "LATEST_LINK_POLL_SECONDS", "causal_lm_model", "cpu_model_from_proc", "install",
           "per_node_signal_files", "promptly_linked"]

COMPOSER = "0.32.1"  # the mosaicml version every work-around here was checked against (pyproject.toml pins it)

_BROADCAST_SIGNAL_FILE_NAME = dist.get_node_signal_file_name
_PY_CPUINFO_MODEL = collect_env.get_cpu_model


def per_node_signal_files(rng=None) -> str:
    """Composer's file-based waits within a node (autoresume, checkpoint downloads) name their signal file after node
    0 on every node: the name is broadcast from rank 0. In a save folder every node shares, the nodes then write and
    remove one file, and the second removal fails (FileNotFoundError; mosaicml/llm-foundry#1736, unfixed in Composer
    0.32.1). Each node's wait gets a name of its own: its node rank where node 0's stood."""
    return re.sub(r"_node\d+_", f"_node{dist.get_node_rank()}_", _BROADCAST_SIGNAL_FILE_NAME(rng), count=1)


@functools.lru_cache(maxsize=1)
def cpu_model_from_proc() -> str:
    """Composer records the CPU's model in every checkpoint, asking py-cpuinfo, which runs a Python subprocess for it
    (about 1.2 s of CPU at the start of every rank); Linux names the model in /proc/cpuinfo. Elsewhere, or where it
    names none, py-cpuinfo is asked as before."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    return value.strip()
    except OSError:
        pass
    return _PY_CPUINFO_MODEL()


def install() -> None:
    """Put the process-wide work-arounds in Composer's place (``per_node_signal_files``, ``cpu_model_from_proc``);
    installing again changes nothing."""
    dist.get_node_signal_file_name = per_node_signal_files
    collect_env.get_cpu_model = cpu_model_from_proc


def causal_lm_model(module, tokenizer, **kwargs) -> HuggingFaceModel:
    """Composer's ``HuggingFaceModel`` around a causal LM, labels shifted. HuggingFaceModel asks whether the model is
    a registered causal LM by importing every causal-LM class transformers has (1.0-1.4 s of CPU at the start of every
    rank); the answer only decides ``shift_labels`` when it is not given, and it is given here, so the question is
    not asked."""
    from composer.models import huggingface

    with mock.patch.object(huggingface, "_is_registered_causal_lm", lambda model: True):
        return HuggingFaceModel(module, tokenizer=tokenizer, shift_labels=True, **kwargs)


# How often the saver looks whether a checkpoint has reached the object store before it points the latest link at
# it. Composer looks every 30 s, and a run waits for that before it ends: up to 30 s more of every run that saves to a
# store, on every node. A lookup of the checkpoint's object a second (on S3 a GET) costs little.
LATEST_LINK_POLL_SECONDS = 1.0


def promptly_linked(callbacks) -> None:
    """The trainer's checkpoint saver (among ``callbacks``, the trainer's) looks every second, not every 30 s,
    whether a checkpoint has reached the store before it links it."""
    for callback in callbacks:
        if isinstance(callback, CheckpointSaver):
            callback._symlink_upload_wait_before_next_try_in_seconds = LATEST_LINK_POLL_SECONDS  # no public setting
