"""The frozen teacher, framework-free: loaded by name, folder or shipped name, scoring its own tokens
(``TeacherScorer``), sharded with PyTorch FSDP over the ranks, fingerprinted, and checked against the shards it is to
read.

Training (``vocagno.algorithms.vocagno_lm``, ``vocagno.algorithms.baselines``), the scoring pass (``vocagno.score``) and the selection report
(``vocagno.selection``) share it; only the first imports Composer.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
from torch import nn

from vocagno.core.fsdp import decoder_layer_classes
from vocagno.core.kernels import (
    DEFAULT_KERNELS, check_chunk_mem_const, check_chunk_size, check_on_gpu, compile_layers, fused_token_loss, use_kernels,
)
from vocagno.core.loss import CHUNK_SIZE, teacher_token_loss
from vocagno.data.shards import describe_tokenizer
from vocagno.teacher.config import is_dtype
from vocagno.core.tokenization import resolve_shipped
from vocagno.doors.untrusted import from_pretrained

__all__ = ["TeacherScorer", "load_teacher", "weights_fingerprint", "check_teacher_options", "shard_teacher",
           "check_teacher_reads"]


class TeacherScorer(nn.Module):
    """A frozen Hugging Face causal LM that returns the loss of each of its tokens: ``[B, M]``, NaN where undefined.
    ``chunk_size``: teacher tokens per chunk of its LM head (None: ``CHUNK_SIZE``; Liger's kernels choose their own,
    bounded by ``chunk_mem_const``: ``vocagno.core.kernels.fused_token_loss``)."""

    def __init__(self, model: nn.Module, chunk_size: int | None = None, kernels: str = DEFAULT_KERNELS,
                 compile_config: dict | None = None, chunk_mem_const: int | None = None):
        super().__init__()
        check_chunk_size(kernels, chunk_size)
        check_chunk_mem_const(kernels, chunk_mem_const, "teacher chunk_mem_const")
        self.chunk_mem_const = chunk_mem_const
        self.model = use_kernels(model.eval().requires_grad_(False), kernels, "teacher kernels")
        self.chunk_size = CHUNK_SIZE if chunk_size is None else chunk_size  # None: PyTorch's kernels' default
        self.kernels, self.compile_config = kernels, compile_config
        compile_layers(self.model, compile_config, decoder_layer_classes(self.model), "teacher compile_config")

    def train(self, mode: bool = True) -> "TeacherScorer":
        return super().train(False)  # always in eval mode, whatever the trainer asks of modules

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, top_k: int | None = None):
        """The loss of each token ``[B, M]``; with ``top_k``, also its next-token distribution at each position,
        truncated to its ``top_k`` most probable tokens (``vocagno.core.distill.teacher_top_k``: ids, probabilities,
        the rest), from the same forward: ``(losses, ids, probs, rest)``."""
        check_on_gpu(self.kernels, input_ids.device, "teacher kernels")
        # The base model's hidden states and the LM head in chunks: the full logits are never materialized. No KV
        # cache: nothing is generated, and a 7B teacher's cache is ~5 GB at 4 x 2560 tokens.
        hidden = self.model.base_model(
            input_ids=input_ids, attention_mask=attention_mask, use_cache=False
        ).last_hidden_state
        head = self.model.get_output_embeddings()
        fused = (lambda flat, targets: fused_token_loss(flat, head, targets, self.chunk_mem_const)) \
            if self.kernels == "liger" else None
        losses = teacher_token_loss(hidden, head, input_ids, attention_mask, chunk_size=self.chunk_size,
                                    linear_cross_entropy=fused)
        if top_k is None:
            return losses
        from vocagno.core.distill import teacher_top_k

        return (losses, *teacher_top_k(hidden, head, attention_mask, top_k, self.chunk_size))


def load_teacher(name_or_path: str, dtype: str = "bfloat16", trust_remote_code: bool = False) -> nn.Module:
    """A pretrained causal LM by Hugging Face name, local folder or shipped name (tiny-math-teacher), in ``dtype``."""
    from transformers import AutoModelForCausalLM

    return from_pretrained(AutoModelForCausalLM, resolve_shipped(name_or_path), trust_remote_code=trust_remote_code,
                           torch_dtype=getattr(torch, dtype))


def weights_fingerprint(model: nn.Module) -> str:
    """16 hex digits from every parameter's name, shape and sum: which weights scored shards, cheap on a GPU."""
    digest = hashlib.sha256()
    for name, parameter in model.named_parameters():
        digest.update(f"{name}{tuple(parameter.shape)}{float(parameter.double().sum()):.10e}".encode())
    return digest.hexdigest()[:16]


def check_teacher_options(teacher_dtype: str, trust_remote_code: Any) -> None:
    """Refuse teacher options every teacher algorithm takes, naming the option, before training starts."""
    if not isinstance(trust_remote_code, bool):  # the string "false" is truthy: it would run a folder's code
        raise ValueError(f"trust_remote_code must be True or False, got {trust_remote_code!r}")
    if not is_dtype(teacher_dtype):
        raise ValueError(f"teacher_dtype must name a torch dtype, got {teacher_dtype!r}")


def shard_teacher(scorer: TeacherScorer, sharding_strategy: str = "FULL_SHARD") -> nn.Module:
    """The teacher sharded with PyTorch FSDP over the default process group, one unit per decoder layer: on this rank's
    GPU, or on the CPU where there is none (gloo; FSDP refuses ``device_id=None`` there). FSDP moves each shard to the
    device itself: no device ever holds the whole teacher."""
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    layer_classes = set(decoder_layer_classes(scorer.model))
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    return FullyShardedDataParallel(
        scorer,
        auto_wrap_policy=ModuleWrapPolicy(layer_classes) if layer_classes else None,
        sharding_strategy=ShardingStrategy[sharding_strategy.upper()],
        device_id=device,
        use_orig_params=True,
        limit_all_gathers=True,
    )


def check_teacher_reads(teacher: nn.Module, metadata, teacher_tokenizer: Any = None) -> None:
    """Refuse a teacher that can't read the shards' teacher tokens (``metadata``: their ``ShardMetadata``): another
    tokenizer (when ``teacher_tokenizer`` is given), too few positions for a row, or an embedding without a row for
    each token (it may have more: Qwen2.5 pads 151,665 tokens to 152,064 rows)."""
    positions = getattr(getattr(teacher, "config", None), "max_position_embeddings", None)
    if positions is not None and positions < metadata.seq_len:  # teacher rows hold about as many tokens, or more
        raise ValueError(
            f"the shards' samples hold {metadata.seq_len} student tokens (and about as many teacher tokens or "
            f"more), but the teacher has max_position_embeddings={positions}: it can't read them"
        )
    rows = teacher.get_input_embeddings().num_embeddings
    if rows < metadata.teacher.vocab_size:
        raise ValueError(
            f"the teacher's embedding has {rows} rows, but the shards' teacher tokenizer "
            f"{metadata.teacher.name!r} has {metadata.teacher.vocab_size} tokens: this teacher can't read them"
        )
    if teacher_tokenizer is not None:
        metadata.check_tokenizers(teacher=describe_tokenizer(teacher_tokenizer, "teacher"))
