"""From a finished run to a Hugging Face folder: whole and sharded checkpoints, local and in an S3 store (a moto server
on this machine), a save folder's latest; what a bad checkpoint or OUT gets; autoresume's repair of sharded and
remote save folders."""

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from helpers import bucket_keys as keys, ends, script

from vocagno.training.checkpoint import BadCheckpoint, repair
from vocagno.training.config import scoring_teacher
from vocagno.export import main as export_main

REPO = Path(__file__).resolve().parents[2]
OVERRIDES = ["selection_report=null", "eval_loader=null", "loggers.console=null", "loggers.picture=null",
             "progress_bar=false"]


def train(*overrides):
    """python train.py yamls/tiny.yaml OVERRIDES, run in this process (``helpers.script``)."""
    result = script(REPO / "train.py", [str(REPO / "yamls" / "tiny.yaml"), *OVERRIDES, *overrides], cwd=REPO)
    assert result.returncode == 0, result.stderr[-4000:]
    return result


@pytest.fixture(scope="module")
def whole_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("whole") / "run"
    train("max_duration=2ba", f"save_folder={folder}", "save_interval=2ba")
    return folder


def _save_sharded(rank: int, world: int, folder: str) -> None:
    """One rank of a 2-rank gloo run on CPU: the tiny student wrapped by PyTorch FSDP per decoder layer (the units
    ``vocagno.core.fsdp`` marks, as Composer's FSDP wraps them), two optimizer steps, each saved by Composer's own
    ``save_checkpoint`` with ``state_dict_type: sharded``: the layout a GPU run's ``fsdp_config`` writes. Rank 0
    also writes the gathered weights (the reference) and what each rank holds."""
    import functools

    import torch.distributed as dist
    from composer.core import State
    from composer.devices import DeviceCPU
    from composer.models import HuggingFaceModel
    from composer.optim import DecoupledAdamW
    from composer.utils import FSDPConfig, ParallelismConfig
    from composer.utils.checkpoint import save_checkpoint
    from omegaconf import OmegaConf as om
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import lambda_auto_wrap_policy

    from vocagno.teacher.config import build_causal_lm
    from vocagno.training.config import load_config
    from vocagno.core.fsdp import wrap_per_decoder_layer
    from vocagno.training.loggers import RunRecipe
    from vocagno.core.tokenization import load_tokenizer

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      NODE_RANK="0")
    dist.init_process_group("gloo", init_method=f"file://{folder}/rendezvous", rank=rank, world_size=world)
    try:
        cfg = load_config(str(REPO / "yamls" / "tiny.yaml"), ["run_name=sharded", "precision=amp_bf16"])
        tokenizer = load_tokenizer(cfg.tokenizer.name)
        student = wrap_per_decoder_layer(build_causal_lm(cfg.model, len(tokenizer), cfg.seed))
        model = HuggingFaceModel(student, tokenizer=tokenizer, use_logits=True, shift_labels=True)
        model.model = FSDP(model.model, device_id=torch.device("cpu"), use_orig_params=True,
                           auto_wrap_policy=functools.partial(lambda_auto_wrap_policy, lambda_fn=student.fsdp_wrap_fn))
        optimizer = DecoupledAdamW(model.parameters(), lr=1e-2)
        state = State(model=model, optimizers=optimizer, rank_zero_seed=cfg.seed, run_name=cfg.run_name,
                      device=DeviceCPU(), callbacks=[RunRecipe(om.to_yaml(cfg, resolve=True))],
                      parallelism_config=ParallelismConfig(fsdp=FSDPConfig(state_dict_type="sharded")))
        for step in (1, 2):
            ids = torch.randint(0, len(tokenizer), (2, 32), generator=torch.Generator().manual_seed(10 * step + rank))
            batch = {"input_ids": ids, "labels": ids, "attention_mask": torch.ones_like(ids)}
            model.loss(model(batch), batch).backward()
            optimizer.step()
            optimizer.zero_grad()
            state.timestamp = state.timestamp.to_next_batch(samples=2 * world, tokens=64 * world)
            save_checkpoint(state, f"{folder}/ep{{epoch}}-ba{{batch}}-rank{{rank}}.pt")
        # Gathered without cpu_offload, which crashes (SIGSEGV) when the ranks are CPU processes already.
        whole = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
        units = len(FSDP.fsdp_modules(model))
        held = sum(unit._handle.flat_param.numel() for unit in FSDP.fsdp_modules(model) if unit._handle is not None)
        shares = [None] * world
        dist.all_gather_object(shares, held)
        if rank == 0:
            total = sum(tensor.numel() for tensor in whole.values())
            torch.save({"model": whole, "units": units, "held": shares, "total": total}, f"{folder}/reference.pt")
            os.symlink("ep0-ba2", f"{folder}/latest-rank0.pt")  # as Composer's CheckpointSaver links a sharded save
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def sharded_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sharded") / "run"
    folder.mkdir()
    # forkserver: not forks of this process, whose threads' locks a fork would inherit
    torch.multiprocessing.start_processes(_save_sharded, args=(2, str(folder)), nprocs=2, join=True,
                                          start_method="forkserver")
    (folder / "rendezvous").unlink(missing_ok=True)
    return folder


def student_with(weights: dict[str, torch.Tensor]):
    """The tiny yaml's student built as train.py builds it, holding ``weights`` (a checkpoint's model state)."""
    from vocagno.teacher.config import build_causal_lm
    from vocagno.training.config import load_config
    from vocagno.core.tokenization import load_tokenizer

    cfg = load_config(str(REPO / "yamls" / "tiny.yaml"), [])
    student = build_causal_lm(cfg.model, len(load_tokenizer(cfg.tokenizer.name)), seed=0)
    student.load_state_dict({key.removeprefix("model."): value.float() for key, value in weights.items()})
    return student.eval()


def logits(model, text="Natalia sold clips to 48 of her friends in April, and then she sold half as many in May."):
    from vocagno.core.tokenization import load_tokenizer

    ids = load_tokenizer("llama2")(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        return model(ids).logits.float()


def from_pretrained(folder):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder).eval()


def test_a_whole_checkpoint_becomes_a_folder_that_loads_with_the_checkpoints_logits_and_states_its_recipe(
        whole_run, tmp_path):
    from vocagno.training.checkpoint import load_checkpoint

    out = tmp_path / "model"
    assert export_main([str(whole_run / "ep0-ba2-rank0.pt"), str(out)]) == 0
    assert {p.name for p in out.iterdir()} >= {"model.safetensors", "config.json", "generation_config.json",
                                                "tokenizer.json", "tokenizer_config.json", "README.md"}
    weights = load_checkpoint(str(whole_run / "ep0-ba2-rank0.pt"))["state"]["model"]
    torch.testing.assert_close(logits(from_pretrained(out)), logits(student_with(weights)), rtol=0, atol=0)
    page = render((out / "README.md").read_text())
    for stated in ("<code>tiny-math-teacher</code>, tokenizer <code>mistral</code>",
                   "random init: llama, 2 layers of 64, tokenizer <code>llama2</code>",
                   "vocagno: topk_ratio 0.4, aggregation max, unmapped include, selection_scope batch",
                   "2,048 student tokens, 2 batches, 16 samples", "float32", '<code class="language-yaml">',
                   "run_name: tiny"):
        assert stated in page, stated
    config = json.loads((out / "generation_config.json").read_text())
    assert config["eos_token_id"] == 2 and config["pad_token_id"] == 2


@pytest.mark.slow
def test_the_card_carries_the_evaluation_of_the_exported_model(whole_run, tmp_path, capsys):
    from vocagno.eval.__main__ import main as eval_main

    assert export_main([str(whole_run), str(tmp_path / "model")]) == 0
    assert eval_main(["--model", str(tmp_path / "model"), "--benchmarks", "gsm8k,svamp", "--limit", "2",
                      "--max-new-tokens", "4", "--output", str(tmp_path / "eval"), "--device", "cpu"]) == 0
    assert export_main([str(whole_run), str(tmp_path / "model"), "--overwrite", "--eval", str(tmp_path / "eval")]) == 0
    card = (tmp_path / "model" / "README.md").read_text()
    assert "## Evaluation" in card and "| GSM8K | SVAMP | AVG |" in card
    assert ("<p>* partial, not the benchmark's score: GSM8K: the first 2 of 1,319 questions (--limit); "
            in render(card))
    capsys.readouterr()
    refused([whole_run, tmp_path / "other", "--eval", tmp_path], capsys, names="no results.json there")
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    for content, names in (("[1, 2]", "results.json: not vocagno.eval's results (a mapping of benchmarks to scores)"),
                           ("{oops", "results.json: refused: not JSON")):
        (tmp_path / "eval" / "results.json").write_text(content)
        refused([whole_run, tmp_path / "other", "--eval", tmp_path / "eval"], capsys, names=names)
    for partial in ("some", ["gsm8k"], {"gsm8k": "a\n## injected heading"}, {"gsm8k": "a\r\r## heading"},
                    {"nope": "x"}):
        (tmp_path / "eval" / "results.json").write_text(json.dumps({**results, "partial": partial}))
        refused([whole_run, tmp_path / "other", "--eval", tmp_path / "eval"], capsys,
                names="refused: its partial is not vocagno.eval's")
    for key in ("avg", "GSM8K", "notes"):  # a number the card would show nowhere, or count in no average
        (tmp_path / "eval" / "results.json").write_text(json.dumps({**results, key: 99.0}))
        refused([whole_run, tmp_path / "other", "--eval", tmp_path / "eval"], capsys,
                names=f"results.json: refused: its key {key!r} is none of vocagno.eval's (accepted: the benchmarks")


def test_the_card_of_a_mixture_run_names_each_stream_and_its_weight():
    from omegaconf import OmegaConf as om
    from transformers import LlamaConfig, LlamaForCausalLM

    from vocagno.training.config import load_config
    from vocagno.export import model_card

    streams = "{gsm: {remote: s3://runs/gsm, local: /tmp/gsm, proportion: 0.75}, heldout: {local: /tmp/heldout}}"
    cfg = load_config(str(REPO / "yamls" / "tiny.yaml"), ["train_loader.dataset.local=null",
                                                          f"train_loader.dataset.streams={streams}"])
    state = {"callbacks": {"RunRecipe": {"yaml": om.to_yaml(cfg, resolve=True)}}}
    model = LlamaForCausalLM(LlamaConfig(vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                                         num_attention_heads=1))
    card = model_card("runs/mixture", "mixture", state, model)
    assert ("<td>data</td>\n<td>mixture: gsm <code>s3://runs/gsm</code> (proportion 0.75), heldout "
            "<code>/tmp/heldout</code></td>\n<td>the checkpoint's stored recipe</td>") in render(card)
    # A stored recipe from elsewhere: a stream, or the dataset, that is markup instead of a mapping is shown as text.
    for dataset, shown in (("{streams: {gsm: {local: /tmp/gsm}, odd: '<img src=x onerror=alert(1)>'}}",
                            "mixture: gsm <code>/tmp/gsm</code>, odd &lt;img src=x onerror=alert(1)&gt;"),
                           ("'<script>alert(1)</script>'", "&lt;script&gt;alert(1)&lt;/script&gt;")):
        recipe = load_config(str(REPO / "yamls" / "tiny.yaml"), [f"train_loader.dataset={dataset}"])
        page = render(model_card("runs/odd", "odd", {"callbacks": {"RunRecipe": {"yaml": om.to_yaml(recipe)}}},
                                 model))
        assert f"<td>data</td>\n<td>{shown}</td>" in page and "<img" not in page and "<script" not in page, page


@pytest.mark.slow
@pytest.mark.distributed  # the sharded checkpoint is written by 2 gloo processes
def test_a_sharded_checkpoint_and_its_save_folder_export_the_gathered_weights(sharded_run, tmp_path):
    reference = torch.load(sharded_run / "reference.pt")
    expected = logits(student_with(reference["model"]))
    for i, source in enumerate([sharded_run / "ep0-ba2", sharded_run]):  # the folder, and the save folder's latest
        out = tmp_path / f"model{i}"
        assert export_main([str(source), str(out), "--dtype", "float32"]) == 0
        torch.testing.assert_close(logits(from_pretrained(out)), expected, rtol=0, atol=0)
    # The run's precision (amp_bf16) is the weights' dtype unless --dtype says otherwise.
    assert export_main([str(sharded_run), str(tmp_path / "bf16")]) == 0
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    torch.testing.assert_close(logits(from_pretrained(tmp_path / "bf16")), expected, rtol=0.1, atol=0.1)
    assert "256 student tokens, 2 batches, 8 samples" in (tmp_path / "bf16" / "README.md").read_text()


@pytest.mark.slow
@pytest.mark.distributed  # the sharded checkpoint is written by 2 gloo processes
def test_the_student_is_wrapped_per_decoder_layer_and_each_rank_holds_half(sharded_run):
    reference = torch.load(sharded_run / "reference.pt")
    assert reference["units"] == 2 + 1  # tiny.yaml's 2 decoder layers, and the root (embeddings, norm, head)
    total, held = reference["total"], reference["held"]
    tied = 32000 * 64  # the head shares the embeddings: counted twice in the state dict, held once
    assert total - tied <= sum(held) <= total - tied + 2 * 3 * 2, (held, total)
    assert max(held) - min(held) <= 3 * 2, held


@pytest.mark.slow
@pytest.mark.distributed  # the sharded checkpoint is written by 2 gloo processes
def test_eval_reads_a_sharded_save_folder_as_its_export(sharded_run, tmp_path, capsys):
    from vocagno.training.models import load_model
    from vocagno.eval.__main__ import main as eval_main
    from vocagno.training.metrics import bits_per_byte

    text = tmp_path / "text.txt"
    text.write_text("Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting.")
    assert export_main([str(sharded_run), str(tmp_path / "model")]) == 0
    bpb = []
    for model in (sharded_run, tmp_path / "model"):
        assert eval_main(["--model", str(model), "--bpb", str(text), "--device", "cpu"]) == 0
        assert "bits per byte on" in capsys.readouterr().out
        bpb.append(bits_per_byte(*load_model(str(model), "cpu"), [text.read_text()]))  # the figure eval prints
    assert bpb[0] == bpb[1], bpb  # the same model: the same number, not merely the same 4 printed decimals


@pytest.fixture(scope="module")
def whole_bf16_run(whole_run, tmp_path_factory):
    """``whole_run``'s checkpoint as an ``amp_bf16`` run saves it (float32 weights; its recipe says amp_bf16), so
    loading it computes in bfloat16."""
    from omegaconf import OmegaConf as om

    from vocagno.training.checkpoint import load_checkpoint

    checkpoint = load_checkpoint(str(whole_run / "ep0-ba2-rank0.pt"))
    recipe = checkpoint["state"]["callbacks"]["RunRecipe"]
    cfg = om.create(recipe["yaml"])
    cfg.precision = "amp_bf16"
    recipe["yaml"] = om.to_yaml(cfg)
    path = tmp_path_factory.mktemp("whole_bf16") / "ep0-ba2-rank0.pt"
    torch.save(checkpoint, path)
    return path


def few_shot_prompt(min_tokens: int = 1024) -> str:
    """The longest GSM8K question's 8-shot chain-of-thought prompt as ``vocagno.eval`` builds it, with the answer a
    perfect model writes under it: the text the last generated tokens attend to."""
    from vocagno.eval.benchmarks import SHIPPED_DATA, load_benchmark
    from vocagno.core.tokenization import load_tokenizer

    longest = max(load_benchmark("gsm8k", SHIPPED_DATA), key=lambda example: len(example.prompt))
    text = longest.prompt + longest.gold_output
    assert len(load_tokenizer("llama2")(text)["input_ids"]) >= min_tokens
    return text


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["whole", pytest.param("sharded", marks=pytest.mark.distributed)])
def test_a_bf16_checkpoint_evaluates_exactly_as_its_export_on_a_few_shot_prompt(kind, request, tmp_path):
    """Loaded by ``vocagno.eval``, a checkpoint of an amp_bf16 run and its export give the same logits to the last
    bit over a 1,000+-token prompt: RoPE's frequencies stay float32 in both, as transformers computes them."""
    from vocagno.training.models import load_model

    checkpoint = request.getfixturevalue("whole_bf16_run" if kind == "whole" else "sharded_run")
    assert export_main([str(checkpoint), str(tmp_path / "model")]) == 0
    prompt = few_shot_prompt()
    outputs = []
    for location in (checkpoint, tmp_path / "model"):
        model, tokenizer = load_model(str(location), "cpu")
        assert next(model.parameters()).dtype == torch.bfloat16
        with torch.no_grad():
            outputs.append(model(tokenizer(prompt, return_tensors="pt")["input_ids"]).logits)
    torch.testing.assert_close(outputs[0], outputs[1], rtol=0, atol=0)


def rotary_buffers_below_float32(model) -> list[str]:
    """RoPE's buffers (``inv_freq``, which transformers computes in float32) held in a narrower dtype."""
    return [f"{name}: {buffer.dtype}" for name, buffer in model.named_buffers()
            if "rotary" in name and buffer.is_floating_point() and torch.finfo(buffer.dtype).bits < 32]


@pytest.mark.slow
@pytest.mark.distributed  # the sharded checkpoint is written by 2 gloo processes
def test_no_path_that_builds_or_loads_a_bf16_model_narrows_its_rotary_frequencies(whole_bf16_run, sharded_run,
                                                                                  tmp_path):
    from transformers import AutoModelForCausalLM

    from vocagno.training.checkpoint import model_from_checkpoint
    from vocagno.teacher.config import build_causal_lm
    from vocagno.training.config import load_config
    from vocagno.training.models import load_model
    from vocagno.teacher.model import load_teacher
    from vocagno.core.tokenization import load_tokenizer

    assert export_main([str(sharded_run), str(tmp_path / "model")]) == 0
    tiny = load_config(str(REPO / "yamls" / "tiny.yaml"), ["teacher.dtype=bfloat16", "model.dtype=bfloat16"])
    qwen = load_config(str(REPO / "yamls" / "tiny_qwen.yaml"), ["teacher.dtype=bfloat16"])
    models = {
        "teacher online (VocAgnoLM's load_teacher)": load_teacher("tiny-math-teacher", "bfloat16"),
        "teacher of the scoring pass, by name": scoring_teacher(tiny, "tiny.yaml").load(),
        "teacher of the scoring pass, from a config": scoring_teacher(qwen, "tiny_qwen.yaml").load(),
        "student of train.py": build_causal_lm(tiny.model, len(load_tokenizer(tiny.tokenizer.name)), tiny.seed),
        "whole checkpoint": model_from_checkpoint(str(whole_bf16_run))[0],
        "sharded checkpoint": model_from_checkpoint(str(sharded_run))[0],
        "export": AutoModelForCausalLM.from_pretrained(tmp_path / "model", torch_dtype="auto"),
        # vocagno.selection --student loads with vocagno.training.models.load_model too.
        "eval and selection --student, a sharded checkpoint": load_model(str(sharded_run), "cpu")[0],
        "eval and selection --student, a whole checkpoint": load_model(str(whole_bf16_run), "cpu")[0],
        "eval and selection --student, an export": load_model(str(tmp_path / "model"), "cpu")[0],
    }
    for where, model in models.items():
        assert next(model.parameters()).dtype == torch.bfloat16, where
        assert any("rotary" in name for name, _ in model.named_buffers()), where
    narrowed = {where: found for where, model in models.items() if (found := rotary_buffers_below_float32(model))}
    assert not narrowed, narrowed


def refused(args, capsys, *, names):
    assert ends(export_main, [str(a) for a in args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and names in err, err
    return err


@pytest.mark.slow
@pytest.mark.distributed  # the sharded checkpoint is written by 2 gloo processes
def test_a_missing_shard_is_named_and_nothing_is_written(sharded_run, tmp_path, capsys):
    broken = tmp_path / "ep0-ba2"
    shutil.copytree(sharded_run / "ep0-ba2", broken)
    (broken / "__1_0.distcp").unlink()
    refused([broken, tmp_path / "out"], capsys, names="shards missing: __1_0.distcp")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ep0-ba2"]  # no OUT, no partial folder


def test_an_existing_out_is_refused_unless_overwrite(whole_run, tmp_path, capsys):
    out = tmp_path / "model"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    refused([whole_run, out], capsys, names="exists: give another OUT, or --overwrite")
    assert [p.name for p in out.iterdir()] == ["mine.txt"]
    assert export_main([str(whole_run), str(out), "--overwrite"]) == 0
    assert not (out / "mine.txt").exists() and (out / "model.safetensors").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_an_out_inside_the_checkpoint_or_holding_it_is_refused(whole_run, capsys):
    for out in (whole_run / "model", whole_run.parent):
        refused([whole_run, out], capsys, names=f"{out}: OUT holds or lies inside the checkpoint")
    assert not (whole_run / "model").exists()


def test_what_is_not_a_checkpoint_gets_one_line(tmp_path, capsys):
    (tmp_path / "notes.pt").write_text("not a checkpoint")
    (tmp_path / "folder").mkdir()
    (tmp_path / "shards").mkdir()
    (tmp_path / "shards" / "__0_0.distcp").write_bytes(b"half a save")
    refused([tmp_path / "notes.pt", tmp_path / "out"], capsys, names="notes.pt: not a checkpoint")
    refused([tmp_path / "nothing", tmp_path / "out"], capsys, names="nothing: no such file or folder")
    refused([tmp_path / "folder", tmp_path / "out"], capsys, names="folder: not a checkpoint")
    refused([tmp_path / "shards", tmp_path / "out"], capsys, names="shards: an incomplete sharded checkpoint")
    torch.save({"state": {"model": {}}}, tmp_path / "other.pt")
    refused([tmp_path / "other.pt", tmp_path / "out"], capsys, names="not a checkpoint of a Hugging Face model")
    assert not (tmp_path / "out").exists()


class RunsACommand:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_crafted_sharded_checkpoint_is_refused_and_runs_nothing(tmp_path, capsys):
    import pickle

    crafted = tmp_path / "ep0-ba2"
    crafted.mkdir()
    (crafted / ".metadata").write_bytes(pickle.dumps(RunsACommand(tmp_path / "pwned")))
    refused([crafted, tmp_path / "out"], capsys, names="refused to load: not torch.distributed.checkpoint's metadata")
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_checkpoint_whose_tokenizer_is_not_its_models_is_refused(whole_run, tmp_path, capsys):
    from composer.models import HuggingFaceModel

    from vocagno.training.checkpoint import load_checkpoint
    from vocagno.core.tokenization import load_tokenizer

    checkpoint = load_checkpoint(str(whole_run / "ep0-ba2-rank0.pt"))
    student = student_with(checkpoint["state"]["model"])
    saved = HuggingFaceModel(student, tokenizer=load_tokenizer("qwen2.5"), allow_embedding_resizing=True)
    checkpoint["state"]["integrations"]["huggingface"]["tokenizer"] = saved.get_metadata()["tokenizer"]
    torch.save(checkpoint, tmp_path / "mixed.pt")
    capsys.readouterr()  # Composer's warning about the resizing above, the first time this process makes one
    refused([tmp_path / "mixed.pt", tmp_path / "out"], capsys, names="tokenizer has 151665 tokens and its model "
                                                                      "embeds 32000")


# ---- an object store: moto's S3 server on this machine (conftest.py's s3) ----

def upload(client, folder: Path, prefix: str) -> None:
    for path in sorted(folder.rglob("*")):
        if path.is_file() and not path.is_symlink() and path.name != "reference.pt":
            client.upload_file(str(path), "runs", f"{prefix}/{path.relative_to(folder)}")


@pytest.mark.slow
@pytest.mark.distributed  # the sharded checkpoint is written by 2 gloo processes
def test_a_sharded_checkpoint_in_s3_exports_by_its_folder_and_by_its_save_folder(s3, sharded_run, tmp_path,
                                                                                monkeypatch):
    env, client = s3
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    upload(client, sharded_run, "sharded")
    client.put_object(Bucket="runs", Key="sharded/latest-rank0.pt.symlink", Body=b"sharded/ep0-ba2")
    expected = logits(student_with(torch.load(sharded_run / "reference.pt")["model"]))
    for i, uri in enumerate(["s3://runs/sharded/ep0-ba2", "s3://runs/sharded"]):
        assert export_main([uri, str(tmp_path / f"m{i}"), "--dtype", "float32"]) == 0
        torch.testing.assert_close(logits(from_pretrained(tmp_path / f"m{i}")), expected, rtol=0, atol=0)


def test_an_unreachable_or_empty_store_gets_one_line(s3, tmp_path, monkeypatch, capsys):
    env, _ = s3
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    refused(["s3://runs/nothing-here", tmp_path / "out"], capsys, names="s3://runs/nothing-here: no checkpoint there")
    refused(["s3://no-such-bucket/run", tmp_path / "out"], capsys, names="the object store can't be read: NoSuchBucket")
    monkeypatch.setenv("S3_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens on the discard port
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    refused(["s3://runs/tiny", tmp_path / "out"], capsys, names="the object store can't be read")
    refused(["gopher://runs/tiny", tmp_path / "out"], capsys, names="gopher://runs/tiny: no object store for it")
    assert not (tmp_path / "out").exists()


# ---- autoresume's repair of sharded and remote save folders ----

class Interrupts:
    """Pickled, it raises KeyboardInterrupt, as Ctrl-C or SIGTERM lands in the middle of ``torch.save``."""

    def __reduce__(self):
        raise KeyboardInterrupt


def test_a_whole_save_interrupted_while_pickling_is_removed_and_latest_points_to_the_last_complete_one(tmp_path,
                                                                                                       capsys):
    """torch.save's zip writer closes its zip on the way out of an interruption: a complete zip holding only the
    records written before data.pkl (version, byteorder). It is a save cut short, not a checkpoint to resume from."""
    folder = tmp_path / "run"
    folder.mkdir()
    torch.save({"state": {"weights": torch.ones(3)}}, folder / "ep0-ba2-rank0.pt")
    with pytest.raises(KeyboardInterrupt):
        torch.save({"state": Interrupts()}, folder / "ep0-ba4-rank0.pt")
    os.symlink("ep0-ba2-rank0.pt", folder / "latest-rank0.pt")
    repair(str(folder))
    assert "removing " + str(folder / "ep0-ba4-rank0.pt") + ": an incomplete checkpoint" in capsys.readouterr().out
    assert sorted(p.name for p in folder.iterdir()) == ["ep0-ba2-rank0.pt", "latest-rank0.pt"]
    assert os.readlink(folder / "latest-rank0.pt") == "ep0-ba2-rank0.pt"


@pytest.mark.slow
@pytest.mark.distributed  # the sharded checkpoint is written by 2 gloo processes
def test_a_sharded_save_cut_short_is_removed_and_latest_points_to_the_last_complete_one(sharded_run, tmp_path, capsys):
    folder = tmp_path / "run"
    shutil.copytree(sharded_run, folder, symlinks=True)
    (folder / "ep0-ba2" / ".metadata").unlink()  # killed before rank 0 wrote the index, which comes last
    (folder / "ep0-ba3").mkdir()  # killed right after making the folder
    repair(str(folder))
    assert capsys.readouterr().out.count("removing") == 2
    assert sorted(p.name for p in folder.iterdir() if p.name.startswith("ep")) == ["ep0-ba1"]
    assert os.readlink(folder / "latest-rank0.pt") == "ep0-ba1"
    assert export_main([str(folder), str(tmp_path / "model")]) == 0


@pytest.mark.slow
@pytest.mark.distributed  # the sharded checkpoint is written by 2 gloo processes
def test_a_sharded_checkpoint_missing_a_shard_is_no_save_cut_short_and_stops_autoresume(sharded_run, tmp_path):
    """.metadata is written after every shard, so a shard missing beside it (lost, or on another node's disk) is
    no proof of a save cut short: repair names it, stops, and deletes nothing."""
    folder = tmp_path / "run"
    shutil.copytree(sharded_run, folder, symlinks=True)
    (folder / "ep0-ba2" / "__1_0.distcp").unlink()
    before = sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))
    with pytest.raises(BadCheckpoint, match=r"ep0-ba2: a sharded checkpoint with shards missing: __1_0.distcp: "
                                            r"autoresume can't tell .* leaves it in place"):
        repair(str(folder))
    assert sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) == before


@pytest.mark.slow
@pytest.mark.distributed  # the sharded checkpoint is written by 2 gloo processes
def test_a_remote_save_folder_loses_its_cut_short_upload_and_its_latest_is_repointed(s3, sharded_run, monkeypatch):
    env, client = s3
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    upload(client, sharded_run, "cut")
    client.put_object(Bucket="runs", Key="cut/ep0-ba3/__0_0.distcp", Body=b"a shard whose upload was cut")
    client.delete_object(Bucket="runs", Key="cut/ep0-ba2/__1_0.distcp")  # the latest's upload cut short
    client.put_object(Bucket="runs", Key="cut/latest-rank0.pt.symlink", Body=b"cut/ep0-ba2")
    repair("s3://runs/cut")
    assert not [k for k in keys(client, "cut/") if k.startswith(("cut/ep0-ba3", "cut/ep0-ba2"))]
    assert client.get_object(Bucket="runs", Key="cut/latest-rank0.pt.symlink")["Body"].read() == b"cut/ep0-ba1"
    repair("s3://runs/cut")  # a repaired folder is left as it is
    assert client.get_object(Bucket="runs", Key="cut/latest-rank0.pt.symlink")["Body"].read() == b"cut/ep0-ba1"
    with pytest.raises(BadCheckpoint, match="no object store"):
        repair("gopher://runs/cut")


# What an attacker writes into a recipe's field, a run's name, a folder's name or a results.json's reason: each would
# be a heading, a table cell, a fence's end, a link, an image, HTML or a terminal's escape if written raw.
INJECTIONS = ["tiny\n# Injected heading\n\n| evaluation | 99.9 |\n|---|---|\n| GSM8K | 99.9 |",
              "a | b | c", "```\n# after the fence\n```", "````", "<script>alert(1)</script><img src=x onerror=1>",
              "[click](javascript:alert(1)) ![i](http://x/i.png)", "**b** _i_ `c` ~~s~~", "\x1b]0;title\x07\x1b[2J",
              "evil\u202etxt", "x\\|y\\", "  - list\n> quote", "&lt;b&gt;"]
MARKUP_OF_A_FIELD = ("<script", "<img", "<a ", "<strong", "<em", "<blockquote", "<ul", "<li")


def card_of(recipe_overrides=None, run_name=None, checkpoint="runs/x/ep0-ba2-rank0.pt", folder="model",
            results=None, eval_dir=None, yaml_tail=""):
    """The card ``model_card`` writes for the tiny yaml's recipe with ``recipe_overrides`` (dotted keys to values,
    any string), stored as ``train.py`` stores it."""
    from omegaconf import OmegaConf as om
    from transformers import LlamaConfig, LlamaForCausalLM

    from vocagno.training.config import load_config
    from vocagno.export import model_card

    cfg = load_config(str(REPO / "yamls" / "tiny.yaml"), [])
    for key, value in (recipe_overrides or {}).items():
        om.update(cfg, key, value, force_add=True)
    if run_name is not None:
        cfg.run_name = run_name
    state = {"callbacks": {"RunRecipe": {"yaml": om.to_yaml(cfg, resolve=True) + yaml_tail}},
             "timestamp": {"Timestamp": {"token": 2048, "batch": 2, "sample": 16}}}
    model = LlamaForCausalLM(LlamaConfig(vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                                         num_attention_heads=1))
    return model_card(checkpoint, folder, state, model, results, eval_dir), om.to_yaml(cfg, resolve=True) + yaml_tail


def render(card: str) -> str:
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark").enable("table").render(card.split("---\n", 2)[2])  # past the front matter


def structure(page: str) -> dict:
    import re

    return {"headings": re.findall(r"<h(\d)>", page), "tables": page.count("<table>"), "pre": page.count("<pre>"),
            "cells per row": sorted({row.count("<td>") for row in re.findall(r"<tr>(.*?)</tr>", page, re.S)
                                     if "<td>" in row}),
            "rows": page.count("<tr>")}


def text_of(fragment: str) -> str:
    import html
    import re

    return html.unescape(re.sub(r"<[^>]+>", "", fragment))


HONEST_RESULTS = {"gsm8k": 12.5, "svamp": 50.0, "partial": {"gsm8k": "the first 2 of 1,319 questions (--limit)"}}


def test_an_honest_card_states_where_each_part_came_from():
    card, yaml = card_of(results=HONEST_RESULTS, eval_dir="evals/tiny")
    page = render(card)
    assert structure(page) == {"headings": ["1", "2", "2", "2"], "tables": 2, "pre": 2, "cells per row": [3],
                               "rows": 12}  # the recipe table's head and 9 rows, the results' head and row
    assert "<h1>tiny</h1>" in page
    for row in ("<td>name</td>\n<td>tiny</td>\n<td>the checkpoint's stored recipe (run_name)</td>",
                "<td>teacher</td>\n<td><code>tiny-math-teacher</code>, tokenizer <code>mistral</code></td>\n"
                "<td>the checkpoint's stored recipe</td>",
                "<td>weights</td>\n<td>", "<td>computed by vocagno.export from the weights</td>",
                "<td>2,048 student tokens, 2 batches, 16 samples</td>\n<td>the checkpoint's timestamp</td>",
                "<td><code>runs/x/ep0-ba2-rank0.pt</code></td>\n<td>vocagno.export's command line</td>"):
        assert row in page, row
    assert "from <code>evals/tiny/results.json</code>" in page
    assert "<p>* partial, not the benchmark's score: GSM8K: the first 2 of 1,319 questions (--limit)</p>" in page
    assert "from the checkpoint's stored recipe" in text_of(page.split("<h2>The run's yaml</h2>")[1])
    assert text_of(page.split('<code class="language-yaml">')[1].split("</code>")[0]) == yaml.rstrip("\n") + "\n"
    assert '<code class="language-python">' in page and "from_pretrained(&quot;model&quot;)" in page


def test_the_cards_tags_and_first_sentence_come_from_the_run_not_the_papers_setting():
    guided, _ = card_of(results=HONEST_RESULTS, eval_dir="evals/tiny")
    assert guided.startswith("---\nlibrary_name: transformers\ntags: [vocagno, vocagnolm, math]\n---\n")
    assert "trained with vocagno: VocAgnoLM (Shin et al., ICML 2025), teacher guided language modeling" in guided
    plain, _ = card_of({"algorithms": None, "teacher": None})  # a corpus of docstrings, no benchmark run
    assert plain.startswith("---\nlibrary_name: transformers\ntags: [vocagno]\n---\n")
    assert "trained with vocagno: plain continual pretraining, without a teacher." in plain
    assert "math" not in plain.split("---")[1] and "Table 1" not in plain
    distilled, _ = card_of({"algorithms": {"vocagno": None, "uld": {}}})
    assert "tags: [vocagno, uld]" in distilled and "Universal Logit Distillation" in distilled


@pytest.mark.parametrize("attack", INJECTIONS)
def test_no_field_of_a_recipe_a_name_or_a_results_file_adds_structure_to_the_card(attack):
    from vocagno.shown import terminal

    fields = {"model.config.model_type": attack, "teacher.name_or_path": attack, "tokenizer.name": attack,
              "teacher.tokenizer": attack, "train_loader.dataset.local": attack, "precision": attack,
              "algorithms.vocagno.aggregation": attack, f"algorithms.{attack}": {"x": attack}}
    card, yaml = card_of(fields, run_name=attack, checkpoint=f"runs/{attack}/ep0", folder=attack,
                         results={**HONEST_RESULTS, "partial": {"gsm8k": attack}}, eval_dir=f"evals/{attack}",
                         # in a comment's lines, but a control character, which no yaml holds
                         yaml_tail="# " + attack.replace("\n", "\n# ") + "\n" if "\x1b" not in attack else "")
    page = render(card)
    assert structure(page) == {"headings": ["1", "2", "2", "2"], "tables": 2, "pre": 2, "cells per row": [3],
                               "rows": 13}, page  # the rows of an honest card and the attack's algorithm
    for markup in MARKUP_OF_A_FIELD:
        assert markup not in page, markup
    assert "\x1b" not in card and "\u202e" not in card
    # as the terminal shows it (a heading's leading and trailing spaces aside, which markdown drops)
    assert text_of(page.split("<h1>")[1].split("</h1>")[0]) == terminal(attack).strip(" ")
    shown = text_of(page.split('<code class="language-yaml">')[1].split("</code>")[0])
    assert shown == yaml.rstrip("\n").replace("\x1b", "\\x1b").replace("\x07", "\\x07").replace(
        "\u202e", "\\u202e") + "\n"
    assert terminal(attack) in text_of(page.split("</table>")[0])  # the recipe's fields, shown as characters


def test_a_mixture_streams_name_adds_no_cell():
    card, _ = card_of({"train_loader.dataset.local": None,
                       "train_loader.dataset.streams": {"a | b": {"local": "/tmp/x | y", "proportion": 0.5}}})
    assert structure(render(card))["cells per row"] == [3]


def test_a_timestamps_count_that_is_no_number_is_shown_as_its_characters():
    from vocagno.export import model_card
    from transformers import LlamaConfig, LlamaForCausalLM

    state = {"timestamp": {"Timestamp": {"token": "1 | 2 <img src=x>\n# h", "batch": 2, "sample": True}}}
    model = LlamaForCausalLM(LlamaConfig(vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                                         num_attention_heads=1))
    page = render(model_card("runs/x", "x", state, model))
    assert structure(page)["cells per row"] == [3] and "<img" not in page and "<h1>x</h1>" in page
    assert "<td>1 | 2 &lt;img src=x&gt;\\n# h student tokens, 2 batches, True samples</td>" in page
