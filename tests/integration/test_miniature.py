"""The miniature (experiments/miniature.py) at its toy size: the product's chain runs end to end, its table prints."""

import json
import re
import sys
from pathlib import Path

import pytest
from helpers import command, script

REPO = Path(__file__).resolve().parents[2]
METHODS = ("plain", "vocagno_40", "vocagno_clean", "random_40", "chunk_1", "chunk_16")


@pytest.mark.slow
def test_the_miniature_runs_the_products_chain_at_toy_size_and_reports_it(tmp_path, capsys):
    """convert -> vocagno.score -> train.py, cached losses, per method -> held-out bits per byte -> vocagno.report,
    run in this process (``helpers.script``, ``helpers.command``): their process is not what this is about."""
    from vocagno.report import main as report_main

    result = script(REPO / "experiments" / "miniature.py", ["--size", "toy", "--device", "cpu",
                                                            "--out", tmp_path / "mini"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    measured = json.loads((tmp_path / "mini" / "miniature.json").read_text())
    assert list(measured["bits_per_byte"]) == ["init", *METHODS]
    assert set(measured["selection_precision"]) == set(METHODS) - {"plain"}
    assert 0.45 < measured["clean_share"] < 0.6  # half the documents are word-shuffled copies
    init = measured["bits_per_byte"]["init"][0]
    # Every student trained (4 steps): below the bits per byte of its initialization, the same for every method.
    assert all(0 < measured["bits_per_byte"][m][0] < init for m in METHODS), measured["bits_per_byte"]
    assert 0 < measured["teacher_bits_per_byte"] < init
    # the method names through md_text (a miniature.json's): vocagno\_40, which renders vocagno_40
    rows = re.findall(r"^\| ([\w\\]+) \| ([0-9.]+) \|", result.stdout, re.MULTILINE)
    assert [name.replace("\\", "") for name, _ in rows] == ["init", *METHODS]
    report = command(report_main, ["--miniature", tmp_path / "mini" / "miniature.json", "--plot",
                                   tmp_path / "bpb.png"], capsys)
    assert report.returncode == 0, report.stderr
    assert "| vocagno\\_40 |" in report.stdout and "n/a (one seed)" in report.stdout
    assert (tmp_path / "bpb.png").read_bytes()[:4] == b"\x89PNG"


def test_the_two_domain_table_pairs_seeds_and_says_what_lies_beyond_twice_the_spread():
    """experiments/two_teachers.py's comparisons: differences paired by seed, "lower"/"higher" only beyond 2 sd, and
    the table's rows and columns from its result (the published one's shape)."""
    sys.path.insert(0, str(REPO))
    from experiments.two_teachers import compare, table

    assert compare([2.675, 2.795, 2.922], [2.774, 2.857, 3.083]) == "-0.1073 ± 0.0500 (lower)"
    # Lower on every seed, but the differences spread as wide as their mean: not beyond.
    assert compare([2.675, 2.795, 2.922], [2.953, 2.808, 3.037]) == "-0.1353 ± 0.1337 (within 2 sd)"
    assert compare([3.0, 3.1, 3.2], [2.0, 2.1, 2.2]) == "+1.0000 ± 0.0000 (higher)"
    assert compare([1.0], [1.5]) == "-0.5000 (one seed)"
    run = {"gsm8k": 2.6, "math": 2.9, "overall": 2.8}
    result = {"size": "toy", "steps": 4, "seeds": [0, 1], "junk": 0.5, "teachers": {"gsm8k": run, "latex": run},
              "bits_per_byte": {m: [run, {k: v + 0.1 for k, v in run.items()}] for m in
                                ("init", "plain", "gsm8k_teacher", "latex_teacher", "both_min")}}
    printed = table(result)
    assert "| both_min | 2.8500 ± 0.0707 | 2.6500 ± 0.0707 | 2.9500 ± 0.0707 | +0.0000 ± 0.0000 (within 2 sd) |" \
        in printed
    assert "| init | 2.8500 ± 0.0707 | 2.6500 ± 0.0707 | 2.9500 ± 0.0707 | - | - | - |" in printed
    assert "| plain | 2.8500 ± 0.0707 | 2.6500 ± 0.0707 | 2.9500 ± 0.0707 | - | +0.0000" in printed
