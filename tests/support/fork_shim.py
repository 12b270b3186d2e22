"""``python`` for a run of ``fork_server``: the executable its ``python ...`` subprocesses (a launcher's ranks, with
``fork_children``) and its multiprocessing spawn start. It asks the run's manager to fork the command (a fork of a
server that imported torch and the rest once) with this process's file descriptors and process state (umask, CPU
affinity, resource limits, niceness, blocked and ignored signals), stands for that process to its parent (signals
passed on, its exit status its own) and ends with it. What it can't pass on (other interpreter options than ``-B``
and ``-u``, more file descriptors than a message carries, an environment the interpreter reads at start that differs
from the server's, no manager among its ancestors) it runs with the real ``python``. A SIGINT sent to it alone is not
passed on where the process shares its process group: Ctrl-C at a terminal reaches that group whole. Standard library
only: it starts with ``python -S``."""

import os
import signal
import socket
import sys

from fork_server import MAX_FDS, process_state, python_command, receive, send

PASSED_ON = (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT)


def manager(folder: str) -> socket.socket | None:
    """A connection to the manager of the run this process descends from (the nearest ancestor with a socket)."""
    pid = os.getppid()
    while pid > 1:
        path = os.path.join(folder, f"{pid}.sock")
        if os.path.exists(path):
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                conn.connect(path)
                return conn
            except OSError:  # a manager that ended: its run's descendants may have another further up
                conn.close()
        try:
            with open(f"/proc/{pid}/stat", encoding="utf-8") as stat:
                pid = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return None
    return None


def main(folder: str, python: str) -> None:
    argv = sys.argv[1:]
    env = dict(os.environ)
    while argv[:1] in (["-B"], ["-u"]):  # multiprocessing passes the interpreter's own options on (PYTHON* settings)
        if argv.pop(0) == "-u":
            env["PYTHONUNBUFFERED"] = "1"
    command = python_command([python, *argv])  # what the server can run: a script, -m module or -c code
    fds = sorted(int(name) for name in os.listdir("/proc/self/fd"))
    conn = manager(folder) if command is not None else None
    fds = [fd for fd in fds if conn is not None and fd != conn.fileno() and _is_open(fd)]
    if conn is None or len(fds) > MAX_FDS:
        os.execv(python, [python, *sys.argv[1:]])
    send(conn, {"argv": command, "cwd": os.getcwd(), "env": env, "fds": fds, "pgid": os.getpgid(0),
                "state": process_state()}, fds)
    started, _ = receive(conn)
    if started is None or "pid" not in started:  # not forked: the real python, with the same file descriptors
        conn.close()
        os.execv(python, [python, *sys.argv[1:]])
    null = os.open(os.devnull, os.O_RDWR)
    for fd in fds:  # the process has them now; a pipe's end left open here would keep its reader from its end
        if fd > 2:
            os.close(fd)
        else:
            os.dup2(null, fd)
    pid = started["pid"]
    for number in PASSED_ON:
        signal.signal(number, lambda number, _: _pass_on(pid, number))
    in_group = _group(pid) == os.getpgid(0)
    signal.signal(signal.SIGINT, signal.SIG_IGN if in_group else lambda number, _: _pass_on(pid, number))
    try:
        ended, _ = receive(conn)
    except OSError:
        ended = None
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
