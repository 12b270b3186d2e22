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
