"""Small entry points fed files an attacker wrote: a benchmark data folder (vocagno.eval), a text to align
(vocagno.align), run folders (vocagno.report). Each refuses in one line naming the file, before reading more than the
file's size or its cap."""

import lzma

import pytest
from helpers import ends

from vocagno.align import main as align_main
from vocagno.eval.benchmarks import read_test_split
from vocagno.doors.untrusted import UntrustedFile


def test_a_report_of_runs_whose_results_are_a_device_or_a_list_says_so_in_one_line(tmp_path, capsys):
    from vocagno.report import main as report_main

    (tmp_path / "cpt").mkdir()
    (tmp_path / "cpt" / "results.json").symlink_to("/dev/zero")
    (tmp_path / "qwen").mkdir()
    (tmp_path / "qwen" / "results.json").write_text("[1, 2]")
    for run in ("cpt", "qwen"):
        assert ends(report_main, [str(tmp_path / run)]) == 2  # as its command line ends: vocagno.entry's one line
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"{tmp_path / run / 'results.json'}: refused: " in err, err



def test_align_refuses_a_device_a_fifo_or_a_file_over_the_document_cap_in_one_line(tmp_path, capsys, monkeypatch):
    import os

    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "big.txt").write_text("x" * 2000)
    monkeypatch.setenv("VOCAGNO_MAX_DOCUMENT_BYTES", "1000")
    for path, why in (("/dev/zero", "a character device"), (tmp_path / "fifo", "a FIFO"),
                      (tmp_path / "big.txt", "2,000 bytes, more than the 1,000 allowed")):
        with pytest.raises(SystemExit) as exit:
            align_main(["--student", "llama2", "--teacher", "mistral", "--file", str(path)])
        assert exit.value.code == 2
        message = capsys.readouterr().err.strip().splitlines()[-1]
        assert f"--file {path}: {path}: refused: {why}" in message, message


def test_a_benchmark_data_folder_with_a_bomb_a_link_or_broken_json_is_refused_by_name(tmp_path, monkeypatch):
    (tmp_path / "gsm8k").mkdir()
    packed = tmp_path / "gsm8k" / "test.jsonl.xz"
    packed.write_bytes(lzma.compress(b'{"question": "1+1", "answer": "2"}\n' * 100))
    assert len(read_test_split(tmp_path, "gsm8k")) == 100
    packed.write_bytes(lzma.compress(b" " * (64 << 20)))  # a few KiB that expand to 64 MiB
    monkeypatch.setenv("VOCAGNO_MAX_JSON_BYTES", str(1 << 20))
    with pytest.raises(UntrustedFile, match=r"test.jsonl.xz: refused: it decompresses to more bytes than the "
                                            r"1,048,576 allowed"):
        read_test_split(tmp_path, "gsm8k")
    (tmp_path / "gsm8k" / "test.jsonl").symlink_to("/etc/hostname")
    with pytest.raises(UntrustedFile, match="test.jsonl: refused: a symbolic link"):
        read_test_split(tmp_path, "gsm8k")
    (tmp_path / "gsm8k" / "test.jsonl").unlink()
    (tmp_path / "gsm8k" / "test.jsonl").write_bytes(b'{"question": "1"}\n\xff\n')
    with pytest.raises(UntrustedFile, match="test.jsonl: refused: line 2 is not JSON in UTF-8"):
        read_test_split(tmp_path, "gsm8k")


@pytest.mark.parametrize("change, why", [
    (lambda m: [m], "no format_version 2"),
    (lambda m: {**m, "student": {**m["student"], "separator_id": 10**12}}, "its student tokenizer's size or ids"),
    (lambda m: {**m, "teacher": {**m["teacher"], "evil": 1}}, "its teacher is not a tokenizer's description"),
    (lambda m: {**m, "teacher": {**m["teacher"], "vocab_size": "32000"}}, "its teacher is not a tokenizer's"),
    (lambda m: {**m, "seq_len": -5}, "seq_len -5"),
    (lambda m: {**m, "scored_by": ["x"]}, "its scored_by is not a mapping"),
])
def test_a_shard_folders_vocagno_json_of_other_shapes_is_refused_in_one_line(change, why, tmp_path):
    import json

    from vocagno.data.shards import ShardMetadata, TokenizerInfo

    info = TokenizerInfo("llama2", "a255706a2929068e", 32000, "</s>", 2, "<s>", 1)
    ShardMetadata(student=info, teacher=info, seq_len=64).write(tmp_path)
    assert ShardMetadata.read(tmp_path).seq_len == 64
    metadata = json.loads((tmp_path / "vocagno.json").read_text())
    (tmp_path / "vocagno.json").write_text(json.dumps(change(metadata)))
    with pytest.raises(UntrustedFile, match=f"vocagno.json: refused: {why}") as refused:
        ShardMetadata.read(tmp_path)
    assert "\n" not in str(refused.value)



def test_eval_refuses_a_bpb_file_without_text_or_a_data_folder_file_it_cant_trust_in_one_line(tmp_path, capsys):
    from vocagno.eval.__main__ import main as eval_main

    (tmp_path / "held.jsonl").write_text('{"text": "2 + 2 = 4"}\n{"content": "no text field"}\n')
    with pytest.raises(SystemExit) as exit:
        eval_main(["--model", "m", "--bpb", str(tmp_path / "held.jsonl")])
    assert exit.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: --bpb {tmp_path / 'held.jsonl'}: refused: document 2: missing text field 'text' (its fields: content): "
        "name the text's field with --bpb-field"]
    (tmp_path / "data" / "gsm8k").mkdir(parents=True)
    (tmp_path / "data" / "gsm8k" / "test.jsonl").symlink_to("/dev/zero")
    assert ends(eval_main, ["--gold", "--benchmarks", "gsm8k", "--data-dir", str(tmp_path / "data"),
                            "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: --data-dir {tmp_path / 'data' / 'gsm8k' / 'test.jsonl'}: refused: a symbolic link: vocagno "
                   "reads regular files only, and follows no link (copy the file itself there)"]
    assert not (tmp_path / "out" / "results.json").exists()


def test_a_linked_benchmark_folder_leads_nowhere_and_a_cap_set_wrong_is_one_line(tmp_path, capsys, monkeypatch):
    from vocagno.eval.__main__ import main as eval_main

    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "test.jsonl").write_text('{"question": "secret", "answer": "1"}\n')
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "gsm8k").symlink_to(tmp_path / "outside")
    assert ends(eval_main, ["--gold", "--benchmarks", "gsm8k", "--data-dir", str(tmp_path / "data"),
                            "--output", str(tmp_path / "out")]) == 2
    assert "follows no link" in capsys.readouterr().err
    monkeypatch.setenv("VOCAGNO_MAX_DOCUMENT_BYTES", "1k")
    (tmp_path / "t.txt").write_text("x")
    with pytest.raises(SystemExit) as exit:
        align_main(["--student", "llama2", "--teacher", "mistral", "--file", str(tmp_path / "t.txt")])
    assert exit.value.code == 2
    assert "VOCAGNO_MAX_DOCUMENT_BYTES='1k': a positive whole number of bytes" in \
        capsys.readouterr().err.strip().splitlines()[-1]


def test_a_stored_teacher_distribution_that_is_no_distribution_is_refused():
    """A shard's top-k columns are a target: rows whose probabilities and rest do not add up to 1 (within float16's
    rounding), or that name one token twice, would train toward no distribution (a crafted row of 1, 1, 1 and rest 1
    quadrupled both cached losses, unrefused)."""
    import numpy as np

    from vocagno.doors.untrusted import check_distribution

    ids = np.array([[3, 1], [0, 9], [4, 2]], dtype=np.uint32)
    probs = np.array([[0.6, 0.3], [0.5, 0.25], [0.9, 0.05]], dtype=np.float16)
    rest = (1 - probs.astype(np.float32).sum(1)).astype(np.float16)
    check_distribution(ids, probs, rest, 3, 2, 10, "float16", "s")
    mass = probs.copy()
    mass[1] = [1.0, 1.0]
    with pytest.raises(UntrustedFile, match="teacher_topk_probs and teacher_topk_rest add up to 2.25, not 1"):
        check_distribution(ids, mass, rest, 3, 2, 10, "float16", "s")
    twice = ids.copy()
    twice[2] = [4, 4]
    with pytest.raises(UntrustedFile, match="teacher_topk_ids names token 4 twice in a row"):
        check_distribution(twice, probs, rest, 3, 2, 10, "float16", "s")
