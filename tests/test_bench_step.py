"""benchmarks/bench_step.py's model building, checked on the CPU: where its runs make their random-init models."""

import sys
from pathlib import Path

import torch
from omegaconf import OmegaConf

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import bench_step  # noqa: E402


def test_every_random_init_model_of_a_run_and_of_its_scoring_pass_is_built_on_the_device_it_names(monkeypatch):
    """On a GPU the paper preset's 7B teacher is built there, not initialized on the CPU for minutes: the student and
    the teacher that train.py builds, and the scoring pass's teacher (vocagno.score). Each build records the device
    torch makes tensors on ("meta" stands in for the GPU) and builds its tiny model on the CPU."""
    import train
    from vocagno import config, score

    build, devices = config.build_causal_lm, []

    def recording(*args, **kwargs):
        devices.append(torch.empty(0).device.type)
        with torch.device("cpu"):
            return build(*args, **kwargs)

    monkeypatch.setattr(config, "build_causal_lm", recording)
    monkeypatch.setattr(train, "build_causal_lm", recording)
    section = OmegaConf.create({"config": {"model_type": "llama", "hidden_size": 16, "intermediate_size": 32,
                                           "num_hidden_layers": 1, "num_attention_heads": 2}})
    cfg = OmegaConf.create({"seed": 0, "teacher": {**OmegaConf.to_container(section), "tokenizer": "llama2"}})
    with bench_step.random_init_on("meta"):
        train.build_causal_lm(section, 300)
        score.Teacher.from_config(cfg, "bench")
    train.build_causal_lm(section, 300)
    assert devices == ["meta", "meta", "cpu"]  # inside it, and only there
