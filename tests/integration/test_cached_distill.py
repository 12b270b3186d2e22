"""Cached cross-vocabulary distillation: the scoring pass stores the teacher's truncated distributions beside its
losses (python -m vocagno.score --top-k), and ULD and cross-vocabulary KD train from them with no teacher loaded.
GSM8K text in llama2 / mistral shards, the shipped tiny-math-teacher."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from composer import Trainer
from composer.models import HuggingFaceModel
from helpers import Capture, first_documents
from torch.utils.data import DataLoader
from transformers import LlamaConfig, LlamaForCausalLM

from vocagno import score
from vocagno.algorithms.baselines import ULD, CrossVocabKD
from vocagno.conversion.convert import main as convert_main
from vocagno.core.distill import cached_uld_loss, projected_kd_loss, teacher_top_k, uld_loss
from vocagno.core.tokenization import resolve_shipped
from vocagno.data.batch import (ALIGN_END, ALIGN_START, TEACHER_ATTENTION_MASK, TEACHER_INPUT_IDS, TOPK_IDS,
    TOPK_PROBS, TOPK_REST)
from vocagno.data.dataset import TeacherGuidedCollator, TeacherGuidedDataset
from vocagno.data.shards import ShardMetadata
from vocagno.doors.untrusted import UntrustedFile, check_distribution
from vocagno.teacher.model import TeacherScorer, load_teacher
from vocagno.teacher.projection import vocabulary_map
from vocagno.teacher.teacher import Teacher

REPO = Path(__file__).resolve().parents[2]
VOCAB = 32000  # the tiny teacher's logits (Mistral's vocabulary)


def scoring(shards, out, *flags):
    assert score.main(["--shards", str(shards), "--teacher", *flags, "--dtype", "float32", "--device", "cpu",
                       "--batch-tokens", "1024", "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """12 documents in 3 parts, scored by a copy of the tiny teacher with its top 8 in float16 (and losses only);
    2 documents with its whole distribution in float32. The copy's weights are then removed: cached runs load none."""
    root = tmp_path_factory.mktemp("cached_distill")
    for name, count, parts in (("shards", 12, 4), ("small", 2, 2)):
        assert convert_main(["--input", str(first_documents(root, count)), "--student-tokenizer", "llama2",
                             "--teacher-tokenizer", "mistral", "--seq-len", "64", "--docs-per-part", str(parts),
                             "--out-root", str(root / name)]) == 0
    shutil.copytree(resolve_shipped("tiny-math-teacher"), root / "teacher")
    teacher = str(root / "teacher")
    scoring(root / "shards", root / "top8", teacher, "--top-k", "8")
    scoring(root / "shards", root / "losses", teacher)
    scoring(root / "small", root / "whole", teacher, "--top-k", str(VOCAB), "--top-k-dtype", "float32")
    (root / "teacher" / "model.safetensors").unlink()
    return root


@pytest.fixture(scope="module")
def live():
    return load_teacher("tiny-math-teacher", "float32")


def samples(folder) -> list[dict]:
    dataset = TeacherGuidedDataset(local=str(folder), batch_size=1)
    return [dataset[i] for i in range(len(dataset))]


def first_batch(folder, tokenizers, size=8) -> dict:
    collate = TeacherGuidedCollator(tokenizers["llama2"].eos_token_id, tokenizers["mistral"].eos_token_id)
    return collate(samples(folder)[:size])


def student():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=32000, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128))


def fit(shards, tokenizers, algorithm):
    """One batch of 8 through Composer's Trainer; the loss dict and the student's logits of that batch."""
    dataset = TeacherGuidedDataset(local=str(shards), batch_size=8)
    loader = DataLoader(dataset, batch_size=8, collate_fn=TeacherGuidedCollator(tokenizers["llama2"].eos_token_id,
                                                                               tokenizers["mistral"].eos_token_id))
    model, capture, logits = student(), Capture(), []
    model.register_forward_hook(lambda module, args, output: logits.append(output.logits.detach().clone()))
    Trainer(model=HuggingFaceModel(model, tokenizer=tokenizers["llama2"], use_logits=True), train_dataloader=loader,
            max_duration="1ba", callbacks=[capture], algorithms=[algorithm], device="cpu", loggers=[],
            optimizers=torch.optim.SGD(model.parameters(), lr=0.0), progress_bar=False).fit()
    return capture.losses[0], logits[0], capture.batches[0]


def labels_of(batch):
    return batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)


def test_the_scoring_pass_stores_each_positions_top_k_beside_the_losses(root, live):
    """Each teacher position's top k as the teacher gives it on the row alone (ids, probabilities rounded to float16,
    the rest), the losses those of a pass without distributions; vocagno.json records the teacher and k."""
    meta = ShardMetadata.read(root / "top8")
    assert meta.scored_by["distribution"] == {"top_k": 8, "logits": VOCAB, "dtype": "float16"}
    assert meta.scored_by["name"] == str(root / "teacher")
    index = json.loads((root / "top8" / "index.json").read_text())
    assert len(index["shards"]) == 3 and {TOPK_IDS, TOPK_PROBS, TOPK_REST} <= set(index["shards"][0]["column_names"])
    scorer = TeacherScorer(live)
    with_distributions, losses_only = samples(root / "top8"), samples(root / "losses")
    for sample, other in zip(with_distributions, losses_only):
        torch.testing.assert_close(sample["teacher_loss"], other["teacher_loss"], equal_nan=True, rtol=0, atol=0)
    for sample in with_distributions[::7]:
        ids = sample["teacher_ids"][None]
        _, top_ids, probs, rest = scorer(ids, torch.ones_like(ids), 8)
        assert sample[TOPK_IDS].shape == (ids.shape[1], 8) and sample[TOPK_REST].shape == (ids.shape[1],)
        assert torch.equal(sample[TOPK_IDS], top_ids[0])
        torch.testing.assert_close(sample[TOPK_PROBS], probs[0].half().float(), rtol=2e-3, atol=1e-6)
        torch.testing.assert_close(sample[TOPK_REST], rest[0].half().float(), rtol=2e-3, atol=1e-6)
        torch.testing.assert_close(sample[TOPK_PROBS].sum(-1) + sample[TOPK_REST], torch.ones(ids.shape[1]),
                                   rtol=0, atol=2e-3)


def test_ranks_score_distributions_as_one_rank_and_another_k_cannot_resume(root, tmp_path, monkeypatch):
    flags = [str(resolve_shipped("tiny-math-teacher")), "--top-k", "8"]
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank in (1, 0):
        monkeypatch.setenv("RANK", str(rank))
        scoring(root / "shards", tmp_path / "ranks", *flags)
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    for one, other in zip(samples(tmp_path / "ranks"), samples(root / "top8")):
        for key in (TOPK_IDS, TOPK_PROBS, TOPK_REST):
            assert torch.equal(one[key], other[key])
    with pytest.raises(ValueError, match=r"other settings \(distribution differ\)"):
        scoring(root / "shards", tmp_path / "ranks", str(resolve_shipped("tiny-math-teacher")), "--top-k", "16")


def test_cached_uld_with_the_whole_vocabulary_is_live_uld_loading_no_teacher(root, tokenizers, live):
    """k = the teacher's vocabulary (float32): the live teacher's ULD, paired through the alignment (the run) and by
    position; with the teacher's weights gone (the cached run loads none)."""
    teacher = Teacher(str(root / "teacher"), tokenizer="mistral")
    cached, logits, batch = fit(root / "whole", tokenizers, ULD(teacher, teacher_losses="cached", top_k=VOCAB,
                                                                pairing="alignment"))
    assert not (root / "teacher" / "model.safetensors").exists()
    labels, mask = labels_of(batch), batch[TEACHER_ATTENTION_MASK]
    with torch.no_grad():
        hidden = live.base_model(input_ids=batch[TEACHER_INPUT_IDS], attention_mask=mask).last_hidden_state
    start, end = batch[ALIGN_START][:, 1:], batch[ALIGN_END][:, 1:]
    aligned = torch.where(end > start, start - 1, -1)
    reference = uld_loss(logits, labels, hidden, live.get_output_embeddings(), mask, aligned_teacher_positions=aligned)
    for key in ("total", "ce", "uld"):
        torch.testing.assert_close(cached[key], reference[key], rtol=1e-5, atol=1e-5)
    assert float(cached["uld_bound"]) < 1e-5
    by_position = cached_uld_loss(logits, labels, batch[TOPK_PROBS], batch[TOPK_REST], mask)
    live_by_position = uld_loss(logits, labels, hidden, live.get_output_embeddings(), mask)
    torch.testing.assert_close(by_position["uld"], live_by_position["uld"], rtol=1e-5, atol=1e-5)


def test_cached_uld_from_the_top_8_lies_within_its_bound_of_live_uld(root, tokenizers, live):
    """k = 8 in float16: live ULD within the reported truncation bound plus float16's rounding (2^-11)."""
    batch = first_batch(root / "top8", tokenizers)
    labels, mask = labels_of(batch), batch[TEACHER_ATTENTION_MASK]
    logits = student()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.detach()
    with torch.no_grad():
        hidden = live.base_model(input_ids=batch[TEACHER_INPUT_IDS], attention_mask=mask).last_hidden_state
    cached = cached_uld_loss(logits, labels, batch[TOPK_PROBS], batch[TOPK_REST], mask)
    reference = uld_loss(logits, labels, hidden, live.get_output_embeddings(), mask)
    gap = abs(float(cached["uld"] - reference["uld"]))
    assert 0.01 < gap <= float(cached["uld_bound"]) + 2**-11, (gap, float(cached["uld_bound"]))


def reference_kd(batch, logits, teacher_probs, tokenizers, kd_ratio=0.5):
    """Cross-vocabulary KD written from its rule, position by position: the student positions whose next token starts
    (by the samples' character offsets) where a teacher token starts; teacher token t's probability to the student
    token of the same text (SentencePiece pieces, '▁' a space, a byte piece its byte, a piece over a byte piece), the
    rest to the student tokens given nothing."""
    def texts(tokenizer):
        out = {}
        for piece, i in tokenizer.get_vocab().items():
            if i in tokenizer.all_special_ids:
                continue
            byte = len(piece) == 6 and piece.startswith("<0x")
            out[i] = (bytes([int(piece[3:5], 16)]) if byte else piece.replace("▁", " ").encode(), byte)
        return out

    by_text = {}
    for i, (text, byte) in sorted(texts(tokenizers["llama2"]).items(), key=lambda item: (not item[1][1], -item[0])):
        by_text[text] = i
    teacher_to_student = torch.full((32000,), -1)
    for t, (text, _) in texts(tokenizers["mistral"]).items():
        teacher_to_student[t] = by_text.get(text, -1)
    mapped_ids = teacher_to_student >= 0
    soft, covered, labeled, mapped = 0.0, 0, 0, 0.0
    for b, sample in enumerate(batch["samples"]):
        s_off, t_off = sample["student_offsets"].tolist(), sample["teacher_offsets"].tolist()
        first = {}  # each character's first teacher token of some text starting there
        for j, (begin, finish) in enumerate(t_off):
            if finish > begin:
                first.setdefault(begin, j)
        for i in range(len(s_off) - 1):
            labeled += 1
            begin, finish = s_off[i + 1]
            if finish == begin or first.get(begin, 0) == 0:
                continue
            covered += 1
            teacher = teacher_probs[b][first[begin] - 1].double()
            target = torch.zeros(32000, dtype=torch.float64).index_add(
                0, teacher_to_student[mapped_ids], teacher[mapped_ids])
            given = target > 0
            log_student = F.log_softmax(logits[b, i].double(), -1)
            bucket = torch.logsumexp(logits[b, i].double()[~given], -1) - torch.logsumexp(logits[b, i].double(), -1)
            soft -= float((target[given] * log_student[given]).sum()) + (1 - float(target.sum())) * float(bucket)
            mapped += float(target.sum())
    ce = F.cross_entropy(logits[:, :-1].reshape(-1, 32000), labels_of(batch)[:, 1:].reshape(-1))
    return {"soft_ce": soft / covered, "coverage": covered / labeled, "mapped_mass": mapped / covered,
            "total": (1 - kd_ratio) * float(ce) + kd_ratio * soft / covered}


@pytest.mark.parametrize("k", [8, VOCAB])
def test_cached_cross_vocab_kd_is_its_rule_on_the_live_teachers_distribution(root, tokenizers, live, k):
    """The run's cached KD (teacher weights gone) against the rule applied to the live teacher's full distribution,
    truncated to its top 8 in float16 as the cache stores it, or whole."""
    folder = root / ("top8" if k == 8 else "whole")
    teacher = Teacher(str(root / "teacher"), tokenizer="mistral")
    cached, logits, batch = fit(folder, tokenizers, CrossVocabKD(teacher, teacher_losses="cached", top_k=k))
    batch["samples"] = samples(folder)[:8]
    probs = []
    with torch.no_grad():
        for sample in batch["samples"]:
            full = F.softmax(live(input_ids=sample["teacher_ids"][None]).logits[0].float(), -1)
            top = full.topk(k, -1)  # the rule truncates to the cache's k (all of them: the whole distribution)
            kept = top.values.half().float() if k == 8 else top.values
            probs.append(torch.zeros_like(full).scatter(-1, top.indices, kept))
    reference = reference_kd(batch, logits, probs, tokenizers)
    for key, value in reference.items():
        assert float(cached[key]) == pytest.approx(value, rel=2e-4, abs=2e-5), key
    assert 0.9 < reference["coverage"] < 1 and 0 < reference["mapped_mass"] < 1


def test_a_cached_run_is_refused_without_this_teachers_distribution_or_of_another_k(root, tokenizers):
    teacher = Teacher(str(root / "teacher"), tokenizer="mistral")
    for folder, algorithm, message in (
            ("shards", ULD(teacher, teacher_losses="cached"),
             f"teacher_losses: cached, but the training shards ({root / 'shards'}) carry no teacher distributions: "
             f"score them with --top-k (python -m vocagno.score --shards {root / 'shards'} --teacher TEACHER --top-k "
             "K --out SCORED) and train on SCORED"),
            ("losses", CrossVocabKD(teacher, teacher_losses="cached", top_k=8),
             f"teacher_losses: cached, but the training shards ({root / 'losses'}) carry the losses of "
             f"{str(root / 'teacher')!r} but no distributions: score them with --top-k (python -m vocagno.score --shards "
             f"{root / 'losses'} --teacher TEACHER --top-k 8 --out SCORED) and train on SCORED"),
            ("top8", ULD(teacher, teacher_losses="cached", top_k=32),
             f"teacher_losses: cached with top_k 32, but the training shards ({root / 'top8'}) hold the top 8 of "
             f"32,000 in float16: score them with --top-k 32 (python -m vocagno.score --shards {root / 'top8'} "
             "--teacher TEACHER --top-k 32 --out SCORED), or set algorithms.uld.top_k: 8"),
            ("top8", CrossVocabKD(Teacher("tiny-math-teacher", tokenizer="mistral"), teacher_losses="cached"),
             f"the shards' distributions were scored by '{root / 'teacher'}', but the teacher is 'tiny-math-teacher': "
             "score them with this teacher, name the one that scored them, or set the teacher's check_scored_by: "
             "false when its name is only a label")):
        with pytest.raises(ValueError) as refused:
            fit(root / folder, tokenizers, algorithm)
        assert str(refused.value) == message
    with pytest.raises(ValueError, match="teacher_temperature 2.0 with teacher_losses: cached"):
        ULD(teacher, teacher_losses="cached", teacher_temperature=2.0)
    # Online ULD compares the whole distributions: a top_k there would be dropped without a word.
    with pytest.raises(ValueError, match="top_k 32 with teacher_losses: online: online ULD compares the teacher's "
                                         "whole distribution"):
        ULD(teacher, top_k=32)


def test_distribution_columns_are_checked_before_training_reads_them(root, tmp_path, tokenizers):
    """A vocagno.json whose k or logits lie about the columns, and columns of another shape, dtype or values, are
    refused in one line naming the column and what to do."""
    for lie, message in (({"top_k": 9}, r"teacher_topk_ids is uint16 \(\d+, 8\), not uint16 or uint32 \(\d+, 9\)"),
                         ({"logits": 100}, r"teacher_topk_ids holds id \d+, past the teacher's 100 logits"),
                         ({"dtype": "float32"}, r"teacher_topk_probs is float16 \(\d+, 8\), not float32 \(\d+, 8\)")):
        folder = tmp_path / str(len(list(tmp_path.iterdir())))
        shutil.copytree(root / "top8", folder)
        meta = json.loads((folder / "vocagno.json").read_text())
        meta["scored_by"]["distribution"].update(lie)
        (folder / "vocagno.json").write_text(json.dumps(meta))
        with pytest.raises(UntrustedFile, match=message + r": not what python -m vocagno.score --top-k"):
            samples(folder)
    meta["scored_by"]["distribution"] = {"top_k": 0, "logits": 100, "dtype": "float16"}
    (folder / "vocagno.json").write_text(json.dumps(meta))
    with pytest.raises(UntrustedFile, match="distribution .* is not a top_k of 1 to its logits"):
        ShardMetadata.read(folder)
    # k and the logits size every batch's columns (batch x positions x k): logits far past the teacher tokenizer's
    # vocabulary would let a shard of one-token samples make a batch of gigabytes.
    vocab = meta["teacher"]["vocab_size"]
    meta["scored_by"]["distribution"] = {"top_k": 8, "logits": 2 * vocab + 1, "dtype": "float16"}
    (folder / "vocagno.json").write_text(json.dumps(meta))
    with pytest.raises(UntrustedFile, match=f"its scored_by's distribution has {2 * vocab + 1:,} logits, more than "
                                            f"twice its teacher tokenizer's {vocab:,} tokens"):
        ShardMetadata.read(folder)
    # Nor can the vocabulary grow with them: its size is part of what the run's tokenizer is checked against.
    meta["teacher"]["vocab_size"] = 4 * vocab
    meta["scored_by"]["distribution"]["logits"] = 4 * vocab
    (folder / "vocagno.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=f"the shards' teacher tokenizer is .*{4 * vocab} tokens.*, but this run's"):
        TeacherGuidedDataset(local=str(folder), batch_size=1, student_tokenizer=tokenizers["llama2"],
                             teacher_tokenizer=tokenizers["mistral"])
    ids, probs, rest = np.tile(np.array([4, 7], np.uint16), (3, 1)), np.full((3, 2), 0.25, np.float16), \
        np.full(3, 0.5, np.float16)
    check_distribution(ids, probs, rest, 3, 2, 10, "float16", "s")
    unsorted = np.array([[0.25, 0.5]] * 3, np.float16)
    for bad, message in (((ids, unsorted, rest), "teacher_topk_probs is not sorted"),
                         ((ids, probs, rest * np.nan), "teacher_topk_rest holds values outside"),
                         ((ids.astype(np.int64), probs, rest), "is int64"),
                         ((ids, probs, None), "teacher_topk_rest is missing")):
        with pytest.raises(UntrustedFile, match=message):
            check_distribution(*bad, 3, 2, 10, "float16", "s")


def test_the_vocabulary_map_matches_tokens_by_their_text_across_tokenizer_families(tokenizers):
    """Mistral -> Llama-2 (both SentencePiece), Qwen2.5's byte-level BPE -> Llama-2: the same text, whatever marks
    its space; specials go nowhere; a space goes to the piece the tokenizer writes, not its byte piece."""
    llama, mistral, qwen = tokenizers["llama2"], tokenizers["mistral"], tokenizers["qwen2.5"]
    to_llama = vocabulary_map(mistral, llama)
    assert to_llama.matched == 24210
    for piece, expected in (("▁the", "▁the"), ("▁", "▁"), ("<0x20>", "▁"), ("<0xE2>", "<0xE2>")):
        assert llama.convert_ids_to_tokens(int(to_llama.student_ids[mistral.convert_tokens_to_ids(piece)])) == expected
    assert int(to_llama.student_ids[mistral.eos_token_id]) == int(to_llama.student_ids[mistral.bos_token_id]) == -1
    from_qwen = vocabulary_map(qwen, llama)
    assert llama.convert_ids_to_tokens(int(from_qwen.student_ids[qwen.convert_tokens_to_ids("Ġthe")])) == "▁the"
    assert int(from_qwen.student_ids[qwen.convert_tokens_to_ids("<|endoftext|>")]) == -1


def test_teacher_top_k_keeps_the_most_probable_and_the_rest():
    hidden = torch.randn(2, 5, 11)
    mask = torch.ones(2, 5, dtype=torch.long)
    mask[1, 3:] = 0
    ids, probs, rest = teacher_top_k(hidden, torch.nn.Identity(), mask, 3, chunk_size=4)
    full = F.softmax(hidden, -1)
    assert torch.equal(ids[0], full[0].topk(3).indices) and (probs[1, 3:] == 0).all() and (rest[1, 3:] == 0).all()
    torch.testing.assert_close(rest[0], 1 - full[0].topk(3).values.sum(-1))
    nowhere = projected_kd_loss(torch.randn(1, 2, 4), torch.tensor([[1, 2]]), ids[:1], probs[:1], rest[:1],
                                torch.tensor([[-1]]), torch.full((11,), -1), kd_ratio=1.0)
    assert nowhere["coverage"] == 0 and nowhere["total"] == 0


def test_the_layouts_bytes_and_who_stores_distributions(root):
    """k ids and k probabilities a teacher token, and the rest: 2-byte ids up to 65,536 logits (a 32K vocabulary),
    4-byte past them (Qwen2.5's 152,064); on disk, the top 8's columns take their layout and a little MDS header per
    sample. A further teacher of a set scores its own tokens, and stores no distribution."""
    from vocagno.data.shards import Distribution
    from vocagno.errors import Refused
    from vocagno.teacher.scoring import _distribution

    assert [Distribution(k, 32000).bytes_per_token() for k in (8, 32, 128)] == [34, 130, 514]
    assert [Distribution(k, 152064).bytes_per_token() for k in (8, 32, 128)] == [50, 194, 770]
    assert Distribution(8, 32000, "float32").bytes_per_token() == 52
    raw = [sum(shard["raw_data"]["bytes"] for shard in json.loads((root / name / "index.json").read_text())["shards"])
           for name in ("top8", "losses")]
    tokens = ShardMetadata.read(root / "top8").totals["teacher tokens"]
    assert 34 <= (raw[0] - raw[1]) / tokens <= 35
    with pytest.raises(Refused, match="--top-k: distributions are stored by the pass of the teacher whose tokens"):
        _distribution(Teacher("tiny-math-teacher", name="math"), 8, "float16", "math")


def test_with_a_yaml_the_pass_takes_k_from_its_cached_distillation(root, tmp_path):
    """--config: the k of the yaml's algorithms.uld (or cross_kd) top_k when the command line gives none; two that
    differ are refused."""
    from vocagno.errors import Refused
    from vocagno.training.config import load_config

    yaml = str(REPO / "yamls" / "tiny.yaml")
    assert score.main(["--shards", str(root / "small"), "--config", yaml, "algorithms.uld.top_k=4",
                       "algorithms.uld.teacher_losses=cached", "--device", "cpu", "--out", str(tmp_path / "s")]) == 0
    assert ShardMetadata.read(tmp_path / "s").scored_by["distribution"] == {"top_k": 4, "logits": VOCAB,
                                                                           "dtype": "float16"}
    with pytest.raises(Refused, match="distributions of different top_k"):
        score.yaml_top_k(load_config(yaml, ["algorithms.uld.top_k=4", "algorithms.cross_kd.top_k=8"]))


def test_online_cross_kd_truncates_the_live_teacher_as_the_cache_does_on_shards_without_one(root, tokenizers):
    """Online, on shards that carry no distributions, the live teacher's top 8: the cached run's loss, but for the
    cache's float16 rounding."""
    live_teacher = Teacher("tiny-math-teacher", tokenizer="mistral", dtype="float32")
    online, _, _ = fit(root / "losses", tokenizers, CrossVocabKD(live_teacher, top_k=8))
    cached, _, _ = fit(root / "top8", tokenizers,
                       CrossVocabKD(Teacher(str(root / "teacher"), tokenizer="mistral"), teacher_losses="cached"))
    for key in ("total", "soft_ce", "coverage", "mapped_mass"):
        torch.testing.assert_close(online[key], cached[key], rtol=1e-3, atol=1e-4)
