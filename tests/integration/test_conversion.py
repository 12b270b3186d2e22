"""Corpus -> MDS shards -> dataset and collator, on the shipped sample and on nasty documents."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from at_once import open_dataset, read_metadata_of, run_at_once, write_many
from helpers import assert_group_gone, command, kill_group

from vocagno.conversion import parts
from vocagno.conversion.convert import main as convert_main
from vocagno.conversion.records import TextOf
from vocagno.conversion.sources import hub_sources, parse_jsonl_line, sources_of
from vocagno import inspect as inspect_command
from vocagno.errors import Refused
from vocagno.core.alignment import align
from vocagno.data.dataset import TeacherGuidedCollator, TeacherGuidedDataset
from vocagno.data.shards import ShardMetadata
from vocagno.core.tokenization import ASSETS, encode_with_offsets, load_tokenizer

SAMPLE = str(ASSETS / "text" / "gsm8k_train_500.jsonl")
SEQ_LEN = 128
BASE_ARGS = ["--student-tokenizer", "llama2", "--teacher-tokenizer", "qwen2.5", "--seq-len", str(SEQ_LEN)]
REPO = Path(__file__).resolve().parents[2]


def convert(out_root, *args, inputs=(SAMPLE,)):
    assert convert_main(["--input", *map(str, inputs), *BASE_ARGS, "--out-root", str(out_root), *args]) == 0
    return out_root


def read_samples(root, tmp_path, first=None, **kwargs):
    """Every sample of a shard folder (or its ``first``), in order, read through Streaming into a cache folder of its
    own."""
    local = tmp_path / f"cache-{Path(root).name}-{time.monotonic_ns()}"
    dataset = TeacherGuidedDataset(local=str(local), remote=str(root), batch_size=1, **kwargs)
    samples = [dataset[i] for i in range(min(len(dataset), first or len(dataset)))]
    del dataset
    return samples


def same_samples(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x["text"] == y["text"]
        for key in ("student_ids", "student_offsets", "teacher_ids", "teacher_offsets"):
            assert torch.equal(x[key], y[key]), key


@pytest.fixture(scope="module")
def sample_shards(tmp_path_factory):
    return convert(tmp_path_factory.mktemp("sample"), "--docs-per-part", "100")


@pytest.fixture(scope="module")
def sample_samples(sample_shards, tmp_path_factory):
    return read_samples(sample_shards, tmp_path_factory.mktemp("read"))


@pytest.mark.slow
def test_ranks_writing_the_same_file_at_once_each_leave_it_whole(tmp_path):
    """Every rank of a scoring pass writes its settings file at start (score.json): the writes of several processes
    at once each replace the file whole, and none fails on another's temporary file."""
    text = json.dumps({"teacher": "x" * 5000})
    assert run_at_once(write_many, [(tmp_path / "score.json", text)] * 4) == [0] * 4
    assert (tmp_path / "score.json").read_text() == text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["score.json"]


@pytest.mark.slow
def test_ranks_of_a_node_fetch_the_shards_metadata_into_one_local_at_once(sample_shards, tmp_path):
    """Each rank of a node reads vocagno.json from the remote into the node's local before Streaming starts: four at
    once all get it, and the local holds it alone."""
    for attempt in range(10):
        local = tmp_path / f"local{attempt}"
        assert run_at_once(read_metadata_of, [(local, sample_shards)] * 4) == [0] * 4, attempt
        assert sorted(p.name for p in local.iterdir()) == ["vocagno.json"]
        assert ShardMetadata.read(local) == ShardMetadata.read(sample_shards)


@pytest.mark.slow
def test_jobs_of_a_node_opening_datasets_at_once_each_get_their_own_shared_memory(sample_shards, tmp_path):
    """Two jobs on one node (or pytest's two workers) starting at the same moment: each dataset takes a free
    Streaming prefix, none fails on a prefix another took between Streaming's search and its registration."""
    from vocagno.compat.streaming_shm import clean_leaked_shared_memory

    locals_ = [str(tmp_path / f"local{job}") for job in range(4)]
    for attempt in range(5):
        codes = run_at_once(open_dataset, [(local, sample_shards) for local in locals_])
        clean_leaked_shared_memory(locals_)  # what a process that failed half-way left
        assert codes == [0] * 4, (attempt, codes)


def test_processes_started_at_once_do_not_inherit_the_locks_the_test_process_holds(sample_shards, tmp_path):
    """The processes of the tests above start from a clean server, not as forks of this process: a lock held here
    (as a thread of an earlier test may hold one at the fork), here the one around Streaming's memories, does not hang
    them inside the registration lock."""
    from vocagno.compat.streaming_shm import _replacing_lock, clean_leaked_shared_memory

    locals_ = [str(tmp_path / f"local{job}") for job in range(4)]
    with _replacing_lock:
        codes = run_at_once(open_dataset, [(local, sample_shards) for local in locals_], timeout=60)
    clean_leaked_shared_memory(locals_)  # what a killed process left
    assert codes == [0] * 4


def test_round_trip_invariants(sample_samples, sample_shards, tokenizers):
    student, teacher = tokenizers["llama2"], tokenizers["qwen2.5"]
    meta = ShardMetadata.read(sample_shards)
    assert (meta.student.name, meta.teacher.name, meta.seq_len) == ("llama2", "qwen2.5", SEQ_LEN)
    assert meta.totals["samples"] == len(sample_samples) > 100
    assert meta.totals["documents read"] == meta.totals["documents converted"] == 500
    doc_start_prefix = 0
    for sample in sample_samples:
        text = sample["text"]
        s_ids, s_off = sample["student_ids"].numpy(), sample["student_offsets"].numpy()
        t_ids, t_off = sample["teacher_ids"].numpy(), sample["teacher_offsets"].numpy()
        assert len(s_ids) == SEQ_LEN and s_off.shape == (SEQ_LEN, 2) and t_off.shape == (len(t_ids), 2)
        for offsets in (s_off, t_off):
            assert ((0 <= offsets[:, 0]) & (offsets[:, 0] <= offsets[:, 1]) & (offsets[:, 1] <= len(text))).all()
        # Specials: empty spans. Llama's BOS starts each row (Qwen adds none); the tokenizers' own end of text
        # separates documents.
        assert s_ids[0] == student.bos_token_id and tuple(s_off[0]) == (0, 0)
        assert set(s_ids[1:][s_off[1:, 0] == s_off[1:, 1]]) <= {student.eos_token_id}
        assert set(t_ids[t_off[:, 0] == t_off[:, 1]]) <= {teacher.convert_tokens_to_ids("<|endoftext|>")}
        assert (s_ids == student.eos_token_id).sum() == (t_ids == teacher.eos_token_id).sum()
        # Teacher coverage: every character under a non-special student token is under a teacher token.
        covered = np.zeros(len(text), bool)
        for s, e in t_off:
            covered[s:e] = True
        for s, e in s_off:
            assert covered[s:e].all()
        # Each id's piece is its span of text.
        for i, (s, e) in zip(s_ids.tolist(), s_off.tolist()):
            piece = student.convert_ids_to_tokens(i)
            if s == e or piece.startswith("<0x"):
                continue
            expected = piece.replace("▁", " ")
            if expected != text[s:e]:
                assert expected == " " + text[s:e]  # the '▁' SentencePiece prepends to a document's first word
                doc_start_prefix += 1
        for i, (s, e) in zip(t_ids.tolist(), t_off.tolist()):
            piece = teacher.decode([i])
            if s < e and "\ufffd" not in piece:
                assert piece == text[s:e]
    assert doc_start_prefix <= 500


def test_samples_follow_the_documents(sample_samples):
    # Consecutive samples continue the token stream; the text of a sample may reach back for a straddling teacher
    # token, never further.
    docs = [json.loads(line)["text"] for line in open(SAMPLE, encoding="utf-8")]
    joined = "".join(docs)
    found = 0
    for sample in sample_samples[:20]:
        at = joined.find(sample["text"], found - 50 if found > 50 else 0)
        assert at >= 0, "a sample's text is not a stretch of the corpus"
        found = at
    assert sample_samples[0]["text"].startswith(docs[0][:50])


@pytest.mark.slow
def test_two_workers_give_the_same_samples(sample_samples, tmp_path):
    root = convert(tmp_path / "two", "--docs-per-part", "100", "--workers", "2")
    same_samples(read_samples(root, tmp_path), sample_samples)


@pytest.mark.parametrize("made", ["missing", "empty"])
def test_a_folder_never_converted_is_named_with_how_to_convert_into_it(tmp_path, made):
    if made == "empty":
        (tmp_path / "never").mkdir()
    with pytest.raises(FileNotFoundError) as refused:
        TeacherGuidedDataset(local=str(tmp_path / "never"), batch_size=1)
    assert str(refused.value) == (f"{tmp_path}/never holds no shards: convert a corpus into it first (python "
                                  f"conversion/convert_dataset.py --input FILE --out-root {tmp_path}/never ...: "
                                  "docs/conversion.md)")


@pytest.mark.slow
def test_jobs_split_sources_and_the_last_merges(tmp_path):
    lines = open(SAMPLE, encoding="utf-8").read().splitlines(keepends=True)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text("".join(lines[:200]), encoding="utf-8")
    (tmp_path / "in" / "b.jsonl").write_text("".join(lines[200:]), encoding="utf-8")
    single = convert(tmp_path / "single", inputs=[tmp_path / "in"])
    split = tmp_path / "split"
    convert(split, "--num-jobs", "2", "--job-index", "1", inputs=[tmp_path / "in"])
    assert not (split / "index.json").exists()  # half the jobs: not a dataset yet
    with pytest.raises(FileNotFoundError, match="conversion has not finished"):
        TeacherGuidedDataset(local=str(split), batch_size=1)
    convert(split, "--num-jobs", "2", "--job-index", "0", inputs=[tmp_path / "in"])
    assert (split / "index.json").exists()
    same_samples(read_samples(split, tmp_path), read_samples(single, tmp_path))


@pytest.mark.slow
def test_kill_and_resume_gives_the_uninterrupted_samples(sample_samples, tmp_path, capsys, monkeypatch):
    root = tmp_path / "killed"
    line = [sys.executable, str(REPO / "conversion" / "convert_dataset.py"), "--input", SAMPLE, *BASE_ARGS,
            "--out-root", str(root), "--docs-per-part", "25"]
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}  # run as docs/conversion.md says
    process = subprocess.Popen(line, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    deadline = time.time() + 300
    while len(list(root.glob("part-*/part.json"))) < 2 and time.time() < deadline and process.poll() is None:
        time.sleep(0.02)
    kill_group(process.pid)  # as a node's death kills it, with its workers
    process.wait()
    assert_group_gone(process.pid)
    done = len(list(root.glob("part-*/part.json")))
    assert 2 <= done < 20, f"the kill should land mid-run ({done} of 20 parts done)"
    assert not (root / "index.json").exists()
    monkeypatch.chdir(tmp_path)  # the same line again, in this process: the kill was the process
    result = command(convert_main, line[2:], capsys)
    assert result.returncode == 0, result.stderr
    assert "documents read:        500" in result.stdout  # the summary counts the parts kept from the first run
    # 25-document parts drop more tails than 100-document parts: compare with an uninterrupted 25-document run.
    reference = convert(tmp_path / "reference", "--docs-per-part", "25")
    same_samples(read_samples(root, tmp_path), read_samples(reference, tmp_path))


def test_changed_settings_on_an_existing_root_are_refused(sample_shards):
    with pytest.raises(Refused, match="seq_len differ"):
        convert_main(["--input", SAMPLE, "--student-tokenizer", "llama2", "--teacher-tokenizer", "qwen2.5",
                      "--seq-len", "64", "--out-root", str(sample_shards), "--docs-per-part", "100"])


def test_dataset_refuses_shards_of_other_tokenizers(sample_shards, tmp_path):
    with pytest.raises(ValueError, match="student tokenizer is 'llama2'.*this run's student tokenizer is 'mistral'"):
        TeacherGuidedDataset(local=str(sample_shards), student_tokenizer="mistral", batch_size=1)
    with pytest.raises(ValueError, match="teacher tokenizer is 'qwen2.5'.*this run's teacher tokenizer is 'deepseek-llm'"):
        TeacherGuidedDataset(local=str(sample_shards), teacher_tokenizer="deepseek-llm", batch_size=1)
    # The same tokenizers under another name (a folder of the same files) are accepted.
    from vocagno.core.tokenization import shipped_tokenizer_dir

    dataset = TeacherGuidedDataset(local=str(tmp_path / "c"), remote=str(sample_shards), batch_size=1,
                                   student_tokenizer=str(shipped_tokenizer_dir("llama2")), teacher_tokenizer="qwen2.5")
    assert len(dataset) > 0
    del dataset


def test_collator_builds_what_the_loss_takes(sample_samples, tokenizers):
    student, teacher = tokenizers["llama2"], tokenizers["qwen2.5"]
    collate = TeacherGuidedCollator(student_pad_id=student.eos_token_id, teacher_pad_id=teacher.pad_token_id)
    samples = sample_samples[:3]
    batch = collate(samples)
    m = max(len(s["teacher_ids"]) for s in samples)
    assert batch["teacher_input_ids"].shape == (3, -(-m // 64) * 64)  # the longest row, up to a multiple of 64
    for b, sample in enumerate(samples):
        ids, n_teacher = sample["student_ids"], len(sample["teacher_ids"])
        assert torch.equal(batch["input_ids"][b], ids)
        assert torch.equal(batch["labels"][b], ids)  # Hugging Face's convention: the model shifts
        start, end = align(sample["student_offsets"].numpy(), sample["teacher_offsets"].numpy())
        assert batch["align_start"][b].tolist() == start.tolist()
        assert batch["align_end"][b].tolist() == end.tolist()
        assert batch["teacher_attention_mask"][b].sum() == n_teacher
        text, offsets = sample["text"], sample["student_offsets"].tolist()
        assert batch["token_bytes"][b].tolist() == [len(text[s:e].encode("utf-8")) for s, e in offsets]
        assert (batch["teacher_input_ids"][b, n_teacher:] == teacher.pad_token_id).all()
        # The BOS and the separators (EOS labels) are unmapped; everything else in this text maps.
        unmapped = batch["align_start"][b] == batch["align_end"][b]
        assert torch.equal(unmapped, (ids == student.eos_token_id) | (ids == student.bos_token_id))

    fixed = TeacherGuidedCollator(student.eos_token_id, teacher.pad_token_id, teacher_seq_len=m + 7)(samples)
    assert fixed["teacher_input_ids"].shape == (3, m + 7)
    short = TeacherGuidedCollator(student.eos_token_id, teacher.pad_token_id, teacher_seq_len=50)
    with pytest.warns(UserWarning, match="teacher tokens more than teacher_seq_len=50"):
        cut = short(samples)
    assert cut["teacher_input_ids"].shape == (3, 50)
    assert (cut["align_end"] <= 50).all()
    assert short.truncated_teacher_tokens == sum(len(s["teacher_ids"]) - 50 for s in samples)


def test_resumption_replays_the_same_batches(sample_shards, tmp_path):
    kwargs = dict(remote=str(sample_shards), batch_size=4, shuffle=True, shuffle_seed=17, num_canonical_nodes=1)
    dataset = TeacherGuidedDataset(local=str(tmp_path / "a"), **kwargs)
    loader = torch.utils.data.DataLoader(dataset, batch_size=4, collate_fn=lambda xs: [x["text"] for x in xs])
    uninterrupted = [batch for _, batch in zip(range(12), loader)]
    state = dataset.state_dict(num_samples=5 * 4, from_beginning=False)
    del loader, dataset
    resumed = TeacherGuidedDataset(local=str(tmp_path / "b"), **kwargs)
    resumed.load_state_dict(state)
    loader = torch.utils.data.DataLoader(resumed, batch_size=4, collate_fn=lambda xs: [x["text"] for x in xs])
    replay = [batch for _, batch in zip(range(7), loader)]
    assert replay == uninterrupted[5:]
    del loader, resumed


NASTY_LINES = [
    b'{"text": ""}',  # empty
    b'{"text": "   \\n\\t  "}',  # whitespace only
    b'{"body": "no text field here"}',  # missing text field
    b'{"text": 42}',  # not a string
    b'{"text": null}',
    b'{"text": "broken JSON',  # invalid JSON
    b'["a list, not an object"]',
    b'{"text": "Caf\xe9 in Latin-1, not UTF-8: \xff\xfe"}',  # invalid UTF-8, repaired
    b'{"text": "a lone surrogate \\ud800 here, and a pair \\ud83d\\ude00"}',  # repaired
    b'{"text": "NUL \\u0000 characters \\u0000 inside"}',  # kept
    b'{"text": "An ordinary document about 3/4 of a pizza."}',
    b'{"text": "Cafe\\u0301 with a combining accent that Qwen folds"}',
] + [b'{"text": "A long enough ordinary document, so that this file fills a sample of 128 student tokens: ' + b"the sum of the first n odd numbers is n squared, and the sum of the first n integers is n(n+1)/2. " * 2 + b'"}'] * 3


@pytest.mark.slow
def test_nasty_documents_are_all_accounted_for(tmp_path, monkeypatch):
    monkeypatch.setattr(parts, "SHARD_BYTES", 1 << 20)  # the long document's part fills several shards
    corpus = tmp_path / "nasty"
    corpus.mkdir()
    (corpus / "a.jsonl").write_bytes(b"\n".join(NASTY_LINES) + b"\n\n")
    (corpus / "b.json").write_text(json.dumps([{"text": "from a JSON list"}, {"title": "no text"}]))
    (corpus / "c.txt").write_bytes(b"A plain text file.\n\x00 with a NUL byte")
    pq.write_table(pa.table({"text": ["parquet row one", None, "parquet row three"]}), corpus / "d.parquet")
    words = "The integral of x squared is x cubed over three. "
    (corpus / "e.txt").write_text((words * (3_000_000 // len(words) + 1))[:3_000_000], encoding="utf-8")
    root = convert(tmp_path / "out", "--workers", "2", inputs=[corpus])
    totals = ShardMetadata.read(root).totals
    expected_skips = {
        "skipped: empty or whitespace-only": 2,
        "skipped: missing text field 'text'": 2,
        "skipped: text field is a number, not a string": 1,  # the file's words, not Python's type names
        "skipped: text field is null, not a string": 2,  # a JSON null, and a .parquet row's
        "skipped: invalid JSON line": 1,
        "skipped: not a JSON object": 1,
    }
    for reason, count in expected_skips.items():
        assert totals.get(reason) == count, reason
    assert totals["repaired: invalid UTF-8 replaced by U+FFFD"] == 1
    assert totals["repaired: lone surrogates replaced by U+FFFD"] == 1
    assert totals["kept: contains NUL characters"] == 2
    assert totals["fields of records skipped for lacking one: body"] == totals[
        "fields of records skipped for lacking one: title"] == 1
    assert totals["repaired: longer than 1,000,000 characters, tokenized in pieces"] == 1
    assert totals["documents read"] == len(NASTY_LINES) + 2 + 1 + 3 + 1
    skipped = sum(v for k, v in totals.items() if k.startswith("skipped: "))
    assert totals["documents converted"] + skipped == totals["documents read"]
    assert totals["characters under student tokens that the teacher's normalizer folded away"] == 1
    assert totals["student tokens"] > 61_224 * 13  # the 3 MB document made it through: 61,225 sentences of 13 tokens
    assert len(json.loads((root / "index.json").read_text())["shards"]) > 5
    samples = read_samples(root, tmp_path, first=50)
    texts = "".join(s["text"] for s in samples[:50])
    assert "Caf\ufffd in Latin-1" in texts and "surrogate \ufffd here, and a pair \U0001f600" in texts


def test_inspect_shows_a_sample_and_the_corpus(sample_shards, tmp_path, capsys):
    page = tmp_path / "sample.html"
    result = command(inspect_command.main, ["--shards", sample_shards, "--index", "3", "--html", page,
                                            "--max-samples", "50", "--rows", "5"], capsys)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert f"samples of {SEQ_LEN} student tokens" in out and "sample 3:" in out
    assert "statistics over 50 samples" in out and "unmapped others (folded chars):   0" in out
    assert "vocabulary overlap:               9,587 / 151,643 = 6.32%" in out
    assert "[SEP]" in out  # the separators between documents
    html = page.read_text(encoding="utf-8")
    data = json.loads(html.split("const data = ", 1)[1].split(";\n", 1)[0])
    assert len(data["student"]) == SEQ_LEN
    for token in data["student"]:
        if token["first"] < token["last"]:
            teacher = data["teacher"][token["first"] : token["last"]]
            assert all(t["s"] < token["e"] and token["s"] < t["e"] for t in teacher)
            assert 0 < token["iou"] <= 1
    assert html.count("<script>") == 1 and "http" not in html.split("<body>")[1]  # self-contained


@pytest.mark.slow
def test_remote_output_uploads_parts_and_resumes_from_the_remote(sample_samples, tmp_path):
    # --local-root sends the output through the remote code path; Streaming's local uploader stands in for S3.
    remote = tmp_path / "remote"
    args = ["--docs-per-part", "100", "--out-root", str(remote)]
    convert_main(["--input", SAMPLE, *BASE_ARGS, *args, "--local-root", str(tmp_path / "work1")])
    assert (remote / "index.json").exists() and (remote / "vocagno.json").exists()
    assert len(list(remote.glob("part-*/shard.*"))) == 5
    # An interrupted run elsewhere: the last part never finished and nothing was merged.
    (remote / "index.json").unlink()
    (remote / "vocagno.json").unlink()
    (remote / "part-00000-000004" / "part.json").unlink()
    convert_main(["--input", SAMPLE, *BASE_ARGS, *args, "--local-root", str(tmp_path / "work2")])
    redone = [p.parent.name for p in (tmp_path / "work2").glob("part-*/shard.*")]
    assert redone == ["part-00000-000004"]  # only the unfinished part was converted again
    same_samples(read_samples(remote, tmp_path), sample_samples)


def test_hub_datasets_stream_one_source_per_file(tmp_path):
    # The hub path (datasets.load_dataset(..., streaming=True), one source per file shard) on a local folder, which
    # datasets loads the same way offline.
    lines = open(SAMPLE, encoding="utf-8").read().splitlines(keepends=True)
    folder = tmp_path / "hubish"
    folder.mkdir()
    (folder / "train-0.jsonl").write_text("".join(lines[:30]), encoding="utf-8")
    (folder / "train-1.jsonl").write_text("".join(lines[30:50]), encoding="utf-8")
    sources = hub_sources(str(folder), "train", TextOf())
    assert len(sources) == 2
    texts = [r.text for source in sources for r in source.records()]
    assert sorted(texts) == sorted(json.loads(line)["text"] for line in lines[:50])
    assert [r.problem for r in hub_sources(str(folder), "train", TextOf("body"))[0].records()][:1] == [
        "missing text field 'body'"
    ]


def small_corpus(path, extra=()):
    docs = [json.loads(line)["text"] for line in open(SAMPLE, encoding="utf-8")][:40]
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": d}) + "\n" for d in [*docs, *extra])
    return path


def test_a_teacher_whose_tokenizer_adds_bos_reads_rows_that_start_with_it(tmp_path, tokenizers):
    """Mistral (like Llemma and DeepSeek) starts every text with <s>: each teacher row does too, as an unmapped
    empty span, and the teacher's first real token gets a loss."""
    corpus = small_corpus(tmp_path / "docs.jsonl")
    root = tmp_path / "shards"
    assert convert_main(["--input", str(corpus), "--student-tokenizer", "llama2", "--teacher-tokenizer",
                         "mistral", "--seq-len", "64", "--out-root", str(root)]) == 0
    meta = ShardMetadata.read(root)
    assert (meta.teacher.bos, meta.teacher.bos_id) == ("<s>", 1) and meta.student.bos == "<s>"
    samples = read_samples(root, tmp_path)
    assert len(samples) > 10
    for sample in samples:
        t_ids, t_off = sample["teacher_ids"], sample["teacher_offsets"]
        assert t_ids[0] == 1 and t_off[0].tolist() == [0, 0] and (t_ids[1:] != 1).all()
        start, end = align(sample["student_offsets"].numpy(), t_off.numpy())
        assert not ((start == 0) & (end > 0)).any()  # no student token is aligned to the BOS
    qwen = ShardMetadata.read(convert(tmp_path / "qwen", inputs=(corpus,)))
    assert qwen.teacher.bos is None and qwen.student.bos == "<s>"  # Qwen2.5 adds no BOS


def test_documents_end_with_end_of_text_also_for_an_instruct_teacher(tmp_path, tokenizers):
    """Qwen2.5-Math-7B-Instruct's tokenizer says eos_token <|im_end|> (a chat turn's end); documents end with
    <|endoftext|>, and vocagno.json says so."""
    instruct = load_tokenizer("qwen2.5")
    instruct.eos_token = "<|im_end|>"
    instruct.save_pretrained(tmp_path / "qwen-instruct")
    root = tmp_path / "shards"
    assert convert_main(["--input", str(small_corpus(tmp_path / "docs.jsonl")), "--student-tokenizer", "llama2",
                         "--teacher-tokenizer", str(tmp_path / "qwen-instruct"), "--seq-len", "64",
                         "--out-root", str(root)]) == 0
    teacher = json.loads((root / "vocagno.json").read_text())["teacher"]
    assert (teacher["separator"], teacher["separator_id"]) == ("<|endoftext|>", 151643)
    ids = np.concatenate([s["teacher_ids"].numpy() for s in read_samples(root, tmp_path)])
    assert (ids == 151643).sum() > 10 and (ids == instruct.convert_tokens_to_ids("<|im_end|>")).sum() == 0


def test_special_token_strings_in_documents_stay_text_and_are_counted(tmp_path, tokenizers):
    tricky = ["Write </s> or <s> to end a Llama text.", "Qwen ends a document with <|endoftext|> and a turn with "
              "<|im_end|>; <s></s> is two more."]
    root = tmp_path / "shards"
    assert convert_main(["--input", str(small_corpus(tmp_path / "docs.jsonl", tricky)), *BASE_ARGS[:4],
                         "--seq-len", "32", "--out-root", str(root)]) == 0
    assert ShardMetadata.read(root).totals[parts.SPECIAL_STRINGS] == 6
    student_specials = set(tokenizers["llama2"].all_special_ids)
    teacher_specials = set(tokenizers["qwen2.5"].all_special_ids)
    texts = []
    for sample in read_samples(root, tmp_path):
        for ids, offsets, specials in ((sample["student_ids"], sample["student_offsets"], student_specials),
                                       (sample["teacher_ids"], sample["teacher_offsets"], teacher_specials)):
            is_special = torch.tensor([int(i) in specials for i in ids])
            assert torch.equal(is_special, offsets[:, 0] == offsets[:, 1])  # specials: exactly the empty spans
        texts.append(sample["text"])
    assert any("<|endoftext|> and a turn" in t for t in texts)
    ids, offsets = encode_with_offsets(tokenizers["llama2"], tricky[0], add_special_tokens=True)
    assert ids[0] == 1 and 2 not in ids and (offsets[1:, 0] < offsets[1:, 1]).all()


def test_inspect_html_escapes_markup_in_documents(tmp_path, capsys):
    doc = "Comment <!--<script>alert(1)</script> and </script><b>bold</b> & more"
    root = tmp_path / "shards"
    assert convert_main(["--input", str(small_corpus(tmp_path / "docs.jsonl", [doc] * 4)), *BASE_ARGS[:4],
                         "--seq-len", "64", "--out-root", str(root)]) == 0
    samples = read_samples(root, tmp_path)
    index = next(i for i, sample in enumerate(samples) if "<!--<script>" in sample["text"])
    page = tmp_path / "sample.html"
    result = command(inspect_command.main, ["--shards", root, "--index", index, "--html", page], capsys)
    assert result.returncode == 0, result.stderr
    html = page.read_text(encoding="utf-8")
    script = html.split("<script>", 1)[1].split("</script>", 1)[0]
    assert "const data = " in script and "render(" in script  # the whole script is one element
    assert "<" not in script.split("const data = ", 1)[1].split(";\n", 1)[0]
    assert html.count("<script>") == 1 and "<!--" not in html
    data = json.loads(script.split("const data = ", 1)[1].split(";\n", 1)[0])
    assert "<!--<script>alert(1)</script>" in data["text"]


def test_a_missing_input_path_is_named_not_sent_to_the_hub(tmp_path):
    with pytest.raises(Refused, match="input data/no_such_folder is no local file or folder, and as a "
                                         "Hugging Face dataset it could not be loaded"):
        convert(tmp_path / "out", inputs=("data/no_such_folder",))


def records_of(path) -> list[tuple]:
    """(text, problem) of each record the converter reads of the file ``path`` (a JSON line parsed as workers do)."""
    (source,) = sources_of([str(path)], "train", TextOf())
    records = (parse_jsonl_line(r, TextOf()) if isinstance(r, bytes) else r for r in source.records())
    return [(r.text, r.problem) for r in records]


def test_a_json_file_is_read_as_an_array_or_as_json_lines_and_one_object_or_a_repair_is_named(tmp_path, monkeypatch):
    array = tmp_path / "array.json"
    # One document with a byte that is not UTF-8, one holding U+FFFD itself (escaped, and as UTF-8), one whose other
    # field has the bad byte: only the first is counted as repaired.
    array.write_bytes(b'[{"text": "3/4 of a pizza"}, {"text": "Caf\xe9 in Latin-1"}, {"text": "\\ufffd and \xef\xbf\xbd"},'
                      b' {"text": "clean", "meta": "\xff"}]')
    assert records_of(array) == [("3/4 of a pizza", None), ("Caf\ufffd in Latin-1", "invalid UTF-8 replaced by U+FFFD"),
                                 ("\ufffd and \ufffd", None), ("clean", None)]
    (tmp_path / "object.json").write_text('{"text": "one object, not a list"}')
    assert records_of(tmp_path / "object.json") == [(None, "a .json file that is not a list of objects")]
    lines = tmp_path / "lines.json"
    lines.write_text('{"text": "a line"}\n{"text": "another line"}\n')
    monkeypatch.setenv("VOCAGNO_MAX_JSON_BYTES", "16")  # over the cap a file read whole may hold: read a line at a time
    assert records_of(lines) == [("a line", None), ("another line", None)]
    (source,) = sources_of([str(array)], "train", TextOf())
    assert [r.problem for r in source.records()] == ["unreadable file (named in the summary)"]
    assert source.error.startswith("UntrustedFile: ") and "refused: a JSON array of more than 16 bytes" in source.error


def test_an_input_that_is_not_there_or_holds_nothing_to_convert_is_refused_in_one_line(tmp_path):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "README.md").write_text("no corpus here")
    for inputs, subset, why in (
            ([notes], None, f"{notes} holds no .jsonl, .json, .parquet, .arrow, .txt files (or .gz/.zst of them)"),
            ([tmp_path / "typo.jsonl"], None, f"input {tmp_path / 'typo.jsonl'} does not exist"),
            ([SAMPLE, tmp_path / "gone.jsonl"], None, f"input {tmp_path / 'gone.jsonl'} does not exist"),
            (["org/dataset", "org/other"], "main", "--subset and --data-files name one Hugging Face dataset: give one "
                                                   "--input")):
        with pytest.raises(Refused) as refused:
            sources_of([str(item) for item in inputs], "train", TextOf(), subset=subset)
        assert str(refused.value) == why


# ------------------------------------------------------------------------------------------ faults and careless input
def converts(out_root, *args, inputs):
    """convert_main's exit code, argparse's exit as its code's text, a refusal as ``"error: MESSAGE"``, for a
    small conversion at seq-len 64."""
    try:
        return convert_main(["--input", *map(str, inputs), *BASE_ARGS[:4], "--seq-len", "64",
                             "--out-root", str(out_root), *args])
    except SystemExit as error:
        return str(error.code)
    except Refused as error:
        return f"error: {error}"


@pytest.mark.slow
def test_a_part_whose_upload_broke_off_is_uploaded_again(tmp_path, monkeypatch):
    """The part finished locally; its last shard reached the remote half-way and part.json never did. The rerun with
    the same --local-root uploads it again instead of trusting the local copy, and the dataset reads whole."""
    from vocagno.data.outroots import Output

    corpus, remote, work = small_corpus(tmp_path / "docs.jsonl"), tmp_path / "remote", tmp_path / "work"
    upload = Output.publish_part

    def breaks_off(self, name):
        if name == "part-00000-000001":
            shard = sorted((self.local / name).glob("shard.*"))[0]
            self.publish(f"{name}/{shard.name}")
            data = (Path(self.remote) / name / shard.name).read_bytes()
            (Path(self.remote) / name / shard.name).write_bytes(data[: len(data) // 2])
            raise ConnectionResetError("the upload broke off")
        upload(self, name)

    monkeypatch.setattr(Output, "publish_part", breaks_off)
    with pytest.raises(ConnectionResetError):
        converts(remote, "--docs-per-part", "15", "--local-root", str(work), inputs=[corpus])
    monkeypatch.setattr(Output, "publish_part", upload)
    assert converts(remote, "--docs-per-part", "15", "--local-root", str(work), inputs=[corpus]) == 0
    whole = read_samples(convert(tmp_path / "whole", "--seq-len", "64", "--docs-per-part", "15", inputs=[corpus]),
                         tmp_path)
    same_samples(read_samples(remote, tmp_path), whole)


@pytest.mark.slow
def test_a_jobs_lookups_on_its_remote_out_root_share_one_client(s3, tmp_path, monkeypatch):
    """Every part's part.json, the jobs' markers and the settings are looked up on the out-root: one S3 client for
    them all (a client per lookup costs more than the small file it fetches), and the dataset is whole."""
    from streaming.base.storage.download import S3Downloader

    env, _ = s3
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    made = []
    create = S3Downloader._create_s3_client
    monkeypatch.setattr(S3Downloader, "_create_s3_client", lambda self, *a, **k: made.append(1) or create(self, *a, **k))
    corpus = small_corpus(tmp_path / "docs.jsonl")
    assert converts("s3://runs/one-client", "--docs-per-part", "10", "--local-root", str(tmp_path / "work"),
                    inputs=[corpus]) == 0
    assert ShardMetadata.read(tmp_path / "work").totals["documents read"] == 40
    assert len(made) == 1, len(made)


def test_the_merge_verifies_every_shard_on_the_out_root(tmp_path):
    corpus, remote = small_corpus(tmp_path / "docs.jsonl"), tmp_path / "remote"
    assert converts(remote, "--local-root", str(tmp_path / "work"), inputs=[corpus]) == 0
    shard = sorted(remote.glob("part-*/shard.*"))[0]
    data = shard.read_bytes()
    shard.write_bytes(data[:-100])  # truncated on the remote
    message = converts(remote, "--local-root", str(tmp_path / "work"), "--merge-only", inputs=[corpus])
    assert f"{shard.parent.name}/{shard.name} has {len(data) - 100:,} bytes, its index says {len(data):,}" in message
    shard.write_bytes(data[:50] + bytes([data[50] ^ 1]) + data[51:])  # one flipped bit
    message = converts(remote, "--local-root", str(tmp_path / "work"), "--merge-only", inputs=[corpus])
    assert f"{shard.parent.name}/{shard.name} does not match its xxh3_64 hash" in message


def test_a_flipped_bit_in_a_shard_is_an_error_naming_it(tmp_path):
    root = tmp_path / "shards"
    assert converts(root, inputs=[small_corpus(tmp_path / "docs.jsonl")]) == 0
    shard = sorted(root.glob("part-*/shard.*.zstd"))[0]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x10
    shard.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=f"Checksum failure: .*{shard.parent.name}/{shard.name}"):
        read_samples(root, tmp_path)


def test_an_input_changed_under_an_existing_root_is_refused_by_name(tmp_path):
    corpus, root = small_corpus(tmp_path / "docs.jsonl"), tmp_path / "shards"
    assert converts(root, inputs=[corpus]) == 0
    with open(corpus, "a", encoding="utf-8") as f:
        f.write(json.dumps({"text": "An appended document."}) + "\n")
    assert f"error: {corpus} changed since part-00000-000000" in converts(root, inputs=[corpus])


def test_a_kept_part_of_other_documents_than_the_part_cut_now_is_refused_by_name(tmp_path, monkeypatch):
    """A part ends at PART_BYTES of documents as well as at --docs-per-part: a part kept on the out-root from a run
    that cut the same input otherwise holds other documents under the same name. The resumed job refuses it in one
    line naming it, instead of keeping it beside parts that repeat its documents or leave some out."""
    corpus, root = small_corpus(tmp_path / "docs.jsonl"), tmp_path / "shards"
    assert converts(root, "--docs-per-part", "20", inputs=[corpus]) == 0
    lines = corpus.read_bytes().splitlines(keepends=True)
    monkeypatch.setattr(parts, "PART_BYTES", sum(map(parts.held_bytes, lines[:10])))
    message = converts(root, "--docs-per-part", "20", inputs=[corpus])
    assert message == (f"error: part-00000-000000 in {root} holds 20 documents, but the same part of the input is now "
                       "10 (its documents are cut into parts otherwise): convert into a new --out-root"), message
    assert ShardMetadata.read(root).totals["documents read"] == 40  # the published dataset stays as it was


def test_a_stale_merge_lock_is_taken_over(tmp_path):
    corpus, root = small_corpus(tmp_path / "docs.jsonl"), tmp_path / "shards"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    root.mkdir()
    import socket

    (root / "merge.lock").write_text(json.dumps({"host": socket.gethostname(), "pid": int(dead.stdout)}))
    assert converts(root, inputs=[corpus]) == 0
    assert (root / "index.json").exists() and not (root / "merge.lock").exists()


def test_writes_are_atomic_on_a_full_disk(tmp_path, monkeypatch):
    from vocagno.doors.writing import write_atomically

    path = tmp_path / "index.json"
    path.write_text('{"version": 2, "shards": []}')

    def disk_full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space left"):
        write_atomically(path, '{"version": 2, "shards": [' + "x" * 10000)
    assert path.read_text() == '{"version": 2, "shards": []}'  # the old file, whole


def test_merge_only_refuses_a_partial_dataset_unless_told(tmp_path):
    files = []
    for i in range(2):
        files.append(small_corpus(tmp_path / f"docs{i}.jsonl"))
    root = tmp_path / "shards"
    assert converts(root, "--num-jobs", "2", "--job-index", "0", inputs=files) == 0
    assert not (root / "index.json").exists()
    message = converts(root, "--num-jobs", "2", "--merge-only", inputs=files)
    assert "job(s) [1] of 2 have not finished" in message and not (root / "index.json").exists()
    assert converts(root, "--num-jobs", "2", "--merge-only", "--allow-partial", inputs=files) == 0
    assert ShardMetadata.read(root).partial == {"jobs_done": [0], "num_jobs": 2}


def test_many_small_files_still_make_samples(tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    docs = [json.loads(line)["text"] for line in open(SAMPLE, encoding="utf-8")][:60]
    for i, doc in enumerate(docs):
        (folder / f"{i:03d}.txt").write_text(doc, encoding="utf-8")
    root = tmp_path / "shards"
    assert convert_main(["--input", str(folder), *BASE_ARGS[:4], "--seq-len", "512",
                         "--out-root", str(root)]) == 0
    meta = ShardMetadata.read(root)
    assert meta.totals["documents converted"] == 60 and meta.totals["samples"] == meta.totals["student tokens"] // 512


@pytest.mark.parametrize("content, reason", [
    ("", "the input holds no documents"),
    ('[{"text": "a"}, {"text": "b"},]', "only 0 of 1 documents converted (--min-converted 0.5); skipped: invalid JSON"),
    ('{"text": "Short."}\n', "make no sample of --seq-len 64"),
])
def test_nothing_converted_is_a_failure_that_says_why(tmp_path, content, reason):
    path = tmp_path / ("in.json" if content.startswith("[") else "in.jsonl")
    path.write_text(content)
    message = converts(tmp_path / "shards", inputs=[path])
    assert reason in message and not (tmp_path / "shards" / "index.json").exists()


def test_a_corpus_with_another_text_field_is_refused_naming_the_flag_and_the_corrected_rerun_runs(tmp_path, capsys):
    docs = [json.loads(line)["text"] for line in open(SAMPLE, encoding="utf-8")][:40]
    corpus = tmp_path / "posts.jsonl"
    corpus.write_text("".join(json.dumps({"content": d, "id": i}) + "\n" for i, d in enumerate(docs)))
    message = converts(tmp_path / "shards", inputs=[corpus])
    assert message == (f"error: nothing published to {tmp_path / 'shards'}: only 0 of 40 documents converted "
                       "(--min-converted 0.5); skipped: missing text field 'text': 40 (the records without it have the fields: content, id: 40); --text-field NAME names the "
                       "field holding the text (--text-template joins several); the same command with corrected "
                       f"options starts afresh there (a corrected input file: delete {tmp_path / 'shards'} first)")
    assert converts(tmp_path / "shards", "--text-field", "content", inputs=[corpus]) == 0
    assert ShardMetadata.read(tmp_path / "shards").totals["documents converted"] == 40
    assert "starting afresh in " in capsys.readouterr().out and not (tmp_path / "shards" / "refused.json").exists()


def test_a_refused_merge_keeps_its_parts_and_a_published_dataset_whole(tmp_path):
    """A merge that publishes nothing deletes nothing: a published dataset stays readable, and the same parts merge
    with a lower --min-converted."""
    docs = [json.loads(line)["text"] for line in open(SAMPLE, encoding="utf-8")][:30]
    corpus = tmp_path / "in.jsonl"
    corpus.write_text("".join(json.dumps({"text": d} if i % 3 else {"body": d}) + "\n" for i, d in enumerate(docs)))
    root = tmp_path / "shards"
    assert converts(root, inputs=[corpus]) == 0  # 20 of 30: over the default 0.5
    published = sorted(p.relative_to(root) for p in root.rglob("*"))
    message = converts(root, "--merge-only", "--min-converted", "0.9", inputs=[corpus])
    assert message.startswith(f"error: nothing merged into {root}: only 20 of 30 documents converted")
    assert message.endswith("its published dataset stays")
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == published
    assert len(read_samples(root, tmp_path)) == ShardMetadata.read(root).totals["samples"]  # still whole
    fresh = tmp_path / "fresh"
    assert converts(fresh, "--min-converted", "0.9", inputs=[corpus]).startswith("error: nothing published")
    assert converts(fresh, "--merge-only", "--min-converted", "0.6", inputs=[corpus]) == 0  # the same parts
    assert ShardMetadata.read(fresh).totals["documents converted"] == 20


@pytest.mark.slow
def test_only_a_single_jobs_refused_conversion_is_started_afresh(tmp_path, capsys):
    """Several jobs' parts, or a refusal recorded for other settings than the out-root holds, stay: the rerun with
    other options is refused, naming what differs, and deletes nothing."""
    docs = [json.loads(line)["text"] for line in open(SAMPLE, encoding="utf-8")][:20]
    corpus = tmp_path / "in.jsonl"
    corpus.write_text("".join(json.dumps({"body": d}) + "\n" for d in docs))
    for name, args in (("jobs", ["--num-jobs", "2", "--job-index", "1"]), ("stale", [])):
        root = tmp_path / name
        converts(root, *args, inputs=[corpus])
        if name == "jobs":
            converts(root, "--num-jobs", "2", "--job-index", "0", inputs=[corpus])  # the last job merges: refused
            assert not (root / "refused.json").exists()
        else:
            (root / "refused.json").write_text(json.dumps({"num_jobs": 1, "settings": {"seq_len": 1}}))
        before = sorted(p.name for p in root.iterdir())
        message = converts(root, "--text-field", "body", inputs=[corpus])
        assert "made with other settings (text_field differ)" in message, message
        assert sorted(p.name for p in root.iterdir()) == before and "starting afresh" not in capsys.readouterr().out


def test_a_parquet_without_the_text_column_counts_each_row_once(tmp_path):
    pq.write_table(pa.Table.from_pylist([{"body": "a"}, {"body": "b"}, {"body": "c"}]), tmp_path / "in.parquet")
    message = converts(tmp_path / "shards", inputs=[tmp_path / "in.parquet"])
    assert "only 0 of 3 documents converted (--min-converted 0.5); skipped: missing text field 'text': 3 (the records without it have the fields: body: 3)" in message


def test_bom_case_compression_and_ignored_files(tmp_path, capsys):
    import gzip

    import zstandard

    folder = tmp_path / "docs"
    folder.mkdir()
    docs = [json.loads(line)["text"] for line in open(SAMPLE, encoding="utf-8")][:30]
    lines = [json.dumps({"text": d}) + "\n" for d in docs]
    (folder / "a.JSONL").write_bytes(b"\xef\xbb\xbf" + "".join(lines[:10]).encode())
    (folder / "b.jsonl.gz").write_bytes(gzip.compress("".join(lines[10:20]).encode()))
    (folder / "c.jsonl").write_bytes(gzip.compress("".join(lines[20:25]).encode()))  # gzip under a plain name
    (folder / "d.Jsonl.ZST").write_bytes(zstandard.ZstdCompressor().compress("".join(lines[25:]).encode()))
    (folder / "notes.csv").write_text("a,b\n")
    root = tmp_path / "shards"
    assert converts(root, inputs=[folder]) == 0
    assert "ignored 1 file(s) that are not .jsonl/.json/.parquet/.arrow/.txt[.gz/.zst]: notes.csv" in capsys.readouterr().out
    meta = ShardMetadata.read(root)
    assert meta.totals["documents read"] == meta.totals["documents converted"] == 30
    assert read_samples(root, tmp_path)[0]["text"].startswith(docs[0][:40])  # no BOM, the first document whole


def test_folders_linked_inside_the_input_are_read_and_links_out_of_it_that_loop_or_point_nowhere_are_named(
        tmp_path, capsys):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    small_corpus(elsewhere / "c.jsonl")
    folder = tmp_path / "docs"
    (folder / "real").mkdir(parents=True)
    small_corpus(folder / "a.jsonl")
    small_corpus(folder / "real" / "b.jsonl")
    (folder / "the-b-folder").symlink_to(folder / "real")  # inside the input: read (once)
    (folder / "real" / "again").symlink_to(folder)  # a loop
    (folder / "linked").symlink_to(elsewhere)  # a folder outside the input: named, not read
    (folder / "gone.jsonl").symlink_to(tmp_path / "deleted.jsonl")
    root = tmp_path / "shards"
    assert converts(root, inputs=[folder]) == 0
    assert (f"{folder}: ignored 4 path(s) that can't be read: gone.jsonl (a link to nothing), linked (a link to a "
            f"folder outside {folder}: give it as an input of its own), real/again (a loop: a link to a folder it is "
            "in), the-b-folder (a link to a folder already read)") in capsys.readouterr().out
    assert ShardMetadata.read(root).totals["documents read"] == 80


def test_one_bad_record_or_file_does_not_abort_the_conversion(tmp_path, capsys):
    folder = tmp_path / "docs"
    folder.mkdir()
    small_corpus(folder / "a.jsonl")
    with open(folder / "a.jsonl", "a") as f:
        f.write("[" * 100000 + "]" * 100000 + "\n")  # a JSON line nested 100,000 deep
    (folder / "b.parquet").write_bytes(b"PAR1" + os.urandom(1000) + b"PAR1")  # corrupt
    root = tmp_path / "shards"
    assert converts(root, inputs=[folder]) == 1  # published, and an error at the end
    out = capsys.readouterr()
    assert f"UNREADABLE: {folder / 'b.parquet'}: " in out.out and "could not read" in out.err
    totals = ShardMetadata.read(root).totals
    assert totals["skipped: JSON nested too deeply"] == 1 and totals["unreadable files"] == 1
    assert totals["documents converted"] == 40


def test_a_foreign_index_or_a_second_run_of_the_same_job_is_refused(tmp_path):
    import socket

    corpus = small_corpus(tmp_path / "docs.jsonl")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "index.json").write_text('{"version": 2, "shards": []}')
    assert "holds a dataset (index.json) that no vocagno conversion made" in converts(foreign, inputs=[corpus])
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "job-0000-of-0001.lock").write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid()}))
    assert "another conversion is running job 0" in converts(busy, inputs=[corpus])


def test_bad_settings_are_refused_before_anything_is_written(tmp_path):
    message = converts(tmp_path / "shards", "--seq-len", "1", inputs=[small_corpus(tmp_path / "docs.jsonl")])
    assert message == "2" and not (tmp_path / "shards").exists()


@pytest.mark.slow
def test_killing_the_converter_leaves_no_worker_behind(tmp_path):
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text(open(SAMPLE, encoding="utf-8").read() * 6, encoding="utf-8")
    process = subprocess.Popen(
        [sys.executable, str(REPO / "conversion" / "convert_dataset.py"), "--input", str(corpus), *BASE_ARGS,
         "--docs-per-part", "50", "--workers", "2", "--out-root", str(tmp_path / "shards")],
        cwd=tmp_path, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def children():
        found = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == process.pid:
                found.append(int(stat.parent.name))
        return found

    deadline = time.time() + 120
    while len(children()) < 2 and time.time() < deadline:
        time.sleep(0.2)
    workers = children()
    assert len(workers) >= 2
    process.send_signal(signal.SIGKILL)
    process.wait()
    deadline = time.time() + 15
    while any(Path(f"/proc/{pid}").exists() for pid in workers) and time.time() < deadline:
        time.sleep(0.2)
    assert not any(Path(f"/proc/{pid}").exists() for pid in workers)


@pytest.mark.parametrize("student, teacher", [("llama2", "qwen2.5"), ("mistral", "deepseek-llm")])
def test_a_long_document_cut_into_pieces_gives_the_tokens_of_the_whole(tokenizers, student, teacher):
    """Cut before a whitespace, a piece that continues a document is encoded without SentencePiece's dummy prefix:
    no spurious "▁" per cut, on either side."""
    from collections import Counter

    from vocagno.conversion.parts import clean
    from vocagno.conversion.records import Record
    from vocagno.conversion.packer import Encoder

    text = "alpha beta gamma\nThe integral ∫x²dx = x³/3 — 中文 😀 and  two  spaces. " * 60
    pieces = clean(Record(text), 97, Counter())
    assert len(pieces) > 30 and "".join(pieces) == text
    encoder = Encoder(tokenizers[student], tokenizers[teacher])
    cut, whole = encoder.encode([pieces]), encoder.encode([[text]])
    for key in ("student_ids", "student_offsets", "teacher_ids", "teacher_offsets"):
        assert np.array_equal(getattr(cut, key), getattr(whole, key)), key


def test_long_documents_are_packed_a_group_at_a_time_into_the_same_samples(tmp_path, monkeypatch):
    long_doc = " ".join(json.loads(line)["text"] for line in open(SAMPLE, encoding="utf-8"))[:60000]
    corpus = small_corpus(tmp_path / "docs.jsonl", [long_doc])
    whole = read_samples(convert(tmp_path / "whole", inputs=[corpus]), tmp_path)
    monkeypatch.setattr(parts, "ENCODE_CHARS", 5000)  # many groups, a document open across them
    cut = read_samples(convert(tmp_path / "cut", "--max-doc-chars", "3000", inputs=[corpus]), tmp_path)
    same_samples(cut, whole)


@pytest.mark.slow
def test_memory_does_not_grow_with_the_length_of_a_document(tmp_path):
    """Peak RSS of the converter (run as docs/conversion.md says) for a one-line 1 MB document and a 7 MB one: long
    documents go through a group of pieces at a time, and freed blocks go back to the system (glibc otherwise keeps
    them: +0.47 GB from 1 to 8 MB before, 1.43 GB at 8 MB; 6.4 GB for 50 MB before pieces and groups)."""
    text = " ".join(json.loads(line)["text"] for line in open(SAMPLE, encoding="utf-8"))
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}

    def peak_gb(megabytes: int) -> float:
        corpus = tmp_path / f"{megabytes}mb.jsonl"
        corpus.write_text(json.dumps({"text": (text * (megabytes * 10**6 // len(text) + 1))[: megabytes * 10**6]}))
        command = [sys.executable, str(REPO / "conversion" / "convert_dataset.py"), "--input", str(corpus),
                   *BASE_ARGS, "--out-root", str(tmp_path / f"{megabytes}mb")]
        measure = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, stdout=-3); "
                   "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")  # KiB: the converter's peak
        result = subprocess.run([sys.executable, "-c", measure, *command], cwd=tmp_path, env=env, capture_output=True,
                                text=True, timeout=300)
        assert result.returncode == 0, result.stderr
        return int(result.stdout) / 2**20

    small, large = peak_gb(1), peak_gb(7)
    assert large - small < 0.25, f"peak RSS {small:.2f} GB for 1 MB, {large:.2f} GB for 7 MB"


def first_rows(n=60):
    with open(SAMPLE, encoding="utf-8") as f:
        return [json.loads(line) for line, _ in zip(f, range(n))]


@pytest.mark.slow
def test_a_dataset_saved_with_save_to_disk_converts_as_its_rows_do(tmp_path):
    import datasets

    rows = first_rows()
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"))
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows[:10]),
                          "test": datasets.Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "saved_dict"))
    want = read_samples(convert(tmp_path / "from_jsonl", inputs=[tmp_path / "rows.jsonl"]), tmp_path)
    for name, extra in (("saved", []), ("saved_dict", ["--split", "test"])):
        got = read_samples(convert(tmp_path / f"from_{name}", *extra, inputs=[tmp_path / name]), tmp_path)
        same_samples(got, want)
        assert ShardMetadata.read(tmp_path / f"from_{name}").totals["documents read"] == 60
    arrow = next((tmp_path / "saved").glob("*.arrow"))  # an .arrow file given alone
    same_samples(read_samples(convert(tmp_path / "from_arrow", inputs=[arrow]), tmp_path), want)
    with pytest.raises(Refused, match=r"has no split 'validation'; --split one of test, train"):
        convert_main(["--input", str(tmp_path / "saved_dict"), "--split", "validation", *BASE_ARGS,
                      "--out-root", str(tmp_path / "nothing")])


@pytest.mark.slow
def test_a_text_template_makes_the_text_of_several_fields_and_counts_records_without_them(tmp_path):
    import datasets

    records = [{"meta": {"title": f"Problem {i}"}, "body": row["text"], "n": i} for i, row in enumerate(first_rows())]
    records[5] = {"meta": {"title": "no body"}, "n": 5}
    (tmp_path / "qa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "qa.parquet")
    datasets.Dataset.from_list(records).save_to_disk(str(tmp_path / "saved"))
    template = "{meta.title} (#{n})\\n\\n{body}"
    texts = {}
    for name in ("qa.jsonl", "qa.parquet", "saved"):
        out = convert(tmp_path / f"out-{name}", "--text-template", template, inputs=[tmp_path / name])
        totals = ShardMetadata.read(out).totals
        assert totals["documents converted"] == 59 and totals["skipped: missing field of the text template 'body'"] == 1
        assert totals["fields of records skipped for lacking one: meta, n"] == 1
        texts[name] = "".join(s["text"] for s in read_samples(out, tmp_path))
    assert texts["qa.jsonl"] == texts["qa.parquet"] == texts["saved"]
    assert f"Problem 3 (#3)\n\n{records[3]['body'][:40]}" in texts["qa.jsonl"]
    # A field no record has: nothing converts, nothing is published, and the summary says why.
    with pytest.raises(Refused, match="nothing published .* only 0 of 60 documents converted .* missing field of "
                                         "the text template 'titel': 60"):
        convert_main(["--input", str(tmp_path / "qa.jsonl"), "--text-template", "{titel}\\n{body}",
                      *BASE_ARGS, "--out-root", str(tmp_path / "typo")])
    assert not (tmp_path / "typo" / "index.json").exists()
    with pytest.raises(Refused, match="names no field"):
        convert_main(["--input", str(tmp_path / "qa.jsonl"), "--text-template", "plain", *BASE_ARGS,
                      "--out-root", str(tmp_path / "none")])


def test_a_hub_dataset_is_read_by_its_configuration_or_its_data_files(tmp_path):
    # A dataset folder with two configurations in its card, which datasets reads as it reads a hub repository.
    rows = first_rows()
    folder = tmp_path / "repo"
    for name, part in (("easy", rows[:20]), ("hard", rows[20:])):
        (folder / name).mkdir(parents=True)
        (folder / name / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part), encoding="utf-8")
    (folder / "README.md").write_text("---\nconfigs:\n- config_name: easy\n  data_files: easy/*.jsonl\n"
                                      "- config_name: hard\n  data_files: hard/*.jsonl\n---\n")
    hard = convert(tmp_path / "hard", "--subset", "hard", inputs=[folder])
    assert ShardMetadata.read(hard).totals["documents read"] == 40
    with pytest.raises(Refused, match=r"no configuration 'medium'; --subset one of: easy, hard"):
        convert_main(["--input", str(folder), "--subset", "medium", *BASE_ARGS, "--out-root",
                      str(tmp_path / "medium")])
    files = convert(tmp_path / "files", "--data-files", str(folder / "easy" / "train.jsonl"), inputs=["json"])
    assert ShardMetadata.read(files).totals["documents read"] == 20


@pytest.fixture(params=["s3", "gs"])
def store(request, monkeypatch):
    """An object store on this machine (conftest's ``s3`` or ``gcs``), reached through the clients a real bucket
    uses (boto3, google-cloud-storage, under Streaming): its scheme and a ``put(key, bytes)`` into its bucket "runs"."""
    env, client = request.getfixturevalue({"s3": "s3", "gs": "gcs"}[request.param])
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    if request.param == "s3":
        return "s3", lambda key, data: client.put_object(Bucket="runs", Key=key, Body=data)
    return "gs", lambda key, data: client.blob(key).upload_from_string(data)


@pytest.mark.slow
def test_inputs_in_an_object_store_convert_as_the_same_files_on_disk_and_a_changed_one_is_refused(store, tmp_path):
    import zstandard

    scheme, put = store
    lines = open(SAMPLE, "rb").read().splitlines(keepends=True)
    local = tmp_path / "corpus"
    local.mkdir()
    (local / "a.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(b"".join(lines[:250])))
    (local / "b.jsonl").write_bytes(b"".join(lines[250:]))
    for path in local.iterdir():
        put(f"corpus/{path.name}", path.read_bytes())
    put("corpus/notes.csv", b"not a document")
    want = read_samples(convert(tmp_path / "from_disk", "--docs-per-part", "100", inputs=[local]), tmp_path)
    # From the store into the store: the shards are read back from there.
    for name, uri in (("folder", f"{scheme}://runs/corpus/"), ("glob", f"{scheme}://runs/corpus/*.jsonl*")):
        out = convert(f"{scheme}://runs/shards-{name}", "--docs-per-part", "100", "--local-root", str(tmp_path / name),
                      inputs=[uri])
        same_samples(read_samples(out, tmp_path), want)
        assert ShardMetadata.read(tmp_path / name).totals["documents read"] == 500
    # The objects' content is their fingerprint: a rerun after one changed names it and stops.
    put("corpus/b.jsonl", b"".join(lines[250:400]))
    with pytest.raises(Refused, match=f"{scheme}://runs/corpus/b.jsonl"):
        convert(f"{scheme}://runs/shards-folder", "--docs-per-part", "100", "--local-root", str(tmp_path / "folder"),
                inputs=[f"{scheme}://runs/corpus/"])
    with pytest.raises(Refused, match=f"input {scheme}://no-such-bucket/corpus/: the object store can't be read"):
        convert(tmp_path / "none", inputs=[f"{scheme}://no-such-bucket/corpus/"])
    with pytest.raises(Refused, match=rf"input {scheme}://runs/corpus/\*.txt: no .jsonl"):
        convert(tmp_path / "none", inputs=[f"{scheme}://runs/corpus/*.txt"])
    assert not list((tmp_path / "none").rglob("*.json"))  # inputs that can't be read leave nothing on the out-root


@pytest.mark.slow
def test_an_object_store_input_at_a_buckets_root_a_glob_within_one_folder_and_a_key_that_is_no_file_name(
        s3, tmp_path, monkeypatch):
    env, client = s3
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    client.create_bucket(Bucket="whole")
    lines = open(SAMPLE, "rb").read().splitlines(keepends=True)
    client.put_object(Bucket="whole", Key="a.jsonl", Body=b"".join(lines[:40]))
    client.put_object(Bucket="whole", Key="deeper/b.jsonl", Body=b"".join(lines[40:80]))
    for name, uri, documents in (("root", "s3://whole", 80), ("root-slash", "s3://whole/", 80),
                                 ("top-glob", "s3://whole/*.jsonl", 40), ("deeper-glob", "s3://whole/*/*.jsonl", 40)):
        convert(tmp_path / name, inputs=[uri])  # a glob's * takes no '/', as a shell's does
        assert ShardMetadata.read(tmp_path / name).totals["documents read"] == documents, uri
    # An object named like a folder (its key ends in '/') is no file to download: refused by name, nothing written.
    client.put_object(Bucket="whole", Key="deeper/c.jsonl/", Body=b"".join(lines[:40]))
    with pytest.raises(Refused, match=r"^s3://whole/deeper/c.jsonl/: refused: its object key's last part ''"):
        convert(tmp_path / "refused", inputs=["s3://whole/deeper/"])
    assert not list((tmp_path / "refused").rglob("*.json"))


def _take_over(path, barrier, results, done):
    """In a process of its own: acquire the stale lock at ``path``, the judging of its owner held at ``barrier`` until
    the other taker judged too (where nothing stops it from judging at once)."""
    import threading

    from vocagno.data.outroots import OwnedLock

    lock = OwnedLock(path, "test")
    judge = lock._stale

    def both_judge(held):
        try:
            barrier.wait(timeout=3)
        except threading.BrokenBarrierError:  # the other one waits for its turn: it judges after this one took over
            pass
        return judge(held)

    lock._stale = both_judge
    results.put(lock.acquire())
    done.wait(60)  # alive, as a lock's owner, until the other one has tried


def test_two_processes_finding_the_same_dead_owner_do_not_both_take_its_lock(tmp_path):
    import multiprocessing
    import socket

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / "job.lock").write_text(json.dumps({"host": socket.gethostname(), "pid": int(dead.stdout),
                                                   "since": 0}))
    context = multiprocessing.get_context("fork")
    barrier, results, done = context.Barrier(2), context.Queue(), context.Event()
    takers = [context.Process(target=_take_over, args=(tmp_path / "job.lock", barrier, results, done))
              for _ in range(2)]
    for taker in takers:
        taker.start()
    taken = sorted(results.get(timeout=60) for _ in takers)
    done.set()
    for taker in takers:
        taker.join(60)
    assert taken == [False, True]


def test_the_progress_bar_counts_the_inputs_bytes_as_they_are_read(tmp_path, monkeypatch):
    """The converter's bar has the input files' bytes as its total and moves as each part is read: through a large
    .jsonl file a line at a time (gzipped too, by its compressed bytes), other formats when done."""
    import gzip

    bars = []

    class Bar:
        def __init__(self, total=None, unit="it", **options):
            self.total, self.unit, self.n, self.seen, self.postfix = total, unit, 0, [], None
            bars.append(self)

        def update(self, n):
            self.n += n
            self.seen.append(self.n)

        def set_postfix_str(self, text):
            self.postfix = text

        def close(self):
            pass

    monkeypatch.setattr("vocagno.conversion.convert.tqdm", Bar)
    lines = open(SAMPLE, "rb").read()
    # Stored, not deflated: a compressed file of several of gzip's read buffers (128 KiB since Python 3.12), so that
    # parts are made while it is being read.
    (tmp_path / "big.jsonl.gz").write_bytes(gzip.compress(lines, compresslevel=0))
    pq.write_table(pa.table({"text": ["a parquet row about 3/4 of a pizza"] * 5}), tmp_path / "rows.parquet")
    inputs = [SAMPLE, tmp_path / "big.jsonl.gz", tmp_path / "rows.parquet"]
    convert(tmp_path / "out", "--docs-per-part", "50", inputs=inputs)
    (bar,) = bars
    assert bar.unit == "B" and bar.total == sum(os.path.getsize(p) for p in inputs) == bar.n
    sample = os.path.getsize(SAMPLE)
    inside = [n for n in bar.seen if 0 < n < sample]  # parts made while the first file was being read
    assert len(set(inside)) >= 3, bar.seen
    assert any(sample < n < sample + os.path.getsize(tmp_path / "big.jsonl.gz") for n in bar.seen), bar.seen
    assert bar.postfix.startswith(f"{ShardMetadata.read(tmp_path / 'out').totals['documents read']:,} docs, ")
    # A part that fills at a file's end is made before the file is read to its end: the bar still ends at its total.
    rows = [json.loads(line)["text"] for line in open(SAMPLE, encoding="utf-8")][:40]
    pq.write_table(pa.table({"text": rows}), tmp_path / "forty.parquet")
    convert(tmp_path / "even", "--docs-per-part", "20", inputs=[tmp_path / "forty.parquet"])
    assert bars[-1].n == bars[-1].total == os.path.getsize(tmp_path / "forty.parquet"), bars[-1].seen


def test_records_each_with_other_fields_keep_the_refusal_short_and_every_record_counted(tmp_path):
    """A corpus whose records each have fields of their own (anyone's corpus): the refusal names the most frequent
    sets of fields, at most FIELD_SETS of them, and counts the rest together; a field below a string names the fields
    of the record holding it."""
    records = [{f"k{i}_{j}_" + "x" * 40: j for j in range(9)} for i in range(40)] + [{"name": i, "body": "b"}
                                                                                    for i in range(10)]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    message = converts(tmp_path / "shards", "--docs-per-part", "1", inputs=[tmp_path / "in.jsonl"])
    assert message.startswith("error: nothing published") and len(message) < 2_000, len(message)
    assert "name, body: 10; " in message and "(other sets): 37" in message, message
    assert TextOf("{meta.title}").__class__ and TextOf("meta").missing("meta.title", {"meta": "s", "id": 3}).fields == (
        "meta, id")
    assert TextOf(template="{meta.title}")({"meta": "a string", "id": 3}).fields == "meta, id"
