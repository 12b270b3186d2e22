"""benchmarks/gpu_check.py without a GPU: its dry run writes the report, every step's status and every goal."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import script

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import gpu_check  # noqa: E402


@pytest.mark.slow
def test_the_dry_run_reports_each_step_and_each_goal_and_marks_the_gpu_ones_skipped(tmp_path):
    # The check in this process (``helpers.script``); its steps are processes of their own, as it starts them.
    result = script(REPO / "benchmarks" / "gpu_check.py", ["--dry-run", "--out", tmp_path, "--only",
                                                           "gpu_tests,bench_tiny,bench_paper,fsdp_all_gpus"],
                    cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    steps = report["steps"]
    assert list(steps) == ["gpu_tests", "bench_tiny", "bench_paper", "fsdp_all_gpus"]
    assert steps["gpu_tests"]["status"] == "ok" and steps["gpu_tests"]["figures"]["collected"] >= 4
    assert steps["bench_tiny"]["status"] == "ok" and steps["bench_tiny"]["figures"]["microbatch.overhead"] > 0
    assert steps["bench_paper"] == {"status": "skipped", "why": "the paper preset needs a GPU", "figures": {}}
    assert {goal["figure"] for goal in report["goals"]} >= {"microbatch.overhead", "mfu", "failed"}
    assert all(goal["met"] is None for goal in report["goals"])  # nothing a CPU measures counts as a GPU figure
    page = (tmp_path / "report.md").read_text()
    assert "dry run: CPU smoke" in page and "| bench_paper | skipped: the paper preset needs a GPU | - |" in page
    assert (tmp_path / "logs" / "bench_tiny.log").read_text()


def test_a_failing_step_is_reported_and_the_others_still_run(tmp_path):
    step = {"name": "broken", "command": [sys.executable, "-c", "import sys; print('1 passed, 2 failed'); sys.exit(3)"],
            "timeout": 60, "parse": gpu_check.pytest_counts}
    slow = {"name": "slow", "command": [sys.executable, "-c", "import time; time.sleep(30)"], "timeout": 1,
            "parse": gpu_check.pytest_counts}
    (tmp_path / "logs").mkdir()
    broken, late = gpu_check.run_step(step, tmp_path / "logs"), gpu_check.run_step(slow, tmp_path / "logs")
    assert broken["status"] == "failed (exit 3)" and broken["figures"] == {"passed": 1, "failed": 2, "skipped": 0}
    assert late["status"] == "failed (past its 1 s)"
    verdict = gpu_check.judge({"gpu_tests": broken})[0]
    assert verdict["value"] == 2 and verdict["met"] is False


def test_a_step_past_its_time_goes_with_every_process_it_started(tmp_path):
    """As a launcher past its time: its ranks must not outlive it, holding a GPU the next step needs."""
    pid_file = tmp_path / "rank.pid"
    (tmp_path / "logs").mkdir()
    late = gpu_check.run_step({"name": "launcher", "command": launcher(pid_file, then="time.sleep(60)"),
                               "timeout": 3, "parse": gpu_check.pytest_counts}, tmp_path / "logs")
    assert late["status"] == "failed (past its 3 s)"
    assert_rank_gone(pid_file)


@pytest.mark.slow
def test_a_check_ended_by_sigterm_ends_the_step_it_runs_and_reports_what_it_and_those_before_did(tmp_path):
    """`timeout 560 python benchmarks/gpu_check.py ...` on a machine lent for minutes: when it strikes, the running
    step's launcher and ranks go too (they run in a session of their own), and the finished steps are reported."""
    pid_file = tmp_path / "rank.pid"
    stopping = launcher(pid_file, first="print('{\"selection_scope\": \"batch\", \"plain_step_s\": 0.2}')",
                        then="time.sleep(60)")
    script = tmp_path / "check.py"
    script.write_text(
        f"import runpy, sys\nsys.path.insert(0, {str(REPO / 'benchmarks')!r})\nimport gpu_check\n"
        "gpu_check.steps = lambda *args: [\n"
        "    {'name': 'gpu_tests', 'command': [sys.executable, '-c', 'print(\"4 passed\")'], 'timeout': 60,\n"
        "     'parse': gpu_check.pytest_counts},\n"
        f"    {{'name': 'bench_paper', 'command': {stopping!r}, 'timeout': 60,\n"
        "     'parse': gpu_check.bench_figures}]\n"
        "gpu_check.exit_on_sigterm()\n"
        f"sys.exit(gpu_check.main(['--dry-run', '--out', {str(tmp_path / 'report')!r}]))\n")
    check = subprocess.Popen([sys.executable, str(script)], cwd=REPO)
    for _ in range(300):
        if pid_file.exists() and pid_file.read_text():
            break
        time.sleep(0.1)
    check.send_signal(signal.SIGTERM)
    assert check.wait(timeout=30) == 128 + signal.SIGTERM
    assert_rank_gone(pid_file)
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert list(report["steps"]) == ["gpu_tests", "bench_paper"]
    stopped = report["steps"]["bench_paper"]  # what it had printed by then: its log and its figures
    assert stopped["status"] == "stopped (the check was ended during this step)"
    assert stopped["figures"] == {"plain_step_s": 0.2}
    assert "plain_step_s" in (tmp_path / "report" / "logs" / "bench_paper.log").read_text()


def test_a_step_that_ends_takes_what_it_left_running_with_it(tmp_path):
    """A launcher that exits while a rank of its still runs: the rank goes with the step, not on into the next."""
    pid_file = tmp_path / "rank.pid"
    (tmp_path / "logs").mkdir()
    done = gpu_check.run_step({"name": "launcher", "command": launcher(pid_file, then="print('4 passed')"),
                               "timeout": 60, "parse": gpu_check.pytest_counts}, tmp_path / "logs")
    assert done["status"] == "ok" and done["figures"]["passed"] == 4
    assert_rank_gone(pid_file)


def launcher(pid_file: Path, then: str, first: str = "pass") -> list[str]:
    """A launcher's command: ``first``, then it starts a rank that sleeps a minute, writes the rank's pid to
    ``pid_file`` and goes on with ``then``."""
    return [sys.executable, "-c", f"import subprocess, sys, time; {first}; sys.stdout.flush(); "
            "rank = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            f"open({str(pid_file)!r}, 'w').write(str(rank.pid)); {then}"]


def assert_rank_gone(pid_file: Path) -> None:
    rank = int(pid_file.read_text())
    for _ in range(50):  # killed at once; the kernel may take a moment to reap it
        if not _alive(rank):
            break
        time.sleep(0.1)
    assert not _alive(rank), f"the launcher's rank {rank} outlived its step"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"  # a zombie is dead, waiting for init to reap it


def test_only_runs_the_steps_it_names_in_its_order_and_refuses_a_name_that_is_no_step_or_twice(tmp_path):
    steps = gpu_check.steps(sys.executable, 1, tmp_path, dry=False)
    chosen = gpu_check.chosen_steps(steps, "bench_paper,gpu_tests")
    assert [step["name"] for step in chosen] == ["bench_paper", "gpu_tests"]
    assert [step["name"] for step in gpu_check.chosen_steps(steps, None)] == [step["name"] for step in steps]
    with pytest.raises(SystemExit, match="--only names no step 'bench-paper'; the steps: gpu_tests, bench_tiny"):
        gpu_check.chosen_steps(steps, "bench-paper,gpu_tests")
    with pytest.raises(SystemExit, match="--only names 'gpu_tests' twice"):
        gpu_check.chosen_steps(steps, "gpu_tests,bench_paper,gpu_tests")


def test_the_report_holds_each_finished_step_when_the_check_is_stopped_before_the_next(tmp_path, monkeypatch):
    """A machine's time may end mid-check: what ran by then is in report.md and report.json."""
    quick = {"name": "gpu_tests", "command": [sys.executable, "-c", "print('4 passed')"], "timeout": 60,
             "parse": gpu_check.pytest_counts}
    stopped = {"name": "bench_paper", "command": [sys.executable, "-c", "pass"], "timeout": 60,
               "parse": gpu_check.bench_figures}
    monkeypatch.setattr(gpu_check, "steps", lambda *args: [quick, stopped])
    monkeypatch.setattr(gpu_check, "run_step", _stopping_after(gpu_check.run_step, "bench_paper"))
    with pytest.raises(KeyboardInterrupt):
        gpu_check.main(["--dry-run", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["steps"]["gpu_tests"]["figures"] == {"passed": 4, "failed": 0, "skipped": 0}
    assert "bench_paper" not in report["steps"] and "1 step(s) not run yet" in report["header"]
    assert "| gpu_tests | ok | " in (tmp_path / "report.md").read_text()


def _stopping_after(run_step, name):
    def run(step, logs):
        if step["name"] == name:
            raise KeyboardInterrupt  # the check stopped from outside while this step ran
        return run_step(step, logs)
    return run


def test_the_sharded_step_reads_the_resumed_losses_against_the_straight_run_and_the_three_bits_per_byte(tmp_path):
    straight = [{"step": step, "loss/train/total": 10.0 - step} for step in range(1, 7)]
    resumed = [{"step": 5, "loss/train/total": 5.05}, {"step": 6, "loss/train/total": 4.0}, {"step": 6, "lr": 1.0}]
    for name, rows in (("all_gpus", straight), ("sharded_resumed", resumed)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    output = "".join(f"bits per byte on held_out.jsonl (100 texts): {v}\n" for v in ("1.5001", "1.5003", "1.5002"))
    figures = gpu_check.sharded_figures(tmp_path)(output)
    assert figures == {"resumed_steps": [5, 6], "resumed_largest_relative_loss_difference": 0.01,
                       "bits_per_byte_export_gpu": 1.5001, "bits_per_byte_checkpoint_minus_export": 0.0001}
    verdicts = {v["figure"]: v["met"] for v in gpu_check.judge({"sharded_resume_export": {"figures": figures}})}
    assert verdicts["resumed_largest_relative_loss_difference"] is True
    assert verdicts["bits_per_byte_checkpoint_minus_export"] is False


def test_a_steps_reason_and_figures_add_no_row_cell_or_heading_to_the_report(tmp_path):
    """A step's reason quotes what its command printed (a file's text, an error): shown as its characters."""
    from markdown_it import MarkdownIt

    results = {"gpu_tests": {"status": "failed", "why": "x | y\n# made up\n| fake | row |", "seconds": 1.0,
                             "figures": {"note | z": "a\n## heading"}}}
    page = gpu_check.markdown(results, [], "header")
    html = MarkdownIt("commonmark").enable("table").render(page)
    assert html.count("<tr>") == 3 and html.count("<td>") == 3, html  # two tables' heads, one row of three cells
    assert html.count("<h2>") == 1 and "<h1>" in html and html.count("<h1>") == 1, html
    gpu_check.write_report(tmp_path, results, "header")
    assert (tmp_path / "report.md").read_text() == gpu_check.markdown(results, gpu_check.judge(results), "header")
