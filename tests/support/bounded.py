"""Calls run in a process of their own with a ceiling on memory and time, for tests that feed a reader files an
attacker wrote: what a call allocates past the ceiling fails there (``MemoryError``), not in the pytest worker, and
a call that hangs is killed. The process is started by multiprocessing's forkserver, not forked from the pytest worker
(whose threads' locks a fork would inherit); the forkserver imports the libraries the calls use first
(``tests/conftest.py``)."""

import contextlib
import multiprocessing
import os
import resource
import signal
import time
import traceback

_context = multiprocessing.get_context("forkserver")

MEMORY = 1 << 30  # the ceiling above the process's address space at its start: the caps' allocations fit far below


class Hung(BaseException):
    """A call still running past its time (no ``except Exception`` or ``except OSError`` of the code under
    test takes it for its own error and goes on)."""


@contextlib.contextmanager
def within(seconds=60, memory=1 << 30):
    """A call in this process that must end within ``seconds`` and allocate less than ``memory`` more address space:
    a reader that blocks on a FIFO or reads /dev/zero fails the test instead of hanging it or exhausting the machine
    (cheaper than a ``Worker`` where the call is short and its imports are the test's own). The timer it takes is
    pytest-timeout's too: what was left of that one is set again after it."""
    def hung(signum, frame):
        raise Hung(f"still running after {seconds} s")

    with open("/proc/self/statm") as f:
        ceiling = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE") + memory
    limits = resource.getrlimit(resource.RLIMIT_AS)
    previous = signal.signal(signal.SIGALRM, hung)
    left, start = signal.getitimer(signal.ITIMER_REAL)[0], time.monotonic()
    resource.setrlimit(resource.RLIMIT_AS, (ceiling, limits[1]))
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        resource.setrlimit(resource.RLIMIT_AS, limits)
        signal.signal(signal.SIGALRM, previous)
        if left:  # pytest-timeout's timer: what was left of it, at least a moment
            signal.setitimer(signal.ITIMER_REAL, max(left - (time.monotonic() - start), 0.01))


class Worker:
    """A bounded process that runs calls one after another (modules imported and tokenizers loaded once, not once a
    call): ``run(target, *args)`` gives ``"ok"``, ``"refused: MESSAGE"`` for a ``Refused`` (an ``UntrustedFile``
    among them), ``"memory"``, ``"hung"`` (killed, and a new process started), ``"died (CODE)"`` or ``"error TYPE:
    MESSAGE"``. Each call may allocate ``memory`` bytes above what the process holds when it starts."""

    def __init__(self, memory: int = MEMORY):
        self.memory = memory
        self._start()

    def _start(self) -> None:
        self._connection, child = _context.Pipe()
        self._process = _context.Process(target=_serve, args=(child, self.memory))
        self._process.start()
        child.close()

    def run(self, target, *args, timeout: float = 120.0) -> str:
        self._connection.send((target, args))
        if not self._connection.poll(timeout):
            self._restart()
            return "hung"
        try:
            return self._connection.recv()
        except EOFError:
            code = self._process.exitcode
            self._restart()
            return f"died ({code})"

    def _restart(self) -> None:
        self._process.kill()
        self._process.join()
        self._start()

    def close(self) -> None:
        self._connection.send(None)
        self._process.join(30)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()


def run_bounded(target, *args, memory: int = MEMORY, timeout: float = 120.0) -> str:
    """``target(*args)`` (a function of this module) in a bounded process of its own (``Worker.run``'s outcomes)."""
    worker = Worker(memory)
    try:
        return worker.run(target, *args, timeout=timeout)
    finally:
        worker.close()


def _serve(connection, memory) -> None:
    while True:
        try:
            call = connection.recv()
        except EOFError:
            return
        if call is None:
            return
        target, args = call
        connection.send(_outcome(target, args, memory))


def _outcome(target, args, memory) -> str:
    from vocagno.errors import Refused

    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[0])
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (pages * os.sysconf("SC_PAGE_SIZE") + memory, hard))
    try:
        target(*args)
        return "ok"
    except Refused as error:
        return f"refused: {error}"
    except SystemExit as error:
        return f"exit {error.code}"
    except MemoryError:
        return "memory"
    except BaseException as error:  # what the test asserts about
        lines = traceback.format_exception_only(type(error), error)
        return "memory" if "alloc" in str(error).lower() else f"error {''.join(lines).strip()}"
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (hard, hard))


def read_shards(folder, remote=None) -> None:
    """Every sample of a shard folder through the training reader, then its memory let go."""
    import gc

    from vocagno.data.dataset import TeacherGuidedDataset

    dataset = TeacherGuidedDataset(local=str(folder), remote=remote, batch_size=1)
    try:
        for i in range(len(dataset)):
            dataset[i]
    finally:
        del dataset
        gc.collect()


def inspect_shards(folder) -> None:
    from vocagno.inspect import main

    code = main(["--shards", str(folder), "--index", "0"])
    if code:
        raise SystemExit(code)


def convert(arguments) -> None:
    import sys

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from vocagno.conversion.convert import main as convert_main

    code = convert_main(arguments)
    if code:
        raise SystemExit(code)


def load_checkpoint_model(path) -> None:
    """The model and tokenizer of a checkpoint, as export and ``vocagno.eval --model`` load them."""
    from vocagno.training.checkpoint import model_from_checkpoint

    model_from_checkpoint(str(path))
