"""Every use of PyTorch's private names, in one module behind the exact pin on torch (``TORCH``).

- ``load_from_metadata``: a sharded (DCP) checkpoint read with no model to load it into, each pickled object through
  the caller's own loader. torch 2.7 has no public way: ``torch.distributed.checkpoint.load`` fills only the keys
  of the state dict it is given, and warns whenever it reads in one process (pytorch/pytorch#125777, #125096); its
  default planner unpickles every object with ``torch.load(weights_only=False)``. So it uses the private
  ``default_planner._EmptyStateDictLoadPlanner`` (the state dict built from the metadata), its ``original_state_dict``
  and ``mappings``, ``state_dict_loader._load_state_dict`` (``no_dist``, silently) and ``_nested_dict.set_element``,
  as torch's own ``format_utils.dcp_to_torch_save`` does.
- ``default_store``: the store of the default process group (``distributed_c10d._get_default_store``), through which
  ``vocagno.compat.streaming_shm`` hands each node's shared-memory prefix to its ranks without a collective. No
  public accessor (no upstream issue asks for one; the closest, pytorch/pytorch#84468, the default process group's).

Checked against torch ``TORCH``, the version pyproject.toml pins (Composer 0.32.1 and llm-foundry 0.22 accept it);
``tests/unit/test_compat_torch.py`` fails when the installed torch is another version or no longer has what a
work-around here relies on.
"""

from __future__ import annotations

import io
from typing import Any, Callable

import torch

__all__ = ["TORCH", "default_store", "load_from_metadata"]

TORCH = "2.7.0"  # the torch version every work-around here was checked against


def load_from_metadata(reader, keys: set[str], load_object: Callable[[io.BytesIO], Any]) -> dict[str, Any]:
    """The entries ``keys`` (flattened names, or their prefixes) of the sharded checkpoint ``reader`` reads (a
    ``torch.distributed.checkpoint.StorageReader``), in this process alone: a state dict built from its metadata
    (an empty tensor of each size it records, then read into), each pickled object read by ``load_object``."""
    from torch.distributed.checkpoint._nested_dict import set_element
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    class Planner(_EmptyStateDictLoadPlanner):
        def load_bytes(self, read_item, value: io.BytesIO) -> None:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], load_object(value))

    state: dict[str, Any] = {}
    _load_state_dict(state, storage_reader=reader, planner=Planner(keys=keys), no_dist=True)
    return state


def default_store() -> torch.distributed.Store:
    """The store of the default process group (``init_process_group``'s, or torchrun's agent's)."""
    return torch.distributed.distributed_c10d._get_default_store()
