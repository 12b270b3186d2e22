"""Several teachers of different vocabularies guiding one student (``Teachers``: each a
``vocagno.teacher.teacher.Teacher``), as the algorithm, the scoring pass and the selection report share them.

Each teacher is aligned to the student's tokens on its own (its tokenizer, its offsets); a student token's reference
loss combines the teachers' aggregated losses (``vocagno.core.loss.reference_loss``: ``min``, the best teacher's, or
``mean``). One teacher of the set, the *first* whose vocabulary is the shards' teacher vocabulary (else the first),
reads the batch's teacher side as a single teacher does (``teacher_input_ids``, ``align_start``, ``align_end`` and,
cached, ``teacher_loss``): ``Teachers.reader``. Every *other* teacher's tokens and
alignment are made from the student's tokens (``vocagno.teacher.side.TeacherSide``, in the training loader's workers
when it has some) into the batch keys ``teachers.NAME.input_ids``, ``.attention_mask``, ``.align_start`` and
``.align_end``; cached, its losses and alignment come from the shards' columns ``teacher_loss.NAME`` and
``align.NAME`` (``python -m vocagno.score ... --name NAME``) as ``teachers.NAME.teacher_loss`` and its alignment.
"""

from __future__ import annotations

import time
from typing import Any, Mapping

import torch
from torch import nn

from vocagno.data.batch import (ALIGN_END, ALIGN_START, TEACHER_ATTENTION_MASK, TEACHER_INPUT_IDS, TEACHER_LOSS,
    teacher_key)
from vocagno.data.shards import check_teacher_name, loss_column
from vocagno.errors import Refused
from vocagno.teacher.side import TeacherSide
from vocagno.teacher.teacher import Teacher

__all__ = ["TEACHER_SHARE", "Teachers", "check_one_or_several", "teachers_from", "reader_first", "WithOtherTeachers",
           "made_side", "teacher_shares"]

TEACHER_SHARE = "vocagno/teacher_share/"  # the metric of each teacher's share, by its name after this

SIDE_KEYS = ("input_ids", "attention_mask", ALIGN_START, ALIGN_END)


def check_one_or_several(teacher: Any, teachers: Any, yaml: bool = False) -> None:
    """A teacher (one) or teachers (several, by name), not both: ``VocAgnoLM``'s arguments, one of which it needs, or
    a yaml's ``teacher:`` and ``teachers:`` sections (``yaml``), neither of which is a run without a teacher."""
    if yaml and teacher is not None and teachers is not None:
        raise Refused("give teacher: (one) or teachers: (several, by name), not both: where a base: yaml gives "
                      "teacher:, set teacher: null beside your teachers:")
    if not yaml and (teacher is None) == (teachers is None):
        raise ValueError("VocAgnoLM: give teacher (one) or teachers (several, by name), not both")


def teachers_from(teachers: Mapping[str, Any]) -> list[Teacher]:
    """``teachers`` (a mapping name -> a ``Teacher``, a model, or a mapping of a ``teacher:`` section's keys: as
    ``Teacher.of`` takes them) as ``Teacher`` s named by their keys, checked: at least two, each name once and
    well-formed."""
    if not isinstance(teachers, Mapping):
        raise ValueError(f"teachers must be a mapping of name -> teacher, got {type(teachers).__name__}")
    if len(teachers) < 2:
        raise ValueError(f"teachers names {len(teachers)} teacher(s): give one as teacher, several as teachers")
    made, seen = [], set()
    for name, value in teachers.items():
        check_teacher_name(name)
        if name.lower() in seen:  # a mapping can't repeat a key, but two spellings would collide in metric names
            raise ValueError(f"teachers: two teachers are named {name!r}")
        seen.add(name.lower())
        made.append(Teacher.of(value, name))
    return made


def reader_first(teachers: list[Teacher], metadata) -> list[Teacher]:
    """``teachers`` with the first whose vocabulary is the shards' teacher vocabulary (``metadata``: it reads their
    teacher tokens) first; refused when none is, or when several lack distinct names. As given where there is
    nothing to choose by (one teacher, or no shards' metadata)."""
    if len(teachers) == 1 or metadata is None:
        return teachers
    names = [t.name for t in teachers]
    if None in names or len({n.lower() for n in names}) < len(names):
        raise Refused(f"several teachers need distinct names, got {names}")
    for i, each in enumerate(teachers):
        if each.reads(metadata):
            return [each, *teachers[:i], *teachers[i + 1:]]
    named = ", ".join(f"{t.name} ({t.tokenizer_source})" if isinstance(t.tokenizer_source, str) else str(t.name)
                      for t in teachers)
    raise Refused(f"none of the teachers {named} reads the shards' teacher tokens (tokenizer "
                  f"{metadata.teacher.name!r}): convert the corpus with one of their tokenizers")


def made_side(side: TeacherSide, name: str, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Teacher ``name``'s side of a batch of student tokens, made by ``side``, under its own keys."""
    made = side({key: batch[key] for key in ("input_ids", "attention_mask") if key in batch})
    return {teacher_key(name, what): made[key] for what, key in zip(SIDE_KEYS, (
        TEACHER_INPUT_IDS, TEACHER_ATTENTION_MASK, ALIGN_START, ALIGN_END))}


def teacher_shares(names: list[str], counts: list[float]) -> dict[str, float]:
    """``vocagno/teacher_share/NAME``: per teacher (``names``, in the order of ``counts``: the kept mapped tokens whose
    reference each gave, then all the kept mapped ones), its share; with ``combine: mean`` every teacher that mapped a
    token gave it, so the shares may add up to more than 1."""
    *per_teacher, kept = counts
    return {f"{TEACHER_SHARE}{name}": count / max(kept, 1) for name, count in zip(names, per_teacher)}


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


class Teachers:
    """The teachers guiding one student: one, or a set. The ``reader`` reads the batch's own teacher side (chosen by
    ``choose_reader``: the first whose vocabulary the shards' teacher tokens have); each of the ``others`` has its
    side made from the student's tokens, its scorer (online) or its cached losses, and its share logged by name."""

    def __init__(self, teachers: list[Teacher], cached: bool):
        self.all, self.cached = list(teachers), cached
        self.reader = self.all[0]
        self.scorers: dict[str, nn.Module] = {}  # the others' scorers, placed
        self.sides: dict[str, TeacherSide] = {}  # the others' sides
        self.seconds: dict[str, float] = {}  # each other teacher's forward time in this step

    @property
    def others(self) -> list[Teacher]:
        return [each for each in self.all if each is not self.reader]

    @property
    def other_names(self) -> list[str]:
        return [each.name for each in self.others]

    @property
    def names(self) -> list[str]:
        """Every teacher's name in metrics, the reader's first (``teacher`` for a teacher alone)."""
        return [self.reader.name or "teacher", *self.other_names]

    def choose_reader(self, metadata) -> bool:
        """Make the first teacher that reads the shards' teacher side (``reader_first``) the reader; whether it
        changed (another fit may keep what an earlier one built)."""
        if metadata is None:  # nothing to choose by: the reader stays
            return False
        reader = reader_first(self.all, metadata)[0]
        changed, self.reader = reader is not self.reader, reader
        if changed:  # the others' sides and scorers are made again for the new set of others
            self.scorers, self.sides = {}, {}
        return changed

    def make_sides(self, student_tokenizer) -> dict[str, TeacherSide]:
        """Each other teacher's ``TeacherSide`` (online only: cached losses come with their alignment)."""
        if self.cached:
            return self.sides
        missing = [each for each in self.others if each.name not in self.sides]
        if missing and student_tokenizer is None:
            raise ValueError("VocAgnoLM makes the other teachers' tokens from the text of the student's: give it "
                             "student_tokenizer (or a HuggingFaceModel with its tokenizer)")
        for each in missing:
            self.sides[each.name] = each.side(student_tokenizer)
        return {name: self.sides[name] for name in self.other_names}

    def add_sides(self, batch: dict[str, Any], student_tokenizer) -> None:
        """The other teachers' sides, where the loader's workers did not make them."""
        if self.cached or not self.others:
            return
        for name, side in self.make_sides(student_tokenizer).items():
            if teacher_key(name, "input_ids") not in batch:
                batch.update({k: v.to(batch["input_ids"].device) for k, v in made_side(side, name, batch).items()})

    def build(self, metadata, place) -> None:
        """Each other teacher's scorer, checked against the shards (``metadata``: it reads its own tokens, made from
        their text) and placed by ``place(scorer, teacher)``."""
        if self.cached:
            return
        for each in self.others:
            if each.name not in self.scorers:
                each.check_reads(metadata, own_tokens=True)
                self.scorers[each.name] = place(each.scorer(), each)

    def check_cached(self, metadata) -> None:
        """Refuse shards (``metadata``: their ``ShardMetadata``) that lack an other teacher's cached losses, or hold
        another teacher's under its name, naming the teacher."""
        scored = getattr(metadata, "also_scored_by", None) or {}
        for each in self.others:
            by = scored.get(each.name)
            if by is None:
                raise ValueError(f"teacher_losses: cached, but the training shards carry no losses of teacher "
                                 f"{each.name!r}: score them with it (python -m vocagno.score --shards SHARDS "
                                 f"--config YAML --name {each.name} --out SCORED: docs/training.md) and train on "
                                 "SCORED")
            wanted = each.tokenizer_info() if each.tokenizer_source is not None else None
            if wanted is not None and by["tokenizer"]["fingerprint"] != wanted.fingerprint:
                raise ValueError(f"teacher {each.name!r}: the shards' {loss_column(each.name)} was scored with the "
                                 f"tokenizer {by['tokenizer']['name']!r}, but this run's is {wanted.name!r}: its "
                                 "tokens and alignment would differ; score them with this tokenizer")
            each.check_scorer(by, f"teacher {each.name!r}: the shards' {loss_column(each.name)} was")

    def losses(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Each other teacher's token losses ``[B, M_t]`` of ``batch``: its forward, or its cached losses."""
        out = {}
        for name in self.other_names:
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
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - begin
        return out

    def take_seconds(self) -> dict[str, float]:
        """The others' forward seconds of this step, each (0 for none); the count starts again."""
        seconds = {name: self.seconds.get(name, 0.0) for name in self.other_names}
        self.seconds = {}
        return seconds
