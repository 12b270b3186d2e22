"""Score once, train many: shards scored by python -m vocagno.score train as the online teacher does, loading none."""

import pytest
import torch
from composer import Trainer
from composer.models import HuggingFaceModel
from streaming.base.util import clean_stale_shared_memory
from torch.utils.data import DataLoader
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from conversion import convert_dataset
from tests.test_algorithm import Capture, tiny
from vocagno import score
from vocagno.algorithm import TeacherScorer, VocAgnoLM
from vocagno.data import TeacherGuidedCollator, TeacherGuidedDataset
from vocagno.shards import ShardMetadata
from vocagno.tokenization import ASSETS


@pytest.fixture(scope="module")
def scored(tmp_path_factory, tokenizers):
    root = tmp_path_factory.mktemp("score")
    convert_dataset.main(["--input", str(ASSETS / "text" / "gsm8k_heldout_100.jsonl"), "--student-tokenizer", "llama2",
                          "--teacher-tokenizer", "qwen2.5", "--seq-len", "64", "--out-root", str(root / "shards")])
    tiny(Qwen2Config, Qwen2ForCausalLM, 152064).save_pretrained(root / "teacher")
    tokenizers["qwen2.5"].save_pretrained(root / "teacher")
    assert score.main(["--shards", str(root / "shards"), "--teacher", str(root / "teacher"), "--out",
                       str(root / "scored"), "--dtype", "float32", "--batch-size", "5", "--device", "cpu"]) == 0
    return root


def fit(shards, tokenizers, teacher, lr=0.5, **options):
    clean_stale_shared_memory()
    dataset = TeacherGuidedDataset(local=str(shards), batch_size=8)
    loader = DataLoader(dataset, batch_size=8, collate_fn=TeacherGuidedCollator(tokenizers["llama2"].eos_token_id,
                                                                               tokenizers["qwen2.5"].pad_token_id))
    student, capture = tiny(LlamaConfig, LlamaForCausalLM, 32000), Capture()
    algorithm = VocAgnoLM(teacher=teacher, teacher_dtype="float32", **options)
    Trainer(model=HuggingFaceModel(student, use_logits=True), train_dataloader=loader, max_duration="2ba",
            device_train_microbatch_size=4, callbacks=[capture], algorithms=[algorithm],
            optimizers=torch.optim.SGD(student.parameters(), lr=lr), device="cpu", loggers=[],
            progress_bar=False).fit()
    return algorithm, capture


def test_cached_losses_give_the_online_teachers_training_without_a_teacher(scored, tokenizers, monkeypatch):
    """Batch for batch, the same selection and loss as the online teacher whose losses are rounded to float16 as the
    shards store them (without the rounding, the tiny random models' scores, crowded around the top-k threshold,
    would trade a few tokens across it)."""
    meta = ShardMetadata.read(scored / "scored")
    assert meta.scored_by["name"] == str(scored / "teacher") and meta.scored_by["dtype"] == "float32"
    assert meta.scored_by["fingerprint"] == score.weights_fingerprint(tiny(Qwen2Config, Qwen2ForCausalLM, 152064))
    teacher = str(scored / "teacher")
    cached_algorithm, cached = fit(scored / "scored", tokenizers, teacher, teacher_losses="cached")
    assert cached_algorithm.scorer is None  # no teacher was loaded
    online_forward = TeacherScorer.forward
    monkeypatch.setattr(TeacherScorer, "forward", lambda self, *a: online_forward(self, *a).half().float())
    _, online = fit(scored / "shards", tokenizers, teacher)
    assert len(online.batches) == len(cached.batches) == 2 and len(online.losses) == len(cached.losses) == 4
    for one, other in zip(online.batches, cached.batches):
        torch.testing.assert_close(other["teacher_token_loss"], one["vocagno_teacher_loss"], equal_nan=True)
        assert torch.equal(one["vocagno_selected"], other["vocagno_selected"])
    for one, other in zip(online.losses, cached.losses):
        for key, value in one.items():
            torch.testing.assert_close(other[key], value, rtol=1e-5, atol=1e-6)


def test_cached_mode_refuses_unscored_shards_and_another_teacher(scored, tokenizers):
    with pytest.raises(ValueError, match="carry no teacher losses"):
        fit(scored / "shards", tokenizers, str(scored / "teacher"), teacher_losses="cached")
    with pytest.raises(ValueError, match="scored by .* but the teacher is 'Qwen/Qwen2.5-Math-7B-Instruct'"):
        fit(scored / "scored", tokenizers, "Qwen/Qwen2.5-Math-7B-Instruct", teacher_losses="cached")
