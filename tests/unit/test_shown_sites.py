"""Where vocagno shows text from a file, or a name from a folder or an object store, on a terminal or in an HTML
page: what an attacker wrote there reaches the terminal as escapes and the page as characters (vocagno.shown),
never as a command to the terminal or an element of the page."""

import re
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from vocagno.shown import terminal

# What a terminal acts on: C0 and C1 controls, DEL, the line and paragraph separators, the bidirectional controls.
ACTED_ON = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069\u061c]")
ATTACK = "x\x1b]0;owned\x07\x1b[2J\x9b31m\u202eevil\r\u2028<script>alert(1)</script>"


def shows_nothing_acted_on(text: str) -> None:
    assert not ACTED_ON.search(text), repr(text)


def test_inspect_shows_a_samples_text_and_a_shards_names_as_escapes():
    from vocagno.inspect import SampleView, header

    text = f"Natalia {ATTACK} sold"
    offsets = torch.tensor([[0, 7], [7, 20], [20, len(text)]])
    sample = {"text": text, "student_ids": torch.tensor([1, 2, 3]), "student_offsets": offsets,
              "teacher_ids": torch.tensor([4, 5]), "teacher_offsets": torch.tensor([[0, 20], [20, len(text)]])}
    view = SampleView(sample, None)
    shown = view.terminal(0, 10)
    shows_nothing_acted_on(shown)
    assert terminal(text[:7]) in shown and "\\x1b]0;owned" in shown
    names = SimpleNamespace(student=SimpleNamespace(name=ATTACK, vocab_size=10),
                            teacher=SimpleNamespace(name=ATTACK, vocab_size=10), seq_len=64)
    shown = header(f"shards/{ATTACK}", 3, names)
    shows_nothing_acted_on(shown)
    assert shown.count(terminal(ATTACK)) == 3
    page = view.html(0, f"{ATTACK} / {ATTACK}")
    title = re.search("<title>(.*)</title>", page, re.S).group(1)
    assert "<" not in title and "\x1b" not in title and "&lt;script&gt;" in title


def test_a_lock_files_host_and_pid_are_shown_as_escapes(tmp_path, capsys):
    import json
    import os
    import time

    from vocagno.data.outroots import OwnedLock

    lock = tmp_path / "job.lock"
    lock.write_text(json.dumps({"host": ATTACK, "pid": ATTACK, "since": time.time()}))
    assert OwnedLock(lock, "conversion").acquire() in (True, False)
    lock.write_text(json.dumps({"host": ATTACK, "pid": os.getpid(), "since": time.time()}))
    assert OwnedLock(lock, "conversion").acquire() is False  # held by this process, on another host's name
    out = capsys.readouterr().out
    shows_nothing_acted_on(out.replace("\n", ""))
    assert f"held by pid {os.getpid()} on {terminal(ATTACK)}" in out


def test_the_conversion_summary_shows_corpus_file_names_as_escapes(tmp_path, capsys):
    from vocagno.conversion.merge import print_summary

    output = SimpleNamespace(local=tmp_path, __str__=lambda self: "out")
    print_summary("merged", Counter({"documents read": 2, "student tokens": 0}), output, [],
                  unreadable={f"corpus/{ATTACK}.jsonl": f"refused: {ATTACK}"}, over_cap=[f"{ATTACK}.jsonl:3"])
    out = capsys.readouterr().out
    shows_nothing_acted_on(out.replace("\n", ""))
    assert f"UNREADABLE: corpus/{terminal(ATTACK)}.jsonl: refused: {terminal(ATTACK)}" in out
    assert f"skipped, over the document cap: {terminal(ATTACK)}.jsonl:3" in out


def test_a_corpus_folders_ignored_file_names_are_shown_as_escapes(tmp_path, capsys):
    from vocagno.conversion.sources import local_sources

    (tmp_path / f"{ATTACK.replace('/', '')}.bin").write_text("x")
    (tmp_path / "docs.jsonl").write_text('{"text": "a"}\n')
    local_sources([str(tmp_path)], lambda record: record["text"])
    out = capsys.readouterr().out
    assert "ignored 1 file(s)" in out
    shows_nothing_acted_on(out.replace("\n", ""))


def test_the_selection_reports_table_and_page_show_names_as_escapes():
    from vocagno.diagnostics.selection.report import Report
    from vocagno.diagnostics.selection.settings import Settings

    kinds = ["clean", "shuffled_words"]
    share = {k: 0.5 for k in kinds}
    report = Report(kinds=kinds, settings=Settings(), teacher=ATTACK, student=ATTACK, rows=2, tokens=10, mapped=8,
                    clean_share=0.5, canaries=0.5,
                    variants={"topk": {"precision": 0.5, "recall": 0.5, "kept_share": share}},
                    losses={"teacher": {k: 1.0 for k in kinds}}, kept_histogram={k: [0] * 10 for k in kinds},
                    unmapped_kept=0, dropped_tokens=0,
                    sources={ATTACK: {"rows": 1, "mapped": 4, "clean_share": 0.5,
                                      "topk": {"precision": 0.5, "recall": 0.5, "kept_share": share}}})
    table = report.table()
    shows_nothing_acted_on(table.replace("\n", ""))
    assert f"teacher: {terminal(ATTACK)}; student: {terminal(ATTACK)}" in table
    title = re.search("<title>(.*)</title>", report.page(f"What the teacher keeps: {ATTACK}"), re.S).group(1)
    assert "<" not in title and "\x1b" not in title


def test_who_scored_cached_losses_is_shown_as_escapes_when_unchecked(capsys):
    from vocagno.teacher.teacher import Teacher

    # check_scored_by false: only says who scored them, as the shards' metadata names it (whatever it holds)
    Teacher("tiny-math-teacher", check_scored_by=False).check_scorer(ATTACK, "teacher_loss was")
    out = capsys.readouterr().out
    shows_nothing_acted_on(out.replace("\n", ""))
    assert f"VocAgnoLM: teacher_loss was scored by {terminal(ATTACK)}; not checked" in out


def test_who_scored_a_runs_cached_losses_is_said_as_escapes():
    from vocagno.algorithms.vocagno_lm import VocAgnoLM

    # the training shards' vocagno.json names who scored their losses: the run's first line says it (Narration)
    metadata = SimpleNamespace(scored_by={"name": ATTACK}, also_scored_by={"b": {"name": ATTACK}})
    state = SimpleNamespace(train_dataloader=SimpleNamespace(dataset=SimpleNamespace(metadata=metadata)))
    line = VocAgnoLM.teacher_source(SimpleNamespace(cached=True), state)
    shows_nothing_acted_on(line)
    assert line == f"teacher losses: cached in the training shards, scored by {terminal(ATTACK)}, {terminal(ATTACK)}"


def test_align_shows_a_tokenizers_pieces_as_escapes(capsys, monkeypatch):
    import vocagno.align

    class Pieces:  # a tokenizer whose vocabulary (a tokenizer.json from elsewhere) holds escape sequences
        def convert_ids_to_tokens(self, ids):
            return [ATTACK] * len(ids)

    def encode(tokenizer, text, add_special_tokens=True):
        return np.array([1, 2]), np.array([[0, 2], [2, len(text)]])

    monkeypatch.setattr(vocagno.align, "load_tokenizer", lambda name: Pieces())
    monkeypatch.setattr(vocagno.align, "encode_with_offsets", encode)
    monkeypatch.setattr(vocagno.align, "vocab_overlap", lambda a, b: "n/a")
    vocagno.align.main(["--text", "ab cd", "--student", "s", "--teacher", "t"])
    out = capsys.readouterr().out
    shows_nothing_acted_on(out.replace("\n", ""))
    assert terminal(ATTACK) in out


def test_a_cached_runs_refusal_names_who_scored_the_shards_as_escapes():
    """ULD from cached distributions on shards that carry only losses: the scorer's name, from the shards' metadata,
    is shown quoted and escaped (the refusal may reach a terminal through llm-foundry, not through vocagno.entry)."""
    from types import SimpleNamespace

    from vocagno.algorithms.baselines import ULD

    uld = ULD(teacher="tiny-math-teacher", teacher_losses="cached")
    metadata = SimpleNamespace(scored_by={"name": ATTACK, "fingerprint": "0", "dtype": "float32"})
    state = SimpleNamespace(train_dataloader=SimpleNamespace(dataset=SimpleNamespace(metadata=metadata)))
    with pytest.raises(ValueError) as refused:
        uld._check_cached(state)
    shows_nothing_acted_on(str(refused.value).replace("\n", ""))
    assert f"carry the losses of {ATTACK!r} but no distributions" in str(refused.value)
