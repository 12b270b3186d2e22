"""Which kernels a model runs, and compiled or not. Kernels: PyTorch's own (``torch``, the default) or Liger-Kernel's
fused Triton kernels (``liger``, a CUDA GPU): RMSNorm and the SwiGLU MLP of every decoder layer, and the teacher's
per-token losses as one fused linear cross-entropy that never holds its whole vocabulary's logits. Compiled:
``torch.compile`` over each decoder layer (the teacher's; Composer compiles the student's forward).

Liger's own patchers (``liger_kernel.transformers.monkey_patch``) need transformers 5 and patch classes process-wide;
vocagno's transformers is 4.5x, so the kernels are bound here to the one model's own modules, the same parameters
under the same names (checkpoints don't change). Rotary embeddings stay PyTorch's: Hugging Face looks them up as a
module-wide function, and replacing it would change every model of that type in the process.
"""

from __future__ import annotations

import types
from importlib import metadata

import torch
from torch import nn

from vocagno.errors import Refused

__all__ = ["KERNELS", "DEFAULT_KERNELS", "LIGER_VERSION", "check_kernels", "use_kernels", "fused_token_loss",
           "liger_chunk_tokens", "check_chunk_mem_const", "check_chunk_size", "check_on_gpu", "check_speed",
           "check_compile_config", "compile_layers"]

KERNELS = ("torch", "liger")
DEFAULT_KERNELS = "torch"  # PyTorch's own, as Hugging Face writes the model
# The version the gpu tests check, per-token losses and gradients both: liger-kernel's fused linear cross-entropy
# returned wrong gradients with reduction="none" until its fix of 2026-07 (linkedin/Liger-Kernel#1298).
LIGER_VERSION = "0.8.5"


def check_kernels(kernels: str, where: str = "kernels") -> None:
    """Refuse, in one line, kernels that are unknown or can't run here: Liger's need a CUDA GPU and liger-kernel
    ``LIGER_VERSION`` (``pip install -e '.[kernels]'``)."""
    if kernels not in KERNELS:
        raise Refused(f"{where} must be one of {', '.join(KERNELS)}, got {kernels!r}")
    if kernels == DEFAULT_KERNELS:
        return
    if not torch.cuda.is_available():
        raise Refused(f"{where}: liger runs Triton kernels on a CUDA GPU, and this machine has none: use torch")
    try:
        found = metadata.version("liger-kernel")
    except metadata.PackageNotFoundError:
        raise Refused(f"{where}: liger needs liger-kernel {LIGER_VERSION}: pip install -e '.[kernels]'") from None
    if found != LIGER_VERSION:
        raise Refused(f"{where}: liger is tested with liger-kernel {LIGER_VERSION}, found {found}: "
                      "pip install -e '.[kernels]'")


def check_chunk_size(kernels: str, chunk_size, where: str | None = "teacher",
                     options: tuple[str, str] = ("chunk_size", "kernels: liger")) -> None:
    """Refuse a chunk size given (not None) with Liger's kernels, which choose their own chunks of the teacher's LM
    head (256 tokens for Qwen2.5-7B's 8,192 x 152K): given and not used, it would be a setting silently dropped.
    ``where`` names the section (None: none), ``options`` the two settings as the user gave them."""
    if kernels == "liger" and chunk_size is not None:
        chunk, liger = options
        raise Refused(f"{f'{where}: ' if where else ''}{chunk} is PyTorch's kernels' own; with {liger}, Liger's fused "
                      f"linear cross-entropy chooses its chunks: leave {chunk} out")


def check_speed(kernels: str, compile_config, chunk_size, where: str, chunk_mem_const=None) -> None:
    """A teacher section's speed options (``kernels``, ``compile_config``, a ``chunk_size`` or ``chunk_mem_const`` given
    or None), refused in one line before anything loads: ``where`` names the section. What the settings say comes
    before what the machine can do."""
    check_chunk_size(kernels, chunk_size, where)
    check_chunk_mem_const(kernels, chunk_mem_const, f"{where}.chunk_mem_const")
    check_compile_config(compile_config, f"{where}.compile_config")
    check_kernels(kernels, f"{where}.kernels")


def use_kernels(model: nn.Module, kernels: str, where: str = "kernels") -> nn.Module:
    """``model`` (a Hugging Face decoder: Llama, Mistral, Qwen2 and their kind) running ``kernels``, in place. Every
    decoder layer must have the modules a kernel replaces (two RMSNorms, a SwiGLU MLP): a model of another shape is
    refused, not half converted."""
    check_kernels(kernels, where)
    if kernels == DEFAULT_KERNELS:
        return model
    base = model.base_model
    layers = getattr(base, "layers", None)
    act = getattr(model.config, "hidden_act", None)
    if layers is None or act not in ("silu", "swish") or not _is_rms_norm(getattr(base, "norm", None)):
        raise Refused(f"{where}: liger replaces a Llama-like decoder's RMSNorm and SwiGLU MLP; "
                      f"{type(model).__name__} (hidden_act {act!r}) is not one: use torch")
    for number, layer in enumerate(layers):
        norms = [getattr(layer, name, None) for name in ("input_layernorm", "post_attention_layernorm")]
        mlp = getattr(layer, "mlp", None)
        if not all(map(_is_rms_norm, norms)) or not all(hasattr(mlp, name) for name in ("gate_proj", "up_proj",
                                                                                         "down_proj")):
            raise Refused(f"{where}: decoder layer {number} of {type(model).__name__} has no RMSNorm pair and "
                          "SwiGLU MLP for liger to replace: use torch")
    from liger_kernel.ops import LigerRMSNormFunction, LigerSiLUMulFunction

    def rms_norm(self, hidden_states):
        return LigerRMSNormFunction.apply(hidden_states, self.weight, self.variance_epsilon, 0.0, "llama", False, None)

    def swiglu(self, x):
        return self.down_proj(LigerSiLUMulFunction.apply(self.gate_proj(x), self.up_proj(x)))

    for module in [base.norm, *(norm for layer in layers for norm in (layer.input_layernorm,
                                                                       layer.post_attention_layernorm))]:
        module.forward = types.MethodType(rms_norm, module)
    for layer in layers:
        layer.mlp.forward = types.MethodType(swiglu, layer.mlp)
    return model


def _is_rms_norm(module) -> bool:
    return isinstance(module, nn.Module) and hasattr(module, "variance_epsilon") and \
        isinstance(getattr(module, "weight", None), nn.Parameter) and getattr(module, "bias", None) is None


def check_on_gpu(kernels: str, device, where: str = "kernels") -> None:
    """Refuse Liger's kernels on a device that is not a CUDA GPU (``--device cpu`` on a machine that has one)."""
    if kernels == "liger" and torch.device(device).type != "cuda":
        raise Refused(f"{where}: liger runs Triton kernels on a CUDA GPU, not on {device}: use torch, or a GPU")


def fused_token_loss(hidden: torch.Tensor, head: nn.Linear, targets: torch.Tensor,
                     chunk_mem_const: int | None = None) -> torch.Tensor:
    """Per-token cross-entropy ``[T]`` (fp32; 0 where ``targets == -100``) of the logits ``head(hidden)``
    (``hidden`` ``[T, H]``, ``head`` an LM head), by Liger's fused linear cross-entropy: the logits exist a chunk of
    tokens at a time, and its gradients are per token (``reduction="none"``). ``chunk_mem_const``: the bound on a
    chunk's logits in multiples of the hidden states' size, which sets the chunk's tokens (``liger_chunk_tokens``);
    None: Liger's default (1)."""
    if chunk_mem_const is None:
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

        loss = LigerFusedLinearCrossEntropyLoss(reduction="none", ignore_index=-100)
        return loss(head.weight, hidden.contiguous(), targets.contiguous(), head.bias).float()
    check_chunk_mem_const("liger", chunk_mem_const)
    from liger_kernel.ops import LigerFusedLinearCrossEntropyFunction

    # Its module takes no chunk_mem_const: the function does, after its other arguments (liger-kernel 0.8.5's order:
    # bias, ce_weight, ignore_index, lse_square_scale, label_smoothing, reduction, softcap, return_z_loss,
    # accum_dtype, use_token_scaling, return_token_accuracy, return_predicted_tokens, ce_impl, ce_mode).
    losses = LigerFusedLinearCrossEntropyFunction.apply(
        hidden.contiguous(), head.weight, targets.contiguous(), head.bias, None, -100, 0.0, 0.0, "none", None, False,
        None, False, False, False, None, None, chunk_mem_const)
    return losses[0].float()


def liger_chunk_tokens(tokens: int, vocab: int, hidden: int, chunk_mem_const: int = 1) -> int:
    """How many of ``tokens`` rows Liger's fused linear cross-entropy (``LIGER_VERSION``) takes per chunk of its LM
    head: a chunk's logits ``[chunk, vocab]`` bounded to about ``chunk_mem_const`` x ``[tokens, hidden]``, the
    chunk's tokens rounded up to a power of two, at most ``tokens``. Qwen2.5-7B (152,064 x 3,584) scoring 8 x 1,024
    tokens: 256 a chunk at 1, 2,048 at 8."""
    check_chunk_mem_const("liger", chunk_mem_const)
    parts = -(-vocab // (chunk_mem_const * hidden))
    return min(1 << (-(-tokens // parts) - 1).bit_length(), tokens)


def check_chunk_mem_const(kernels: str, chunk_mem_const, where: str = "chunk_mem_const") -> None:
    """Refuse a ``chunk_mem_const`` that is not a positive integer (None: Liger's default), or one given with
    PyTorch's kernels, which chunk by ``chunk_size`` instead: given and not used, it would be a setting silently
    dropped."""
    if chunk_mem_const is None:
        return
    if isinstance(chunk_mem_const, bool) or not isinstance(chunk_mem_const, int) or chunk_mem_const < 1:
        raise Refused(f"{where} must be a positive integer (Liger's chunk budget), got {chunk_mem_const!r}")
    if kernels != "liger":
        raise Refused(f"{where} is Liger's fused cross-entropy's; with kernels: {kernels}, chunk_size sets the "
                      "chunks: leave it out")


COMPILE_OPTIONS = ("fullgraph", "dynamic", "backend", "mode", "options", "disable")  # torch.compile's keywords
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def check_compile_config(compile_config, where: str = "compile_config") -> None:
    """Refuse, in one line, what torch.compile would not take as its options (None: not compiled): an unknown key, a
    value of the wrong kind (the string "false" is no boolean), an unknown backend, mode or inductor option, a mode
    and options together. Before anything loads, not in the first step."""
    if compile_config is None:
        return
    if not isinstance(compile_config, dict):
        raise Refused(f"{where}: give torch.compile's options as a mapping ({{}} for its defaults), "
                      f"got {compile_config!r}")
    for key, value in compile_config.items():
        if key not in COMPILE_OPTIONS:
            raise Refused(f"{where}: torch.compile has no option {key!r}; it takes {', '.join(COMPILE_OPTIONS)}")
        if key in ("fullgraph", "disable") and not isinstance(value, bool) or \
                key == "dynamic" and value is not None and not isinstance(value, bool):
            raise Refused(f"{where}: {key} must be true or false, got {value!r}")
    backends = torch.compiler.list_backends(exclude_tags=())
    if compile_config.get("backend", "inductor") not in backends:
        raise Refused(f"{where}: backend must be one of {', '.join(backends)}, got {compile_config['backend']!r}")
    if compile_config.get("mode") is not None and compile_config["mode"] not in COMPILE_MODES:
        raise Refused(f"{where}: mode must be one of {', '.join(COMPILE_MODES)}, got {compile_config['mode']!r}")
    options = compile_config.get("options")
    if options is not None:
        if compile_config.get("mode") is not None:
            raise Refused(f"{where}: give mode or options, not both (torch.compile takes one)")
        from torch._inductor import list_options  # what torch.compile's documentation points to

        known = list_options()
        unknown = [key for key in options if key not in known] if isinstance(options, dict) else [options]
        if unknown:
            raise Refused(f"{where}: options must map inductor's options (torch._inductor.list_options()) to "
                          f"values; unknown: {', '.join(map(str, unknown))}")


def compile_layers(model: nn.Module, compile_config: dict | None, layer_classes, where: str = "compile_config") -> None:
    """Compile each of ``model``'s decoder layers (``layer_classes``) with ``torch.compile(**compile_config)``, in
    place (None: none): one graph serves every layer of the same shape, and the layers stay the modules they were."""
    check_compile_config(compile_config, where)
    if compile_config is None:
        return
    layers = [module for module in model.modules() if type(module) in set(layer_classes)]
    if not layers:
        raise Refused(f"{where}: {type(model).__name__} has no decoder layers to compile")
    for layer in layers:
        layer.compile(**compile_config)
