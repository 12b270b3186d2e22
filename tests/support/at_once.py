"""Several processes let go at the same moment, as the ranks or jobs of one node start: each started by
multiprocessing's forkserver, not forked from the pytest worker. A fork of the worker inherits the threads and locks
that the tests it ran before left (Streaming's threads, torch's, execnet's): a lock some thread held at the fork stays
held in the child for good, and the child hangs on it. The forkserver imports the libraries the calls use first
(``tests/conftest.py``)."""

import multiprocessing

_context = multiprocessing.get_context("forkserver")


def run_at_once(target, args_per_process, timeout: float = 120.0) -> list[int]:
    """Run ``target(barrier, *args)`` (a function of this module) in one process per args, all let go at once; exit
    codes (-9: hung past ``timeout`` and killed, so that nothing outlives the test)."""
    barrier = _context.Barrier(len(args_per_process))
    processes = [_context.Process(target=target, args=(barrier, *args)) for args in args_per_process]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout)
        if process.is_alive():
            process.kill()
            process.join()
    return [process.exitcode for process in processes]


def write_many(barrier, path, text):
    from vocagno.doors.writing import write_atomically

    barrier.wait()
    for _ in range(200):
        write_atomically(path, text)


def read_metadata_of(barrier, local, remote):
    from vocagno.data.dataset import read_metadata

    barrier.wait()
    read_metadata(str(local), str(remote))


def open_dataset(barrier, local, remote):
    from vocagno.data.dataset import TeacherGuidedDataset

    barrier.wait()
    TeacherGuidedDataset(local=str(local), remote=str(remote), batch_size=1)
