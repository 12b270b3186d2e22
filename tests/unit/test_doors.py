"""The one way in (``vocagno.doors.untrusted``) and the one way out (``vocagno.doors.writing``) on their own: what they open, what
they refuse before reading, what they never write through. The entry points' attacker tests use them through the
real commands (tests/integration/test_untrusted.py)."""

import bz2
import gzip
import json
import os
from pathlib import Path

import pytest
import zstandard

from vocagno.doors.untrusted import (
    UntrustedFile, cap, check_config, check_folder, check_index, decompress, open_regular, read_bytes, read_json,
)
from vocagno.doors.writing import make_readable, publish, remove, staging, write_atomically
from vocagno.errors import Refused


def test_a_regular_file_reads_whole_and_nothing_else_is_opened(tmp_path):
    (tmp_path / "a.json").write_text('{"x": 1}')
    assert read_json(tmp_path / "a.json") == {"x": 1}
    (tmp_path / "link").symlink_to(tmp_path / "a.json")
    os.mkfifo(tmp_path / "fifo")
    for path, kind in ((tmp_path / "link", "symbolic link"), (tmp_path / "fifo", "FIFO"),
                       (Path("/dev/zero"), "character device")):
        with pytest.raises(UntrustedFile, match=f"{path}: refused: a {kind}"):
            read_bytes(path)


def test_a_proc_file_that_says_it_is_empty_is_refused_once_it_gives_more():
    assert os.stat("/proc/self/environ").st_size == 0
    with pytest.raises(UntrustedFile, match="holds more than the 0 bytes its size says"):
        read_bytes("/proc/self/environ")


def test_a_file_inside_a_folder_is_reached_through_no_link(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("secret")
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "sub").symlink_to(outside)
    (folder / "real").mkdir()
    (folder / "real" / "x").write_text("x")
    assert read_bytes("real/x", folder=folder) == b"x"
    with pytest.raises(UntrustedFile, match="follows no link"):
        read_bytes("sub/secret", folder=folder)
    with pytest.raises(UntrustedFile, match="not a relative path inside its folder"):
        read_bytes("../outside/secret", folder=folder)


def test_a_file_over_its_cap_is_refused_before_it_is_read_and_the_cap_can_be_raised(tmp_path, monkeypatch):
    path = tmp_path / "big.json"
    path.write_text(json.dumps({"x": "y" * 2000}))
    monkeypatch.setenv("VOCAGNO_MAX_JSON_BYTES", "1000")
    with pytest.raises(UntrustedFile, match=r"2,\d{3} bytes, more than the 1,000 allowed .*VOCAGNO_MAX_JSON_BYTES"):
        read_json(path)
    monkeypatch.setenv("VOCAGNO_MAX_JSON_BYTES", "1_000_000")
    assert len(read_json(path)["x"]) == 2000
    with pytest.raises(UntrustedFile, match=r"big.json: refused: 2,\d{3} bytes, more than the 100 expected$"):
        read_bytes(path, 100, cap_name="json_bytes")  # the size stated for it, named as such (not the cap)
    monkeypatch.setenv("VOCAGNO_MAX_JSON_BYTES", "lots")
    with pytest.raises(UntrustedFile, match="VOCAGNO_MAX_JSON_BYTES=.lots.: a positive whole number of bytes"):
        cap("json_bytes")


def test_check_folder_lists_regular_files_and_refuses_a_link_anywhere(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "b.json").write_text("{}")
    (tmp_path / "c.txt").write_text("c")
    assert check_folder(tmp_path) == [Path("a/b.json"), Path("c.txt")]
    (tmp_path / "a" / "key").symlink_to("/etc/hostname")
    with pytest.raises(UntrustedFile, match="a/key: refused: a symbolic link"):
        check_folder(tmp_path)


def shard(basename="shard.00000.mds.zstd", samples=10, raw=4096, **changes):
    info = {"format": "mds", "version": 2, "column_names": ["text", "student_ids"],
            "column_encodings": ["str", "ndarray"], "column_sizes": [None, None], "compression": "zstd",
            "hashes": ["xxh3_64"], "samples": samples, "size_limit": 1 << 26,
            "raw_data": {"basename": basename.removesuffix(".zstd"), "bytes": raw, "hashes": {"xxh3_64": "1"}},
            "zip_data": {"basename": basename, "bytes": 100, "hashes": {"xxh3_64": "2"}},
            "raw_meta": None, "zip_meta": None}
    info.update(changes)
    return info


@pytest.mark.parametrize("change, message", [
    ({"samples": 10**9}, "says it holds 1000000000 samples: its 4,096 bytes hold 1 to 1,022"),
    ({"samples": -1}, "says it holds -1 samples"),
    ({"samples": True}, "says it holds True samples"),
    ({"raw_data": {"basename": "../outside/x", "bytes": 10, "hashes": {"xxh3_64": "1"}}},
     "'../outside/x' is not a relative path inside its folder"),
    ({"raw_data": {"basename": "x.mds", "bytes": 4 << 30, "hashes": {"xxh3_64": "1"}}},
     "has 4294967296 bytes: a shard has 1 to 1,073,741,824"),
    ({"raw_data": {"basename": "x.mds", "bytes": 4096, "hashes": {"md5": "1"}}}, "has no xxh3_64 hash"),
    ({"column_encodings": ["str", "pkl"]}, "column 'student_ids' is stored as 'pkl'"),
    ({"compression": "br"}, "compression 'br' is not one vocagno reads"),
    ({"format": "jsonl"}, "is not an MDS shard"),
])
def test_an_index_is_refused_for_any_number_or_name_its_bytes_cant_hold(change, message):
    good = {"version": 2, "shards": [shard()]}
    assert check_index(good, "x/index.json") is good
    with pytest.raises(UntrustedFile, match=f"x/index.json: refused: .*{message.replace('(', '.').replace(')', '.')}"):
        check_index({"version": 2, "shards": [shard(**change)]}, "x/index.json")


def test_an_index_over_the_caps_of_shards_or_samples_or_with_none_is_refused(monkeypatch):
    with pytest.raises(UntrustedFile, match="lists no shards"):
        check_index({"version": 2, "shards": []}, "i")
    many = {"version": 2, "shards": [shard(f"s{i}.mds.zstd", samples=1000) for i in range(3)]}
    monkeypatch.setenv("VOCAGNO_MAX_SAMPLES", "2999")
    with pytest.raises(UntrustedFile, match="3,000 samples, more than the 2,999 allowed"):
        check_index(many, "i")
    monkeypatch.setenv("VOCAGNO_MAX_SHARDS", "2")
    with pytest.raises(UntrustedFile, match="3 shards, more than the 2 allowed"):
        check_index(many, "i")
    with pytest.raises(UntrustedFile, match="names a file the index names already"):
        check_index({"version": 2, "shards": [shard(), shard()]}, "i")


@pytest.mark.parametrize("compression, compress", [
    ("zstd", lambda data: zstandard.ZstdCompressor().compress(data)),
    ("zstd:7", lambda data: zstandard.ZstdCompressor(level=7).compress(data)),
    ("gz", gzip.compress), ("bz2", bz2.compress),
])
def test_decompression_stops_one_byte_past_what_the_index_says(compression, compress):
    data = b"0123456789" * 1000
    assert decompress(compression, compress(data), len(data), "s") == data
    bomb = compress(b"\0" * (64 << 20))  # 64 MiB of zeros: a few KiB compressed
    assert len(bomb) < 200_000
    with pytest.raises(UntrustedFile,
                       match=r"s: refused: it decompresses to more bytes than its index says \(10,000\)"):
        decompress(compression, bomb, len(data), "s")
    with pytest.raises(UntrustedFile, match="decompresses to 9,999 bytes, its index says 10,000"):
        decompress(compression, compress(data[:-1]), len(data), "s")
    with pytest.raises(UntrustedFile, match=f"s: refused: not {compression.split(':')[0]} data"):
        decompress(compression, b"not compressed at all", len(data), "s")


@pytest.mark.parametrize("field", [{"auto_map": {"AutoModel": "m.M"}}, {"trust_remote_code": True},
                                   {"attn_implementation": "kernels-community/flash-attn"},
                                   {"tokenizer_class": "my_module.Tokenizer"}, {"quantization_config": {"x": 1}}])
def test_a_config_naming_code_is_refused(field):
    assert check_config({"model_type": "llama", "attn_implementation": "sdpa"}, "c")
    with pytest.raises(UntrustedFile, match=f"c: refused: its config names code to load .{next(iter(field))}"):
        check_config({"model_type": "llama", **field}, "c")


def test_write_atomically_replaces_a_planted_link_and_never_writes_through_it(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("mine")
    (tmp_path / "out").symlink_to(victim)
    write_atomically(tmp_path / "out", "new")
    assert victim.read_text() == "mine" and not (tmp_path / "out").is_symlink()
    assert (tmp_path / "out").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "victim"]


def test_staging_is_fresh_and_publish_replaces_only_when_told_and_removes_links_not_their_targets(tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "id_rsa").write_text("key")
    os.chmod(victim / "id_rsa", 0o600)
    final = tmp_path / "model"
    final.symlink_to(victim)
    built = staging(final)
    assert built.parent.parent == tmp_path and not any(built.iterdir())
    assert {oct(f.stat().st_mode & 0o777) for f in (built, built.parent)} == {"0o700"}
    assert staging(final) != built
    (built / "config.json").write_text("{}")
    (built / "link").symlink_to(victim / "id_rsa")
    make_readable(built, umask=0o022)
    assert oct((victim / "id_rsa").stat().st_mode & 0o777) == "0o600"
    assert oct((built / "config.json").stat().st_mode & 0o777) == "0o644"
    with pytest.raises(FileExistsError):
        publish(built, final)
    publish(built, final, replace=True)
    assert (final / "config.json").exists() and not final.is_symlink() and (victim / "id_rsa").read_text() == "key"
    remove(final / "link")
    assert (victim / "id_rsa").exists()
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".model.staging")) == ["model", "victim"]


def test_a_staging_folder_swapped_for_a_link_is_not_made_readable_through_it(tmp_path):
    """Someone who can write the folder beside it renames the staging folder and plants a link to a folder of the
    victim's at its name: make_readable refuses it, and no mode changes there (an id_rsa stays 0600)."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "id_rsa").write_text("key")
    os.chmod(victim / "id_rsa", 0o600)
    os.chmod(victim, 0o700)
    built = staging(tmp_path / "model")
    (built / "config.json").write_text("{}")
    os.rename(built, tmp_path / "moved")
    built.symlink_to(victim)
    with pytest.raises(OSError):
        make_readable(built, umask=0o022)
    assert (oct(victim.stat().st_mode & 0o777), oct((victim / "id_rsa").stat().st_mode & 0o777)) == ("0o700", "0o600")


def test_a_staging_folder_swapped_for_a_link_while_it_fills_leads_no_write_out(tmp_path):
    """Its outer folder renamed and a link to the victim's folder planted at its name while a writer fills it by path:
    the next write finds no folder (the inner name is in no folder the link can name), nothing lands in the victim's,
    and removing the staging folder unlinks the link and leaves the victim's folder as it was."""
    victim = tmp_path / "victim"
    victim.mkdir()
    built = staging(tmp_path / "part")
    (built / "shard.00000.mds").write_bytes(b"before")
    [swapped] = tmp_path.glob(".part.staging-*")  # what the others see beside the part
    os.rename(swapped, tmp_path / "moved")
    swapped.symlink_to(victim)
    with pytest.raises(FileNotFoundError):
        (built / "index.json").write_text("{}")
    assert list(victim.iterdir()) == []
    remove(built)
    assert not os.path.lexists(swapped) and victim.is_dir() and list(victim.iterdir()) == []


def test_a_log_is_appended_to_its_own_file_and_never_through_a_link(tmp_path):
    from vocagno.doors.writing import append

    append(tmp_path / "logs" / "metrics.jsonl", "one\n")
    append(tmp_path / "logs" / "metrics.jsonl", "two\n")
    assert (tmp_path / "logs" / "metrics.jsonl").read_text() == "one\ntwo\n"
    victim = tmp_path / "victim"
    victim.write_text("mine")
    (tmp_path / "planted.jsonl").symlink_to(victim)
    with pytest.raises(OSError):
        append(tmp_path / "planted.jsonl", "three\n")
    assert victim.read_text() == "mine"



def test_a_regular_file_seeks_within_the_size_it_said(tmp_path):
    (tmp_path / "f").write_bytes(b"0123456789")
    with open_regular(tmp_path / "f") as f:
        assert f.seek(0, os.SEEK_END) == 10 and f.read() == b""
        f.seek(4)
        assert f.read(3) == b"456" and f.tell() == 7 and f.read() == b"789"


def test_a_link_planted_in_the_tokenizer_cache_is_replaced_by_the_shipped_tokenizer(tmp_path, monkeypatch):
    from vocagno.core import tokenization

    monkeypatch.setenv("VOCAGNO_CACHE", str(tmp_path / "cache"))
    folder = tokenization.shipped_tokenizer_dir("llama2")
    remove(folder)
    planted = tmp_path / "planted"
    planted.mkdir()
    (planted / "tokenizer.json").write_text("{}")
    folder.symlink_to(planted)
    assert tokenization.shipped_tokenizer_dir("llama2") == folder
    assert not folder.is_symlink() and (planted / "tokenizer.json").read_text() == "{}"
    assert len(tokenization.load_tokenizer("llama2")) == 32000


def test_an_mds_shard_passes_with_the_count_it_holds_and_no_other(tmp_path):
    import numpy as np
    from streaming import MDSWriter

    from vocagno.doors.untrusted import check_mds

    with MDSWriter(out=str(tmp_path), columns={"ids": "ndarray"}) as writer:
        for n in range(5):
            writer.write({"ids": np.arange(n + 1, dtype=np.uint16)})
    data = (tmp_path / "shard.00000.mds").read_bytes()
    assert (np.diff(check_mds(data, 5, len(data), "s")) > 0).all()
    for samples, size in ((6, len(data)), (4, len(data)), (5, len(data) + 1)):
        with pytest.raises(UntrustedFile, match=f"s: refused: not an MDS shard of the {samples} samples"):
            check_mds(data, samples, size, "s")


def test_a_write_inside_a_folder_goes_through_no_link_below_it(tmp_path):
    from vocagno.doors.writing import move_inside, write_inside

    victim = tmp_path / "victim"
    victim.mkdir()
    folder = tmp_path / "cache"
    folder.mkdir()
    (folder / "out").symlink_to(victim)
    write_inside(folder, "part/a/shard.mds", b"x")
    assert (folder / "part" / "a" / "shard.mds").read_bytes() == b"x"
    (tmp_path / "mine").write_bytes(b"y")
    move_inside(tmp_path / "mine", folder, "part/b/shard.mds")
    assert (folder / "part" / "b" / "shard.mds").read_bytes() == b"y"
    (tmp_path / "mine").write_bytes(b"z")
    for write in (lambda: write_inside(folder, "out/authorized_keys", b"key"),
                  lambda: move_inside(tmp_path / "mine", folder, "out/authorized_keys")):
        with pytest.raises(NotADirectoryError, match="out is not a folder of its own"):
            write()
    assert not any(victim.iterdir())


def test_a_folder_on_the_way_swapped_for_a_link_is_named_as_such(tmp_path):
    (tmp_path / "folder" / "b").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "notes.txt").write_text("secret")
    (tmp_path / "folder" / "b").rmdir()
    (tmp_path / "folder" / "b").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UntrustedFile, match="b/notes.txt: refused: a path through a link"):
        read_bytes("b/notes.txt", folder=tmp_path / "folder")


def test_a_weights_header_is_believed_only_where_the_files_bytes_hold_it(tmp_path):
    import struct

    import torch
    from safetensors.torch import save_file

    from vocagno.doors.untrusted import saved_shapes

    save_file({"a": torch.zeros(2, 3), "empty": torch.zeros(0)}, str(tmp_path / "model.safetensors"))
    assert saved_shapes(tmp_path, [Path("model.safetensors")]) == {"a": (2, 3), "empty": (0,)}
    header = {"a": {"dtype": "F32", "shape": [1 << 20, 4096], "data_offsets": [0, 24]}}  # 16 GiB claimed in 24 bytes
    text = json.dumps(header).encode()
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + bytes(24))
    with pytest.raises(UntrustedFile, match=r"model.safetensors: refused: its tensor 'a' is not one its bytes hold"):
        saved_shapes(tmp_path, [Path("model.safetensors")])
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", 1 << 40) + text)
    with pytest.raises(UntrustedFile, match=r"not safetensors \(its header says 1,099,511,627,776 bytes"):
        saved_shapes(tmp_path, [Path("model.safetensors")])
    (tmp_path / "notes.index.json").write_text(json.dumps({"weight_map": {"x": "model.safetensors"}}))
    (tmp_path / "model.safetensors").unlink()
    assert saved_shapes(tmp_path, [Path("notes.index.json")]) is None  # only the index transformers reads counts


def weights(folder, **files) -> list[Path]:
    for name, content in files.items():
        (folder / name.replace("__", ".")).write_bytes(content if isinstance(content, bytes) else content.encode())
    return sorted(Path(name.replace("__", ".")) for name in files)


@pytest.mark.parametrize("files, explicit, why", [
    ({"model__bin": b"x"}, "model.bin", "config.json: refused: its transformers_weights 'model.bin' is no safetensors "
                                        "file or index"),
    ({}, "other.safetensors", "config.json: refused: its transformers_weights 'other.safetensors' is not a file of"),
    ({"model__safetensors": (8).to_bytes(8, "little") + b"{not json"}, None,
     "model.safetensors: refused: not safetensors (its header is not JSON)"),
    ({"pytorch_model__bin": b"\x80\x02 a pickle cut short"}, None, "pytorch_model.bin: refused: not PyTorch weights ("),
    ({"model__safetensors__index__json": '{"metadata": {}}'}, None,
     "model.safetensors.index.json: refused: no weight_map of tensor names to files"),
    ({"model__safetensors__index__json": '{"weight_map": {"w": "part-2.safetensors"}}'}, None,
     "model.safetensors.index.json: refused: it names 'part-2.safetensors', which is not a file of"),
])
def test_weights_a_model_folder_holds_or_names_that_cant_be_its_weights_are_refused_naming_the_file(
        tmp_path, files, explicit, why):
    from vocagno.doors.untrusted import saved_shapes

    with pytest.raises(UntrustedFile) as refused:
        saved_shapes(tmp_path, weights(tmp_path, **files), explicit)
    assert str(refused.value).startswith(f"{tmp_path}/{why}"), refused.value


def test_a_model_config_that_is_no_mapping_or_nests_configs_without_end_is_refused():
    from vocagno.doors.untrusted.pretrained import check_loops

    with pytest.raises(UntrustedFile, match=r"^teacher/config.json: refused: its config is not a mapping$"):
        check_config(["model_type", "llama"], "teacher/config.json")
    nested = {"num_hidden_layers": 2}
    for _ in range(9):
        nested = {"text_config": nested}
    check_loops(nested["text_config"], 4, "teacher")  # 8 deep: a config's own nesting
    with pytest.raises(UntrustedFile, match=r"^teacher: refused: its model config nests configs more than 8 deep$"):
        check_loops(nested, 4, "teacher")


def test_a_private_folder_is_written_through_its_descriptor_whatever_its_name_comes_to_hold(tmp_path):
    from vocagno.doors.writing import PrivateFolder

    victim = tmp_path / "victim"
    victim.mkdir()
    with PrivateFolder(tmp_path, ".download-") as private:
        assert oct(os.stat(private.name).st_mode & 0o777) == "0o700"
        moved = tmp_path / "moved"
        os.rename(private.name, moved)  # someone who can write tmp_path swaps it for a link
        os.symlink(victim, private.name)
        (private.path / "file").write_bytes(b"shard")
        assert (moved / "file").read_bytes() == b"shard" and list(victim.iterdir()) == []
    assert list(moved.iterdir()) == [] and os.path.islink(private.name)  # emptied through it; the link left as it is


def test_a_file_where_a_path_needs_a_folder_is_a_missing_file_not_a_link(tmp_path):
    (tmp_path / "a").write_text("x")
    with pytest.raises(FileNotFoundError, match="a file stands where its path needs a folder"):
        read_bytes("a/b", folder=tmp_path)
    (tmp_path / "c").symlink_to(tmp_path)
    with pytest.raises(UntrustedFile, match="c/a: refused: a path through a link"):
        read_bytes("c/a", folder=tmp_path)


def test_a_torch_zip_python_cant_read_or_holding_a_deflated_record_is_refused_before_torch_reads_it(tmp_path):
    """torch's reader finds a zip's directory where Python's zipfile may not (a stray end-of-directory signature after
    it, a zip64 locator naming two disks): such a zip is refused, as is a deflated record, whatever else reads it."""
    import io
    import struct
    import zipfile

    import torch

    from vocagno.doors.untrusted import check_torch_zip, load_torch

    buffer = io.BytesIO()
    torch.save({"w": torch.zeros(4), "step": 3}, buffer)
    sound = buffer.getvalue()
    assert load_torch(io.BytesIO(sound), "sound.pt")["step"] == 3
    deflated = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(sound)) as source, zipfile.ZipFile(deflated, "w") as out:
        for info in source.infolist():
            out.writestr(info.filename, source.read(info),
                         zipfile.ZIP_DEFLATED if info.filename.endswith("data.pkl") else zipfile.ZIP_STORED)
    end = sound.rindex(b"PK\x05\x06")
    for name, data, why in (
            ("deflated.pt", deflated.getvalue(), "its record .*data.pkl' is compressed"),
            ("trailing.pt", deflated.getvalue() + b"PK\x05\x06" + bytes(10), "a zip Python's zipfile can't read"),
            ("disks.pt", sound[:end] + b"PK\x06\x07" + struct.pack("<IQI", 0, 0, 2) + sound[end:],
             "a zip Python's zipfile can't read")):
        with pytest.raises(UntrustedFile, match=f"{name}: refused: {why}"):
            load_torch(io.BytesIO(data), name)
        (tmp_path / name).write_bytes(data)
        with pytest.raises(UntrustedFile, match=f"{name}: refused: {why}"):
            check_torch_zip(tmp_path / name, name)


# ---- the checked copy, in a private place (vocagno.doors.private) ----

def _model_folder(folder: Path, layers: int = 1) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=8, intermediate_size=16, num_hidden_layers=layers,
                                 num_attention_heads=2, num_key_value_heads=1)).save_pretrained(folder)
    return folder


def test_a_private_folder_is_the_processs_own_and_refused_where_others_can_rename_it(tmp_path, monkeypatch):
    import stat
    import tempfile

    from vocagno.doors.private import private_folder

    made = private_folder("vocagno-test-")
    assert stat.S_IMODE(made.stat().st_mode) == 0o700 and made.parent == Path(tempfile.gettempdir()).resolve()
    made.rmdir()
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)  # writable by all, not sticky: someone could rename the private folder and put theirs there
    monkeypatch.setattr(tempfile, "tempdir", str(shared))
    with pytest.raises(Refused, match=f"{shared}: the temporary folder \\(TMPDIR\\) is writable by others and not "
                                      "sticky .* set TMPDIR to a folder only you can write"):
        private_folder("vocagno-test-")


def test_a_copy_links_this_users_own_files_and_copies_anyone_elses(tmp_path):
    from vocagno.doors.private import copy_file

    own = tmp_path / "own.bin"
    own.write_bytes(b"weights" * 1000)
    copy_file(own, tmp_path / "linked")
    assert os.stat(tmp_path / "linked").st_ino == own.stat().st_ino  # no disk, no time
    theirs = tmp_path / "theirs.bin"
    theirs.write_bytes(b"theirs" * 1000)
    os.chown(theirs, 65534, 65534)  # nobody's: they may rewrite it after the check
    copy_file(theirs, tmp_path / "copied")
    assert os.stat(tmp_path / "copied").st_ino != theirs.stat().st_ino
    assert (tmp_path / "copied").read_bytes() == theirs.read_bytes()
    theirs.chmod(0o666)
    os.chown(theirs, os.geteuid(), os.getegid())  # this user's, but anyone may write it
    copy_file(theirs, tmp_path / "copied again")
    assert os.stat(tmp_path / "copied again").st_ino != theirs.stat().st_ino


def test_a_model_folders_config_swapped_during_loads_never_reaches_transformers_unchecked(tmp_path):
    """Someone who can write the folder swaps config.json for one of 64 layers (its weights hold one) and back, all
    through the loads: each load builds the checked one-layer model or is refused in one line, never the other."""
    import threading

    from transformers import AutoModelForCausalLM

    from vocagno.doors.untrusted import from_pretrained

    folder = _model_folder(tmp_path / "model")
    honest = (folder / "config.json").read_text()
    swapped = json.dumps({**json.loads(honest), "num_hidden_layers": 64})
    (tmp_path / "honest.json").write_text(honest)
    (tmp_path / "swapped.json").write_text(swapped)
    os.chown(tmp_path / "swapped.json", 65534, 65534)
    stop = threading.Event()

    def swap():
        while not stop.is_set():
            for source in ("swapped.json", "honest.json"):
                os.link(tmp_path / source, folder / "config.swap")
                os.replace(folder / "config.swap", folder / "config.json")

    swapper = threading.Thread(target=swap)
    swapper.start()
    built, refused = 0, 0
    try:
        for _ in range(12):
            try:
                model = from_pretrained(AutoModelForCausalLM, str(folder))
            except UntrustedFile as error:
                # the swapped config checked, or the swapper's own file gone as it was copied: one line either way
                assert any(why in str(error) for why in ("its config does not describe its weights",
                                                         "went away while")), error
                assert str(folder) in str(error) and "\n" not in str(error)
                refused += 1
            else:
                assert model.config.num_hidden_layers == 1 and model.config._name_or_path == str(folder)
                built += 1
    finally:
        stop.set()
        swapper.join()
    assert built + refused == 12 and built > 0, (built, refused)


def test_a_file_that_goes_away_between_the_folders_listing_and_its_copy_is_refused_in_one_line(tmp_path, monkeypatch):
    """Someone who can write the folder removes a file the listing named (a swap's link renamed over another name):
    the copy is refused, naming the file, not ended by a FileNotFoundError's traceback."""
    from vocagno.doors import private
    from vocagno.doors.untrusted.files import UntrustedFile

    folder = tmp_path / "model"
    folder.mkdir()
    for name in ("config.json", "config.swap"):
        (folder / name).write_text("{}")
    listed = private.check_folder

    def listing_then_gone(source):
        files = listed(source)
        (Path(source) / "config.swap").unlink()
        return files

    monkeypatch.setattr(private, "check_folder", listing_then_gone)
    with pytest.raises(UntrustedFile, match="config.swap: refused: it went away while it was copied"):
        private.copy_folder(folder, tmp_path / "copy")
