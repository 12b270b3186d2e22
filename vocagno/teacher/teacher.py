"""One teacher, as training, the scoring pass and the selection report know it.

A ``Teacher`` is its model (a Hugging Face name, folder or shipped name, or a causal LM module), its tokenizer and
its options. It loads its model once (``load``) into the module that scores its tokens (``scorer``:
``vocagno.teacher.model.TeacherScorer``), makes its tokens and alignment from a student's (``side``:
``vocagno.teacher.side.TeacherSide``), checks that it can read shards (``check_reads``), says where its cached losses go
in them (``column``) and whether cached losses are its own (``check_scorer``). A yaml's section becomes one in one
way (``Teacher.from_config``), and any teacher an algorithm is given (``Teacher.of``). Several guiding one student are
``vocagno.teacher.several.Teachers``.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vocagno.core.kernels import DEFAULT_KERNELS, check_speed
from vocagno.core.tokenization import as_tokenizer
from vocagno.data.shards import ShardMetadata, describe_tokenizer
from vocagno.shown import terminal
from vocagno.errors import Refused
from vocagno.teacher.config import LOADED_DTYPE, TeacherConfig
from vocagno.teacher.model import (
    TeacherScorer, check_teacher_options, check_teacher_reads, load_teacher, weights_fingerprint,
)

__all__ = ["NoTokenizer", "Teacher", "PLACEMENTS", "TOKENIZER_FILES", "teacher_label"]

PLACEMENTS = ("auto", "replicate", "fsdp")


def _sharded(module: nn.Module) -> bool:
    from torch.distributed.fsdp import FullyShardedDataParallel

    return any(isinstance(each, FullyShardedDataParallel) for each in module.modules())


def teacher_label(model: str | nn.Module) -> str:
    """A teacher's model as a run names it to its user: its name or folder, or what a model built from a config is."""
    if isinstance(model, str):
        return model
    config = getattr(model, "config", None)
    named = getattr(config, "_name_or_path", "") or getattr(config, "name_or_path", "")
    if named:
        return str(named)
    return f"a random-init {getattr(config, 'model_type', type(model).__name__)} built from its config"


# The files a tokenizer's folder holds, one of them at least (transformers' fast and slow tokenizers).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "tokenizer_config.json")


class NoTokenizer(Refused):
    """A teacher given by a model folder that holds no tokenizer files; the message names the teacher and its
    folder, and the command that made it adds how its user gives the tokenizer (a flag, a yaml key, an argument)."""


@dataclass
class Teacher:
    """One frozen teacher.

    Args:
        model: a Hugging Face name, folder or shipped name (loaded in ``dtype``), or a causal LM module.
        name: its name in a set of teachers (shard columns, batch keys, metric names); None for a teacher alone.
        tokenizer: its tokenizer (name, folder or object); unset, its model's folder's when ``model`` is a name
            (``tokenizer_source``).
        dtype, trust_remote_code: how a model given by name loads.
        placement: ``replicate``, ``fsdp`` or ``auto`` (``fsdp`` when the run uses FSDP); ``VocAgnoLM``'s alone.
        chunk_size, kernels, compile_config, chunk_mem_const: how its scorer runs (``TeacherScorer``; a
            ``chunk_size`` of None: ``CHUNK_SIZE`` with PyTorch's kernels, Liger's own chunks with theirs, bounded
            by ``chunk_mem_const``).
        label: what runs and the scoring pass's ``scored_by`` call it; unset, ``teacher_label(model)``.
        check_scored_by: with cached losses, refuse those another teacher scored (``check_scorer``).

    Its options' defaults are a ``teacher:`` section's (``TeacherConfig``).
    """

    model: str | nn.Module
    name: str | None = None
    tokenizer: Any = TeacherConfig.tokenizer
    dtype: str = LOADED_DTYPE
    placement: str = TeacherConfig.placement
    chunk_size: int | None = TeacherConfig.chunk_size
    trust_remote_code: bool = TeacherConfig.trust_remote_code
    kernels: str = TeacherConfig.kernels
    compile_config: dict | None = TeacherConfig.compile_config
    label: str = ""
    check_scored_by: bool = TeacherConfig.check_scored_by
    chunk_mem_const: int | None = TeacherConfig.chunk_mem_const
    _tokenizer: Any = field(default=None, init=False, repr=False, compare=False)  # loaded once
    _module: nn.Module | None = field(default=None, init=False, repr=False, compare=False)  # loaded once
    _scorer: TeacherScorer | None = field(default=None, init=False, repr=False, compare=False)  # built once
    _fingerprint: str = field(default="", init=False, repr=False, compare=False)  # of its frozen weights

    def __post_init__(self):
        self.label = self.label or teacher_label(self.model)

    @classmethod
    def from_config(cls, section: Any, name: str | None = None, seed: int | None = None, tokenizer: Any = None,
                    label: str = "", where: str | None = None) -> "Teacher":
        """A ``teacher:`` section, a ``teachers:`` entry (``name``), or the mapping an llm-foundry yaml gives
        ``algorithms.vocagno.teacher`` (``TeacherConfig``'s keys; another is refused naming ``where``, by default
        ``teacher`` or ``teachers.NAME``) as a ``Teacher``. One given by ``name_or_path`` is loaded when first needed;
        one built from its ``config`` is built here, its random weights a function of the section and ``seed`` (the
        scoring pass builds the very teacher a run of the same yaml builds), its vocabulary its tokenizer's.
        ``tokenizer``: its tokenizer, loaded (None: the section's, loaded where needed)."""
        # Its build_causal_lm looked up when called: benchmarks/bench_step.py builds them on a device by replacing it.
        from vocagno.teacher import config as sections

        where = where or (f"teachers.{name}" if name is not None else "teacher")
        config = TeacherConfig.of(section, f"{where}.")
        if config.name_or_path:
            model = config.name_or_path
        elif config.config is None:
            raise ValueError(f"{where}: needs name_or_path (pretrained) or config (random init)")
        else:
            if tokenizer is None and config.tokenizer is None:  # its vocabulary is its tokenizer's
                raise Refused(f"{where} is built from its config and needs its tokenizer")
            tokenizer = as_tokenizer(config.tokenizer) if tokenizer is None else tokenizer
            model = sections.build_causal_lm(config, len(tokenizer), seed)
        return cls(model, name, config.tokenizer if tokenizer is None else tokenizer, config.dtype or LOADED_DTYPE,
                   config.placement, config.chunk_size, config.trust_remote_code, config.kernels,
                   config.compile_config, label, config.check_scored_by, config.chunk_mem_const)

    @classmethod
    def of(cls, given: Any, name: str | None = None) -> "Teacher":
        """A teacher as an algorithm is given it, named ``name`` (a set's, or None): a ``Teacher`` (renamed where a set
        names it otherwise), a model (a Hugging Face name or folder, a shipped name, a folder as a ``pathlib.Path``,
        or a causal LM module), or a mapping of a ``teacher:`` section's keys (``from_config``)."""
        if isinstance(given, Teacher):
            return given if name is None or given.name == name else replace(given, name=name)
        if isinstance(given, (str, nn.Module)):
            return cls(given, name)
        if isinstance(given, os.PathLike):  # a folder, as its name as a string gives it
            return cls(os.fspath(given), name)
        return cls.from_config(given, name)

    @property
    def tokenizer_source(self) -> Any:
        """Its tokenizer as given, else its model's name (a named teacher's folder has its tokenizer); None for a
        module given without one."""
        if self.tokenizer is not None:
            return self.tokenizer
        return self.model if isinstance(self.model, str) else None

    @property
    def called(self) -> str:
        """How messages name it: ``teacher 'NAME'`` in a set, ``the teacher`` alone."""
        return f"teacher {self.name!r}" if self.name else "the teacher"

    def check_options(self) -> None:
        """Refuse options it can't run with, before anything loads, naming it (``teachers.NAME`` in a set)."""
        where = f"teachers.{self.name}" if self.name else "teacher"
        try:
            if self.placement not in PLACEMENTS:
                raise ValueError(f"teacher_placement must be one of {PLACEMENTS}, got {self.placement!r}")
            check_teacher_options(self.dtype, self.trust_remote_code)
            if not isinstance(self.check_scored_by, bool):  # 0 would switch the check off, "false" leave it on
                raise ValueError(f"check_scored_by must be True or False, got {self.check_scored_by!r}")
        except ValueError as error:
            raise ValueError(f"{where}: {error}" if self.name else str(error)) from None
        check_speed(self.kernels, self.compile_config, self.chunk_size, where, self.chunk_mem_const)

    def loaded_tokenizer(self):
        """Its tokenizer, loaded once (None for a module given without one); one that won't load names the teacher
        (``Refused``), and a model folder without tokenizer files says so (``NoTokenizer``: each command adds how its
        user gives one)."""
        if self.tokenizer_source is None or self._tokenizer is not None:
            return self._tokenizer
        source = self.tokenizer_source
        if isinstance(source, (str, Path)) and Path(source).is_dir() and \
                not any((Path(source) / name).is_file() for name in TOKENIZER_FILES):
            raise NoTokenizer(f"{self.called}: its folder {source} holds no tokenizer files "
                              f"({', '.join(TOKENIZER_FILES)})")
        try:
            self._tokenizer = as_tokenizer(source)
        except Exception as error:  # not a tokenizer's name or folder, a hub name offline, a broken file
            message = str(error).strip().splitlines()[0] if str(error).strip() else error.__class__.__name__
            message = message if len(message) <= 200 else message[:200] + " ..."
            raise Refused(f"{self.called}: cannot load its tokenizer {source!r}: {message}") from None
        return self._tokenizer

    def required_tokenizer(self):
        """Its tokenizer, loaded, where its tokens are made from the text: a module given without one is refused."""
        if self.tokenizer_source is None:
            where = f"teachers.{self.name}" if self.name else "teacher_tokenizer"
            raise ValueError(f"{where}: give its tokenizer (a teacher given as a module has none)")
        return self.loaded_tokenizer()

    def tokenizer_info(self):
        return describe_tokenizer(self.required_tokenizer(), "teacher")

    def reads(self, metadata: ShardMetadata | None) -> bool:
        """Whether its vocabulary is the one the shards' teacher tokens were made with (False where it can't say)."""
        if self.tokenizer_source is None or metadata is None:
            return False
        return metadata.teacher.same_vocabulary(self.tokenizer_info())

    def load(self) -> nn.Module:
        """Its model: loaded by name (once), or the module it was given."""
        if self._module is None:
            self._module = self.model if isinstance(self.model, nn.Module) else load_teacher(
                self.model, self.dtype, self.trust_remote_code)
        return self._module

    def scorer(self) -> TeacherScorer:
        """The module that scores its tokens, built once. FSDP changes the module it shards in place: one an earlier
        run sharded is loaded again (a teacher given by name) or refused (a module)."""
        if self._scorer is not None and _sharded(self._scorer):
            if not isinstance(self.model, str):
                raise ValueError(f"{self.called}: its module was sharded by an earlier run: give it by name, or a new "
                                 "module")
            self._module = self._scorer = None
        if self._scorer is None:
            self._scorer = TeacherScorer(self.load(), self.chunk_size, self.kernels, self.compile_config,
                                         self.chunk_mem_const)
        return self._scorer

    def check_reads(self, metadata: ShardMetadata | None, own_tokens: bool = False) -> None:
        """Refuse a teacher that can't read the shards (``metadata``) it is to score: their teacher tokens, or, with
        ``own_tokens``, its own tokens made from their text with its tokenizer."""
        if metadata is None:
            return
        if own_tokens:
            metadata = replace(metadata, teacher=self.tokenizer_info())
        tokenizer = None if own_tokens else self.loaded_tokenizer()  # a refusal of it names the teacher already
        try:
            check_teacher_reads(self.load(), metadata, tokenizer)
        except ValueError as error:
            raise ValueError(f"{self.called}: {error}" if self.name else str(error)) from None

    def side(self, student_tokenizer):
        """The ``TeacherSide`` that makes its tokens and alignment from a student's tokens."""
        from vocagno.teacher.side import TeacherSide

        return TeacherSide(as_tokenizer(student_tokenizer), self.required_tokenizer())

    def scored_by(self) -> dict:
        """What shards it scores record of it (``ShardMetadata.scored_by``): its label, its weights' fingerprint, and
        the dtype it was loaded in (a module's: its weights')."""
        weights = str(next(self.load().parameters()).dtype).removeprefix("torch.")
        dtype = self.dtype if isinstance(self.model, str) else weights
        return {"name": self.label, "fingerprint": self.fingerprint(), "dtype": dtype}

    def fingerprint(self) -> str:
        """Its weights' fingerprint (``weights_fingerprint``), computed once: they are frozen."""
        self._fingerprint = self._fingerprint or weights_fingerprint(self.load())
        return self._fingerprint

    def check_scorer(self, by: dict, losses: str) -> None:
        """Refuse cached losses that ``by`` (a ``ShardMetadata.scored_by`` entry) says another teacher scored: another
        name when it is given by name, other weights when given as a module. ``losses`` begins the message (which
        losses, and "was"/"were"); with ``check_scored_by`` false, only say who scored them."""
        if not self.check_scored_by:
            print(terminal(f"VocAgnoLM: {losses} scored by {by}; not checked (check_scored_by: false)"), flush=True)
        elif isinstance(self.model, str) and by["name"] != self.label:
            raise ValueError(f"{losses} scored by {by['name']!r}, but the teacher is {self.label!r}: score them with "
                             "this teacher, name the one that scored them, or set the teacher's check_scored_by: false "
                             "when its name is only a label")
        elif isinstance(self.model, nn.Module) and by["fingerprint"] != self.fingerprint():
            raise ValueError(f"{losses} scored by {by['name']!r} (weights {by['fingerprint']}), but this run's teacher "
                             f"has other weights ({self.fingerprint()}): score them with this teacher")

    def column(self, metadata: ShardMetadata, source: str) -> str | None:
        """Where the scoring pass puts its losses in ``metadata``'s shards: None for ``teacher_loss`` (the shards' own
        teacher tokens, not yet scored), else its name (``teacher_loss.NAME``); refused, in one line, when that
        place is taken or it has no name. A teacher alone given no tokenizer reads the shards' teacher tokens: its
        folder may hold its weights alone."""
        reads = (self.tokenizer is None and self.name is None) or self.reads(metadata)
        if reads and metadata.scored_by is None:
            return None
        if self.name is None:
            why = (f"is already scored (by {metadata.scored_by['name']})" if reads else
                   f"holds {metadata.teacher.name!r}'s teacher tokens, not this teacher's")
            raise Refused(f"{source} {why}: a further teacher of a set goes beside it under its name "
                          "(--name NAME, its name in the run's teachers:)")
        if self.name in (metadata.also_scored_by or {}):
            raise Refused(f"{source} is already scored by a teacher named {self.name!r} "
                          f"({metadata.also_scored_by[self.name]['name']})")
        return self.name

    def scoring_settings(self) -> dict:
        """What a resumed scoring pass must share with the one it resumes: its weights, chunk size, kernels and
        compiling (each changes the losses' last bits), and, scoring its own tokens, its tokenizer."""
        settings = {"scored_by": self.scored_by(), "chunk_size": self.scorer().chunk_size}
        if self.kernels != DEFAULT_KERNELS:  # the defaults: no key, as before there was a choice
            settings["kernels"] = self.kernels
        if self.compile_config is not None:
            settings["compile_config"] = self.compile_config
        if self.chunk_mem_const is not None:  # Liger's default: no key, as before there was a choice
            settings["chunk_mem_const"] = self.chunk_mem_const
        return settings

    def at_initialization(self, seed: int) -> "Teacher":
        """The same architecture with fresh random weights (from ``seed``): a control whose losses know nothing."""
        from transformers import AutoModelForCausalLM

        model = self.load()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            fresh = AutoModelForCausalLM.from_config(model.config, torch_dtype=next(model.parameters()).dtype)
        return replace(self, model=fresh, tokenizer=self.tokenizer_source,
                       label=f"{self.label} at initialization (seed {seed})")

    def student_side(self, metadata: ShardMetadata):
        """Its ``TeacherSide`` for shards' student tokens (``metadata``'s student tokenizer, checked)."""
        from vocagno.core.tokenization import load_tokenizer

        student = load_tokenizer(metadata.student.name)
        try:  # the name the shards record may load another vocabulary here
            metadata.check_tokenizers(student=describe_tokenizer(student, "student"))
        except ValueError as error:
            raise Refused(str(error)) from None
        return self.side(student)

    def recorded(self) -> dict:
        """``scored_by`` with its tokenizer, as a set's further teacher is recorded (``also_scored_by``)."""
        return {**self.scored_by(), "tokenizer": asdict(self.tokenizer_info())}
