"""benchmarks/gpu_check.py without a GPU: its dry run writes the report, every step's status and every goal."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import gpu_check  # noqa: E402


def test_the_dry_run_reports_each_step_and_each_goal_and_marks_the_gpu_ones_skipped(tmp_path):
    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--dry-run", "--out",
                             str(tmp_path), "--only", "gpu_tests,bench_tiny,bench_paper,fsdp_all_gpus"],
                            capture_output=True, text=True, timeout=900, cwd=tmp_path)
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
