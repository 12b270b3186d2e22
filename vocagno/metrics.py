"""Bits per byte: a language modeling metric that does not depend on the tokenizer.

The negative log-likelihood of the predicted tokens, in bits, over the UTF-8 bytes of their text, so a student,
its teacher and a plain student compare on the same bytes whatever their vocabularies.
"""

from __future__ import annotations

import math

import torch
from torchmetrics import Metric

from vocagno.loss import token_cross_entropy

__all__ = ["BitsPerByte"]


class BitsPerByte(Metric):
    """Composer metric over ``TeacherGuidedCollator`` batches (``token_bytes``) and a causal LM's logits.

    ``update`` takes what Composer's ``HuggingFaceModel`` passes with ``needs_batch``: the logits per input position
    and the labels it shifted (``labels[:, i]`` is token ``i + 1``).
    """

    needs_batch = True
    full_state_update = False

    def __init__(self, ignore_index: int = -100, dist_sync_on_step: bool = False):
        super().__init__(dist_sync_on_step=dist_sync_on_step)
        self.ignore_index = ignore_index
        self.add_state("nats", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("bytes", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, batch: dict, outputs: torch.Tensor, labels: torch.Tensor) -> None:
        logits = outputs.logits if hasattr(outputs, "logits") else outputs
        predicted = labels != self.ignore_index
        token_bytes = torch.zeros_like(labels)
        token_bytes[:, :-1] = batch["token_bytes"][:, 1:].to(labels.device)  # the bytes of token i + 1
        self.nats += token_cross_entropy(logits, labels, self.ignore_index).double().sum()
        self.bytes += token_bytes[predicted].sum()

    def compute(self) -> torch.Tensor:
        return self.nats / math.log(2) / self.bytes.clamp(min=1)
