"""``python`` for a run of ``fork_server``: the executable its ``python ...`` subprocesses (a launcher's ranks, with
``fork_children``) and its multiprocessing spawn start. It asks the run's manager to fork the command (a fork of a
server that imported torch and the rest once) with this process's file descriptors, stands for that process to its
parent (signals passed on, its exit status its own) and ends with it. Anything it can't pass on (other interpreter
options than ``-B`` and ``-u``, no manager among its ancestors) it runs with the real ``python``. Standard library
only: it starts with ``python -S``."""

import json
import os
import signal
import socket
import struct
import sys

HEADER = struct.Struct("!I")  # fork_server's messages
PASSED_ON = (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT)


def manager(folder: str) -> socket.socket | None:
    """A connection to the manager of the run this process descends from."""
    pid = os.getppid()
    while pid > 1:
        path = os.path.join(folder, f"{pid}.sock")
        if os.path.exists(path):
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                conn.connect(path)
                return conn
            except OSError:
                conn.close()
                return None
        try:
            with open(f"/proc/{pid}/stat", encoding="utf-8") as stat:
                pid = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return None
    return None


def receive(conn: socket.socket) -> dict | None:
    data = b""
    while len(data) < HEADER.size:
        more = conn.recv(HEADER.size - len(data))
        if not more:
            return None
        data += more
    (length,) = HEADER.unpack(data)
    data = b""
    while len(data) < length:
        more = conn.recv(length - len(data))
        if not more:
            return None
        data += more
    return json.loads(data)


def main(folder: str, python: str) -> None:
    argv = sys.argv[1:]
    env = dict(os.environ)
    while argv[:1] in (["-B"], ["-u"]):  # multiprocessing passes the interpreter's own options on (PYTHON* settings)
        if argv.pop(0) == "-u":
            env["PYTHONUNBUFFERED"] = "1"
    plain = bool(argv) and (argv[0] in ("-m", "-c") and len(argv) >= 2 or not argv[0].startswith("-"))
    conn = manager(folder) if plain else None
    if conn is None:
        os.execv(python, [python, *sys.argv[1:]])
    fds = sorted(int(name) for name in os.listdir("/proc/self/fd") if int(name) != conn.fileno())
    fds = [fd for fd in fds if _is_open(fd)]
    request = {"argv": [python, *argv], "cwd": os.getcwd(), "env": env, "fds": fds,
               "pgid": os.getpgid(0)}
    data = json.dumps(request).encode()
    socket.send_fds(conn, [HEADER.pack(len(data))], fds)
    conn.sendall(data)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in fds:  # the process has them now; a pipe's end left open here would keep its reader from its end
        if fd > 2:
            os.close(fd)
        elif fd != null:
            os.dup2(null, fd)
    started = receive(conn)
    if started is None or "pid" not in started:
        sys.exit(1)
    pid = started["pid"]
    for number in PASSED_ON:
        signal.signal(number, lambda number, _: _pass_on(pid, number))
    # Ctrl-C reaches the process through its process group when it shares this one's
    in_group = _group(pid) == os.getpgid(0)
    signal.signal(signal.SIGINT, signal.SIG_IGN if in_group else lambda number, _: _pass_on(pid, number))
    ended = receive(conn)
    code = ended["status"] if ended and "status" in ended else -signal.SIGKILL
    if code >= 0:
        os._exit(code)
    signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
    os._exit(128 - code)


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _group(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _pass_on(pid: int, number: int) -> None:
    try:
        os.kill(pid, number)
    except ProcessLookupError:
        pass
