"""python -m vocagno.align, as a user runs it (its ``main``, in this process)."""

import pytest
from helpers import command

from vocagno import align


@pytest.fixture
def run_align(capsys):
    def run(*args):
        result = command(align.main, args, capsys)
        assert result.returncode == 0, result.stderr
        return result.stdout

    return run


def test_align_command_prints_tokens_unmapped_and_overlap(run_align):
    out = run_align("--student", "llama2", "--teacher", "qwen2.5", "--text", "Cafe\u0301 costs $3/4 ∫x²dx")
    lines = out.splitlines()
    assert any("'▁costs'" in line and "Ġcosts" in line and "1.00  1.00" in line for line in lines)
    assert any("'<s>'" in line and "(unmapped)" in line for line in lines)  # BOS: empty span
    assert "unmapped, empty span (specials): 1" in out
    assert "unmapped, overlapping no teacher token: 1" in out
    assert "'\u0301'" in out  # the combining mark Qwen's NFC folded into the 'e'
    assert "vocabulary overlap: 9,587 / 151,643 = 6.32%" in out


def test_align_command_reads_a_file(tmp_path, run_align):
    path = tmp_path / "a.txt"
    path.write_text("Natalia sold 48/2 = 24 clips in May.\n", encoding="utf-8")
    out = run_align("--student", "deepseek-llm", "--teacher", "mistral", "--file", str(path), "--no-special-tokens",
                    "--chunks", "1,4")
    assert "unmapped, empty span (specials): 0" in out
    assert "token level: mean IoU" in out and "mean IoS 1.000" in out
    assert "   1 chunks:  mean IoU 1.000, mean IoS 1.000" in out and "   4 chunks:" in out
    assert "unmapped, overlapping no teacher token: 0" in out
    assert "IoS = 1 for" in out


def test_align_command_needs_text(capsys):
    result = command(align.main, ["--student", "llama2", "--teacher", "qwen2.5"], capsys)
    assert result.returncode == 2 and "one of the arguments --text --file is required" in result.stderr
