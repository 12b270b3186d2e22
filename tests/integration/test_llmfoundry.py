"""vocagno inside llm-foundry 0.22 itself: installed beside it in one resolve, trained by its ``train_from_yaml``.

The venv is built once (``pip install -e REPO llm-foundry==0.22.0``: a single resolve, so our pins and llm-foundry's
must agree; it gets our exact Streaming and torch, and transformers 4.51 and datasets 3.6, the low ends of our
ranges) over the test's own torch: a ``.pth`` file puts links to the test venv's torch, triton and nvidia-*
distributions after its own packages, so pip takes them (about 4 GB, not installed again) and installs everything
else into the new venv, as a fresh install would. It is kept under
``$VOCAGNO_TEST_VENVS`` (default ``~/.cache/vocagno-test-venvs``) until what it installs changes (``pyproject.toml``
but for the test extra and the tools' settings, llm-foundry's pin, the Python, the venv beneath it). Where it can't be
installed (no package registry) the test is skipped, saying so; in CI (``CI`` set) that is a failure instead.
"""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from helpers import private_shm_works, with_private_shm

pytestmark = pytest.mark.slow  # builds llm-foundry's venv and trains in it: minutes

REPO = Path(__file__).resolve().parents[2]
FOUNDRY = "llm-foundry==0.22.0"


def _what_it_installs() -> str:
    """llm-foundry's pin, the Python, the venv it is layered over and the versions it takes from there, and
    ``pyproject.toml`` but for what the install does not record (the test extra, pytest's and ruff's settings):
    editing those keeps the venv."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: the whole file
        return FOUNDRY + sys.prefix + str(_layered_versions()) + (REPO / "pyproject.toml").read_text()
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    project["project"].pop("optional-dependencies", None)
    for tool in ("pytest", "ruff"):
        project.get("tool", {}).pop(tool, None)
    return json.dumps([FOUNDRY, list(sys.version_info[:2]), sys.prefix, _layered_versions(), project], sort_keys=True)


def _run(command: list[str], timeout: int, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, **kwargs)


# The distributions the llm-foundry venv takes from the test venv: torch and what its wheel brings (CUDA's libraries,
# Triton), about 4 GB; every other package is installed into it, as a fresh install would.
LAYERED = re.compile(r"torch|triton|nvidia-.*")


def _layered_versions() -> list[str]:
    """The distributions of this venv the llm-foundry venv takes, with their versions (part of its cache key)."""
    from importlib.metadata import distributions

    return sorted(f"{d.metadata['Name']}=={d.version}" for d in distributions()
                  if LAYERED.fullmatch(d.metadata["Name"].lower()))


def _layer_over_this_venv(python: Path) -> None:
    """The venv of ``python`` sees this venv's torch, triton and nvidia-* distributions after its own packages: links
    to their files in a folder of its own, named by a ``.pth`` file (read at start). Nothing else of this venv is
    visible there, so a package vocagno or llm-foundry uses without declaring it is missing there as it would be in a
    fresh install."""
    from importlib.metadata import distributions

    venv = python.parent.parent
    lower = venv / "layered-from-test-venv"
    lower.mkdir()
    for dist in distributions():
        if not LAYERED.fullmatch(dist.metadata["Name"].lower()):
            continue
        root = Path(dist.locate_file(""))
        tops = {Path(str(file)).parts[0] for file in dist.files or ()}
        for top in tops:
            if top != ".." and (root / top).exists() and not (lower / top).exists():
                (lower / top).symlink_to(root / top)
    theirs = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], 120)
    (Path(theirs.stdout.strip()) / "_vocagno_test_venv.pth").write_text(f"{lower}\n")


@pytest.fixture(scope="module")
def foundry_python() -> str:
    venvs = Path(os.environ.get("VOCAGNO_TEST_VENVS", Path.home() / ".cache" / "vocagno-test-venvs"))
    venv = venvs / FOUNDRY.replace("==", "-")
    python = venv / "bin" / "python"
    stamp = venv / "made-from"
    wanted = hashlib.sha256(_what_it_installs().encode()).hexdigest()
    if not (python.exists() and stamp.exists() and stamp.read_text() == wanted):
        shutil.rmtree(venv, ignore_errors=True)
        made = _run([sys.executable, "-m", "venv", str(venv)], 300)
        if made.returncode == 0:
            _layer_over_this_venv(python)
            # --no-compile: the runs compile what they import, a fraction of what pip would compile up front
            made = _run([str(python), "-m", "pip", "install", "-q", "--no-compile", "-e", str(REPO), FOUNDRY], 1800)
        if made.returncode != 0:
            message = f"could not install vocagno beside {FOUNDRY}:\n{made.stdout[-3000:]}\n{made.stderr[-3000:]}"
            if os.environ.get("CI"):
                pytest.fail(message)
            pytest.skip(message)
        stamp.write_text(wanted)
    # The venv may have been made from another checkout: point its editable vocagno at this one.
    where = _run([str(python), "-c", "import vocagno; print(vocagno.__file__)"], 120)
    if Path(where.stdout.strip()).parent.parent != REPO:
        relinked = _run([str(python), "-m", "pip", "install", "-q", "--no-deps", "-e", str(REPO)], 600)
        assert relinked.returncode == 0, relinked.stderr
    return str(python)


@pytest.mark.timeout(3600)  # its venv's first build (pip install, its own timeouts) counts in its time
def test_llmfoundry_trains_with_vocagno_on_its_own_text_loader_and_on_ours(foundry_python, tmp_path):
    """(a) llm-foundry's ``text`` loader on a token MDS from its ``convert_dataset_json``, the teacher side made per
    batch, in the training process and in 2 loader workers; (b) ``train_loader: {name: vocagno}`` on our shards; (c)
    the same on shards scored once, with cached teacher losses and no teacher loaded; (d) ``name: vocagno`` on a
    mixture of two streams, logging each one's share and kept fraction; (e) two teachers (``teachers:``) on our
    loader with 2 workers making the second teacher's side, and on its text loader, logging each teacher's share.
    (f) docs/drop-in.md's yaml (``yamls/llm-foundry/tiny.yaml``: llm-foundry's MPT, the shipped teacher). All log
    ``loss/train/kept_fraction`` (tokenizers: TinyLlama's, Qwen2.5's, Mistral's; models: tiny random-init)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VOCAGNO_CACHE")}
    runner = [foundry_python, str(REPO / "tests" / "support" / "llmfoundry_run.py"), str(tmp_path)]
    # Its own /dev/shm: llm-foundry's text loader registers Streaming's shared memory without vocagno's lock, and
    # took the prefix a job of the other test worker took at the same moment (FileExistsError: '/008403_locals').
    why = private_shm_works()
    if why:
        warnings.warn(f"llm-foundry's runs share this machine's /dev/shm with the other tests' jobs: {why}")
    result = _run(runner if why else with_private_shm(runner), 1200, cwd=tmp_path,
                  env={**env, "VOCAGNO_CACHE": str(tmp_path / "cache")})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    runs = {r["run"]: r for r in map(json.loads, (line for line in result.stdout.splitlines() if line.startswith("{")))}
    assert set(runs) == {"text-loader", "text-loader-workers", "vocagno-loader", "vocagno-loader-cached",
                         "vocagno-loader-mixture", "vocagno-loader-two-teachers", "text-loader-two-teachers",
                         "drop-in-yaml"}
    assert [run["teacher_loaded"] for run in runs.values()] == [True, True, True, False, True, True, True, True]
    # With workers they make the teacher side, and the run is the same: the same kept fractions, step by step.
    assert runs["text-loader-workers"]["collate"] == "WithTeacherSide" != runs["text-loader"]["collate"]
    assert runs["text-loader-workers"]["kept_fraction"] == runs["text-loader"]["kept_fraction"]
    for run in runs.values():
        assert run["batches"] == 3 and len(run["kept_fraction"]) == 3, run
        assert all(0.35 < kept < 0.5 for kept in run["kept_fraction"]), run  # 40% of the mapped, plus the unmapped
        assert run["versions"]["llm-foundry"] == "0.22.0"
        assert run["versions"]["mosaicml-streaming"].startswith("0.12.")
        assert run["versions"]["transformers"].startswith("4.51.")
    mixture = runs["vocagno-loader-mixture"]["streams"]
    assert sorted(mixture) == [f"vocagno/{what}/{name}" for what in ("kept_fraction", "stream_share")
                               for name in ("gsm8k", "heldout")]
    for step in range(3):
        assert mixture["vocagno/stream_share/gsm8k"][step] + mixture["vocagno/stream_share/heldout"][step] == 1.0
    assert all(0.2 < kept < 0.7 for name in ("gsm8k", "heldout") for kept in mixture[f"vocagno/kept_fraction/{name}"])
    assert all(not run["streams"] for name, run in runs.items() if name != "vocagno-loader-mixture")
    # Two teachers: each one's share of the kept tokens every step (min: they add up to 1; mean: each at most 1).
    assert runs["vocagno-loader-two-teachers"]["collate"] == "WithOtherTeachers"
    for name, run in runs.items():
        if "two-teachers" not in name:
            assert not run["shares"]
            continue
        assert sorted(run["shares"]) == ["vocagno/teacher_share/mistral", "vocagno/teacher_share/qwen"]
        for step in range(3):
            mistral, qwen = (run["shares"][f"vocagno/teacher_share/{n}"][step] for n in ("mistral", "qwen"))
            assert (mistral + qwen == 1.0) if name.startswith("vocagno") else (0 < mistral <= 1 and 0 < qwen <= 1)
