"""What the private copy of a checkpoint costs a run that loads one (autoresume, ``load_path``): time and disk.

    python benchmarks/bench_private_copy.py [--gib 13.2] [--where DIR]

Writes a file the size of the paper student's whole Composer checkpoint (TinyLlama-1.1B: 1,100,048,384 parameters in
float32 with Adam's two moments, 13.2 GB) in ``--where`` (default: the current folder), then takes it into a folder
of ``private_folder`` (``TMPDIR``, else ``/tmp``) as ``take`` does (``copy_file``): a checkpoint of this user's own
(the run's, nobody else may write it) is hard-linked where the two folders share a file system; anyone else's is
copied by the kernel (``copy_file_range``), cold where the page cache can be dropped (root) and warm. Prints the
seconds, GB/s and the disk the copy holds until Composer has loaded it.
The checks that follow the copy are the ones every loaded checkpoint had before; an object store's checkpoint is
downloaded once into the private folder (Composer downloaded it a second time before), so it costs no copy.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from vocagno.doors.private import copy_file
from vocagno.training.checkpoint.private import private_folder

PAPER_STUDENT_PARAMETERS = 1_100_048_384  # TinyLlama-1.1B
BLOCK = 64 << 20


def drop_page_cache() -> bool:
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=PAPER_STUDENT_PARAMETERS * 4 * 3 / 1e9,
                        help="the checkpoint's size in GB (default: the paper student's, 13.2)")
    parser.add_argument("--where", default=".", help="the folder the checkpoint is written in")
    args = parser.parse_args()
    size = int(args.gib * 1e9)
    source_folder = Path(tempfile.mkdtemp(prefix="bench-private-copy-", dir=args.where))
    source = source_folder / "ep0-ba1000-rank0.pt"
    try:
        block = os.urandom(BLOCK)
        with open(source, "wb") as f:
            for start in range(0, size, BLOCK):
                f.write(block[: min(BLOCK, size - start)])
        cases = [("own, linked", None), ("someone else's, cold", "cold"), ("someone else's, warm", "warm")]
        for label, cache in cases:
            os.chown(source, *((os.geteuid(), os.getegid()) if cache is None else (65534, 65534)))
            if cache == "cold" and not drop_page_cache():
                print(f"{label}: the page cache can't be dropped here (not root): skipped")
                continue
            private = private_folder()
            try:
                began = time.perf_counter()
                copy_file(source, private / "checkpoint.pt")
                seconds = time.perf_counter() - began
                linked = os.stat(private / "checkpoint.pt").st_ino == os.stat(source).st_ino
                held = 0 if linked else os.stat(private / "checkpoint.pt").st_blocks * 512
            finally:
                shutil.rmtree(private)
            pace = "" if linked else f" ({size / 1e9 / seconds:.2f} GB/s)"
            print(f"{label}: {size / 1e9:.1f} GB {'linked' if linked else 'copied'} in {seconds * 1000:,.0f} ms{pace}; "
                  f"the copy holds {held / 1e9:.1f} GB more of {Path(tempfile.gettempdir())} until Composer has "
                  "loaded it")
    finally:
        shutil.rmtree(source_folder)


if __name__ == "__main__":
    main()
