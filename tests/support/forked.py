"""Commands (``python train.py ...``, ``python -m vocagno.score ...``) run as processes forked from a server that
imported train.py's modules once (``fork_server``: torch, Composer, Streaming, transformers, about 7 s of CPU a fresh
interpreter spends before its first line of work), instead of a fresh interpreter each.

A run is still a process of its own, as close to ``python ...`` as a fork gets: its own session and process group (to
kill whole), working folder, environment, ``sys.path`` and ``sys.argv``, stdout and stderr (unbuffered under
``PYTHONUNBUFFERED``), the exit code and the end a script gets (its non-daemon threads joined, its atexit handlers
run), and a server that never ran anything before it: multiprocessing is a fresh interpreter's. What a fork can't
give: modules the server imported stay imported (``fork_server.PREIMPORTED``, all installed packages, importable by a
fresh interpreter too), with what they read from the environment and did when imported (the pytest worker's
environment: one torch thread, Hugging Face offline; Composer's SIGTERM and SIGINT handlers, which every command of
vocagno has, as it imports Composer); every run has the server's hash seed, and a command whose settings the
interpreter reads as it starts (``fork_server.STARTUP_ENV``: PYTHONHASHSEED, ...) differ from the server's is refused
(``ValueError``). The processes a run starts with multiprocessing's spawn, and with ``fork_children`` its ``python
...`` subprocesses (a launcher's ranks), are forks of the same server, in the run's process group (``fork_shim``).
What only a fresh interpreter shows (what a module imports, ``torchrun``) keeps ``subprocess``."""

import atexit
import multiprocessing
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fork_server import PREIMPORTED, python_command, receive, send

# multiprocessing's forkserver with the same modules imported, for functions run in a process of their own (at_once,
# bounded): forked from a fresh interpreter, not from the pytest worker, whose threads' locks a fork would inherit
context = multiprocessing.get_context("forkserver")
context.set_forkserver_preload(PREIMPORTED)
SUPPORT = Path(__file__).resolve().parent
_server: dict = {}  # the server of this process: "process", "folder"
_live: set["Forked"] = set()  # runs not waited for yet (their connection is what keeps them alive)


def _server_folder() -> str:
    """The folder of this process's server (started at the first run): its sockets and its ``python`` shim."""
    process = _server.get("process")
    if process is not None and process.poll() is None:
        return _server["folder"]
    folder = tempfile.mkdtemp(prefix="fork-server-")
    shim = Path(folder) / "python"
    shim.write_text(f"#!{sys.executable} -S\nimport sys\nsys.path.insert(0, {str(SUPPORT)!r})\n"
                    f"from fork_shim import main\nmain({folder!r}, {sys.executable!r})\n")
    shim.chmod(0o755)
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    log = open(Path(folder) / "server.log", "w")
    _server.update(folder=folder, process=subprocess.Popen(
        [sys.executable, str(SUPPORT / "fork_server.py"), folder], stdin=subprocess.PIPE, stdout=log, stderr=log,
        env=env, start_new_session=True))
    log.close()
    atexit.register(_stop_server, _server["process"], folder)
    return folder


def _stop_server(process: subprocess.Popen, folder: str) -> None:
    process.stdin.close()  # it ends when its standard input does
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
    shutil.rmtree(folder, ignore_errors=True)


def _connect() -> socket.socket:
    folder = _server_folder()
    deadline = time.time() + 300
    while True:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(os.path.join(folder, "server.sock"))
            return conn
        except (FileNotFoundError, ConnectionRefusedError):
            conn.close()
        process = _server["process"]
        if process.poll() is not None or time.time() > deadline:
            log = (Path(folder) / "server.log").read_text(errors="replace")[-4000:]
            raise RuntimeError(f"forked's server did not start (exit code {process.poll()}):\n{log}")
        time.sleep(0.05)


class Forked:
    """A running command, as much of ``subprocess.Popen`` as the tests use: ``pid`` (also its process group),
    ``poll``, ``wait``, ``kill``; ``stdout`` and ``stderr`` are the files its output went to. ``fork_children``: see
    ``run``; ``private_shm``: in a mount namespace of its own with its own /dev/shm (a node of a job over several).
    It returns once the run leads its process group, so that killing the group reaches it."""

    def __init__(self, command, cwd=None, env=None, stdout=None, stderr=None, fork_children=False, private_shm=False):
        python = python_command(command)
        if python is None:
            raise ValueError(f"not a `python script ...`, `python -m module ...` or `python -c ...` command: {command}")
        self.args = command
        self._folder = tempfile.TemporaryDirectory(prefix="forked-")
        self.stdout = stdout or os.path.join(self._folder.name, "stdout")
        self.stderr = stderr or os.path.join(self._folder.name, "stderr")
        self._conn = _connect()
        try:
            fds = [os.open(os.devnull, os.O_RDONLY)]
            try:
                fds += [os.open(output, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                        for output in (self.stdout, self.stderr)]
                send(self._conn, {"argv": python, "cwd": os.path.abspath(cwd or os.getcwd()),
                                  "env": dict(os.environ if env is None else env), "fds": [0, 1, 2],
                                  "fork_children": fork_children, "private_shm": private_shm}, fds)
            finally:
                for fd in fds:
                    os.close(fd)
            started, _ = receive(self._conn)
        except BaseException:
            self._conn.close()
            raise
        if started is None or "pid" not in started:
            self._conn.close()
            error = (started or {}).get("error", "its manager ended")
            raise (ValueError if error.startswith("not forked") else RuntimeError)(f"forked: {error}: {command}")
        self.pid = started["pid"]
        self.returncode = None
        _live.add(self)

    def poll(self):
        if self.returncode is None and select.select([self._conn], [], [], 0)[0]:
            self._ended()
        return self.returncode

    def wait(self, timeout=None):
        if self.returncode is None:
            if not select.select([self._conn], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._ended()
        return self.returncode

    def _ended(self) -> None:
        ended, _ = receive(self._conn)
        if ended is None or "status" not in ended:
            raise RuntimeError(f"forked: the run's manager ended without its exit status: {ended}")
        self.returncode = ended["status"]
        self._conn.close()
        _live.discard(self)

    def kill(self):
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def outputs(self) -> tuple[str, str]:
        """What it wrote to stdout and to stderr, so far."""
        return tuple(Path(path).read_text(encoding="utf-8", errors="replace") if os.path.exists(path) else ""
                     for path in (self.stdout, self.stderr))


def run(command, cwd=None, env=None, timeout=None, fork_children=False) -> subprocess.CompletedProcess:
    """``subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)``, forked; a run
    past ``timeout``, or whose wait is interrupted, is killed with its process group. ``fork_children``: the
    ``python ...`` processes it starts (a launcher's ranks) are forks of the server too."""
    process = Forked(command, cwd=cwd, env=env, fork_children=fork_children)
    try:
        code = process.wait(timeout)
    except BaseException as error:
        kill_group(process.pid)
        process.wait()
        if isinstance(error, subprocess.TimeoutExpired):
            error.output, error.stderr = process.outputs()
        raise
    finally:
        stdout, stderr = process.outputs()
        process._folder.cleanup()
    return subprocess.CompletedProcess(command, code, stdout, stderr)


def kill_group(group: int) -> None:
    try:
        os.killpg(group, signal.SIGKILL)
    except ProcessLookupError:
        pass
