"""VocAgnoLM as a Composer algorithm: a frozen teacher of any vocabulary guides which student tokens to train on.

    from vocagno.algorithms.vocagno_lm import VocAgnoLM
    trainer = Trainer(..., algorithms=[VocAgnoLM(teacher="Qwen/Qwen2.5-Math-7B-Instruct", topk_ratio=0.4)])

Batches from ``vocagno.data.dataset.TeacherGuidedCollator`` (shards made by the converter: student
``input_ids``/``labels`` plus ``align_start``/``align_end`` and the teacher's ``teacher_input_ids``/
``teacher_attention_mask``) are used as they are. A batch of student ``input_ids`` alone (llm-foundry's ``text``
loader, any recipe's) gets its teacher side made on the CPU (``vocagno.teacher.side.TeacherSide``: the text of the
student's tokens, the teacher's tokens of it, the alignment), from the student's tokenizer (``student_tokenizer``,
or the model's): in the training loader's worker processes when it has some (FIT_START wraps its ``collate_fn`` in
``WithTeacherSide``, before the workers start), else at AFTER_DATALOADER in the training process.

``selection_scope`` says over which tokens the top-k is taken. ``batch`` (the default, Rho-1's "tokens in a batch"):
the whole global batch, every rank and every microbatch, so ``device_train_microbatch_size`` is only a memory knob.
For that, AFTER_DATALOADER runs a scoring pass over the rank's batch, microbatch by microbatch: the teacher's token
losses (computed once, kept in the batch for training) and a no-grad forward of the student give each token's score;
the scores of all ranks are gathered and one top-k over them gives the selection, which travels in the batch as
``vocagno_selected``. The pass costs one extra student forward per step (``benchmarks/bench_step.py``).
``microbatch`` takes the top-k within each microbatch of each rank, ``sequence`` within each sequence: no scoring
pass, the teacher scores each microbatch after the student's forward. Then each microbatch:

- BEFORE_FORWARD: ``labels`` leave the batch, so a Hugging Face student computes no loss of its own;
- AFTER_FORWARD: ``teacher_guided_loss`` computes the guided loss from the student's logits and the teacher's token
  losses (``TeacherScorer`` under ``torch.no_grad()``: chunked cross-entropy, no fp32 logits over its whole
  vocabulary); its total becomes ``outputs["loss"]``, which ``HuggingFaceModel.loss`` returns as it is (no second CE);
- AFTER_LOSS: ``state.loss`` becomes the dict of ``vocagno.core.loss.guided_loss`` (``total`` and statistics, which
  Composer logs as ``loss/train/kept_fraction`` etc.); the teacher's forward time is logged as
  ``vocagno/teacher_forward_seconds``.

On a mixture (``TeacherGuidedDataset`` ``streams``: rows carry their ``stream``), each stream's share of the global
batch's rows and the share of its labeled tokens kept, counted over every microbatch and rank, are logged at the step's
loss as ``vocagno/stream_share/NAME`` and ``vocagno/kept_fraction/NAME``.

The teacher lives in the algorithm, never in ``state.model``: not in the optimizer, not in checkpoints. It is placed
on every device whole, or sharded with FSDP when the run uses FSDP (its ``placement``).
"""

from __future__ import annotations

import time
from typing import Any, Mapping

import torch
from composer.core import Algorithm, Event, State
from composer.core.precision import get_precision_context
from composer.loggers import Logger
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from vocagno.core.alignment import ALIGNMENT, NUM_CHUNKS, check_alignment, chunk_align
from vocagno.shown import terminal
from vocagno.data.dataset import TeacherGuidedCollator
from vocagno.core.loss import (AGGREGATION, COMBINE, SELECTION, SELECTION_SCOPE, TOPK_RATIO, UNMAPPED,
    check_options, excess_loss, guided_loss, next_token_cross_entropy)
from vocagno.teacher.model import shard_teacher
from vocagno.teacher.side import TeacherSide, WithTeacherSide, unpack_teacher_side
from vocagno.teacher.several import Teachers, WithOtherTeachers, check_one_or_several, teachers_from
from vocagno.teacher.teacher import NoTokenizer, Teacher
from vocagno.errors import Refused
from vocagno.data.batch import (ALIGN_END, ALIGN_START, SELECTED, TEACHER_ATTENTION_MASK, TEACHER_INPUT_IDS,
    TEACHER_LOSS, teacher_key)
from vocagno.algorithms.global_selection import select_over_ranks
from vocagno.algorithms.step_metrics import StepMetrics

__all__ = ["TEACHER_TIMINGS", "teacher_guided_loss", "VocAgnoLM"]

TEACHER_TIMINGS = ("wall", "device")  # VocAgnoLM.teacher_timing's choices


def teacher_guided_loss(
    student_logits: torch.Tensor,
    labels: torch.Tensor,
    batch: dict[str, torch.Tensor],
    teacher_loss: torch.Tensor,
    selected: torch.Tensor | None = None,
    others: Mapping[str, torch.Tensor] | None = None,
    **options: Any,
) -> dict[str, torch.Tensor]:
    """The functional form: ``guided_loss``'s dict for a ``TeacherGuidedCollator`` batch.

    ``student_logits`` ``[B, N, V]`` and ``labels`` ``[B, N]`` are per input position (Hugging Face's convention) and
    ``teacher_loss`` is ``TeacherScorer``'s ``[B, M]``; position i predicts student token i + 1, so labels and the
    batch's ``align_start``/``align_end`` move one place left here (the last position gets no label, as Hugging Face's
    loss pads it: slicing the logits instead would copy all B x N x V of them). ``selected`` ``[B, N - 1]`` and
    ``token_counts`` (``guided_loss``'s), when given, are per predicted token already. ``others``: the token losses of
    a set's other teachers by name (``vocagno.teacher.several``), aligned by the batch's ``teachers.NAME.align_*``.
    """
    losses, starts, ends = teacher_loss, _shift_left(batch[ALIGN_START], 0), _shift_left(batch[ALIGN_END], 0)
    if others:
        losses, starts, ends = [losses, *others.values()], [starts], [ends]
        for name in others:
            starts.append(_shift_left(batch[teacher_key(name, ALIGN_START)], 0))
            ends.append(_shift_left(batch[teacher_key(name, ALIGN_END)], 0))
    return guided_loss(
        student_logits, _shift_left(labels, -100), losses, starts, ends,
        selected=None if selected is None else F.pad(selected, (0, 1), value=False),
        **options,
    )


def _shift_left(values: torch.Tensor, pad: Any) -> torch.Tensor:
    """``values[:, 1:]`` with ``pad`` appended: what position i of the logits predicts, for every position."""
    return F.pad(values[:, 1:], (0, 1), value=pad)


def _shard_metadata(state: State):
    """The training shards' ``ShardMetadata`` (``vocagno.json``), or None when the loader reads no vocagno shards."""
    return getattr(getattr(getattr(state, "train_dataloader", None), "dataset", None), "metadata", None)


def _loader_name(state: State) -> str:
    dataset = getattr(state.train_dataloader, "dataset", None)
    return type(dataset).__name__ if dataset is not None else type(state.train_dataloader).__name__


def _no_cache(model) -> dict[str, bool]:
    """``use_cache=False`` for a Hugging Face student's forward: its KV cache (~0.2 GB for TinyLlama at 4 x 2048) is
    built by default and never read in training. Only for models whose forward takes it (Composer's
    ``HuggingFaceModel`` passes the batch's keys its model's forward names)."""
    return {"use_cache": False} if "use_cache" in getattr(model, "model_forward_args", ()) else {}


def _as_it_is(batch):
    return batch


class VocAgnoLM(Algorithm):
    """Teacher guided language modeling with a teacher of any vocabulary (Shin et al., ICML 2025).

    Args:
        teacher: the teacher: a ``vocagno.teacher.teacher.Teacher``, a Hugging Face name or folder or a shipped name
            (loaded in bfloat16), a causal LM module, or a mapping of a ``teacher:`` section's keys
            (``vocagno.teacher.config.TeacherConfig``: ``{"name_or_path": DIR, "tokenizer": ..., "dtype": ...}``, as
            an llm-foundry yaml gives it). Its tokenizer, given or its folder's when it is named, must be the one the
            shards' teacher tokens were made with.
        topk_ratio, aggregation, unmapped: as in ``vocagno.core.loss.guided_loss``.
        selection_scope: ``batch`` (the global batch), ``microbatch`` or ``sequence``: see the module's docstring.
        selection: ``topk`` (by score), or ``random``: as many mapped tokens drawn at random (a control), from a
            generator seeded with the run's seed (the Trainer's, rank zero's) and the batch index (the same draws on
            every rank, and after a resume).
        teacher_losses: ``online`` (the teacher scores each batch), or ``cached``: the batches carry the teacher's
            token losses (shards scored by ``python -m vocagno.score``) and no teacher is loaded; shards scored by
            another teacher are refused: another name than ``teacher``, or for a teacher given as a module (a
            config-built one), other weights (unless the teacher's ``check_scored_by`` is false: its name is only a
            label then).
        alignment: ``token`` (each student token to the teacher tokens over its characters), or ``chunk``: the
            paper's Table 2 baseline as reconstructed (``vocagno.core.alignment.chunk_align``: each row cut into
            ``num_chunks`` chunks by token count on each side, chunk k to chunk k; every token is mapped, so
            ``unmapped`` has nothing to act on; the reconstruction takes the chunk's mean: ``aggregation: mean``).
        student_tokenizer: for batches of student tokens alone: the student's tokenizer (name, folder or object);
            unset, the model's (``HuggingFaceModel.tokenizer``).
        teachers: several teachers, by name: each as ``teacher`` takes one (``vocagno.teacher.several``).
        combine: several teachers: a student token's reference is their ``min`` or ``mean``.

    ``teacher_timing`` (set on the instance; ``wall`` unless set): how the teacher's forward is timed for
    ``vocagno/teacher_forward_seconds``. ``wall``: the host's clock from its launch to its end, which on a GPU waits
    for the device every microbatch. ``device``: on a GPU, CUDA events around the forward, read at BATCH_END (after
    Composer has read the step's loss): no wait inside the step; the device's time on the forward, without the work
    queued before it. Off until a GPU has measured both.
    """

    teacher_timing = "wall"
    _teacher_events: tuple = ()  # with teacher_timing "device": this step's (start, end) CUDA events

    def __init__(
        self,
        teacher: Any = None,
        topk_ratio: float = TOPK_RATIO,
        aggregation: str = AGGREGATION,
        unmapped: str = UNMAPPED,
        selection_scope: str = SELECTION_SCOPE,
        selection: str = SELECTION,
        alignment: str = ALIGNMENT,
        num_chunks: int = NUM_CHUNKS,
        teacher_losses: str = "online",
        student_tokenizer: Any = None,
        teachers: Mapping[str, Any] | None = None,
        combine: str = COMBINE,
    ):
        check_options(topk_ratio, aggregation, unmapped, selection_scope, selection, combine)
        check_one_or_several(teacher, teachers)
        chosen = teachers_from(teachers) if teachers is not None else [Teacher.of(teacher)]
        if len(chosen) > 1 and alignment == "chunk":
            raise ValueError("alignment: chunk takes one teacher (the paper's Table 2 baseline), not teachers")
        if teacher_losses not in ("online", "cached"):
            raise ValueError(f"teacher_losses must be 'online' or 'cached', got {teacher_losses!r}")
        check_alignment(alignment, num_chunks)
        for each in chosen:
            each.check_options()
        self.options = dict(topk_ratio=topk_ratio, aggregation=aggregation, unmapped=unmapped, combine=combine)
        self.selection_scope = selection_scope
        self.selection = selection
        self.alignment, self.num_chunks = alignment, num_chunks
        self.cached = teacher_losses == "cached"
        self._generator: torch.Generator | None = None  # for selection="random", seeded per batch
        # The reader (the set's teacher that reads the shards' teacher side) is chosen at FIT_START.
        self.teachers = Teachers(chosen, self.cached)
        self.student_tokenizer = student_tokenizer
        self.teacher_side: TeacherSide | None = None  # made on the first batch that has no teacher tokens
        self.scorer: nn.Module | None = None
        self._labels: torch.Tensor | None = None
        self._loss: dict[str, torch.Tensor] | None = None
        self._global_counts: dict[str, torch.Tensor] = {}  # the global batch's labeled, mapped and kept tokens
        self._global_samples = 0
        self._metrics = StepMetrics()  # per stream and per teacher, logged once a step
        self._teacher_seconds = 0.0

    def teacher_source(self, state: State) -> str:
        """One line for the terminal: where this run's teacher losses come from (online: which teachers; cached: who
        scored them, as the shards' metadata names them, through ``terminal``)."""
        if not self.cached:
            if len(self.teachers.all) == 1:
                return f"teacher losses: online, {self.teachers.reader.label} scores every batch"
            return "teacher losses: online, " + ", ".join(
                f"{each.name} ({each.label})" for each in self.teachers.all) + " score every batch"
        metadata = _shard_metadata(state)
        scored = [(getattr(metadata, "scored_by", None) or {}).get("name", "?")]
        scored += [by.get("name", "?") for by in (getattr(metadata, "also_scored_by", None) or {}).values()]
        return terminal(f"teacher losses: cached in the training shards, scored by {', '.join(map(str, scored))}")

    @property
    def teacher(self) -> Teacher:
        """The teacher that reads the batch's own teacher side (of a set, ``Teachers.reader``)."""
        return self.teachers.reader

    def __repr__(self) -> str:
        def shown(each: Teacher) -> str:
            return each.model if isinstance(each.model, str) else type(each.model).__name__

        if len(self.teachers.all) > 1:
            names = {each.name: shown(each) for each in self.teachers.all}
            return f"VocAgnoLM(teachers={names!r}, " + ", ".join(f"{k}={v!r}" for k, v in self.options.items()) + ")"
        options = {**{k: v for k, v in self.options.items() if k != "combine"},
                   "selection_scope": self.selection_scope, "selection": self.selection,
                   **({"alignment": "chunk", "num_chunks": self.num_chunks} if self.alignment == "chunk" else {})}
        shown_options = ", ".join(f"{k}={v!r}" for k, v in options.items())
        return f"VocAgnoLM(teacher={shown(self.teacher)!r}, {shown_options})"

    @staticmethod
    def required_on_load() -> bool:
        return False

    def _fit_start(self, state: State) -> None:
        if self.teacher_timing not in TEACHER_TIMINGS:
            raise ValueError(f"teacher_timing must be one of {TEACHER_TIMINGS}, got {self.teacher_timing!r}")
        self._choose_teacher(state)
        self._teacher_side_in_workers(state)
        if self.cached:
            self._check_scored_by(state)
        else:
            if self.scorer is None:
                self.teacher.check_reads(_shard_metadata(state))
                self.scorer = self._place(self.teacher.scorer(), state, self.teacher.placement)
            self.teachers.build(_shard_metadata(state), lambda scorer, each: self._place(scorer, state,
                                                                                         each.placement))

    def match(self, event: Event, state: State) -> bool:
        return event in (Event.FIT_START, Event.AFTER_DATALOADER, Event.BEFORE_TRAIN_BATCH, Event.BEFORE_FORWARD,
                         Event.AFTER_FORWARD, Event.AFTER_LOSS, Event.AFTER_TRAIN_BATCH, Event.BATCH_END)

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        if event == Event.FIT_START:
            try:
                self._fit_start(state)
            except NoTokenizer as error:  # how a plain Composer recipe gives it
                raise Refused(f"{error}: give VocAgnoLM(teacher={{'name_or_path': MODEL, 'tokenizer': NAME_OR_FOLDER}}) "
                              "or a Teacher with its tokenizer, or each of teachers= its 'tokenizer' (in an llm-foundry "
                              "yaml: algorithms.vocagno.teacher.tokenizer)") from None
        elif event == Event.AFTER_DATALOADER:
            state.batch = unpack_teacher_side(state.batch)  # as loader workers send it
            if TEACHER_INPUT_IDS not in state.batch:  # a loader without workers: made here
                state.batch = WithTeacherSide(_as_it_is, self._make_teacher_side(state), _loader_name(state))(
                    state.batch)
            self.teachers.add_sides(state.batch, self._student_tokenizer(state))
            if self.alignment == "chunk":
                batch = state.batch
                ids = batch["input_ids"]
                lengths = batch["attention_mask"].sum(1) if "attention_mask" in batch else \
                    torch.full(ids.shape[:1], ids.shape[1], device=ids.device)
                batch[ALIGN_START], batch[ALIGN_END] = chunk_align(
                    lengths, batch[TEACHER_ATTENTION_MASK].sum(1), self.num_chunks, ids.shape[1])
            if self.selection == "random":  # drawn where the scores are: the training device
                if self._generator is None:  # (the batch is still on the host: Composer moves each microbatch)
                    self._generator = torch.Generator(device=state.device.tensor_to_device(torch.zeros(())).device)
                self._generator.manual_seed(state.rank_zero_seed * 1_000_003 + int(state.timestamp.batch))
            if self.selection_scope == "batch":
                self._select_over_global_batch(state)
        elif event == Event.BEFORE_TRAIN_BATCH:  # also before each retry of the batch (Composer's auto microbatching)
            self._metrics.start(state)
        elif event == Event.BEFORE_FORWARD:
            self._labels = state.batch.pop("labels")
            state.batch.update(_no_cache(state.model))
        elif event == Event.AFTER_FORWARD:
            logits = state.outputs.logits if hasattr(state.outputs, "logits") else state.outputs
            if self.selection_scope == "batch":
                share = state.batch["input_ids"].shape[0] / self._global_samples
                self._loss = teacher_guided_loss(
                    logits, self._labels, state.batch, state.batch[TEACHER_LOSS],
                    selected=state.batch[SELECTED],
                    others={name: state.batch[teacher_key(name, TEACHER_LOSS)] for name in self.teachers.other_names},
                    token_counts={k: v * share for k, v in self._global_counts.items()},
                    row_counts=self._metrics.per_stream, **self.options,
                )
            else:
                self._loss = teacher_guided_loss(logits, self._labels, state.batch, self._teacher_loss(state.batch),
                                                 others=self.teachers.losses(state.batch),
                                                 per_sequence=self.selection_scope == "sequence",
                                                 selection=self.selection, generator=self._generator,
                                                 row_counts=self._metrics.per_stream, **self.options)
            self._metrics.add(state.batch.get("stream"), self._loss)
            if hasattr(state.outputs, "logits"):
                state.outputs["loss"] = self._loss["total"]  # HuggingFaceModel.loss returns it: no second CE
            # A model computing its own loss from the labels (llm-foundry's MPT) reads them; AFTER_LOSS replaces it.
            state.batch["labels"] = self._labels
        elif event == Event.AFTER_LOSS:
            state.loss = self._loss
            self._labels = self._loss = None
        elif event == Event.AFTER_TRAIN_BATCH:  # every microbatch done, the step not yet counted: the loss's step
            self._metrics.log(state, logger, self.teachers.names)
        elif event == Event.BATCH_END:
            self._teacher_seconds += self._take_device_seconds()
            others = self.teachers.take_seconds()
            seconds = {f"vocagno/teacher_forward_seconds/{name}": value for name, value in others.items()}
            if seconds:
                seconds[f"vocagno/teacher_forward_seconds/{self.teachers.names[0]}"] = self._teacher_seconds
            logger.log_metrics({"vocagno/teacher_forward_seconds": self._teacher_seconds + sum(others.values()),
                                **seconds})
            self._teacher_seconds = 0.0

    def _choose_teacher(self, state: State) -> None:
        """Of a set, the teacher that reads the shards' teacher side (``Teachers.choose_reader``)."""
        if self.teachers.choose_reader(_shard_metadata(state)):  # another fit may keep what an earlier one built
            self.scorer = self.teacher_side = None

    def _student_tokenizer(self, state: State):
        return self.student_tokenizer or getattr(state.model, "tokenizer", None)

    def _teacher_side_in_workers(self, state: State) -> None:
        """Move the making of the teacher side into the training loader's workers (see the module's docstring)."""
        loader = state.train_dataloader
        if not isinstance(loader, DataLoader) or loader.num_workers == 0 or self.cached:
            return
        student = self._student_tokenizer(state)
        if self.teachers.others and student is not None and not isinstance(loader.collate_fn, WithOtherTeachers):
            loader.collate_fn = WithOtherTeachers(loader.collate_fn, self.teachers.make_sides(student),
                                                  _loader_name(state))
        if isinstance(loader.collate_fn, WithOtherTeachers):
            loader = loader.collate_fn  # the teacher's own side goes inside: made first, as at AFTER_DATALOADER
        if isinstance(loader.collate_fn, (TeacherGuidedCollator, WithTeacherSide)):
            return
        if student is None or self.teacher.tokenizer_source is None:
            return  # the first batch says what is missing, if it needs the tokenizers at all
        loader.collate_fn = WithTeacherSide(loader.collate_fn, self._make_teacher_side(state), _loader_name(state))

    def _make_teacher_side(self, state: State) -> TeacherSide:
        if self.teacher_side is None:
            student = self._student_tokenizer(state)
            if student is None or self.teacher.tokenizer_source is None:
                missing = "student_tokenizer (or a HuggingFaceModel with its tokenizer)" if student is None else \
                    "the teacher its tokenizer"
                raise ValueError(
                    "VocAgnoLM got a batch of student tokens alone (no teacher_input_ids): it makes the teacher's side "
                    f"from their text, which needs the tokenizers; give it {missing}, or train on shards made by "
                    "conversion/convert_dataset.py"
                )
            self.teacher_side = self.teacher.side(student)
        return self.teacher_side

    def _check_scored_by(self, state: State) -> None:
        """Cached losses must come from this run's teacher: every stream's, in a mixture (named when one is not)."""
        dataset = getattr(state.train_dataloader, "dataset", None)
        streams = getattr(dataset, "stream_metadata", None) or {"": _shard_metadata(state)}
        folders = getattr(dataset, "stream_folders", None) or {}
        for name, metadata in streams.items():
            try:
                self._check_scored_by_one(metadata, folders.get(name))
                self.teachers.check_cached(metadata)
            except ValueError as error:
                raise ValueError(f"stream {name!r}: {error}" if len(streams) > 1 else str(error)) from None

    def _check_scored_by_one(self, metadata, folder: str | None = None) -> None:
        scored_by = getattr(metadata, "scored_by", None)
        if metadata is not None and scored_by is None:
            shards = f"the training shards ({folder})" if folder else "the training shards"
            command = f"python -m vocagno.score --shards {folder or 'SHARDS'} --teacher TEACHER --out SCORED"
            if self.teachers.others:
                others = ", then ".join(f"--name {each.name}" for each in self.teachers.others)
                raise ValueError(f"teacher_losses: cached, but {shards} carry no losses of teacher "
                                 f"{self.teacher.name!r} (it reads the shards' teacher tokens): score them with each "
                                 "teacher of the set in turn, each pass on the one before's output (python -m "
                                 f"vocagno.score --shards {folder or 'SHARDS'} --config YAML --name {self.teacher.name} "
                                 f"--out SCORED, then {others}: docs/training.md) and train on the last")
            raise ValueError(f"teacher_losses: cached, but {shards} carry no teacher losses: score them first "
                             f"({command}) and train on SCORED")
        if scored_by is not None:
            self.teacher.check_scorer(scored_by, "the shards were")

    def _teacher_loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.cached:
            if TEACHER_LOSS not in batch:
                raise KeyError("teacher_losses: cached, but the batch has no teacher_loss: train on shards "
                               "scored by python -m vocagno.score")
            return batch[TEACHER_LOSS].float()
        ids, mask = batch[TEACHER_INPUT_IDS], batch[TEACHER_ATTENTION_MASK]
        if self.teacher_timing == "device" and ids.is_cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            teacher_loss = self.scorer(ids, mask)
            end.record()
            self._teacher_events = (*self._teacher_events, (start, end))
            return teacher_loss
        begin = time.perf_counter()
        teacher_loss = self.scorer(ids, mask)
        if teacher_loss.is_cuda:
            torch.cuda.synchronize()  # so that the time is the teacher's forward, not its launch
        self._teacher_seconds += time.perf_counter() - begin
        return teacher_loss

    def _take_device_seconds(self) -> float:
        """The seconds of this step's teacher forwards timed by CUDA events (``teacher_timing`` ``device``); the
        events start again."""
        events, self._teacher_events = self._teacher_events, ()
        if not events:
            return 0.0
        events[-1][1].synchronize()  # done already: Composer has read the step's loss
        return sum(start.elapsed_time(end) for start, end in events) / 1000

    @torch.no_grad()
    def _select_over_global_batch(self, state: State) -> None:
        """The scoring pass of ``selection_scope="batch"``: this rank's rows scored piece by piece (a microbatch at a
        time: the student's forward without gradients, each teacher's losses), the selection made over every rank's
        scores (``select_over_ranks``), and ``SELECTED`` and each teacher's ``TEACHER_LOSS`` put into the batch.

        Composer weights each microbatch's loss by its share of the rank's samples and averages gradients over ranks;
        dividing each microbatch's sums by the global counts times its share of the global samples makes the step's
        loss the mean over the global batch's kept tokens, however the batch is split.
        """
        batch = state.batch
        size = batch["input_ids"].shape[0]
        step = state.device_train_microbatch_size or size
        teacher_losses, scores, labeled = [], [], []
        for begin in range(0, size, step):
            piece = state.device.batch_to_device(
                {k: v[begin : begin + step] for k, v in batch.items() if isinstance(v, torch.Tensor)})
            teacher_loss, others = self._teacher_loss(piece), self.teachers.losses(piece)
            with get_precision_context(state.precision, state.precision_config):
                outputs = state.model({**{k: v for k, v in piece.items() if k != "labels"}, **_no_cache(state.model)})
            logits = outputs.logits if hasattr(outputs, "logits") else outputs
            names = list(others)
            score, _ = excess_loss(
                next_token_cross_entropy(logits, piece["labels"]), piece["labels"][:, 1:],
                [teacher_loss, *others.values()],
                [piece[key][:, 1:] for key in (ALIGN_START, *(teacher_key(n, ALIGN_START) for n in names))],
                [piece[key][:, 1:] for key in (ALIGN_END, *(teacher_key(n, ALIGN_END) for n in names))],
                self.options["aggregation"], combine=self.options["combine"],
            )
            teacher_losses.append([teacher_loss, *others.values()])
            scores.append(score)
            labeled.append(piece["labels"][:, 1:] != -100)  # the batch's own labels are still on the host
        score = torch.cat(scores)
        chosen = select_over_ranks(score, torch.cat(labeled), self.options["topk_ratio"], self.options["unmapped"],
                                   self.selection, self._generator)
        self._global_counts, self._global_samples = chosen.counts, chosen.samples
        batch[SELECTED] = chosen.selected
        for t, key in enumerate([TEACHER_LOSS, *(teacher_key(n, TEACHER_LOSS) for n in self.teachers.other_names)]):
            batch[key] = torch.cat([losses[t] for losses in teacher_losses])

    def _place(self, scorer: nn.Module, state: State, placement: str) -> nn.Module:
        if placement == "auto":
            placement = "fsdp" if state.fsdp_enabled else "replicate"
        if placement == "replicate":
            return state.device.module_to_device(scorer)
        strategy = getattr(state.fsdp_config, "sharding_strategy", "FULL_SHARD") if state.fsdp_config else "FULL_SHARD"
        return shard_teacher(scorer, str(strategy))
