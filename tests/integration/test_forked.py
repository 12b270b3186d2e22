"""tests/support/forked.py: a run forked from its server is, to its script, the process `python ...` would start."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import forked
import pytest

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


RANK_STATE = """import atexit, json, os, pickle, resource, signal, stat, sys
class Kept:
    pass
def at_exit():
    print(json.dumps({"main": type(pickle.loads(pickle.dumps(Kept()))).__module__, "pipes": pipes}))
atexit.register(at_exit)
pipes = sum(stat.S_ISFIFO(os.fstat(int(fd)).st_mode) for fd in sys.argv[1:])
print(json.dumps({"umask": oct(os.umask(0)), "affinity": sorted(os.sched_getaffinity(0)),
                  "files": resource.getrlimit(resource.RLIMIT_NOFILE), "nice": os.getpriority(os.PRIO_PROCESS, 0),
                  "blocked": sorted(map(int, signal.pthread_sigmask(signal.SIG_BLOCK, []))),
                  "usr2": str(signal.getsignal(signal.SIGUSR2)), "hash": hash("vocagno"),
                  "forked": "fork_server" in open("/proc/self/cmdline").read()}))
"""

LAUNCHER = """import os, resource, signal, subprocess, sys
os.umask(0o077)
os.sched_setaffinity(0, [0])
resource.setrlimit(resource.RLIMIT_NOFILE, (1000, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
os.nice(3)
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
signal.signal(signal.SIGUSR2, signal.SIG_IGN)
ends = [end for _ in range(40) for end in os.pipe()]  # 80 file descriptors passed on
env = {**os.environ, "PYTHONHASHSEED": sys.argv[2]} if sys.argv[2] else None
rank = subprocess.run([sys.executable, sys.argv[1], *map(str, ends)], pass_fds=ends, env=env, capture_output=True,
                      text=True)
print(rank.stdout, rank.stderr, rank.returncode)
"""


def test_a_rank_started_through_the_shim_gets_what_exec_would_give_it(tmp_path):
    """What a launcher set of its process (umask, CPU affinity, limits, niceness, blocked and ignored signals) and
    every file descriptor it passed on reach its rank, whose ``__main__`` stays its own until its atexit handlers
    ran; a rank whose environment sets what an interpreter reads as it starts (PYTHONHASHSEED) runs in the real
    python. As a fresh interpreter launching a fresh interpreter sees it."""
    (tmp_path / "rank.py").write_text(RANK_STATE)
    (tmp_path / "launcher.py").write_text(LAUNCHER)
    for seed in ("", "0"):
        command = [sys.executable, str(tmp_path / "launcher.py"), str(tmp_path / "rank.py"), seed]
        result = forked.run(command, cwd=tmp_path, timeout=120, fork_children=True)
        fresh = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        lines = [json.loads(line) for line in result.stdout.splitlines()[:2]]
        assert lines[0].pop("forked") is (seed == ""), result.stdout
        if not seed:  # a fork has the server's hash seed: a run that needs its own sets PYTHONHASHSEED
            lines[0].pop("hash")
        expected = [json.loads(line) for line in fresh.stdout.splitlines()[:2]]
        expected[0].pop("forked")
        if not seed:
            expected[0].pop("hash")
        assert lines == expected, (result.stdout, result.stderr)
        assert expected[1] == {"main": "__main__", "pipes": 80}


def test_an_error_a_run_leaves_is_shown_as_python_shows_it(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text("def inner():\n    raise ValueError('boom')\n\ninner()\n")
    result = forked.run([sys.executable, str(script)], cwd=tmp_path, timeout=120)
    fresh = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert (result.returncode, result.stderr) == (fresh.returncode, fresh.stderr) == (1, fresh.stderr)
    assert "fork_server" not in result.stderr


def test_a_command_the_server_cant_stand_for_is_refused(tmp_path):
    """An interpreter setting read at start (PYTHONHASHSEED) other than the server's: not forked, said."""
    with pytest.raises(ValueError, match="not forked: PYTHONHASHSEED"):
        forked.Forked([sys.executable, "-c", "pass"], env={**os.environ, "PYTHONHASHSEED": "12345"})


RANK_SLEEPS = "import os, sys, time\nopen(sys.argv[1] + '.part', 'w').write(str(os.getpid()))\n" \
              "os.rename(sys.argv[1] + '.part', sys.argv[1])\ntime.sleep(300)\n"


def pids_running(script) -> list[int]:
    """The processes whose command line names ``script``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and str(script) in (entry / "cmdline").read_text():
                found.append(int(entry.name))
        except OSError:
            pass
    return found


def test_a_rank_whose_launcher_kills_its_popen_is_killed_and_the_run_still_ends_with_its_status(tmp_path):
    """A launcher that kills a rank's process (here the shim that stands for it) kills the rank."""
    (tmp_path / "rank.py").write_text(RANK_SLEEPS)
    launcher = tmp_path / "launcher.py"
    launcher.write_text("import os, signal, subprocess, sys, time\n"
                        f"rank = subprocess.Popen([sys.executable, {str(tmp_path / 'rank.py')!r}, 'pid'])\n"
                        "while not os.path.exists('pid'):\n    time.sleep(0.05)\n"
                        "rank.kill()\nrank.wait()\nrank_pid = int(open('pid').read())\n"
                        "for _ in range(200):\n"
                        "    if not os.path.exists(f'/proc/{rank_pid}') or 'Z' in open(f'/proc/{rank_pid}/stat')"
                        ".read().rsplit(')', 1)[1].split()[:1]:\n        break\n    time.sleep(0.05)\n"
                        "else:\n    sys.exit('the rank outlived its kill')\n"
                        "sys.exit(7)\n")
    result = forked.run([sys.executable, str(launcher)], cwd=tmp_path, timeout=120, fork_children=True)
    assert result.returncode == 7, result.stderr
    assert not pids_running(tmp_path / "rank.py")


def test_a_run_killed_while_it_starts_ranks_leaves_nothing_running(tmp_path):
    (tmp_path / "rank.py").write_text(RANK_SLEEPS)
    launcher = tmp_path / "launcher.py"
    launcher.write_text("import subprocess, sys\n"
                        "ranks = [subprocess.Popen([sys.executable, sys.argv[1], f'pid{i}']) for i in range(6)]\n"
                        "[rank.wait() for rank in ranks]\n")
    for attempt in range(3):
        run = forked.Forked([sys.executable, str(launcher), str(tmp_path / "rank.py")], cwd=tmp_path,
                            fork_children=True)
        deadline = time.time() + 60
        while not list(tmp_path.glob("pid*")) and time.time() < deadline:
            time.sleep(0.01)
        os.killpg(run.pid, signal.SIGKILL)
        assert run.wait(60) == -signal.SIGKILL
        assert not pids_running(tmp_path / "rank.py"), attempt
        for pid in tmp_path.glob("pid*"):
            pid.unlink()
