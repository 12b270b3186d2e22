"""A yaml's model sections, typed (``Section``: a frozen dataclass), each key with its one default: ``ModelConfig`` (``model:``, the student's) and
``TeacherConfig`` (``teacher:``, a ``teachers:`` entry, or the mapping an llm-foundry yaml gives
``algorithms.vocagno.teacher``; ``vocagno.teacher.teacher.Teacher.from_config`` makes a teacher of one). A key a
section does not have is refused naming the closest one (``check_names``). ``build_causal_lm``: the model a section
names, or builds from its config.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Iterable

import torch
from omegaconf import DictConfig
from omegaconf import OmegaConf as om
from torch import nn

from vocagno.core.kernels import DEFAULT_KERNELS, check_speed

__all__ = ["BUILT_DTYPE", "LOADED_DTYPE", "ModelConfig", "Section", "TeacherConfig", "build_causal_lm", "check_names", "is_dtype"]

BUILT_DTYPE = "float32"  # a model's dtype where its section gives none: built from its config, or a student by name
LOADED_DTYPE = "bfloat16"  # a teacher's loaded by name, where its section gives none


def check_names(where: str, given: Iterable[Any], allowed: Iterable[str]) -> None:
    """Every key of ``given`` (a yaml section at ``where``, dotted, ending in ``.`` unless empty) among ``allowed``:
    else a ValueError naming the first unknown one, the closest allowed one and all of them."""
    allowed = list(allowed)
    for key in given:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f" (did you mean {where}{close[0]}?)" if close else ""
            raise ValueError(f"unknown config key {where}{key}{hint}; allowed here: {', '.join(allowed)}")


def is_dtype(value: Any) -> bool:
    """Whether ``value`` names a torch dtype (``float32``, ``bfloat16``, ``half``, ...)."""
    return isinstance(value, str) and isinstance(getattr(torch, value, None), torch.dtype)


class Section:
    """What a typed yaml section (a frozen dataclass of its keys and their defaults) shares: its keys, and ``of``."""

    @classmethod
    def keys(cls) -> list[str]:
        """The section's keys, in the order refusals list them."""
        return [each.name for each in fields(cls)]

    @classmethod
    def of(cls, section: Any, where: str = ""):
        """``section`` (a yaml's mapping or a dict; one typed already is taken as it is) typed: a key it does not
        have refused (``check_names``, ``where`` the section's dotted place ending in ``.``), a null value its
        key's default."""
        if isinstance(section, cls):
            return section
        if section is None:
            section = {}
        if not isinstance(section, Mapping):
            raise ValueError(f"{where.rstrip('.') or 'a ' + cls.__name__}: give its keys as a mapping "
                             f"({', '.join(cls.keys())}), got {section!r}")
        values = om.to_container(section, resolve=True) if isinstance(section, DictConfig) else dict(section)
        check_names(where, values, cls.keys())
        return cls(**{key: value for key, value in values.items() if value is not None})


@dataclass(frozen=True)
class ModelConfig(Section):
    """A ``model:`` section: the student.

    Args:
        name_or_path: a pretrained model: a Hugging Face name or folder, or a shipped name (``tiny-math-teacher``).
        config: else a randomly initialized one: ``model_type`` and its fields (``build_causal_lm``).
        dtype: unset, ``BUILT_DTYPE`` (a teacher loaded by name: ``LOADED_DTYPE``).
        trust_remote_code: for a model loaded by name.
        tokenizer: the student's is the yaml's ``tokenizer.name``: accepted, not read (a teacher's is its own).
        kernels: ``torch`` or ``liger`` (``vocagno.core.kernels``).
    """

    name_or_path: str | None = None
    config: dict | None = None
    dtype: str | None = None
    trust_remote_code: bool = False
    tokenizer: Any = None
    kernels: str = DEFAULT_KERNELS


@dataclass(frozen=True)
class TeacherConfig(ModelConfig):
    """A ``teacher:`` section, a ``teachers:`` entry, or the mapping an llm-foundry yaml gives
    ``algorithms.vocagno.teacher``: a model section's keys, its ``tokenizer`` the teacher's (the one the shards'
    teacher tokens were made with; unset, a named teacher's folder's), and how it runs.

    Args:
        placement: ``replicate``, ``fsdp`` or ``auto`` (``fsdp`` when the run uses FSDP); only ``VocAgnoLM`` takes it.
        chunk_size: teacher tokens per chunk of its LM head (unset: ``CHUNK_SIZE`` with PyTorch's kernels, Liger's own
            chunks with theirs).
        compile_config: torch.compile's options for each of its decoder layers; unset, not compiled.
        chunk_mem_const: with ``kernels: liger``, the bound on a chunk's logits in multiples of the hidden states'
            size, which sets Liger's chunk of tokens (``vocagno.core.kernels.liger_chunk_tokens``); unset, Liger's
            default (1).
        check_scored_by: with cached losses, refuse shards another teacher scored (another name where it is given
            by name, other weights where it is built); false takes them whoever scored them (its name is only a
            label then: a teacher scored from a local copy and named by its hub name) and says who did.
    """

    placement: str = "auto"
    chunk_size: int | None = None
    compile_config: dict | None = None
    chunk_mem_const: int | None = None
    check_scored_by: bool = True

    def check_speed(self, where: str) -> None:
        """Its speed options, refused in one line before anything loads (``vocagno.core.kernels.check_speed``)."""
        check_speed(self.kernels, self.compile_config, self.chunk_size, where, self.chunk_mem_const)


def build_causal_lm(section: ModelConfig | Mapping, vocab_size: int, seed: int | None = None) -> nn.Module:
    """A pretrained model by name, folder or shipped name (``tiny-math-teacher``), or a randomly initialized one from
    ``config`` (``model_type`` + fields) with ``vocab_size`` tokens. ``seed`` makes the random weights a function of
    the section and the seed alone, whatever ran before: the scoring pass (``python -m vocagno.score --config``)
    builds the very teacher a run of the same yaml builds."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from vocagno.teacher.model import load_teacher

    section = ModelConfig.of(section)
    if section.name_or_path:
        return load_teacher(section.name_or_path, section.dtype or BUILT_DTYPE, section.trust_remote_code)
    if section.config is None:
        raise ValueError("a model section needs name_or_path (pretrained) or config (random init)")
    values = dict(section.config)
    config = AutoConfig.for_model(values.pop("model_type"), **{"vocab_size": vocab_size, **values})
    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(config, torch_dtype=getattr(torch, section.dtype or BUILT_DTYPE),
                                                trust_remote_code=section.trust_remote_code is True)
