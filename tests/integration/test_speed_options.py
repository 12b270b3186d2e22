"""The options that make a run faster without changing what it learns: torch.compile for the student (Composer's
``compile_config``) and the teacher (``teacher.compile_config``, per decoder layer), and Liger-Kernel's fused kernels
(``model.kernels`` / ``teacher.kernels: liger``, a CUDA GPU: checked against PyTorch's in the ``gpu`` tests)."""

import pytest
import torch
from helpers import own_data, read_log

from vocagno.training.builders import build_algorithms
from vocagno.training.config import load_config
from vocagno.train import train
from vocagno.core.kernels import LIGER_VERSION, check_kernels, fused_token_loss, use_kernels
from vocagno.teacher.model import TeacherScorer
from vocagno.teacher.config import build_causal_lm
from vocagno.errors import Refused

from test_train import TINY

# A compiled step's float32 losses may differ from the eager step's in the last bits (a backend's fused or decomposed
# reductions sum in another order); after a few optimizer steps the difference grows but stays far below what a
# change of method would make.
COMPILED_REL = 1e-4


def train_losses(tmp_path, name, *overrides):
    cfg = load_config(TINY, [*own_data(TINY, f"{tmp_path}/shards/train", f"{tmp_path}/shards/heldout"),
                                   "loggers.console=null", "loggers.picture=null", "eval_loader=null",
                                   "selection_report=null", "max_duration=4ba", "progress_bar=false",
                                   f"loggers.jsonl.path={tmp_path}/{name}.jsonl", *overrides])
    train(cfg)
    steps = read_log(tmp_path / f"{name}.jsonl")
    return {step: steps[step]["loss/train/total"] for step in steps if "loss/train/total" in steps[step]}


@pytest.mark.slow
def test_a_compiled_student_and_teacher_train_the_losses_of_uncompiled_ones(tmp_path):
    from torch._dynamo.utils import counters

    eager = train_losses(tmp_path, "eager")
    counters.clear()
    # aot_eager: Dynamo's graphs and AOTAutograd's backward, run by eager kernels. Inductor's C++ code generation
    # costs minutes of a cold CPU here: the compiled teacher test below runs Inductor (the teacher's layers, forward
    # only); the gpu check's liger_compiled step trains with it for speed, without comparing losses.
    compiled = train_losses(tmp_path, "compiled", "compile_config={backend: aot_eager}",
                            "teacher.compile_config={backend: aot_eager}")
    assert counters["frames"]["ok"] >= 2  # the student's forward and the teacher's decoder layer, at least
    assert sorted(eager) == sorted(compiled) == [0, 1, 2, 3]
    for step in eager:
        assert compiled[step] == pytest.approx(eager[step], rel=COMPILED_REL), step
    assert len(set(eager.values())) == 4  # it trained: every step's loss its own


def tiny_qwen(tokenizers):
    from omegaconf import OmegaConf as om

    section = om.create({"config": {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 192,
                                    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                                    "max_position_embeddings": 256, "tie_word_embeddings": False}})
    return build_causal_lm(section, len(tokenizers["qwen2.5"]), seed=0)


def teacher_tokens(tokenizers):
    """Two rows of real Qwen2.5 tokens of shipped text, the second padded on the right."""
    from vocagno.core.tokenization import ASSETS

    lines = (ASSETS / "text" / "gsm8k_heldout_100.jsonl").read_text(encoding="utf-8").splitlines()[:2]
    import json

    rows = [tokenizers["qwen2.5"](json.loads(line)["text"])["input_ids"][:96] for line in lines]
    width = max(map(len, rows))
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, row in enumerate(rows):
        ids[b, :len(row)], mask[b, :len(row)] = torch.tensor(row), 1
    mask[1, width - 20:] = 0
    return ids, mask


@pytest.mark.slow
def test_a_compiled_teacher_scores_its_tokens_as_the_uncompiled_one(tokenizers):
    model = tiny_qwen(tokenizers)
    ids, mask = teacher_tokens(tokenizers)
    from torch._dynamo.utils import counters

    eager = TeacherScorer(model)(ids, mask)
    counters.clear()
    compiled = TeacherScorer(model, compile_config={})(ids, mask)
    assert counters["frames"]["ok"] >= 1
    assert torch.equal(eager.isnan(), compiled.isnan()) and eager.isnan().sum() >= 21
    torch.testing.assert_close(compiled.nan_to_num(), eager.nan_to_num(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("options, message", [
    ({"kernels": "triton"}, "teacher kernels must be one of torch, liger, got 'triton'"),
    ({"compile_config": True}, "teacher compile_config: give torch.compile's options as a mapping"),
    ({"compile_config": {"mod": "max-autotune"}}, "torch.compile has no option 'mod'"),
])
def test_speed_options_torch_cannot_take_are_refused_in_one_line(tokenizers, options, message):
    with pytest.raises(Refused, match=message):
        TeacherScorer(tiny_qwen(tokenizers), **options)


@pytest.mark.parametrize("compile_config, message", [
    ({"mode": "bogus"}, "mode must be one of default, reduce-overhead, max-autotune"),
    ({"backend": "bogus"}, "backend must be one of .*inductor"),
    ({"options": {"bogus_option": 1}}, r"options must map inductor's options .*; unknown: bogus_option"),
    ({"mode": "max-autotune", "options": {"max_autotune": True}}, "give mode or options, not both"),
    ({"fullgraph": "maybe"}, "fullgraph must be true or false, got 'maybe'"),
    ({"disable": "false"}, "disable must be true or false, got 'false'"),
])
def test_compile_options_torch_would_refuse_in_the_first_step_are_refused_before_anything_loads(
        tmp_path, compile_config, message):
    import json

    cfg = load_config(TINY, [*own_data(TINY, f"{tmp_path}/shards/train", f"{tmp_path}/shards/heldout"),
                                   f"teacher.compile_config={json.dumps(compile_config)}"])
    with pytest.raises(Refused, match=f"teacher.compile_config: {message}"):
        train(cfg)
    assert not (tmp_path / "shards").exists()  # before the conversion


def test_a_chunk_size_beside_liger_is_refused_by_the_algorithm_too(tokenizers):
    from vocagno.algorithms.vocagno_lm import VocAgnoLM
    from vocagno.teacher.teacher import Teacher

    with pytest.raises(ValueError, match="teacher: chunk_size is PyTorch's kernels' own; with kernels: liger"):
        VocAgnoLM(teacher=Teacher(tiny_qwen(tokenizers), kernels="liger", chunk_size=2048))


def test_liger_on_a_device_that_is_not_a_gpu_is_refused():
    from vocagno.core.kernels import check_on_gpu

    with pytest.raises(Refused, match="--kernels: liger runs Triton kernels on a CUDA GPU, not on cpu: use torch"):
        check_on_gpu("liger", "cpu", "--kernels")
    check_on_gpu("liger", "cuda:0")
    check_on_gpu("torch", "cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal of a machine without CUDA")
def test_liger_on_a_machine_without_cuda_is_refused_before_anything_loads(tmp_path):
    cfg = load_config(TINY, [*own_data(TINY, f"{tmp_path}/shards/train", f"{tmp_path}/shards/heldout"),
                                   "model.kernels=liger"])
    with pytest.raises(Refused, match="model.kernels: liger runs Triton kernels on a CUDA GPU, and this machine has "
                                      "none: use torch"):
        train(cfg)
    assert not (tmp_path / "shards").exists()  # before the conversion
    with pytest.raises(ValueError, match="model.kernels must be torch or liger, got 'fast'"):
        load_config(TINY, ["model.kernels=fast"])


def test_the_baselines_refuse_teacher_speed_options_they_would_not_use(tokenizers):
    cfg = load_config(TINY.replace("tiny.yaml", "tiny_uld.yaml"), ["teacher.compile_config={}"])
    with pytest.raises(ValueError, match="teacher.compile_config: only algorithms.vocagno's teacher takes it"):
        build_algorithms(cfg, tokenizers[cfg.teacher.tokenizer])


# Liger-Kernel against PyTorch on a GPU, in float32: bf16 would hide a wrong gradient in its rounding.


def ran(call, *names) -> None:
    """Run ``call`` under torch.profiler and check that each of Liger's autograd functions ``names`` ran: a model
    that kept PyTorch's kernels would also give PyTorch's losses."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        call()
    seen = {event.name for event in profile.events()}
    for name in names:
        assert any(name in event for event in seen), f"{name} did not run"

def _with_liger_available():
    from importlib import metadata

    assert metadata.version("liger-kernel") == LIGER_VERSION


@pytest.mark.parametrize("architecture", ["llama", "qwen2"])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_liger_kernels_give_the_per_token_losses_and_gradients_of_pytorchs(architecture, tokenizers):
    from omegaconf import OmegaConf as om
    from vocagno.core.loss import next_token_cross_entropy

    _with_liger_available()
    tokenizer = tokenizers["llama2" if architecture == "llama" else "qwen2.5"]
    section = om.create({"config": {"model_type": architecture, "hidden_size": 128, "intermediate_size": 352,
                                    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                                    "max_position_embeddings": 256, "tie_word_embeddings": False}})
    reference = build_causal_lm(section, len(tokenizer), seed=0).cuda()
    fused = use_kernels(build_causal_lm(section, len(tokenizer), seed=0).cuda(), "liger")
    ids = torch.tensor([tokenizer("Natalia sold clips to 48 of her friends in April, and then she sold half as many "
                                  "clips in May. How many clips did Natalia sell altogether?")["input_ids"][:32]] * 2,
                       device="cuda")
    weights = torch.rand(ids.shape[0], ids.shape[1] - 1, device="cuda")  # a selection's uneven weights per token
    losses = {}

    def step(name, model):
        per_token = next_token_cross_entropy(model(input_ids=ids).logits, ids)
        (per_token * weights).sum().backward()
        losses[name] = per_token.detach()

    step("reference", reference)
    ran(lambda: step("fused", fused), "LigerRMSNormFunction", "LigerSiLUMulFunction")
    torch.testing.assert_close(losses["fused"], losses["reference"], rtol=1e-4, atol=1e-4)
    grads = dict(reference.named_parameters())
    for name, parameter in fused.named_parameters():
        torch.testing.assert_close(parameter.grad, grads[name].grad, rtol=1e-3, atol=1e-4, msg=name)


@pytest.mark.parametrize("chunk_mem_const", [None, 8])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_ligers_fused_linear_cross_entropy_gives_per_token_losses_and_gradients_of_pytorchs(chunk_mem_const):
    """reduction="none" with an uneven gradient per token and ignored targets: the mode whose gradients liger-kernel
    got wrong until 2026-07; in Liger's default chunks, and in chunks of a larger budget (``chunk_mem_const``)."""
    from vocagno.core.loss import token_cross_entropy

    _with_liger_available()
    torch.manual_seed(0)
    head = torch.nn.Linear(256, 151665, bias=False, device="cuda")
    hidden = torch.randn(300, 256, device="cuda", requires_grad=True)
    targets = torch.randint(0, 151665, (300,), device="cuda")
    targets[::7] = -100
    upstream = torch.rand(300, device="cuda")
    results = {}
    for name, loss in (("reference", lambda h, t: token_cross_entropy(head(h), t)),
                       ("fused", lambda h, t: fused_token_loss(h, head, t, chunk_mem_const))):
        hidden.grad, head.weight.grad = None, None
        per_token = loss(hidden, targets)
        (per_token * upstream).sum().backward()
        results[name] = per_token.detach(), hidden.grad.clone(), head.weight.grad.clone()
    for ours, want, what in zip(results["fused"], results["reference"], ("losses", "hidden grad", "weight grad")):
        torch.testing.assert_close(ours, want, rtol=1e-3, atol=1e-4, msg=what)
    assert (results["fused"][0][::7] == 0).all() and results["fused"][1][::7].abs().max() == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_liger_teacher_scores_its_tokens_as_pytorchs_does(tokenizers):
    _with_liger_available()
    model = tiny_qwen(tokenizers).cuda()
    ids, mask = (t.cuda() for t in teacher_tokens(tokenizers))
    eager = TeacherScorer(model)(ids, mask)
    scores = []
    ran(lambda: scores.append(TeacherScorer(model, kernels="liger")(ids, mask)), "LigerRMSNormFunction",
        "LigerSiLUMulFunction", "LigerFusedLinearCrossEntropyFunction")
    fused = scores[0]
    assert torch.equal(eager.isnan(), fused.isnan())
    torch.testing.assert_close(fused.nan_to_num(), eager.nan_to_num(), rtol=1e-4, atol=1e-4)


def test_a_chunk_size_given_with_ligers_kernels_is_refused_not_dropped(tmp_path, tokenizers, capsys):
    """Liger's fused linear cross-entropy chooses its own chunks: a chunk size given with it would not be used."""
    from vocagno import score
    from vocagno.training.config import scoring_teacher

    cfg = load_config(TINY, [*own_data(TINY, f"{tmp_path}/shards/train", f"{tmp_path}/shards/heldout"),
                                   "teacher.kernels=liger", "teacher.chunk_size=2048"])
    with pytest.raises(Refused, match="teacher: chunk_size is PyTorch's kernels' own; with kernels: liger"):
        train(cfg)
    assert not (tmp_path / "shards").exists()  # before the conversion
    with pytest.raises(Refused, match="tiny.yaml: teacher: chunk_size is PyTorch's kernels' own"):
        scoring_teacher(cfg, "tiny.yaml")
    shards = tmp_path / "given"
    shards.mkdir()
    for name in ("index.json", "vocagno.json"):
        (shards / name).write_text("{}")
    with pytest.raises(SystemExit) as ended:
        score.main(["--shards", str(shards), "--teacher", "tiny-math-teacher", "--out", str(tmp_path / "out"),
                    "--kernels", "liger", "--chunk-size", "512"])
    assert ended.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(
        "error: --chunk-size is PyTorch's kernels' own; with --kernels liger, Liger's fused linear cross-entropy "
        "chooses its chunks: leave --chunk-size out")


def test_liger_kernels_other_than_the_tested_version_or_a_model_of_another_shape_are_refused(monkeypatch):
    """What a GPU machine would refuse, seen here with CUDA stood in for: liger-kernel missing or of another
    version than the one the gpu tests check, and a decoder without the RMSNorm and SwiGLU MLP it replaces."""
    from importlib import metadata

    from transformers import GPT2Config, GPT2LMHeadModel

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)
    with pytest.raises(Refused, match=f"model.kernels: liger needs liger-kernel {LIGER_VERSION}: pip install -e "):
        check_kernels("liger", "model.kernels")
    monkeypatch.setattr(metadata, "version", lambda name: "0.6.4")
    with pytest.raises(Refused, match=f"liger is tested with liger-kernel {LIGER_VERSION}, found 0.6.4"):
        check_kernels("liger", "model.kernels")
    monkeypatch.setattr(metadata, "version", lambda name: LIGER_VERSION)
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100))
    with pytest.raises(Refused, match="liger replaces a Llama-like decoder's RMSNorm and SwiGLU MLP; GPT2LMHeadModel"):
        use_kernels(gpt2, "liger", "model.kernels")
