"""python -m vocagno.report on evaluation folders as vocagno.eval writes them (its ``main``, in this process)."""

import json

import pytest
from helpers import command

from vocagno import report as report_command
from vocagno.eval.benchmarks import BENCHMARKS


@pytest.fixture
def report(capsys):
    """``python -m vocagno.report ARGUMENTS``: its exit code and what it printed."""
    return lambda *arguments: command(report_command.main, arguments, capsys)


def eval_folder(root, name, accuracy):
    folder = root / name
    folder.mkdir()
    (folder / "results.json").write_text(json.dumps({b: accuracy + i for i, b in enumerate(BENCHMARKS)}))
    return folder


def test_the_report_prints_the_table_with_gains_over_cpt_and_plots_a_sweep(tmp_path, report):
    runs = [eval_folder(tmp_path, "cpt", 10.0), eval_folder(tmp_path, "qwen-topk20", 13.0),
            eval_folder(tmp_path, "qwen-topk40", 14.6)]
    out = report(*runs, "--plot", tmp_path / "k.png")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("| run | GSM8K | MATH | SVAMP |") and lines[0].endswith("| AVG | vs cpt |")
    # AVG of cpt: 10 + mean(0..8) = 14.0; topk40: 18.6, a gain of +32.9%.
    assert "| cpt | 10.0 | 11.0 |" in lines[2] and lines[2].endswith("| 14.0 | +0.0% |")
    # a run's name through md_text: renders as qwen-topk40
    assert lines[4].startswith("| qwen\\-topk40 | 14.6 |") and lines[4].endswith("| 18.6 | +32.9% |")
    assert (tmp_path / "k.png").read_bytes()[:4] == b"\x89PNG"


def test_a_run_with_partial_scores_is_marked_in_the_table_and_warned_of(tmp_path, report):
    """vocagno.eval's results.json names the scores made with --limit (or a short generation, or overlong prompts):
    the report marks them, and says why, rather than compare them with whole ones."""
    cpt = eval_folder(tmp_path, "cpt", 10.0)
    limited = eval_folder(tmp_path, "qwen-topk40", 14.6)
    results = json.loads((limited / "results.json").read_text())
    results["partial"] = {"gsm8k": "the first 4 of 1,319 questions (--limit)"}
    (limited / "results.json").write_text(json.dumps(results))
    out = report(cpt, limited)
    assert out.returncode == 0, out.stderr
    rows = out.stdout.splitlines()
    assert rows[3].startswith("| qwen\\-topk40 | 14.6* | 15.6 |") and "| 10.0 | 11.0 |" in rows[2]
    assert ("warning: qwen-topk40: partial scores, marked *: GSM8K: the first 4 of 1,319 questions (--limit)"
            in out.stderr)


def test_runs_in_folders_of_the_same_name_stay_apart_named_by_their_path_below_the_common_folder(tmp_path, report):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    runs = [eval_folder(tmp_path / "a", "cpt", 10.0), eval_folder(tmp_path / "a", "qwen-topk40", 14.6),
            eval_folder(tmp_path / "b", "cpt", 12.0)]
    out = report(*runs, "--baseline", "a/cpt")
    assert out.returncode == 0, out.stderr
    rows = out.stdout.splitlines()[2:]
    assert [row.split(" | ")[0] for row in rows] == ["| a/cpt", "| a/qwen\\-topk40", "| b/cpt"]
    assert rows[1].endswith("| 18.6 | +32.9% |") and rows[2].endswith("| 16.0 | +14.3% |")
    out = report(*runs)  # two runs named cpt: which is the baseline is not guessed
    assert out.returncode != 0
    assert "two or more runs are named *cpt* (a/cpt, b/cpt): choose one with --baseline" in out.stderr


def test_the_plot_places_each_run_at_the_number_after_the_x_key_in_its_name(tmp_path, report):
    runs = [eval_folder(tmp_path, "cpt", 10.0), eval_folder(tmp_path, "qwen2.5-topk40-seed1", 14.6),
            eval_folder(tmp_path, "qwen2.5-topk20-seed1", 13.0), eval_folder(tmp_path, "chunk16-seed2", 12.0)]
    out = report(*runs, "--plot", tmp_path / "k.png")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == (
        f"wrote {tmp_path / 'k.png'}: x is the number after 'topk' in each run's name: qwen2.5-topk20-seed1 at 20, "
        "qwen2.5-topk40-seed1 at 40; without it, a dashed line each: cpt, chunk16-seed2")
    out = report(*runs, "--plot", tmp_path / "c.png", "--x-key", "chunk", "--x-label", "chunks")
    assert out.stdout.splitlines()[-1].startswith(
        f"wrote {tmp_path / 'c.png'}: x is the number after 'chunk' in each run's name: chunk16-seed2 at 16; ")


def test_a_folder_without_results_is_named(tmp_path, report):
    (tmp_path / "empty").mkdir()
    out = report(tmp_path / "empty")
    assert out.returncode != 0 and "results.json is missing" in out.stderr


def test_the_miniature_table_pairs_each_method_with_plain_over_the_same_seeds():
    from vocagno.report import miniature_table

    result = {"size": "cpu", "steps": 250, "seeds": [0, 1, 2], "device": "cpu", "junk": 0.5, "clean_share": 0.512,
              "teacher": "tiny-math-teacher", "teacher_bits_per_byte": 1.5,
              "bits_per_byte": {"plain": [3.0, 3.2, 3.1], "vocagno_40": [2.9, 3.1, 3.0], "random_40": [3.0, 3.3, 3.05]},
              "selection_precision": {"vocagno_40": 0.9, "random_40": 0.51}}
    rows = {line.split(" | ")[0].strip("| ").replace("\\", ""): line.split(" | ")
            for line in miniature_table(result).splitlines()
            if line.startswith("| ") and "---" not in line}
    # vocagno_40 is lower by 0.1 on every seed: paired differences -0.1 each, sd 0: beyond 2 sd. The spread of the
    # raw values (0.1) is as large as the effect: only the pairing shows it.
    assert rows["vocagno_40"][1] == "3.0000 ± 0.1000" and rows["vocagno_40"][2] == "0.900"
    assert rows["vocagno_40"][3] == "-0.1000 ± 0.0000" and rows["vocagno_40"][4] == "yes, lower |"
    # random_40: differences 0, +0.1, -0.05: mean +0.0167, sd 0.0764: not beyond.
    assert rows["random_40"][3] == "+0.0167 ± 0.0764" and rows["random_40"][4] == "no |"


def rendered(markdown: str) -> str:
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark").enable("table").render(markdown)


def cells_per_row(page: str) -> list[int]:
    import re

    return [row.count("<td>") + row.count("<th>") for row in re.findall(r"<tr>(.*?)</tr>", page, re.S)]


# Folder names a shared evaluations folder may hold: each a cell, a link, an image, HTML or a terminal escape if
# written raw. ("/" can't be in a folder's name.)
NAMES = ["a | b | c", "**bold** `code` _i_", "<img src=x onerror=alert(1)>", "[x](javascript:alert(1))",
         "x\x1b]0;title\x07\x1b[2Jy", "evil\u202etxt", "run\\|", "\\"]
MARKUP = ("<img", "<a ", "<strong", "<em", "<code", "<script")


@pytest.mark.parametrize("name", NAMES)
def test_a_runs_folder_name_is_shown_as_its_characters_and_adds_no_cell(tmp_path, report, name):
    from vocagno.shown import terminal

    runs = [eval_folder(tmp_path, "cpt", 10.0), eval_folder(tmp_path, name, 14.6)]
    out = report(*runs, "--plot", tmp_path / "k.png")
    assert out.returncode == 0, out.stderr
    table = "\n".join(line for line in out.stdout.splitlines() if line.startswith("|"))
    page = rendered(table)
    assert page.count("<table>") == 1 and cells_per_row(page) == [12] * 3, page
    assert not any(markup in page for markup in MARKUP), page
    assert f"<td>{terminal(name)}</td>" in page.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"')
    assert "\x1b" not in out.stdout + out.stderr and "\u202e" not in out.stdout + out.stderr


def test_a_key_of_no_benchmark_is_refused_in_one_line_not_averaged(tmp_path, report):
    cpt = eval_folder(tmp_path, "cpt", 10.0)
    other = eval_folder(tmp_path, "qwen", 14.6)
    results = json.loads((other / "results.json").read_text())
    (other / "results.json").write_text(json.dumps({**results, "notes": 2000.0}))  # +1400% if it were averaged
    out = report(cpt, other)
    assert out.returncode == 2 and out.stdout == ""
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert (f"{other / 'results.json'}: refused: its key 'notes' is none of vocagno.eval's (accepted: the "
            "benchmarks gsm8k, math,") in out.stderr


def test_the_average_is_over_the_benchmarks_shown_and_honest_keys_count_in_none(tmp_path, report):
    runs = [eval_folder(tmp_path, "cpt", 10.0), eval_folder(tmp_path, "qwen", 14.6)]
    results = json.loads((runs[1] / "results.json").read_text())
    results.update({"tabmwp": "unavailable: no tabmwp/test.jsonl", "bits_per_byte": {"file": "x", "value": 9e9},
                    "partial": {"gsm8k": "the first 4 of 1,319 questions (--limit)"}})
    (runs[1] / "results.json").write_text(json.dumps(results))
    out = report(*runs)
    assert out.returncode == 0, out.stderr
    row = out.stdout.splitlines()[3].split(" | ")
    shown = [float(cell.rstrip("*")) for cell in row[1:10] if cell != "-"]
    assert len(shown) == 8 and row[10] == f"{sum(shown) / 8:.1f}* (partial)"


def test_the_miniature_table_shows_a_files_names_as_their_characters():
    from vocagno.report import miniature_table

    attack = "x | y\n# h <img src=x>\x1b[2J"
    result = {"size": attack, "steps": 250, "seeds": [0, 1], "device": attack, "junk": 0.5, "clean_share": 0.5,
              "teacher": attack, "teacher_bits_per_byte": 1.5,
              "bits_per_byte": {"plain": [3.0, 3.2], attack: [2.9, 3.1]}, "selection_precision": {attack: 0.9}}
    markdown = miniature_table(result)
    page = rendered(markdown)
    assert "\x1b" not in markdown and "<img" not in page and "<h1>" not in page
    assert page.count("<table>") == 1 and set(cells_per_row(page)) == {5}, page
