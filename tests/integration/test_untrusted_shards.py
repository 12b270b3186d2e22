"""A shard folder from elsewhere plays the attacker against every reader of shards: the streaming dataset (a local
folder, and a remote on this machine), ``python -m vocagno.inspect``, ``python -m vocagno.score`` and
``python -m vocagno.selection``. Each is refused in one line naming the file, before anything is written outside
the folder, allocated from a count in the index, or read from a link, device or FIFO.

The cases that would take gigabytes or hang on a reader that trusts the index run in one child interpreter of their
own (``_run_cases``): each case a fork of it with its address space capped 2 GiB above what the imports took and a
timeout."""

import json
import os
import re
import shutil
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import zstandard
from streaming.base.hashing import get_hash
from test_selection import convert

from vocagno import inspect, score, selection
from vocagno.data.dataset import TeacherGuidedDataset
from vocagno.doors.untrusted import UntrustedFile
from helpers import ends

REPO = Path(__file__).resolve().parents[2]
TEXT = REPO / "vocagno" / "assets" / "text"
BOMB_BYTES = 4 << 30  # what the crafted zstd shard (128 KiB) expands to
CASE_SECONDS = 30  # a case past it hangs (a FIFO opened for reading waits for a writer)


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """20 GSM8K problems in llama2 / mistral shards (one zstd shard of 27 samples): tiny-math-teacher reads them."""
    texts = [json.loads(line)["text"] for line in open(TEXT / "gsm8k_heldout_100.jsonl", encoding="utf-8")][:20]
    return convert(texts, tmp_path_factory.mktemp("shards") / "shards")


def crafted(shards: Path, folder: Path, change=None) -> Path:
    """A copy of ``shards`` (its index, vocagno.json and compressed shards only) whose index ``change`` edits, as
    someone else's file may say anything."""
    folder.mkdir(parents=True)
    for name in ("index.json", "vocagno.json"):
        shutil.copy(shards / name, folder / name)
    index = json.loads((shards / "index.json").read_text())
    for info in index["shards"]:
        target = folder / info["zip_data"]["basename"]
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(shards / info["zip_data"]["basename"], target)
    if change is not None:
        change(index["shards"][0], folder)
        (folder / "index.json").write_text(json.dumps(index))
    return folder


def one_line_error(text: str) -> str:
    """The one ``error: ...`` line of what an entry point wrote (a progress bar may stand before it), and no
    traceback."""
    assert text.count("error: ") == 1 and "Traceback" not in text, text[-3000:]
    return text[text.index("error: "):].splitlines()[0]


# ---- names that leave the folder ----

def _outside(info: dict, folder: Path) -> None:
    info["raw_data"]["basename"] = "../outside/shard.00000.mds"  # where the decompressed shard would be written


def test_the_dataset_refuses_a_shard_name_out_of_its_local_folder_and_writes_nothing_there(shards, tmp_path):
    folder = crafted(shards, tmp_path / "shards", _outside)
    (tmp_path / "outside").mkdir()
    with pytest.raises(UntrustedFile, match=r"index.json: refused: its shard name '\.\./outside/shard.00000.mds' is "
                                            "not a relative path inside its folder"):
        TeacherGuidedDataset(local=str(folder), batch_size=1)[0]
    assert not list((tmp_path / "outside").iterdir())


def test_the_dataset_refuses_a_remote_index_naming_a_download_out_of_local_before_it_is_placed(shards, tmp_path):
    def escape(info, folder):
        for key in ("raw_data", "zip_data"):
            info[key]["basename"] = "../escape/" + Path(info[key]["basename"]).name
        (folder.parent / "escape").mkdir()  # the remote holds what the names lead to
        shutil.copy(shards / "part-00000-000000" / "shard.00000.mds.zstd", folder.parent / "escape")

    remote = crafted(shards, tmp_path / "remote" / "shards", escape)
    local = tmp_path / "cache" / "local"
    with pytest.raises(UntrustedFile, match=r"shards/index.json: refused: its shard name '\.\./escape/"):
        TeacherGuidedDataset(local=str(local), remote=str(remote), batch_size=1)[0]
    assert not (tmp_path / "cache" / "escape").exists()
    assert not (local / "index.json").exists()  # Streaming never sees an index vocagno refused


def test_inspect_refuses_a_shard_name_out_of_the_folder_in_one_line(shards, tmp_path, capsys):
    folder = crafted(shards, tmp_path / "shards", _outside)
    (tmp_path / "outside").mkdir()
    assert ends(inspect.main, ["--shards", str(folder), "--max-samples", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {folder}/index.json: refused: its shard name '../outside/")
    assert not list((tmp_path / "outside").iterdir())


# ---- counts and hashes the scoring pass and the selection report trusted ----

def _negative(info, folder):
    info["samples"] = -3


def _unknown_hash(info, folder):
    for key in ("raw_data", "zip_data"):
        info[key]["hashes"] = {"sha1": "0" * 40}
    info["hashes"] = ["sha1"]


@pytest.mark.parametrize("change, message", [
    (_negative, "shard 0 says it holds -3 samples: its 52,376 bytes hold 1 to 13,092"),
    (_unknown_hash, "shard 0's raw_data has no xxh3_64 hash"),
], ids=["negative-count", "unknown-hash"])
def test_score_refuses_an_index_it_cannot_check_and_publishes_nothing(shards, tmp_path, change, message, capsys):
    folder = crafted(shards, tmp_path / "shards", change)
    assert ends(score.main, ["--shards", str(folder), "--teacher", "tiny-math-teacher", "--out",
                             str(tmp_path / "scored"), "--dtype", "float32", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {folder}/index.json: refused: {message}")
    assert not (tmp_path / "scored" / "index.json").exists()


def test_selection_refuses_shards_whose_index_names_an_unknown_hash_in_one_line(shards, tmp_path, capsys):
    folder = crafted(shards, tmp_path / "shards", _unknown_hash)
    code = ends(selection.main, ["--shards", str(folder), "--teacher", "tiny-math-teacher", "--samples", "4",
                                 "--dtype", "float32", "--json", str(tmp_path / "out.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert err[0] == f"error: {folder}/index.json: refused: shard 0's raw_data has no xxh3_64 hash: vocagno checks " \
                     "every shard it reads against its hash, and vocagno's converter records one"
    assert not (tmp_path / "out.json").exists()


# ---- what would take gigabytes or hang: one child interpreter, each case a fork with its memory capped ----

RUNNER = textwrap.dedent('''
    import json, os, resource, signal, sys, time, traceback
    import vocagno.data.dataset, vocagno.inspect, vocagno.score  # what the cases import, before the cap
    from vocagno.entry import run

    def dataset(local, remote=None):  # a sample read as train.py's loader reads it
        vocagno.data.dataset.TeacherGuidedDataset(local=local, remote=remote, batch_size=1)[0]
        return 0

    ENTRIES = {"inspect": lambda args: vocagno.inspect.main(args), "score": lambda args: vocagno.score.main(args),
               "dataset": lambda args: dataset(*args)}
    cases, out, seconds = json.loads(sys.argv[1]), sys.argv[2], float(sys.argv[3])
    results = {}
    for name, entry, args in cases:
        err = os.path.join(out, name + ".err")
        pid = os.fork()
        if pid == 0:
            fd = os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(fd, 2)
            os.dup2(fd, 1)
            size = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
            resource.setrlimit(resource.RLIMIT_AS, (size + (2 << 30), size + (2 << 30)))
            code = 1
            try:
                run(lambda: ENTRIES[entry](args))  # as the command line ends: one line and exit 2 for a refusal
            except SystemExit as error:
                code = error.code
            except BaseException:
                traceback.print_exc()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        deadline = time.monotonic() + seconds
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                results[name] = os.waitstatus_to_exitcode(status)
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                results[name] = "timeout"
                break
            time.sleep(0.05)
    print(json.dumps(results))
''')


def _bomb(info, folder):
    """The shard replaced by 128 KiB of zstd that expands to 4 GiB (its size in the frame), its hash recorded: the
    index's raw size (52,376 bytes) is all it may give."""
    zipped = folder / info["zip_data"]["basename"]
    with open(zipped, "wb") as f, zstandard.ZstdCompressor(level=1, write_content_size=True).stream_writer(
            f, size=BOMB_BYTES, closefd=False) as writer:
        zeros = bytes(16 << 20)
        for _ in range(BOMB_BYTES // len(zeros)):
            writer.write(zeros)
    data = zipped.read_bytes()
    info["zip_data"].update(bytes=len(data), hashes={"xxh3_64": get_hash("xxh3_64", data)})


def _billion(info, folder):
    info["samples"] = 10**9


def _zero_link(info, folder):
    zipped = folder / info["zip_data"]["basename"]
    zipped.unlink()
    zipped.symlink_to("/dev/zero")


def _fifo(info, folder):
    zipped = folder / info["zip_data"]["basename"]
    zipped.unlink()
    os.mkfifo(zipped)


def _mds(samples: list[bytes]) -> bytes:
    """An MDS shard of ``samples``: its count, its offsets, then the samples."""
    begin = 4 + 4 * (len(samples) + 1)
    offsets = [begin + sum(map(len, samples[:i])) for i in range(len(samples) + 1)]
    return struct.pack(f"<{len(offsets) + 1}I", len(samples), *offsets) + b"".join(samples)


def _linked(info, folder, zip_name: str) -> Path:
    """The index names its shard ``out/authorized_keys`` (its compressed file ``zip_name``), a sound MDS header, then
    whatever the author likes; ``victim``, beside ``folder``, the folder a link at ``out`` leads to."""
    raw = _mds([b"\nssh-ed25519 AAAA attacker\n"])
    zipped = zstandard.ZstdCompressor().compress(raw)
    (folder / zip_name).parent.mkdir(exist_ok=True)
    (folder / zip_name).write_bytes(zipped)
    info.update(samples=1, raw_data={"basename": "out/authorized_keys", "bytes": len(raw),
                                     "hashes": {"xxh3_64": get_hash("xxh3_64", raw)}},
                zip_data={"basename": zip_name, "bytes": len(zipped),
                          "hashes": {"xxh3_64": get_hash("xxh3_64", zipped)}})
    victim = folder.parent / "victim"
    victim.mkdir()
    return victim


def _through_link(info, folder):
    """A shard folder whose ``out`` is a link: the shard decompressed there is written where it leads."""
    (folder / "out").symlink_to(_linked(info, folder, "x.zstd"))


def _cache_through_link(info, folder):
    """A remote's shards, to be downloaded into a local cache (someone else's too) whose ``out`` is a link: the
    download and the decompressed shard are written where it leads."""
    local = folder.parent / "local"
    local.mkdir()
    (local / "out").symlink_to(_linked(info, folder, "out/x.zstd"))


def _crafted_sample(info, folder):
    """Sample 0's bytes all 0xff, its shard's header, sizes and hashes as the index says: the decoder meets a
    length past the sample's end."""
    zipped = folder / info["zip_data"]["basename"]
    raw = bytearray(zstandard.ZstdDecompressor().decompress(zipped.read_bytes()))
    begin, end = struct.unpack_from("<II", raw, 4)
    raw[begin:end] = b"\xff" * (end - begin)
    data = zstandard.ZstdCompressor().compress(bytes(raw))
    zipped.write_bytes(data)
    info["raw_data"]["hashes"] = {"xxh3_64": get_hash("xxh3_64", bytes(raw))}
    info["zip_data"].update(bytes=len(data), hashes={"xxh3_64": get_hash("xxh3_64", data)})


def _raw(info, folder, edit=None) -> Path:
    """The shard decompressed beside its compressed file, as a folder read before holds it (Streaming counts a raw
    file there as present and reads it as it is); ``edit`` changes its bytes."""
    raw = zstandard.ZstdDecompressor().decompress((folder / info["zip_data"]["basename"]).read_bytes())
    target = folder / info["raw_data"]["basename"]
    target.write_bytes(edit(bytearray(raw)) if edit else raw)
    return target


def _raw_link(info, folder):
    """The raw shard in the folder is a link to a file elsewhere (here a sound shard: what it reads is another's)."""
    target = _raw(info, folder)
    elsewhere = folder.parent / "elsewhere.mds"
    target.rename(elsewhere)
    target.symlink_to(elsewhere)


def _raw_longer(info, folder):
    _raw(info, folder, lambda raw: bytes(raw) + b"appended")


def _raw_header(info, folder):
    """Sample 0 ends 4 GiB into a shard of the size its index says: a reader that believes it allocates 4 GiB."""
    def edit(raw):
        struct.pack_into("<I", raw, 8, 0xFFFFFFF0)
        return bytes(raw)
    _raw(info, folder, edit)


def _scoring(folder: Path, out: Path) -> list[str]:
    return ["--shards", str(folder), "--teacher", "tiny-math-teacher", "--out", str(out), "--dtype", "float32",
            "--device", "cpu"]


@pytest.fixture(scope="module")
def capped(shards, tmp_path_factory):
    """name -> (exit code or "timeout", what the case wrote, its folder) of every case below, run by one child."""
    root = tmp_path_factory.mktemp("capped")
    plan = {  # name: (entry, change, what reads the crafted folder)
        "inspect-billion-samples": ("inspect", _billion, "shards"),
        "inspect-bomb": ("inspect", _bomb, "shards"),
        "inspect-dev-zero": ("inspect", _zero_link, "shards"),
        "score-bomb": ("score", _bomb, "score"),
        "score-fifo": ("score", _fifo, "score"),
        "remote-bomb": ("dataset", _bomb, "remote"),
        "remote-fifo": ("dataset", _fifo, "remote"),
        "inspect-through-link": ("inspect", _through_link, "shards"),
        "remote-through-link": ("dataset", _cache_through_link, "remote"),
        "inspect-crafted-sample": ("inspect", _crafted_sample, "shards"),
        "inspect-raw-link": ("inspect", _raw_link, "shards"),
        "inspect-raw-longer": ("inspect", _raw_longer, "shards"),
        "dataset-raw-header": ("dataset", _raw_header, "local"),
    }
    cases, folders = [], {}
    for name, (entry, change, reader) in plan.items():
        folder = crafted(shards, root / name / "shards", change)
        folders[name] = folder
        args = {"shards": ["--shards", str(folder), "--max-samples", "2"],
                "score": _scoring(folder, root / name / "scored"),
                "remote": [str(root / name / "local"), str(folder)], "local": [str(folder)]}[reader]
        cases.append((name, entry, args))
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", RUNNER, json.dumps(cases), str(root), str(CASE_SECONDS)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=60 + CASE_SECONDS * len(cases))
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    return {name: (results[name], (root / f"{name}.err").read_text(errors="replace"), folders[name])
            for name in plan}


def _refused(capped, name: str) -> str:
    code, text, _ = capped[name]
    assert code == 2, f"{name}: {code}\n{text[-3000:]}"  # a refusal, as every command line ends one
    return one_line_error(text)


def test_a_billion_samples_in_the_index_are_refused_before_streaming_allocates_for_them(capped):
    folder = capped["inspect-billion-samples"][2]
    assert _refused(capped, "inspect-billion-samples") == (
        f"error: {folder}/index.json: refused: shard 0 says it holds 1000000000 samples: its 52,376 bytes hold 1 to "
        "13,092")


@pytest.mark.parametrize("name", ["inspect-bomb", "score-bomb", "remote-bomb"])
def test_a_shard_that_expands_past_its_raw_size_is_refused_without_expanding_it(capped, name):
    error = _refused(capped, name)
    assert re.search(r"shard.00000.mds.zstd: refused: it decompresses to more .*52,376", error), error
    if name == "score-bomb":
        scored = capped[name][2].parent / "scored"
        assert not (scored / "index.json").exists()
        assert not list(scored.glob(".*staging*"))  # no staging folder left behind


@pytest.mark.parametrize("name, kind", [
    ("inspect-dev-zero", "a symbolic link"), ("score-fifo", "a FIFO"), ("remote-fifo", "a FIFO"),
])
def test_a_shard_that_is_a_link_to_a_device_or_a_fifo_is_refused_unread(capped, name, kind):
    folder = capped[name][2]
    assert _refused(capped, name) == (
        f"error: {folder}/part-00000-000000/shard.00000.mds.zstd: refused: {kind}: vocagno reads regular files only"
        + (", and follows no link (copy the file itself there)" if "link" in kind else ""))


@pytest.mark.parametrize("name", ["inspect-through-link", "remote-through-link"])
def test_a_shard_named_through_a_linked_folder_is_refused_and_nothing_is_written_where_the_link_leads(capped, name):
    folder = capped[name][2]
    local = folder if name.startswith("inspect") else folder.parent / "local"
    assert _refused(capped, name) == (
        f"error: {local}/out/authorized_keys: refused: a path through a link: vocagno reads regular files only, and "
        "follows no link (copy the file itself there)")
    assert not list((folder.parent / "victim").iterdir())


def test_a_sample_whose_bytes_do_not_decode_is_refused_naming_its_shard_and_sample(capped):
    folder = capped["inspect-crafted-sample"][2]
    assert _refused(capped, "inspect-crafted-sample") == (
        f"error: {folder}/part-00000-000000/shard.00000.mds: refused: its sample 0 does not decode as its columns say "
        "(IndexError: index out of range)")


def test_shards_already_in_a_local_folder_are_checked_before_streaming_reads_them(capped):
    shard = "part-00000-000000/shard.00000.mds"
    assert _refused(capped, "inspect-raw-link") == (
        f"error: {capped['inspect-raw-link'][2]}/{shard}: refused: a symbolic link: vocagno reads regular files only, "
        "and follows no link (copy the file itself there)")
    assert _refused(capped, "inspect-raw-longer") == (
        f"error: {capped['inspect-raw-longer'][2]}/{shard}: refused: 52,384 bytes, its index says 52,376")
    assert _refused(capped, "dataset-raw-header") == (
        f"error: {capped['dataset-raw-header'][2]}/{shard}: refused: not an MDS shard of the 27 samples its index says")


def test_an_object_store_index_is_checked_before_it_is_placed_and_a_sound_one_reads(shards, s3, tmp_path,
                                                                                   monkeypatch):
    env, client = s3
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    sound = crafted(shards, tmp_path / "sound")
    bad = crafted(shards, tmp_path / "bad", lambda info, folder: info["zip_data"].update(basename="../x.mds.zstd"))
    for folder in (sound, bad):
        for path in folder.rglob("*"):
            if path.is_file():
                client.upload_file(str(path), "runs", f"shards-{folder.name}/{path.relative_to(folder)}")
    dataset = TeacherGuidedDataset(local=str(tmp_path / "local-sound"), remote="s3://runs/shards-sound", batch_size=1)
    assert len(dataset) == 27 and dataset[26]["text"]
    with pytest.raises(UntrustedFile, match=r"s3://runs/shards-bad/index.json: refused: its shard name '\.\./x"):
        TeacherGuidedDataset(local=str(tmp_path / "local-bad"), remote="s3://runs/shards-bad", batch_size=1)
    assert sorted(p.name for p in (tmp_path / "local-bad").iterdir()) == ["vocagno.json"]  # no index, no temporary


def test_a_sample_whose_offsets_are_out_of_order_is_refused_in_one_line(tmp_path):
    """Offsets that decode, lie within their text and hold start <= end, but not in text order (which the alignment
    needs): the dataset names the shard and the sample instead of the alignment's traceback."""
    import numpy as np
    from streaming import MDSWriter

    from vocagno.data.dataset import TeacherGuidedDataset
    from vocagno.data.shards import COLUMNS, ShardMetadata, TokenizerInfo
    from vocagno.doors.untrusted import UntrustedFile

    folder = tmp_path / "shards"
    with MDSWriter(out=str(folder), columns=COLUMNS, hashes=["xxh3_64"]) as writer:
        for student in ([[0, 2], [2, 4]], [[2, 4], [0, 2]]):
            writer.write({"text": "abcd", "student_ids": np.array([5, 6], np.uint16),
                          "student_offsets": np.array(student, np.uint16), "teacher_ids": np.array([7], np.uint16),
                          "teacher_offsets": np.array([[0, 4]], np.uint16)})
    info = TokenizerInfo("llama2", "a255706a2929068e", 32000, "</s>", 2)
    ShardMetadata(student=info, teacher=info, seq_len=2).write(folder)
    dataset = TeacherGuidedDataset(local=str(folder), batch_size=1)
    assert dataset[0]["student_offsets"].tolist() == [[0, 2], [2, 4]]
    with pytest.raises(UntrustedFile, match=r"shard.00000.mds: refused: its sample 1 does not hold vocagno's columns "
                                            r"\(.*its student offsets: offsets are not sorted") as refused:
        dataset[1]
    assert "\n" not in str(refused.value)
    del dataset


@pytest.mark.parametrize("remote", ["on this machine", "object store"])
def test_a_download_folder_swapped_for_a_link_after_it_was_made_leads_no_write_out(shards, s3, tmp_path, monkeypatch,
                                                                                  remote):
    """Someone who can write the shared cache replaces the private folder a download lands in (right after vocagno
    made it) by a link to a folder of theirs' choosing: nothing is written there."""
    import tempfile

    victim = tmp_path / "victim"
    victim.mkdir()
    made = tempfile.mkdtemp

    def swapped(*args, **kwargs):
        folder = made(*args, **kwargs)
        if os.path.basename(folder).startswith(".download-"):
            os.rename(folder, folder + "-moved")
            os.symlink(victim, folder)
        return folder

    source = str(crafted(shards, tmp_path / "remote"))
    if remote == "object store":
        env, client = s3
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        for path in Path(source).rglob("*"):
            if path.is_file():
                client.upload_file(str(path), "runs", f"swapped/{path.relative_to(source)}")
        source = "s3://runs/swapped"
    monkeypatch.setattr(tempfile, "mkdtemp", swapped)
    with pytest.raises(UntrustedFile, match=r"refused: .*\.download-\w+: the private folder it made was replaced"):
        TeacherGuidedDataset(local=str(tmp_path / "cache"), remote=source, batch_size=1)[0]
    assert list(victim.iterdir()) == []


@pytest.mark.parametrize("swap", ["fifo", "header"])
def test_a_local_shard_swapped_after_it_was_checked_is_refused_as_it_is_read(shards, tmp_path, swap):
    """Streaming reads each sample by the shard's path, its offsets from the file again: a shard replaced after the
    dataset checked it (a FIFO, or a header whose sample 0 ends 4 GiB in) is refused as it is read, not waited on or
    allocated for."""
    from bounded import within

    folder = crafted(shards, tmp_path / "local")
    index = json.loads((folder / "index.json").read_text())
    target = _raw(index["shards"][0], folder)
    dataset = TeacherGuidedDataset(local=str(folder), batch_size=1)
    swapped = tmp_path / "swapped"
    if swap == "fifo":
        os.mkfifo(swapped)
    else:
        raw = bytearray(target.read_bytes())
        struct.pack_into("<I", raw, 8, 0xFFFFFFF0)
        swapped.write_bytes(bytes(raw))
    os.rename(swapped, target)
    message = "a FIFO" if swap == "fifo" else "its sample 0 lies outside the file (bytes 432 to 4,294,967,280 of 52,376)"
    with within(seconds=20, memory=1 << 30), pytest.raises(UntrustedFile,
                                                           match=re.escape(f"{target}: refused: {message}")):
        dataset[0]


def test_the_work_folder_of_a_long_non_ascii_out_root_is_a_name_the_file_system_takes(tmp_path, monkeypatch):
    from vocagno.data.outroots import work_folder

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    folder = work_folder("s3://bucket/" + "データ" * 40)
    assert folder.is_dir() and len(folder.name.encode()) <= 255
