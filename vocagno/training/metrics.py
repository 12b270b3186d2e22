"""Bits per byte: a language modeling metric that does not depend on the tokenizer.

The negative log-likelihood of the predicted tokens, in bits, over the UTF-8 bytes of their text, so a student,
its teacher and a plain student compare on the same bytes whatever their vocabularies.
"""

from __future__ import annotations

import math

import torch
from torchmetrics import Metric

from vocagno.core.loss import token_cross_entropy
from vocagno.data.shards import document_separator
from vocagno.data.batch import SPECIAL_TOKENS, TOKEN_BYTES

__all__ = ["BitsPerByte", "bits_per_byte"]


@torch.no_grad()
def bits_per_byte(model, tokenizer, texts: list[str], max_length: int | None = None, stride: int | None = None) -> float:
    """Total negative log-likelihood of ``texts`` in bits over their total UTF-8 bytes.

    Each text is tokenized as text (a "</s>" in it is text) and preceded by one context token, the one before a
    document at the start of a row of our shards: the tokenizer's BOS, else its document separator. So every token of
    the text is predicted and the bytes counted are exactly the text's. A text longer than ``max_length`` tokens
    (default: the model's ``max_position_embeddings``) is scored in windows: the first window scores its
    ``max_length`` tokens, every later one the next ``stride`` tokens (default half the window) with the
    ``max_length - stride`` tokens before them as context.
    """
    context_id = tokenizer.bos_token_id
    if context_id is None:
        context_id = tokenizer.convert_tokens_to_ids(document_separator(tokenizer))
    config = getattr(model, "config", None)
    max_length = max_length or getattr(config, "max_position_embeddings", None) or 2048
    stride = stride or max(max_length // 2, 1)
    if not 0 < stride < max_length:
        raise ValueError(
            "stride must be in [1, max_length): each window scores `stride` new tokens after max_length - stride "
            f"tokens of context; got stride={stride}, max_length={max_length}"
        )
    device = next(iter(model.parameters()), torch.empty(0)).device
    nats, n_bytes = 0.0, 0
    for text in texts:
        tokens = [context_id] + tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        n_bytes += len(text.encode("utf-8"))
        scored = 1  # tokens[:scored] are scored (token 0, the context token, never is)
        while scored < len(tokens):
            end = min(max_length if scored == 1 else scored + stride, len(tokens))
            begin = max(0, end - max_length)
            window = torch.tensor([tokens[begin:end]], device=device)
            logits = model(input_ids=window).logits[0]
            targets = window[0, scored - begin :]
            nats += float(token_cross_entropy(logits[scored - begin - 1 : end - begin - 1], targets).double().sum())
            scored = end
    return nats / math.log(2) / max(n_bytes, 1)


class BitsPerByte(Metric):
    """Composer metric over ``TeacherGuidedCollator`` batches (``token_bytes``, ``special_tokens``) and a causal LM's
    logits: the text tokens' negative log-likelihood over the bytes they cover, each byte once. Specials (separators)
    are not scored, so a one-document row gives what ``bits_per_byte`` gives for that document. A row's first token
    has no context: neither its loss nor its bytes count (with a tokenizer that adds a BOS, it is the BOS).

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
        token_bytes = torch.zeros_like(labels)
        token_bytes[:, :-1] = batch[TOKEN_BYTES][:, 1:].to(labels.device)  # the bytes of token i + 1
        special = torch.ones_like(labels, dtype=torch.bool)
        special[:, :-1] = batch[SPECIAL_TOKENS][:, 1:].to(labels.device)
        scored = (labels != self.ignore_index) & ~special
        self.nats += token_cross_entropy(logits, labels.masked_fill(~scored, self.ignore_index), self.ignore_index
                                         ).double().sum()
        self.bytes += token_bytes[scored].sum()

    def compute(self) -> torch.Tensor:
        return self.nats / math.log(2) / self.bytes.clamp(min=1)
