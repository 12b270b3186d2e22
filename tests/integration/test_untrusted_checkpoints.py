"""A checkpoint, a model folder or a tokenizer someone else wrote, played as the attacker through the real entry
points (``train.py``'s ``load_path``, ``vocagno.export``, ``vocagno.eval --model``): what each would have run, read,
allocated or written through, refused in one line before it happens."""

import copy
import io
import json
import os
import resource
import stat
import sys
import tempfile
import time
from pathlib import Path

import pytest
from helpers import ends, script
import torch
from test_untrusted import RunsACommand, dcp_save, gadgets, store, whole_with  # noqa: F401 (store: a fixture)
from transformers import LlamaConfig, LlamaForCausalLM

from vocagno.training.checkpoint import BadCheckpoint
from vocagno.eval.__main__ import main as eval_main
from vocagno.export import main as export_main
from vocagno.core.tokenization import load_tokenizer
from vocagno.doors.untrusted import UntrustedFile

REPO = Path(__file__).resolve().parents[2]
VOCAB = 32001  # llama2's 32,000 tokens and one a tokenizer from elsewhere may add


@pytest.fixture(scope="module")
def state(tmp_path_factory) -> dict:
    """A checkpoint's state as Composer's HuggingFaceModel saves one: a tiny Llama (8 wide, one layer) and llama2's
    tokenizer files, each as ``{file_extension, content}``."""
    folder = tmp_path_factory.mktemp("tokenizer")
    load_tokenizer("llama2").save_pretrained(folder)
    files = {}
    for path in sorted(folder.iterdir()):
        if path.suffix == ".json":
            files[path.name] = {"file_extension": ".json", "content": json.loads(path.read_text())}
        elif path.suffix == ".model":
            files[path.name] = {"file_extension": ".model", "content": path.read_bytes()}
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64))
    return {"state": {"model": {f"model.{key}": value for key, value in model.state_dict().items()},
                      "integrations": {"huggingface": {"model": {"config": {"content": model.config.to_dict()}},
                                                       "tokenizer": files}}}}


def saved(state: dict, path: Path, config: dict | None = None, tokenizer_config: dict | None = None) -> Path:
    """``state`` saved whole at ``path``, its model config and tokenizer_config.json updated by what is given."""
    state = copy.deepcopy(state)
    huggingface = state["state"]["integrations"]["huggingface"]
    huggingface["model"]["config"]["content"].update(config or {})
    huggingface["tokenizer"]["tokenizer_config.json"]["content"].update(tokenizer_config or {})
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, path)
    return path


def snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): (os.readlink(p) if p.is_symlink() else p.read_bytes() if p.is_file() else "",
                                       os.lstat(p).st_mode) for p in sorted(root.rglob("*"))}


def one_error_line(capsys, *needles: str) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert all(needle in err[0] for needle in needles), (needles, err[0])
    return err[0]


# ---- 1. train.py's load_path: Composer would load it with torch.load(weights_only=False) ----

def test_a_gadget_given_as_load_path_to_train_py_runs_nothing(tmp_path):
    marker = tmp_path / "ran"
    (tmp_path / "shared").mkdir()
    checkpoint = whole_with(gadgets(marker)["os.system"], tmp_path / "shared" / "ep0-ba1-rank0.pt")
    command = [sys.executable, str(REPO / "train.py"), str(REPO / "yamls" / "tiny.yaml"),
               f"variables.data={tmp_path}/shards/train", "eval_loader=null", "selection_report=null",
               "loggers.console=null", "loggers.picture=null", "progress_bar=false", "max_duration=1ba",
               f"callbacks.load_checkpoint.load_path={checkpoint}"]
    result = script(command[1], command[2:], cwd=REPO)
    assert not marker.exists(), "the checkpoint's pickle ran"
    # one line, the last (torch may warn before it about the pickle's protocol), and no traceback
    err = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 2 and len(err) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.rstrip().endswith(err[0])
    assert err[0].startswith("error: callbacks.load_checkpoint.load_path: ") and checkpoint.name in err[0], err
    assert "refused to load" in err[0]
    assert not (tmp_path / "shards").exists(), "the run went on before checking what it loads"


@pytest.fixture
def own_temporary_folder(tmp_path, monkeypatch):
    """The private folders a test makes, in a temporary folder of its own (removed with the test's)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir(mode=0o700)


def test_a_load_path_in_a_store_or_on_disk_is_taken_into_a_private_folder_and_checked_there(store, tmp_path,
                                                                                            own_temporary_folder):
    """What train.py calls for a load_path: a store's whole file or sharded checkpoint downloaded into a private
    folder, a local one copied there, and checked there; what is refused leaves nothing loadable behind."""
    from vocagno.training.checkpoint import private_folder, take

    marker = tmp_path / "ran"
    torch.save({"state": {"timestamp": RunsACommand(marker)}}, tmp_path / "evil.pt")
    store.upload_file(str(tmp_path / "evil.pt"), "runs", f"{tmp_path.name}/ep0-ba1-rank0.pt")
    sharded = dcp_save({"state": {"model": {"w": torch.ones(2)}, "timestamp": RunsACommand(marker)}},
                       tmp_path / "ep0-ba2")
    for path in sharded.iterdir():
        store.upload_file(str(path), "runs", f"{tmp_path.name}/ep0-ba2/{path.name}")
    for location in (f"s3://runs/{tmp_path.name}/ep0-ba1-rank0.pt", f"s3://runs/{tmp_path.name}/ep0-ba2",
                     str(tmp_path / "evil.pt"), str(sharded)):
        private = private_folder()
        with pytest.raises(BadCheckpoint, match="refused to load: it holds objects that are not tensors"):
            take(location, private)
    with pytest.raises(BadCheckpoint, match="not a checkpoint: a folder without .metadata"):
        take(str(tmp_path), private_folder())
    torch.save({"state": {"model": {"w": torch.ones(2)}}}, tmp_path / "good.pt")
    store.upload_file(str(tmp_path / "good.pt"), "runs", f"{tmp_path.name}/good.pt")
    for location in (f"s3://runs/{tmp_path.name}/good.pt", str(tmp_path / "good.pt")):
        private = private_folder()
        copy = take(location, private)
        assert copy == private / "checkpoint.pt" and copy.read_bytes() == (tmp_path / "good.pt").read_bytes()
        assert stat.S_IMODE(private.stat().st_mode) == 0o700 and private.parent == Path(tempfile.gettempdir())
    assert not marker.exists()


def test_a_checkpoint_swapped_after_its_check_changes_nothing_composer_loads(tmp_path, own_temporary_folder):
    """Composer unpickles what it loads with weights_only=False: it is handed the private copy, so a checkpoint
    renamed over the checked one a moment later (someone who can write the save folder) is never what it reads."""
    from vocagno.training.checkpoint import private_folder, take

    marker = tmp_path / "ran"
    folder = tmp_path / "save"
    folder.mkdir()
    torch.save({"state": {"model": {"w": torch.arange(3.0)}}}, folder / "ep0-ba2-rank0.pt")
    (folder / "latest-rank0.pt").symlink_to("ep0-ba2-rank0.pt")
    private = private_folder()
    copy = take(str(folder), private)
    whole_with(gadgets(marker)["os.system"], tmp_path / "evil.pt").rename(folder / "ep0-ba2-rank0.pt")
    loaded = torch.load(copy, weights_only=False)  # as Composer's loader reads it
    assert not marker.exists()
    torch.testing.assert_close(loaded["state"]["model"]["w"], torch.arange(3.0))
    assert {p.name for p in private.iterdir()} == {"checkpoint.pt"}


@pytest.mark.parametrize("target", ["{key} ", "{key}\n", " {key}", "{key}\x00", "{key}\u2028x", "/{key}"])
def test_a_stores_latest_link_holding_anything_but_one_key_is_refused_by_its_one_reader(target, store, tmp_path,
                                                                                        own_temporary_folder):
    """A latest link whose text another reader would read as another key (Composer reads it raw, vocagno once
    stripped it): no key but one written exactly as Composer writes it is followed, by the run or its repair."""
    from vocagno.training.checkpoint import private_folder, repair, take

    marker = tmp_path / "ran"
    key = f"{tmp_path.name}/ep0-ba2-rank0.pt"
    torch.save({"state": {"model": {"w": torch.ones(2)}}}, tmp_path / "good.pt")
    store.upload_file(str(tmp_path / "good.pt"), "runs", key)
    whole_with(gadgets(marker)["os.system"], tmp_path / "evil.pt")
    store.upload_file(str(tmp_path / "evil.pt"), "runs", target.format(key=key).strip(" \n\x00"))
    store.put_object(Bucket="runs", Key=f"{tmp_path.name}/latest-rank0.pt.symlink", Body=target.format(key=key))
    for call in (lambda: take(f"s3://runs/{tmp_path.name}", private_folder()),
                 lambda: repair(f"s3://runs/{tmp_path.name}")):
        with pytest.raises(BadCheckpoint, match="refused: a latest link holds one key as Composer writes it") as got:
            call()
        assert "\n" not in str(got.value) and f"runs/{tmp_path.name}/latest-rank0.pt.symlink" in str(got.value)
    assert not marker.exists()


def test_a_checkpoint_torch_itself_cannot_read_stops_autoresume_in_one_line(tmp_path):
    """A zip with torch.save's data.pkl and none of its other records: every vocagno check passes it as a finished
    save, and torch's reader fails on it (RuntimeError): refused in one line, and left where it is."""
    import zipfile

    from vocagno.training.checkpoint import repair

    folder = tmp_path / "save"
    folder.mkdir()
    torch.save({"state": {"model": {"w": torch.ones(2)}}}, tmp_path / "real.pt")
    with zipfile.ZipFile(tmp_path / "real.pt") as real, zipfile.ZipFile(folder / "ep0-ba2-rank0.pt", "w") as crafted:
        for info in real.infolist():
            if info.filename.endswith("data.pkl"):
                crafted.writestr(info.filename, real.read(info))
    with pytest.raises(BadCheckpoint, match=r"ep0-ba2-rank0.pt: refused: not a checkpoint torch can read") as got:
        repair(str(folder))
    assert "\n" not in str(got.value)
    assert (folder / "ep0-ba2-rank0.pt").exists()


def test_a_checkpoint_taken_from_a_store_is_named_by_its_address_and_a_failure_leaves_nothing(
        store, tmp_path, own_temporary_folder, monkeypatch):
    """A refusal names the store's address, never the private copy; an object gone between the listing and the
    download (any failure of the store) ends the run in one line, and its private folder is gone with it."""
    from composer.utils.object_store import S3ObjectStore

    from vocagno.errors import Refused

    from vocagno.training.config import load_config

    from vocagno.training.loading import take_checkpoint
    from vocagno.training.checkpoint import private_folder, take

    marker = tmp_path / "ran"
    torch.save({"state": {"timestamp": RunsACommand(marker)}}, tmp_path / "evil.pt")
    store.upload_file(str(tmp_path / "evil.pt"), "runs", f"{tmp_path.name}/ep0-ba1-rank0.pt")
    location = f"s3://runs/{tmp_path.name}/ep0-ba1-rank0.pt"
    with pytest.raises(BadCheckpoint) as refused:
        take(location, private_folder())
    assert str(refused.value).startswith(f"{location}: refused to load") and "vocagno-checkpoint-" not in str(
        refused.value), refused.value

    def gone(self, object_name, filename, *args, **kwargs):
        raise FileNotFoundError(f"Object {object_name} not found")

    monkeypatch.setattr(S3ObjectStore, "download_object", gone)
    before = sorted((tmp_path / "tmp").iterdir())
    cfg = load_config(str(REPO / "yamls" / "tiny.yaml"), [f"callbacks.load_checkpoint.load_path={location}"])
    with pytest.raises(Refused) as refused:
        take_checkpoint(cfg)
    assert str(refused.value).startswith(f"callbacks.load_checkpoint.load_path: {location}: can't be read"), \
        refused.value
    assert sorted((tmp_path / "tmp").iterdir()) == before and not marker.exists()


def test_a_sharded_copy_holds_what_its_metadata_names_and_a_copy_without_room_is_refused(
        tmp_path, own_temporary_folder, monkeypatch):
    import vocagno.doors.private as private
    from vocagno.training.checkpoint import private_folder, take

    sharded = dcp_save({"state": {"model": {"w": torch.ones(2)}}}, tmp_path / "ep0-ba2")
    (sharded / "__9_0.distcp").write_bytes(b"\0" * 4096)  # a shard .metadata does not name: never read, not copied
    copy = take(str(sharded), private_folder())
    named = sorted(p.name for p in sharded.iterdir() if p.name != "__9_0.distcp")
    assert sorted(p.name for p in copy.iterdir()) == named
    for path in sharded.iterdir():
        os.chown(path, 65534, 65534)  # someone else's: copied, not linked
    real = os.statvfs

    class Full:
        def __init__(self, folder):
            self.f_frsize, self.f_bavail = real(folder).f_frsize, 0

    monkeypatch.setattr(private.os, "statvfs", Full)
    with pytest.raises(Exception, match=r"its private copy needs .* GiB free: set TMPDIR to a folder"):
        take(str(sharded), private_folder())


def test_a_load_checkpoint_event_after_the_trainer_is_made_is_refused_naming_the_ones_that_work(tmp_path):
    from vocagno.errors import Refused
    from vocagno.training.config import load_config
    from vocagno.training.loading import take_checkpoint

    torch.save({"state": {"model": {"w": torch.ones(2)}}}, tmp_path / "good.pt")
    cfg = load_config(str(REPO / "yamls" / "tiny.yaml"), [
        f"callbacks.load_checkpoint.load_path={tmp_path / 'good.pt'}", "callbacks.load_checkpoint.event=fit_start"])
    with pytest.raises(Refused, match=r"^callbacks.load_checkpoint.event: fit_start: .* give one of init, "
                                            r"before_load, after_load$"):
        take_checkpoint(cfg)


# ---- 2. a config claiming far more than its weights hold: refused before anything is allocated ----

@pytest.fixture
def little_address_space():
    """The process may map at most 3 GiB more than it has now while the test runs: a model of a crafted config
    (200 layers of 4096: 13 GB in float32) fails to allocate rather than filling the machine."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as f:
        mapped = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (mapped + (3 << 30), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@pytest.mark.parametrize("config, reason", [
    ({"num_hidden_layers": 200, "hidden_size": 4096}, "num_hidden_layers=200"),
    ({"hidden_size": 65536}, "of another shape"),  # one layer of 65536: 70 GB in float32
])
def test_a_config_far_larger_than_its_weights_is_refused_before_it_is_built(config, reason, state, tmp_path, capsys,
                                                                            little_address_space):
    checkpoint = saved(state, tmp_path / "run" / "ep0-ba1-rank0.pt", config)
    text = tmp_path / "text.txt"
    text.write_text("Natalia sold clips to 48 of her friends in April.")
    for read in (lambda: ends(export_main, [str(checkpoint), str(tmp_path / "out")]),
                 lambda: ends(eval_main, ["--model", str(checkpoint), "--bpb", str(text), "--device", "cpu"])):
        started = time.monotonic()
        assert read() == 2
        assert time.monotonic() - started < 10
        one_error_line(capsys, checkpoint.name, reason)
    assert not (tmp_path / "out").exists()


# ---- 3. config fields that make transformers fetch or run code ----

@pytest.mark.parametrize("field", [
    {"auto_map": {"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}},
    {"trust_remote_code": True},
    {"attn_implementation": "kernels-community/flash-attn"},
    {"quantization_config": {"quant_method": "bitsandbytes", "load_in_8bit": True}},
    {"tokenizer_class": "evil_tokenizer.EvilTokenizer"},
], ids=lambda field: next(iter(field)))
def test_a_checkpoint_config_naming_code_is_refused(field, state, tmp_path, capsys):
    checkpoint = saved(state, tmp_path / "run" / "ep0-ba1-rank0.pt", field)
    before = snapshot(tmp_path)
    assert ends(export_main, [str(checkpoint), str(tmp_path / "out")]) == 2
    one_error_line(capsys, checkpoint.name, "names code to load", next(iter(field)))
    assert snapshot(tmp_path) == before


def _no_mapping(state):
    state["state"]["model"] = list(state["state"]["model"].values())


def _not_a_tensor(state):
    state["state"]["model"]["model.lm_head.weight"] = "a string"


def _other_shape(state):
    state["state"]["model"]["model.lm_head.weight"] = torch.zeros(3, 3)


def _no_tokenizer(state):
    state["state"]["integrations"]["huggingface"]["tokenizer"] = {}


def _unheld_vocab(state):
    tokenizer = state["state"]["integrations"]["huggingface"]["tokenizer"]
    tokenizer["tokenizer_config.json"]["content"]["vocab_file"] = "other.model"


@pytest.mark.parametrize("damage, why", [
    (_no_mapping, "refused: its state.model is not a mapping of names to tensors"),
    (_not_a_tensor, "refused: its state.model holds 'model.lm_head.weight', which is not a named tensor"),
    (_other_shape, "its weights don't fit the model its config describes"),
    (_no_tokenizer, "the checkpoint holds no tokenizer (train.py saves one with the model)"),
    (_unheld_vocab, "refused: its tokenizer_config names vocab_file 'other.model', a file the checkpoint does not hold"),
], ids=lambda value: value.__name__.strip("_") if callable(value) else None)
def test_a_checkpoint_whose_weights_or_tokenizer_are_not_what_it_says_is_refused_and_nothing_published(
        damage, why, state, tmp_path, capsys):
    broken = copy.deepcopy(state)
    damage(broken)
    checkpoint = tmp_path / "run" / "ep0-ba1-rank0.pt"
    checkpoint.parent.mkdir()
    torch.save(broken, checkpoint)
    assert ends(export_main, [str(checkpoint), str(tmp_path / "out")]) == 2
    one_error_line(capsys, checkpoint.name, why)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


# ---- 4. a tokenizer_config.json naming a file outside the checkpoint ----

@pytest.mark.parametrize("key", ["tokenizer_file", "vocab_file"])
def test_a_checkpoint_tokenizer_naming_a_file_outside_it_is_refused_and_nothing_of_it_published(key, state, tmp_path,
                                                                                                capsys, monkeypatch):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    content = copy.deepcopy(state["state"]["integrations"]["huggingface"]["tokenizer"]["tokenizer.json"]["content"])
    content["added_tokens"].append({"id": 32000, "content": "OUTSIDE_SECRET", "single_word": False, "lstrip": False,
                                    "rstrip": False, "normalized": False, "special": True})
    target = outside / "tokenizer.json"
    target.write_text(json.dumps(content))
    checkpoint = saved(state, tmp_path / "run" / "ep0-ba1-rank0.pt", tokenizer_config={key: str(target)})
    assert ends(export_main, [str(checkpoint), str(tmp_path / "out")]) == 2
    one_error_line(capsys, checkpoint.name, key, "not a plain file name")
    assert not (tmp_path / "out").exists()
    if key != "tokenizer_file":
        return
    # A plain name of a file the checkpoint holds is its own file, whatever the working folder holds of that name.
    checkpoint = saved(state, tmp_path / "run2" / "ep0-ba1-rank0.pt", tokenizer_config={"tokenizer_file":
                                                                                          "tokenizer.json"})
    monkeypatch.chdir(outside)
    assert export_main([str(checkpoint), str(tmp_path / "out")]) == 0
    assert "OUTSIDE_SECRET" not in (tmp_path / "out" / "tokenizer.json").read_text()


# ---- 5. export's staging folder and OUT: nothing written, chmod-ed or deleted through a planted link ----

def test_export_writes_chmods_and_deletes_nothing_through_a_planted_link(state, tmp_path, capsys):
    checkpoint = saved(state, tmp_path / "run" / "ep0-ba1-rank0.pt")
    secret = tmp_path / "home" / ".ssh"
    secret.mkdir(parents=True)
    (secret / "id_rsa").write_text("PRIVATE KEY")
    (secret / "id_rsa").chmod(0o600)
    secret.chmod(0o700)
    before = snapshot(secret)
    out = tmp_path / "models" / "x"
    out.parent.mkdir()
    # a link at a staging name a writer could predict (export's own, at 1ae17a8)
    (out.parent / f".{out.name}.partial-{os.getpid()}").symlink_to(secret)
    assert export_main([str(checkpoint), str(out)]) == 0
    assert snapshot(secret) == before and stat.S_IMODE((secret / "id_rsa").stat().st_mode) == 0o600
    assert not out.is_symlink() and {"config.json", "model.safetensors", "tokenizer.json"} <= {
        p.name for p in out.iterdir()}
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE((out / "model.safetensors").stat().st_mode) == 0o666 & ~umask
    assert sorted(p.name for p in out.parent.iterdir()) == sorted([out.name, f".{out.name}.partial-{os.getpid()}"])

    # --overwrite of an OUT that is a link removes the link, never what it names
    linked = tmp_path / "models" / "linked"
    linked.symlink_to(secret)
    assert export_main([str(checkpoint), str(linked), "--overwrite"]) == 0
    assert not linked.is_symlink() and (linked / "config.json").is_file()
    assert snapshot(secret) == before
    capsys.readouterr()


# ---- 6. a model folder whose config names its own code: never run, never asked about ----

def test_eval_of_a_model_folder_naming_its_own_code_runs_nothing_and_asks_nothing(tmp_path, capsys, monkeypatch):
    marker = tmp_path / "ran"
    folder = tmp_path / "model"
    LlamaForCausalLM(LlamaConfig(vocab_size=32000, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=1)).save_pretrained(folder)
    load_tokenizer("llama2").save_pretrained(folder)
    (folder / "evil.py").write_text(f"import os\nos.system('touch {marker}')\n"
                                    "from transformers import LlamaConfig, LlamaForCausalLM\n"
                                    "class EvilConfig(LlamaConfig):\n    pass\n"
                                    "class EvilForCausalLM(LlamaForCausalLM):\n    pass\n")
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilForCausalLM"}
    (folder / "config.json").write_text(json.dumps(config))
    text = tmp_path / "text.txt"
    text.write_text("Natalia sold clips to 48 of her friends in April.")
    answer = io.StringIO("y\n")  # what a user at the terminal might type to transformers' question
    monkeypatch.setattr(sys, "stdin", answer)
    assert ends(eval_main, ["--model", str(folder), "--bpb", str(text), "--device", "cpu"]) == 2
    one_error_line(capsys, "config.json", "names code to load", "auto_map")
    assert not marker.exists() and answer.tell() == 0, "the folder's code ran, or transformers asked"
    # the tokenizer a shards' vocagno.json names is loaded the same way
    with pytest.raises(UntrustedFile, match="config.json: refused: its config names code to load"):
        load_tokenizer(str(folder))
    assert not marker.exists() and answer.tell() == 0


@pytest.mark.parametrize("planted", ["whole .pt", ".metadata", "a shard"])
def test_a_checkpoint_that_is_a_fifo_or_holds_one_is_refused_without_waiting_on_it(planted, tmp_path, capsys):
    """Opening a FIFO waits for a writer that never comes, reading a device never ends: export names the file in one
    line instead (within seconds, no memory to speak of)."""
    from bounded import within

    if planted == "whole .pt":
        checkpoint = tmp_path / "ep0-ba1-rank0.pt"
        os.mkfifo(checkpoint)
        name = checkpoint
    else:
        checkpoint = tmp_path / "ep0-ba1"
        checkpoint.mkdir()
        (checkpoint / "__0_0.distcp").write_bytes(b"")
        (checkpoint / ".metadata").write_bytes(b"")
        name = checkpoint / (".metadata" if planted == ".metadata" else "__0_0.distcp")
        name.unlink()
        os.mkfifo(name)
    with within(seconds=20, memory=1 << 30):
        assert ends(export_main, [str(checkpoint), str(tmp_path / "model")]) != 0
    one_error_line(capsys, f"{name}: refused: a FIFO")
    assert not (tmp_path / "model").exists()


def _model_folder(tmp_path: Path) -> Path:
    """A copy of the shipped tiny teacher's folder (config, safetensors weights, tokenizer)."""
    import shutil

    from vocagno.core.tokenization import shipped_model_dir

    folder = tmp_path / "shared" / "model"
    shutil.copytree(shipped_model_dir("tiny-math-teacher"), folder)
    return folder


def test_a_model_folders_config_looping_past_its_weights_is_refused_before_it_is_built(tmp_path, capsys):
    from bounded import within

    folder = _model_folder(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (tmp_path / "t.txt").write_text("1 + 1 = 2\n")
    assert eval_main(["--model", str(folder), "--bpb", str(tmp_path / "t.txt"), "--device", "cpu"]) == 0
    capsys.readouterr()
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 10_000_000}))
    with within(seconds=20, memory=1 << 30):
        assert ends(eval_main, ["--model", str(folder), "--bpb", str(tmp_path / "t.txt"), "--device", "cpu"]) == 2
    one_error_line(capsys, f"{folder / 'config.json'}: refused: its model config says num_hidden_layers=10000000")


def _safetensors(path: Path, tensors: dict) -> None:
    """``tensors`` (name -> tensor) saved at ``path``; empty tensors included (a valid safetensors file)."""
    from safetensors.torch import save_file

    save_file({name: tensor.contiguous() for name, tensor in tensors.items()}, str(path))


def _inflated(folder: Path, how: str) -> str:
    """The model folder's tensors made to look many (``how``), and its config looping over 100,000 layers: what the
    folder's tensors are counted as must come from weights that hold bytes."""
    import torch
    from safetensors.torch import load_file

    names = list(load_file(str(folder / "model.safetensors")))
    fake = {f"model.layers.{i}.mlp.up_proj.weight": torch.zeros(0) for i in range(100_000)}
    if how == "stray index":  # an index of another name, its entries all pointing at the real weights
        (folder / "notes.index.json").write_text(json.dumps(
            {"weight_map": {**{name: "model.safetensors" for name in names},
                            **{name: "model.safetensors" for name in fake}}}))
    elif how == "empty tensors":  # 100,000 tensors of no element in a sound safetensors file
        _safetensors(folder / "model.safetensors", {**load_file(str(folder / "model.safetensors")), **fake})
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 100_000}))
    return "num_hidden_layers=100000"


def _larger(folder: Path, how: str) -> str:
    """A config of 200 layers of 4,096 (13 GB in float32) over weights of as many tensors, each one number:
    transformers would fill in every weight the folder lacks."""
    import torch

    (folder / "model.safetensors").unlink()
    _safetensors(folder / "model.safetensors",
                 {f"model.layers.{i}.w{j}": torch.zeros(1) for i in range(200) for j in range(10)})
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 200, "hidden_size": 4096,
                                                    "intermediate_size": 11008, "num_attention_heads": 32,
                                                    "num_key_value_heads": 8}))
    return "its weights hold 2,000 numbers"


@pytest.mark.parametrize("craft, how", [(_inflated, "stray index"), (_inflated, "empty tensors"),
                                        (_larger, "")])
def test_a_model_folder_whose_config_describes_more_than_its_weights_hold_is_refused_unbuilt(craft, how, tmp_path,
                                                                                             capsys):
    from bounded import within

    folder = _model_folder(tmp_path)
    reason = craft(folder, how)
    (tmp_path / "t.txt").write_text("1 + 1 = 2\n")
    with within(seconds=30, memory=1 << 30):
        assert ends(eval_main, ["--model", str(folder), "--bpb", str(tmp_path / "t.txt"), "--device", "cpu"]) == 2
    one_error_line(capsys, f"{folder / 'config.json'}: refused: ", reason)


@pytest.mark.parametrize("load", ["model", "tokenizer"])
def test_a_model_folders_config_is_bounded_before_transformers_parses_it(load, tmp_path, capsys):
    """Qwen2's config constructor makes a list of num_hidden_layers entries: 10**12 of them are refused first, for a
    tokenizer load too (transformers reads config.json to find a tokenizer's class)."""
    from bounded import within
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vocagno.doors.untrusted import from_pretrained

    folder = _model_folder(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "qwen2", "num_hidden_layers": 10**12}))
    (folder / "tokenizer_config.json").write_text("{}")  # no tokenizer_class: transformers looks in config.json
    with within(seconds=20, memory=1 << 30), pytest.raises(UntrustedFile, match=(
            f"{folder / 'config.json'}: refused: its model config says num_hidden_layers=1000000000000")):
        from_pretrained(AutoModelForCausalLM if load == "model" else AutoTokenizer, str(folder))


def test_a_model_folder_of_pickled_weights_is_checked_by_their_shapes_and_loads_when_it_fits(tmp_path, capsys):
    import torch
    from safetensors.torch import load_file

    folder = _model_folder(tmp_path)
    torch.save(load_file(str(folder / "model.safetensors")), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    (tmp_path / "t.txt").write_text("1 + 1 = 2\n")
    assert eval_main(["--model", str(folder), "--bpb", str(tmp_path / "t.txt"), "--device", "cpu"]) == 0
    capsys.readouterr()
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "intermediate_size": 4096}))  # 16 times its MLPs
    assert ends(eval_main, ["--model", str(folder), "--bpb", str(tmp_path / "t.txt"), "--device", "cpu"]) == 2
    one_error_line(capsys, f"{folder / 'config.json'}: refused: its model config describes 7,902,048 parameters, "
                           "and its weights hold 3,478,368 numbers")


def test_a_config_looping_past_the_layers_cap_is_refused_and_the_cap_can_be_raised(tmp_path, capsys, monkeypatch):
    folder = _model_folder(tmp_path)
    (tmp_path / "t.txt").write_text("1 + 1 = 2\n")
    monkeypatch.setenv("VOCAGNO_MAX_LAYERS", "3")
    assert ends(eval_main, ["--model", str(folder), "--bpb", str(tmp_path / "t.txt"), "--device", "cpu"]) == 2
    one_error_line(capsys, f"{folder / 'config.json'}: refused: its model config says num_hidden_layers=4, more than "
                           "the 3 allowed (raise VOCAGNO_MAX_LAYERS if it is right)")
    monkeypatch.setenv("VOCAGNO_MAX_LAYERS", "4")
    assert eval_main(["--model", str(folder), "--bpb", str(tmp_path / "t.txt"), "--device", "cpu"]) == 0


def _explicit_outside(folder: Path, tmp_path: Path) -> str:
    """config.json's transformers_weights (which transformers loads first) names a file outside the folder (there, a
    FIFO would hang the load, a link to /dev/zero exhaust memory)."""
    (folder / "model.safetensors").rename(tmp_path / "weights.safetensors")
    config = json.loads((folder / "config.json").read_text())
    outside = str(tmp_path / "weights.safetensors")
    (folder / "config.json").write_text(json.dumps({**config, "transformers_weights": outside}))
    return "its transformers_weights"


def _single_beside_index(folder: Path, tmp_path: Path) -> str:
    """model.safetensors (which transformers loads first) holds one number; the index beside it names the real
    weights: transformers would build the model from the one file and fill in the rest."""
    import torch

    (folder / "model.safetensors").rename(folder / "real.safetensors")
    from safetensors import safe_open

    with safe_open(str(folder / "real.safetensors"), "pt") as f:
        names = list(f.keys())
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {name: "real.safetensors" for name in names}}))
    _safetensors(folder / "model.safetensors", {"unused": torch.zeros(1)})
    return "its weights hold 1 tensors"


def _nested_decoder_layers(folder: Path, tmp_path: Path) -> str:
    """BART's decoder_layers (not num_hidden_layers), 1,000,000 of them."""
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "decoder_layers": 1_000_000,
                                                    "text_config": {"num_hidden_layers": 10}}))
    return "decoder_layers=1000000"


def _causal_mask(folder: Path, tmp_path: Path) -> str:
    """A GPT-2 of 100,000 positions whose weights hold all it has: its causal-mask buffer alone is 10 GB."""
    import torch
    from transformers import AutoModelForCausalLM, GPT2Config

    config = GPT2Config(vocab_size=32000, n_positions=100_000, n_embd=8, n_layer=1, n_head=1)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    (folder / "model.safetensors").unlink()
    _safetensors(folder / "model.safetensors", {name: torch.zeros(tuple(t.shape)) for name, t in
                                                model.state_dict().items() if not name.endswith("attn.bias")})
    (folder / "config.json").write_text(config.to_json_string())
    return "buffer numbers, and its weights hold"


def _sparse_generation_config(folder: Path, tmp_path: Path) -> str:
    with open(folder / "generation_config.json", "r+b") as f:
        f.truncate(300 << 20)  # 300 MiB that take no disk
    return "generation_config.json: refused: 314,572,800 bytes, more than the 268,435,456 allowed"


@pytest.mark.parametrize("craft", [_explicit_outside, _single_beside_index, _nested_decoder_layers, _causal_mask,
                                   _sparse_generation_config])
def test_a_model_folder_is_checked_as_transformers_will_read_it(craft, tmp_path, capsys):
    from bounded import within

    folder = _model_folder(tmp_path)
    reason = craft(folder, tmp_path)
    (tmp_path / "t.txt").write_text("1 + 1 = 2\n")
    with within(seconds=30, memory=2 << 30):
        assert ends(eval_main, ["--model", str(folder), "--bpb", str(tmp_path / "t.txt"), "--device", "cpu"]) == 2
    one_error_line(capsys, f"{folder}", "refused: ", reason)


def test_a_model_folder_naming_its_own_weights_file_and_one_of_torchs_legacy_format_load(tmp_path, capsys):
    import torch
    from safetensors.torch import load_file

    folder = _model_folder(tmp_path)
    (tmp_path / "t.txt").write_text("1 + 1 = 2\n")
    (folder / "model.safetensors").rename(folder / "weights.safetensors")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "transformers_weights": "weights.safetensors"}))
    assert eval_main(["--model", str(folder), "--bpb", str(tmp_path / "t.txt"), "--device", "cpu"]) == 0
    torch.save(load_file(str(folder / "weights.safetensors")), folder / "pytorch_model.bin",
               _use_new_zipfile_serialization=False)
    (folder / "weights.safetensors").unlink()
    (folder / "config.json").write_text(json.dumps(config))
    assert eval_main(["--model", str(folder), "--bpb", str(tmp_path / "t.txt"), "--device", "cpu"]) == 0


def test_a_checkpoint_whose_zip_holds_a_compressed_record_is_refused_before_torch_unpacks_it(state, tmp_path,
                                                                                             capsys):
    """torch.save stores its records as they are; torch.load unpacks a deflated one whole (a few MB of it could be
    gigabytes): refused first, in one line."""
    import zipfile

    checkpoint = saved(state, tmp_path / "run" / "ep0-ba1-rank0.pt")
    crafted = tmp_path / "run" / "ep0-ba2-rank0.pt"
    with zipfile.ZipFile(checkpoint) as source, zipfile.ZipFile(crafted, "w") as out:
        for info in source.infolist():
            out.writestr(info.filename, source.read(info),
                         zipfile.ZIP_DEFLATED if info.filename.endswith("data.pkl") else zipfile.ZIP_STORED)
    assert ends(export_main, [str(crafted), str(tmp_path / "out")]) == 2
    one_error_line(capsys, "ep0-ba2-rank0.pt: refused: its record ", "data.pkl' is compressed")
    assert not (tmp_path / "out").exists()


def test_a_model_folders_weight_index_naming_a_file_outside_it_is_refused(tmp_path, capsys):
    from safetensors import safe_open

    folder = _model_folder(tmp_path)
    private = tmp_path / "private"
    private.mkdir()
    (folder / "model.safetensors").rename(private / "weights.safetensors")
    with safe_open(str(private / "weights.safetensors"), "pt") as f:
        names = list(f.keys())
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {name: "../../private/weights.safetensors" for name in names}}))
    (tmp_path / "t.txt").write_text("1 + 1 = 2\n")
    assert ends(eval_main, ["--model", str(folder), "--bpb", str(tmp_path / "t.txt"), "--device", "cpu"]) == 2
    one_error_line(capsys, f"{folder / 'model.safetensors.index.json'}: refused: ",
                   "'../../private/weights.safetensors' is not a relative path inside its folder")


def test_composers_latest_link_is_followed_to_the_checkpoint_beside_it_and_no_further(state, tmp_path, capsys):
    save = tmp_path / "save"
    saved(state, save / "ep0-ba1-rank0.pt")
    (save / "latest-rank0.pt").symlink_to("ep0-ba1-rank0.pt")
    assert export_main([str(save / "latest-rank0.pt"), str(tmp_path / "model")]) == 0
    (tmp_path / "elsewhere.pt").write_bytes((save / "ep0-ba1-rank0.pt").read_bytes())
    (save / "latest-rank0.pt").unlink()
    (save / "latest-rank0.pt").symlink_to(tmp_path / "elsewhere.pt")
    capsys.readouterr()
    assert ends(export_main, [str(save / "latest-rank0.pt"), str(tmp_path / "model2")]) != 0
    one_error_line(capsys, "latest-rank0.pt: refused: its link target")


@pytest.mark.parametrize("links", [{"latest-rank0.pt": "latest-rank0.pt"},
                                   {"latest-rank0.pt": "latest-rank1.pt", "latest-rank1.pt": "latest-rank0.pt"},
                                   {"latest-rank0.pt": "other.pt", "other.pt": "ep0-ba1-rank0.pt"}])
def test_a_latest_link_is_followed_one_hop_and_a_loop_of_them_is_refused_in_one_line(links, state, tmp_path, capsys):
    save = tmp_path / "save"
    saved(state, save / "ep0-ba1-rank0.pt")
    for name, target in links.items():
        (save / name).symlink_to(target)
    assert ends(export_main, [str(save / "latest-rank0.pt"), str(tmp_path / "model")]) == 2
    one_error_line(capsys, "latest-rank0.pt: refused: its link target ", "is itself a link")
    assert not (tmp_path / "model").exists()


@pytest.mark.slow
def test_a_sharded_checkpoint_whose_metadata_claims_more_than_its_shards_hold_is_refused_unallocated(state, tmp_path,
                                                                                                      capsys):
    """torch.distributed.checkpoint's loader makes an empty tensor of every size ``.metadata`` claims before it reads
    a byte: a claim of 10**12 floats is refused first."""
    import pickle

    from bounded import within
    from test_untrusted import dcp_save
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from vocagno.doors.untrusted import read_dcp_metadata

    folder = dcp_save(copy.deepcopy(state), tmp_path / "ep0-ba1")
    metadata = read_dcp_metadata(folder / ".metadata")
    item = next(item for item in metadata.state_dict_metadata.values() if isinstance(item, TensorStorageMetadata))
    item.size = torch.Size([10**6, 10**6])
    (folder / ".metadata").write_bytes(pickle.dumps(metadata))
    with within(seconds=30, memory=2 << 30):
        assert ends(export_main, [str(folder), str(tmp_path / "model")]) != 0
    one_error_line(capsys, "ep0-ba1/.metadata: refused: its tensors claim more bytes than its shards hold")


@pytest.mark.parametrize("architecture", ["llama", "qwen2", "gpt2", "mixtral"])
def test_a_model_folder_transformers_saved_loads_through_the_checks(architecture, tmp_path):
    """Sound folders of architectures whose configs carry counts other than their layers (Qwen2's max_window_layers
    past its 2 layers, Mixtral's experts) or buffers (GPT-2's causal mask) load, sharded and whole."""
    from transformers import AutoModelForCausalLM, GPT2Config, MixtralConfig, Qwen2Config

    from vocagno.doors.untrusted import from_pretrained

    small = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=64)
    config = {"llama": LlamaConfig(**small, tie_word_embeddings=True), "qwen2": Qwen2Config(**small),
              "gpt2": GPT2Config(vocab_size=128, n_positions=64, n_embd=32, n_layer=2, n_head=4),
              "mixtral": MixtralConfig(**small, num_local_experts=4, num_experts_per_tok=2)}[architecture]
    model = AutoModelForCausalLM.from_config(config)
    for shard in ("50KB", "10GB"):
        folder = tmp_path / shard
        model.save_pretrained(folder, max_shard_size=shard)
        with open(folder / "flax_model.msgpack", "wb") as f:  # a full snapshot's other frameworks' weights
            f.truncate(300 << 20)
        loaded = from_pretrained(AutoModelForCausalLM, str(folder))
        assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values()))
