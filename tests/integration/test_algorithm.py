"""VocAgnoLM inside a real Composer Trainer: what it runs, what it leaves alone, what it refuses."""

import math

import pytest
import torch
from composer import Trainer
from composer.models import HuggingFaceModel
from helpers import Capture
from torch.utils.data import DataLoader
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from vocagno.conversion.convert import main as convert_main
from vocagno.errors import Refused
from vocagno.algorithms.vocagno_lm import VocAgnoLM, teacher_guided_loss
from vocagno.data.dataset import TeacherGuidedCollator, TeacherGuidedDataset
from vocagno.core.loss import teacher_token_loss
from vocagno.teacher.model import TeacherScorer
from vocagno.teacher.teacher import Teacher
from vocagno.core.tokenization import ASSETS

QWEN = "Qwen/Qwen2.5-Math-7B-Instruct"

def tiny(config_class, model_class, vocab_size):
    torch.manual_seed(0)
    config = config_class(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128)
    return model_class(config)


@pytest.fixture(scope="module")
def loader(tmp_path_factory, tokenizers):
    root = tmp_path_factory.mktemp("shards")
    convert_main(["--input", str(ASSETS / "text" / "gsm8k_heldout_100.jsonl"), "--student-tokenizer", "llama2",
                  "--teacher-tokenizer", "qwen2.5", "--seq-len", "64", "--out-root", str(root)])
    dataset = TeacherGuidedDataset(local=str(root), batch_size=8, student_tokenizer=tokenizers["llama2"],
                                   teacher_tokenizer=tokenizers["qwen2.5"])
    collate = TeacherGuidedCollator(tokenizers["llama2"].eos_token_id, tokenizers["qwen2.5"].pad_token_id)
    yield DataLoader(dataset, batch_size=8, collate_fn=collate)


def test_the_teacher_guides_and_stays_out_of_the_optimizer_and_checkpoints(loader, tokenizers, tmp_path):
    student = tiny(LlamaConfig, LlamaForCausalLM, 32000)
    teacher = tiny(Qwen2Config, Qwen2ForCausalLM, 152064)  # Qwen pads its embedding past the 151,665 tokens
    forward_kwargs = []
    student.register_forward_pre_hook(lambda module, args, kwargs: forward_kwargs.append(set(kwargs)), with_kwargs=True)
    algorithm = VocAgnoLM(teacher=Teacher(teacher, tokenizer=tokenizers["qwen2.5"], dtype="float32"))
    model = HuggingFaceModel(student, tokenizer=tokenizers["llama2"], use_logits=True)
    trainer = Trainer(model=model, train_dataloader=loader, max_duration="2ba", algorithms=[algorithm],
                      optimizers=torch.optim.SGD(model.parameters(), lr=0.1), device="cpu",
                      save_folder=str(tmp_path / "ckpt"), save_interval="2ba", loggers=[], progress_bar=False)
    trainer.fit()
    assert forward_kwargs and all("labels" not in kwargs for kwargs in forward_kwargs)  # no HF loss computed
    loss = trainer.state.loss
    assert set(loss) == {"total", "kept_fraction", "mapped_fraction", "student_loss", "teacher_loss", "score"}
    assert not any(p.requires_grad for p in teacher.parameters())
    optimized = {id(p) for group in trainer.state.optimizers[0].param_groups for p in group["params"]}
    assert not optimized & {id(p) for p in teacher.parameters()}
    assert all(p.grad is None for p in teacher.parameters())
    checkpoint = torch.load(tmp_path / "ckpt" / "ep0-ba2-rank0.pt", weights_only=False)
    model_keys = checkpoint["state"]["model"].keys()
    assert model_keys and not any("teacher" in k or "scorer" in k for k in model_keys)
    assert sum(t.numel() for t in checkpoint["state"]["model"].values()) == sum(p.numel() for p in student.parameters())


class OwnLossModel(HuggingFaceModel):
    """A Composer model that computes its own loss from ``batch["labels"]``, as llm-foundry's MPT
    (``ComposerMPTCausalLM.loss``) does, rather than taking the forward's."""

    def loss(self, outputs, batch):
        logits = outputs.logits[:, :-1].flatten(0, 1)
        return torch.nn.functional.cross_entropy(logits, batch["labels"][:, 1:].flatten(), ignore_index=-100)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["vocagno", "uld"])
def test_a_model_computing_its_own_loss_from_the_labels_trains_with_the_teachers_loss(loader, tokenizers, method):
    from vocagno.algorithms.baselines import ULD

    student = tiny(LlamaConfig, LlamaForCausalLM, 32000)
    teacher = tiny(Qwen2Config, Qwen2ForCausalLM, 152064)
    algorithm = VocAgnoLM(teacher=Teacher(teacher, tokenizer=tokenizers["qwen2.5"], dtype="float32")) if (
        method == "vocagno") else ULD(teacher=Teacher(teacher, dtype="float32"))
    model = OwnLossModel(student, tokenizer=tokenizers["llama2"], use_logits=True)
    trainer = Trainer(model=model, train_dataloader=loader, max_duration="1ba", algorithms=[algorithm],
                      optimizers=torch.optim.SGD(model.parameters(), lr=0.1), device="cpu", loggers=[],
                      progress_bar=False)
    trainer.fit()
    assert isinstance(trainer.state.loss, dict) and "total" in trainer.state.loss  # the algorithm's, not the model's
    if method == "vocagno":
        assert set(trainer.state.loss) == {"total", "kept_fraction", "mapped_fraction", "student_loss", "teacher_loss",
                                           "score"}


def test_teacher_scorer_equals_the_loss_of_the_full_logits():
    teacher = tiny(Qwen2Config, Qwen2ForCausalLM, 300)
    ids = torch.randint(0, 300, (2, 20))
    mask = torch.ones_like(ids)
    mask[1, 15:] = 0
    scored = TeacherScorer(teacher, chunk_size=7)(ids, mask)
    with torch.no_grad():
        logits = teacher(input_ids=ids, attention_mask=mask).logits
    want = teacher_token_loss(logits, torch.nn.Identity(), ids, mask)
    torch.testing.assert_close(scored, want, equal_nan=True)
    assert torch.isnan(scored[1, 15:]).all() and not torch.isnan(scored[0, 1:]).any()


def test_a_teacher_too_small_for_the_shards_vocabulary_is_refused(loader, tokenizers):
    student = tiny(LlamaConfig, LlamaForCausalLM, 32000)
    teacher = tiny(Qwen2Config, Qwen2ForCausalLM, 32000)  # a Llama-sized embedding for Qwen's tokens
    trainer = Trainer(model=HuggingFaceModel(student, use_logits=True), train_dataloader=loader, max_duration="1ba",
                      algorithms=[VocAgnoLM(teacher=Teacher(teacher, dtype="float32"))], device="cpu", loggers=[],
                      progress_bar=False)
    with pytest.raises(ValueError, match="teacher's embedding has 32000 rows.*'qwen2.5' has 151665 tokens"):
        trainer.fit()


def test_a_teacher_tokenizer_other_than_the_shards_is_refused(loader, tokenizers):
    student = tiny(LlamaConfig, LlamaForCausalLM, 32000)
    teacher = tiny(Qwen2Config, Qwen2ForCausalLM, 152064)
    trainer = Trainer(model=HuggingFaceModel(student, use_logits=True), train_dataloader=loader, max_duration="1ba",
                      algorithms=[VocAgnoLM(teacher=Teacher(teacher, tokenizer="deepseek-llm"))], device="cpu",
                      loggers=[], progress_bar=False)
    with pytest.raises(ValueError, match="teacher tokenizer is 'qwen2.5'.*teacher tokenizer is 'deepseek-llm'"):
        trainer.fit()


def test_a_teacher_folder_without_tokenizer_files_names_the_argument_that_gives_one(loader, tmp_path):
    """The plain-Composer drop-in given a colleague's folder of weights alone: one line naming the folder and
    how VocAgnoLM's teacher takes its tokenizer (and llm-foundry's key for it), not transformers' converter list."""
    student = tiny(LlamaConfig, LlamaForCausalLM, 32000)
    tiny(Qwen2Config, Qwen2ForCausalLM, 152064).save_pretrained(tmp_path / "weights")
    trainer = Trainer(model=HuggingFaceModel(student, use_logits=True), train_dataloader=loader, max_duration="1ba",
                      algorithms=[VocAgnoLM(teacher={"name_or_path": str(tmp_path / "weights"), "dtype": "float32"})],
                      device="cpu", loggers=[], progress_bar=False)
    with pytest.raises(Refused) as refused:
        trainer.fit()
    assert str(refused.value) == (
        f"the teacher: its folder {tmp_path / 'weights'} holds no tokenizer files (tokenizer.json, tokenizer.model, "
        "vocab.json, vocab.txt, tokenizer_config.json): give VocAgnoLM(teacher={'name_or_path': MODEL, 'tokenizer': "
        "NAME_OR_FOLDER}) or a Teacher with its tokenizer, or each of teachers= its 'tokenizer' (in an llm-foundry "
        "yaml: algorithms.vocagno.teacher.tokenizer)")


@pytest.mark.parametrize("kwargs, message", [
    ({"topk_ratio": 2.0}, "topk_ratio"), ({"aggregation": "median"}, "aggregation"),
    ({"unmapped": "keep"}, "unmapped"), ({"teacher": {"name_or_path": QWEN, "placement": "cpu"}}, "teacher_placement"),
    ({"teacher": {"name_or_path": QWEN, "dtype": "bf16"}}, "teacher_dtype"),
    ({"teacher": {"name_or_path": QWEN, "dtyp": "float32"}}, r"teacher.dtyp \(did you mean teacher.dtype\?\)"),
])
def test_bad_options_are_refused_at_once(kwargs, message):
    with pytest.raises(ValueError, match=message):
        VocAgnoLM(**{"teacher": QWEN, **kwargs})


@pytest.mark.parametrize("baseline, kwargs, message", [
    ("ULD", {"teacher_losses": "offline"}, "^teacher_losses must be 'online' or 'cached', got 'offline'$"),
    ("ULD", {"teacher_losses": "cached", "top_k": 0}, "^top_k must be a whole number of at least 1, got 0$"),
    ("CrossVocabKD", {"teacher_losses": "cached", "top_k": True}, "^top_k must be a whole number of at least 1, "
                                                                  "got True$"),
    ("ULD", {"pairing": "greedy"}, r"^pairing must be 'position' \(ULD's\) or 'alignment' \(through vocagno's\), "
                                   "got 'greedy'$"),
    ("KLD", {"kd_ratio": 1.5}, r"^kd_ratio must be in \[0, 1\], got 1.5$"),
    ("CrossVocabKD", {"kd_ratio": -0.1}, r"^kd_ratio must be in \[0, 1\], got -0.1$"),
])
def test_a_baselines_bad_options_are_refused_at_once(baseline, kwargs, message):
    from vocagno.algorithms import baselines

    with pytest.raises(ValueError, match=message):
        getattr(baselines, baseline)(teacher=QWEN, **kwargs)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_fsdp_run_shards_the_teacher(loader, tokenizers):
    """With FSDP on (one GPU is enough), the teacher is wrapped in FSDP too and training runs in amp_bf16."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    student = tiny(LlamaConfig, LlamaForCausalLM, 32000)
    teacher = tiny(Qwen2Config, Qwen2ForCausalLM, 152064).to(torch.bfloat16)
    algorithm = VocAgnoLM(teacher=Teacher(teacher, tokenizer=tokenizers["qwen2.5"]))
    trainer = Trainer(model=HuggingFaceModel(student, use_logits=True), train_dataloader=loader, max_duration="2ba",
                      algorithms=[algorithm], device="gpu", precision="amp_bf16", loggers=[], progress_bar=False,
                      parallelism_config={"fsdp": {"sharding_strategy": "FULL_SHARD", "mixed_precision": "PURE"}})
    trainer.fit()
    assert isinstance(algorithm.scorer, FullyShardedDataParallel)
    assert torch.isfinite(trainer.state.loss["total"]) and 0.35 < trainer.state.loss["kept_fraction"] < 0.5


def test_the_teacher_builds_no_kv_cache():
    teacher = tiny(LlamaConfig, LlamaForCausalLM, 300)  # Llama's config has use_cache=True
    outputs = []
    teacher.model.register_forward_hook(lambda module, args, output: outputs.append(output))
    ids = torch.randint(0, 300, (2, 16))
    TeacherScorer(teacher)(ids, torch.ones_like(ids))
    assert len(outputs) == 1 and outputs[0].past_key_values is None


def guided_fit(loader, microbatch, scope, lr=0.5, batches=2, seed=0, **options):
    student, teacher = tiny(LlamaConfig, LlamaForCausalLM, 32000), tiny(Qwen2Config, Qwen2ForCausalLM, 152064)
    capture = Capture()
    algorithm = VocAgnoLM(teacher=Teacher(teacher, dtype="float32"), selection_scope=scope, **options)
    trainer = Trainer(model=HuggingFaceModel(student, use_logits=True), train_dataloader=loader,
                      max_duration=f"{batches}ba", device_train_microbatch_size=microbatch, callbacks=[capture],
                      algorithms=[algorithm],
                      optimizers=torch.optim.SGD(student.parameters(), lr=lr), device="cpu", loggers=[],
                      progress_bar=False, seed=seed)
    trainer.fit()
    return student, teacher, capture


def test_batch_scope_selects_the_same_tokens_and_takes_the_same_steps_however_the_batch_is_split(loader):
    """1 x 8, 2 x 4 and 8 x 1 microbatches: the same kept tokens (one top-k over the batch) and the same update (the
    loss is the mean over the batch's kept tokens, not a mean of microbatch means)."""
    runs = {microbatch: guided_fit(loader, microbatch, "batch") for microbatch in (8, 4, 1)}
    student, _, whole = runs[8]
    for microbatch in (4, 1):
        split_student, _, split = runs[microbatch]
        assert len(split.losses) == 2 * 8 // microbatch
        for one, other in zip(whole.batches, split.batches):
            assert torch.equal(one["vocagno_selected"], other["vocagno_selected"])
            torch.testing.assert_close(one["teacher_loss"], other["teacher_loss"], equal_nan=True)
        for p, q in zip(student.parameters(), split_student.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6)
    selected = whole.batches[0]["vocagno_selected"]
    mapped = torch.isfinite(whole.batches[0]["teacher_loss"]).any()  # the teacher scored something
    assert mapped and selected.sum() == math.ceil(0.4 * (whole.losses[0]["mapped_fraction"] * 8 * 63).round())
    # The selection is over the batch: sequences keep different shares of their tokens.
    assert selected.sum(1).float().std() > 0


@pytest.mark.parametrize("scope", ["microbatch", "sequence"])
def test_microbatch_and_sequence_scopes_select_within_each_microbatch_or_sequence(loader, scope):
    student, teacher, capture = guided_fit(loader, 4, scope, lr=0.0, batches=1)
    assert "vocagno_selected" not in capture.batches[0]  # no scoring pass
    scorer = TeacherScorer(teacher)
    for index, begin in enumerate((0, 4)):
        piece = {k: v[begin : begin + 4] for k, v in capture.batches[0].items()}
        with torch.no_grad():
            logits = student(input_ids=piece["input_ids"], attention_mask=piece["attention_mask"]).logits
            teacher_loss = scorer(piece["teacher_input_ids"], piece["teacher_attention_mask"])
        want = teacher_guided_loss(logits, piece["labels"], piece, teacher_loss, per_sequence=scope == "sequence")
        for key, value in want.items():
            torch.testing.assert_close(capture.losses[index][key], value, rtol=1e-5, atol=1e-6)


def test_batches_of_student_tokens_alone_get_their_teacher_side_made(loader, tokenizers):
    """A recipe's loader that gives only ``input_ids``/``attention_mask`` (no conversion): the algorithm makes the
    teacher's tokens and the alignment at AFTER_DATALOADER, from the model's tokenizer, and trains as on shards."""
    shard_batches = [batch for batch, _ in zip(loader, range(2))]
    plain = DataLoader([{"input_ids": b["input_ids"], "attention_mask": b["attention_mask"]} for b in shard_batches],
                       batch_size=None)
    student, teacher = tiny(LlamaConfig, LlamaForCausalLM, 32000), tiny(Qwen2Config, Qwen2ForCausalLM, 152064)
    capture = Capture()
    trainer = Trainer(model=HuggingFaceModel(student, tokenizer=tokenizers["llama2"], use_logits=True),
                      train_dataloader=plain, max_duration="2ba", device_train_microbatch_size=4, callbacks=[capture],
                      algorithms=[VocAgnoLM(teacher=Teacher(teacher, tokenizer="qwen2.5", dtype="float32"))],
                      optimizers=torch.optim.SGD(student.parameters(), lr=0.1), device="cpu", loggers=[],
                      progress_bar=False)
    trainer.fit()
    made = capture.batches[0]
    assert {"labels", "align_start", "align_end", "teacher_input_ids", "vocagno_selected"} <= set(made)
    # The shards' rows start with a BOS mid-document, read here as a document's start: compare inside the rows.
    shard = shard_batches[0]
    for row in range(8):
        got = made["teacher_input_ids"][row][made["teacher_attention_mask"][row].bool()]
        want = shard["teacher_input_ids"][row][shard["teacher_attention_mask"][row].bool()]
        assert torch.equal(got[4:-4], want[4:-4]), row
    kept = [loss["kept_fraction"] for loss in capture.losses]
    assert len(kept) == 4 and all(0.3 < k < 0.6 for k in kept)


def test_student_tokens_alone_without_a_student_tokenizer_are_refused(loader):
    batch = next(iter(loader))
    plain = DataLoader([{"input_ids": batch["input_ids"]}], batch_size=None)
    student, teacher = tiny(LlamaConfig, LlamaForCausalLM, 32000), tiny(Qwen2Config, Qwen2ForCausalLM, 152064)
    trainer = Trainer(model=HuggingFaceModel(student, use_logits=True), train_dataloader=plain, max_duration="1ba",
                      algorithms=[VocAgnoLM(teacher=Teacher(teacher, tokenizer="qwen2.5", dtype="float32"))],
                      optimizers=torch.optim.SGD(student.parameters(), lr=0.1), device="cpu", loggers=[],
                      progress_bar=False)
    with pytest.raises(ValueError, match="give it student_tokenizer"):
        trainer.fit()


@pytest.mark.parametrize("config_class, model_class",
                         [(LlamaConfig, LlamaForCausalLM), (Qwen2Config, Qwen2ForCausalLM)])
def test_fsdp_units_and_activation_checkpoints_are_the_decoder_layers(config_class, model_class):
    from vocagno.core.fsdp import wrap_per_decoder_layer

    model = wrap_per_decoder_layer(tiny(config_class, model_class, 300))
    layers = [m for m in model.modules() if model.fsdp_wrap_fn(m)]
    assert layers == list(model.model.layers) and len(layers) == 1
    assert [m for m in model.modules() if model.activation_checkpointing_fn(m)] == layers
    with pytest.raises(ValueError, match="no decoder layer class"):
        wrap_per_decoder_layer(torch.nn.Linear(2, 2))


def _fit_on_gpu(loader, tokenizers, fsdp, placement, tmp_path=None, batches=2, **kwargs):
    from vocagno.core.fsdp import wrap_per_decoder_layer

    student = wrap_per_decoder_layer(tiny(LlamaConfig, LlamaForCausalLM, 32000))
    teacher = tiny(Qwen2Config, Qwen2ForCausalLM, 152064).to(torch.bfloat16)
    algorithm = VocAgnoLM(teacher=Teacher(teacher, tokenizer=tokenizers["qwen2.5"], placement=placement))
    capture = Capture()
    trainer = Trainer(model=HuggingFaceModel(student, use_logits=True), train_dataloader=loader,
                      max_duration=f"{batches}ba", algorithms=[algorithm], device="gpu", precision="amp_bf16",
                      callbacks=[capture], loggers=[], progress_bar=False, seed=0,
                      optimizers=torch.optim.SGD(student.parameters(), lr=0.1),
                      parallelism_config={"fsdp": fsdp} if fsdp else None,
                      save_folder=str(tmp_path) if tmp_path else None, save_interval="1ba", **kwargs)
    trainer.fit()
    return trainer, algorithm, capture


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_fsdp_on_one_gpu_gives_the_loss_of_no_fsdp_with_the_teacher_sharded_or_replicated(loader, tokenizers):
    from torch.distributed.fsdp import FullyShardedDataParallel

    fsdp = {"sharding_strategy": "FULL_SHARD", "mixed_precision": "PURE", "activation_checkpointing": True}
    _, _, plain = _fit_on_gpu(loader, tokenizers, None, "replicate", batches=1)
    for placement in ("fsdp", "replicate"):
        trainer, algorithm, sharded = _fit_on_gpu(loader, tokenizers, fsdp, placement, batches=1)
        assert isinstance(algorithm.scorer, FullyShardedDataParallel) == (placement == "fsdp")
        units = [m for m in trainer.state.model.modules() if isinstance(m, FullyShardedDataParallel)]
        assert len(units) == 1 + 1  # the root and the one decoder layer: a unit per layer
        for ours, want in zip(sharded.losses, plain.losses):
            torch.testing.assert_close(ours["total"], want["total"], rtol=2e-2, atol=2e-2)  # bf16
            assert ours["kept_fraction"] == want["kept_fraction"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_checkpoint_saved_under_fsdp_resumes(loader, tokenizers, tmp_path):
    fsdp = {"sharding_strategy": "FULL_SHARD", "mixed_precision": "PURE", "state_dict_type": "sharded"}
    first, _, _ = _fit_on_gpu(loader, tokenizers, fsdp, "fsdp", tmp_path=tmp_path / "ckpt", batches=1,
                              autoresume=True, run_name="fsdp")
    resumed, _, capture = _fit_on_gpu(loader, tokenizers, fsdp, "fsdp", tmp_path=tmp_path / "ckpt", batches=2,
                                      autoresume=True, run_name="fsdp")
    assert int(first.state.timestamp.batch) == 1 and int(resumed.state.timestamp.batch) == 2
    assert len(capture.batches) == 1  # only the second batch ran: the first came from the checkpoint


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_teacher_scoring_stays_within_2_gib_above_its_weights():
    """Qwen2.5-Math-7B's head (3584 x 152064) over 4 x 2048 tokens: full fp32 logits would be 11.6 GiB."""
    config = Qwen2Config(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=2,
                         num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=4096)
    teacher = Qwen2ForCausalLM(config).to("cuda", torch.bfloat16)
    scorer = TeacherScorer(teacher)
    ids = torch.randint(0, 151665, (4, 2048), device="cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    weights = torch.cuda.memory_allocated()
    scorer(ids, torch.ones_like(ids))
    torch.cuda.synchronize()
    above = (torch.cuda.max_memory_allocated() - weights) / 2**30
    assert above <= 2.0, f"{above:.2f} GiB above the weights"


def test_student_and_teacher_attend_with_sdpa(tmp_path):
    """What docs/many-nodes.md says: PyTorch's SDPA attention for both, as transformers gives by default."""
    from omegaconf import OmegaConf

    from vocagno.teacher.config import build_causal_lm
    from vocagno.teacher.model import load_teacher

    student = build_causal_lm(OmegaConf.create({"config": {
        "model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
        "num_attention_heads": 2}}), 300)
    tiny(Qwen2Config, Qwen2ForCausalLM, 300).save_pretrained(tmp_path / "teacher")
    teacher = load_teacher(str(tmp_path / "teacher"), "float32")
    assert student.config._attn_implementation == "sdpa" and teacher.config._attn_implementation == "sdpa"


def test_random_selection_keeps_as_many_tokens_drawn_by_a_seed_however_the_batch_is_split(loader):
    """The control: as many tokens as the top-k keeps, at random among the mapped ones; the same draw for 1 x 8 and
    2 x 4 microbatches (one draw over the global batch, seeded by the batch index), another with another run seed."""
    _, _, topk = guided_fit(loader, 8, "batch", lr=0.0, batches=1)
    _, _, whole = guided_fit(loader, 8, "batch", lr=0.0, batches=1, selection="random")
    _, _, split = guided_fit(loader, 4, "batch", lr=0.0, batches=1, selection="random")
    _, _, other = guided_fit(loader, 8, "batch", lr=0.0, batches=1, selection="random", seed=1)
    chosen = whole.batches[0]["vocagno_selected"]
    assert torch.equal(chosen, split.batches[0]["vocagno_selected"])
    assert chosen.sum() == topk.batches[0]["vocagno_selected"].sum()
    assert not torch.equal(chosen, topk.batches[0]["vocagno_selected"])
    assert not torch.equal(chosen, other.batches[0]["vocagno_selected"])
    assert torch.isfinite(whole.batches[0]["teacher_loss"]).any()
    torch.testing.assert_close(whole.losses[0]["kept_fraction"], topk.losses[0]["kept_fraction"])


def test_chunk_alignment_maps_every_token_to_its_chunk(loader):
    from vocagno.core.alignment import chunk_align

    _, _, capture = guided_fit(loader, 4, "batch", lr=0.0, batches=1, alignment="chunk", num_chunks=8,
                               aggregation="mean")
    batch = capture.batches[0]
    start, end = chunk_align(batch["attention_mask"].sum(1), batch["teacher_attention_mask"].sum(1), 8,
                             batch["input_ids"].shape[1])
    assert torch.equal(batch["align_start"], start) and torch.equal(batch["align_end"], end)
    assert len(set(batch["align_start"][0].tolist())) == 8  # 8 chunks, each its own teacher range
    assert all(loss["mapped_fraction"] == 1 for loss in capture.losses)  # no token is unmapped at chunk level
    assert all(abs(loss["kept_fraction"] - 0.4) < 0.02 for loss in capture.losses)
    with pytest.raises(ValueError, match="num_chunks"):
        VocAgnoLM(teacher="Qwen/Qwen2.5-Math-7B-Instruct", alignment="chunk", num_chunks=0)
    with pytest.raises(ValueError, match="alignment must be"):
        VocAgnoLM(teacher="Qwen/Qwen2.5-Math-7B-Instruct", alignment="chunks")


def test_with_the_students_own_tokenizer_the_loss_is_rho1s_selective_language_modeling(tmp_path, tokenizers):
    """Rho-1 is vocagno with a reference model of the student's vocabulary: the alignment is the identity (token i is
    token i, specials included, detected without aligning) and the loss is SLM's by its definition (Rho-1 Eqs. 1-5):
    the mean cross-entropy over the top 60% of the batch's tokens by student loss minus reference loss."""
    import torch.nn.functional as F

    root = tmp_path / "shards"
    convert_main(["--input", str(ASSETS / "text" / "gsm8k_heldout_100.jsonl"), "--student-tokenizer", "llama2",
                  "--teacher-tokenizer", "llama2", "--seq-len", "64", "--out-root", str(root)])
    dataset = TeacherGuidedDataset(local=str(root), batch_size=4)
    eos = tokenizers["llama2"].eos_token_id
    batch = TeacherGuidedCollator(eos, eos)([dataset[i] for i in range(4)])
    positions = torch.arange(batch["input_ids"].shape[1]).expand_as(batch["input_ids"])
    assert torch.equal(batch["align_start"], positions) and torch.equal(batch["align_end"], positions + 1)
    assert torch.equal(batch["teacher_input_ids"][:, :64], batch["input_ids"])

    student, reference = tiny(LlamaConfig, LlamaForCausalLM, 32000), tiny(LlamaConfig, LlamaForCausalLM, 32000)
    noise = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in reference.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=noise))
        ids = batch["input_ids"]
        logits = student(input_ids=ids).logits
        reference_loss = TeacherScorer(reference)(batch["teacher_input_ids"], batch["teacher_attention_mask"])
        ours = teacher_guided_loss(logits, batch["labels"], batch, reference_loss, topk_ratio=0.6)
        student_ce = F.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none").flatten()
        reference_ce = F.cross_entropy(reference(input_ids=ids).logits[:, :-1].transpose(1, 2), ids[:, 1:],
                                       reduction="none").flatten()
    kept = (student_ce - reference_ce).topk(math.ceil(0.6 * student_ce.numel())).indices
    torch.testing.assert_close(ours["total"], student_ce[kept].mean(), rtol=1e-5, atol=1e-6)
    assert ours["mapped_fraction"] == 1


def token_rows(loader, batches=3):
    """The shards' student tokens alone, one sample a row: what llm-foundry's ``text`` loader gives."""
    rows = [row for batch, _ in zip(loader, range(batches)) for row in batch["input_ids"]]
    return [{"input_ids": row} for row in rows]


def tokens_fit(rows, tokenizers, workers, batches=3, **options):
    student, teacher = tiny(LlamaConfig, LlamaForCausalLM, 32000), tiny(Qwen2Config, Qwen2ForCausalLM, 152064)
    capture = Capture()
    algorithm = VocAgnoLM(teacher=Teacher(teacher, tokenizer="qwen2.5", dtype="float32"), **options)
    trainer = Trainer(model=HuggingFaceModel(student, tokenizer=tokenizers["llama2"], use_logits=True),
                      train_dataloader=DataLoader(rows, batch_size=8, num_workers=workers),
                      max_duration=f"{batches}ba", device_train_microbatch_size=4, callbacks=[capture],
                      algorithms=[algorithm], optimizers=torch.optim.SGD(student.parameters(), lr=0.1), device="cpu",
                      loggers=[], progress_bar=False)
    trainer.fit()
    return trainer, capture


@pytest.mark.slow
def test_with_loader_workers_the_teacher_side_is_made_there_and_the_batches_are_the_same(loader, tokenizers,
                                                                                        monkeypatch):
    from vocagno.teacher import side as teacher_side

    made_by = teacher_side.TeacherSide.__call__

    def marked(self, batch):  # which process made the teacher side: a worker (forked with this patch) or the trainer
        worker = torch.utils.data.get_worker_info() is not None
        return {**made_by(self, batch), "made_in_worker": torch.full((len(batch["input_ids"]),), worker)}

    monkeypatch.setattr(teacher_side.TeacherSide, "__call__", marked)
    rows = token_rows(loader)
    (in_workers, with_workers), (in_trainer, without) = (tokens_fit(rows, tokenizers, w) for w in (2, 0))
    assert isinstance(in_workers.state.train_dataloader.collate_fn, teacher_side.WithTeacherSide)
    assert [bool(b.pop("made_in_worker").all()) for b in with_workers.batches] == [True] * 3
    assert [bool(b.pop("made_in_worker").any()) for b in without.batches] == [False] * 3
    for one, other in zip(with_workers.batches, without.batches):
        assert one.keys() == other.keys() and "teacher_input_ids" in one
        for key in one:
            torch.testing.assert_close(one[key], other[key], equal_nan=True, msg=key)
    for one, other in zip(with_workers.losses, without.losses):
        torch.testing.assert_close(one["total"], other["total"])


class StudentTokensOnly:
    """The collator's batches cut to the student's input_ids and attention_mask: a Streaming loader of student tokens
    alone, resumable like llm-foundry's ``text`` loader."""

    def __init__(self, collate):
        self.collate = collate

    def __call__(self, samples):
        batch = self.collate(samples)
        return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}


@pytest.mark.slow
def test_with_loader_workers_a_resumed_run_takes_the_batches_and_steps_of_an_uninterrupted_one(loader, tokenizers,
                                                                                             tmp_path):
    root = loader.dataset.streams[0].local
    collate = StudentTokensOnly(loader.collate_fn)

    def fit(name, batches, **checkpointing):
        dataset = TeacherGuidedDataset(remote=root, local=str(tmp_path / name), batch_size=4, shuffle=True,
                                       shuffle_seed=3, num_canonical_nodes=1)
        student, teacher = tiny(LlamaConfig, LlamaForCausalLM, 32000), tiny(Qwen2Config, Qwen2ForCausalLM, 152064)
        capture = Capture()
        trainer = Trainer(model=HuggingFaceModel(student, tokenizer=tokenizers["llama2"], use_logits=True),
                          train_dataloader=DataLoader(dataset, batch_size=4, num_workers=2, collate_fn=collate),
                          max_duration=f"{batches}ba", callbacks=[capture], seed=1,
                          algorithms=[VocAgnoLM(teacher=Teacher(teacher, tokenizer="qwen2.5", dtype="float32"))],
                          optimizers=torch.optim.SGD(student.parameters(), lr=0.1), device="cpu", loggers=[],
                          progress_bar=False, **checkpointing)
        trainer.fit()
        trainer.close()
        return capture

    straight = fit("straight", 4)
    fit("first", 2, save_folder=str(tmp_path / "ckpt"), save_interval="2ba")
    resumed = fit("resumed", 4, load_path=str(tmp_path / "ckpt" / "ep0-ba2-rank0.pt"))
    assert len(resumed.batches) == 2 and len(straight.batches) == 4
    for one, other in zip(straight.batches[2:], resumed.batches):
        for key in ("input_ids", "teacher_input_ids", "align_start", "vocagno_selected"):
            assert torch.equal(one[key], other[key]), key
    for one, other in zip(straight.losses[2:], resumed.losses):
        torch.testing.assert_close(one["total"], other["total"])


@pytest.mark.slow
def test_a_loader_whose_tokens_are_not_the_students_or_that_has_none_is_named(loader, tokenizers):
    rows = token_rows(loader, batches=1)
    rows[3]["input_ids"] = rows[3]["input_ids"].clone()
    rows[3]["input_ids"][5] = 40000  # an id of another, larger vocabulary
    for workers in (0, 2):
        with pytest.raises(ValueError, match=r"the training loader \(list\): student input_ids from \d+ to 40000, but "
                                             r"the student tokenizer has 32000 ids"):
            tokens_fit(rows, tokenizers, workers, batches=1)
        with pytest.raises(ValueError, match=r"the training loader \(list\) gives batches with \['tokens'\]"):
            tokens_fit([{"tokens": row["input_ids"]} for row in rows], tokenizers, workers, batches=1)


@pytest.mark.slow
def test_the_students_training_forwards_build_no_kv_cache(loader):
    """The training forwards and the batch scope's scoring pass ask the student for no cache, and it returns none."""
    asked, returned = [], []
    original = tiny

    def spied(*args):
        model = original(*args)
        if model.config.vocab_size == 32000:  # the student
            model.register_forward_pre_hook(lambda m, a, kwargs: asked.append(kwargs.get("use_cache")),
                                            with_kwargs=True)
            model.register_forward_hook(lambda m, a, output: returned.append(output.past_key_values))
        return model

    globals()["tiny"] = spied
    try:
        student, _, capture = guided_fit(loader, 4, "batch", batches=1)
    finally:
        globals()["tiny"] = original
    assert student.config.use_cache  # the model's own setting is left alone (generation uses it)
    assert len(asked) == 2 + 2 and asked == [False] * 4  # 2 microbatches scored, 2 trained
    assert returned == [None] * 4
