"""FSDP units per decoder layer for Hugging Face causal LMs, as llm-foundry's ``prepare_hf_model_for_fsdp`` does.

Composer 0.32 wraps a ``HuggingFaceModel``'s inner model as one FSDP unit unless the model says which submodules to
wrap (``fsdp_wrap_fn``) and checkpoint (``activation_checkpointing_fn``): one unit would gather every parameter at
once, and ``activation_checkpointing: true`` would do nothing. The decoder layers are the classes a model names in
``_no_split_modules`` (``LlamaDecoderLayer``, ``Qwen2DecoderLayer``, ...), so this works for any HF causal LM.
"""

from __future__ import annotations

from torch import nn

__all__ = ["decoder_layer_classes", "wrap_per_decoder_layer"]


def decoder_layer_classes(model: nn.Module) -> tuple[type, ...]:
    """The classes of ``model``'s submodules that it names in ``_no_split_modules``: its decoder layers."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    return tuple({type(m) for m in model.modules() if type(m).__name__ in names})


def wrap_per_decoder_layer(model: nn.Module) -> nn.Module:
    """Mark ``model`` so that Composer's FSDP makes each decoder layer a unit (the rest, embeddings and head, stays
    in the root unit) and checkpoints activations per decoder layer when ``activation_checkpointing`` is on."""
    layers = decoder_layer_classes(model)
    if not layers:
        raise ValueError(f"{type(model).__name__} names no decoder layer class in _no_split_modules: FSDP can't "
                         "wrap it per layer")
    model.fsdp_wrap_fn = lambda module: isinstance(module, layers)
    model.activation_checkpointing_fn = lambda module: isinstance(module, layers)
    return model
