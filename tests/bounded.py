"""A call run in a process of its own with a ceiling on its memory and its time, for tests that feed a reader files an
attacker wrote: what it allocated past the ceiling fails there (``MemoryError``), not in the pytest worker, and a call
that hangs is killed. The process is forked from ``forked``'s server, not from the pytest worker (whose threads'
locks a fork would inherit)."""

import json
import os
import resource
import tempfile
import traceback

from forked import context as _context

MEMORY = 1 << 30  # the ceiling above the process's address space at its start: the caps' allocations fit far below


def run_bounded(target, *args, memory: int = MEMORY, timeout: float = 120.0) -> str:
    """``target(*args)`` (a function of this module) in a bounded process: ``"ok"``, ``"refused: MESSAGE"`` for an
    ``UntrustedFile`` or a ``SystemExit`` with a message, ``"memory"``, ``"hung"``, or ``"error TYPE: MESSAGE"``."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        process = _context.Process(target=_bounded, args=(target, args, memory, out.name))
        process.start()
        process.join(timeout)
        if process.is_alive():
            process.kill()
            process.join()
            return "hung"
        with open(out.name, encoding="utf-8") as f:
            text = f.read()
        return json.loads(text) if text else f"died ({process.exitcode})"


def _bounded(target, args, memory, out) -> None:
    from vocagno.untrusted import UntrustedFile

    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[0])
    ceiling = pages * os.sysconf("SC_PAGE_SIZE") + memory
    resource.setrlimit(resource.RLIMIT_AS, (ceiling, ceiling))
    try:
        target(*args)
        outcome = "ok"
    except UntrustedFile as error:
        outcome = f"refused: {error}"
    except SystemExit as error:
        outcome = f"refused: {error.code}" if isinstance(error.code, str) else f"exit {error.code}"
    except MemoryError:
        outcome = "memory"
    except BaseException as error:  # what the test asserts about
        lines = traceback.format_exception_only(type(error), error)
        outcome = "memory" if "alloc" in str(error).lower() else f"error {''.join(lines).strip()}"
    with open(out, "w", encoding="utf-8") as f:
        json.dump(outcome, f)


def read_shards(folder, remote=None) -> None:
    """Every sample of a shard folder through the training reader, then its memory let go."""
    import gc

    from vocagno.data import TeacherGuidedDataset

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

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from conversion import convert_dataset

    code = convert_dataset.main(arguments)
    if code:
        raise SystemExit(code)
