"""The README's test command (what CI runs) leaves out the tests marked ``slow`` and still runs one test of each kind
that the slow ones stand beside: a guided training run, a scoring pass, cached losses against the online teacher, cached
ULD, a teacher sharded over gloo ranks, an export."""

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
# The quick set's test of each kind (docs/development.md names them): none of them may be marked slow.
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


def marked_slow(node: ast.AST) -> bool:
    """``node`` (a decorator, a ``pytestmark`` value) is or holds ``pytest.mark.slow``."""
    return any(isinstance(n, ast.Attribute) and n.attr == "slow" and ast.unparse(n.value) == "pytest.mark"
               for n in ast.walk(node))


def slow_and_quick(path: Path) -> tuple[set[str], set[str]]:
    """The test functions of ``path`` marked slow (the function or its module), and the others."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    module_slow = any(isinstance(node, ast.Assign) and any(ast.unparse(t) == "pytestmark" for t in node.targets)
                      and marked_slow(node.value) for node in tree.body)
    slow, quick = set(), set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
            (slow if module_slow or any(marked_slow(d) for d in node.decorator_list) else quick).add(node.name)
    return slow, quick


def test_the_readmes_test_command_leaves_out_the_slow_tests_and_pyproject_registers_the_marker():
    second = re.findall(r"^python3 -m venv \.venv && .*pytest.*$", (REPO / "README.md").read_text(encoding="utf-8"),
                        re.M)[0]
    assert ' -m "not slow" ' in second
    assert re.search(r'^\s*"slow: ', (REPO / "pyproject.toml").read_text(encoding="utf-8"), re.M)


@pytest.mark.parametrize("kind", KINDS)
def test_the_quick_set_keeps_one_test_of_each_kind(kind):
    file, name = KINDS[kind]
    slow, quick = slow_and_quick(TESTS / file)
    assert name in quick, f"{kind}: {file}::{name} is {'marked slow' if name in slow else 'gone'}"


def test_slow_tests_are_found_where_they_are_marked():
    """The check above reads the marks as pytest does: on the function, on a parametrised case, on the module."""
    slow, quick = slow_and_quick(TESTS / "distributed" / "test_multinode.py")  # pytestmark = [..., pytest.mark.slow]
    assert slow and not quick
    slow, quick = slow_and_quick(TESTS / "integration" / "test_train.py")
    assert "test_kill_and_autoresume_continue_with_the_same_losses" in slow
    assert "test_tiny_run_trains_on_the_guided_tokens_and_its_loss_falls" in quick
