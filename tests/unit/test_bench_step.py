"""benchmarks/bench_step.py's model building, checked on the CPU: where its runs make their random-init models."""

import sys
from pathlib import Path

import pytest
import torch
from helpers import Reached, reached
from omegaconf import OmegaConf

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import bench_step  # noqa: E402


def test_every_random_init_model_of_a_run_and_of_its_scoring_pass_is_built_on_the_device_it_names(monkeypatch):
    """On a GPU the paper preset's 7B teacher is built there, not initialized on the CPU for minutes: the student and
    the teacher that train.py builds, and the scoring pass's teacher (vocagno.score). Each build records the device
    torch makes tensors on ("meta" stands in for the GPU) and builds its tiny model on the CPU."""
    from vocagno.teacher import config
    from vocagno.training.config import scoring_teacher

    build, devices = config.build_causal_lm, []

    def recording(*args, **kwargs):
        devices.append(torch.empty(0).device.type)
        with torch.device("cpu"):
            return build(*args, **kwargs)

    monkeypatch.setattr(config, "build_causal_lm", recording)
    section = OmegaConf.create({"config": {"model_type": "llama", "hidden_size": 16, "intermediate_size": 32,
                                           "num_hidden_layers": 1, "num_attention_heads": 2}})
    cfg = OmegaConf.create({"seed": 0, "teacher": {**OmegaConf.to_container(section), "tokenizer": "llama2"}})
    with bench_step.random_init_on("meta"):
        config.build_causal_lm(section, 300)
        scoring_teacher(cfg, "bench")
    config.build_causal_lm(section, 300)
    assert devices == ["meta", "meta", "cpu"]  # inside it, and only there


def test_a_finished_run_is_let_go_before_the_next_one(monkeypatch):
    """A finished Trainer stays in reference cycles until the garbage collector's full pass: on a GPU, every run
    before would hold its models (the paper preset ran out of memory at its fifth run)."""
    import weakref

    from composer import Trainer
    from composer.models import HuggingFaceModel
    from transformers import LlamaConfig, LlamaForCausalLM

    def finished_run():
        student = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                                               num_hidden_layers=1, num_attention_heads=2))
        batches = [{"input_ids": torch.randint(0, 64, (2, 8)), "labels": torch.randint(0, 64, (2, 8))}]
        Trainer(model=HuggingFaceModel(student), train_dataloader=batches, max_duration="1ba",
                device_train_microbatch_size=2, loggers=[], progress_bar=False).fit()
        return weakref.ref(student)

    student = finished_run()
    assert student() is not None  # dropped, yet held: what bench_step's runs must not leave
    bench_step.free_earlier_runs()
    assert student() is None

    monkeypatch.setattr(bench_step, "free_earlier_runs", reached)
    for first_thing_of in (lambda: bench_step.run(None, True, "batch", 1), lambda: bench_step.score_once(None, "", "")):
        with pytest.raises(Reached):  # before it builds anything
            first_thing_of()
