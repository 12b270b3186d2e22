"""Composer checkpoints of ``train.py``, wherever a run left them: found, checked, read into a model, and repaired
for autoresume.

A checkpoint is a whole file (``ep0-ba100-rank0.pt``), a sharded folder (``ep0-ba100/``: ``__R_0.distcp`` files and
``.metadata``, as ``fsdp_config.state_dict_type: sharded`` writes it with ``torch.distributed.checkpoint``), or a run's
``save_folder`` (its ``latest-rank0.pt``), on a local disk or in an object store Composer reads (``s3://``,
``gs://``, ``oci://``, ...: there a save folder's latest is the ``latest-rank0.pt.symlink`` object Composer uploads).

Five modules, one job each: ``files`` (where a checkpoint is, fetched from a store, and whether its save finished),
``state`` (its state read through the one way in, and its recipe), ``model`` (a Hugging Face model built from that
state), ``repair`` (a save folder made fit for autoresume) and ``private`` (the copy a run hands Composer to load, in
a folder of its own, checked there).
"""

from vocagno.training.checkpoint.files import (
    LATEST, METADATA, BadCheckpoint, IncompleteCheckpoint, fetch, has_latest, is_checkpoint, load_checkpoint, resolve,
    resolve_remote,
)
from vocagno.training.checkpoint.model import (
    DTYPES, RUN_DTYPES, model_from_checkpoint, model_from_state, tokenizer_from_state,
)
from vocagno.training.checkpoint.private import private_folder, take
from vocagno.training.checkpoint.repair import repair
from vocagno.training.checkpoint.state import (
    MODEL_PARTS, check_objects, read_state, recipe, recipe_config,
)

__all__ = ["BadCheckpoint", "IncompleteCheckpoint", "check_objects", "fetch", "has_latest",
           "is_checkpoint", "load_checkpoint", "model_from_checkpoint", "model_from_state", "private_folder",
           "read_state", "recipe", "recipe_config", "repair", "resolve", "resolve_remote", "take",
           "tokenizer_from_state", "DTYPES", "RUN_DTYPES", "LATEST", "METADATA", "MODEL_PARTS"]
