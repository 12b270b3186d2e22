"""The recipe a run publishes (in every checkpoint, then in the exported model card): no value read from the
environment, nor one built on it, whatever the yaml reads; the run itself still reads them."""

from pathlib import Path

from omegaconf import OmegaConf as om

from vocagno.training.config import load_config, published_yaml

TINY = str(Path(__file__).resolve().parents[2] / "yamls" / "tiny.yaml")


def test_values_read_from_the_environment_are_left_out_named_and_still_read_by_the_run(monkeypatch, tmp_path):
    monkeypatch.setenv("VOCAGNO_TEST_TOKEN", "hunter2")
    monkeypatch.setenv("VOCAGNO_TEST_BUCKET", "team-secret-bucket")
    yaml = tmp_path / "mine.yaml"
    yaml.write_text(f"base: {TINY}\nrun_name: ${{oc.env:VOCAGNO_TEST_TOKEN}}\n"
                    "save_folder: s3://${oc.env:VOCAGNO_TEST_BUCKET,none}/runs/${run_name}\n"
                    "variables:\n  secrets: {token: '${oc.env:VOCAGNO_TEST_TOKEN}'}\n"
                    "  copy_of_secrets: ${variables.secrets}\n")
    cfg = load_config(str(yaml), ["loggers.jsonl.path=logs/${run_name}.jsonl"])
    # the run reads every value as before, as plain containers too (how train.py hands sections to Composer)
    assert (cfg.run_name, cfg.save_folder) == ("hunter2", "s3://team-secret-bucket/runs/hunter2")
    assert om.to_container(cfg.loggers)["jsonl"]["path"] == "logs/hunter2.jsonl"
    assert om.to_container(cfg.variables)["copy_of_secrets"] == {"token": "hunter2"}
    published = published_yaml(cfg)
    assert "hunter2" not in published and "team-secret-bucket" not in published
    recipe = om.create(published)
    assert recipe.run_name == "<left out: read from the environment (VOCAGNO_TEST_TOKEN)>"
    assert recipe.save_folder == "<left out: read from the environment (VOCAGNO_TEST_BUCKET)>"
    assert recipe.loggers.jsonl.path == "logs/<left out: read from the environment (VOCAGNO_TEST_TOKEN)>.jsonl"
    assert recipe.variables.copy_of_secrets.token == "<left out: read from the environment (VOCAGNO_TEST_TOKEN)>"
    assert not any(om.is_interpolation(recipe, key) for key in recipe)  # a plain yaml: export reads it as it is


def test_a_yaml_that_reads_no_environment_is_published_resolved_as_it_was():
    cfg = load_config(TINY, ["run_name=plain-${seed}"])
    assert published_yaml(cfg) == om.to_yaml(cfg, resolve=True)
    assert om.create(published_yaml(cfg)).run_name == f"plain-{cfg.seed}"
