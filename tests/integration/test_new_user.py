"""A new user's path, end to end, as README.md and docs/ tell it, on a corpus of the user's own making (its text in a
field named ``content``, three bad lines): convert it (forgetting ``--text-field`` first), see what the teacher keeps
of it, train guided online with checkpoints, be interrupted and resume, score it once and train from the cached
losses, evaluate with a limit, export with the results, load the export with transformers and generate. Each mistake
on the way ends in one line ``error: ...``; each run says what it does; partial scores are marked; no step trains on
data it was not given."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import command, kill_group, script

pytestmark = pytest.mark.slow  # a user's whole path, corpus to exported model: a minute each

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "yamls" / "tiny.yaml")


def one_line_error(result) -> str:
    """The run failed with exit code 2 and ended in one line ``error: ...`` with no traceback: that line."""
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and sum(line.startswith("error: ") for line in result.stderr.splitlines()) == 1
    return last


def test_a_new_users_path_from_their_corpus_to_a_model_transformers_loads(tmp_path, capsys, monkeypatch):
    from vocagno import score, selection
    from vocagno.eval.__main__ import main as eval_main
    from vocagno.export import main as export_main

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    monkeypatch.chdir(tmp_path)
    mains = {"vocagno.selection": selection.main, "vocagno.score": score.main, "vocagno.eval": eval_main,
             "vocagno.export": export_main}

    def run(*words):
        """``python WORDS``, in this process where the process is not the point (``helpers``)."""
        if words[0] == "-m":
            return command(mains[words[1]], words[2:], capsys)
        return script(words[0], words[1:])

    documents = [json.loads(line)["text"] for line in open(REPO / "vocagno" / "assets" / "text" /
                                                            "gsm8k_train_500.jsonl", encoding="utf-8")][:60]
    lines = [json.dumps({"id": i, "content": text}) for i, text in enumerate(documents)]
    lines[5:5] = ['{"id": 900, "content": "unfinished', '{"id": 901}', '{"id": 902, "content": 7}']  # bad lines
    (tmp_path / "posts.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    convert = [REPO / "conversion" / "convert_dataset.py", "--input", "posts.jsonl", "--student-tokenizer", "llama2",
               "--teacher-tokenizer", "mistral", "--seq-len", "64", "--out-root", "shards/mine"]

    # Converting without naming the text's field: one line that names the flag; the corrected command runs at once.
    refused = run(*convert)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "missing text field 'text': 62" in refused.stderr and "--text-field NAME names the field" in refused.stderr
    converted = run(*convert, "--text-field", "content")
    assert converted.returncode == 0, converted.stderr[-3000:]
    assert "invalid JSON line: 1" in converted.stdout and "missing text field 'content': 1" in converted.stdout
    assert "text field is a number, not a string: 1" in converted.stdout

    # What the shipped teacher keeps of it, with canaries.
    selection = run("-m", "vocagno.selection", "--shards", "shards/mine", "--teacher", "tiny-math-teacher",
                    "--canaries", "0.5", "--samples", "16", "--html", "selection.html")
    assert selection.returncode == 0 and "what the teacher keeps:" in selection.stdout, selection.stderr[-3000:]

    train = [REPO / "train.py", TINY, "variables.seq_len=64", "eval_loader=null", "selection_report=null",
             "loggers.picture.path=runs/mine.png", "progress_bar=false"]
    # A typo of the folder: one line naming it; nothing is converted into it.
    typo = run(*train, "variables.data=shards/mien")
    assert one_line_error(typo).startswith("error: train_loader.dataset.local: shards/mien holds no converted shards")
    assert not (tmp_path / "shards" / "mien").exists()
    # A misspelled option of the algorithm: the key it meant.
    option = run(*train, "variables.data=shards/mine", "algorithms.vocagno.topk_ration=0.3")
    assert "(did you mean algorithms.vocagno.topk_ratio?)" in one_line_error(option)

    # Guided online, checkpoints every 2 batches; interrupted (SIGTERM, as a scheduler ends a job), then resumed.
    online = [*train, "variables.data=shards/mine", "save_folder=runs/mine", "save_interval=2ba", "autoresume=true"]
    with open(tmp_path / "online.out", "w") as out, open(tmp_path / "online.err", "w") as err:
        process = subprocess.Popen([sys.executable, *map(str, online), "max_duration=400ba"], cwd=tmp_path, env=env,
                                   stdout=out, stderr=err, start_new_session=True)
    try:
        deadline = time.time() + 300
        while not (tmp_path / "runs" / "mine" / "ep0-ba4-rank0.pt").exists() and time.time() < deadline:
            time.sleep(0.05)
        os.kill(process.pid, signal.SIGTERM)
        assert process.wait(120) == 130
    finally:
        kill_group(process.pid)  # nothing of it outlives the test
        process.wait()
    out, err = ((tmp_path / f"online.{name}").read_text() for name in ("out", "err"))
    assert "teacher losses: online, tiny-math-teacher scores every batch" in out
    assert "saved checkpoint runs/mine/ep0-ba2-rank0.pt" in out
    assert re.fullmatch(r"interrupted in batch \d+; the last checkpoint saved: runs/mine/ep0-ba\d+-rank0.pt",
                        err.strip().splitlines()[-1]), err[-3000:]
    last = max(int(re.search(r"ba(\d+)", p.name).group(1)) for p in (tmp_path / "runs" / "mine").glob("ep0-ba*.pt"))
    resumed = run(*online, f"max_duration={last + 2}ba", "loggers.console={}", "console_log_interval=1ba")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    # From the last checkpoint whose save completed: one the interruption cut short is removed, saying so.
    batch, saved = map(int, re.search(r"^resuming at batch (\d+) from runs/mine/ep0-ba(\d+)-rank0.pt$", resumed.stdout,
                                      re.M).groups())
    assert batch == saved + 1 and saved in (last, last - 2), resumed.stdout
    assert (saved == last) != (f"removing runs/mine/ep0-ba{last}-rank0.pt: an incomplete checkpoint" in resumed.stdout)
    assert re.search(rf"^\[batch {last + 2}/{last + 2}\] loss [0-9.]+ \| student", resumed.stdout, re.M)
    assert "wrote runs/mine.png" in resumed.stdout and (tmp_path / "runs" / "mine.png").stat().st_size > 10_000

    # Scored once; a run from the cached losses says whose they are.
    scored = run("-m", "vocagno.score", "--shards", "shards/mine", "--teacher", "tiny-math-teacher", "--dtype",
                 "float32", "--out", "shards/mine-scored", "--device", "cpu")
    assert scored.returncode == 0, scored.stderr[-3000:]
    cached = run(*train, "variables.data=shards/mine-scored", "algorithms.vocagno.teacher_losses=cached",
                 "max_duration=2ba")
    assert cached.returncode == 0, cached.stderr[-3000:]
    assert "teacher losses: cached in the training shards, scored by tiny-math-teacher" in cached.stdout

    # Evaluated with a limit: a partial score, said so at run time and in results.json.
    evaluated = run("-m", "vocagno.eval", "--model", "runs/mine", "--benchmarks", "gsm8k", "--limit", "2",
                    "--max-new-tokens", "8", "--output", "evals", "--device", "cpu")
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert "warning: GSM8K is scored partially, not as the benchmark is: the first 2 of 1,319 questions" in (
        evaluated.stderr)
    results = json.loads((tmp_path / "evals" / "results.json").read_text())
    assert "--max-new-tokens 8" in results["partial"]["gsm8k"] and "reached the model's 64 positions" in (
        results["partial"]["gsm8k"])
    wrong_field = run("-m", "vocagno.eval", "--model", "runs/mine", "--bpb", "posts.jsonl")
    assert wrong_field.returncode == 2 and "name the text's field with --bpb-field" in wrong_field.stderr

    # Exported with its results: the card marks the partial score; transformers loads the export and generates.
    exported = run("-m", "vocagno.export", "runs/mine", "exported", "--eval", "evals")
    assert exported.returncode == 0, exported.stderr[-3000:]
    card = (tmp_path / "exported" / "README.md").read_text()
    from markdown_it import MarkdownIt  # the reason is written through md_text: as the page shows it

    assert ("<p>* partial, not the benchmark's score: GSM8K: the first 2 of 1,319 questions (--limit)"
            in MarkdownIt("commonmark").enable("table").render(card))
    generated = subprocess.run([sys.executable, "-c", "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
                                "model = AutoModelForCausalLM.from_pretrained('exported')\n"
                                "tokenizer = AutoTokenizer.from_pretrained('exported')\n"
                                "ids = tokenizer('Natalia sold', return_tensors='pt').input_ids\n"
                                "print(model.generate(ids, max_new_tokens=5, do_sample=False).shape[1] - "
                                "ids.shape[1])"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert generated.returncode == 0 and generated.stdout.strip() == "5", generated.stderr[-3000:]


def test_a_second_users_path_a_parquet_a_bare_teacher_folder_two_vocabularies_a_gzipped_held_out_file(
        tmp_path, capsys, monkeypatch):
    """Another user's path, with what they have: a .parquet corpus whose text is in a field ``body``, a gzipped
    held-out .jsonl, a colleague's teacher folder of weights without tokenizer files, and a second teacher of another
    vocabulary (DeepSeek's beside Mistral's). Each mistake on the way is answered in one line ``error: ...`` naming the
    fix in the words the user typed; what they run says what it does: the selection report's verdict, the run's plan
    and each teacher's share on its console line, the bits per byte of the gzipped file."""
    import gzip
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    from vocagno.conversion.convert import main as convert_main
    from vocagno import score, selection
    from vocagno.core.tokenization import ASSETS, shipped_model_dir
    from vocagno.entry import run as entry_run
    from vocagno import train as training_run
    from vocagno.eval.__main__ import main as eval_main

    monkeypatch.chdir(tmp_path)

    def last_error(result) -> str:
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and lines and lines[-1].startswith("error: "), result.stderr[-3000:]
        assert sum(line.startswith("error: ") for line in lines) == 1 and "Traceback" not in result.stderr
        return lines[-1]

    def train_command(*argv):  # train.py in this process, ended as its command line ends it
        monkeypatch.setattr(sys, "argv", ["train.py", *map(str, argv)])
        handler = signal.getsignal(signal.SIGTERM)
        capsys.readouterr()
        try:
            entry_run(lambda: training_run.command(sys.argv[1:]), training_run.MISTAKES)
            code = 0
        except SystemExit as exit:
            code = exit.code
        finally:
            signal.signal(signal.SIGTERM, handler)
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(argv, code, out, err)

    texts = [json.loads(line)["text"] for line in open(ASSETS / "text" / "gsm8k_train_500.jsonl", encoding="utf-8")]
    pq.write_table(pa.Table.from_pylist([{"name": f"doc{i}", "body": t} for i, t in enumerate(texts[:30])]),
                   "docs.parquet")
    held = [json.loads(line)["text"] for line in open(ASSETS / "text" / "gsm8k_heldout_100.jsonl", encoding="utf-8")]
    Path("held.jsonl.gz").write_bytes(gzip.compress("".join(json.dumps({"id": i, "body": t}) + "\n"
                                                            for i, t in enumerate(held[:24])).encode()))
    tokenizers = ["--student-tokenizer", "llama2", "--teacher-tokenizer", "mistral", "--seq-len", "64"]

    # The converter without --text-field: the records' fields and the flag; then the corpus and the held-out file.
    docs = ["--input", "docs.parquet", *tokenizers, "--out-root", "shards/docs"]
    assert ("(the records without it have the fields: name, body: 30); --text-field NAME names the field holding "
            "the text") in last_error(command(convert_main, docs, capsys))
    assert command(convert_main, [*docs, "--text-field", "body"], capsys).returncode == 0
    assert command(convert_main, ["--input", "held.jsonl.gz", "--text-field", "body", *tokenizers,
                                          "--out-root", "shards/held"], capsys).returncode == 0

    # A colleague's teacher: weights without tokenizer files.
    Path("colleague").mkdir()
    for path in shipped_model_dir("tiny-math-teacher").iterdir():
        if not path.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(path, Path("colleague") / path.name)
    report = ["--shards", "shards/held", "--samples", "16", "--canaries", "0.5", "--dtype", "float32"]
    assert last_error(command(selection.main, [*report, "--teacher", "colleague"], capsys)).endswith(
        "add --teacher-tokenizer NAME_OR_FOLDER")
    assert last_error(command(selection.main, [*report, "--teacher", "math=colleague", "--teacher",
                                               "latex=tiny-latex-teacher"], capsys)).endswith(
        "give it as teachers.NAME.tokenizer in a yaml, with --config YAML (several --teacher take each one's folder's "
        "tokenizer)")
    kept = command(selection.main, [*report, "--teacher", "colleague", "--teacher-tokenizer", "mistral"], capsys)
    assert kept.returncode == 0 and kept.stdout.strip().splitlines()[-1].startswith(
        "verdict: the teacher separates this corpus's useful tokens: its top-k keeps "), kept.stdout[-2000:]
    assert last_error(command(score.main, ["--shards", "shards/dcos", "--teacher", "colleague", "--out", "x"],
                              capsys)).startswith(
        "error: --shards shards/dcos holds no shards: convert a corpus into it first (python "
        "conversion/convert_dataset.py --input FILE --out-root shards/dcos ...")

    # Two teachers of two vocabularies in a yaml of their own, beside the checkout's yamls.
    assert train_command("--help").stdout.startswith("usage: composer train.py YAML")
    teachers = ("teachers:\n  math: {name_or_path: colleague, tokenizer: mistral, dtype: float32}\n"
                "  latex: {name_or_path: tiny-latex-teacher, tokenizer: deepseek-llm, dtype: float32}\n"
                "run_name: two\nvariables: {data: shards/docs, heldout: shards/held, seq_len: 64}\n"
                "selection_report: null\nloggers: {picture: null}\nprogress_bar: false\n")
    Path("two.yaml").write_text("base: tiny.yaml\n" + teachers)
    where = last_error(train_command("two.yaml"))
    assert "two.yaml" in where and f"base: {REPO / 'yamls' / 'tiny.yaml'}" in where, where
    Path("two.yaml").write_text(f"base: {REPO / 'yamls' / 'tiny.yaml'}\n" + teachers)
    assert last_error(train_command("two.yaml")).endswith("set teacher: null beside your teachers:")
    Path("two.yaml").write_text(f"base: {REPO / 'yamls' / 'tiny.yaml'}\nteacher: null\n" + teachers)
    cached = last_error(train_command("two.yaml", "algorithms.vocagno.teacher_losses=cached", "max_duration=2ba"))
    assert cached.endswith("the training shards (shards/docs) carry no losses of teacher 'math' (it reads the shards' "
                           "teacher tokens): score them with each teacher of the set in turn, each pass on the one "
                           "before's output (python -m vocagno.score --shards shards/docs --config YAML --name math "
                           "--out SCORED, then --name latex: docs/training.md) and train on the last"), cached

    # The run says what it will do, and each teacher's share on its console line.
    trained = train_command("two.yaml", "max_duration=2", "eval_interval=0", "console_log_interval=2ba",
                            "save_folder=runs/two", "save_interval=2ba")
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "max_duration 2 is 2 epochs: a number without a unit is epochs to Composer (write 2ba for batches)" in (
        trained.stdout)
    assert re.search(r"^\[batch \d+/\?\] .* \| kept [0-9.]+ \| shares math [0-9.]+ latex [0-9.]+ \|", trained.stdout,
                     re.M), trained.stdout[-3000:]
    again = last_error(train_command("two.yaml", "max_duration=2ba", "eval_interval=0", "save_folder=runs/two"))
    assert "autoresume" in again and "save_overwrite" in again and "overwrite=True" not in again, again

    # The held-out file as it is, gzipped: its field misnamed, then its bits per byte with a progress bar.
    model = sorted(Path("runs/two").glob("ep*-ba*-rank0.pt"))[-1]
    assert last_error(command(eval_main, ["--model", model, "--bpb", "held.jsonl.gz", "--device", "cpu"],
                              capsys)).endswith("missing text field 'text' (its fields: id, body): name the text's "
                                                "field with --bpb-field")
    measured = command(eval_main, ["--model", model, "--bpb", "held.jsonl.gz", "--bpb-field", "body", "--device",
                                   "cpu"], capsys)
    assert measured.returncode == 0 and re.search(r"bits per byte: 100%.*\| 24/24 ", measured.stderr)
    assert re.fullmatch(r"bits per byte on held.jsonl.gz \(24 texts\): [0-9.]+", measured.stdout.strip())
