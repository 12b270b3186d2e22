"""The server ``forked`` runs commands from: a fresh interpreter that imported train.py's modules once (torch,
Composer, Streaming, transformers: about 7 s of CPU a fresh interpreter spends before its first line of work) and then
forks one process per command, which runs the command as its main program.

``python fork_server.py FOLDER`` listens on ``FOLDER/server.sock``; it ends when its standard input closes (the pytest
worker that started it is gone). A request is one message (``send``): the command, its working folder, its
environment, and the file descriptors it gets (at the numbers it gets them).

- The server forks a *manager* per run: the leader of a session of its own (and of a mount namespace with its own
  /dev/shm when asked, as a node of a job over several machines has), which forks the run and serves the run's own
  ``python ...`` processes (a launcher's ranks, multiprocessing's spawn) on ``FOLDER/<manager pid>.sock``, through
  ``fork_shim``: each is forked by the manager and joins the process group of the shim that asked for it, so that
  killing the run's process group kills them too, as it kills a launcher's ranks.
- A command's process leaves the server's loop and runs the command from this module's main: when the command ends,
  the interpreter ends as it ends a script (its non-daemon threads joined, its atexit handlers run, ``SystemExit``'s
  code), and nothing of the server's stays open in it.
- The manager reports each process's exit status to whoever asked for it; when the run ends it kills what it forked
  for the run and is still alive, then reports the run's status, and ends. A client that goes away (its connection
  closed) has its process killed.

Nothing here touches a private attribute of CPython or of the standard library."""

import fcntl
import io
import json
import os
import runpy
import select
import signal
import socket
import struct
import sys
import types

# What train.py, the scoring pass, the selection report and Composer's launcher import.
PREIMPORTED = ["torch", "transformers", "streaming", "composer", "composer.cli.launcher", "omegaconf",
               "vocagno.algorithms.vocagno_lm", "vocagno.algorithms.baselines", "vocagno.training.config",
               "vocagno.data.dataset", "vocagno.data.streaming", "vocagno.training.checkpoint",
               "vocagno.training.loggers", "vocagno.training.metrics", "vocagno.core.fsdp", "vocagno.teacher.scoring",
               "vocagno.score", "vocagno.selection"]
# File descriptors 3..RESERVED-1 are held on /dev/null while the modules import, so that no module's own file takes a
# number a command is to get (a launcher's ranks get their files at the numbers the launcher had them at).
RESERVED = 64
HEADER = struct.Struct("!I")
MAX_FDS = 64


def send(conn: socket.socket, message: dict, fds=()) -> None:
    """One message: its length with the file descriptors, then its JSON."""
    data = json.dumps(message).encode()
    socket.send_fds(conn, [HEADER.pack(len(data))], list(fds))
    conn.sendall(data)


def receive(conn: socket.socket) -> tuple[dict | None, list[int]]:
    """One message and the file descriptors sent with it; (None, []) at the end of the connection."""
    header, fds, _, _ = socket.recv_fds(conn, HEADER.size, MAX_FDS)
    while header and len(header) < HEADER.size:
        more = conn.recv(HEADER.size - len(header))
        if not more:
            break
        header += more
    if len(header) < HEADER.size:
        for fd in fds:
            os.close(fd)
        return None, []
    (length,) = HEADER.unpack(header)
    data = b""
    while len(data) < length:
        more = conn.recv(length - len(data))
        if not more:
            raise EOFError("a request cut short")
        data += more
    return json.loads(data), fds


def serve(folder: str, fresh_path: list[str]) -> dict:
    """The server's loop; it returns only in a process forked to run a command: that command's request."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(os.path.join(folder, "server.sock"))
    listener.listen(64)
    while True:
        readable, _, _ = select.select([listener, 0], [], [], 1.0)
        if 0 in readable and not os.read(0, 1024):
            os._exit(0)  # the worker that started the server is gone; each manager ends with its own client
        while True:  # the managers that ended
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
        if listener in readable:
            conn, _ = listener.accept()
            request, fds = receive(conn)
            if request is None:
                conn.close()
                continue
            if os.fork() == 0:
                listener.close()
                return Manager(folder, fresh_path).run(conn, request, fds)
            conn.close()
            for fd in fds:
                os.close(fd)


class Manager:
    """One run's processes: the run and those the run asked for through ``fork_shim``."""

    def __init__(self, folder: str, fresh_path: list[str]):
        self.folder = folder
        self.fresh_path = fresh_path
        self.clients: dict[int, socket.socket] = {}  # pid -> the connection of whoever asked for it
        self.pidfds: dict[int, int] = {}  # pidfd -> pid

    def run(self, conn: socket.socket, request: dict, fds: list[int]) -> dict:
        """The manager's loop; it returns only in a process forked to run a command: that command's request."""
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)  # not the server's pipe from the worker
        os.close(null)
        if request.get("private_shm"):
            try:
                own_dev_shm()
            except OSError as error:
                send(conn, {"error": str(error)})
                os._exit(1)
        path = os.path.join(self.folder, f"{os.getpid()}.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(64)
        root = None
        gone: set[socket.socket] = set()  # clients that went away, whose processes were killed
        pending = [(conn, request, fds)]
        while True:
            for client, asked, received in pending:
                pid = os.fork()
                if pid == 0:
                    for sock in (listener, *self.clients.values(), *(other for other, _, _ in pending)):
                        sock.close()
                    for pidfd in self.pidfds:
                        os.close(pidfd)
                    for _, _, others in pending:
                        for fd in others:
                            if fd not in received:
                                os.close(fd)
                    return self.become(asked, received, leader=root is None)
                try:
                    os.setpgid(pid, pid if root is None else asked.get("pgid", pid))
                except OSError:  # another session's group (the shim's Popen started one), or the child got there
                    pass
                for fd in received:
                    os.close(fd)
                root = pid if root is None else root
                self.clients[pid] = client
                self.pidfds[os.pidfd_open(pid)] = pid
                send(client, {"pid": pid})
            pending = []
            watched = [listener, *(client for client in self.clients.values() if client not in gone), *self.pidfds]
            for ready in select.select(watched, [], [])[0]:
                if ready is listener:
                    client, _ = listener.accept()
                    try:
                        asked, received = receive(client)
                    except (EOFError, OSError, ValueError):
                        asked = None
                    if asked is None:
                        client.close()
                    else:
                        pending.append((client, asked, received))
                elif isinstance(ready, int):
                    pid = self.pidfds.pop(ready)
                    os.close(ready)
                    _, status = os.waitpid(pid, 0)
                    client = self.clients.pop(pid)
                    if pid == root:  # the run ended: what it left of ours goes first, then its status
                        self.end(listener, path)
                    try:
                        send(client, {"status": os.waitstatus_to_exitcode(status)})
                    except OSError:
                        pass
                    gone.discard(client)
                    client.close()
                    if pid == root:
                        os._exit(0)
                elif not ready.recv(1, socket.MSG_PEEK):  # a client that went away: its process goes too
                    gone.add(ready)
                    pid = next(pid for pid, client in self.clients.items() if client is ready)
                    kill(pid, group=pid == root)

    def end(self, listener: socket.socket, path: str) -> None:
        listener.close()
        os.unlink(path)
        for pidfd, pid in list(self.pidfds.items()):
            kill(pid)
            os.waitpid(pid, 0)
            os.close(pidfd)
            self.clients.pop(pid).close()

    def become(self, request: dict, fds: list[int], leader: bool) -> dict:
        """In the forked process: its process group, its file descriptors, working folder, environment, standard
        streams, ``sys.path``, ``sys.argv``; its multiprocessing's spawn and (``fork_children``) its ``python ...``
        subprocesses through ``fork_shim``."""
        if leader:
            os.setpgid(0, 0)
        else:
            try:
                os.setpgid(0, request.get("pgid", 0))
            except OSError:
                os.setpgid(0, 0)
        place(fds, request["fds"])
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
        for name, fd in (("stdout", 1), ("stderr", 2)):
            raw = io.FileIO(fd, "w", closefd=False)
            stream = io.TextIOWrapper(raw if unbuffered else io.BufferedWriter(raw), encoding="utf-8",
                                      errors="backslashreplace" if name == "stderr" else "strict",
                                      line_buffering=name == "stderr" or raw.isatty(), write_through=unbuffered)
            setattr(sys, name, stream)
            setattr(sys, f"__{name}__", stream)
        shim = os.path.join(self.folder, "python")
        import multiprocessing
        import subprocess

        multiprocessing.set_executable(shim)  # spawn, forkserver and the resource tracker: forks of this manager
        if request.get("fork_children"):
            subprocess.Popen = forking_popen(subprocess.Popen, shim)
        argv = request["argv"]
        python_path = [entry for entry in request["env"].get("PYTHONPATH", "").split(os.pathsep) if entry]
        if argv[1] == "-m":
            sys.path[:] = [os.getcwd(), *python_path, *self.fresh_path]
        elif argv[1] == "-c":
            sys.path[:] = ["", *python_path, *self.fresh_path]
        else:
            sys.path[:] = [os.path.dirname(os.path.abspath(argv[1])), *python_path, *self.fresh_path]
        return request


def place(fds: list[int], targets: list[int]) -> None:
    """The received file descriptors at the numbers they were sent from; the reserved numbers not taken closed."""
    above = max([RESERVED, *targets]) + 1
    moved = []
    for fd in fds:  # first out of the way of every target
        moved.append(fcntl.fcntl(fd, fcntl.F_DUPFD, above))
        os.close(fd)
    for target in targets:
        if target >= RESERVED:
            try:
                os.fstat(target)
            except OSError:
                continue
            print(f"fork_server: file descriptor {target} is taken by a preimported module", file=sys.stderr)
            os._exit(1)
    for fd, target in zip(moved, targets):
        os.dup2(fd, target)
    for fd in moved:
        os.close(fd)
    for fd in range(3, RESERVED):
        if fd not in targets:
            try:
                os.close(fd)
            except OSError:
                pass


def forking_popen(popen: type, shim: str) -> type:
    """``subprocess.Popen`` whose ``python ...`` commands go through ``shim`` (their process: a fork of the run's
    manager, in the shim's process group); any other command runs as it is."""

    class ForkingPopen(popen):
        def __init__(self, args, *rest, **kwargs):
            command = python_command(args) if isinstance(args, (list, tuple)) and not rest else None
            if command is not None and not kwargs.get("shell") and kwargs.get("executable") is None:
                args = [shim, *command[1:]]
            super().__init__(args, *rest, **kwargs)

    return ForkingPopen


def python_command(command) -> list[str] | None:
    """``command`` as ``[python, script, ...]``, ``[python, -m, module, ...]`` or ``[python, -c, code, ...]`` (a
    Python console script of this environment, such as ``composer``, is a script), or None for any other command."""
    command = [os.fsdecode(part) if isinstance(part, bytes) else str(part) for part in command]
    if command and command[0] != sys.executable and os.path.dirname(command[0]) == os.path.dirname(sys.executable):
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
    if command[1] in ("-m", "-c"):
        return command if len(command) >= 3 else None
    return None if command[1].startswith("-") else command


def kill(pid: int, group: bool = False) -> None:
    try:
        (os.killpg if group else os.kill)(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def own_dev_shm() -> None:
    """A mount namespace of this process's own with an empty /dev/shm, as a machine of its own has (``unshare -m
    --propagation private`` and ``mount -t tmpfs tmpfs /dev/shm``, as root)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    clone_newns, ms_rec, ms_private = 0x20000, 0x4000, 0x40000
    if (libc.unshare(clone_newns) or libc.mount(b"none", b"/", None, ms_rec | ms_private, None)
            or libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", 0, b"size=2g")):
        error = ctypes.get_errno()
        raise OSError(error, f"a private /dev/shm: {os.strerror(error)}")


def run(argv: list[str]) -> None:
    """``python ...``'s main program: a script, ``-m module`` or ``-c code``."""
    if argv[1] == "-m":
        sys.argv = [argv[2], *argv[3:]]
        if not hasattr(sys.modules.get(argv[2]), "__path__"):  # preimported: python -m has not imported it
            sys.modules.pop(argv[2], None)
        runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
    elif argv[1] == "-c":
        sys.argv = ["-c", *argv[3:]]
        main = types.ModuleType("__main__")
        sys.modules["__main__"] = main
        exec(compile(argv[2], "<string>", "exec"), main.__dict__)
    else:
        sys.argv = argv[1:]
        if not os.path.exists(argv[1]):
            print(f"{sys.executable}: can't open file {os.path.abspath(argv[1])!r}: [Errno 2] No such file or "
                  "directory", file=sys.stderr)
            raise SystemExit(2)
        runpy.run_path(argv[1], run_name="__main__")


def main() -> None:
    folder = sys.argv[1]
    fresh_path = sys.path[1:]  # a fresh interpreter's, less the script's folder (started without PYTHONPATH)
    placeholders = []
    while True:
        fd = os.open(os.devnull, os.O_RDONLY)
        if fd >= RESERVED:
            os.close(fd)
            break
        placeholders.append(fd)
    import importlib

    for name in PREIMPORTED:
        importlib.import_module(name)
    run(serve(folder, fresh_path)["argv"])


if __name__ == "__main__":
    main()
