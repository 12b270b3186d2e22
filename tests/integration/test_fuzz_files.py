"""Bounded fuzzing of files from elsewhere: a real ``index.json`` and an out-root's real state files, each mutated by
hypothesis (a value anywhere in them replaced by what an attacker would write: huge, negative or non-integer numbers,
names that leave the folder, devices, other encodings) and fed to the real readers in a process with a memory and
time ceiling (tests/support/bounded.py); and so are a real checkpoint's embedded model and tokenizer configs. Whatever the
mutation, no reader writes outside its folders, runs code, allocates past its ceiling or hangs; what it refuses, it
refuses in one line. (Pickles in checkpoints: tests/integration/test_untrusted.py.)"""

import contextlib
import copy
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from bounded import Worker, convert, inspect_shards, load_checkpoint_model, read_shards
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from test_untrusted_checkpoints import state  # noqa: F401 (a fixture)

from vocagno.core.tokenization import ASSETS

SAMPLE = ASSETS / "text" / "gsm8k_train_500.jsonl"
CONVERT = ["--student-tokenizer", "llama2", "--teacher-tokenizer", "mistral", "--seq-len", "64"]
OUTSIDE = "/tmp/vocagno-fuzz-outside"

ATTACKS = st.one_of(
    st.sampled_from([0, -1, 10**9, 2**31, 2**32 - 1, 2**40, -(2**63), True, False, None, 1.5, [], {}]),
    st.integers(min_value=1, max_value=200_000),  # near the real counts and sizes: passes the checks, is wrong
    st.sampled_from(["../outside/x", OUTSIDE, "a/../../x", "index.json", "..", "", "x\\y", "/dev/zero",
                     "/proc/self/environ", "pkl", "json", "br", "zstd", "gz", "bz2",
                     "mds", "xxh3_64", "md5", "part-00000-000000/shard.00000.mds"]),
    st.integers(min_value=-(2**63), max_value=2**64),
    st.text(max_size=8),
    st.lists(st.integers(min_value=-5, max_value=2**40), max_size=3),
)
PART = "part-00000-000000"
FILE = ("raw_data", "zip_data")
SHARD = [("samples",), ("compression",), ("format",), ("version",), ("column_encodings",), ("column_encodings", 0),
         ("column_names", 4), ("column_sizes",), ("size_limit",), ("hashes",), ("raw_meta",),
         *((key, field) for key in FILE for field in ("basename", "bytes", "hashes")),
         *((key, "hashes", "xxh3_64") for key in FILE), *((key,) for key in FILE)]
# The places of a vocagno index.json (one shard, as CONVERT writes the corpus below) an attacker would change.
INDEX_PLACES = [("version",), *(("shards", 0, *at) for at in SHARD)]
# The out-root's state files the converter reads when it resumes (before its merge), and their places.
STATE_PLACES = {
    "conversion.json": [(), ("seq_len",), ("inputs",), ("inputs", 0), ("compression",), ("docs_per_part",),
                        ("student",), ("student", "vocab_size"), ("teacher", "separator_id")],
    "job-0000-of-0001.json": [(), ("parts",), ("parts", 0), ("unreadable",), ("over_cap",)],
    f"{PART}/part.json": [(), ("samples",), ("documents",), ("sources",), ("tail_tokens",)],
    f"{PART}/index.json": [(), ("shards",), *(("shards", 0, *at) for at in SHARD)],
}


def replaced(tree, at, value):
    if not at:
        return value
    tree = copy.deepcopy(tree)
    parent = tree
    for key in at[:-1]:
        parent = parent[key]
    parent[at[-1]] = value
    return tree


def apply(tree, changes):
    for at, value in changes:
        try:
            tree = replaced(tree, at, value)
        except (KeyError, IndexError, TypeError):  # not in this file, or an earlier change took the place away
            pass
    return tree


def files_under(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


@pytest.fixture(scope="module")
def worker():
    """One bounded process for the file's calls: its imports and tokenizers loaded once."""
    bounded = Worker()
    yield bounded
    bounded.close()


@pytest.fixture(scope="module")
def shards(tmp_path_factory, worker):
    lines = SAMPLE.read_text(encoding="utf-8").splitlines()[:24]
    corpus = tmp_path_factory.mktemp("corpus") / "docs.jsonl"
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    root = tmp_path_factory.mktemp("fuzz") / "shards"
    assert worker.run(convert, ["--input", str(corpus), *CONVERT, "--out-root", str(root)]) == "ok"
    with mutated_copy(root, "index.json", []) as (base, _):  # the readers read what is sound
        assert worker.run(read_shards, base / "shards") == "ok"
        assert worker.run(read_shards, base / "cache", str(base / "shards")) == "ok"
        assert worker.run(inspect_shards, base / "shards") == "ok"
    return root


def outcome_is_harmless(outcome: str, base: Path, before: set[str]) -> None:
    """Nothing past the ceilings; a refusal in one line; nothing new but in the reader's own folders."""
    assert outcome not in ("memory", "hung") and not outcome.startswith("died"), outcome
    if outcome.startswith("refused"):
        assert "\n" not in outcome.strip(), outcome
    assert {p for p in files_under(base) - before if not p.startswith(("shards", "cache"))} == set(), \
        f"written outside its folder ({outcome})"
    assert not os.path.lexists(OUTSIDE), outcome


@contextlib.contextmanager
def mutated_copy(shards: Path, name: str, changes, remove=()):
    """A copy of the shard folder, in a fresh folder with an empty ``outside`` beside it, its file ``name`` given
    ``changes`` (and the files ``remove`` removed): that folder, and the files under it."""
    base = Path(tempfile.mkdtemp(prefix="fuzz-"))
    try:
        shutil.copytree(shards, base / "shards")
        (base / "outside").mkdir()
        for gone in remove:
            (base / "shards" / gone).unlink()
        path = base / "shards" / name
        path.write_text(json.dumps(apply(json.loads(path.read_text()), changes)))
        yield base, files_under(base)
    finally:
        shutil.rmtree(base)


INDEX_CHANGES = st.lists(st.tuples(st.sampled_from(INDEX_PLACES), ATTACKS), min_size=1, max_size=3)


@pytest.mark.slow
@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(changes=INDEX_CHANGES)
@example(changes=[(("shards", 0, "samples"), 10**9)])
@example(changes=[(("shards", 0, "samples"), -1)])
@example(changes=[(("shards", 0, "raw_data", "basename"), "../outside/x")])
@example(changes=[(("shards", 0, "raw_data", "bytes"), 4 << 30)])
@example(changes=[(("shards", 0, "zip_data", "hashes"), {"md5": "0"}), (("shards", 0, "raw_data", "hashes"), {})])
@example(changes=[(("shards", 0, "column_encodings", 4), "pkl")])
def test_a_mutated_index_is_read_or_refused_and_never_written_outside_or_past_memory(worker, shards, changes):
    """The training reader, with the shards as its local folder and as its remote."""
    with mutated_copy(shards, "index.json", changes) as (base, before):
        outcome_is_harmless(worker.run(read_shards, base / "shards"), base, before)
        outcome_is_harmless(worker.run(read_shards, base / "cache", str(base / "shards")), base, before)


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(changes=INDEX_CHANGES)
@example(changes=[(("shards", 0, "samples"), 10**9)])
@example(changes=[(("shards", 0, "raw_data", "basename"), "../outside/x")])
def test_inspect_reads_or_refuses_a_mutated_index_in_one_line(worker, shards, changes):
    with mutated_copy(shards, "index.json", changes) as (base, before):
        outcome_is_harmless(worker.run(inspect_shards, base / "shards"), base, before)


STATE_CHANGES = st.sampled_from(sorted(STATE_PLACES)).flatmap(lambda name: st.tuples(
    st.just(name), st.lists(st.tuples(st.sampled_from(STATE_PLACES[name]), ATTACKS), min_size=1, max_size=3)))


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(change=STATE_CHANGES)
@example(change=(f"{PART}/index.json", [(("shards", 0, "samples"), 10**9)]))
@example(change=(f"{PART}/index.json", [(("shards", 0, "samples"), -1)]))
@example(change=(f"{PART}/index.json", [(("shards", 0, "raw_data", "basename"), "../../outside/x")]))
@example(change=("job-0000-of-0001.json", [(("parts", 0), "../outside")]))
def test_a_mutated_out_root_state_file_is_resumed_or_refused_in_one_line(worker, shards, change):
    """The converter run again on an out-root, its parts converted but not yet merged, whose state file someone
    rewrote: it merges (the file read as valid) or stops in one line; it never writes outside the out-root or
    allocates past its ceiling, and what it publishes reads as harmlessly."""
    name, changes = change
    corpus = json.loads((shards / "conversion.json").read_text())["inputs"][0]  # as the first run named it
    with mutated_copy(shards, name, changes, remove=("index.json", "vocagno.json")) as (base, before):
        root = base / "shards"
        outcome = worker.run(convert, ["--input", str(corpus), *CONVERT, "--out-root", str(root)])
        outcome_is_harmless(outcome, base, before)
        if outcome == "ok":  # what it published is read as harmlessly
            outcome_is_harmless(worker.run(read_shards, root), base, before)


# A checkpoint's embedded configs: the model's (a tiny Llama) and its tokenizer's, as Composer saves them.
MODEL_CONFIG_PLACES = [("vocab_size",), ("hidden_size",), ("intermediate_size",), ("num_hidden_layers",),
                       ("num_attention_heads",), ("num_key_value_heads",), ("head_dim",), ("max_position_embeddings",),
                       ("rope_scaling",), ("rope_theta",), ("model_type",), ("architectures",), ("tokenizer_class",),
                       ("auto_map",), ("attn_implementation",), ("torch_dtype",), ("tie_word_embeddings",),
                       ("id2label",), ("pad_token_id",), ("quantization_config",)]
TOKENIZER_CONFIG_PLACES = [("tokenizer_class",), ("tokenizer_file",), ("vocab_file",), ("model_max_length",),
                           ("added_tokens_decoder",), ("auto_map",), ("chat_template",), ("name_or_path",),
                           ("bos_token",), ("legacy",)]
CHECKPOINT_ATTACKS = st.one_of(ATTACKS, st.sampled_from([
    {"AutoConfig": "evil.EvilConfig"}, "kernels-community/flash-attn", "evil.Tokenizer", "../tokenizer.json",
    f"{OUTSIDE}/tokenizer.json", {"type": "dynamic", "factor": 2**40}, 10**6]))
CHECKPOINT_CHANGES = st.one_of(
    st.lists(st.tuples(st.sampled_from(MODEL_CONFIG_PLACES).map(lambda at: ("model", *at)), CHECKPOINT_ATTACKS),
             min_size=1, max_size=2),
    st.lists(st.tuples(st.sampled_from(TOKENIZER_CONFIG_PLACES).map(lambda at: ("tokenizer", *at)),
                       CHECKPOINT_ATTACKS), min_size=1, max_size=2))


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning")  # the state's repr, shown on failure
@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(changes=CHECKPOINT_CHANGES)
@example(changes=[(("model", "num_hidden_layers"), 200), (("model", "hidden_size"), 4096)])
@example(changes=[(("model", "vocab_size"), 10**9)])
@example(changes=[(("model", "attn_implementation"), "kernels-community/flash-attn")])
@example(changes=[(("tokenizer", "tokenizer_file"), f"{OUTSIDE}/tokenizer.json")])
def test_a_checkpoints_mutated_configs_load_or_are_refused_and_nothing_runs_or_is_read_outside(worker, state,
                                                                                               changes):
    """The model loaded from a checkpoint whose model config or tokenizer_config.json someone rewrote (export's and
    vocagno.eval --model's reader): loaded, or refused in one line, within the ceiling, no code run."""
    saved = copy.deepcopy(state)
    huggingface = saved["state"]["integrations"]["huggingface"]
    configs = {"model": huggingface["model"]["config"]["content"],
               "tokenizer": huggingface["tokenizer"]["tokenizer_config.json"]["content"]}
    for (which, *at), value in changes:
        configs[which] = apply(configs[which], [(tuple(at), value)])
    huggingface["model"]["config"]["content"] = configs["model"]
    huggingface["tokenizer"]["tokenizer_config.json"]["content"] = configs["tokenizer"]
    base = Path(tempfile.mkdtemp(prefix="fuzz-checkpoint-"))
    try:
        (base / "outside").mkdir()
        os.makedirs(OUTSIDE)  # a tokenizer an attacker left outside, which nothing may read
        Path(OUTSIDE, "tokenizer.json").write_text("{}")
        (base / "shards").mkdir()
        torch.save(saved, base / "shards" / "ep0-ba1-rank0.pt")
        before = files_under(base)
        outcome = worker.run(load_checkpoint_model, base / "shards" / "ep0-ba1-rank0.pt")
        shutil.rmtree(OUTSIDE)
        outcome_is_harmless(outcome, base, before)
        assert outcome == "ok" or outcome.startswith("refused"), outcome
    finally:
        shutil.rmtree(base)
        shutil.rmtree(OUTSIDE, ignore_errors=True)


# ----------------------------------------------------------------------------- the writers of pages and the terminal
# What an attacker writes into a recipe, a run's name, a folder's name or a results.json, each a heading, a cell, a
# fence's end, a link, HTML or a terminal's escape if written raw; and values of other kinds.
SHOWN_ATTACKS = st.one_of(
    st.sampled_from(["x\n# Injected\n\n| evaluation | 99.9 |\n|---|---|\n| GSM8K | 99.9 |", "a | b", "```", "````",
                     "~~~\n# h", "<script>alert(1)</script>", "<img src=x onerror=1>", "[x](javascript:alert(1))",
                     "![i](http://x/i.png)", "**b** _i_ `c`", "\x1b]0;owned\x07\x1b[2J", "evil\u202etxt", "x\\|y\\",
                     "  - list\n> quote", "&lt;b&gt;", "${oc.env:HOME}", "", " ", "\r\r## h", "\u2028# h"]),
    st.text(max_size=12),
    st.sampled_from([None, 0, -1, 1.5, 10**20, True, [], {}, ["a|b"], {"x": "```"}]),
)
RECIPE_PLACES = ["run_name", "model.name_or_path", "model.config.model_type", "model.config.num_hidden_layers",
                 "tokenizer.name", "teacher.name_or_path", "teacher.tokenizer", "teacher", "model", "tokenizer",
                 "train_loader.dataset.local", "train_loader.dataset.remote", "train_loader.dataset.streams",
                 "train_loader.dataset", "algorithms", "algorithms.vocagno", "algorithms.vocagno.aggregation",
                 "precision"]
RESULTS_PLACES = [("partial",), ("partial", "gsm8k"), ("gsm8k",), ("svamp",), ("bits_per_byte",), ("avg",),
                  ("a | b",), ("\x1b[2J",)]
# What a terminal acts on: C0 and C1 controls but the new line, DEL, the separators, the bidirectional controls.
ACTED_ON = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069\u061c]")
MARKUP = ("<script", "<img", "<a ", "<strong", "<em", "<blockquote", "<ul", "<li", "<h3", "<hr")


def _page(markdown: str) -> str:
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark").enable("table").render(markdown)


def _cells_per_row(page: str) -> set[int]:
    return {row.count("<td>") + row.count("<th>") for row in re.findall(r"<tr>(.*?)</tr>", page, re.S)}


def _one_line_refusal(error: BaseException) -> None:
    from vocagno.entry import one_line
    from vocagno.errors import Refused

    assert isinstance(error, Refused), repr(error)
    assert one_line(error), error


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(recipe=st.lists(st.tuples(st.sampled_from(RECIPE_PLACES), SHOWN_ATTACKS), max_size=3),
       results=st.lists(st.tuples(st.sampled_from(RESULTS_PLACES), SHOWN_ATTACKS), max_size=2),
       name=SHOWN_ATTACKS, yaml_tail=SHOWN_ATTACKS)
@example(recipe=[("run_name", "```\n# after the fence\n```")], results=[], name="x", yaml_tail="")
@example(recipe=[("run_name", "x\n# Evaluation\n| GSM8K | 99 |")], results=[(("partial", "gsm8k"), "<b>x</b>")],
         name="a|b", yaml_tail="\n```\n# h\n")
def test_a_cards_mutated_recipe_name_and_results_write_no_structure_or_are_refused_in_one_line(
        tmp_path_factory, recipe, results, name, yaml_tail):
    """vocagno.export's model card from a checkpoint whose stored recipe, run name and ``--eval`` results.json someone
    rewrote, exported from a folder of any name: the card has its headings, tables, cells and fences and no other, and
    no HTML or terminal escape passes; or the file is refused in one line."""
    from omegaconf import OmegaConf as om
    from transformers import LlamaConfig, LlamaForCausalLM

    from vocagno.export import _eval_results, model_card
    from vocagno.training.config import load_config

    repo = Path(__file__).resolve().parents[2]
    cfg = load_config(str(repo / "yamls" / "tiny.yaml"), [])
    for place, value in recipe:
        om.update(cfg, place, value, force_add=True, merge=False)
    folder = tmp_path_factory.mktemp("eval")
    written = {"gsm8k": 12.5, "svamp": 50.0, "partial": {"gsm8k": "the first 2 of 1,319 questions (--limit)"}}
    (folder / "results.json").write_text(json.dumps(apply(written, [(at, v) for at, v in results])))
    tail = yaml_tail if isinstance(yaml_tail, str) else json.dumps(yaml_tail)
    state = {"callbacks": {"RunRecipe": {"yaml": om.to_yaml(cfg) + tail}}, "timestamp": {"Timestamp": {}}}
    model = LlamaForCausalLM(LlamaConfig(vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                                         num_attention_heads=1))
    try:
        card = model_card(f"runs/{name}/ep0", str(name), state, model, _eval_results(str(folder)), str(folder))
    except Exception as error:  # a recipe or results.json refused: in one line, as vocagno.entry says it
        _one_line_refusal(error)
        return
    assert "\x1b" not in card and "\u202e" not in card and "\x07" not in card
    page = _page(card.split("---\n", 2)[2])
    assert re.findall(r"<h(\d)>", page) == ["1", "2", "2", "2"], page
    assert page.count("<table>") == 2 and page.count("<pre>") == 2, page
    assert _cells_per_row(page.split("<h2>Evaluation</h2>")[0]) == {3}, page
    assert not any(markup in page for markup in MARKUP), page


def _folder_name(text: str) -> str:
    name = text.replace("/", "_").replace("\x00", "_")
    return name if name not in ("", ".", "..") else f"run{name}"


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(names=st.lists(SHOWN_ATTACKS.map(str).map(_folder_name), min_size=1, max_size=3, unique=True),
       results=st.lists(st.tuples(st.sampled_from(RESULTS_PLACES), SHOWN_ATTACKS), max_size=2))
@example(names=["a | b", "cpt"], results=[(("notes",), 2000.0)])  # refused: no benchmark
@example(names=["x\x1b[2J|y", "<img src=x>"], results=[(("partial", "gsm8k"), "a **b**")])
def test_a_reports_mutated_results_and_folder_names_write_no_structure_or_are_refused_in_one_line(
        tmp_path_factory, capsys, names, results):
    """python -m vocagno.report over evaluation folders of any name, one results.json rewritten: a table of a row per
    run and a cell per benchmark, AVG and gain, and no markup or terminal escape; or one line, exit 2."""
    from helpers import command

    from vocagno import report

    root = tmp_path_factory.mktemp("runs")
    folders = []
    for i, name in enumerate(names):
        folders.append(root / name)
        folders[-1].mkdir()
        written = {"gsm8k": 10.0 + i, "svamp": 20.0, "partial": {}}
        (folders[-1] / "results.json").write_text(json.dumps(apply(written, results if i == 0 else [])))
    out = command(report.main, [*folders, "--baseline", names[0]], capsys)
    assert not ACTED_ON.search(out.stdout.replace("\n", "") + out.stderr.replace("\n", "")), out
    if out.returncode != 0:
        assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
        return
    page = _page(out.stdout)
    assert page.count("<table>") == 1 and page.count("<tr>") == len(names) + 1, page
    assert len(_cells_per_row(page)) == 1, page
    assert not any(markup in page for markup in MARKUP), page

