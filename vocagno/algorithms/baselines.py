"""The paper's logit-distillation baselines as Composer algorithms: ``ULD`` (any two vocabularies) and ``KLD`` (one
vocabulary), registered for yamls as ``uld`` and ``kld`` beside ``vocagno``; and ``CrossVocabKD`` (``cross_kd``), KD
from a teacher of another vocabulary whose distributions are projected onto the student's.

    algorithms: {uld: {teacher: Qwen/Qwen2.5-Math-7B-Instruct}}             # batches from TeacherGuidedCollator
    algorithms: {kld: {teacher: EleutherAI/llemma_7b}}                     # any batch of student tokens
    algorithms: {uld: {teacher_losses: cached, top_k: 32}}                 # shards scored with --top-k 32
    algorithms: {cross_kd: {teacher_losses: cached, top_k: 32}}

``teacher_losses: cached`` (``ULD`` and ``CrossVocabKD``, as ``VocAgnoLM``'s cached mode) trains from the teacher's
distributions stored in the shards by ``python -m vocagno.score --top-k K`` (its K most probable next tokens at each
teacher position and the mass outside them) and loads no teacher: shards without a distribution of this teacher, or
one of another K than ``top_k``, are refused in one line.

Like ``VocAgnoLM``: the teacher is frozen, lives in the algorithm (never in the optimizer or checkpoints), runs with no
KV cache; the student's Hugging Face loss is not computed (``labels`` leave the batch before the forward) and the
baseline's loss takes its place, its parts logged as ``loss/train/...``. The teacher is replicated on each device
(sharding it with FSDP is ``VocAgnoLM``'s alone so far). The losses: ``vocagno.core.distill``.
"""

from __future__ import annotations

from typing import Any

import torch
from composer.core import Algorithm, Event, State
from composer.loggers import Logger
from torch import nn

from vocagno.core.distill import cached_uld_loss, kld_loss, projected_kd_loss, teacher_top_k, uld_loss
from vocagno.teacher.config import TeacherConfig
from vocagno.teacher.teacher import Teacher
from vocagno.core.tokenization import as_tokenizer
from vocagno.core.loss import CHUNK_SIZE
from vocagno.data.batch import (ALIGN_END, ALIGN_START, STARTS_TOGETHER, TEACHER_ATTENTION_MASK, TEACHER_INPUT_IDS,
    TOPK_IDS, TOPK_PROBS, TOPK_REST)
from vocagno.data.shards import describe_tokenizer, distribution_of
from vocagno.shown import terminal

__all__ = ["ULD", "KLD", "CrossVocabKD"]

TEACHER_LOSSES = ("online", "cached")


def _streams(state: State) -> dict[str, tuple[Any, str | None]]:
    """The training shards' ``vocagno.json`` of each stream (one: ``""``) and where they come from."""
    dataset = getattr(state.train_dataloader, "dataset", None)
    streams = getattr(dataset, "stream_metadata", None) or {"": getattr(dataset, "metadata", None)}
    folders = getattr(dataset, "stream_folders", None) or {}
    return {name: (metadata, folders.get(name)) for name, metadata in streams.items()}


class _Distillation(Algorithm):
    """What ULD, KLD and cross-vocabulary KD share: the frozen teacher (as ``VocAgnoLM`` takes one: ``Teacher.of``; its dtype,
    trust_remote_code, tokenizer and chunk_size used), and the student's loss replaced by the baseline's. Its
    placement, kernels and compile options are ``VocAgnoLM``'s alone: one given is refused, not dropped. With
    ``teacher_losses: cached`` (ULD's and cross_kd's) the teacher is never loaded: the batches carry its cached
    distributions, of ``top_k`` when given."""

    yaml_name = ""  # its name under algorithms: in a yaml

    def __init__(self, teacher: Any, teacher_losses: str = "online", top_k: int | None = None):
        if teacher_losses not in TEACHER_LOSSES:
            raise ValueError(f"teacher_losses must be 'online' or 'cached', got {teacher_losses!r}")
        if top_k is not None and (not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1):
            raise ValueError(f"top_k must be a whole number of at least 1, got {top_k!r}")
        self.cached, self.top_k = teacher_losses == "cached", top_k
        self.teacher = Teacher.of(teacher)
        if self.teacher.placement != TeacherConfig.placement:
            raise ValueError("teacher.placement: only algorithms.vocagno shards its teacher; the others replicate it")
        for key in ("kernels", "compile_config"):
            if getattr(self.teacher, key) != getattr(TeacherConfig, key):
                raise ValueError(f"teacher.{key}: only algorithms.vocagno's teacher takes it; the others read its "
                                 "logits through PyTorch's own kernels")
        self.teacher.check_options()
        self.chunk_size = CHUNK_SIZE if self.teacher.chunk_size is None else self.teacher.chunk_size
        self.model: nn.Module | None = None
        self._labels: torch.Tensor | None = None
        self._loss: dict[str, torch.Tensor] | None = None

    @staticmethod
    def required_on_load() -> bool:
        return False

    def teacher_source(self, state: State) -> str:
        """One line: the teacher whose distributions this baseline distills, every batch, or who scored the cached
        ones."""
        if self.cached:
            metadata = next(iter(_streams(state).values()))[0]  # the first stream's
            scored_by = getattr(metadata, "scored_by", None) or {}
            return terminal(f"teacher: cached distributions ({distribution_of(metadata)}) in the training shards, "
                            f"scored by {scored_by.get('name', '?')} ({type(self).__name__})")
        return (f"teacher: online, {self.teacher.label} gives its distributions every batch "
                f"({type(self).__name__})")

    def match(self, event: Event, state: State) -> bool:
        return event in (Event.FIT_START, Event.BEFORE_FORWARD, Event.AFTER_FORWARD, Event.AFTER_LOSS)

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        if event == Event.FIT_START and self.cached:
            self._check_cached(state)
        elif event == Event.FIT_START and self.model is None:
            teacher = self.teacher.load()
            self._check_teacher(teacher, state)
            self.model = state.device.module_to_device(teacher.eval().requires_grad_(False))
        elif event == Event.BEFORE_FORWARD:
            self._labels = state.batch.pop("labels")
        elif event == Event.AFTER_FORWARD:
            logits = state.outputs.logits if hasattr(state.outputs, "logits") else state.outputs
            if self.cached:
                missing = [key for key in (TOPK_IDS, TOPK_PROBS, TOPK_REST) if key not in state.batch]
                if missing:
                    raise KeyError(f"teacher_losses: cached, but the batch has no {', '.join(missing)}: train on shards "
                                   "scored by python -m vocagno.score --top-k K")
                self._loss = self._distill_cached(logits, self._labels, state.batch)
            else:
                ids, mask = self._teacher_inputs(state.batch)
                with torch.no_grad():
                    hidden = self.model.base_model(input_ids=ids, attention_mask=mask,
                                                   use_cache=False).last_hidden_state
                self._loss = self._distill(logits, self._labels, state.batch, hidden,
                                           self.model.get_output_embeddings(), mask)
            if hasattr(state.outputs, "logits"):
                state.outputs["loss"] = self._loss["total"]  # HuggingFaceModel.loss returns it: no second CE
            state.batch["labels"] = self._labels  # a model computing its own loss reads them (llm-foundry's MPT)
        elif event == Event.AFTER_LOSS:
            state.loss = self._loss
            self._labels = self._loss = None

    def _check_teacher(self, teacher: nn.Module, state: State) -> None:
        pass

    def _check_cached(self, state: State) -> None:
        """Every stream's shards carry this teacher's distributions, of ``top_k`` when it is given; refused in one
        line naming the stream (in a mixture) and what to run otherwise."""
        streams = _streams(state)
        for stream, (metadata, folder) in streams.items():
            where = f"stream {stream!r}: " if len(streams) > 1 else ""
            shards = f"the training shards ({folder})" if folder else "the training shards"
            command = (f"python -m vocagno.score --shards {folder or 'SHARDS'} --teacher TEACHER --top-k "
                       f"{self.top_k or 'K'} --out SCORED")
            if metadata is None:
                raise ValueError(f"teacher_losses: cached needs vocagno shards scored by {command}")
            scored_by, distribution = metadata.scored_by, distribution_of(metadata)
            if distribution is None:
                what = "no teacher distributions" if scored_by is None else \
                    f"the losses of {scored_by['name']!r} but no distributions"
                raise ValueError(f"{where}teacher_losses: cached, but {shards} carry {what}: score them with "
                                 f"--top-k ({command}) and train on SCORED")
            if self.top_k is not None and distribution.top_k != self.top_k:
                raise ValueError(f"{where}teacher_losses: cached with top_k {self.top_k}, but {shards} hold "
                                 f"{distribution}: score them with --top-k {self.top_k} ({command}), or set "
                                 f"algorithms.{self.yaml_name}.top_k: {distribution.top_k}")
            try:
                self.teacher.check_scorer(scored_by, "the shards' distributions were")
                self._check_cached_shards(metadata)
            except ValueError as error:
                raise ValueError(f"{where}{error}") from None

    def _check_cached_shards(self, metadata) -> None:
        pass

    def _distill_cached(self, logits, labels, batch) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def _teacher_inputs(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def _distill(self, logits, labels, batch, hidden, head, mask) -> dict[str, torch.Tensor]:
        raise NotImplementedError


class ULD(_Distillation):
    """Universal Logit Distillation (Boizard et al.) with a teacher of any vocabulary: ``vocagno.core.distill.uld_loss``,
    the teacher reading its own tokens of the same text (``teacher_input_ids`` from ``TeacherGuidedCollator``).

    Args: ``teacher`` as ``VocAgnoLM``'s; ``weight``,
    ``student_temperature``, ``teacher_temperature``, ``skip_student_eos``: ``uld_loss``'s (the reference code's
    defaults: 1.5, 1, 1, True); ``pairing``: ``position`` (ULD's) or ``alignment`` (each student position with the
    teacher position predicting the first teacher token aligned to the student's next token; not in the references).
    ``teacher_losses``: ``online`` (the teacher runs every batch) or ``cached``: from the distributions the shards
    carry (``vocagno.core.distill.cached_uld_loss``: the teacher's sorted top-k and the rest; within ``min(S, r)``
    a pair of live ULD, and equal to it with k the teacher's vocabulary), no teacher loaded, at teacher temperature 1
    (the cache holds its distributions at 1). ``top_k``: the k the cached distributions must have (unset: theirs;
    online, refused: live ULD compares the whole distributions).
    """

    yaml_name = "uld"

    def __init__(self, teacher: Any, weight: float = 1.5, student_temperature: float = 1.0,
                 teacher_temperature: float = 1.0, skip_student_eos: bool = True, pairing: str = "position",
                 teacher_losses: str = "online", top_k: int | None = None):
        super().__init__(teacher, teacher_losses, top_k)
        if pairing not in ("position", "alignment"):
            raise ValueError(f"pairing must be 'position' (ULD's) or 'alignment' (through vocagno's), got {pairing!r}")
        if not self.cached and top_k is not None:
            raise ValueError(f"top_k {top_k} with teacher_losses: online: online ULD compares the teacher's whole "
                             "distribution; top_k is the k of cached ones (teacher_losses: cached)")
        if self.cached and teacher_temperature != 1.0:
            raise ValueError(f"teacher_temperature {teacher_temperature} with teacher_losses: cached: the shards hold "
                             "the teacher's distributions at temperature 1; train online for another")
        self.pairing = pairing
        self.options = dict(weight=weight, student_temperature=student_temperature,
                            teacher_temperature=teacher_temperature, skip_student_eos=skip_student_eos)

    def _teacher_inputs(self, batch):
        if TEACHER_INPUT_IDS not in batch:
            raise KeyError("ULD needs the teacher's own tokens of the text: batches from "
                           "vocagno.data.dataset.TeacherGuidedCollator (teacher_input_ids, teacher_attention_mask)")
        return batch[TEACHER_INPUT_IDS], batch[TEACHER_ATTENTION_MASK]

    def _aligned(self, batch) -> torch.Tensor | None:
        if self.pairing != "alignment":
            return None
        # Student position i predicts token i + 1: pair it with the teacher position predicting that token's first
        # teacher token (-1: unmapped).
        start, end = batch[ALIGN_START][:, 1:], batch[ALIGN_END][:, 1:]
        return torch.where(end > start, start - 1, -1)

    def _distill(self, logits, labels, batch, hidden, head, mask):
        return uld_loss(logits, labels, hidden, head, mask, aligned_teacher_positions=self._aligned(batch),
                        chunk_size=self.chunk_size, **self.options)

    def _distill_cached(self, logits, labels, batch):
        options = {k: v for k, v in self.options.items() if k != "teacher_temperature"}
        return cached_uld_loss(logits, labels, batch[TOPK_PROBS], batch[TOPK_REST], batch[TEACHER_ATTENTION_MASK],
                               aligned_teacher_positions=self._aligned(batch), chunk_size=self.chunk_size, **options)


class KLD(_Distillation):
    """Same-vocabulary logit distillation (MiniPLM's recipe): ``vocagno.core.distill.kld_loss``, the teacher reading the
    student's token ids. A teacher whose vocabulary is not the student's (its first ids the student's ids, with the
    same pieces) is refused, naming both.

    Args: ``teacher`` as ``VocAgnoLM``'s; ``kd_ratio`` (0.5); ``student_tokenizer`` (a name, folder or object;
    unset, the model's) and the teacher's tokenizer (its own, or its name's) for the vocabulary check.
    """

    yaml_name = "kld"

    def __init__(self, teacher: Any, kd_ratio: float = 0.5, student_tokenizer: Any = None):
        super().__init__(teacher)
        if not 0.0 <= kd_ratio <= 1.0:
            raise ValueError(f"kd_ratio must be in [0, 1], got {kd_ratio}")
        self.kd_ratio = kd_ratio
        self.student_tokenizer = student_tokenizer
        self.teacher_tokenizer = self.teacher.tokenizer_source

    def _check_teacher(self, teacher, state):
        student = self.student_tokenizer or getattr(state.model, "tokenizer", None)
        if student is None or self.teacher_tokenizer is None:
            raise ValueError("KLD checks that the teacher shares the student's vocabulary: give it student_tokenizer "
                             "(or a HuggingFaceModel with its tokenizer) and the teacher its tokenizer")
        student, teacher_tok = as_tokenizer(student), as_tokenizer(self.teacher_tokenizer)
        student_vocab = student.get_vocab()
        teacher_pieces = {i: piece for piece, i in teacher_tok.get_vocab().items()}
        different = [piece for piece, i in student_vocab.items() if teacher_pieces.get(i) != piece]
        if different:
            raise ValueError(
                f"KLD needs one vocabulary: the student's tokenizer {student.name_or_path!r} and the teacher's "
                f"{teacher_tok.name_or_path!r} differ at {len(different)} of the student's {len(student_vocab)} ids "
                f"(e.g. {different[0]!r}); use vocagno or uld for a teacher of another vocabulary"
            )

    def _teacher_inputs(self, batch):
        ids = batch["input_ids"]
        return ids, batch.get("attention_mask", torch.ones_like(ids))

    def _distill(self, logits, labels, batch, hidden, head, mask):
        return kld_loss(logits, labels, hidden, head, kd_ratio=self.kd_ratio, chunk_size=self.chunk_size)


class CrossVocabKD(_Distillation):
    """Knowledge distillation from a teacher of another vocabulary, its distributions projected onto the student's
    (``vocagno.core.distill.projected_kd_loss``): ``(1 - kd_ratio) x CE + kd_ratio x soft CE``.

    At each student position whose next token starts where a teacher token starts (the two tokenizers cut the text
    there alike: ``STARTS_TOGETHER`` of the token's first aligned teacher token), the teacher's distribution at the
    position predicting that teacher token is moved onto the student's vocabulary token by token, each teacher token
    to the student token of the same text (``vocagno.teacher.projection``); the mass it moves nowhere (unmatched
    tokens, and in the cache the mass outside the top k) is one bucket, the student's tokens the projection gave
    nothing. Logged with the loss: ``coverage`` (the share of labeled student positions with a teacher distribution)
    and ``mapped_mass`` (the teacher mass moved onto a student token, on average at a covered position).

    Args: ``teacher`` as ``VocAgnoLM``'s, its tokenizer the one the shards' teacher tokens were made with;
    ``kd_ratio`` (0.5); ``teacher_losses``: ``cached`` (the shards' distributions, scored with ``--top-k``; no teacher
    loaded) or ``online`` (the teacher runs every batch and its distributions are truncated as the scoring pass
    truncates them, to ``top_k``, or kept whole when unset); ``top_k``: the k the cached distributions must have
    (unset: theirs); ``student_tokenizer``: the student's tokenizer (unset, the model's).
    """

    yaml_name = "cross_kd"

    def __init__(self, teacher: Any, kd_ratio: float = 0.5, teacher_losses: str = "online", top_k: int | None = None,
                 student_tokenizer: Any = None):
        super().__init__(teacher, teacher_losses, top_k)
        if not 0.0 <= kd_ratio <= 1.0:
            raise ValueError(f"kd_ratio must be in [0, 1], got {kd_ratio}")
        self.kd_ratio = kd_ratio
        self.student_tokenizer = student_tokenizer
        self.vocabulary = None  # the projection, made at FIT_START from both tokenizers

    def _projection(self, state: State) -> None:
        from vocagno.teacher.projection import vocabulary_map

        student = self.student_tokenizer or getattr(state.model, "tokenizer", None)
        if student is None or self.teacher.tokenizer_source is None:
            raise ValueError("cross_kd projects the teacher's vocabulary onto the student's: give it student_tokenizer "
                             "(or a HuggingFaceModel with its tokenizer) and the teacher its tokenizer")
        if self.vocabulary is None:
            self.vocabulary = vocabulary_map(self.teacher.loaded_tokenizer(), as_tokenizer(student))
            print(terminal(f"cross_kd: {self.vocabulary}"), flush=True)

    def _check_teacher(self, teacher, state):
        self._projection(state)

    def _check_cached_shards(self, metadata) -> None:
        # The cached ids are of the shards' teacher vocabulary: the projection must be made from that one.
        metadata.check_tokenizers(teacher=describe_tokenizer(self.teacher.loaded_tokenizer(), "teacher"))

    def _check_cached(self, state: State) -> None:
        super()._check_cached(state)
        self._projection(state)

    def _teacher_inputs(self, batch):
        if TEACHER_INPUT_IDS not in batch:
            raise KeyError("cross_kd needs the teacher's own tokens of the text: batches from "
                           "vocagno.data.dataset.TeacherGuidedCollator (teacher_input_ids, teacher_attention_mask)")
        return batch[TEACHER_INPUT_IDS], batch[TEACHER_ATTENTION_MASK]

    def _teacher_positions(self, batch) -> torch.Tensor:
        """For student position i, the teacher position predicting the teacher token that starts where token i + 1
        starts, or -1."""
        if STARTS_TOGETHER not in batch:
            raise KeyError("cross_kd needs where the two tokenizations cut the text alike (starts_together): batches "
                           "from vocagno.data.dataset.TeacherGuidedCollator")
        start, end = batch[ALIGN_START][:, 1:], batch[ALIGN_END][:, 1:]
        covered = (end > start) & batch[STARTS_TOGETHER][:, 1:] & (start >= 1)
        return torch.where(covered, start - 1, -1)

    def _kd(self, logits, labels, batch, ids, probs, rest):
        student_ids = self.vocabulary.student_ids.to(logits.device)
        return projected_kd_loss(logits, labels, ids, probs, rest, self._teacher_positions(batch), student_ids,
                                 kd_ratio=self.kd_ratio, chunk_size=self.chunk_size)

    def _distill(self, logits, labels, batch, hidden, head, mask):
        top_k = self.top_k or head.weight.shape[0]
        ids, probs, rest = teacher_top_k(hidden, head, mask, top_k, self.chunk_size)
        return self._kd(logits, labels, batch, ids, probs, rest)

    def _distill_cached(self, logits, labels, batch):
        return self._kd(logits, labels, batch, batch[TOPK_IDS], batch[TOPK_PROBS], batch[TOPK_REST])
