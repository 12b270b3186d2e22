"""The test helpers that stand for a node's death: what they kill leaves nothing behind."""

import os
import signal
import sys
import time
from pathlib import Path

import forked
from helpers import assert_group_gone, kill_when


def test_a_killed_run_leaves_no_process_behind(tmp_path):
    """A run's children (dataloader workers, spawned ranks, a resource tracker) die with it, as on a node's death."""
    pids = tmp_path / "pids"
    kill_when(["sh", "-c", f"sleep 300 & echo $! > {pids}; sleep 300"], pids.exists, settle=0.2)
    child = int(pids.read_text())
    try:
        os.kill(child, 0)
    except ProcessLookupError:
        return
    os.kill(child, signal.SIGKILL)
    raise AssertionError(f"the killed run's child {child} outlived it")


def test_a_forked_run_and_the_python_processes_it_starts_die_with_its_process_group(tmp_path):
    """forked's runs stand for a launcher and its ranks: a rank it forks stays in the launcher's process group (unless
    asked for a session of its own), so killing the group, as a node's death does, leaves nothing behind."""
    rank = tmp_path / "rank.py"
    rank.write_text("import os, pathlib, sys, time\npathlib.Path(sys.argv[1] + '.part').write_text(str(os.getpid()))\n"
                    "os.rename(sys.argv[1] + '.part', sys.argv[1])\ntime.sleep(300)\n")
    launcher = tmp_path / "launcher.py"
    launcher.write_text("import subprocess, sys\n"
                        f"subprocess.Popen([sys.executable, {str(rank)!r}, sys.argv[1]]).wait()\n")
    pids = tmp_path / "pid"
    launcher_run = forked.Forked([sys.executable, str(launcher), str(pids)], fork_children=True)
    deadline = time.time() + 120
    while not pids.exists() and time.time() < deadline:
        time.sleep(0.05)
    child = int(pids.read_text())
    assert "fork_server" in (Path("/proc") / str(child) / "cmdline").read_text()  # forked, not a fresh interpreter
    assert os.getpgid(child) == launcher_run.pid  # in the launcher's group, not a session of its own
    os.killpg(launcher_run.pid, signal.SIGKILL)
    launcher_run.wait(30)
    assert_group_gone(launcher_run.pid)
