"""train.py and the VocAgnoLM algorithm: the tiny run, kill and resume, the yamls, refusals (runs of several ranks:
test_distributed.py)."""

import json
import math
import os
import re
import runpy
import sys
from pathlib import Path

import pytest
from helpers import Reached, assert_same_losses, kill_when, own_data, reached, read_log, run_whole, script
from omegaconf import OmegaConf as om

from vocagno.errors import Refused
from vocagno.training.builders import build_algorithms, build_loggers, student_model
from vocagno.training.config import load_config
from vocagno.training.loaders import build_loader
from vocagno.training.registry import ALGORITHM_GROUP, OWN_ALGORITHMS, algorithm
from vocagno.training import registry
from vocagno import train as training_run
from vocagno.train import report_selection, train
from vocagno.algorithms.vocagno_lm import VocAgnoLM
from vocagno.algorithms.baselines import KLD, ULD
from vocagno.data.shards import ShardMetadata

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "yamls" / "tiny.yaml")


def run_train(tmp_path, *overrides, check=True, yaml=TINY):
    """python train.py yamls/tiny.yaml (or ``yaml``), run in this process (``helpers.script``), with its shards and
    logs under tmp_path."""
    result = script(REPO / "train.py", [yaml, *own_data(yaml, f"{tmp_path}/shards/train", f"{tmp_path}/shards/heldout"),
                                        "loggers.console=null", f"loggers.picture.path={tmp_path}/run.png", *overrides],
                    cwd=REPO)
    if check:
        assert result.returncode == 0, result.stderr[-4000:]
    return result


def refusal(tmp_path, *overrides) -> str:
    """What stops train.py yamls/tiny.yaml (its shards and logs under tmp_path) before it trains: ``train`` run in
    this process, as ``train.py`` runs it, since a subprocess would spend most of its time importing Composer."""
    cfg = load_config(TINY, [*own_data(TINY, f"{tmp_path}/shards/train", f"{tmp_path}/shards/heldout"),
                                   "loggers.console=null", "loggers.picture=null", *overrides])
    with pytest.raises(ValueError) as refused:
        train(cfg)
    return str(refused.value)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tiny")
    result = run_train(tmp, "max_duration=24ba", "eval_interval=24ba", f"loggers.jsonl.path={tmp}/log.jsonl",
                       "loggers.console={}", "console_log_interval=12ba")
    (tmp / "output.txt").write_text(result.stdout + result.stderr)
    return tmp, read_log(tmp / "log.jsonl")


def test_tiny_run_trains_on_the_guided_tokens_and_its_loss_falls(tiny_run):
    _, steps = tiny_run
    losses = [steps[s]["loss/train/student_loss"] for s in sorted(steps) if "loss/train/student_loss" in steps[s]]
    assert len(losses) == 24
    assert losses[-1] < losses[0] - 1.0, losses  # ln(32000) = 10.4 falls by more than a nat
    for s in sorted(steps):
        row = steps[s]
        if "loss/train/kept_fraction" not in row:
            continue
        mapped, kept = row["loss/train/mapped_fraction"], row["loss/train/kept_fraction"]
        # 40% of the mapped tokens (rounded up per microbatch) plus every unmapped one (the separators).
        assert 0.4 * mapped + (1 - mapped) - 1e-4 <= kept <= 0.4 * mapped + (1 - mapped) + 0.01
        assert 0.95 < mapped < 1.0
        assert row["loss/train/total"] > 0
    assert all(steps[s]["vocagno/teacher_forward_seconds"] > 0 for s in range(1, 25))
    bits_per_byte = steps[24]["metrics/eval/BitsPerByte"]
    assert 0 < bits_per_byte < math.log2(32000) and math.isfinite(bits_per_byte)


def test_llmfoundry_named_callbacks_log_throughput_and_the_learning_rate_once_on_the_console(tiny_run):
    """tiny.yaml's callbacks (speed_monitor, lr_monitor: llm-foundry's names for Composer's classes) log; with the
    console logger on, there is no progress bar printing the same metrics again."""
    tmp, steps = tiny_run
    assert all("lr-DecoupledAdamW/group0" in steps[s] for s in range(1, 25))
    assert all(steps[s]["throughput/device/tokens_per_sec"] > 0 for s in range(11, 25))  # after a 10-batch window
    assert all(steps[s]["throughput/device/flops_per_sec"] > 0 for s in range(11, 25))  # MFU's numerator
    output = (tmp / "output.txt").read_text()
    lines = [line for line in output.splitlines() if line.startswith("[batch ")]
    assert [line.split("]")[0] for line in lines] == ["[batch 12/24", "[batch 24/24"], output[-3000:]
    assert re.fullmatch(r"\[batch 12/24\] loss [0-9.]+ \| student [0-9.]+ \| teacher [0-9.]+ \| kept 0\.[0-9]+ \| "
                        r"tok/s [0-9,]+ \| lr [0-9.e+-]+", lines[0]), lines[0]
    assert re.search(r" \| held-out bits/byte [0-9.]+$", lines[1]), lines[1]  # the batch ended in an evaluation
    assert "time/" not in output and "throughput/" not in output  # one line per logged step; the rest in the log
    assert "Epoch" not in output and "ba/s" not in output  # Composer's progress bar
    assert "teacher losses: online, tiny-math-teacher scores every batch" in output


def test_the_console_line_puts_each_evaluation_on_the_batch_it_was_measured_at(capsys):
    """Evaluations at a batch's end join its line, or get a line of their own where the batch prints none; one at an
    epoch's end (after the batch's line) gets its own line with that batch, not the next one's."""
    from types import SimpleNamespace

    from composer.core import Time, Timestamp

    from vocagno.training.loggers import ConsoleLine

    console = ConsoleLine(every=5)
    state = SimpleNamespace(max_duration=Time(10, "ba"))
    for batch in range(1, 11):
        state.timestamp = Timestamp(batch=batch)
        console.log_metrics({"loss/train/total": float(batch)}, step=batch - 1)
        if batch == 3:  # an evaluation at a batch's end: before the batch's checkpoint event
            console.log_metrics({"metrics/eval/BitsPerByte": 1.5}, step=batch)
        console.batch_checkpoint(state, None)
        if batch == 5:  # an evaluation at the epoch's end: after it
            console.log_metrics({"metrics/eval/BitsPerByte": 1.25}, step=batch)
            console.eval_end(state, None)
    assert capsys.readouterr().out.splitlines() == [
        "[batch 3/10] held-out bits/byte 1.5000", "[batch 5/10] loss 5.0000", "[batch 5/10] held-out bits/byte 1.2500",
        "[batch 10/10] loss 10.0000"]


def test_every_checkpoint_saved_is_said_once_also_when_composer_rotates_them(tmp_path, capsys):
    from types import SimpleNamespace

    from composer.callbacks import CheckpointSaver

    from vocagno.training.loggers import Narration

    saver = CheckpointSaver(folder=str(tmp_path), num_checkpoints_to_keep=0)  # each rotated away at once
    state = SimpleNamespace(callbacks=[saver], algorithms=[])
    saver.all_saved_checkpoints_to_timestamp = {str(tmp_path / "ep0-ba1-rank0.pt"): 1}  # a resumed run's
    narration = Narration(str(tmp_path))
    narration.fit_start(state, None)
    for batch in range(2, 6):
        saver.all_saved_checkpoints_to_timestamp[str(tmp_path / f"ep0-ba{batch}-rank0.pt")] = batch
        saver.saved_checkpoints = []  # Composer's list of the kept ones: none
        narration.batch_checkpoint(state, None)
    said = capsys.readouterr().out.splitlines()
    assert said == [f"saved checkpoint {tmp_path}/ep0-ba{b}-rank0.pt" for b in range(2, 6)]
    assert narration.saved()[-1] == f"{tmp_path}/ep0-ba5-rank0.pt"
    remote = Narration("s3://bucket/runs/x")
    saver.all_saved_checkpoints_to_timestamp = {"runs/x/ep0-ba6-rank0.pt": 6}  # Composer's local name of an upload
    remote.batch_checkpoint(state, None)
    assert capsys.readouterr().out == "saved checkpoint s3://bucket/runs/x/ep0-ba6-rank0.pt\n"


def test_a_run_ends_with_a_picture_of_its_loss_kept_fraction_and_bits_per_byte(tiny_run):
    tmp, _ = tiny_run
    picture = tmp / "run.png"
    assert f"wrote {picture}: the run's loss, kept fraction and held-out bits per byte over its batches" in (
        tmp / "output.txt").read_text()
    from PIL import Image

    with Image.open(picture) as image:
        assert image.format == "PNG" and image.size[0] > 2 * image.size[1]  # three panels side by side
        colors = image.convert("RGB").getcolors(maxcolors=1 << 20)
    assert len(colors) > 50  # drawn lines and text, not an empty canvas


def test_the_default_run_ends_by_showing_what_its_teacher_keeps(tiny_run):
    """README command 1 ends with vocagno.selection's summary on the held-out shards with canaries (selection_report):
    the shipped teacher, ranking with the student just trained, keeps clean text well above its share, a random
    selection about the clean share, and the same teacher at initialization (ranking by the student's loss alone,
    highest on the noise) less than either."""
    tmp, _ = tiny_run
    output = (tmp / "output.txt").read_text()
    assert "what the teacher keeps:" in output and "student: tiny after 24 batches" in output
    clean_share = float(re.search(r"clean share of the mapped tokens: ([0-9.]+)", output).group(1))
    precision = {name: float(value) for name, value in re.findall(r"^(\w+)\s+([0-9.]+)\s+[0-9.]+\s+", output, re.M)}
    assert precision["topk"] > clean_share + 0.1, (precision, clean_share)
    assert abs(precision["random"] - clean_share) < 0.05, (precision, clean_share)
    assert precision["untrained_teacher"] < clean_share < precision["topk"], (precision, clean_share)
    assert re.search(r"^verdict: the teacher separates this corpus's useful tokens: its top-k keeps ", output, re.M)


def test_a_selection_report_the_shards_cannot_make_is_skipped_saying_why(tmp_path, capsys):
    """The run is done and saved when its selection_report starts: a refusal of the report (here a folder that holds
    no shards) is one line saying why it is skipped, and the run ends as it would."""
    from types import SimpleNamespace

    import torch

    cfg = load_config(str(REPO / "yamls" / "tiny.yaml"), [f"selection_report.shards={tmp_path}"])
    student = torch.nn.Linear(2, 2)
    trainer = SimpleNamespace(state=SimpleNamespace(model=SimpleNamespace(model=student),
                                                    timestamp=SimpleNamespace(batch=3)))
    report_selection(cfg, trainer, sharded=False)
    out = capsys.readouterr().out
    assert out.startswith(f"selection_report skipped: {tmp_path} holds no shards") and len(out.splitlines()) == 1, out


def test_the_student_model_shifts_labels_without_importing_every_causal_lm_class(monkeypatch, tokenizers):
    """Composer's HuggingFaceModel asks transformers' whole causal-LM mapping whether the student is in it (every
    model class imported, 1.0-1.4 s of CPU at each rank's start); train.py gives shift_labels, so that question is
    never asked."""
    from composer.models import huggingface
    from transformers.models.auto import modeling_auto

    from vocagno.teacher.config import build_causal_lm

    class Unasked:
        def values(self):
            raise AssertionError("every causal-LM class of transformers was imported")

    monkeypatch.setattr(modeling_auto, "MODEL_FOR_CAUSAL_LM_MAPPING", Unasked())
    student = build_causal_lm(om.create({"config": {"model_type": "llama", "hidden_size": 16, "intermediate_size": 32,
                                                    "num_hidden_layers": 1, "num_attention_heads": 2}}), 32000, seed=0)
    asked = huggingface._is_registered_causal_lm
    model = student_model(student, tokenizers["llama2"])
    assert model.shift_labels and model.use_logits and list(model.val_metrics) == ["BitsPerByte"]
    assert huggingface._is_registered_causal_lm is asked  # Composer's own question again for every other model


def test_loggers_and_callbacks_take_llmfoundrys_names_and_refuse_unknown_ones():
    loggers, callbacks = build_loggers(om.create({
        "loggers": {"console": {}, "inmemory": {}, "tensorboard": None},  # null: off
        "callbacks": {"speed_monitor": {"window_size": 5}, "lr_monitor": {}, "nan_monitor": {}, "optimizer_monitor": {},
                      "runtime_estimator": {}, "memory_monitor": {}},
    }))
    assert [type(x).__name__ for x in loggers] == ["InMemoryLogger", "ConsoleLine"]  # console: vocagno's one line
    assert [type(x).__name__ for x in callbacks] == ["SpeedMonitor", "LRMonitor", "NaNMonitor", "OptimizerMonitor",
                                                     "RuntimeEstimator", "MemoryMonitor"]
    with pytest.raises(ValueError, match=r"speed_monitr \(did you mean speed_monitor\?\); known: .*lr_monitor"):
        build_loggers(om.create({"callbacks": {"speed_monitr": {}}}))
    with pytest.raises(ValueError,
                       match="wandbb .*known: console, inmemory, jsonl, mlflow, picture, tensorboard, wandb"):
        build_loggers(om.create({"loggers": {"wandbb": {}}}))
    with pytest.raises(ValueError, match="callbacks.speed_monitor: .*windw_size"):
        build_loggers(om.create({"callbacks": {"speed_monitor": {"windw_size": 5}}}))


def test_the_run_converted_the_embedded_sample_first(tiny_run):
    tmp, _ = tiny_run
    meta = ShardMetadata.read(tmp / "shards" / "train")
    assert (meta.student.name, meta.teacher.name, meta.seq_len) == ("llama2", "mistral", 128)
    assert meta.totals["documents read"] == 500


CHECKPOINTED = ["save_interval=2ba", "autoresume=true", "eval_loader=null"]


@pytest.fixture(scope="module")
def straight_folder(tiny_run, tmp_path_factory):
    """An uninterrupted run of 8 batches saving every 2 (``ckpt``) and its log (``log.jsonl``)."""
    folder = tmp_path_factory.mktemp("straight")
    run_train(tiny_run[0], *CHECKPOINTED, "max_duration=8ba", f"save_folder={folder}/ckpt", "run_name=straight",
              f"loggers.jsonl.path={folder}/log.jsonl")
    return folder


@pytest.fixture(scope="module")
def straight(straight_folder):
    """The losses of the uninterrupted run: what the interrupted runs must end with (its first 6 steps are a 6-batch
    run's: the learning rate is still warming up, whatever the run's length)."""
    return read_log(straight_folder / "log.jsonl")


@pytest.mark.slow
def test_kill_and_autoresume_continue_with_the_same_losses(tiny_run, straight, tmp_path):
    killed = tmp_path / "killed"
    command = [sys.executable, str(REPO / "train.py"), TINY, f"variables.data={tiny_run[0]}/shards/train",
               f"variables.heldout={tiny_run[0]}/shards/heldout", "loggers.console=null", "loggers.picture=null",
               *CHECKPOINTED,
               "max_duration=8ba", f"save_folder={killed}/ckpt", "run_name=killed",
               f"loggers.jsonl.path={killed}/log.jsonl"]
    kill_when(command, (killed / "ckpt" / "ep0-ba4-rank0.pt").exists, settle=0.5, cwd=REPO,
              env={**os.environ, "PYTHONPATH": str(REPO)})
    first = read_log(killed / "log.jsonl")
    assert max(s for s in first if "loss/train/total" in first[s]) < 7, "the kill should land before the run ends"
    result = script(command[1], command[2:], cwd=REPO)  # the same command again, here: the kill was the process
    assert result.returncode == 0, result.stderr[-4000:]
    assert_same_losses(straight, read_log(killed / "log.jsonl"), 8)
    resumed = re.search(r"^resuming at batch (\d+) from (\S+)$", result.stdout, re.M)
    assert resumed and resumed.group(2) == f"{killed}/ckpt/ep0-ba{int(resumed.group(1)) - 1}-rank0.pt", result.stdout
    saved = re.findall(r"^saved checkpoint (\S+)$", result.stdout, re.M)
    assert [Path(path).name for path in saved] == [f"ep0-ba{b}-rank0.pt" for b in range(int(resumed.group(1)) + 1, 9)
                                                   if b % 2 == 0], result.stdout


# Renames a checkpoint that runs a command over the honest one and back, as fast as it can, until told to stop.
SWAPPER = """
import os, sys, time
target, honest, evil, stop = sys.argv[1:5]
deadline = time.time() + 600
while not os.path.exists(stop) and time.time() < deadline:
    for source in (evil, honest):
        os.link(source, target + ".swap")
        os.replace(target + ".swap", target)
"""


@pytest.mark.slow
def test_a_checkpoint_swapped_back_and_forth_during_a_resume_is_never_loaded_unchecked(tiny_run, straight_folder,
                                                                                         tmp_path):
    """Someone who can write the save folder swaps the latest checkpoint for one that runs a command, and back, all
    through the resume: whatever vocagno read is what Composer loads (its private copy), so the run resumes from
    the honest checkpoint or stops in one line, and nothing runs."""
    import shutil
    import subprocess

    from test_untrusted import gadgets, whole_with

    folder = tmp_path / "ckpt"
    shutil.copytree(straight_folder / "ckpt", folder, symlinks=True)
    target = folder / "ep0-ba8-rank0.pt"
    shutil.copy(target, tmp_path / "honest.pt")
    marker = tmp_path / "ran"
    whole_with(gadgets(marker)["os.system"], tmp_path / "evil.pt")
    swapper = subprocess.Popen([sys.executable, "-c", SWAPPER, str(target), str(tmp_path / "honest.pt"),
                                str(tmp_path / "evil.pt"), str(tmp_path / "stop")])
    try:
        result = run_train(tiny_run[0], *CHECKPOINTED, "max_duration=10ba", f"save_folder={folder}",
                           "run_name=swapped", f"loggers.jsonl.path={tmp_path}/log.jsonl", check=False)
    finally:
        (tmp_path / "stop").touch()
        swapper.wait(timeout=60)
    assert not marker.exists(), "a swapped-in checkpoint was loaded unchecked"
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    if result.returncode == 0:
        assert f"resuming at batch 9 from {target}" in result.stdout, result.stdout
    else:
        assert result.returncode == 2 and len(errors) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
        assert errors[0].startswith("error: autoresume: ") and "refused to load" in errors[0], errors


@pytest.mark.slow
def test_an_interrupted_checkpoint_save_resumes_with_the_same_command(tiny_run, straight, tmp_path):
    """A kill or a full disk during a save leaves a truncated checkpoint (here the latest, ba4) and a partial one
    past it (ba6): the same command falls back to ba2 and ends with the losses of an uninterrupted run."""
    broken = tmp_path / "broken"
    resume = [*CHECKPOINTED, "max_duration=6ba", f"save_folder={broken}/ckpt", "run_name=broken",
              f"loggers.jsonl.path={broken}/log.jsonl"]
    run_train(tiny_run[0], *resume, "max_duration=4ba")
    latest = broken / "ckpt" / "ep0-ba4-rank0.pt"
    latest.write_bytes(latest.read_bytes()[: latest.stat().st_size // 2])
    (broken / "ckpt" / "ep0-ba6-rank0.pt").write_bytes(b"PK\x03\x04 partial")
    result = run_train(tiny_run[0], *resume)
    assert "removing" in result.stdout and "ep0-ba4-rank0.pt: an incomplete checkpoint" in result.stdout
    first_six = {step: row for step, row in straight.items() if step < 6}  # steps count from 0
    assert_same_losses(first_six, read_log(broken / "log.jsonl"), 6)
    assert os.path.realpath(broken / "ckpt" / "latest-rank0.pt").endswith("ep0-ba6-rank0.pt")


SHORT_TEACHER = ("teacher.name_or_path=null", "teacher.config={model_type: mistral, hidden_size: 32, "
                 "intermediate_size: 64, num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1, "
                 "max_position_embeddings: 64}")


@pytest.mark.parametrize("overrides, message", [
    (["model.config.max_position_embeddings=64"],
     "hold 128 student tokens, but the student .* max_position_embeddings=64"),
    (SHORT_TEACHER, "hold 128 student tokens .* the teacher has max_position_embeddings=64"),
])
def test_models_too_short_for_the_shards_are_refused(tiny_run, overrides, message):
    assert re.search(message, refusal(tiny_run[0], *overrides, "max_duration=1ba", "eval_loader=null"))


def test_fewer_samples_than_one_global_batch_is_refused_at_start(tmp_path):
    from vocagno.conversion.convert import main as convert_main

    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": f"Problem {i}: 2 + {i} = {2 + i}. " * 20}) + "\n" for i in range(3)))
    assert convert_main(["--input", str(docs), "--student-tokenizer", "llama2", "--teacher-tokenizer",
                         "mistral", "--seq-len", "128", "--out-root", str(tmp_path / "shards" / "train")]) == 0
    samples = ShardMetadata.read(tmp_path / "shards" / "train").totals["samples"]
    assert 0 < samples < 8
    assert f"hold {samples} samples, fewer than one global batch of 8" in refusal(tmp_path, "eval_loader=null")


@pytest.mark.parametrize("yaml", sorted(p for p in (REPO / "yamls").rglob("*.yaml") if "llm-foundry" not in p.parts),
                         ids=lambda p: str(p.relative_to(REPO / "yamls")))
def test_every_yaml_loads_and_validates(yaml):
    """Every yaml of train.py, the table variants (a base: plus overrides) too, loads and builds its algorithm without
    downloading anything (a named teacher is loaded when training starts). yamls/llm-foundry/ holds llm-foundry's
    (tests/integration/test_llmfoundry.py)."""
    cfg = load_config(str(yaml), [])
    if cfg.get("teachers") is not None:  # several teachers: one VocAgnoLM with the set, in the yaml's order
        [algorithm] = build_algorithms(cfg, teacher_tok=None)
        assert isinstance(algorithm, VocAgnoLM) and [each.name for each in algorithm.teachers.all] == list(cfg.teachers)
    elif cfg.get("teacher") is not None:
        algorithms = build_algorithms(cfg, teacher_tok=None) if cfg.teacher.get("name_or_path") else []
        assert all(isinstance(a, (VocAgnoLM, ULD, KLD)) for a in algorithms)
        assert len(algorithms) == (1 if cfg.teacher.get("name_or_path") else 0)
    else:
        assert build_algorithms(cfg, teacher_tok=None) == []
    if not yaml.name.startswith(("tiny", "miniature")):  # the paper's scale
        assert cfg.tokenizer.name == "TinyLlama/TinyLlama_v1.1" and cfg.model.name_or_path == "TinyLlama/TinyLlama_v1.1"
        assert cfg.global_train_batch_size * cfg.variables.seq_len == 1024 * 2048
        assert cfg.optimizer.lr == 8e-5 and cfg.scheduler.alpha_f == pytest.approx(0.1)


def test_a_decoupled_weight_decay_that_shrinks_weights_each_step_is_refused():
    with pytest.raises(ValueError, match=r"optimizer.weight_decay=0.1 would shrink every weight by 10.0% per step"):
        load_config(TINY, ["optimizer.weight_decay=0.1"])
    assert load_config(TINY, ["optimizer.weight_decay=8e-6"]).optimizer.weight_decay == 8e-6


@pytest.mark.parametrize("override, message", [
    ("teacher.trust_remote_code='false'", "teacher.trust_remote_code must be true or false, got 'false'"),
    ("model.trust_remote_code='no'", "model.trust_remote_code must be true or false, got 'no'"),
    ("autoresume='true'", "autoresume must be true or false"),
    ("optimizer.lr=fast", "optimizer.lr must be a positive number, got 'fast'"),
    ("teacher.dtype=float128", "teacher.dtype must be a torch dtype .*, got 'float128'"),
    ("variables.seq_len=1", "variables.seq_len must be an integer >= 2, got 1"),
    ("global_train_batch_size=0", "global_train_batch_size must be a positive integer, got 0"),
])
def test_values_of_the_wrong_kind_are_refused_naming_the_key(override, message):
    with pytest.raises(ValueError, match=message):
        load_config(TINY, [override])


def test_a_string_trust_remote_code_is_refused_by_the_algorithm():
    with pytest.raises(ValueError, match="trust_remote_code must be True or False, got 'false'"):
        VocAgnoLM(teacher={"name_or_path": "Qwen/Qwen2.5-Math-7B-Instruct", "trust_remote_code": "false"})


def test_a_check_scored_by_that_is_not_a_boolean_is_refused_for_every_teacher():
    """0 or "" would switch the scorer check off, "false" would leave it on: under teacher:, under teachers.NAME and
    given to the algorithm, only true or false."""
    with pytest.raises(ValueError, match="check_scored_by must be True or False, got 0"):
        VocAgnoLM(teacher={"name_or_path": "tiny-math-teacher", "check_scored_by": 0})
    with pytest.raises(ValueError, match="teachers.gsm8k: check_scored_by must be True or False, got 'false'"):
        VocAgnoLM(teachers={"gsm8k": {"name_or_path": "tiny-math-teacher", "check_scored_by": "false"},
                            "other": {"name_or_path": "tiny-math-teacher"}})


def test_misspelled_keys_are_errors(tmp_path):
    with pytest.raises(ValueError, match=r"unknown config key optimiser \(did you mean optimizer\?\)"):
        load_config(TINY, ["optimiser.lr=1"])
    with pytest.raises(ValueError, match=r"unknown config key teacher.dtyp \(did you mean teacher.dtype\?\)"):
        load_config(TINY, ["teacher.dtyp=float32"])


@pytest.mark.parametrize("override, message", [
    ("algorithms.vocagno.topk_ration=0.3",
     r"algorithms.vocagno.topk_ration \(did you mean algorithms.vocagno.topk_ratio"),
    ("algorithms.vocagn={}", r"algorithm algorithms.vocagn \(did you mean algorithms.vocagno\?\)"),
    ("train_loader.dataset.shufle=true", r"train_loader.dataset.shufle \(did you mean train_loader.dataset.shuffle"),
    ("eval_loader.convert_if_missing.text_feild=content",
     r"eval_loader.convert_if_missing.text_feild \(did you mean eval_loader.convert_if_missing.text_field"),
    ("callbacks.speed_monitor.window=3",
     r"callbacks.speed_monitor.window \(did you mean callbacks.speed_monitor.window_size"),
    ("train_loader.dataset={streams: {a: {local: x, proportion: 1, repet: 2}}}",
     r"train_loader.dataset.streams.a.repet \(did you mean train_loader.dataset.streams.a.repeat"),
])
def test_misspelled_keys_of_nested_sections_are_refused_before_anything_loads(override, message, monkeypatch):
    monkeypatch.setattr(training_run, "load_tokenizer", reached)  # refused before the first thing a run loads
    with pytest.raises(ValueError, match=message):
        train(load_config(TINY, [override]))


@pytest.mark.parametrize("made", ["missing", "empty"])
def test_a_data_folder_named_on_the_command_line_never_gets_the_yamls_corpus(tmp_path, made):
    folder = tmp_path / "mathy_mistrl"  # a typo of the folder the user converted
    if made == "empty":
        folder.mkdir()
    cfg = load_config(TINY, [f"variables.data={folder}", "loggers.console=null"])
    with pytest.raises(ValueError) as refused:
        train(cfg)
    assert str(refused.value).startswith(f"train_loader.dataset.local: {folder} holds no converted shards "
                                         f"({TINY}'s train_loader.convert_if_missing converts its input into "
                                         "shards/gsm8k_sample_mistral_128, and the command line names another folder)"
                                         ), refused.value
    # the converter's command that makes shards this run reads, and the key that would convert them
    assert (f"--out-root {folder} --student-tokenizer llama2 --teacher-tokenizer mistral --seq-len 128: "
            "docs/conversion.md), or say what to convert into it with train_loader.convert_if_missing.input=FILE"
            ) in str(refused.value)
    assert (sorted(folder.iterdir()) == []) if made == "empty" else not folder.exists()


def test_a_variant_yaml_naming_a_folder_converts_into_it_only_what_it_names_and_says_so(tmp_path, capsys, tokenizers):
    heldout = REPO / "vocagno" / "assets" / "text" / "gsm8k_heldout_100.jsonl"
    (tmp_path / "mine.yaml").write_text(f"base: {TINY}\nvariables:\n  heldout: {tmp_path}/held\n")
    cfg = load_config(str(tmp_path / "mine.yaml"), [])
    with pytest.raises(ValueError, match=rf"{tmp_path}/held holds no converted shards \({TINY}'s eval_loader"
                                         r".convert_if_missing converts its input into shards/gsm8k_heldout_mistral_"
                                         rf"128, and {tmp_path}/mine.yaml names another folder\)"):
        build_loader(cfg.eval_loader, tokenizers["llama2"], tokenizers["mistral"], 8, "eval_loader")
    (tmp_path / "mine.yaml").write_text(f"base: {TINY}\nvariables:\n  heldout: {tmp_path}/held\n"
                                        f"eval_loader:\n  convert_if_missing:\n    input: {heldout}\n")
    cfg = load_config(str(tmp_path / "mine.yaml"), [])
    # Naming the base's own folder again, or changing what its name is made of, keeps the base's conversion.
    again = load_config(str(tmp_path / "mine.yaml"), ["variables.data=shards/gsm8k_sample_mistral_128"])
    assert again.train_loader.convert_if_missing.input == "vocagno/assets/text/gsm8k_train_500.jsonl"
    shorter = load_config(TINY, ["variables.seq_len=64"])
    assert (shorter.train_loader.dataset.local, shorter.train_loader.convert_if_missing.seq_len) == (
        "shards/gsm8k_sample_mistral_64", 64)
    # Another converter flag is no input: the base's corpus still stays out of another folder; so it does out of one
    # named through another variable, or a template of the same variables; written differently, a folder is itself.
    for other in (["variables.data=shards/mine", "train_loader.convert_if_missing.seq_len=64"],
                  ["variables.data=${variables.heldout}"], ["train_loader.dataset.local=${variables.heldout}"],
                  ["variables.data=shards/mine_${variables.seq_len}"]):
        assert "not_for" in load_config(TINY, other).train_loader.convert_if_missing, other
    same = load_config(TINY, ["variables.data=./shards/gsm8k_sample_mistral_128/"])
    assert same.train_loader.convert_if_missing.input == "vocagno/assets/text/gsm8k_train_500.jsonl"
    with pytest.raises(ValueError, match="a key given as another kind of value than its base gives it"):
        load_config(TINY, ["train_loader.convert_if_missing=[a.jsonl]"])
    loader = build_loader(cfg.eval_loader, tokenizers["llama2"], tokenizers["mistral"], 8, "eval_loader")
    assert f"eval_loader: converting {heldout} into {tmp_path}/held (convert_if_missing)\n" in capsys.readouterr().out
    assert ShardMetadata.read(tmp_path / "held").totals["documents read"] == 100 and len(loader.dataset) > 0


@pytest.mark.slow
def test_a_mistake_ends_train_py_in_one_line_and_the_switch_shows_its_traceback(tmp_path, monkeypatch):
    command = [sys.executable, str(REPO / "train.py"), TINY, f"variables.data={tmp_path}/typo"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = script(command[1], command[2:], cwd=REPO)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]  # one line
    assert result.stderr.startswith(f"error: train_loader.dataset.local: {tmp_path}/typo holds no converted shards")
    monkeypatch.setenv("VOCAGNO_TRACEBACK", "1")  # the error goes on to the interpreter: its traceback, exit code 1
    with pytest.raises(ValueError, match="^train_loader"):
        script(command[1], command[2:], cwd=REPO)
    monkeypatch.delenv("VOCAGNO_TRACEBACK")
    # Under Composer's launcher, a process and its rank: the same line, then the launcher's own report of the rank's
    # exit code.
    launched = run_whole([sys.executable, "-m", "composer.cli.launcher", "-n", "1", *command[1:]], 600, cwd=REPO,
                         env=env)
    lines = launched.stderr.strip().splitlines()
    assert launched.returncode == 2 and "Traceback" not in launched.stderr, launched.stderr[-3000:]
    assert lines[0].startswith(f"error: train_loader.dataset.local: {tmp_path}/typo holds no converted shards")
    assert "Rank 0 crashed with exit code 2" in lines[1]


def test_shards_of_other_tokenizers_are_refused(tiny_run):
    refused = refusal(tiny_run[0], "tokenizer.name=mistral", "max_duration=1ba")
    assert "student tokenizer is 'llama2'" in refused and "student tokenizer is 'mistral'" in refused
    refused = refusal(tiny_run[0], "teacher.tokenizer=deepseek-llm", "max_duration=1ba")
    assert "teacher tokenizer is 'mistral'" in refused and "teacher tokenizer is 'deepseek-llm'" in refused


@pytest.mark.parametrize("overrides", [
    ["algorithms.vocagno.selection=random"],
    ["algorithms.vocagno.alignment=chunk", "algorithms.vocagno.num_chunks=8", "algorithms.vocagno.aggregation=mean"],
], ids=["random", "chunk"])
def test_tiny_variants_of_the_method_train(tiny_run, tmp_path, overrides):
    """The controls and baselines that are options of the vocagno algorithm train from tiny.yaml plus overrides."""
    run_train(tiny_run[0], "max_duration=3ba", "eval_loader=null", f"loggers.jsonl.path={tmp_path}/log.jsonl",
              *overrides)
    steps = read_log(tmp_path / "log.jsonl")
    logged = [row for _, row in sorted(steps.items()) if "loss/train/kept_fraction" in row]
    kept, mapped = ([row[f"loss/train/{key}"] for row in logged] for key in ("kept_fraction", "mapped_fraction"))
    assert len(logged) == 3
    assert all(0.35 < k < 0.5 for k in kept), kept
    assert all(m == 1.0 for m in mapped) == ("algorithms.vocagno.alignment=chunk" in overrides), mapped


@pytest.mark.slow
@pytest.mark.parametrize("name, parts, overrides", [
    ("uld", {"ce", "uld"}, []),
    ("uld", {"ce", "uld"}, ["algorithms.uld.pairing=alignment"]),
    ("kld", {"ce", "soft_ce", "kl"}, []),
], ids=["uld", "uld-aligned", "kld"])
def test_tiny_baselines_train_from_their_yamls(tiny_run, tmp_path, name, parts, overrides):
    """yamls/tiny_uld.yaml and tiny_kld.yaml (tiny.yaml and tiny_qwen.yaml as their base:, vocagno turned off): 3 batches, the
    baseline's loss and its parts logged, the CE below the uniform guess over 32,000 tokens."""
    shards = tiny_run[0] if name == "uld" else tmp_path  # tiny.yaml's shards are tiny_uld.yaml's; Qwen's are made here
    run_train(shards, "max_duration=3ba", "eval_loader=null", f"loggers.jsonl.path={tmp_path}/log.jsonl",
              *overrides, yaml=str(REPO / "yamls" / f"tiny_{name}.yaml"))
    logged = [row for _, row in sorted(read_log(tmp_path / "log.jsonl").items()) if "loss/train/total" in row]
    assert len(logged) == 3
    assert all({f"loss/train/{part}" for part in parts} <= set(row) for row in logged)
    assert all(0 < row["loss/train/ce"] < math.log(32000) + 0.5 for row in logged)
    assert "loss/train/kept_fraction" not in logged[0]  # vocagno is off


def test_kld_refuses_a_teacher_of_another_vocabulary(tiny_run, tmp_path):
    refused = refusal(tiny_run[0], "max_duration=1ba", "eval_loader=null", "algorithms.vocagno=null", "algorithms.kld={}")
    assert "KLD needs one vocabulary" in refused and "'mistral'" in refused


def test_the_table_yamls_say_what_their_row_is(tmp_path):
    """Spot checks of the variants' merged configs: each differs from its base where its table says."""
    def load(name):
        return load_config(str(REPO / "yamls" / name), [])

    assert load("table2/chunk_16.yaml").algorithms.vocagno.num_chunks == 16
    assert load("table2/chunk_16.yaml").algorithms.vocagno.aggregation == "mean"
    exclude_min = load("table3/exclude_min.yaml").algorithms.vocagno
    assert (exclude_min.unmapped, exclude_min.aggregation, exclude_min.topk_ratio) == ("exclude", "min", 0.4)
    assert load("table1/rho1_llemma.yaml").algorithms.vocagno.topk_ratio == 0.6
    assert load("table1/uld_mistral.yaml").teacher.name_or_path == "gair-prox/Mistral-7B-ProXMath"
    assert load("table1/uld_mistral.yaml").algorithms.vocagno is None
    assert load("topk/random_40.yaml").algorithms.vocagno.selection == "random"
    assert load("cpt_baseline.yaml").get("teacher") is None
    (tmp_path / "a.yaml").write_text("base: b.yaml\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    with pytest.raises(ValueError, match="comes back to itself"):
        load_config(str(tmp_path / "a.yaml"), [])


def test_a_checkout_that_pip_never_installed_finds_vocagnos_algorithms(monkeypatch):
    """On PYTHONPATH without an install (the GPU image's way) no entry point is registered: train.py still finds its
    own algorithms, the ones pyproject.toml registers for llm-foundry."""
    import tomllib

    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"][ALGORITHM_GROUP]
    assert declared == OWN_ALGORITHMS
    monkeypatch.setattr(registry, "entry_points", lambda group: [])
    cfg = load_config(str(REPO / "yamls" / "tiny.yaml"), [])
    [algorithm] = build_algorithms(cfg, teacher_tok=None)
    assert type(algorithm).__name__ == "VocAgnoLM"


@pytest.mark.slow
def test_the_two_teacher_yaml_trains_with_both_and_ends_with_what_each_keeps(tiny_run, tmp_path):
    """yamls/tiny_two_teachers.yaml on a CPU (on tiny.yaml's shards, its base's): the GSM8K teacher reads the shards'
    Mistral tokens, the MATH teacher's DeepSeek tokens are made from the text; each step logs both teachers' shares of
    the kept tokens (combine: min: they add up to 1) and forward times; the run ends with what each teacher keeps and
    the combination."""
    result = run_train(tiny_run[0], "max_duration=4ba", "eval_interval=4ba", f"loggers.jsonl.path={tmp_path}/log.jsonl",
                       "loggers.console={}", "console_log_interval=4ba", "selection_report.samples=24",
                       yaml=str(REPO / "yamls" / "tiny_two_teachers.yaml"))
    steps = read_log(tmp_path / "log.jsonl")
    trained = [s for s in sorted(steps) if "loss/train/total" in steps[s]]  # logged with the step's loss
    assert len(trained) == 4
    for step in trained:
        shares = [steps[step][f"vocagno/teacher_share/{name}"] for name in ("math", "latex")]
        assert sum(shares) == pytest.approx(1) and all(0 <= share <= 1 for share in shares)
    assert sum(steps[step]["vocagno/teacher_share/latex"] for step in trained) > 0  # it gives some references
    assert all(steps[step][f"vocagno/teacher_forward_seconds/{n}"] > 0 for n in ("math", "latex") for step in
               range(1, 5))
    output = result.stdout + result.stderr
    assert "what the teacher keeps:" in output and "math" in output and "latex" in output
    line = re.search(r"^\[batch 4/4\] .* \| kept [0-9.]+ \| shares math ([0-9.]+) latex ([0-9.]+) \| lr ", output,
                     re.M)  # each teacher's share on the console line, as logged
    assert line and list(line.groups()) == [f'{steps[trained[-1]][f"vocagno/teacher_share/{n}"]:.2f}'
                                          for n in ("math", "latex")], [l for l in output.splitlines() if "[batch" in l]



def _streaming_shm(prefix: int) -> set[tuple[str, int]]:
    """The shared memory files of a Streaming prefix, by name and inode (a name taken again is another file)."""
    return {(entry.name, entry.inode()) for entry in os.scandir("/dev/shm") if entry.name.startswith(f"{prefix:06}_")}


@pytest.mark.slow
def test_a_run_cleans_what_a_killed_run_left_in_shared_memory_and_not_what_a_live_job_holds(tiny_run, tmp_path,
                                                                                               monkeypatch):
    """Two jobs on one node: a run starting unlinks the Streaming shared memory a killed run left on its local (which
    would refuse it: the same local with a remote), and leaves the shared memory of a job still reading its shards."""
    import tempfile

    from vocagno.data.dataset import TeacherGuidedDataset

    # The live job as on a fresh node: no Streaming file locks in its temporary folder, so it takes the lowest free
    # prefix (0 here), the first that Streaming's clean_stale_shared_memory unlinks.
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    remote = str(tiny_run[0] / "shards" / "train")
    live = TeacherGuidedDataset(local=str(tmp_path / "live"), remote=remote, batch_size=1)
    held = _streaming_shm(live._shm_prefix_int)
    assert held
    # Killed with its whole process group, as a node's death kills it: its resource tracker unlinks nothing. It reads
    # a sample first, which leaves Streaming's file locks of its prefix in /tmp: other datasets (pytest -n's other
    # worker) skip that prefix instead of mapping it.
    leave_behind = ("import pathlib, time; from vocagno.data.dataset import TeacherGuidedDataset; "
                    f"d = TeacherGuidedDataset(local={str(tmp_path / 'cache')!r}, remote={remote!r}, batch_size=1); "
                    f"d[0]; pathlib.Path({str(tmp_path / 'prefix')!r}).write_text(str(d._shm_prefix_int)); "
                    "time.sleep(600)")
    kill_when([sys.executable, "-c", leave_behind], (tmp_path / "prefix").exists, settle=0.5, cwd=REPO, env=env)
    left = _streaming_shm(int((tmp_path / "prefix").read_text()))
    assert left
    command = [sys.executable, str(REPO / "train.py"), TINY, f"train_loader.dataset.remote={remote}",
               f"train_loader.dataset.local={tmp_path}/cache", "train_loader.convert_if_missing=null",
               "eval_loader=null", "selection_report=null", "loggers.console=null", "loggers.picture=null",
               "max_duration=1ba"]
    result = script(command[1], command[2:], cwd=REPO)
    assert result.returncode == 0, result.stderr[-4000:]
    assert _streaming_shm(live._shm_prefix_int) == held
    assert not left & _streaming_shm(int((tmp_path / "prefix").read_text()))
    assert next(iter(live))["student_ids"].shape == (128,)


def test_a_cpu_run_keeps_the_large_blocks_its_steps_free_from_its_start(monkeypatch):
    """vocagno.memory on a CPU (tests/integration/test_memory.py shows what it changes): set before anything is built."""
    import torch

    monkeypatch.setattr(training_run, "keep_freed_memory", reached)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(Reached):
        train(load_config(TINY, []))


def test_a_run_names_its_cpu_for_composer_without_a_subprocess(tiny_run, monkeypatch):
    """Composer records the CPU model in checkpoints through py-cpuinfo, a Python subprocess on every rank (about
    1.2 s of CPU): a run reads the same name from /proc/cpuinfo."""
    import subprocess as processes

    import cpuinfo
    from composer.utils import collect_env

    name = cpuinfo.get_cpu_info()["brand_raw"]
    monkeypatch.setattr(collect_env, "get_cpu_model", collect_env.get_cpu_model)  # as it was, after this test
    collect_env.get_cpu_model.cache_clear()  # not asked yet in this process, whatever ran in it before
    refusal(tiny_run[0], "tokenizer.name=mistral")  # train as far as its shards' check

    def no_subprocess(*args, **kwargs):
        raise AssertionError(f"a subprocess: {args}")

    monkeypatch.setattr(processes, "Popen", no_subprocess)
    assert collect_env.get_cpu_model() == name


def test_vocagnos_own_algorithms_win_over_an_installs_stale_entry_points(monkeypatch):
    """An environment whose installed metadata predates a move of the code (an old `pip install -e .`, or an image
    with the code on PYTHONPATH) still names the old module: train.py takes vocagno's own classes, not that."""
    from importlib.metadata import EntryPoint

    stale = [EntryPoint("vocagno", "vocagno.algorithm:VocAgnoLM", ALGORITHM_GROUP)]
    monkeypatch.setattr(registry, "entry_points", lambda group: stale)
    assert algorithm("vocagno") is VocAgnoLM


def test_help_prints_the_usage_and_where_the_keys_are_and_no_args_names_help(monkeypatch, capsys):
    """train.py, the face, run as its command line runs it (in this process: its process is not the point)."""
    from helpers import command

    def face(argv):
        monkeypatch.setattr(sys, "argv", ["train.py", *argv])
        runpy.run_path(str(REPO / "train.py"), run_name="__main__")

    helped = command(face, ["--help"], capsys)
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout.startswith("usage: composer train.py YAML [KEY=VALUE ...]")
    assert f"{REPO}/docs/training.md" in helped.stdout and (REPO / "docs" / "training.md").is_file()
    with pytest.raises(Refused, match=r"python train.py --help says more"):
        training_run.command([])


def test_teachers_beside_an_inherited_teacher_name_the_key_that_turns_it_off(tmp_path):
    message = refusal(tmp_path, "teachers.math.name_or_path=tiny-math-teacher", "teachers.math.tokenizer=mistral")
    assert message.startswith("give teacher: (one) or teachers: (several, by name), not both") and \
        "set teacher: null beside your teachers:" in message


def test_a_save_folder_holding_a_runs_checkpoints_names_the_yaml_keys_that_decide(tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "ep0-ba2-rank0.pt").write_bytes(b"")  # Composer's saver judges by the names alone
    message = refusal(tmp_path, f"save_folder={tmp_path}/ckpt", "save_interval=2ba", "max_duration=2ba",
                      "eval_loader=null", "selection_report=null")
    assert message == (f"save_folder {tmp_path}/ckpt holds checkpoints past where this run starts (ep0-ba2-rank0.pt, "
                       "...): set autoresume: true to continue that run, save_overwrite: true to write over them, or "
                       "give another save_folder")
    assert "overwrite=True" not in message
