"""The paper's logit-distillation baselines as Composer algorithms: ``ULD`` (any two vocabularies) and ``KLD`` (one
vocabulary), registered for yamls as ``uld`` and ``kld`` beside ``vocagno``.

    algorithms: {uld: {teacher: Qwen/Qwen2.5-Math-7B-Instruct}}             # batches from TeacherGuidedCollator
    algorithms: {kld: {teacher: EleutherAI/llemma_7b}}                     # any batch of student tokens

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

from vocagno.core.distill import kld_loss, uld_loss
from vocagno.teacher.config import TeacherConfig
from vocagno.teacher.teacher import Teacher
from vocagno.core.tokenization import as_tokenizer
from vocagno.core.loss import CHUNK_SIZE
from vocagno.data.batch import ALIGN_END, ALIGN_START, TEACHER_ATTENTION_MASK, TEACHER_INPUT_IDS

__all__ = ["ULD", "KLD"]


class _Distillation(Algorithm):
    """What ULD and KLD share: the frozen teacher (as ``VocAgnoLM`` takes one: ``Teacher.of``; its dtype,
    trust_remote_code, tokenizer and chunk_size used), and the student's loss replaced by the baseline's. Its
    placement, kernels and compile options are ``VocAgnoLM``'s alone: one given is refused, not dropped."""

    def __init__(self, teacher: Any):
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
        """One line: the teacher whose distributions this baseline distills, every batch."""
        return (f"teacher: online, {self.teacher.label} gives its distributions every batch "
                f"({type(self).__name__})")

    def match(self, event: Event, state: State) -> bool:
        return event in (Event.FIT_START, Event.BEFORE_FORWARD, Event.AFTER_FORWARD, Event.AFTER_LOSS)

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        if event == Event.FIT_START and self.model is None:
            teacher = self.teacher.load()
            self._check_teacher(teacher, state)
            self.model = state.device.module_to_device(teacher.eval().requires_grad_(False))
        elif event == Event.BEFORE_FORWARD:
            self._labels = state.batch.pop("labels")
        elif event == Event.AFTER_FORWARD:
            logits = state.outputs.logits if hasattr(state.outputs, "logits") else state.outputs
            ids, mask = self._teacher_inputs(state.batch)
            with torch.no_grad():
                hidden = self.model.base_model(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
            self._loss = self._distill(logits, self._labels, state.batch, hidden, self.model.get_output_embeddings(),
                                       mask)
            if hasattr(state.outputs, "logits"):
                state.outputs["loss"] = self._loss["total"]  # HuggingFaceModel.loss returns it: no second CE
            state.batch["labels"] = self._labels  # a model computing its own loss reads them (llm-foundry's MPT)
        elif event == Event.AFTER_LOSS:
            state.loss = self._loss
            self._labels = self._loss = None

    def _check_teacher(self, teacher: nn.Module, state: State) -> None:
        pass

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
    """

    def __init__(self, teacher: Any, weight: float = 1.5, student_temperature: float = 1.0,
                 teacher_temperature: float = 1.0, skip_student_eos: bool = True, pairing: str = "position"):
        super().__init__(teacher)
        if pairing not in ("position", "alignment"):
            raise ValueError(f"pairing must be 'position' (ULD's) or 'alignment' (through vocagno's), got {pairing!r}")
        self.pairing = pairing
        self.options = dict(weight=weight, student_temperature=student_temperature,
                            teacher_temperature=teacher_temperature, skip_student_eos=skip_student_eos)

    def _teacher_inputs(self, batch):
        if TEACHER_INPUT_IDS not in batch:
            raise KeyError("ULD needs the teacher's own tokens of the text: batches from "
                           "vocagno.data.dataset.TeacherGuidedCollator (teacher_input_ids, teacher_attention_mask)")
        return batch[TEACHER_INPUT_IDS], batch[TEACHER_ATTENTION_MASK]

    def _distill(self, logits, labels, batch, hidden, head, mask):
        aligned = None
        if self.pairing == "alignment":  # student position i predicts token i + 1: pair it with the teacher
            start, end = batch[ALIGN_START][:, 1:], batch[ALIGN_END][:, 1:]  # the position predicting
            aligned = torch.where(end > start, start - 1, -1)  # that token's first teacher token (-1: unmapped)
        return uld_loss(logits, labels, hidden, head, mask, aligned_teacher_positions=aligned,
                        chunk_size=self.chunk_size, **self.options)


class KLD(_Distillation):
    """Same-vocabulary logit distillation (MiniPLM's recipe): ``vocagno.core.distill.kld_loss``, the teacher reading the
    student's token ids. A teacher whose vocabulary is not the student's (its first ids the student's ids, with the
    same pieces) is refused, naming both.

    Args: ``teacher`` as ``VocAgnoLM``'s; ``kd_ratio`` (0.5); ``student_tokenizer`` (a name, folder or object;
    unset, the model's) and the teacher's tokenizer (its own, or its name's) for the vocabulary check.
    """

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
