"""tests/support/schedule.py on a project of its own: a whole run that passes with --write-durations writes each file's
seconds, the next run starts with the longest file, and any other run writes nothing."""

import json
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]  # a pytest session of its own, in this process

SUPPORT = Path(__file__).resolve().parents[1] / "support"
CONFTEST = f"""
import sys
from pathlib import Path
sys.path.insert(0, {str(SUPPORT)!r})
from schedule import Schedule
globals().update(Schedule(Path(__file__).resolve().parent / "durations.json").hooks())
"""


WRITE = "--write-durations"


def pytest_in(pytester, *args: str) -> list[str]:
    done = pytester.runpytest_inprocess("-v", "-p", "no:cacheprovider", "-p", "no:randomly", "-p", "no:xdist", *args)
    return [line.split("::")[0] for line in done.outlines if "::" in line and "PASSED" in line]


@pytest.mark.slow
def test_the_longest_file_runs_first_once_a_whole_run_measured_it(pytester):
    tmp_path = pytester.path
    (tmp_path / "pyproject.toml").write_text('[tool.pytest.ini_options]\ntestpaths = ["tests"]\n')
    tests = tmp_path / "tests"
    (tests / "unit").mkdir(parents=True)
    (tests / "conftest.py").write_text(CONFTEST)
    (tests / "unit" / "test_a_quick.py").write_text("def test_quick():\n    pass\n")
    (tests / "unit" / "test_b_slow.py").write_text("import time\n\ndef test_slow():\n    time.sleep(1.2)\n")
    durations = tests / "durations.json"
    assert pytest_in(pytester, "-k", "quick", WRITE) == ["tests/unit/test_a_quick.py"]
    assert not durations.exists()  # partial
    assert pytest_in(pytester, "-m", "not slow", WRITE) == ["tests/unit/test_a_quick.py", "tests/unit/test_b_slow.py"]
    assert not durations.exists()  # a selection by marks: partial too, whatever it selected
    assert pytest_in(pytester) == ["tests/unit/test_a_quick.py", "tests/unit/test_b_slow.py"]  # nothing known yet
    assert not durations.exists()  # not asked for
    assert pytest_in(pytester, WRITE) == ["tests/unit/test_a_quick.py", "tests/unit/test_b_slow.py"]
    seconds = json.loads(durations.read_text())
    assert list(seconds) == ["unit/test_b_slow.py", "unit/test_a_quick.py"] and seconds["unit/test_b_slow.py"] >= 1
    assert pytest_in(pytester) == ["tests/unit/test_b_slow.py", "tests/unit/test_a_quick.py"]  # the longest first
    assert json.loads(durations.read_text()) == seconds  # a run not asked to write it leaves it as it was
    (tests / "unit" / "test_a_quick.py").write_text("def test_quick():\n    assert False\n")
    durations.write_text("{}")
    pytest_in(pytester, WRITE)
    assert durations.read_text() == "{}"  # a failed run writes nothing


def test_a_durations_file_that_is_a_link_or_no_mapping_orders_nothing_and_is_replaced(pytester):
    """Whatever stands at durations.json only orders the run: a link is neither followed when read nor written
    through, and a file that is not a mapping of files to seconds is ignored."""
    tmp_path = pytester.path
    (tmp_path / "pyproject.toml").write_text('[tool.pytest.ini_options]\ntestpaths = ["tests"]\n')
    tests = tmp_path / "tests"
    (tests / "unit").mkdir(parents=True)
    (tests / "conftest.py").write_text(CONFTEST)
    (tests / "unit" / "test_a.py").write_text("def test_a():\n    pass\n")
    victim = tmp_path / "victim.txt"
    victim.write_text("kept")
    (tests / "durations.json").symlink_to(victim)
    assert pytest_in(pytester, WRITE) == ["tests/unit/test_a.py"]
    assert victim.read_text() == "kept" and not (tests / "durations.json").is_symlink()
    (tests / "durations.json").write_text('["unit/test_a.py"]')
    assert pytest_in(pytester) == ["tests/unit/test_a.py"]  # collected and run, not an AttributeError
