"""A trained model to read: a Hugging Face name or folder, or a checkpoint of ``train.py`` in any form
``vocagno.training.checkpoint`` finds. ``python -m vocagno.eval --model`` and ``python -m vocagno.selection
--student`` load theirs here."""

from __future__ import annotations

from vocagno.doors.untrusted import from_pretrained
from vocagno.training.checkpoint import is_checkpoint, model_from_checkpoint

__all__ = ["load_model"]


def load_model(name_or_path: str, device: str = "cpu"):
    """An HF causal LM (in eval mode) and its tokenizer from a name or folder, or from a checkpoint of train.py
    (whole or sharded, local or in an object store, a save folder's latest)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if is_checkpoint(name_or_path):
        model, tokenizer, _ = model_from_checkpoint(name_or_path, device)
        return model, tokenizer
    # trust_remote_code off, said explicitly: left unset, transformers asks on the terminal and runs a folder's code
    # on "y". A local folder is checked first (its files regular, no links, its configs naming no code).
    tokenizer = from_pretrained(AutoTokenizer, name_or_path)
    model = from_pretrained(AutoModelForCausalLM, name_or_path, torch_dtype="auto")
    return model.to(device).eval(), tokenizer
