"""The README's test command (what CI runs) leaves out the tests marked ``slow`` and still runs the quick set's test of
each kind that docs/development.md names: a guided training run, a scoring pass, cached losses against the online
teacher, cached ULD, a teacher sharded over gloo ranks, an export. What counts is what pytest itself selects with
``-m "not slow"``, however a mark is written (on the function, a parametrised case, the module, a conftest hook), and
that the case selected is neither skipped nor expected to fail."""

import re
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]  # a pytest session of its own, in this process

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
# The quick set's test of each kind: pytest's "not slow" selection must hold at least one of its cases.
KINDS = {
    "a guided training run": ("integration/test_train.py", "test_tiny_run_trains_on_the_guided_tokens_and_its_loss_falls"),
    "a scoring pass": ("integration/test_score.py",
                       "test_the_scored_shards_hold_the_inputs_samples_shard_for_shard_with_the_teachers_losses"),
    "cached losses against the online teacher": (
        "integration/test_score.py", "test_cached_losses_give_the_online_teachers_training_without_a_teacher"),
    "cached ULD": ("integration/test_cached_distill.py",
                   "test_cached_uld_with_the_whole_vocabulary_is_live_uld_loading_no_teacher"),
    "a teacher sharded over gloo ranks": (
        "distributed/test_distributed.py",
        "test_a_teacher_sharded_over_cpu_ranks_scores_as_the_whole_one_and_each_rank_holds_a_share"),
    "an export": ("integration/test_export.py",
                  "test_a_whole_checkpoint_becomes_a_folder_that_loads_with_the_checkpoints_logits_and_states_its_recipe"),
}


class Marks:
    """A plugin: each test pytest selects, by node id (relative to the repository), with the names of its marks."""

    def __init__(self):
        self.items: dict[str, set[str]] = {}

    def pytest_collection_finish(self, session):
        self.items = {item.nodeid: {mark.name for mark in item.iter_markers()} for item in session.items}


def collected(pytester, *args: str) -> dict[str, set[str]]:
    """What pytest selects from ``args`` in the repository's settings: node id -> its marks' names."""
    marks = Marks()
    done = pytester.runpytest_inprocess("--collect-only", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                                        "--rootdir", str(REPO), "-c", str(REPO / "pyproject.toml"), *args,
                                        plugins=[marks])
    assert done.ret in (0, 5), "\n".join(done.outlines + done.errlines)  # 5: nothing selected
    return marks.items


def test_the_readmes_test_command_leaves_out_the_slow_tests_and_pyproject_registers_the_marker():
    second = re.findall(r"^python3 -m venv \.venv && .*pytest.*$", (REPO / "README.md").read_text(encoding="utf-8"),
                        re.M)[0]
    assert ' -m "not slow" ' in second
    assert re.search(r'^\s*"slow: ', (REPO / "pyproject.toml").read_text(encoding="utf-8"), re.M)


def test_the_quick_set_keeps_one_test_of_each_kind_and_leaves_out_what_is_marked_slow(pytester):
    files = sorted({str(TESTS / file) for file, _ in KINDS.values()})
    quick = collected(pytester, "-m", "not slow", *files, str(TESTS / "distributed" / "test_multinode.py"))
    missing = [f"{kind}: tests/{file}::{name}" for kind, (file, name) in KINDS.items()
               if not any(re.fullmatch(rf"tests/{re.escape(file)}::{name}(\[.*\])?", node)
                          and not quick[node] & {"skip", "skipif", "xfail"} for node in quick)]
    assert not missing, f"pytest -m 'not slow' selects no case of {missing} that is not skipped or expected to fail"
    # The marks pytest reads: a module's pytestmark (every multi-node test), a parametrised case's (test_score's CELLS).
    assert not [node for node in quick if "test_multinode.py" in node]
    cached = "integration/test_score.py::test_cached_losses_give_the_online_teachers_training_without_a_teacher["
    cells = sorted(node.split("[", 1)[1].rstrip("]") for node in quick if f"tests/{cached}" in node)
    assert cells == ["chunk-4-mean", "exclude-mean", "include-max", "microbatch", "sequence"]
