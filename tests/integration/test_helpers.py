"""The test helpers that stand for a node's death: what they kill leaves nothing behind."""

import os
import signal

from helpers import kill_when


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
