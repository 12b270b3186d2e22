"""The ``vocagno`` loader llm-foundry builds (``vocagno.training.foundry``), called in-process as llm-foundry's
``build_dataloader`` calls a registered builder; tests/integration/test_llmfoundry.py runs it inside llm-foundry."""

import pytest

from vocagno.conversion.convert import main as convert_main
from vocagno.core.tokenization import ASSETS
from vocagno.data.batch import ALIGN_END, ALIGN_START, TEACHER_INPUT_IDS
from vocagno.training.foundry import build_vocagno_dataloader


@pytest.fixture(scope="module")
def shards(tmp_path_factory, tokenizers):
    root = tmp_path_factory.mktemp("shards")
    assert convert_main(["--input", str(ASSETS / "text" / "gsm8k_heldout_100.jsonl"), "--student-tokenizer",
                         "llama2", "--teacher-tokenizer", "qwen2.5", "--seq-len", "64",
                         "--out-root", str(root)]) == 0
    return root


@pytest.mark.parametrize("workers", [0, 1])
def test_the_loader_gives_batches_of_both_sides_and_counts_their_student_tokens(shards, tokenizers, workers):
    spec = build_vocagno_dataloader(tokenizers["llama2"], 4, {"local": str(shards), "shuffle": False},
                                    num_workers=workers, pin_memory=False)
    batch = next(iter(spec.dataloader))
    assert batch["input_ids"].shape == (4, 64)
    for key in (TEACHER_INPUT_IDS, ALIGN_START, ALIGN_END):
        assert key in batch and batch[key].shape[0] == 4
    # each student token's teacher range lies within the teacher's row
    assert bool((batch[ALIGN_END] <= batch[TEACHER_INPUT_IDS].shape[1]).all())
    assert spec.get_num_tokens_in_batch(batch) == int(batch["attention_mask"].sum()) > 0
    assert spec.dataloader.num_workers == workers


def test_a_fractional_batch_size_is_refused(shards, tokenizers):
    with pytest.raises(ValueError, match="a whole number of samples per device, got 2.5"):
        build_vocagno_dataloader(tokenizers["llama2"], 2.5, {"local": str(shards)})
