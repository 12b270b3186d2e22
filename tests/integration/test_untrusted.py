"""The attacker's side of the trust boundary: checkpoints someone else wrote (a shared bucket, a save folder) reach
every reader (export, eval --model, selection --student, autoresume's repair) as crafted pickles, names that leave
their folder, symlinks, oversized and truncated files; shards and out-roots reach the scoring pass and the
converter's merge with names that leave their folder; a corpus folder reaches the converter with a truncated file,
a loop and a dangling link (object-store keys that are no file name: tests/integration/test_conversion.py). Each ends in one line naming the file and the reason, with a
non-zero exit (or a BadCheckpoint, for the library's repair); nothing runs, nothing is written outside the output,
nothing is deleted. The crafted files are made here, never shipped."""

import io
import json
import os
import pickle
import re
import shutil
import tempfile
import zipfile
from pathlib import Path

import pytest
from helpers import ends
import torch
from test_conversion import convert, converts, small_corpus
from test_selection import TEXT
from test_selection import convert as convert_texts

from vocagno import score
from vocagno.errors import Refused
from vocagno.training.checkpoint import BadCheckpoint, repair
from vocagno.eval.__main__ import main as eval_main
from vocagno.export import main as export_main
from vocagno.selection import main as selection_main

REPO = Path(__file__).resolve().parents[2]


def calls(module: str, name: str, *args) -> bytes:
    """A protocol-4 pickle that calls ``module.name(*args)`` when loaded; protocol 4 resolves a dotted ``name`` by
    walking attributes from the module."""
    return b"\x80\x04c" + f"{module}\n{name}\n".encode() + pickle.dumps(args, protocol=2)[2:-1] + b"R."


def gadgets(marker: Path) -> dict[str, bytes]:
    """Pickles that create ``marker`` when loaded, each by another way in."""
    touch = f"touch {marker}"
    os_module = b"cbuiltins\n__import__\n(Vos\ntR"
    return {
        "os.system": calls("os", "system", touch),
        "subprocess.Popen": calls("subprocess", "Popen", ["touch", str(marker)]),
        "builtins.eval": calls("builtins", "eval", f"__import__('os').system('{touch}')"),
        "Popen through DCP's metadata module": calls("torch.distributed.checkpoint.metadata",
                                                     "torch.ctypes.util.subprocess.Popen", ["touch", str(marker)]),
        "operator.attrgetter chain": b"\x80\x04coperator\nattrgetter\n(Vsystem\ntR(" + os_module
                                     + f"tR(V{touch}\ntR.".encode(),
        "attrgetter through torch._prims_common": b"\x80\x04ctorch.distributed.checkpoint.metadata\n"
                                                  b"torch._prims_common.operator.attrgetter\n(Vsystem\ntR("
                                                  + os_module + f"tR(V{touch}\ntR.".encode(),
        "functools.partial": b"\x80\x04cfunctools\npartial\n(cos\nsystem\n" + f"V{touch}\ntR(tR.".encode(),
    }


def test_each_gadget_runs_when_pickle_loads_it(tmp_path):
    """The gadgets are real: plain pickle runs every one (so each refusal below is a refusal of working code)."""
    import time

    for name, payload in gadgets(tmp_path / "ran").items():
        try:
            pickle.loads(payload)
        except Exception:
            pass  # the call ran before whatever the result fails at
        deadline = time.monotonic() + 10
        while not (tmp_path / "ran").exists() and time.monotonic() < deadline:  # Popen's touch runs on its own
            time.sleep(0.05)
        assert (tmp_path / "ran").exists(), name
        (tmp_path / "ran").unlink()


def whole_with(pickled: bytes, path: Path) -> Path:
    """A torch.save zip whose pickle (``data.pkl``) is ``pickled``."""
    torch.save({"state": {}}, path.with_suffix(".real"))
    with zipfile.ZipFile(path.with_suffix(".real")) as real, zipfile.ZipFile(path, "w") as crafted:
        for info in real.infolist():
            data = pickled if info.filename.endswith("/data.pkl") else real.read(info)
            crafted.writestr(info.filename, data)
    path.with_suffix(".real").unlink()
    return path


def sharded_with_metadata(pickled: bytes, folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "__0_0.distcp").write_bytes(b"")
    (folder / ".metadata").write_bytes(pickled)
    return folder


def dcp_save(state: dict, folder: Path) -> Path:
    """A real sharded checkpoint of ``state``, saved by torch.distributed.checkpoint in this one process."""
    import torch.distributed.checkpoint as dcp

    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(folder)), no_dist=True)
    return folder


class RunsACommand:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.fixture(scope="module")
def heldout(tmp_path_factory) -> Path:
    texts = [json.loads(line)["text"] for line in open(TEXT / "gsm8k_heldout_100.jsonl", encoding="utf-8")][:8]
    return convert_texts(texts, tmp_path_factory.mktemp("heldout") / "shards")


@pytest.fixture
def store(s3, monkeypatch):
    """conftest's S3 server, which Composer's and Streaming's clients reach through the environment: its client."""
    env, client = s3
    for variable, value in env.items():
        monkeypatch.setenv(variable, value)
    return client


def readers(heldout: Path, text: Path):
    """Every entry point that reads a checkpoint, as a user calls it: ``(name, call(checkpoint) -> exit code)``."""
    return {
        "export": lambda checkpoint, out: ends(export_main, [str(checkpoint), str(out)]),
        "eval --model": lambda checkpoint, out: ends(eval_main, ["--model", str(checkpoint), "--bpb", str(text),
                                                                 "--device", "cpu"]),
        "selection --student": lambda checkpoint, out: ends(selection_main, [
            "--shards", str(heldout), "--teacher", "tiny-math-teacher", "--dtype", "float32", "--student",
            str(checkpoint), "--samples", "4", "--json", str(out / "report.json")]),
    }


def snapshot(root: Path) -> dict[str, bytes | str | tuple]:
    """Every file under ``root``: its bytes, or for a large one (the 3 GiB sparse metadata, read in seconds each time)
    its inode, size and change time, which any write moves."""
    def state(p: Path):
        if p.is_symlink():
            return os.readlink(p)
        if not p.is_file():
            return ""
        info = p.stat()
        return p.read_bytes() if info.st_size <= 1 << 20 else (info.st_ino, info.st_size, info.st_ctime_ns)

    return {str(p.relative_to(root)): state(p) for p in sorted(root.rglob("*"))}


def assert_refused_by_every_reader(checkpoint: Path, reason: str, heldout: Path, tmp_path: Path, capsys,
                                   names: str | None = None) -> None:
    text = tmp_path / "text.txt"
    text.write_text("Natalia sold clips to 48 of her friends in April.")
    for reader, read in readers(heldout, text).items():
        before = snapshot(tmp_path)
        out = tmp_path / f"out-{reader.split()[0]}"
        assert read(checkpoint, out) != 0, reader
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and (names or checkpoint.name) in err[0] and reason in err[0], (reader, err)
        assert snapshot(tmp_path) == before, f"{reader} wrote or deleted files"


def assert_repair_refuses(checkpoint: Path, reason: str, save: Path) -> None:
    before = snapshot(save)
    with pytest.raises(BadCheckpoint, match=reason) as refused:
        repair(str(save))
    assert checkpoint.name in str(refused.value) and "\n" not in str(refused.value)
    assert snapshot(save) == before, "repair deleted or changed files"


@pytest.mark.parametrize("where", ["sharded .metadata", "whole .pt"])
def test_pickle_gadgets_in_a_checkpoint_run_nothing_in_any_reader(where, heldout, tmp_path, capsys):
    marker = tmp_path.parent / f"{tmp_path.name}-ran"
    for name, payload in gadgets(marker).items():
        case = tmp_path / name.replace(" ", "_").replace(".", "_")
        save = case / "save"
        if where == "whole .pt":
            save.mkdir(parents=True)
            checkpoint = whole_with(payload, save / "ep0-ba1-rank0.pt")
            reason = "refused to load"
        else:
            checkpoint = sharded_with_metadata(payload, save / "ep0-ba1")
            reason = "refused to load: not torch.distributed.checkpoint's metadata"
        assert_refused_by_every_reader(checkpoint, reason, heldout, case, capsys)
        assert_repair_refuses(checkpoint, reason, save)
        assert not marker.exists(), f"{name} in a {where} ran"


def test_a_pickled_object_in_a_sharded_checkpoints_shards_runs_nothing(heldout, tmp_path, capsys):
    """DCP pickles each non-tensor object into the shards, and PyTorch's loader (Composer's autoresume) unpickles
    them unchecked: vocagno reads them with weights_only, and repair does before Composer loads anything."""
    marker = tmp_path.parent / f"{tmp_path.name}-ran"
    save = tmp_path / "save"
    checkpoint = dcp_save({"state": {"model": {"w": torch.ones(2)}, "timestamp": RunsACommand(marker),
                                     "integrations": {"huggingface": {}}}}, save / "ep0-ba1")
    assert_refused_by_every_reader(checkpoint, "refused to load: it holds objects that are not tensors", heldout,
                                   tmp_path, capsys, names="ep0-ba1")
    assert_repair_refuses(checkpoint, "refused to load: it holds objects that are not tensors", save)
    assert not marker.exists()


def torch_archive(pickled: bytes, before: bytes = b"", **records: bytes) -> io.BytesIO:
    """What ``torch.save`` writes (as DCP writes each object into a shard), holding ``pickled`` as its pickle and
    ``records`` besides (or instead of) its own, after ``before``."""
    saved, made = io.BytesIO(), io.BytesIO(before)
    torch.save("x", saved)
    made.seek(0, 2)
    with zipfile.ZipFile(saved) as original, zipfile.ZipFile(made, "a") as archive:
        prefix = original.infolist()[0].filename.split("/")[0]
        for member in original.infolist():
            name = member.filename.removeprefix(prefix + "/")
            if name not in records:
                archive.writestr(member, pickled if name == "data.pkl" else original.read(member))
        for name, content in records.items():
            archive.writestr(f"{prefix}/{name}", content)
    return io.BytesIO(made.getvalue())


def test_an_object_of_a_sharded_checkpoint_reads_as_torch_reads_it_and_a_gadget_in_one_runs_nothing(tmp_path):
    """An object of a sharded checkpoint's shards that is plain data (a saved tokenizer is one a token) is read by
    Python's unpickler, faster, with the result of torch's weights_only one; anything else goes to torch's, which
    reads tensors and refuses what would run code. A gadget before the archive (torch.load reads that, not the zip
    found from the end), a TorchScript archive, a byte order torch doesn't know, or a pickle that keeps an object
    under a number far out (Python's unpickler would allocate for it) are torch's to judge, never read as data."""
    import datetime

    from vocagno.doors.untrusted import UntrustedFile, load_torch
    from vocagno.doors.untrusted.torch_files import _NOT_PLAIN, _plain_data

    def saved(value) -> io.BytesIO:
        out = io.BytesIO()
        torch.save(value, out)
        return io.BytesIO(out.getvalue())

    for value in ["▁the", "\udc80", 7, -2**70, 1.5, None, True, [1, "a", (2, 3)], {"a": {"b": [None]}}, ()]:
        assert _plain_data(saved(value)) == torch.load(saved(value), weights_only=True) == value
        assert load_torch(saved(value), "x") == value
    with torch.serialization.safe_globals([datetime.timedelta]):
        for value in [torch.arange(3), {"w": torch.ones(2)}, b"bytes", datetime.timedelta(days=1)]:
            assert _plain_data(saved(value)) is _NOT_PLAIN
            assert str(load_torch(saved(value), "x")) == str(value)
    marker = tmp_path / "ran"
    plain = pickle.dumps("harmless", protocol=2)
    for name, gadget in gadgets(marker).items():
        for archive in (torch_archive(gadget), torch_archive(plain, before=gadget)):
            with pytest.raises(UntrustedFile, match="refused to load"):
                load_torch(archive, name)
            assert not marker.exists(), name
    assert _plain_data(torch_archive(plain)) == "harmless"
    far = b"\x80\x02N" + b"r" + (2**32 - 1).to_bytes(4, "little") + b"."  # None, kept as object 4294967295
    appends_nothing = b"\x80\x02N(e."  # None, extended by nothing: torch's refuses it, Python's gives None
    for odd in (torch_archive(plain, **{"constants.pkl": plain}), torch_archive(plain, byteorder=b"middle"),
                torch_archive(plain, **{".storage_alignment": b"x"}), torch_archive(far),
                torch_archive(appends_nothing), torch_archive(b"\x80\x02N(\x80\x02e.")):
        assert _plain_data(odd) is _NOT_PLAIN


def crafted_state(tokenizer_files: dict) -> dict:
    """A checkpoint's state as train.py saves one, of a Llama with no weights, holding ``tokenizer_files``."""
    config = {"config": {"content": {"model_type": "llama"}}}
    return {"state": {"model": {}, "integrations": {"huggingface": {"model": config, "tokenizer": tokenizer_files}}}}


@pytest.mark.parametrize("key, extension", [("../../outside", ".json"), ("/tmp/vocagno-absolute", ".json"),
                                            ("../../sitecustomize", ".py"), ("tokenizer", ".py")])
def test_a_tokenizer_file_name_or_code_in_a_checkpoint_writes_nothing(key, extension, heldout, tmp_path, capsys):
    content = "import os; os.system('touch ran')" if extension == ".py" else {"x": 1}
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    checkpoint = deep / "ep0-ba1-rank0.pt"
    torch.save(crafted_state({key: {"file_extension": extension, "content": content}}), checkpoint)
    reason = "never code" if extension == ".py" else "not a plain file name"
    assert_refused_by_every_reader(checkpoint, reason, heldout, tmp_path, capsys)
    # Where the file would land: beside the temporary folder the tokenizer is unpacked into, or at its absolute path.
    landing = Path(key) if key.startswith("/") else Path(tempfile.gettempdir()) / "unpacked" / key
    assert not Path(os.path.normpath(f"{landing}{extension}")).exists()


def with_shard_name(folder: Path, name: str) -> Path:
    """A real sharded checkpoint whose ``.metadata`` names its shard ``name``."""
    metadata_file = folder / ".metadata"
    with open(metadata_file, "rb") as f:
        metadata = pickle.load(f)
    for info in metadata.storage_data.values():
        info.relative_path = name
    with open(metadata_file, "wb") as f:
        pickle.dump(metadata, f)
    return folder


@pytest.mark.parametrize("name", ["../../outside.distcp", "/tmp/vocagno-outside.distcp", "a/../../b.distcp"])
def test_a_shard_name_leaving_its_folder_is_refused_locally_and_in_a_store(name, store, heldout, tmp_path, capsys):
    client = store
    checkpoint = with_shard_name(dcp_save({"state": {"model": {"w": torch.ones(2)}}}, tmp_path / "save" / "ep0-ba1"),
                                 name)
    reason = "is not a relative path inside its folder"
    assert_refused_by_every_reader(checkpoint, reason, heldout, tmp_path, capsys)
    assert_repair_refuses(checkpoint, reason, tmp_path / "save")
    prefix = f"{tmp_path.name}/ep0-ba1"
    for path in checkpoint.iterdir():
        client.upload_file(str(path), "runs", f"{prefix}/{path.name}")
    assert ends(export_main, [f"s3://runs/{prefix}", str(tmp_path / "remote-out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and reason in err[0], err
    assert not Path("/tmp/vocagno-outside.distcp").exists() and not (tmp_path.parent / "outside.distcp").exists()
    with pytest.raises(BadCheckpoint, match=reason):
        repair(f"s3://runs/{tmp_path.name}")
    assert f"{prefix}/.metadata" in [o["Key"] for o in client.list_objects_v2(Bucket="runs")["Contents"]]


@pytest.mark.parametrize("bad", [["__0_0.distcp"], "../outside.distcp"], ids=["no string", "a parent"])
def test_a_bad_shard_name_after_many_good_ones_is_refused_in_one_line(bad, tmp_path):
    """.metadata names a shard for every item (a tokenizer in the state is thousands): each distinct name is checked
    once, and a bad one after the good ones, or one that is no string at all, is still refused in one line."""
    from vocagno.doors.untrusted import UntrustedFile, read_dcp_metadata

    checkpoint = dcp_save({"state": {"model": {"w": torch.ones(2)}, "timestamp": {str(i): i for i in range(50)}}},
                          tmp_path / "save" / "ep0-ba1")
    with open(checkpoint / ".metadata", "rb") as f:
        metadata = pickle.load(f)
    items = list(metadata.storage_data.values())
    assert len(items) > 50 and all(item.relative_path == items[0].relative_path for item in items)
    items[-1].relative_path = bad
    with open(checkpoint / ".metadata", "wb") as f:
        pickle.dump(metadata, f)
    with pytest.raises(UntrustedFile, match=f"its shard name {re.escape(repr(bad))} is not a"):
        read_dcp_metadata(checkpoint / ".metadata")
    assert_repair_refuses(checkpoint, "shard name", tmp_path / "save")


def test_a_latest_link_in_a_store_naming_a_parent_is_refused(store, tmp_path, capsys):
    client = store
    client.put_object(Bucket="runs", Key="dots/..", Body=b"not a checkpoint")
    client.put_object(Bucket="runs", Key="dots/latest-rank0.pt.symlink", Body=b"dots/..")
    assert ends(export_main, ["s3://runs/dots", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'..' is not a plain file name" in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_symlinks_pointing_outside_a_save_folder_are_neither_followed_nor_deleted_by_repair(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_text("keep")
    (outside / "ep0-ba9").mkdir()
    save = tmp_path / "save"
    save.mkdir()
    (save / "ep0-ba9").symlink_to(outside / "ep0-ba9")
    (save / "ep0-ba8-rank0.pt").symlink_to(outside / "precious.txt")
    before, kept = snapshot(save), snapshot(outside)
    repair(str(save))
    assert snapshot(save) == before and snapshot(outside) == kept


def test_an_oversized_metadata_is_refused_unread(heldout, tmp_path, capsys):
    save = tmp_path / "save"
    checkpoint = sharded_with_metadata(b"", save / "ep0-ba1")
    with open(checkpoint / ".metadata", "wb") as f:
        f.truncate(3 << 30)  # sparse: 3 GiB that take no disk
    reason = "more than a checkpoint's metadata ever needs"
    assert_refused_by_every_reader(checkpoint, reason, heldout, tmp_path, capsys)
    assert_repair_refuses(checkpoint, reason, save)


def test_truncated_files_are_named_and_only_a_save_cut_short_is_removed(heldout, tmp_path, capsys):
    real = dcp_save({"state": {"model": {"w": torch.ones(1000)}}}, tmp_path / "real")
    save = tmp_path / "save"
    cut_metadata = shutil.copytree(real, save / "ep0-ba1")
    data = (cut_metadata / ".metadata").read_bytes()
    (cut_metadata / ".metadata").write_bytes(data[: len(data) // 2])
    reason = "refused to load: not torch.distributed.checkpoint's metadata"
    assert_refused_by_every_reader(cut_metadata, reason, heldout, tmp_path, capsys)
    assert_repair_refuses(cut_metadata, reason, save)
    shutil.rmtree(cut_metadata)

    cut_shard = shutil.copytree(real, save / "ep0-ba2")
    shard = next(cut_shard.glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:100])
    assert_refused_by_every_reader(cut_shard, "its tensors claim more bytes than its shards hold", heldout, tmp_path,
                                   capsys)
    shutil.rmtree(cut_shard)

    torch.save({"state": {"model": {"w": torch.ones(1000)}}}, save / "ep0-ba3-rank0.pt")
    whole = (save / "ep0-ba3-rank0.pt").read_bytes()
    (save / "ep0-ba3-rank0.pt").write_bytes(whole[: len(whole) // 2])
    assert_refused_by_every_reader(save / "ep0-ba3-rank0.pt", "an incomplete checkpoint", heldout, tmp_path, capsys)
    repair(str(save))  # a zip without its directory, which comes last: proof its save was cut short
    assert not (save / "ep0-ba3-rank0.pt").exists()

    (save / "ep0-ba4-rank0.pt").write_bytes(b"")  # a save killed before its first byte
    assert_refused_by_every_reader(save / "ep0-ba4-rank0.pt", "an incomplete checkpoint", heldout, tmp_path, capsys)
    repair(str(save))
    assert not (save / "ep0-ba4-rank0.pt").exists()


def test_a_read_error_is_no_proof_of_a_save_cut_short(tmp_path, monkeypatch):
    """An NFS hiccup or a permission error while repair looks at a whole checkpoint stops it, naming the file; the
    checkpoint stays (zipfile.is_zipfile, used before, answered False on any OSError, and the file was deleted)."""
    import errno

    from vocagno.training.checkpoint import files

    save = tmp_path / "save"
    save.mkdir()
    torch.save({"state": {}}, save / "ep0-ba1-rank0.pt")

    def hiccup(path):
        raise OSError(errno.EIO, "Input/output error", str(path))

    monkeypatch.setattr(files, "_zip_cut_short", hiccup)
    with pytest.raises(BadCheckpoint, match="ep0-ba1-rank0.pt: can't be read: Input/output error: autoresume"):
        repair(str(save))
    assert (save / "ep0-ba1-rank0.pt").exists()


# ---- shards and out-roots: names in index.json and job markers ----

@pytest.mark.parametrize("column, basename", [("zip_data", "../../x"), ("raw_data", "OUTSIDE")])
def test_an_input_index_naming_a_shard_outside_its_folder_is_refused_by_name(heldout, tmp_path, column, basename):
    """An index.json is a file someone else wrote: a shard name in it that leaves the folder ('..', an absolute
    path, where the decompressed shard would be written) is refused in one line, and nothing is read or written
    there."""
    shards = tmp_path / "shards"
    shutil.copytree(heldout, shards)
    outside = tmp_path / "outside" / "x"
    basename = str(outside) if basename == "OUTSIDE" else basename
    index = json.loads((shards / "index.json").read_text())
    index["shards"][0][column]["basename"] = basename
    (shards / "index.json").write_text(json.dumps(index))
    with pytest.raises(Refused) as error:
        score.main(["--shards", str(shards), "--teacher", "tiny-math-teacher", "--dtype", "float32",
                    "--device", "cpu", "--out", str(tmp_path / "scored")])
    assert f"error: {error.value}" == (f"error: {shards / 'index.json'}: refused: its shard name {basename!r} is not a "
                                     "relative path inside its folder (an absolute path, '..', an empty part, a "
                                     "backslash or a NUL)")
    assert not outside.exists() and not (tmp_path / "outside").exists()


def test_a_part_or_shard_name_on_the_out_root_that_leaves_its_folder_is_refused_by_name(tmp_path):
    """Job markers and parts' index.json on an out-root may have been written by someone else (a shared bucket): a
    part or shard name in them that leaves its folder is refused in one line, and nothing outside it is merged."""
    corpus = small_corpus(tmp_path / "docs.jsonl")
    root = tmp_path / "shards"
    assert converts(root, inputs=[corpus]) == 0
    part = next(root.glob("part-*"))
    shutil.copytree(part, tmp_path / "elsewhere")  # a complete part outside the out-root
    marker = root / "job-0000-of-0001.json"
    job = json.loads(marker.read_text())
    marker.write_text(json.dumps({**job, "parts": [*job["parts"], "../elsewhere"]}))
    assert converts(root, "--merge-only", inputs=[corpus]) == (
        f"error: {marker}: refused: its part name '../elsewhere' is not a plain file name (a path outside its folder, "
        "or no name at all)")
    marker.write_text(json.dumps(job))
    index = json.loads((part / "index.json").read_text())
    index["shards"][0]["zip_data"]["basename"] = "../elsewhere/shard.00000.mds.zstd"
    (part / "index.json").write_text(json.dumps(index))
    assert converts(root, "--merge-only", inputs=[corpus]) == (
        f"error: {part / 'index.json'}: refused: its shard name '../elsewhere/shard.00000.mds.zstd' is not a relative "
        "path inside its folder (an absolute path, '..', an empty part, a backslash or a NUL)")
    assert "elsewhere" not in (root / "index.json").read_text()  # the first merge's, untouched


def test_the_merged_index_refuses_a_shard_name_that_leaves_its_part(tmp_path):
    from vocagno.data.outroots import merged_index
    from vocagno.doors.untrusted import UntrustedFile

    root = convert(tmp_path / "shards", inputs=[small_corpus(tmp_path / "docs.jsonl")])
    part = next(root.glob("part-*"))
    index = json.loads((part / "index.json").read_text())
    index["shards"][0]["raw_data"]["basename"] = "/tmp/x"
    (part / "index.json").write_text(json.dumps(index))
    with pytest.raises(UntrustedFile, match=rf"^{part / 'index.json'}: refused: its shard name '/tmp/x'"):
        merged_index(root, [part.name])


# ---- what a reviewer found: a config naming code, latest links, a folder judged by one file, the recipe ----

@pytest.mark.parametrize("model_type, reason", [
    ("evil", "refused: its model config is not one of an architecture transformers ships (model_type 'evil')"),
    ("llama", "names code to load (auto_map, trust_remote_code)"),  # one list of the fields that load code
])
def test_a_model_config_naming_code_or_a_place_to_load_from_runs_nothing(model_type, reason, heldout, tmp_path,
                                                                          capsys):
    """Composer's config reader falls back to ``from_pretrained(_name_or_path, **fields)`` for an unknown
    model_type, trust_remote_code included: vocagno refuses an unknown model_type, and a known one whose config names
    code (vocagno.doors.untrusted.check_config)."""
    marker = tmp_path.parent / f"{tmp_path.name}-ran"
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "configuration_evil.py").write_text(f"import os\nos.system('touch {marker}')\n"
                                                "from transformers import PretrainedConfig\n"
                                                "class EvilConfig(PretrainedConfig):\n    model_type = 'evil'\n")
    (repo / "config.json").write_text(json.dumps({"model_type": "evil",
                                                  "auto_map": {"AutoConfig": "configuration_evil.EvilConfig"}}))
    config = {"model_type": model_type, "_name_or_path": str(repo), "trust_remote_code": True,
              "auto_map": {"AutoConfig": "configuration_evil.EvilConfig"}}
    state = crafted_state({})
    state["state"]["integrations"]["huggingface"]["model"] = {"config": {"content": config}}
    deep = tmp_path / "a"
    deep.mkdir()
    torch.save(state, deep / "ep0-ba1-rank0.pt")
    assert_refused_by_every_reader(deep / "ep0-ba1-rank0.pt", reason, heldout, tmp_path, capsys)
    assert not marker.exists()


def test_a_latest_file_or_link_in_a_save_folder_is_checked_or_refused(tmp_path):
    marker = tmp_path.parent / f"{tmp_path.name}-ran"
    crafted = tmp_path / "crafted"
    crafted.mkdir()
    torch.save({"state": {"timestamp": RunsACommand(marker)}}, crafted / "latest-rank0.pt")
    with pytest.raises(BadCheckpoint, match=r"latest-rank0.pt: refused to load: .* autoresume stops"):
        repair(str(crafted))  # a file Composer would load, with no checkpoint beside it
    outside = tmp_path / "real"
    outside.mkdir()
    torch.save({"state": {}}, outside / "ep0-ba1-rank0.pt")
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "latest-rank0.pt").symlink_to(outside / "ep0-ba1-rank0.pt")
    with pytest.raises(BadCheckpoint, match=r"latest-rank0.pt: refused: its link target '/.*' is not a plain file"):
        repair(str(linked))
    # export of that save folder into the folder its latest points at would delete the real checkpoint
    assert ends(export_main, [str(linked), str(outside), "--overwrite"]) == 2
    assert (outside / "ep0-ba1-rank0.pt").exists() and not marker.exists()


def test_a_checkpoint_folder_is_judged_by_what_a_save_writes_never_by_a_link_inside_it(tmp_path):
    save = tmp_path / "save"
    (save / "ep0-ba5").mkdir(parents=True)
    (save / "ep0-ba5" / "precious.txt").write_text("keep")
    (save / "ep0-ba5" / "latest-rank0.pt").write_bytes(b"")  # an empty file: "cut short", were it followed
    with pytest.raises(BadCheckpoint, match="ep0-ba5: a checkpoint folder without .metadata, holding files a "
                                            "sharded save does not write"):
        repair(str(save))
    assert (save / "ep0-ba5" / "precious.txt").read_text() == "keep"


def test_a_recipe_that_reads_the_environment_is_refused(tmp_path, capsys, monkeypatch):
    from omegaconf import OmegaConf as om

    from vocagno.training.checkpoint import load_checkpoint

    monkeypatch.setenv("VOCAGNO_TEST_SECRET", "hunter2")
    state = crafted_state({})
    state["state"]["callbacks"] = {"RunRecipe": {"yaml": om.to_yaml({"run_name": "${oc.env:VOCAGNO_TEST_SECRET}"})}}
    torch.save(state, tmp_path / "ep0-ba1-rank0.pt")
    assert load_checkpoint(str(tmp_path / "ep0-ba1-rank0.pt"))  # a plain checkpoint, read
    assert ends(export_main, [str(tmp_path / "ep0-ba1-rank0.pt"), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "refused: its recipe holds interpolations (run_name)" in err and "hunter2" not in err
    assert not (tmp_path / "out").exists()


def test_a_link_planted_in_the_scoring_pass_out_root_is_not_written_through(heldout, tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    out = tmp_path / "scored"
    out.mkdir()
    (out / ".scratch-part-00000").symlink_to(victim)
    (out / ".tmp-part-00000").symlink_to(victim)
    assert score.main(["--shards", str(heldout), "--teacher", "tiny-math-teacher", "--dtype", "float32",
                       "--device", "cpu", "--out", str(out)]) == 0
    assert list(victim.iterdir()) == [] and (out / "index.json").exists()


@pytest.mark.parametrize("planted", ["newest checkpoint", "latest object", "link without a checkpoint"])
def test_what_composer_would_load_from_a_store_save_folder_is_checked_first(planted, store, tmp_path):
    """Composer's autoresume downloads a store's latest and loads it with torch.load(weights_only=False): the newest
    checkpoint the repaired link names, a plain ``latest-rank0.pt`` object (loaded before any ``.symlink``), or
    what a ``.symlink`` names where no checkpoint of the run is complete."""
    marker = tmp_path.parent / f"{tmp_path.name}-ran"
    torch.save({"state": {"timestamp": RunsACommand(marker)}}, tmp_path / "evil.pt")
    prefix = f"{tmp_path.name}/run"
    if planted == "newest checkpoint":
        store.upload_file(str(tmp_path / "evil.pt"), "runs", f"{prefix}/ep0-ba9-rank0.pt")
        reason = r"ep0-ba9-rank0.pt: refused to load: .* autoresume stops"
    elif planted == "latest object":
        torch.save({"state": {}}, tmp_path / "good.pt")
        store.upload_file(str(tmp_path / "good.pt"), "runs", f"{prefix}/ep0-ba2-rank0.pt")
        store.upload_file(str(tmp_path / "evil.pt"), "runs", f"{prefix}/latest-rank0.pt")
        reason = "latest-rank0.pt: a latest object Composer's autoresume would load"
    else:
        store.upload_file(str(tmp_path / "evil.pt"), "runs", f"{tmp_path.name}/elsewhere/x.pt")
        store.put_object(Bucket="runs", Key=f"{prefix}/latest-rank0.pt.symlink", Body=f"{tmp_path.name}/elsewhere/x.pt")
        reason = "x.pt: refused to load: .* autoresume stops"
    before = [o["Key"] for o in store.list_objects_v2(Bucket="runs", Prefix=tmp_path.name)["Contents"]]
    with pytest.raises(BadCheckpoint, match=reason):
        repair(f"s3://runs/{prefix}")
    assert [o["Key"] for o in store.list_objects_v2(Bucket="runs", Prefix=tmp_path.name)["Contents"]] == before
    assert not marker.exists()


def test_a_corpus_folder_with_a_truncated_file_a_loop_and_a_dangling_link_is_read_as_far_as_it_goes(tmp_path,
                                                                                                     capsys):
    """The converter's inputs: what can't be read is named with its reason and counted, the rest converts, and the
    job ends in one line naming the unreadable file, exit 1; nothing is written outside the out-root."""
    import gzip

    docs = tmp_path / "docs"
    docs.mkdir()
    small_corpus(docs / "good.jsonl")
    whole = gzip.compress(b'{"text": "Natalia sold clips to 48 of her friends in April."}\n' * 500)
    (docs / "cut.jsonl.gz").write_bytes(whole[: len(whole) // 2])
    (docs / "loop").symlink_to(docs)
    (docs / "gone.jsonl").symlink_to(tmp_path / "deleted.jsonl")
    before = snapshot(docs)
    assert converts(tmp_path / "shards", inputs=[docs]) == 1
    out, err = capsys.readouterr()
    assert f"{docs}: ignored 2 path(s) that can't be read: gone.jsonl (a link to nothing), loop (a loop" in out
    assert f"UNREADABLE: {docs / 'cut.jsonl.gz'}: EOFError" in out and "without the 1 unreadable file(s)" in out
    assert err.strip().splitlines()[-1].startswith(f"error: could not read {docs / 'cut.jsonl.gz'}: EOFError")
    assert snapshot(docs) == before and sorted(p.name for p in tmp_path.iterdir()) == ["docs", "shards"]
