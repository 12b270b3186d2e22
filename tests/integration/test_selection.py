"""vocagno.selection and vocagno.diagnostics.canaries: what a teacher keeps, measured with canaries, on real tokenizers and text."""

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import Reached, reached, ends, kill_group

from vocagno.conversion.convert import main as convert_main
from vocagno import selection
from vocagno.diagnostics.selection import Report, Settings
from vocagno.diagnostics.canaries import CLEAN, NOISE, clean_documents, mix, pack
from vocagno.teacher.scoring import read_shard
from vocagno.data.shards import ShardMetadata

REPO = Path(__file__).resolve().parents[2]
TEXT = REPO / "vocagno" / "assets" / "text"


def convert(texts: list[str], out: Path, seq_len: int = 128) -> Path:
    corpus = out.with_suffix(".jsonl")
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    assert convert_main(["--input", str(corpus), "--student-tokenizer", "llama2", "--teacher-tokenizer",
                         "mistral", "--seq-len", str(seq_len), "--out-root", str(out)]) == 0
    return out


def rows_of(folder: Path) -> list[dict]:
    index = json.loads((folder / "index.json").read_text())
    return [row for info in index["shards"] for row in read_shard(folder, info)]


@pytest.fixture(scope="module")
def heldout(tmp_path_factory) -> Path:
    """GSM8K problems 501-600 (no teacher or student of the tiny yamls trains on them) in llama2 / mistral shards."""
    texts = [json.loads(line)["text"] for line in open(TEXT / "gsm8k_heldout_100.jsonl", encoding="utf-8")]
    return convert(texts, tmp_path_factory.mktemp("heldout") / "shards")


def test_noise_is_made_of_the_clean_documents_words_and_characters():
    rng = random.Random(0)
    text = "Question: Tom has 3 apples.\nAnswer: 3 + 4 = 7 #### 7"
    shuffled, scrambled = NOISE["shuffled_words"](text, rng), NOISE["scrambled_characters"](text, rng)
    assert sorted(shuffled.split()) == sorted(text.split()) and shuffled != " ".join(text.split())
    assert [sorted(w) for w in scrambled.split()] == [sorted(w) for w in text.split()]
    documents = mix([f"document {i} " * 5 for i in range(30)], 0.25, list(NOISE), seed=1)
    kinds = [kind for kind, _ in documents]
    assert kinds.count(CLEAN) == 30 and len(kinds) == 40  # a quarter of all documents is noise, the kinds in turn
    assert kinds.count("shuffled_words") == kinds.count("scrambled_characters") == 5


def test_canary_rows_are_the_converters_rows_and_each_token_knows_its_document(tokenizers, tmp_path):
    """The rows made for the canaries are, sample for sample, those conversion/convert_dataset.py writes for the same
    documents; every student token that holds text is labelled with the document and kind its characters come from."""
    clean = [json.loads(line)["text"] for line in open(TEXT / "gsm8k_train_500.jsonl", encoding="utf-8")][:40]
    documents = mix(clean, 0.5, list(NOISE), seed=7)
    converted = convert([text for _, text in documents], tmp_path / "shards")
    canaries = pack(documents, tokenizers["llama2"], tokenizers["mistral"], ShardMetadata.read(converted))
    expected = rows_of(converted)
    assert len(canaries.samples) == len(expected) > 20
    for made, written in zip(canaries.samples, expected):
        assert made["text"] == written["text"]
        for column in ("student_ids", "student_offsets", "teacher_ids", "teacher_offsets"):
            assert np.array_equal(np.asarray(made[column]), written[column]), column
    labelled = set()
    for sample, document, kind in zip(canaries.samples, canaries.document, canaries.kind):
        offsets = np.asarray(sample["student_offsets"], dtype=np.int64)
        for (s, e), d, k in zip(offsets.tolist(), document, kind):
            if s == e:  # BOS, separators: no text, no document
                assert d == k == -1
                continue
            assert sample["text"][s:e] in documents[d][1]
            assert canaries.kinds[k] == documents[d][0]
            labelled.add(d)
    assert len(labelled) > 0.9 * len(documents)  # all but those in the dropped tail
    assert canaries.kinds == [CLEAN, *NOISE]


def test_clean_documents_are_cut_where_a_row_ends_a_document(heldout):
    meta = ShardMetadata.read(heldout)
    row = rows_of(heldout)[1]
    pieces = clean_documents(row, meta.student.separator_id)
    ends = sum(1 for i, (s, e) in zip(row["student_ids"], row["student_offsets"])
               if i == meta.student.separator_id and s == e)
    assert ends >= 1 and len(pieces) == ends + 1
    assert "".join(pieces) == row["text"]  # cut, nothing lost or joined


@pytest.fixture(scope="module")
def measured(heldout, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("selection")
    code = selection.main(["--shards", str(heldout), "--teacher", "tiny-math-teacher", "--dtype", "float32",
                           "--canaries", "0.5", "--samples", "64", "--json", str(tmp / "report.json"),
                           "--html", str(tmp / "page.html")])
    assert code == 0
    return json.loads((tmp / "report.json").read_text()), (tmp / "page.html").read_text()


def test_a_teacher_that_learned_the_text_keeps_it_and_the_controls_keep_the_clean_share(measured):
    """The shipped teacher (the GSM8K problems it was trained on are not these) ranks alone, with a flat student: its
    top 40% holds clean text well above the clean share; a random selection and the same teacher at initialization
    keep the clean share. (Measured: 0.670 against 0.460; the chunk-level variants, which average the loss over
    whole stretches of a row, do better on these canaries, whole documents of noise: docs/selection.md.)"""
    report, _ = measured
    variants, clean_share = report["variants"], report["clean_share"]
    assert set(variants) == {"topk", "chunk_1", "chunk_4", "chunk_16", "random", "untrained_teacher"}
    assert 0.35 < clean_share < 0.65
    assert variants["topk"]["precision"] > clean_share + 0.15, variants
    assert all(variants[f"chunk_{n}"]["precision"] > clean_share + 0.15 for n in (1, 4, 16)), variants
    assert abs(variants["untrained_teacher"]["precision"] - clean_share) < 0.03
    assert abs(variants["random"]["precision"] - clean_share) < 0.03
    # 40% of the mapped tokens: a precision above the clean share means recall above 40%.
    assert variants["topk"]["recall"] > 0.4
    teacher = report["losses"]["teacher"]
    assert teacher["clean"] < teacher["shuffled_words"] and teacher["clean"] < teacher["scrambled_characters"]
    assert set(report["kept_histogram"]) == {"clean", *NOISE}


def test_the_page_shows_every_token_with_its_kind_and_fate_and_holds_no_markup_from_the_text(measured):
    report, page = measured
    script = page.split("<script>")[1].split("</script>")[0]
    data = json.loads(script.split("const data = ", 1)[1].split(";\n", 1)[0])
    assert data["kinds"] == ["clean", *NOISE] and len(data["rows"]) == 12
    tokens = [t for row in data["rows"] for t in row["tokens"]]
    assert {t["kept"] for t in tokens} == {True, False, None}
    assert {t["k"] for t in tokens} == {-1, 0, 1, 2}
    assert "<" not in script.split("const data = ", 1)[1].split(";\n", 1)[0]
    # the chart of each variant's kept share of each kind: the report's figures
    assert '<div id="chart"></div>' in page and "function chart()" in script and "chart();" in script
    assert {name: v["kept_share"] for name, v in data["variants"].items()} == {
        name: v["kept_share"] for name, v in report["variants"].items()}


def test_a_trained_student_can_rank_instead_of_a_flat_one(heldout, tmp_path):
    """--student takes a Hugging Face folder; its losses replace ln V in the score."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    student = LlamaForCausalLM(LlamaConfig(vocab_size=32000, hidden_size=32, intermediate_size=64,
                                           num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
    student.save_pretrained(tmp_path / "student")
    from vocagno.core.tokenization import load_tokenizer

    load_tokenizer("llama2").save_pretrained(tmp_path / "student")
    assert selection.main(["--shards", str(heldout), "--teacher", "tiny-math-teacher", "--dtype", "float32",
                           "--student", str(tmp_path / "student"), "--samples", "8",
                           "--json", str(tmp_path / "r.json")]) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["student"] == str(tmp_path / "student") and report["kinds"] == ["clean"]
    assert 9 < report["losses"]["student"]["clean"] < 11  # a random student: about ln 32000 = 10.4, not exactly
    assert report["variants"]["topk"]["precision"] == 1.0  # no canaries: everything kept is clean


def _crafted(shards: Path, folder: Path) -> Path:
    """A copy of ``shards`` whose index.json names its shards outside the folder, as someone else's file may."""
    import shutil

    shutil.copytree(shards, folder)
    index = json.loads((folder / "index.json").read_text())
    for info in index["shards"]:
        info["zip_data"]["basename"] = "../../x"
    (folder / "index.json").write_text(json.dumps(index))
    return folder


def _token_mds(folder: Path) -> Path:
    """An MDS folder of token ids alone (what llm-foundry's convert_dataset_json writes): no text, no offsets."""
    from streaming import MDSWriter

    with MDSWriter(out=str(folder), columns={"tokens": "ndarray"}) as writer:
        writer.write({"tokens": np.arange(128, dtype=np.int64)})
    return folder


@pytest.mark.parametrize("arguments, message", [
    (["--canaries", "1.5"], r"--canaries is the fraction of noise documents, in \(0, 1\), got 1.5"),
    (["--canaries", "0"], r"--canaries is the fraction of noise documents, in \(0, 1\), got 0.0"),
    (["--samples", "0"], "--samples must be at least 1, got 0"),
    (["--noise", "shuffled_words,typos"], "--noise takes kinds of shuffled_words, scrambled_characters"),
    (["--teacher-tokenizer", "qwen2.5"], "teacher tokenizer is 'mistral' .* this run's teacher tokenizer is 'qwen2.5'"),
    (["--student", "STUDENT"], r"--student .*STUDENT\.pt: not a checkpoint"),
    (["--shards", "TOKENS"], "holds no vocagno.json: not vocagno shards"),
    (["--shards", "CRAFTED"], r"index.json: refused: its shard name '\.\./\.\./x' is not a relative path inside its"),
    (["--teacher", "SMALL", "--teacher-tokenizer", "mistral"],
     "the teacher's embedding has 1000 rows, but the shards' teacher tokenizer 'mistral' has 32000 tokens"),
    (["--shards", "NOTES"], r"--shards .*/notes holds no index.json: not a shard folder"),
    (["seed=3"], r"overrides \['seed=3'\] need --config"),
], ids=["canaries-above-1", "canaries-0", "samples-0", "noise", "teacher-tokenizer", "student-not-a-checkpoint",
        "shards-without-offsets", "shards-named-outside", "teacher-cannot-read", "shards-not-shards",
        "overrides-without-config"])
def test_bad_input_is_one_line_exit_2_and_nothing_written(heldout, tmp_path, capsys, arguments, message):
    import re

    import torch
    from transformers import MistralConfig, MistralForCausalLM

    (tmp_path / "STUDENT.pt").write_text("not a checkpoint")
    torch.manual_seed(0)
    MistralForCausalLM(MistralConfig(vocab_size=1000, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=1)).save_pretrained(tmp_path / "SMALL")
    replace = {"STUDENT": str(tmp_path / "STUDENT.pt"), "TOKENS": str(_token_mds(tmp_path / "tokens")),
               "SMALL": str(tmp_path / "SMALL"), "CRAFTED": str(_crafted(heldout, tmp_path / "crafted")),
               "NOTES": str(tmp_path / "notes")}
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "README.md").write_text("no shards here")
    arguments = [replace.get(a, a) for a in arguments]
    base = {"--shards": str(heldout), "--teacher": "tiny-math-teacher"}
    for flag in base:
        if flag not in arguments:
            arguments = [flag, base[flag], *arguments]
    code = ends(selection.main, [*arguments, "--dtype", "float32", "--json", str(tmp_path / "out.json"),
                                 "--html", str(tmp_path / "out.html")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: ")
    assert re.search(message, err[0]), err[0]
    assert not (tmp_path / "out.json").exists() and not (tmp_path / "out.html").exists()


@pytest.mark.slow
def test_two_ranks_share_the_scoring_and_rank_0_alone_reports_and_writes_files(heldout, tmp_path, capsys, monkeypatch,
                                                                               measured):
    """Ranks as torchrun starts them (RANK, WORLD_SIZE, the same arguments): rank 0 writes the rows, each scores its
    shards, and rank 0 alone, whichever rank finishes last, reports and writes --json and --html."""
    arguments = ["--shards", str(heldout), "--teacher", "tiny-math-teacher", "--dtype", "float32", "--canaries", "0.5",
                 "--samples", "64", "--work", str(tmp_path / "work")]
    files = ["--json", str(tmp_path / "report.json"), "--html", str(tmp_path / "page.html")]
    with open(tmp_path / "rank1.out", "w") as out, open(tmp_path / "rank1.err", "w") as err:  # rank 1: a process
        other = subprocess.Popen([sys.executable, "-m", "vocagno.selection", *arguments, *files], cwd=REPO,
                                 env={**os.environ, "RANK": "1", "WORLD_SIZE": "2"}, stdout=out, stderr=err,
                                 start_new_session=True)
    try:
        monkeypatch.setenv("WORLD_SIZE", "2")
        monkeypatch.setenv("RANK", "0")
        assert selection.main([*arguments, *files]) == 0
        code = other.wait(timeout=600)
    finally:
        kill_group(other.pid)  # nothing of it outlives the test
        other.wait()
    out, err = ((tmp_path / f"rank1.{name}").read_text() for name in ("out", "err"))
    assert code == 0, err
    assert "wrote" not in out
    assert "precision" not in out  # no report
    assert len(json.loads((tmp_path / "work" / "rows" / "index.json").read_text())["shards"]) > 1
    assert f"wrote {tmp_path / 'report.json'}" in capsys.readouterr().out
    report = json.loads((tmp_path / "report.json").read_text())
    alone, _ = measured
    assert report["variants"] == alone["variants"] and report["losses"] == alone["losses"]
    assert (tmp_path / "page.html").exists()
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    assert ends(selection.main, [*arguments, "--seed", "1"]) == 2  # other rows
    assert "made with other settings (seed differ)" in capsys.readouterr().err


def test_the_topk_row_selects_as_the_yaml_says_its_alignment_and_selection_included(heldout, tmp_path):
    """--config's algorithms.vocagno: chunk alignment (4 chunks, the chunk's mean) makes the topk row the chunk_4
    row; selection: random makes it the random row (the rows and scores, in --work, are made once). A link planted
    in --work at the name the rows were once staged at is not written through."""
    base = ["--shards", str(heldout), "--config", str(REPO / "yamls" / "tiny.yaml"), "--canaries", "0.5",
            "--samples", "16", "--work", str(tmp_path / "work")]
    (tmp_path / "work").mkdir()
    (tmp_path / "victim").mkdir()
    (tmp_path / "work" / ".tmp-rows").symlink_to(tmp_path / "victim")
    for overrides, same_as in ((["algorithms.vocagno.alignment=chunk", "algorithms.vocagno.num_chunks=4",
                                 "algorithms.vocagno.aggregation=mean"], "chunk_4"),
                               (["algorithms.vocagno.selection=random"], "random")):
        assert selection.main([*base, *overrides, "--json", str(tmp_path / f"{same_as}.json")]) == 0
        report = json.loads((tmp_path / f"{same_as}.json").read_text())
        assert report["variants"]["topk"] == report["variants"][same_as], same_as
        assert report["variants"]["topk"] != report["variants"]["chunk_1"]
    assert report["settings"]["selection"] == "random" and report["settings"]["alignment"] == "token"
    assert not any((tmp_path / "victim").iterdir())


def test_the_json_report_is_strict_json_a_mean_over_no_tokens_is_null():
    """A kind whose tokens all fell in the dropped tail has no mean loss: NaN in the terminal, null in --json (strict
    parsers refuse NaN)."""
    report = Report(
        kinds=["clean", "shuffled_words"], settings=Settings(), teacher="t", student="s", rows=1, tokens=10,
        mapped=8, clean_share=1.0, canaries=0.5,
        variants={"topk": {"precision": 1.0, "recall": 0.5, "kept_share": {"clean": 0.5, "shuffled_words": 0.0}}},
        losses={"teacher": {"clean": 2.5, "shuffled_words": float("nan")}},
        kept_histogram={"clean": [0] * 5 + [1] + [0] * 4, "shuffled_words": [0] * 10}, unmapped_kept=2,
        dropped_tokens=7)

    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")

    parsed = json.loads(json.dumps(report.as_json()), parse_constant=refuse)
    assert parsed["losses"]["teacher"] == {"clean": 2.5, "shuffled_words": None}
    assert "nan" in report.table()


def verdict_of(topk, clean_share=0.479, untrained=None, chunk=None, canaries=0.5, student="a checkpoint", mapped=8):
    """The verdict of a report whose variants kept these precisions."""
    def variant(precision):
        return {"precision": precision, "recall": 0.5, "kept_share": {"clean": 0.5, "shuffled_words": 0.2}}

    variants = {"topk": variant(topk), "random": variant(clean_share)}
    if untrained is not None:
        variants["untrained_teacher"] = variant(untrained)
    if chunk is not None:
        variants["chunk_4"] = variant(chunk)
    return Report(kinds=["clean", "shuffled_words"], settings=Settings(), teacher="t", student=student, rows=1,
                  tokens=10, mapped=mapped, clean_share=clean_share if canaries else 1.0, canaries=canaries,
                  variants=variants, losses={}, kept_histogram={}, unmapped_kept=0, dropped_tokens=0).verdict()


def test_the_verdict_says_whether_guidance_can_help_from_the_miniatures_thresholds():
    """docs/selection.md#the-verdict: a lift over the clean share of +0.15 or more separates (the miniature's top 40%
    that beat plain: +0.19); under +0.05 does not (a random selection's lift is 0, within 0.03 on 64 rows, and never
    helped); between, weak; a teacher no better than itself at initialization does not separate either."""
    from vocagno.diagnostics.selection.report import NO_SEPARATION, SEPARATES

    assert (SEPARATES, NO_SEPARATION) == (0.15, 0.05)
    miniature = verdict_of(0.703, clean_share=0.512, untrained=0.51)
    assert miniature.level == "separates" and miniature.advice == [] and miniature.lift == pytest.approx(0.191)
    assert "its top-k keeps 0.703 clean against a clean share of 0.512 (+0.191)" in miniature.line
    hurt = verdict_of(0.516, clean_share=0.479)  # +0.037
    assert hurt.level == "does not separate" and "expect no gain over plain training" in hurt.line
    assert hurt.advice[-1].startswith("plain training: ") and any("a teacher trained on this corpus's domain" in a
                                                       for a in hurt.advice)
    assert verdict_of(0.58, clean_share=0.479).level == "weak"
    no_better = verdict_of(0.70, clean_share=0.50, untrained=0.68)  # what a trained student alone ranks
    assert no_better.level == "does not separate" and "no better than the same teacher at initialization" in (
        no_better.line)
    chunky = verdict_of(0.67, clean_share=0.46, untrained=0.46, chunk=0.81)  # the shipped teacher's canaries
    assert chunky.level == "separates" and len(chunky.advice) == 1 and chunky.advice[0].startswith("chunk_4 keeps")
    flat = verdict_of(0.52, clean_share=0.479, chunk=0.70, student="at initialization (ln 32,000 per token)")
    assert flat.advice[0].startswith("chunk_4 keeps cleaner text here (0.700)") and "--student CHECKPOINT" in (
        flat.advice[1])
    none = verdict_of(1.0, canaries=0.0)
    assert none.level == "no verdict" and "add --canaries 0.5" in none.line
    assert verdict_of(0.0, clean_share=0.0, mapped=0).level == "no verdict"  # nothing mapped: no evidence


def test_the_report_ends_with_its_verdict_on_the_terminal_the_json_and_the_page(measured, heldout, capsys):
    """The shipped teacher on held-out GSM8K separates (0.670 against 0.455: docs/selection.md); the command's last
    line is the verdict; --json and the page's verdict box say the same."""
    report, page = measured
    assert report["verdict"]["level"] == "separates", report["verdict"]
    data = json.loads(page.split("const data = ", 1)[1].split(";\n", 1)[0])
    assert data["verdict"] == report["verdict"] and '<div id="verdict"></div>' in page and "verdict();" in page
    assert "box.append(head, line)" in page and "textContent = v.line" in page  # text, never markup
    assert selection.main(["--shards", str(heldout), "--teacher", "tiny-math-teacher", "--dtype", "float32",
                           "--samples", "8"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("verdict: no verdict without canaries: add --canaries 0.5"), last


def test_a_report_on_a_cpu_keeps_the_blocks_it_frees_for_the_next_batch(heldout, monkeypatch):
    """vocagno.memory, as train.py on a CPU: the models' logits and log-softmax reused, not faulted in again (a
    report of 64 rows: 1.75M page faults without it, 0.30M with it)."""
    from vocagno.teacher import scoring

    monkeypatch.setattr(scoring, "keep_freed_memory", reached)
    with pytest.raises(Reached):
        selection.main(["--shards", str(heldout), "--teacher", "tiny-math-teacher", "--dtype", "float32",
                        "--device", "cpu"])


@pytest.mark.parametrize("planted", ["an empty folder", "a link"])
def test_rows_a_work_folder_already_holds_unfinished_are_refused_in_one_line_and_nothing_is_left(planted, heldout,
                                                                                                tmp_path, capsys):
    work, victim = tmp_path / "work", tmp_path / "victim"
    work.mkdir()
    victim.mkdir()
    if planted == "a link":
        (work / "rows").symlink_to(victim)
    else:
        (work / "rows").mkdir()
    assert ends(selection.main, ["--shards", str(heldout), "--teacher", "tiny-math-teacher", "--samples", "8",
                                 "--device", "cpu", "--work", str(work)]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == (f"error: {work / 'rows'}: something stands there that no selection "
                                            "finished (no index.json): remove it, or give another --work"), err
    assert "Traceback" not in err
    assert not [p.name for p in work.iterdir() if p.name.startswith(".")]  # no staging folder left
    assert list(victim.iterdir()) == []


def test_the_report_measures_by_default_the_selection_a_run_makes_by_default():
    """Settings (the report's), VocAgnoLM's options and guided_loss take each default from one place: changing one
    there changes all three."""
    import inspect

    from vocagno.algorithms import VocAgnoLM
    from vocagno.core.loss import guided_loss

    report = Settings()
    trained = inspect.signature(VocAgnoLM).parameters
    computed = inspect.signature(guided_loss).parameters
    for option in ("topk_ratio", "aggregation", "unmapped", "selection", "alignment", "num_chunks",
                   "selection_scope"):
        assert getattr(report, option) == trained[option].default, option
        if option in computed:
            assert computed[option].default == trained[option].default, option


def test_shards_that_are_not_there_are_refused_with_the_conversion_that_makes_them(tmp_path, capsys):
    from helpers import command

    from vocagno import score
    from vocagno.selection import main as selection_main

    for main, argv in ((score.main, ["--teacher", "tiny-math-teacher", "--out", tmp_path / "scored"]),
                       (selection_main, ["--teacher", "tiny-math-teacher"])):
        result = command(main, ["--shards", tmp_path / "never", *argv], capsys)
        assert result.returncode == 2, result
        assert result.stderr.strip().splitlines()[-1].endswith(
            f"--shards {tmp_path}/never holds no shards: convert a corpus into it first (python "
            f"conversion/convert_dataset.py --input FILE --out-root {tmp_path}/never ...: docs/conversion.md)"), result


def test_a_teacher_folder_without_tokenizer_files_is_answered_with_the_flag_or_yaml_that_gives_one(heldout, tmp_path,
                                                                                                     capsys):
    """A colleague's folder of weights alone: one line naming the teacher and its folder, and how this command gives
    it a tokenizer: --teacher-tokenizer for one, a yaml's teachers: for several."""
    import shutil

    from helpers import command

    from vocagno.core.tokenization import shipped_model_dir
    from vocagno.selection import main as selection_main

    weights = tmp_path / "colleague"
    weights.mkdir()
    for path in shipped_model_dir("tiny-math-teacher").iterdir():
        if not path.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(path, weights / path.name)
    base = ["--shards", heldout, "--samples", "2", "--dtype", "float32", "--device", "cpu"]
    one = command(selection_main, [*base, "--teacher", weights], capsys)
    assert one.returncode == 2 and one.stderr.strip().splitlines()[-1] == (
        f"error: the teacher: its folder {weights} holds no tokenizer files (tokenizer.json, tokenizer.model, "
        "vocab.json, vocab.txt, tokenizer_config.json): add --teacher-tokenizer NAME_OR_FOLDER"), one.stderr
    two = command(selection_main, [*base, "--teacher", f"math={weights}", "--teacher", "tiny-math-teacher"], capsys)
    last = two.stderr.strip().splitlines()[-1]
    assert two.returncode == 2 and last.startswith("error: teacher 'math': its folder ") and last.endswith(
        "give it as teachers.NAME.tokenizer in a yaml, with --config YAML (several --teacher take each one's folder's "
        "tokenizer)"), two.stderr
