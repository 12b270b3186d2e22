"""Commands (``python train.py ...``, ``python -m vocagno.score ...``) run as processes forked from a server that
imported train.py's modules once (torch, Composer, Streaming, transformers: about 7 s of CPU a fresh interpreter
spends before its first line of work), instead of a fresh interpreter each.

A run is still a process of its own: its own session (a process group to kill whole), working folder, environment,
stdout and stderr, exit code, and the exit a script gets (its non-daemon threads joined, its atexit handlers run). The
server is multiprocessing's forkserver, started clean from this module, not the pytest worker: a fork of the worker
inherits the threads and locks its earlier tests left, and a lock some thread held at the fork stays held in the
child (the CI run at 9dd6544 saw four such children hang). What a fresh interpreter alone tests (what a module
imports, ``PYTHONPATH``, a launcher's own processes) keeps ``subprocess``."""

import atexit
import multiprocessing
import os
import runpy
import subprocess
import sys
import tempfile
import threading
import traceback
from pathlib import Path

EXEC_POPEN = subprocess.Popen
context = multiprocessing.get_context("forkserver")
# at_once's processes come from the same server (one per pytest worker, the preload set before it starts).
context.set_forkserver_preload(["forked", "at_once", "train", "vocagno.score", "vocagno.selection"])


def _exit_code(code) -> int:
    """What the interpreter exits with for ``sys.exit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _as_a_fresh_interpreter() -> None:
    """The forked process is multiprocessing's main process, with no parent, and starts its own resource tracker
    when it first needs one (a run's leaked shared memory is its tracker's, which dies with its process group)."""
    from multiprocessing import process, resource_tracker

    current = process.current_process()
    current._name, current._identity, current._parent_pid, current._parent_name = "MainProcess", (), None, None
    process._parent_process = None
    tracker = resource_tracker._resource_tracker
    if tracker._fd is not None:
        os.close(tracker._fd)
    tracker._fd = tracker._pid = None


def _python_command(command) -> list[str] | None:
    """``command`` as ``[python, script, ...]`` or ``[python, -m, module, ...]`` (a console script of this
    environment, such as ``composer``, is a script), or None for any other command."""
    command = [os.fsdecode(part) if isinstance(part, bytes) else str(part) for part in command]
    if command and command[0] != sys.executable and Path(command[0]).parent == Path(sys.executable).parent:
        command = [sys.executable, *command]
    if len(command) < 2 or command[0] != sys.executable:
        return None
    if command[1] == "-m":
        return command if len(command) >= 3 else None
    return None if command[1].startswith("-") else command


def _become(command: list[str], cwd: str, env, fork_children: bool) -> None:
    """In a forked process: run ``command`` as ``python`` would, then exit as the interpreter does."""
    _as_a_fresh_interpreter()
    os.chdir(cwd)
    env = dict(env)
    os.environ.clear()
    os.environ.update(env)
    subprocess.Popen = ForkingPopen if fork_children else EXEC_POPEN
    code = 0
    try:
        if command[1] == "-m":  # python -m: the working folder first on the path, the module's file in argv[0]
            sys.argv = [command[2], *command[3:]]
            sys.path.insert(0, cwd)
            runpy.run_module(command[2], run_name="__main__", alter_sys=True)
        else:  # python script.py: the script's folder first
            sys.argv = command[1:]
            sys.path.insert(0, str(Path(command[1]).resolve().parent))
            runpy.run_path(command[1], run_name="__main__")
    except SystemExit as exit:
        code = _exit_code(exit.code)
    except BaseException:
        traceback.print_exc()
        code = 1
    try:  # the interpreter's exit: non-daemon threads joined, then the atexit handlers
        threading._shutdown()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _own_dev_shm() -> None:
    """A mount namespace of this process's own with an empty /dev/shm, as a machine of its own has (``unshare -m
    --propagation private`` and ``mount -t tmpfs tmpfs /dev/shm``, as root)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    clone_newns, ms_rec, ms_private = 0x20000, 0x4000, 0x40000
    if (libc.unshare(clone_newns) or libc.mount(b"none", b"/", None, ms_rec | ms_private, None)
            or libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", 0, b"size=2g")):
        error = ctypes.get_errno()
        raise OSError(error, f"a private /dev/shm: {os.strerror(error)}")


def _run_command(command: list[str], cwd: str, env: dict, stdout: str, stderr: str, fork_children: bool,
                 private_shm: bool) -> None:
    """The forkserver's child: a session of its own, its output into files."""
    os.setsid()
    if private_shm:
        _own_dev_shm()
    for fd, path in ((1, stdout), (2, stderr)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        os.dup2(target, fd)
        os.close(target)
    _become(command, cwd, env, fork_children)


class ForkingPopen(subprocess.Popen):
    """``subprocess.Popen`` whose ``python ...`` children are forks of this process, which has their modules imported
    (a launcher that starts ranks, before it starts any thread); other commands, or a process with threads, exec as
    usual."""

    def _execute_child(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo, creationflags,
                       shell, p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite, restore_signals, gid, gids, uid,
                       umask, start_new_session, *process_group):
        command = None if shell or preexec_fn or threading.active_count() > 1 else _python_command(args)
        if command is None:
            return super()._execute_child(args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo,
                                          creationflags, shell, p2cread, p2cwrite, c2pread, c2pwrite, errread,
                                          errwrite, restore_signals, gid, gids, uid, umask, start_new_session,
                                          *process_group)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            try:
                if start_new_session:
                    os.setsid()
                for fd in (p2cwrite, c2pread, errread):  # the parent's ends
                    if fd != -1:
                        os.close(fd)
                for target, fd in ((p2cread, 0), (c2pwrite, 1), (errwrite, 2)):
                    if target != -1:
                        os.dup2(target, fd)
                _become(command, os.fsdecode(cwd) if cwd else os.getcwd(), os.environ if env is None else env, False)
            finally:
                os._exit(1)
        self.pid = pid
        self._child_created = True
        self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)


class Forked:
    """A running command, as much of ``subprocess.Popen`` as the tests use: ``pid`` (also its process group),
    ``poll``, ``wait``, ``kill``; ``stdout`` and ``stderr`` are the files its output went to. ``fork_children``: see
    ``run``; ``private_shm``: in a mount namespace of its own with its own /dev/shm (a node of a job over several).
    """

    def __init__(self, command, cwd=None, env=None, stdout=None, stderr=None, fork_children=False, private_shm=False):
        python = _python_command(command)
        if python is None:
            raise ValueError(f"not a `python script ...` or `python -m module ...` command: {command}")
        self._folder = tempfile.TemporaryDirectory(prefix="forked-")
        self.stdout = stdout or os.path.join(self._folder.name, "stdout")
        self.stderr = stderr or os.path.join(self._folder.name, "stderr")
        self._process = context.Process(target=_run_command, args=(
            python, str(cwd or os.getcwd()), dict(os.environ if env is None else env), str(self.stdout),
            str(self.stderr), fork_children, private_shm))
        self._process.start()
        self.pid = self._process.pid

    def poll(self):
        return self._process.exitcode

    def wait(self, timeout=None):
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(self._process.name, timeout)
        return self._process.exitcode

    def kill(self):
        self._process.kill()

    def output(self, path) -> str:
        return Path(path).read_text(encoding="utf-8", errors="replace") if os.path.exists(path) else ""


def run(command, cwd=None, env=None, timeout=None, fork_children=False) -> subprocess.CompletedProcess:
    """``subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)``, forked; a run
    past ``timeout`` is killed with its process group and raises ``subprocess.TimeoutExpired``. ``fork_children``:
    the ``python ...`` processes it starts (a launcher's ranks) are forks of it too (``ForkingPopen``)."""
    process = Forked(command, cwd=cwd, env=env, fork_children=fork_children)
    try:
        code = process.wait(timeout)
    except subprocess.TimeoutExpired:
        kill_group(process.pid)
        process.wait()
        raise
    finally:
        stdout, stderr = process.output(process.stdout), process.output(process.stderr)
        process._folder.cleanup()
    return subprocess.CompletedProcess(command, code, stdout, stderr)


def kill_group(group: int) -> None:
    try:
        os.killpg(group, 9)
    except ProcessLookupError:
        pass
