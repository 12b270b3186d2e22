"""The test helpers that stand for a node's death or a launcher's end: what they kill leaves nothing behind; a script
run in the test's process ends as its process would and leaves the test's process as it was."""

import os
import signal
import subprocess
import sys

import pytest
from helpers import kill_when, run_whole, script


def assert_dead(pid: int) -> None:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return
    os.kill(pid, signal.SIGKILL)
    raise AssertionError(f"the killed run's child {pid} outlived it")


def test_a_killed_run_leaves_no_process_behind(tmp_path):
    """A run's children (dataloader workers, spawned ranks, a resource tracker) die with it, as on a node's death."""
    pids = tmp_path / "pids"
    kill_when(["sh", "-c", f"sleep 300 & echo $! > {pids}; sleep 300"], pids.exists, settle=0.2)
    assert_dead(int(pids.read_text()))


@pytest.mark.slow
def test_a_launcher_past_its_time_goes_with_the_processes_it_started(tmp_path):
    """run_whole's timeout ends a launcher with its ranks, not the launcher alone."""
    pids = tmp_path / "pids"
    with pytest.raises(subprocess.TimeoutExpired):
        run_whole(["sh", "-c", f"sleep 300 & echo $! > {pids}; sleep 300"], 5)
    assert_dead(int(pids.read_text()))
    ended = run_whole(["sh", "-c", "echo out; echo err >&2; exit 3"], 60)
    assert (ended.returncode, ended.stdout, ended.stderr) == (3, "out\n", "err\n")


def test_a_script_run_here_ends_as_its_process_would_and_leaves_this_process_as_it_was(tmp_path):
    path = tmp_path / "script.py"
    path.write_text("import os, signal, sys\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nsys.path.insert(0, 'x')\n"
                    "print(os.getcwd(), sys.argv, __name__)\nprint('said', file=sys.stderr)\nsys.exit(3)\n")
    before = (list(sys.argv), list(sys.path), os.getcwd(), signal.getsignal(signal.SIGTERM))
    result = script(path, ["a", 1], cwd=tmp_path)
    assert (result.returncode, result.stderr) == (3, "said\n")
    assert result.stdout == f"{tmp_path} {[str(path), 'a', '1']} __main__\n"
    assert (sys.argv, sys.path, os.getcwd(), signal.getsignal(signal.SIGTERM)) == before
    path.write_text("import sys\nsys.exit('a message')\n")
    ended = script(path, [])
    assert (ended.returncode, ended.stdout, ended.stderr) == (1, "", "a message\n")  # as sys.exit(str) ends python
