"""PyTorch's door (``vocagno.compat.torch``) against the installed torch: its version is the one the door was checked
against, every private name a work-around uses is there with the signature and attributes it relies on, and a
sharded checkpoint reads back with no model through them. A new torch fails here first, naming what changed."""

import dataclasses
import inspect
import io
import pickle
import warnings
from importlib.metadata import version

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._nested_dict import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.planner import ReadItem
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

from vocagno.compat.torch import TORCH, load_from_metadata


def parameters(function) -> list[str]:
    return list(inspect.signature(function).parameters)


def test_the_installed_torch_is_the_one_the_door_was_checked_against():
    assert version("torch") == TORCH, (
        f"torch {version('torch')} is installed; vocagno/compat/torch.py was checked against {TORCH}: check each "
        "work-around on it, then move the pin")


def test_the_loader_and_planner_the_checkpoint_reader_uses_keep_their_signatures_and_attributes():
    assert parameters(_load_state_dict)[:2] == ["state_dict", "storage_reader"]
    assert {"planner", "no_dist"} <= set(parameters(_load_state_dict))
    assert issubclass(_EmptyStateDictLoadPlanner, DefaultLoadPlanner)
    assert parameters(_EmptyStateDictLoadPlanner.__init__)[:2] == ["self", "keys"]
    assert parameters(_EmptyStateDictLoadPlanner.load_bytes) == ["self", "read_item", "value"]
    planner = _EmptyStateDictLoadPlanner(keys={"state.model"})
    assert planner.keys == {"state.model"} and planner.flatten_state_dict
    assert hasattr(planner, "original_state_dict") and hasattr(planner, "mappings")
    assert parameters(set_element) == ["root_dict", "path", "value"]
    assert "dest_index" in {field.name for field in dataclasses.fields(ReadItem)}
    assert "fqn" in {field.name for field in dataclasses.fields(MetadataIndex)}


def test_the_default_store_and_what_the_shared_memory_registration_asks_of_it():
    assert parameters(torch.distributed.distributed_c10d._get_default_store) == []
    for name in ("set", "get", "multi_get"):
        assert callable(getattr(torch.distributed.Store, name)), name


def test_a_sharded_checkpoint_reads_back_from_its_metadata_alone(tmp_path):
    """Tensors made from the metadata and read into, nested as saved; each pickled object through ``load_object``;
    only the keys asked for."""
    saved = {"state": {"model": {"w": torch.arange(6.0).reshape(2, 3)}, "timestamp": {"batch": 3},
                       "optimizers": {"m": torch.ones(4)}}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DCP's "assuming the intent is to save in a single process"
        dcp.save(saved, storage_writer=dcp.FileSystemWriter(str(tmp_path)), no_dist=True)
    objects = []

    def load_object(value: io.BytesIO):
        objects.append(value)
        return torch.load(value, weights_only=True)

    state = load_from_metadata(dcp.FileSystemReader(str(tmp_path)), {"state.model", "state.timestamp"}, load_object)
    assert set(state) == {"state"} and set(state["state"]) == {"model", "timestamp"}
    assert torch.equal(state["state"]["model"]["w"], saved["state"]["model"]["w"])
    assert state["state"]["timestamp"] == {"batch": 3} and len(objects) == 1
    pickle.dumps(state)  # plain objects, nothing of the planner's
