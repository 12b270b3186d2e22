"""The training yaml's ``base:`` chain (vocagno/training/config.py ``load_config``) given a yaml someone else wrote:
a chain too deep, or one that comes back to itself, is refused in one line that names it, before any base is merged."""

from pathlib import Path

import pytest

from vocagno.errors import Refused
from vocagno.training.config import MAX_BASE_DEPTH, load_config

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "yamls" / "tiny.yaml"


def chain(folder: Path, length: int) -> Path:
    """``y0.yaml`` whose ``base:`` chain is ``y1.yaml``, ..., ``y{length - 1}.yaml``, then yamls/tiny.yaml: ``length``
    variants above a complete yaml."""
    for i in range(length):
        base = f"y{i + 1}.yaml" if i + 1 < length else str(TINY)
        (folder / f"y{i}.yaml").write_text(f"base: {base}\nseed: {i}\n")
    return folder / "y0.yaml"


def test_a_base_chain_thousands_deep_is_refused_in_one_line_naming_it(tmp_path):
    with pytest.raises(Refused) as refused:
        load_config(str(chain(tmp_path, 5000)), [])
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"{tmp_path / 'y0.yaml'}: its base: chain names more than {MAX_BASE_DEPTH} bases "
                              f"({tmp_path / 'y0.yaml'} -> y1.yaml -> y2.yaml -> y3.yaml -> ... -> y32.yaml -> y33.yaml)")
    assert len(message) < 400


def test_a_base_chain_at_the_depth_allowed_loads(tmp_path):
    cfg = load_config(str(chain(tmp_path, MAX_BASE_DEPTH)), [])
    assert cfg.seed == 0 and cfg.run_name  # the nearest yaml's seed, the rest from tiny.yaml


def test_a_base_chain_that_comes_back_to_itself_is_refused_in_one_line_naming_it(tmp_path):
    (tmp_path / "a.yaml").write_text("base: b.yaml\n")
    (tmp_path / "b.yaml").write_text("base: c.yaml\n")
    (tmp_path / "c.yaml").write_text("base: ./a.yaml\n")
    with pytest.raises(Refused) as refused:
        load_config(str(tmp_path / "a.yaml"), [])
    assert str(refused.value) == (f"{tmp_path / 'c.yaml'}: its base: chain comes back to itself: "
                                  f"{tmp_path / 'a.yaml'} -> b.yaml -> c.yaml -> ./a.yaml (remove the base: that "
                                  "closes the loop)")


def test_a_base_beside_a_yaml_outside_the_repo_says_where_it_looked_and_the_shipped_one(tmp_path):
    """A new user's own yaml names ``base: tiny.yaml`` as the shipped variants do: the refusal says where it looked
    and how to name the shipped one."""
    (tmp_path / "mine.yaml").write_text("base: tiny.yaml\nmax_duration: 2ba\n")
    with pytest.raises(Refused) as refused:
        load_config(str(tmp_path / "mine.yaml"), [])
    assert str(refused.value) == (
        f"{tmp_path / 'mine.yaml'}: base: tiny.yaml names no yaml file: looked for {tmp_path / 'tiny.yaml'} (a base: "
        f"is a path beside the yaml that names it); for the shipped one write base: {TINY}")


def test_a_yaml_that_does_not_exist_is_named_with_the_shipped_one_of_that_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(Refused) as refused:
        load_config("tiny.yaml", [])
    assert str(refused.value) == f"tiny.yaml: no such yaml file (the shipped one: {TINY})"
    with pytest.raises(Refused, match=r"^nothing\.yaml: no such yaml file$"):
        load_config("nothing.yaml", [])


def test_a_yaml_that_leaves_out_the_optional_keys_runs_on_the_typed_sections_defaults():
    """tiny.yaml's sections, with what they may leave out taken away: each default comes from its typed section (one
    place), the keys a yaml may hold are those sections' keys, and a key given as null is its default too."""
    from omegaconf import OmegaConf as om

    from vocagno.teacher.config import TeacherConfig
    from vocagno.training.config import SCHEMA
    from vocagno.training.sections import (LoaderConfig, OptimizerConfig, RunConfig, SchedulerConfig,
                                           SelectionReportConfig)

    cfg = load_config(str(Path(__file__).resolve().parents[2] / "yamls" / "tiny.yaml"),
                      ["optimizer.weight_decay=null", "optimizer.betas=null", "train_loader.num_workers=null"])
    optimizer = OptimizerConfig.of(cfg.optimizer, "optimizer.")
    assert (optimizer.lr, optimizer.weight_decay, optimizer.betas) == (cfg.optimizer.lr, 0.0, (0.9, 0.95))
    assert LoaderConfig.of(cfg.train_loader).num_workers == 0 and LoaderConfig.of(cfg.train_loader).drop_last is True
    run = RunConfig.of(om.create({"eval_interval": "40ba", "run_name": "x"}))
    assert (run.eval_interval, run.save_interval, run.dist_timeout, run.autoresume) == ("40ba", "1ep", 600, False)
    assert SelectionReportConfig.of(None) == SelectionReportConfig(shards=None, samples=64, canaries=0.5)
    for key, section in (("optimizer", OptimizerConfig), ("scheduler", SchedulerConfig),
                         ("train_loader", LoaderConfig), ("selection_report", SelectionReportConfig),
                         ("teacher", TeacherConfig)):
        assert list(SCHEMA[key]) == section.keys()
    assert set(RunConfig.keys()) < set(SCHEMA)
    with pytest.raises(ValueError, match=r"unknown config key optimizer\.weight_decy \(did you mean "
                                         r"optimizer\.weight_decay\?\)"):
        OptimizerConfig.of({"lr": 1e-3, "weight_decy": 0.0}, "optimizer.")


def test_optimizer_kernels_build_the_multi_tensor_decoupled_adamw_and_master_weights_need_them():
    from composer.optim import DecoupledAdamW
    from omegaconf import OmegaConf as om
    from torch import nn

    from vocagno.training.builders import build_optimizer
    from vocagno.training.optimizers import MultiTensorDecoupledAdamW

    model = nn.Linear(4, 4)

    def built(dtype="bfloat16", **optimizer):
        return build_optimizer(om.create({"model": {"dtype": dtype},
                                          "optimizer": {"lr": 1e-3, "weight_decay": 1e-5, **optimizer}}), model)

    assert type(built()) is DecoupledAdamW
    for kernels in ("foreach", "fused"):
        multi = built(kernels=kernels, master_weights=True)
        assert type(multi) is MultiTensorDecoupledAdamW and multi.master_weights
        assert multi.one_kernel is (kernels == "fused")
        assert multi.defaults["weight_decay"] == 1e-5 and multi.defaults["betas"] == (0.9, 0.95)
    with pytest.raises(ValueError, match="optimizer.master_weights needs optimizer.kernels: foreach or fused"):
        built(master_weights=True)
    with pytest.raises(ValueError, match="the student's are float32: set model.dtype: bfloat16"):
        built(dtype=None, kernels="fused", master_weights=True)
    with pytest.raises(ValueError, match="optimizer.kernels must be composer or foreach or fused, got 'apex'"):
        built(kernels="apex")


@pytest.mark.parametrize("overrides, refusal", [
    (["optimizer.kernels=fusd"], "optimizer.kernels must be composer or foreach or fused, got 'fusd'"),
    (["selection_report.samples=0"], "selection_report.samples must be a positive integer, got 0"),
    (["selection_report.canaries=1.0"], r"selection_report.canaries must be the share of noise documents, in \[0, 1\)"),
    (["optimizer.lr=null"], "missing required keys: optimizer.lr"),
    (["scheduler.t_warmup=null"], "missing required keys: scheduler.t_warmup"),
])
def test_values_the_run_cant_take_are_refused_when_the_yaml_loads(overrides, refusal):
    """Refused in one line naming the key when the yaml is read, before anything is converted or loaded (a misspelt
    optimizer.kernels used to be found after both conversions; canaries 1.0 ended a finished run in a
    ZeroDivisionError)."""
    with pytest.raises(ValueError, match=refusal):
        load_config(str(Path(__file__).resolve().parents[2] / "yamls" / "tiny.yaml"), overrides)


def test_master_weights_the_optimizer_cant_keep_are_refused_with_the_speed_options():
    from vocagno.training.builders import check_speed_options

    tiny = str(Path(__file__).resolve().parents[2] / "yamls" / "tiny.yaml")
    with pytest.raises(ValueError, match="optimizer.master_weights needs optimizer.kernels: foreach or fused"):
        check_speed_options(load_config(tiny, ["optimizer.master_weights=true"]))
    with pytest.raises(ValueError, match="the student's are float32"):
        check_speed_options(load_config(tiny, ["optimizer.master_weights=true", "optimizer.kernels=fused"]))
    check_speed_options(load_config(tiny, ["optimizer.master_weights=true", "optimizer.kernels=fused",
                                           "model.dtype=bfloat16"]))
