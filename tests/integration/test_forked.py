"""tests/support/forked.py: a run forked from its server is, to its script, the process `python ...` would start."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import forked

SUPPORT = str(Path(__file__).resolve().parents[1] / "support")  # on the pytest worker's sys.path

REPORT = """import composer, json, multiprocessing, signal, sys
def handler(number):
    handler = signal.getsignal(number)
    return getattr(handler, "__qualname__", str(handler))
print(json.dumps({"path": sys.path[:2], "tests": any(p.rstrip("/") == %r for p in sys.path), "argv": sys.argv,
                  "start": multiprocessing.get_start_method(), "name": multiprocessing.current_process().name,
                  "parent": multiprocessing.parent_process() is None,
                  "signals": {number: handler(number) for number in signal.valid_signals()}}))
"""


def test_a_forked_run_sees_what_a_fresh_interpreter_sees(tmp_path):
    """The same script, forked and as a fresh interpreter (which imports Composer: its signal handlers included)."""
    script = tmp_path / "report.py"
    script.write_text(REPORT % SUPPORT)
    command, env = [sys.executable, str(script), "a", "b"], {**os.environ, "PYTHONPATH": "/elsewhere"}
    result = forked.run(command, cwd=tmp_path, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen["path"] == [str(tmp_path), "/elsewhere"] and not seen["tests"]  # not the pytest worker's path
    assert seen["argv"] == [str(script), "a", "b"]
    assert (seen["start"], seen["name"], seen["parent"]) == ("fork", "MainProcess", True)
    fresh = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert json.loads(fresh.stdout) == seen
    module = forked.run([sys.executable, "-m", "vocagno.score", "--help"], timeout=120)
    assert module.returncode == 0 and "usage:" in module.stdout and "RuntimeWarning" not in module.stderr
    missing = forked.run([sys.executable, str(tmp_path / "missing.py")], timeout=120)
    assert missing.returncode == 2 and "can't open file" in missing.stderr


def test_a_rank_forked_by_a_launcher_keeps_nothing_of_the_launchers_state(tmp_path):
    """Its temporary folders stay (their finalizers are the launcher's), its signal handlers are the defaults, and
    PYTHONUNBUFFERED gets its output out before a kill -9."""
    rank = tmp_path / "rank.py"
    rank.write_text("import os, pathlib, signal, sys\n"
                    "forked = 'fork_server' in pathlib.Path(f'/proc/{os.getpid()}/cmdline').read_text()\n"
                    "print('forked' if forked else 'exec', 'default' if signal.getsignal(signal.SIGUSR1) == "
                    "signal.SIG_DFL else 'inherited')\n"
                    "if sys.argv[1] == 'killed':\n"
                    "    os.kill(os.getpid(), signal.SIGKILL)\n")
    launcher = tmp_path / "launcher.py"
    launcher.write_text("import os, signal, subprocess, sys, tempfile\n"
                        "signal.signal(signal.SIGUSR1, lambda *a: sys.exit(138))\n"
                        "folder = tempfile.TemporaryDirectory()\n"
                        "for how in ('exits', 'killed'):\n"
                        f"    with open({str(tmp_path)!r} + f'/{{how}}.out', 'w') as out:\n"
                        f"        subprocess.Popen([sys.executable, {str(rank)!r}, how], stdout=out,\n"
                        "                         env={**os.environ, 'PYTHONUNBUFFERED': '1'}).wait()\n"
                        "print('kept' if os.path.isdir(folder.name) else 'gone')\n")
    result = forked.run([sys.executable, str(launcher)], cwd=tmp_path, timeout=120, fork_children=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "kept"  # the rank that exited ran no finalizer of the launcher's folder
    for how in ("exits", "killed"):  # forked; the killed one's line out unbuffered
        assert (tmp_path / f"{how}.out").read_text().split() == ["forked", "default"], how


def test_a_run_killed_as_soon_as_it_starts_is_killed(tmp_path):
    """Forked returns once the run leads its process group: killing the group at once reaches it."""
    script = tmp_path / "sleep.py"
    script.write_text("import time\ntime.sleep(300)\n")
    for _ in range(3):
        run = forked.Forked([sys.executable, str(script)])
        os.killpg(run.pid, signal.SIGKILL)
        began = time.time()
        assert run.wait(60) == -signal.SIGKILL and time.time() - began < 60


SPAWNS = """import concurrent.futures, multiprocessing, os, pathlib, sys

def where():
    parent = pathlib.Path(f"/proc/{os.getppid()}/stat").read_text().rsplit(")", 1)[1].split()
    forked = "fork_server" in pathlib.Path("/proc/self/cmdline").read_text() and "composer" in sys.modules
    return forked, os.getpgid(0), os.getppid(), int(parent[1])

if __name__ == "__main__":
    with concurrent.futures.ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        seen = [pool.submit(where).result() for _ in range(3)]
    forks = {fork for fork, _, _, _ in seen}
    groups = {group == os.getpgid(0) for _, group, _, _ in seen}
    servers = {server for _, _, server, _ in seen}
    managers = {server == os.getppid() for _, _, server, _ in seen}
    print(forks, groups, len(servers), managers)
"""


def test_a_runs_spawned_processes_are_forks_of_its_manager_in_its_process_group(tmp_path):
    """Composer starts its uploaders with multiprocessing's spawn: a fresh interpreter each, which imports the run's
    script again (8 s of CPU each, four a run saving to a store). A forked run's spawned processes are forks of the
    run's manager (which imported Composer and the rest once), and still the run's to kill (its process group)."""
    script = tmp_path / "spawns.py"
    script.write_text(SPAWNS)
    result = forked.run([sys.executable, str(script)], cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    # forks with Composer imported, in the run's group, of the run's manager
    assert result.stdout.strip() == "{True} {True} 1 {True}", result.stdout
