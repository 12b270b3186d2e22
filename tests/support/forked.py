"""Commands (``python train.py ...``, ``python -m vocagno.score ...``) run as processes forked from a server that
imported train.py's modules once (torch, Composer, Streaming, transformers: about 7 s of CPU a fresh interpreter
spends before its first line of work), instead of a fresh interpreter each.

A run is still a process of its own, as close to ``python ...`` as a fork gets: its own session (a process group to
kill whole), working folder, environment, ``sys.path`` and ``sys.argv``, stdout and stderr (unbuffered under
``PYTHONUNBUFFERED``), default signal handlers, multiprocessing's own state, exit code, and the exit a script gets
(its non-daemon threads joined, its atexit handlers run). What a fork can't give: modules the server imported stay
imported (``PREIMPORTED``, all installed packages, importable by a fresh interpreter too), with what they read from
the environment when imported (the pytest worker's: one torch thread, Hugging Face offline). Its processes started
with multiprocessing's spawn are forks of a forkserver of its own: one fresh interpreter a run, which imports the
run's script as each spawned process would.

The server is multiprocessing's forkserver, a clean interpreter, not the pytest worker: a fork of the worker
inherits the threads and locks its earlier tests left, and a lock some thread held at the fork stays held in the
child for good. What only a fresh interpreter shows (what a module
imports, ``torchrun``) keeps ``subprocess``."""

import atexit
import io
import json
import logging
import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import weakref
from pathlib import Path

EXEC_POPEN = subprocess.Popen
# Installed modules (the server's path is a fresh interpreter's, not the tests'): what train.py, the scoring pass,
# the selection report and Composer's launcher import.
PREIMPORTED = ["torch", "transformers", "streaming", "composer", "composer.cli.launcher", "omegaconf",
               "vocagno.algorithms.vocagno_lm", "vocagno.algorithms.baselines", "vocagno.training.config",
               "vocagno.data.dataset", "vocagno.data.streaming", "vocagno.training.checkpoint",
               "vocagno.training.loggers", "vocagno.training.metrics", "vocagno.core.fsdp", "vocagno.teacher.scoring",
               "vocagno.score", "vocagno.selection"]
context = multiprocessing.get_context("forkserver")
context.set_forkserver_preload(PREIMPORTED)  # at_once's processes come from the same server
_live: set["Forked"] = set()
_root_handlers: list = []  # the root logger's handlers when a run starts
_fresh_path: list[str] = []  # set in the tests' process, and in a run for the runs it forks


def fresh_path() -> list[str]:
    """``sys.path`` of a fresh interpreter without PYTHONPATH, less its first entry (the script's folder)."""
    if not _fresh_path:
        env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
        out = subprocess.run([sys.executable, "-c", "import json, sys; print(json.dumps(sys.path[1:]))"], env=env,
                             capture_output=True, text=True, check=True).stdout
        _fresh_path[:] = json.loads(out)
    return _fresh_path


def _exit_code(code) -> int:
    """What the interpreter exits with for ``sys.exit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _as_a_fresh_interpreter(env: dict) -> None:
    """What the forked process inherited of the process it was forked from, as a fresh interpreter has it: default
    signal handlers, no finalizers of the parent's objects (a launcher's temporary folders), stdout and stderr on
    fds 1 and 2, multiprocessing's main process with no parent, its default start method, its own resource tracker
    and forkserver when it first needs them (a run's leaked shared memory is its tracker's, which dies with its
    process group)."""
    from multiprocessing import forkserver, process, resource_tracker, util

    for number in signal.valid_signals():  # CPython's own at start; a measuring coverage's SIGTERM handler stays
        handler = signal.getsignal(number)
        if callable(handler) and not getattr(handler, "__module__", "").startswith("coverage"):
            signal.signal(number, signal.default_int_handler if number == signal.SIGINT else signal.SIG_DFL)
    for number in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(number, signal.SIG_IGN)
    weakref.finalize._registry.clear()
    util._finalizer_registry.clear()
    logging.root.handlers[:] = _root_handlers  # those a launcher's logging.basicConfig added go
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    for name, fd in (("stdout", 1), ("stderr", 2)):
        raw = io.FileIO(fd, "w", closefd=False)
        stream = io.TextIOWrapper(raw if unbuffered else io.BufferedWriter(raw), encoding="utf-8",
                                  errors="backslashreplace" if name == "stderr" else "strict",
                                  line_buffering=name == "stderr" or raw.isatty(), write_through=unbuffered)
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
    current = process.current_process()
    current._name, current._identity, current._parent_pid, current._parent_name = "MainProcess", (), None, None
    process._parent_process = None
    process._children.clear()  # the launcher's, which a rank's exit would otherwise terminate
    process.ORIGINAL_DIR = os.getcwd()
    multiprocessing.context._default_context._actual_context = None
    tracker = resource_tracker._resource_tracker
    if tracker._fd is not None:
        os.close(tracker._fd)
    tracker._fd = tracker._pid = None
    server = forkserver._forkserver
    if server._forkserver_alive_fd is not None:
        os.close(server._forkserver_alive_fd)
    server._forkserver_address = server._forkserver_alive_fd = server._forkserver_pid = None
    server._inherited_fds = None
    server._preload_modules = ["__main__", *PREIMPORTED]  # Python 3.11 preloads no __main__ (spawn names it otherwise)
    # Its spawn is its forkserver (Composer's uploaders: four a run saving to a store, each a fresh interpreter importing
    # the run's script again, 8 s of CPU): one fresh interpreter a run, whose forks are in the run's process group.
    multiprocessing.context._concrete_contexts["spawn"] = multiprocessing.context._concrete_contexts["forkserver"]


def _python_command(command) -> list[str] | None:
    """``command`` as ``[python, script, ...]`` or ``[python, -m, module, ...]`` (a Python console script of this
    environment, such as ``composer``, is a script), or None for any other command."""
    command = [os.fsdecode(part) if isinstance(part, bytes) else str(part) for part in command]
    if command and command[0] != sys.executable and Path(command[0]).parent == Path(sys.executable).parent:
        try:
            with open(command[0], "rb") as script:
                first = script.readline(200)
        except OSError:
            return None
        if not (first.startswith(b"#!") and b"python" in first):
            return None
        command = [sys.executable, *command]
    if len(command) < 2 or command[0] != sys.executable:
        return None
    if command[1] == "-m":
        return command if len(command) >= 3 else None
    return None if command[1].startswith("-") else command


def _become(command: list[str], cwd: str, env: dict, fork_children: bool) -> None:
    """In a forked process, its fds 0-2 set: run ``command`` as ``python`` would, then exit as the interpreter does."""
    code = 0
    try:
        os.chdir(cwd)
        _as_a_fresh_interpreter(env)
        os.environ.clear()
        os.environ.update(env)
        subprocess.Popen = ForkingPopen if fork_children else EXEC_POPEN
        python_path = [entry for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry]
        if command[1] == "-m":  # python -m: the working folder first, the module run as __main__ only
            sys.argv = [command[2], *command[3:]]
            sys.path[:] = [os.getcwd(), *python_path, *_fresh_path]
            if not hasattr(sys.modules.get(command[2]), "__path__"):  # preloaded: python -m has not imported it
                sys.modules.pop(command[2], None)
            runpy.run_module(command[2], run_name="__main__", alter_sys=True)
        else:  # python script.py: the script's folder first
            sys.argv = command[1:]
            if not os.path.exists(command[1]):
                print(f"{sys.executable}: can't open file {os.path.abspath(command[1])!r}: [Errno 2] No such file "
                      "or directory", file=sys.stderr)
                raise SystemExit(2)
            sys.path[:] = [str(Path(command[1]).resolve().parent), *python_path, *_fresh_path]
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


def _run_command(command: list[str], cwd: str, env: dict, stdout: str, stderr: str, fork_children: bool,
                 private_shm: bool, path: list[str]) -> None:
    """The forkserver's child: a session of its own, its output into files."""
    os.setsid()
    _fresh_path[:] = path
    _root_handlers[:] = logging.root.handlers
    sys.stdout.flush()  # what the server printed goes to the server's output, not the run's
    sys.stderr.flush()
    for fd, output in ((1, stdout), (2, stderr)):
        target = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(target, fd)
        os.close(target)
    if private_shm:
        try:
            _own_dev_shm()
        except OSError:
            traceback.print_exc()
            os._exit(1)
    _become(command, cwd, env, fork_children)


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


def _cuda_initialized() -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and torch.cuda.is_initialized()


class ForkingPopen(subprocess.Popen):
    """``subprocess.Popen`` whose ``python ...`` children are forks of this process, which has their modules imported
    (a launcher that starts ranks, before it starts any thread); other commands, or a process with threads, exec as
    usual. Unlike exec it keeps the parent's other file descriptors open in the child (closing them would leave the
    parent's objects that own them closing numbers reused since)."""

    def _execute_child(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo, creationflags,
                       shell, p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite, restore_signals, gid, gids, uid,
                       umask, start_new_session, *process_group):
        plain = not (shell or preexec_fn or executable or threading.active_count() > 1 or _cuda_initialized())
        command = _python_command(args) if plain and isinstance(args, (list, tuple)) else None
        if command is None or gid is not None or gids is not None or uid is not None or umask >= 0 \
                or process_group[:1] not in ((), (None,), (-1,)):
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
                # As _posixsubprocess: move the child's ends off 0-2 first, so dup2 in order does not clobber them.
                if c2pwrite == 0:
                    c2pwrite = os.dup(c2pwrite)
                while errwrite in (0, 1):
                    errwrite = os.dup(errwrite)
                ends = [(p2cread, 0), (c2pwrite, 1), (errwrite, 2)]
                for target, fd in ends:
                    if target != -1 and target != fd:
                        os.dup2(target, fd)
                for target in {target for target, _ in ends if target > 2}:
                    os.close(target)
                child_cwd = os.fsdecode(cwd) if cwd else os.getcwd()
                _become(command, child_cwd, dict(os.environ if env is None else env), False)
            finally:
                os._exit(1)
        self.pid = pid
        self._child_created = True
        self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)


class Forked:
    """A running command, as much of ``subprocess.Popen`` as the tests use: ``pid`` (also its process group),
    ``poll``, ``wait``, ``kill``; ``stdout`` and ``stderr`` are the files its output went to. ``fork_children``: see
    ``run``; ``private_shm``: in a mount namespace of its own with its own /dev/shm (a node of a job over several).
    It returns once the run leads its process group, so that killing the group reaches it."""

    def __init__(self, command, cwd=None, env=None, stdout=None, stderr=None, fork_children=False, private_shm=False):
        python = _python_command(command)
        if python is None:
            raise ValueError(f"not a `python script ...` or `python -m module ...` command: {command}")
        self.args = command
        self._folder = tempfile.TemporaryDirectory(prefix="forked-")
        self.stdout = stdout or os.path.join(self._folder.name, "stdout")
        self.stderr = stderr or os.path.join(self._folder.name, "stderr")
        self._process = context.Process(target=_run_command, args=(
            python, os.path.abspath(cwd or os.getcwd()), dict(os.environ if env is None else env), str(self.stdout),
            str(self.stderr), fork_children, private_shm, fresh_path()))
        self._process.start()
        self.pid = self._process.pid
        _live.add(self)
        while self._process.exitcode is None:
            try:
                if os.getpgid(self.pid) == self.pid:
                    break
            except ProcessLookupError:
                break
            time.sleep(0.001)

    def poll(self):
        code = self._process.exitcode
        if code is not None:
            _live.discard(self)
        return code

    def wait(self, timeout=None):
        self._process.join(timeout)
        if self.poll() is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self._process.exitcode

    def kill(self):
        self._process.kill()

    def outputs(self) -> tuple[str, str]:
        """What it wrote to stdout and to stderr, so far."""
        return tuple(Path(path).read_text(encoding="utf-8", errors="replace") if os.path.exists(path) else ""
                     for path in (self.stdout, self.stderr))


def run(command, cwd=None, env=None, timeout=None, fork_children=False) -> subprocess.CompletedProcess:
    """``subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)``, forked; a run
    past ``timeout``, or whose wait is interrupted, is killed with its process group. ``fork_children``: the
    ``python ...`` processes it starts (a launcher's ranks) are forks of it too (``ForkingPopen``)."""
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


@atexit.register
def _kill_live_groups() -> None:
    """A worker that ends (interrupted, crashed) takes its runs with it: each has a session of its own, which no
    Ctrl-C at a terminal reaches."""
    for run in list(_live):
        if run.poll() is None:
            kill_group(run.pid)
