"""Run by tests/integration/test_llmfoundry.py with the Python of a venv holding llm-foundry 0.22 and vocagno (one resolve).

    python tests/support/llmfoundry_run.py WORKDIR

Builds a tiny random-init Llama student (TinyLlama's tokenizer) and Qwen2 teacher (Qwen2.5's tokenizer) as Hugging
Face folders, makes a token MDS with llm-foundry's own ``convert_dataset_json`` and vocagno shards with
``conversion/convert_dataset.py`` from the same GSM8K text, then trains with llm-foundry's ``train_from_yaml``:
(a) its ``text`` loader plus ``algorithms: {vocagno: {teacher: DIR}}``, (b) ``train_loader: {name: vocagno}``,
(c) the same on shards scored by ``python -m vocagno.score`` with ``teacher_losses: cached``, (d) ``name: vocagno`` on
a mixture (``dataset.streams``, as llm-foundry writes them), (e) two teachers of two vocabularies (``teachers:``, a
tiny Mistral-vocabulary teacher beside the Qwen2.5 one) on our shards with 2 loader workers and on its ``text``
loader; (f) docs/drop-in.md's ``yamls/llm-foundry/tiny.yaml``, llm-foundry's own MPT student guided by the shipped
teacher. Prints one JSON line per run: the logged
``loss/train/kept_fraction`` and per-stream (``vocagno/...``) values, whether a teacher was loaded, the installed
versions.
"""

import json
import os
import shutil
import sys
from importlib.metadata import version
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # `conversion` is a folder of the repo

import torch  # noqa: E402
from composer.loggers import InMemoryLogger  # noqa: E402
from llmfoundry.command_utils import train_from_yaml  # noqa: E402
from llmfoundry.command_utils.data_prep.convert_dataset_json import convert_dataset_json  # noqa: E402
from omegaconf import OmegaConf as om  # noqa: E402
from transformers import (  # noqa: E402
    LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM,
)

from vocagno.conversion.convert import main as convert_main  # noqa: E402
from vocagno import score  # noqa: E402
from vocagno.algorithms.vocagno_lm import VocAgnoLM  # noqa: E402
from vocagno.core.tokenization import ASSETS, load_tokenizer  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SEQ_LEN = 128
TEXT = ASSETS / "text" / "gsm8k_train_500.jsonl"


def tiny_model(config_class, model_class, tokenizer_name: str, folder: Path) -> str:
    torch.manual_seed(0)
    tokenizer = load_tokenizer(tokenizer_name)
    config = config_class(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                          bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    model_class(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def run(work: Path, name: str, train_loader: dict, student: str, teacher: str | None, **options) -> dict:
    config = {
        "run_name": name,
        "seed": 0,
        "max_seq_len": SEQ_LEN,
        "model": {"name": "hf_causal_lm", "pretrained_model_name_or_path": student, "pretrained": True},
        "tokenizer": {"name": student, "kwargs": {"model_max_length": SEQ_LEN}},
        "train_loader": train_loader,
        "algorithms": {"vocagno": {**({"teacher": {"name_or_path": teacher, "dtype": "float32"}} if teacher else {}),
                                   **options}},
        "optimizer": {"name": "decoupled_adamw", "lr": 1.0e-3, "weight_decay": 0.0},
        "scheduler": {"name": "constant_with_warmup", "t_warmup": "0ba"},
        "max_duration": "3ba",
        "eval_interval": 1,
        "global_train_batch_size": 4,
        "device_train_microbatch_size": 2,
        "device_eval_batch_size": 2,
        "precision": "fp32",
        "progress_bar": False,
        "log_to_console": False,
        "loggers": {"inmemory": {}},
    }
    yaml = work / f"{name}.yaml"
    yaml.write_text(om.to_yaml(config))
    return result(name, train_from_yaml(str(yaml)))


def result(name: str, trainer) -> dict:
    memory = next(d for d in trainer.logger.destinations if isinstance(d, InMemoryLogger))
    kept = [float(value) for _, value in memory.data.get("loss/train/kept_fraction", [])]
    streams = {k: [float(v) for _, v in values] for k, values in memory.data.items()
               if k.startswith(("vocagno/stream_share/", "vocagno/kept_fraction/"))}
    shares = {k: [float(v) for _, v in values] for k, values in memory.data.items()
              if k.startswith("vocagno/teacher_share/")}
    algorithm = next(a for a in trainer.state.algorithms if isinstance(a, VocAgnoLM))
    return {"run": name, "kept_fraction": kept, "streams": streams, "shares": shares,
            "batches": int(trainer.state.timestamp.batch),
            "teacher_loaded": algorithm.scorer is not None,
            "collate": type(trainer.state.train_dataloader.collate_fn).__name__}


def drop_in(work: Path, student: str) -> dict:
    """docs/drop-in.md's yaml, yamls/llm-foundry/tiny.yaml, as ``llmfoundry train`` runs it: llm-foundry's own MPT
    student guided by the shipped tiny teacher (Mistral's tokenizer) on vocagno shards; its data and the student's
    tokenizer (a folder: no hub here) given as overrides, 3 batches."""
    convert_main(["--input", str(TEXT), "--student-tokenizer", "llama2", "--teacher-tokenizer", "mistral",
                  "--seq-len", str(SEQ_LEN), "--out-root", str(work / "mistral-shards")])
    trainer = train_from_yaml(str(REPO / "yamls" / "llm-foundry" / "tiny.yaml"), [
        f"variables.data={work / 'mistral-shards'}", f"tokenizer.name={student}", "max_duration=3ba",
        "log_to_console=false"])
    assert type(trainer.state.model).__name__ == "ComposerMPTCausalLM"
    return result("drop-in-yaml", trainer)


def main(work: Path) -> None:
    student = tiny_model(LlamaConfig, LlamaForCausalLM, "llama2", work / "student")
    teacher = tiny_model(Qwen2Config, Qwen2ForCausalLM, "qwen2.5", work / "teacher")
    second = tiny_model(MistralConfig, MistralForCausalLM, "mistral", work / "second")
    teachers = {"qwen": {"name_or_path": teacher, "dtype": "float32"},
                "mistral": {"name_or_path": second, "dtype": "float32"}}
    convert_dataset_json(path=str(TEXT), out_root=str(work / "tokens"), compression=None, concat_tokens=SEQ_LEN,
                         split="train", tokenizer=student, eos_text="</s>")
    convert_main(["--input", str(TEXT), "--student-tokenizer", student, "--teacher-tokenizer", teacher,
                  "--seq-len", str(SEQ_LEN), "--out-root", str(work / "shards")])
    # The cached run reads 100 held-out problems, scored once (a smaller corpus: the CPU scores ~2K tokens/s).
    convert_main(["--input", str(ASSETS / "text" / "gsm8k_heldout_100.jsonl"), "--student-tokenizer", student,
                  "--teacher-tokenizer", teacher, "--seq-len", str(SEQ_LEN), "--out-root", str(work / "few")])
    assert score.main(["--shards", str(work / "few"), "--teacher", teacher, "--dtype", "float32", "--device", "cpu",
                       "--out", str(work / "scored")]) == 0
    for name, shards in (("gsm8k", "shards"), ("heldout", "few")):  # each stream's own local, as Streaming asks
        shutil.copytree(work / shards, work / "mixture" / name)
    versions = {p: version(p) for p in ("llm-foundry", "mosaicml-streaming", "transformers", "datasets")}
    runs = [
        run(work, "text-loader", {"name": "text", "dataset": {"local": str(work / "tokens"), "split": None,
            "shuffle": False, "max_seq_len": SEQ_LEN}, "drop_last": True, "num_workers": 0, "prefetch_factor": None,
            "persistent_workers": False}, student, teacher),
        # The same with 2 workers: the algorithm has them make the teacher side (WithTeacherSide).
        run(work, "text-loader-workers", {"name": "text", "dataset": {"local": str(work / "tokens"), "split": None,
            "shuffle": False, "max_seq_len": SEQ_LEN}, "drop_last": True, "num_workers": 2}, student, teacher),
        run(work, "vocagno-loader", {"name": "vocagno", "dataset": {"local": str(work / "shards"), "shuffle": False},
            "drop_last": True, "num_workers": 0}, student, teacher),
        run(work, "vocagno-loader-cached", {"name": "vocagno", "dataset": {"local": str(work / "scored"),
            "shuffle": False}, "drop_last": True, "num_workers": 0}, student, teacher, teacher_losses="cached"),
        run(work, "vocagno-loader-mixture", {"name": "vocagno", "dataset": {"streams": {
            name: {"local": str(work / "mixture" / name), "proportion": 0.5} for name in ("gsm8k", "heldout")},
            "shuffle": True, "epoch_size": 64}, "drop_last": True, "num_workers": 0}, student, teacher),
        # Two teachers: the Qwen2.5 one reads the shards' teacher tokens, the Mistral one's are made in the workers.
        run(work, "vocagno-loader-two-teachers", {"name": "vocagno", "dataset": {"local": str(work / "shards"),
            "shuffle": False}, "drop_last": True, "num_workers": 2}, student, None, teachers=teachers),
        run(work, "text-loader-two-teachers", {"name": "text", "dataset": {"local": str(work / "tokens"),
            "split": None, "shuffle": False, "max_seq_len": SEQ_LEN}, "drop_last": True, "num_workers": 0,
            "prefetch_factor": None, "persistent_workers": False}, student, None, teachers=teachers, combine="mean"),
        drop_in(work, student),
    ]
    for one in runs:
        print(json.dumps({**one, "versions": versions}), flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
