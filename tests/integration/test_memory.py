"""vocagno.memory: a CPU process keeps the large blocks it frees, and allocating them again faults no page in."""

import resource
import subprocess
import sys

import pytest

STEP = """
import resource, sys, torch
from vocagno.memory import keep_freed_memory
torch.set_num_threads(1)  # as in the test workers: with two, reuse varied more from run to run
if sys.argv[1] == "kept":
    assert keep_freed_memory()
def step():  # tiny.yaml's logits and their log-softmax: 8 x 128 x 32K floats each
    logits = torch.randn(8 * 128, 32000)
    return torch.log_softmax(logits, dim=-1).sum()
for _ in range(3):  # the heap grows to its size
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""



def minor_faults(script: str, *modes: str) -> dict[str, int]:
    """The page faults ``script`` counts (its last line) in a fresh interpreter, for each mode given as its argument."""
    faults = {}
    for mode in modes:
        result = subprocess.run([sys.executable, "-c", script, mode], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr[-2000:]
        faults[mode] = int(result.stdout)
    return faults


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_steps_after_the_first_fault_no_pages_in_once_freed_memory_is_kept():
    faults = minor_faults(STEP, "default", "kept")
    pages = 2 * 8 * 128 * 32000 * 4 // resource.getpagesize()  # two 131 MB tensors a step
    assert faults["default"] > 10 * pages // 2, faults  # given back and faulted in again every step
    # Mostly reused: at most 2 steps' worth of tensors faulted in again, in a CI run beside the other tests' processes.
    assert faults["kept"] < faults["default"] // 3, faults


DOCUMENTS = """
import resource, sys
from vocagno.memory import return_freed_memory
if sys.argv[1] == "returned":
    assert return_freed_memory()
def document():  # a long document's arrays: a 20 MB block, written, then freed
    block = bytearray(20 << 20)
    block[:: 4096] = b"x" * len(block[:: 4096])
for _ in range(2):  # the first one freed raises glibc's own threshold to its size
    document()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    document()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_the_converters_setting_gives_every_large_block_back_as_it_is_freed():
    """return_freed_memory (the converter's): glibc's own threshold would keep a freed 20 MB block in the heap, reused
    without faults and never given back; with it, each block is mapped afresh and given back when freed."""
    faults = minor_faults(DOCUMENTS, "default", "returned")
    pages = (20 << 20) // resource.getpagesize()
    assert faults["returned"] > 10 * pages // 2, faults  # mapped afresh and faulted in every time
    assert faults["default"] < faults["returned"] // 3, faults
