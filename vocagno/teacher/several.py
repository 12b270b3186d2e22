"""Several teachers of different vocabularies guiding one student: the set that the algorithm, the scoring pass and
the selection tool share.

Each teacher is aligned to the student's tokens on its own (its tokenizer, its offsets); a student token's reference
loss combines the teachers' aggregated losses (``vocagno.core.loss.reference_loss``: ``min``, the best teacher's, or
``mean``). One teacher of the set, the *first* whose vocabulary is the shards' teacher vocabulary (else the first),
reads the batch's teacher side as a single teacher does (``teacher_input_ids``, ``align_start``, ``align_end`` and,
cached, ``teacher_loss``): ``VocAgnoLM`` treats it as its ``teacher``. Every *other* teacher's tokens and
alignment are made from the student's tokens (``vocagno.teacher.side.TeacherSide``, in the training loader's workers
when it has some) into the batch keys ``teachers.NAME.input_ids``, ``.attention_mask``, ``.align_start`` and
``.align_end``; cached, its losses and alignment come from the shards' columns ``teacher_loss.NAME`` and
``align.NAME`` (``python -m vocagno.score ... --name NAME``) as ``teachers.NAME.teacher_loss`` and its alignment.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch
from torch import nn

from vocagno.data.shards import check_teacher_name, describe_tokenizer, loss_column
from vocagno.teacher.side import TeacherSide
from vocagno.core.tokenization import as_tokenizer
from vocagno.core.loss import CHUNK_SIZE
from vocagno.core.kernels import DEFAULT_KERNELS
from vocagno.data.batch import (ALIGN_END, ALIGN_START, TEACHER_ATTENTION_MASK, TEACHER_INPUT_IDS, TEACHER_LOSS,
    teacher_key)

__all__ = ["TeacherSpec", "teacher_specs", "OtherTeachers", "WithOtherTeachers", "made_side", "check_scored_by_teacher",
           "reading_teacher", "checked_teacher", "teacher_shares", "teacher_label"]

SPEC_KEYS = ("teacher", "tokenizer", "dtype", "placement", "chunk_size", "trust_remote_code", "kernels",
             "compile_config")
SIDE_KEYS = ("input_ids", "attention_mask", ALIGN_START, ALIGN_END)


@dataclass
class TeacherSpec:
    """One teacher of a set: ``teacher`` a Hugging Face name or folder (or shipped name), or a causal LM module; the
    other fields as ``VocAgnoLM``'s ``teacher_tokenizer``, ``teacher_dtype``, ``teacher_placement``, ``chunk_size``,
    ``trust_remote_code``, ``teacher_kernels`` and ``teacher_compile_config``."""

    name: str
    teacher: str | nn.Module
    tokenizer: Any = None
    dtype: str = "bfloat16"
    placement: str = "auto"
    chunk_size: int = CHUNK_SIZE
    trust_remote_code: bool = False
    kernels: str = DEFAULT_KERNELS
    compile_config: dict | None = None
    _loaded: Any = field(default=None, init=False, repr=False, compare=False)  # the tokenizer, once loaded

    def __post_init__(self):
        if self.tokenizer is None and isinstance(self.teacher, str):
            self.tokenizer = self.teacher  # a named teacher's folder has its tokenizer

    def loaded_tokenizer(self):
        """Its tokenizer, loaded (None for a module given without one); one that won't load names the teacher."""
        if self.tokenizer is None:
            return None
        if self._loaded is not None:  # asked for by every check: a 151K vocabulary loads in a quarter of a second
            return self._loaded
        try:
            self._loaded = as_tokenizer(self.tokenizer)
            return self._loaded
        except Exception as error:  # not a tokenizer's name or folder, a hub name offline, a broken file
            message = str(error).strip().splitlines()[0] if str(error).strip() else error.__class__.__name__
            raise ValueError(f"teacher {self.name!r}: cannot load its tokenizer {self.tokenizer!r}: {message}") from None

    def required_tokenizer(self):
        """Its tokenizer, loaded, where its tokens are made from the text: a module given without one is refused."""
        if self.tokenizer is None:
            raise ValueError(f"teachers.{self.name}: give its tokenizer (a teacher given as a module has none)")
        return self.loaded_tokenizer()

    def reads(self, metadata) -> bool:
        """Whether this teacher's vocabulary is the one the shards' teacher tokens were made with."""
        if self.tokenizer is None or metadata is None:
            return False
        return metadata.teacher.same_vocabulary(describe_tokenizer(self.loaded_tokenizer(), "teacher"))


def teacher_specs(teachers: Mapping[str, Any]) -> list[TeacherSpec]:
    """``teachers`` (a mapping name -> a teacher, or name -> a dict of ``TeacherSpec``'s fields) as specs, checked:
    at least two, each name once and well-formed, known fields only."""
    if not isinstance(teachers, Mapping):
        raise ValueError(f"teachers must be a mapping of name -> teacher, got {type(teachers).__name__}")
    if len(teachers) < 2:
        raise ValueError(f"teachers names {len(teachers)} teacher(s): give one as teacher, several as teachers")
    specs, seen = [], set()
    for name, value in teachers.items():
        check_teacher_name(name)
        if name.lower() in seen:  # a mapping can't repeat a key, but two spellings would collide in metric names
            raise ValueError(f"teachers: two teachers are named {name!r}")
        seen.add(name.lower())
        fields = dict(value) if isinstance(value, Mapping) else {"teacher": value}
        unknown = sorted(set(fields) - set(SPEC_KEYS))
        if unknown or fields.get("teacher") is None:
            raise ValueError(f"teachers.{name}: needs teacher, may have {', '.join(SPEC_KEYS[1:])}"
                             + (f"; unknown: {', '.join(unknown)}" if unknown else ""))
        specs.append(TeacherSpec(name, **{k: v for k, v in fields.items() if v is not None}))
    return specs


def made_side(side: TeacherSide, name: str, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Teacher ``name``'s side of a batch of student tokens, made by ``side``, under its own keys."""
    made = side({key: batch[key] for key in ("input_ids", "attention_mask") if key in batch})
    return {teacher_key(name, what): made[key] for what, key in zip(SIDE_KEYS, (
        TEACHER_INPUT_IDS, TEACHER_ATTENTION_MASK, ALIGN_START, ALIGN_END))}


def reading_teacher(specs: list[TeacherSpec], metadata) -> TeacherSpec | None:
    """Of a set, the teacher that reads the shards' teacher side: the first whose vocabulary they were made with; a
    set none of whose teachers reads them is refused. None where there is nothing to choose by (no shards' metadata)."""
    if metadata is None:
        return None
    if len(specs) == 1:
        return specs[0]
    reads = [spec for spec in specs if spec.reads(metadata)]
    if not reads:
        names = ", ".join(f"{spec.name} ({spec.tokenizer})" for spec in specs)
        raise ValueError(f"the shards' teacher tokens are {metadata.teacher.name!r}'s, and no teacher of the set reads "
                         f"them ({names}): convert the corpus with one of their tokenizers")
    return reads[0]


def checked_teacher(spec: TeacherSpec, metadata):
    """A set's other teacher as a ``TeacherScorer``, loaded and checked: it reads its own tokens (made from the text
    with its tokenizer) at the length of the shards' rows (``metadata``, when there are shards)."""
    from dataclasses import replace

    from vocagno.teacher.model import TeacherScorer, check_teacher_reads, load_teacher

    teacher = spec.teacher
    if isinstance(teacher, str):
        teacher = load_teacher(teacher, spec.dtype, spec.trust_remote_code)
    if metadata is not None:
        own = replace(metadata, teacher=describe_tokenizer(spec.required_tokenizer(), "teacher"))
        try:
            check_teacher_reads(teacher, own)
        except ValueError as error:
            raise ValueError(f"teacher {spec.name!r}: {error}") from None
    return TeacherScorer(teacher, spec.chunk_size, spec.kernels, spec.compile_config)


def teacher_label(teacher: str | nn.Module) -> str:
    """A teacher as a run names it to its user: its name or folder, or what a model built from a config is."""
    if isinstance(teacher, str):
        return teacher
    config = getattr(teacher, "config", None)
    named = getattr(config, "_name_or_path", "") or getattr(config, "name_or_path", "")
    if named:
        return str(named)
    return f"a random-init {getattr(config, 'model_type', type(teacher).__name__)} built from its config"


def teacher_shares(names: list[str], counts: list[float]) -> dict[str, float]:
    """``vocagno/teacher_share/NAME``: per teacher (``names``, in the order of ``counts``: the kept mapped tokens whose
    reference each gave, then all the kept mapped ones), its share; with ``combine: mean`` every teacher that mapped a
    token gave it, so the shares may add up to more than 1."""
    *per_teacher, kept = counts
    return {f"vocagno/teacher_share/{name}": count / max(kept, 1) for name, count in zip(names, per_teacher)}


def check_scored_by_teacher(teacher: str | nn.Module, by: dict, check: bool, losses: str) -> None:
    """Refuse cached losses that ``by`` (a ``ShardMetadata.scored_by`` entry) says another teacher scored than
    ``teacher`` (its name, or the module: its weights). ``losses`` begins the message (which losses, and "was"/"were");
    with ``check`` false, only say who scored them."""
    from vocagno.teacher.model import weights_fingerprint

    if not check:
        print(f"VocAgnoLM: {losses} scored by {by}; not checked (check_scored_by: false)", flush=True)
    elif isinstance(teacher, str) and by["name"] != teacher:
        raise ValueError(f"{losses} scored by {by['name']!r}, but the teacher is {teacher!r}: score them with this "
                         "teacher, name the one that scored them, or set check_scored_by: false when the teacher's "
                         "name is only a label")
    elif isinstance(teacher, nn.Module) and by["fingerprint"] != weights_fingerprint(teacher):
        raise ValueError(f"{losses} scored by {by['name']!r} (weights {by['fingerprint']}), but this run's teacher "
                         f"has other weights ({weights_fingerprint(teacher)}): score them with this teacher")


class WithOtherTeachers:
    """A loader's ``collate_fn`` that adds the other teachers' sides (``made_side``) to its batches, in the loader's
    worker processes. Batches that have them pass as they are."""

    def __init__(self, collate_fn, sides: dict[str, TeacherSide], loader: str):
        self.collate_fn, self.sides, self.loader = collate_fn, sides, loader

    def __call__(self, samples: list) -> dict[str, Any]:
        batch = self.collate_fn(samples)
        for name, side in self.sides.items():
            if teacher_key(name, "input_ids") not in batch:
                try:
                    batch.update(made_side(side, name, batch))
                except ValueError as error:
                    raise ValueError(f"the training loader ({self.loader}), teacher {name!r}: {error}") from None
        return batch


class OtherTeachers:
    """The teachers of a set beside the one ``VocAgnoLM`` treats as its ``teacher``: their sides, their scorers
    (online) or cached losses, and the names under which their shares are logged."""

    def __init__(self, specs: list[TeacherSpec], cached: bool):
        self.specs, self.cached = specs, cached
        self.names = [spec.name for spec in specs]
        self.scorers: dict[str, nn.Module] = {}
        self.sides: dict[str, TeacherSide] = {}
        self.seconds = dict.fromkeys(self.names, 0.0)  # each teacher's forward time in this step

    def make_sides(self, student_tokenizer) -> dict[str, TeacherSide]:
        """Each other teacher's ``TeacherSide`` (online only: cached losses come with their alignment)."""
        if self.cached or self.sides or not self.specs:  # a single teacher has no others to make
            return self.sides
        if student_tokenizer is None:
            raise ValueError("VocAgnoLM makes the other teachers' tokens from the text of the student's: give it "
                             "student_tokenizer (or a HuggingFaceModel with its tokenizer)")
        for spec in self.specs:
            self.sides[spec.name] = TeacherSide(as_tokenizer(student_tokenizer), spec.required_tokenizer())
        return self.sides

    def add_sides(self, batch: dict[str, Any], student_tokenizer) -> None:
        """The other teachers' sides, where the loader's workers did not make them."""
        if self.cached:
            return
        for name, side in self.make_sides(student_tokenizer).items():
            if teacher_key(name, "input_ids") not in batch:
                batch.update({k: v.to(batch["input_ids"].device) for k, v in made_side(side, name, batch).items()})

    def build(self, load, place) -> None:
        """Each other teacher's scorer: ``load(spec)`` builds it (checked), ``place(scorer, spec)`` places it."""
        if not self.cached and not self.scorers:
            for spec in self.specs:
                self.scorers[spec.name] = place(load(spec), spec)

    def check_cached(self, metadata, check_scored_by: bool) -> None:
        """Refuse shards (``metadata``: their ``ShardMetadata``) that lack an other teacher's cached losses, or hold
        another teacher's under its name, naming the teacher."""
        scored = getattr(metadata, "also_scored_by", None) or {}
        for spec in self.specs:
            by = scored.get(spec.name)
            if by is None:
                raise ValueError(f"teacher_losses: cached, but the training shards carry no losses of teacher "
                                 f"{spec.name!r}: score them with it (python -m vocagno.score ... --name {spec.name})")
            wanted = describe_tokenizer(spec.loaded_tokenizer(), "teacher") if spec.tokenizer else None
            if wanted is not None and by["tokenizer"]["fingerprint"] != wanted.fingerprint:
                raise ValueError(f"teacher {spec.name!r}: the shards' {loss_column(spec.name)} was scored with the "
                                 f"tokenizer {by['tokenizer']['name']!r}, but this run's is {wanted.name!r}: its tokens "
                                 "and alignment would differ; score them with this tokenizer")
            check_scored_by_teacher(spec.teacher, by, check_scored_by,
                                    f"teacher {spec.name!r}: the shards' {loss_column(spec.name)} was")

    def losses(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Each other teacher's token losses ``[B, M_t]`` of ``batch``: its forward, or its cached losses."""
        out = {}
        for name in self.names:
            if self.cached:
                key = teacher_key(name, TEACHER_LOSS)
                if key not in batch:
                    raise KeyError(f"teacher_losses: cached, but the batch has no {key}: train on shards scored by "
                                   f"python -m vocagno.score ... --name {name}")
                out[name] = batch[key].float()
                continue
            begin = time.perf_counter()
            out[name] = self.scorers[name](batch[teacher_key(name, "input_ids")],
                                           batch[teacher_key(name, "attention_mask")])
            if out[name].is_cuda:
                torch.cuda.synchronize()  # so that the time is the teacher's forward, not its launch
            self.seconds[name] += time.perf_counter() - begin
        return out
