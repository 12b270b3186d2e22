"""Composer's door (``vocagno.compat.composer``) against the installed Composer: its version is the one the door was
checked against, and every private name a work-around uses is there, looked up where the work-around replaces it. A
new Composer fails here first, naming what changed."""

import inspect
from importlib.metadata import version

from composer.callbacks import CheckpointSaver
from composer.models import huggingface
from composer.trainer import trainer
from composer.utils import checkpoint, collect_env, dist

from vocagno.compat import composer as compat


def parameters(function) -> list[str]:
    return list(inspect.signature(function).parameters)


def calls(function, *names: str) -> None:
    """``function`` looks ``names`` up when it runs (a module's global, an attribute): what replacing them relies on."""
    used = set(function.__code__.co_names)
    assert set(names) <= used, f"{function.__qualname__} no longer uses {sorted(set(names) - used)}"


def test_the_installed_composer_is_the_one_the_door_was_checked_against():
    assert version("mosaicml") == compat.COMPOSER, (
        f"mosaicml {version('mosaicml')} is installed; vocagno/compat/composer.py was checked against "
        f"{compat.COMPOSER}: check each work-around on it, then move the pin")


def test_the_signal_file_name_is_still_node_zeros_and_looked_up_where_it_is_replaced(monkeypatch):
    """Composer still broadcasts node 0's name (else the work-around is no longer needed: drop it), and its callers
    look the function up in ``dist`` when they run, where ``install`` replaces it."""
    assert "broadcast_object_list" in inspect.getsource(compat._BROADCAST_SIGNAL_FILE_NAME)
    assert parameters(compat._BROADCAST_SIGNAL_FILE_NAME) == ["rng"] == parameters(compat.per_node_signal_files)
    for module in (trainer, checkpoint):  # autoresume's wait, a checkpoint's download
        assert "dist.get_node_signal_file_name()" in inspect.getsource(module), module.__name__
    monkeypatch.setattr(dist, "get_node_rank", lambda: 3)
    monkeypatch.setattr(compat, "_BROADCAST_SIGNAL_FILE_NAME", lambda rng=None: "._signal_file_node0_abc123")
    assert compat.per_node_signal_files() == "._signal_file_node3_abc123"


def test_the_cpu_model_is_asked_through_the_module_where_it_is_replaced(monkeypatch):
    calls(collect_env.get_composer_env_dict, "get_cpu_model")
    assert parameters(compat._PY_CPUINFO_MODEL) == []
    monkeypatch.setattr(dist, "get_node_signal_file_name", dist.get_node_signal_file_name)  # as they were, after
    monkeypatch.setattr(collect_env, "get_cpu_model", collect_env.get_cpu_model)
    compat.install()
    compat.install()  # again: the same functions, nothing wrapped twice
    assert collect_env.get_cpu_model is compat.cpu_model_from_proc
    assert dist.get_node_signal_file_name is compat.per_node_signal_files


def test_the_causal_lm_question_is_still_asked_where_it_is_skipped():
    assert parameters(huggingface._is_registered_causal_lm) == ["model"]
    calls(huggingface.HuggingFaceModel.__init__, "_is_registered_causal_lm")
    assert "shift_labels" in parameters(huggingface.HuggingFaceModel.__init__)


def test_the_savers_latest_link_wait_is_still_the_attribute_it_sets(tmp_path):
    saver = CheckpointSaver(folder=str(tmp_path))
    assert saver._symlink_upload_wait_before_next_try_in_seconds == 30.0
    assert "_symlink_upload_wait_before_next_try_in_seconds" in inspect.getsource(CheckpointSaver)
    compat.promptly_linked([object(), saver])
    assert saver._symlink_upload_wait_before_next_try_in_seconds == compat.LATEST_LINK_POLL_SECONDS
