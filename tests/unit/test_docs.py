"""The docs say what the code does: every command line in README.md, docs/*.md and scripts/README.md names a module,
script or yaml that exists, and its arguments parse, so a renamed flag fails here instead of a reader. Nothing runs:
argparse CLIs parse their real arguments (their ``main`` stops at ``parse_args``), ``train.py``'s yaml and overrides
load through ``vocagno.training.config.load_config``, launchers (``composer``, ``torchrun``, ``pip``, ``pytest``) through their
own parsers. Also: code blocks name their language (output is ``text``, not a shell), the README keeps the two
commands ``.ci/run`` runs, every key of ``train.py``'s schema is on docs/training.md, and links between pages resolve.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import importlib.util
import inspect
import io
import re
import shlex
import sys
from importlib.metadata import entry_points
from pathlib import Path
from unittest import mock

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
PAGES = [README, *DOCS, REPO / "scripts" / "README.md"]
SHELL_BLOCKS = {"bash", "sh", "shell", "console"}
# The README's first block: the two commands for a fresh machine (.ci/run runs the second).
FRESH_MACHINE = [
    "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/composer train.py yamls/tiny.yaml",
    'python3 -m venv .venv && .venv/bin/pip install -e ".[test]" && .venv/bin/python -m pytest -q -n 2 --dist loadfile '
    '-m "not slow" --durations=30',
]
# Words an inline code span starts with when it is a command line (checked like the blocks' lines).
COMMAND_WORDS = ("python", "python3", "composer", "torchrun", "pytest", "pip", "sbatch")
SYNOPSIS = re.compile(r"\[[^\]]*\.\.\.\]")  # `composer train.py YAML [key=value ...]`: a usage line, not a command
SHELL_BUILTINS = {"cd", "export", "ls", "mkdir", "cat", "echo", "source"}


def fenced_blocks(path: Path) -> list[tuple[str, int, list[str]]]:
    """(language, line number of the opening fence, the lines inside) of each fenced code block."""
    blocks, lines, i = [], path.read_text(encoding="utf-8").splitlines(), 0
    while i < len(lines):
        opening = re.match(r"^\s*(`{3,}|~{3,})\s*(\S*)", lines[i])
        if not opening:
            i += 1
            continue
        fence, start = opening.group(1), i
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            i += 1
        blocks.append((opening.group(2), start + 1, lines[start + 1 : i]))
        i += 1
    return blocks


def prose(path: Path) -> str:
    """The page without its fenced blocks (their lines left empty, so line numbers hold)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    for _, start, body in fenced_blocks(path):
        for k in range(start - 1, start + len(body) + 1):
            if k < len(lines):
                lines[k] = ""
    return "\n".join(lines)


def block_commands(path: Path) -> list[tuple[str, str]]:
    """(where, command line) for each command in the page's shell blocks; continuation lines joined."""
    found = []
    for language, start, body in fenced_blocks(path):
        if language not in SHELL_BLOCKS:
            continue
        pending, first = "", 0
        for offset, line in enumerate(body, start + 1):
            if language == "console":  # a console block: commands after "$ ", output otherwise
                if not line.startswith("$ ") and not pending:
                    continue
                line = line[2:] if line.startswith("$ ") else line
            if not pending:
                first = offset
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            command = (pending + line).strip()
            pending = ""
            if command and not command.startswith("#"):
                found.append((f"{path.relative_to(REPO)}:{first}", command))
    return found


def inline_commands(path: Path) -> list[tuple[str, str]]:
    """(where, command) for each inline code span of the prose that is a command line: it starts with a command word
    and has arguments. Usage synopses (``[key=value ...]``) are not commands."""
    found = []
    for number, paragraph in paragraphs(prose(path)):
        for span in re.findall(r"`([^`]+)`", paragraph):
            words = span.split()
            word = words[0].removeprefix(".venv/bin/") if words else ""
            if word in COMMAND_WORDS and len(words) > 1 and not SYNOPSIS.search(span):
                found.append((f"{path.relative_to(REPO)}:{number} (inline)", span))
    return found


def paragraphs(text: str) -> list[tuple[int, str]]:
    """Paragraphs (and table rows, list items) joined onto one line, with the number of their first line."""
    result, current, first = [], [], 0
    for number, line in enumerate(text.splitlines(), 1):
        starts_item = line.lstrip().startswith(("- ", "| ", "|")) or re.match(r"^\s*\d+\. ", line)
        if not line.strip() or starts_item:
            if current:
                result.append((first, " ".join(current)))
            current = []
        if line.strip():
            if not current:
                first = number
            current.append(line.strip())
    if current:
        result.append((first, " ".join(current)))
    return result


ALL_COMMANDS = [command for page in PAGES for command in block_commands(page) + inline_commands(page)]


# --- checking one command line --------------------------------------------------------------------------------------


class Parsed(Exception):
    """Raised in place of returning from ``ArgumentParser.parse_args``: the arguments parsed, nothing else runs."""


@functools.cache
def script_module(path: Path):
    name = f"_docs_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # as an import would (dataclasses look their module up there)
    spec.loader.exec_module(module)
    return module


def parse_with_main(module, prog: str, args: list[str]) -> argparse.Namespace:
    """The namespace the module's own ``main`` parses from ``args``: ``parse_args`` is stopped right after parsing, so
    nothing is run. A module with a ``parse_args(argv)`` of its own (checks after argparse's) is asked directly."""
    errors = io.StringIO()
    original = argparse.ArgumentParser.parse_args

    def stop_after_parsing(parser, args=None, namespace=None):
        raise Parsed(original(parser, args, namespace))

    try:
        with contextlib.redirect_stderr(errors), contextlib.redirect_stdout(io.StringIO()):
            if callable(getattr(module, "parse_args", None)):
                return module.parse_args(args)
            main = getattr(module, "main", None)
            assert main is not None, f"{prog}: no main() to parse the arguments with"
            with mock.patch.object(argparse.ArgumentParser, "parse_args", stop_after_parsing), \
                    mock.patch.object(sys, "argv", [prog, *args]):
                main(args) if inspect.signature(main).parameters else main()
    except Parsed as parsed:
        return parsed.args[0]
    except SystemExit as exit:
        pytest.fail(f"{prog} {shlex.join(args)}: the arguments don't parse (exit {exit.code}): "
                    f"{errors.getvalue().strip()}")
    pytest.fail(f"{prog}: main() returned without parsing its arguments")


def check_train(args: list[str]) -> None:
    from vocagno.training.config import load_config

    assert args, "train.py needs a yaml"
    yaml = REPO / args[0]
    assert yaml.is_file(), f"no yaml {args[0]}"
    load_config(str(yaml), args[1:])  # unknown keys and values of the wrong kind are errors here


def check_module(name: str, args: list[str]) -> None:
    if name == "pytest":
        return check_pytest(args)
    if name == "vocagno.launch":
        return check_launch(args)
    spec = importlib.util.find_spec(name)
    assert spec is not None, f"no module {name}"
    module = importlib.import_module(name)
    if spec.submodule_search_locations and not hasattr(module, "main"):  # a package runs its __main__ (venv's only
        module = importlib.import_module(f"{name}.__main__")              # calls venv.main: checked as such)
    parse_with_main(module, f"python -m {name}", args)


def check_script(path: str, args: list[str]) -> None:
    script = REPO / path
    assert script.is_file(), f"no script {path}"
    if path == "train.py":
        return check_train(args)
    if script.suffix == ".py":
        parse_with_main(script_module(script), f"python {path}", args)


def check_launch(args: list[str]) -> None:
    from vocagno import launch

    parsed = parse_with_main(launch, "python -m vocagno.launch", args)
    if launch.JOBS[parsed.job] is not None:
        return check_module(launch.JOBS[parsed.job], parsed.job_args)
    check_train(parsed.job_args)
    launch.node_command(parsed.job, parsed.job_args, nodes=parsed.nodes, node_rank=parsed.node_rank,
                        nproc=parsed.nproc, master_addr=parsed.master_addr, cache=parsed.cache, shards=parsed.shards,
                        eval_shards=parsed.eval_shards, logs=parsed.logs)  # builds the command, runs nothing


def check_composer(args: list[str]) -> None:
    from composer.cli.launcher import _get_parser

    parsed = parse_with_parser(_get_parser(), "composer", args)
    (check_module if parsed.module_mode else check_script)(parsed.training_script, parsed.training_script_args)


def check_torchrun(args: list[str]) -> None:
    from torch.distributed.run import get_args_parser

    parsed = parse_with_parser(get_args_parser(), "torchrun", args)
    (check_module if parsed.module else check_script)(parsed.training_script, parsed.training_script_args)


def parse_with_parser(parser: argparse.ArgumentParser, prog: str, args: list[str]) -> argparse.Namespace:
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            return parser.parse_args(args)
    except SystemExit as exit:
        pytest.fail(f"{prog} {shlex.join(args)}: the arguments don't parse (exit {exit.code}): "
                    f"{errors.getvalue().strip()}")


def check_pytest(args: list[str]) -> None:
    from _pytest.config import UsageError, get_config

    config = get_config(args)
    config.pluginmanager.import_plugin("xdist.plugin")  # the test extra's plugin: -n, --dist
    try:
        options = config._parser.parse(args)
    except UsageError as error:
        pytest.fail(f"pytest {shlex.join(args)}: {error}")
    for target in options.file_or_dir:
        assert (REPO / target.split("::")[0]).exists(), f"pytest: no {target}"
    declared = {line.split(":")[0].strip().strip('"') for line in
                re.findall(r'^\s*"([^"]+)"', pyproject().split("markers = [", 1)[1].split("]", 1)[0], re.M)}
    for marker in re.findall(r"\w+", options.markexpr or ""):
        assert marker in declared | {"and", "or", "not"}, f"pytest -m: marker {marker!r} is not declared"


@functools.cache
def pyproject() -> str:
    return (REPO / "pyproject.toml").read_text(encoding="utf-8")


def check_pip(args: list[str]) -> None:
    # setuptools first: pip imports distutils with setuptools' shim taken out, which leaves the standard library's in
    # this process, and torch.compile's C++ builder (it imports setuptools) then fails in every later test here.
    import setuptools  # noqa: F401
    from packaging.requirements import Requirement
    from pip._internal.commands import create_command

    assert args and args[0] == "install", f"pip {shlex.join(args)}: only pip install is shown"
    with contextlib.redirect_stderr(io.StringIO()):
        options, targets = create_command("install").parse_args(args[1:])
    for editable in options.editables:
        path, _, extras = editable.partition("[")
        assert (REPO / path / "pyproject.toml").is_file(), f"pip install -e {editable}: no project there"
        for extra in filter(None, extras.rstrip("]").split(",")):
            assert re.search(rf"^{re.escape(extra)} = \[", pyproject(), re.M), f"no extra [{extra}] in pyproject.toml"
    for target in targets:
        Requirement(target)  # a requirement pip can read


def check_sbatch(args: list[str], env: dict[str, str]) -> None:
    scripts = [arg for arg in args if arg.endswith(".sh")]
    assert len(scripts) == 1, f"sbatch {shlex.join(args)}: which script?"
    script = REPO / scripts[0]
    assert script.is_file(), f"no script {scripts[0]}"
    text = script.read_text(encoding="utf-8")
    for name in env:  # the variables the line sets are ones the script reads
        assert re.search(rf"\$\{{?{name}\b", text), f"{scripts[0]} does not read ${name}"


def split_commands(line: str) -> list[list[str]]:
    """The simple commands of a shell line (split at ``&&``, ``||``, ``;``, ``|``), as words, comments dropped."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    commands, current = [], []
    for token in lexer:
        if token and set(token) <= set(";&|"):
            commands.append(current)
            current = []
        else:
            current.append(token)
    return [command for command in [*commands, current] if command]


def check_command(words: list[str]) -> None:
    env = {}
    while words and re.match(r"^[A-Za-z_]\w*=", words[0]):  # A=B cmd: the variables a command is given
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    # A shell variable stands for a value the reader supplies: the line's own, else 0 (a number parses anywhere).
    words = [re.sub(r"\$\{?(\w+)\}?", lambda m: env.get(m.group(1), "0"), word) for word in words]
    if not words:
        return
    word, args = re.sub(r"^\.venv[\w-]*/bin/", "", words[0]), words[1:]  # .venv/bin/, .venv-foundry/bin/
    if word in SHELL_BUILTINS:
        return
    if word in ("python", "python3"):
        assert args, "python with no arguments"
        if args[0] == "-m":
            return check_module(args[1], args[2:])
        return check_script(args[0], args[1:])
    checks = {"composer": check_composer, "torchrun": check_torchrun, "pytest": check_pytest, "pip": check_pip,
              "llmfoundry": check_llmfoundry, "coverage": check_coverage}
    if word in checks:
        return checks[word](args)
    if word == "sbatch":
        return check_sbatch(args, env)
    assert (REPO / words[0]).is_file(), f"unknown command {words[0]!r}: teach tests/unit/test_docs.py how to check it"


def check_coverage(args: list[str]) -> None:
    """coverage.py's ``run -m MODULE ...`` (the module's command checked), ``combine`` and ``report``."""
    assert args and args[0] in ("run", "combine", "report"), f"coverage {shlex.join(args)}: run, combine or report"
    if args[0] == "run":
        assert args[1:2] == ["-m"] and len(args) > 2, f"coverage {shlex.join(args)}: coverage run -m MODULE ..."
        check_module(args[2], args[3:])


def check_llmfoundry(args: list[str]) -> None:
    """``llmfoundry train YAML [key=value ...]``: an llm-foundry yaml of the repository that omegaconf reads, with
    vocagno's algorithm in it (tests/integration/test_llmfoundry.py runs it in llm-foundry's venv)."""
    from omegaconf import OmegaConf

    assert args[:1] == ["train"] and len(args) >= 2, f"llmfoundry {args}: only `llmfoundry train YAML` is documented"
    cfg = OmegaConf.merge(OmegaConf.load(REPO / args[1]), OmegaConf.from_dotlist(args[2:]))
    assert "vocagno" in cfg.algorithms and cfg.model.name and cfg.train_loader.name, args[1]


@pytest.mark.parametrize("where, line", ALL_COMMANDS, ids=[where for where, _ in ALL_COMMANDS])
def test_every_command_line_in_the_docs_parses(where, line, monkeypatch):
    """Each command of README.md, docs/ and scripts/README.md: its module, script or yaml exists and its arguments
    parse (not run)."""
    monkeypatch.chdir(REPO)
    mention = re.fullmatch(r"(\.venv/bin/)?python3? -m ([\w.]+)", line)
    if where.endswith("(inline)") and mention:  # `python -m vocagno.score` in a sentence names the module
        assert importlib.util.find_spec(mention.group(2)) is not None, f"no module {mention.group(2)}"
        return
    for words in split_commands(line):
        check_command(words)


def test_the_docs_show_commands_of_every_kind():
    """The extraction finds what the pages hold: blocks and inline spans, modules and scripts, launchers."""
    lines = [line for _, line in ALL_COMMANDS]
    assert len(lines) > 60
    for expected in ("python -m vocagno.selection", "conversion/convert_dataset.py", "composer train.py", "torchrun",
                     "sbatch", "python -m vocagno.launch", "python -m vocagno.eval", "python -m vocagno.export",
                     "benchmarks/bench_step.py", "experiments/miniature.py", "pip install"):
        assert any(expected in line for line in lines), expected


@pytest.mark.parametrize("line, words", [
    ('A=1 B=2 sbatch x.sh && echo "a # b" # c', [["A=1", "B=2", "sbatch", "x.sh"], ["echo", "a # b"]]),
    ("python -m m --x 'a b'; cd y | z", [["python", "-m", "m", "--x", "a b"], ["cd", "y"], ["z"]]),
])
def test_split_commands(line, words):
    assert split_commands(line) == words


def test_a_renamed_flag_or_key_fails():
    """The checks catch what they are for: a flag a CLI doesn't have, a yaml key train.py doesn't know, a missing
    script or module, a required argument left out, an undeclared marker, an extra the project lacks, a variable the
    Slurm script doesn't read."""
    for words in (["python", "-m", "vocagno.selection", "--shards", "x", "--teacher", "t", "--fraction", "0.5"],
                  ["composer", "train.py", "yamls/tiny.yaml", "optimiser.lr=1e-3"],
                  ["python", "benchmarks/bench_nothing.py"],
                  ["python", "-m", "vocagno.nothing"],
                  ["torchrun", "--nproc-per-node", "2", "-m", "vocagno.score", "--shards", "x"],
                  ["pytest", "-m", "gpus"],
                  ["coverage", "run", "-m", "pytest", "-m", "gpus"],
                  ["coverage", "erase"],
                  ["pip", "install", "-e", ".[tests]"],
                  ["SHARD=x", "sbatch", "scripts/slurm_train.sh"]):
        with pytest.raises((pytest.fail.Exception, AssertionError, ValueError)):
            check_command(list(words))


# --- the pages ---------------------------------------------------------------------------------------------------


def test_every_code_block_names_its_language():
    """Shell blocks hold commands only: output and other text go in ``text`` blocks, which the command check skips."""
    unnamed = [f"{page.relative_to(REPO)}:{start}" for page in PAGES for language, start, _ in fenced_blocks(page)
               if not language]
    assert not unnamed, f"code blocks without a language (```bash, ```text, ...): {unnamed}"


def test_yaml_blocks_are_yaml():
    import yaml

    for page in PAGES:
        for language, start, body in fenced_blocks(page):
            if language == "yaml":
                try:
                    yaml.safe_load("\n".join(body))
                except yaml.YAMLError as error:
                    pytest.fail(f"{page.relative_to(REPO)}:{start}: {error}")


def test_the_readme_begins_with_the_two_commands_ci_runs():
    """The README's first block is the two commands for a fresh machine, and .ci/run's grep finds the second, which
    prints the 30 slowest tests."""
    language, _, body = fenced_blocks(README)[0]
    assert language == "bash" and body == FRESH_MACHINE
    pattern = re.search(r"grep -m1 -E '([^']+)' README\.md", (REPO / ".ci" / "run").read_text()).group(1)
    found = [line for line in README.read_text(encoding="utf-8").splitlines() if re.search(pattern, line)]
    assert found[0] == FRESH_MACHINE[1] and "--durations=30" in found[0]


def test_the_readme_is_a_front_page():
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 250


def test_every_docs_page_begins_with_its_command():
    for page in DOCS:
        lines = [line for line in page.read_text(encoding="utf-8").splitlines() if line.strip()]
        assert lines[0].startswith("# "), f"{page.name}: a title first"
        assert lines[1] == "```bash", f"{page.name}: its command right after the title"


def schema_keys(schema: dict, prefix: str = "") -> list[str]:
    keys = []
    for key, section in schema.items():
        keys.append(prefix + key)
        if isinstance(section, dict):
            keys += schema_keys(section, f"{prefix}{key}.")
    return keys


def test_the_training_page_lists_every_key_of_the_schema():
    """Every key train.py accepts (``SCHEMA``, nested sections too) and every keyword argument a yaml gives a
    registered algorithm (those train.py fills from ``teacher:`` aside) is on docs/training.md: a new key without
    docs fails here."""
    from vocagno.training.registry import ALGORITHM_GROUP, TEACHER_ALGORITHMS
    from vocagno.training.config import SCHEMA

    text = (REPO / "docs" / "training.md").read_text(encoding="utf-8")
    missing = [key for key in schema_keys(SCHEMA) if f"`{key}`" not in text]
    algorithms = {entry.name: entry for entry in entry_points(group=ALGORITHM_GROUP)}
    assert {"vocagno", "uld", "kld"} <= set(algorithms)
    for name, entry in algorithms.items():
        filled = {"teacher"} if name in TEACHER_ALGORITHMS else set()
        for parameter in inspect.signature(entry.load()).parameters.values():
            if parameter.kind in (parameter.VAR_KEYWORD, parameter.VAR_POSITIONAL) or parameter.name in filled:
                continue
            if f"`algorithms.{name}.{parameter.name}`" not in text:
                missing.append(f"algorithms.{name}.{parameter.name}")
    assert not missing, f"keys docs/training.md does not document: {missing}"


def github_anchor(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {github_anchor(line.lstrip("#")) for line in prose(page).splitlines() if re.match(r"^#{1,6} ", line)}


def test_links_between_pages_resolve():
    """Relative links (README to docs, docs to each other, to files of the repository) name what exists, anchors
    included."""
    broken = []
    for page in PAGES:
        text = re.sub(r"`[^`]*`", "", prose(page))
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists() or (anchor and linked.suffix == ".md" and anchor not in anchors(linked)):
                broken.append(f"{page.relative_to(REPO)}: {target}")
    assert not broken, f"links that lead nowhere: {broken}"


def test_the_caps_page_lists_every_cap_with_its_default():
    from vocagno.doors.untrusted import CAPS

    page = (REPO / "docs" / "files-from-elsewhere.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `([A-Z_]+)` \| (\d+)", page, flags=re.M))
    assert rows == {name.upper(): str(default) for name, (default, _) in CAPS.items()}


def test_the_readmes_figures_and_intervals_are_the_default_runs():
    """What the README says of README command 1's run is what yamls/tiny.yaml makes it do: a console line every 10
    batches, held-out bits per byte at batches 40 and 80, its picture in runs/tiny.png, a top 40%, the 3.48M-parameter
    shipped teacher."""
    from vocagno.training.config import load_config
    from vocagno.core.tokenization import resolve_shipped

    text = " ".join(README.read_text(encoding="utf-8").split())
    cfg = load_config(str(REPO / "yamls" / "tiny.yaml"), [])
    assert "printing one line every 10 batches" in text and cfg.console_log_interval == "10ba"
    evaluations = [b for b in range(1, int(cfg.max_duration.removesuffix("ba")) + 1)
                   if b % int(cfg.eval_interval.removesuffix("ba")) == 0]
    assert "at batches 40 and 80 held-out bits per byte" in text and evaluations == [40, 80]
    assert "It draws the run in `runs/tiny.png`" in text and cfg.loggers.picture.path == f"runs/{cfg.run_name}.png"
    assert "(40% of the mapped tokens" in text and cfg.algorithms.vocagno.topk_ratio == 0.4
    import math

    from safetensors import safe_open

    with safe_open(str(Path(resolve_shipped("tiny-math-teacher")) / "model.safetensors"), "pt") as weights:
        params = sum(math.prod(weights.get_slice(name).get_shape()) for name in weights.keys())
    assert f"a {params / 1e6:.2f}M-parameter" in text


@pytest.mark.slow
def test_the_drop_in_pages_python_runs_as_written(tmp_path, monkeypatch, capfd):
    """docs/drop-in.md's plain Composer script, run as written (its shards converted first, as the page's commands
    convert them, here in a temporary folder)."""
    from vocagno.conversion.convert import main as convert_main

    [code] = [lines for language, _, lines in fenced_blocks(REPO / "docs" / "drop-in.md") if language == "python"]
    shards = "shards/gsm8k_sample_mistral_128"
    monkeypatch.chdir(tmp_path)
    assert convert_main(["--input", str(REPO / "vocagno" / "assets" / "text" / "gsm8k_heldout_100.jsonl"),
                         "--student-tokenizer", "llama2", "--teacher-tokenizer", "mistral", "--seq-len", "128",
                         "--out-root", shards]) == 0
    exec(compile("\n".join(code), "docs/drop-in.md", "exec"), {"__name__": "drop_in"})
    assert "'kept_fraction'" in capfd.readouterr().out
