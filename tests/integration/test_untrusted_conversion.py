"""The converter (conversion/convert_dataset.py) against files an attacker wrote: a corpus folder holding a link to
/proc/self/environ or a FIFO, an out-root whose state files are a link to /dev/zero, a FIFO or an index with numbers
no shard holds, a link planted at a part's staging name, and documents and files that would take memory without
bound (a 1 GiB line, a gzip bomb). Each runs the converter's main() in this process, bounded in time (an alarm) and,
where an old reader would read without end, in memory (RLIMIT_AS), so a regression fails here instead of hanging or
exhausting the machine."""

import contextlib
import gzip
import json
import os
import tracemalloc
from pathlib import Path

import pytest
from bounded import within
from test_conversion import converts, small_corpus

from vocagno.conversion.columnar import PYTHON_BYTES
from vocagno.conversion.records import Record, TextOf
from vocagno.conversion.sources import sources_of
from vocagno.data.shards import ShardMetadata


def every_byte(folder):
    return b"".join(p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file() and not p.is_symlink())


# ---- the corpus ----

def test_a_link_to_proc_self_environ_and_a_fifo_in_a_corpus_folder_are_named_and_never_read(tmp_path, capsys):
    """A corpus folder is someone else's: a .txt link to /proc/self/environ would publish the converter's environment
    in the shards (a .txt file is one document), a FIFO would block the reader for ever. Both are listed as paths
    that can't be read, with why, and the rest converts."""
    with open("/proc/self/environ", "rb") as f:  # what this process's environment is, as the link would read it
        values = [v.partition(b"=")[2] for v in f.read().split(b"\0")]
    secrets = [v for v in values if len(v) >= 16]
    assert secrets
    docs = tmp_path / "docs"
    docs.mkdir()
    small_corpus(docs / "good.jsonl")
    (docs / "env.txt").symlink_to("/proc/self/environ")
    os.mkfifo(docs / "pipe.jsonl")
    root = tmp_path / "shards"
    with within():
        assert converts(root, "--compression", "none", inputs=[docs]) == 0
    out = capsys.readouterr().out
    assert (f"{docs}: ignored 2 path(s) that can't be read: env.txt (a link to a file: only regular files are read), "
            "pipe.jsonl (a FIFO: only regular files are read)") in out
    assert ShardMetadata.read(root).totals["documents read"] == 40
    shards = every_byte(root)
    assert not [s for s in secrets if s in shards]


def test_a_fifo_or_a_device_named_as_the_input_is_refused_in_one_line(tmp_path):
    os.mkfifo(tmp_path / "pipe.jsonl")
    for path, kind in ((tmp_path / "pipe.jsonl", "a FIFO"), ("/dev/zero", "a character device")):
        with within():
            message = converts(tmp_path / "shards", inputs=[path])
        assert message == f"error: {path}: refused: {kind}: only regular files are read (the input named)"
        assert list((tmp_path / "shards").iterdir()) == []  # the out-root, made empty when the job started


# ---- the out-root's state files ----

def test_a_settings_file_linked_to_dev_zero_or_a_fifo_lock_is_refused_in_one_line(tmp_path):
    """The settings a resumed job compares (conversion.json) and a job's lock are read back from the out-root: a link
    to /dev/zero there would be read until memory runs out, a FIFO would block for ever. Each is refused in one line
    naming it, at once, and nothing is written there."""
    corpus = small_corpus(tmp_path / "docs.jsonl")
    zero, fifo = tmp_path / "zero", tmp_path / "fifo"
    zero.mkdir()
    (zero / "conversion.json").symlink_to("/dev/zero")
    fifo.mkdir()
    os.mkfifo(fifo / "job-0000-of-0001.lock")
    for root, name, kind in ((zero, "conversion.json", "a symbolic link"), (fifo, "job-0000-of-0001.lock", "a FIFO")):
        with within(seconds=30):
            message = converts(root, inputs=[corpus])
        assert message.startswith(f"error: {root / name}: refused: {kind}") and "\n" not in message, message
        assert [p.name for p in root.iterdir()] == [name]


@pytest.mark.parametrize("samples", [10**9, -1])
def test_a_parts_index_with_samples_no_shard_holds_is_refused_before_the_merge_uses_it(tmp_path, samples):
    """A part's index.json on the out-root says how many samples its shards hold: a billion (Streaming would
    allocate for each) or a negative count is refused in one line naming the file, and nothing is published."""
    corpus = small_corpus(tmp_path / "docs.jsonl")
    root = tmp_path / "shards"
    assert converts(root, inputs=[corpus]) == 0
    (root / "index.json").unlink()
    (root / "vocagno.json").unlink()
    index_file = next(root.glob("part-*/index.json"))
    index = json.loads(index_file.read_text())
    index["shards"][0]["samples"] = samples
    index_file.write_text(json.dumps(index))
    with within(seconds=30):
        message = converts(root, "--merge-only", inputs=[corpus])
    assert message.startswith(f"error: {index_file}: refused: shard 0 says it holds {samples!r} samples"), message
    assert not (root / "index.json").exists() and not (root / "vocagno.json").exists()


def test_a_link_planted_at_a_parts_staging_name_is_not_written_through(tmp_path, monkeypatch):
    """A part is built under a fresh private name of the converter's own: a link someone planted at the name the next
    part was once built under (.tmp-part-...), while the job runs, leads nowhere the converter writes."""
    from vocagno.data.outroots import Output

    victim = tmp_path / "victim"
    victim.mkdir()
    root = tmp_path / "shards"
    planted = root / ".tmp-part-00000-000001"
    upload = Output.publish_part

    def plants(self, name):  # once the first part is published, before the second is built
        upload(self, name)
        if not os.path.lexists(planted):
            planted.symlink_to(victim)

    monkeypatch.setattr(Output, "publish_part", plants)
    assert converts(root, "--docs-per-part", "20", inputs=[small_corpus(tmp_path / "docs.jsonl")]) == 0
    assert list(victim.iterdir()) == [] and planted.is_symlink()
    for part in ("part-00000-000000", "part-00000-000001"):
        assert (root / part).is_dir() and not (root / part).is_symlink() and (root / part / "part.json").is_file()
    assert ShardMetadata.read(root).totals["documents converted"] == 40


# ---- memory: documents and files over their caps ----

def test_documents_over_the_cap_are_skipped_counted_and_named_and_a_large_json_array_is_refused(tmp_path,
                                                                                                monkeypatch, capsys):
    """A .jsonl line, a .txt file and a gzip bomb's one line over VOCAGNO_MAX_DOCUMENT_BYTES are skipped without
    being held whole, counted, and named by file and line in the summary; a JSON array over VOCAGNO_MAX_JSON_BYTES
    (read whole) is refused, named as a file that can't be read; everything else converts."""
    monkeypatch.setenv("VOCAGNO_MAX_DOCUMENT_BYTES", "4000")
    monkeypatch.setenv("VOCAGNO_MAX_JSON_BYTES", str(8 << 20))  # above the tokenizers' tokenizer.json (5.4 MB)
    docs = tmp_path / "docs"
    docs.mkdir()
    small_corpus(docs / "a.jsonl", extra=["x " * 3000])  # line 41: 6,000 characters of text
    (docs / "b.txt").write_text("y " * 3000)
    (docs / "c.jsonl.gz").write_bytes(gzip.compress(b'{"text": "fine"}\n' + b"0" * (4 << 20) + b"\n", 9))
    (docs / "d.json").write_text(json.dumps([{"text": "z " * 1000}] * 4500))  # 9 MB
    root = tmp_path / "shards"
    with within():
        assert converts(root, inputs=[docs]) == 1
    out = capsys.readouterr().out
    reason = "over the document cap of 4,000 bytes (VOCAGNO_MAX_DOCUMENT_BYTES)"
    for where in (f"{docs / 'a.jsonl'} line 41", f"{docs / 'b.txt'} (the whole file, one document)",
                  f"{docs / 'c.jsonl.gz'} line 2"):
        assert f"skipped, over the document cap: {where}\n" in out, where
    assert f"UNREADABLE: {docs / 'd.json'}: UntrustedFile: {docs / 'd.json'}: refused: a JSON array of more" in out
    totals = ShardMetadata.read(root).totals
    assert totals[f"skipped: {reason}"] == 3
    assert totals["documents converted"] == 41  # a.jsonl's 40, c.jsonl.gz's first line


def read_with_peak_under(path: Path, most: int):
    """The converter's source of ``path`` and its records, read while Python's allocations peak below ``most`` bytes
    (tracemalloc)."""
    (source,) = sources_of([str(path)], "train", TextOf())
    tracemalloc.start()
    try:
        records = list(source.records())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < most, f"{peak:,} bytes at the peak"
    return source, records


def test_a_gzip_bomb_of_one_line_is_read_in_bounded_memory(tmp_path, monkeypatch):
    """A 40 KB .gz that expands to one 32 MiB line: with a 1 MiB cap, reading it holds about the cap, not the line
    (peak of Python's allocations while the file is read, tracemalloc)."""
    monkeypatch.setenv("VOCAGNO_MAX_DOCUMENT_BYTES", str(1 << 20))
    path = tmp_path / "bomb.jsonl.gz"
    path.write_bytes(gzip.compress(b'{"text": "' + b"0" * (32 << 20) + b'"}\n{"text": "after"}\n', 9))
    assert path.stat().st_size < 100_000
    source, records = read_with_peak_under(path, 8 << 20)
    assert [getattr(r, "where", r) for r in records] == ["line 1", b'{"text": "after"}\n']
    assert source.over_cap == [f"{path} line 1"]


def dictionary_bomb(path: Path, value_bytes: int, rows: int) -> Path:
    """A .parquet file of a few KiB whose text column is dictionary-encoded: one value of ``value_bytes`` letters
    (zstd-compressed in the dictionary page), which every one of ``rows`` rows points at (run-length-encoded indices):
    ``value_bytes * rows`` bytes of text once decoded."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    column = pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()), pa.array(["a" * value_bytes]))
    pq.write_table(pa.table({"text": column}), path, compression="zstd", compression_level=19)
    return path


_POOLS = []  # every pool a test measured with, alive as long as the process: a buffer pyarrow made there may be


@contextlib.contextmanager
def arrow_allocations():
    """A pool that counts what pyarrow allocates in the block (``max_memory()``: its peak), which tracemalloc does
    not see: pyarrow's default pool, with counts of its own."""
    import pyarrow as pa

    default = pa.default_memory_pool()
    _POOLS.append(pa.proxy_memory_pool(default))
    pa.set_memory_pool(_POOLS[-1])
    try:
        yield _POOLS[-1]
    finally:
        pa.set_memory_pool(default)


def refused_unread(bomb: Path) -> str:
    """Why the corpus file ``bomb`` is refused, its one record the unreadable file's, with pyarrow having allocated
    under 1 MiB for it (the process's address space bounded meanwhile)."""
    with within(), arrow_allocations() as pool:
        (source,) = sources_of([str(bomb)], "train", TextOf())
        records = list(source.records())
    assert pool.max_memory() < 1 << 20, f"{pool.max_memory():,} bytes at the peak"
    assert [r.problem for r in records] == ["unreadable file (named in the summary)"]
    return source.error


@pytest.mark.slow
def test_a_parquet_dictionary_value_that_decodes_to_gigabytes_is_refused_in_one_line_before_it_is(tmp_path):
    """A few KiB .parquet file whose dictionary page holds one 256 MiB value, which 8 rows point at (2 GiB of text;
    with 1 GiB, pyarrow decoded the page and a batch of its rows, 4 GiB at the peak, before a row was measured
    against the cap; 256 MiB is over the cap all the same, and the file is made 4 times faster).
    The page's header says it decodes to more than the document cap a value: the file is refused, named in one line,
    before pyarrow allocates anything for it; the corpus's other files convert."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    bomb = dictionary_bomb(corpus / "bomb.parquet", 1 << 28, 8)
    assert bomb.stat().st_size < 64 << 10
    small_corpus(corpus / "docs.jsonl")
    assert refused_unread(bomb) == (
        f"UntrustedFile: {bomb}: refused: row group 1 of its column 'text' holds a page of 1 value(s) that decodes "
        f"to {(1 << 28) + 4:,} bytes: a value over the document cap of 67,108,864 bytes, which pyarrow would decode "
        "whole (raise VOCAGNO_MAX_DOCUMENT_BYTES if it is right)")
    with within(), arrow_allocations() as pool:
        assert converts(tmp_path / "shards", inputs=[corpus]) == 1  # a file that can't be read: named, exit 1
    assert pool.max_memory() < 64 << 20, f"{pool.max_memory():,} bytes at the peak"
    assert ShardMetadata.read(tmp_path / "shards").totals["documents converted"] == 40


@pytest.mark.parametrize("damage, why", [
    (lambda header: bytes([header[0] & 0xF0 | 13]) + header[1:], "a page header holds a value of unknown type 13"),
    (lambda header: header[:1] + b"\xff" * 10 + header[11:], "a page header's number runs over 64 bits"),
])
def test_a_parquet_page_header_an_attacker_rewrote_is_refused_in_one_line_before_pyarrow_reads_the_page(
        tmp_path, damage, why):
    """A .parquet file pyarrow wrote, its first page header's bytes rewritten in place (a field of a type Thrift does
    not have; a number of more than 64 bits): named in one line, no row read from it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"text": ["a parquet row about 3/4 of a pizza"] * 50}), path)
    column = pq.ParquetFile(path).metadata.row_group(0).column(0)
    first = min(column.data_page_offset, column.dictionary_page_offset or column.data_page_offset)
    data = path.read_bytes()
    path.write_bytes(data[:first] + damage(data[first:first + 16]) + data[first + 16:])
    assert refused_unread(path) == f"ValueError: {why}"


def test_a_parquet_dictionary_value_under_the_cap_repeated_is_read_a_few_rows_at_a_time(tmp_path):
    """A 2 KiB .parquet file whose 100,000 rows all point at one 30 MiB dictionary value (3 TB of text once decoded):
    a batch holds as many rows as BATCH_BYTES takes of the largest page (8), never 64 of them (1.9 GiB), and each row
    is made a Python string alone (30 MiB, over PYTHON_BYTES)."""
    bomb = dictionary_bomb(tmp_path / "bomb.parquet", 30 << 20, 100_000)
    assert bomb.stat().st_size < 8 << 10
    (source,) = sources_of([str(bomb)], "train", TextOf())
    with within(), arrow_allocations() as pool:
        records = source.records()
        first = [len(next(records).text) for _ in range(100)]
        records.close()
    assert first == [30 << 20] * 100 and source.error is None
    assert pool.max_memory() < 256 << 20, f"{pool.max_memory():,} bytes at the peak"


# ---- a tokenizer folder from elsewhere ----

@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_a_teacher_tokenizer_that_panics_on_a_document_is_refused_in_one_line(tmp_path, capsys, workers):
    """A teacher tokenizer whose pre-tokenizer pattern makes Oniguruma give up on a document ends in a Rust panic
    (a ``BaseException``, which a worker process can't even send back): the conversion is refused in one line that
    names the tokenizer, the text, the part and its file, and the fix."""
    from panicking import PANIC_FIX, backtracking_tokenizer

    teacher = backtracking_tokenizer(tmp_path / "teacher")
    corpus = small_corpus(tmp_path / "docs.jsonl", extra=["a" * 40 + " and more"])
    message = converts(tmp_path / "shards", "--teacher-tokenizer", str(teacher), "--workers", str(workers),
                       inputs=[corpus])
    assert message.startswith(f"error: tokenizer {str(teacher)!r}: refused: it panicked encoding one of ")
    assert message.endswith(f"{PANIC_FIX} (part part-00000-000000, from {corpus})")
    assert "\n" not in message and "PanicException: Onig: Regex search error: retry-limit-in-match over" in message


# ---- an out-root on this machine given with --local-root, and the working folder of a remote one ----

@pytest.mark.slow
def test_a_link_planted_on_an_out_root_folder_given_with_local_root_is_not_written_through(tmp_path):
    """--out-root a folder of this machine with --local-root: a part is written there as into any folder others can
    write, never through a link planted at a shard's name (a file of someone else's) or at a part's folder."""
    corpus = small_corpus(tmp_path / "docs.jsonl")
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "important.txt").write_text("the victim's file\n")
    remote = tmp_path / "remote"
    (remote / "part-00000-000000").mkdir(parents=True)
    (remote / "part-00000-000000" / "shard.00000.mds").symlink_to(victim / "important.txt")
    with within():
        assert converts(remote, "--compression", "none", "--local-root", str(tmp_path / "work"), inputs=[corpus]) == 0
    assert (victim / "important.txt").read_text() == "the victim's file\n"
    shard = remote / "part-00000-000000" / "shard.00000.mds"
    assert shard.is_file() and not shard.is_symlink()
    assert ShardMetadata.read(remote).totals["documents converted"] == 40

    other = tmp_path / "remote2"
    other.mkdir()
    (other / "part-00000-000000").symlink_to(victim)  # a part's folder: refused in one line, nothing read or written
    with within():
        message = converts(other, "--local-root", str(tmp_path / "work2"), inputs=[corpus])
    assert message.startswith(f"error: {other / 'part-00000-000000'}/") and "a path through a link" in message
    assert "\n" not in message
    assert sorted(p.name for p in victim.iterdir()) == ["important.txt"]


@pytest.mark.parametrize("kind", ["a symbolic link", "a FIFO"])
def test_a_state_file_on_an_out_root_folder_given_with_local_root_is_read_as_a_file_from_elsewhere(tmp_path, kind):
    """The same out-root's part.json, read back to see whether the part is done: a link to /dev/zero would be copied
    without end (filling the disk), a FIFO would end in a traceback. Each is refused in one line naming it."""
    remote = tmp_path / "remote"
    (remote / "part-00000-000000").mkdir(parents=True)
    planted = remote / "part-00000-000000" / "part.json"
    planted.symlink_to("/dev/zero") if kind == "a symbolic link" else os.mkfifo(planted)
    with within(seconds=30):
        message = converts(remote, "--local-root", str(tmp_path / "work"),
                           inputs=[small_corpus(tmp_path / "docs.jsonl")])
    assert message.startswith(f"error: {planted}: refused: {kind}") and "\n" not in message, message
    assert not list((tmp_path / "work").rglob("part.json"))


def test_a_remote_out_roots_working_folder_planted_in_the_temporary_folder_is_refused(tmp_path, monkeypatch):
    """An object-store out-root without --local-root works in the temporary folder, which every user of the machine
    writes: a link planted there by another user (to a folder of the victim's) is refused in one line that says to
    pass --local-root, and nothing is written through it. A folder of its own is made private (0700)."""
    tmp, victim = tmp_path / "tmp", tmp_path / "victim"
    tmp.mkdir()
    victim.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(tmp))
    for variable, value in (("AWS_ENDPOINT_URL", "http://127.0.0.1:9"), ("AWS_ACCESS_KEY_ID", "x"),
                            ("AWS_SECRET_ACCESS_KEY", "x")):  # no store is reached
        monkeypatch.setenv(variable, value)
    top = tmp / f"vocagno-convert-{os.getuid()}"
    top.symlink_to(victim)
    (tmp / "vocagno-convert").symlink_to(victim)  # the shared name earlier versions used
    with within(seconds=30):
        message = converts("s3://bucket/shards", inputs=[small_corpus(tmp_path / "docs.jsonl")])
    assert message.startswith(f"error: {top}: refused as the local working folder of s3://bucket/shards") \
        and message.endswith("pass --local-root") and "\n" not in message, message
    assert list(victim.iterdir()) == []
    from vocagno.data.outroots import work_folder

    top.unlink()
    folder = work_folder("s3://bucket/shards")
    assert work_folder("s3://bucket/x_y") != work_folder("s3://bucket/x/y")  # names alike, folders apart
    assert folder == top / "s3_bucket_shards-136c0db6cba8" and (top.stat().st_mode & 0o777, folder.stat().st_mode & 0o777) == (
        0o700, 0o700)
    top.chmod(0o755)
    with pytest.raises(Exception, match="pass --local-root"):
        work_folder("s3://bucket/shards")


# ---- the corpus, while it is read ----

def test_a_corpus_subfolder_swapped_for_a_link_after_the_listing_is_not_read(tmp_path, monkeypatch, capsys):
    """A conversion reads its corpus for hours: a subfolder swapped for a link to a folder of the victim's after the
    files were listed leads nowhere. Its file is named as one that can't be read, and the rest converts."""
    from vocagno.conversion import convert

    corpus, victim = tmp_path / "corpus", tmp_path / "victim"
    (corpus / "a").mkdir(parents=True)
    (corpus / "b").mkdir()
    victim.mkdir()
    small_corpus(corpus / "a" / "first.jsonl")
    (corpus / "b" / "notes.txt").write_text("an ordinary document of the corpus " * 20)
    (victim / "notes.txt").write_text("SECRET-TOKEN-0123456789 the victim's private notes " * 20)
    listed = convert.sources_of

    def swaps(*args, **kwargs):
        sources = listed(*args, **kwargs)
        (corpus / "b" / "notes.txt").unlink()
        (corpus / "b").rmdir()
        (corpus / "b").symlink_to(victim)
        return sources

    monkeypatch.setattr(convert, "sources_of", swaps)
    root = tmp_path / "shards"
    with within():
        assert converts(root, "--compression", "none", inputs=[corpus]) == 1
    assert b"SECRET-TOKEN" not in every_byte(root)
    assert f"UNREADABLE: {corpus / 'b' / 'notes.txt'}: UntrustedFile: " in capsys.readouterr().out
    assert ShardMetadata.read(root).totals["documents converted"] == 40


def test_a_parquet_document_over_the_cap_is_never_made_a_python_string(tmp_path, monkeypatch, capsys):
    """A 2 KB .parquet file holding a 32 MiB document, with a 1 MiB cap: pyarrow measures the value, which is
    skipped, counted and named by row without being made a Python string (peak of Python's allocations while the
    file is read, tracemalloc); the rows beside it convert."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.setenv("VOCAGNO_MAX_DOCUMENT_BYTES", str(1 << 20))
    texts = [json.loads(line)["text"] for line in small_corpus(tmp_path / "docs.jsonl").read_text().splitlines()]
    path = tmp_path / "corpus" / "big.parquet"
    path.parent.mkdir()
    pq.write_table(pa.table({"text": [*texts[:20], "a" * (32 << 20), *texts[20:]]}), path, compression="zstd")
    assert path.stat().st_size < 100_000
    source, records = read_with_peak_under(path, 8 << 20)
    assert [r.where for r in records if r.text is None] == ["row 21"] and len(records) == 41
    with within():
        assert converts(tmp_path / "shards", inputs=[path.parent]) == 0
    assert f"skipped, over the document cap: {path} row 21\n" in capsys.readouterr().out


# ---- the out-root's locks and leftovers ----

@pytest.mark.parametrize("since", [1e300, float("nan")])
def test_a_planted_merge_lock_that_never_goes_stale_is_taken_over(tmp_path, since, capsys):
    """A merge.lock on the out-root saying it was taken in the far future (or at NaN) would never go stale: every
    job would convert its parts, skip the merge and exit 0 with nothing published. It is taken over, in one line."""
    root = tmp_path / "shards"
    root.mkdir()
    (root / "merge.lock").write_text(json.dumps({"host": "elsewhere", "pid": 4242, "since": since}))
    with within():
        assert converts(root, inputs=[small_corpus(tmp_path / "docs.jsonl")]) == 0
    assert (root / "index.json").is_file() and not (root / "merge.lock").exists()
    assert f"taking over merge.lock from a lock that says it was taken at {since!r}" in capsys.readouterr().out


def test_a_name_on_the_out_root_like_a_staging_folders_without_a_part_number_is_left_alone(tmp_path):
    """Leftover staging folders of this job's parts are removed when it starts; a planted name that looks like one
    but holds no part number (.part-x.staging-1) is no part's, and is neither removed nor a crash."""
    root = tmp_path / "shards"
    root.mkdir()
    (root / ".part-x.staging-1").write_text("")
    (root / ".part-00000-000007.staging-abc").mkdir()  # this job's, of an interrupted run
    with within():
        assert converts(root, inputs=[small_corpus(tmp_path / "docs.jsonl")]) == 0
    assert (root / ".part-x.staging-1").is_file() and not (root / ".part-00000-000007.staging-abc").exists()


# ---- memory: parts of many documents, each under the cap ----

def many_copies(path: Path, value_bytes: int, rows: int) -> Path:
    """A small file of ``rows`` documents of ``value_bytes`` letters each, all under the cap: a .parquet file whose
    rows all point at one dictionary value, or a .jsonl.zst file of the same line again and again."""
    if path.name.endswith(".parquet"):
        return dictionary_bomb(path, value_bytes, rows)
    import zstandard

    line = b'{"text": "' + b"a" * value_bytes + b'"}\n'
    with open(path, "wb") as f, zstandard.ZstdCompressor(level=19).stream_writer(f) as out:
        for _ in range(rows):
            out.write(line)
    return path


@pytest.mark.parametrize("name", ["copies.parquet", "copies.jsonl.zst"])
def test_a_part_holds_at_most_part_bytes_of_documents_each_under_the_cap(tmp_path, name):
    """A file of a few KiB holding 600 documents of 1 MiB each (each under the cap): a part took --docs-per-part
    (5,000) of them, all held in memory until the part was handed to a worker (600 MiB here; 150 GB for 100,000 rows
    of one 30 MiB value, with up to twice --workers such parts pending). A part now ends before the document that
    would take it over PART_BYTES: reading the file's parts one after the other holds one part, and what the reader
    holds ahead of it, at most (peak of Python's allocations, tracemalloc), and the parts hold every document, in
    order."""
    from vocagno.conversion import parts

    path = many_copies(tmp_path / name, 1 << 20, 600)
    assert path.stat().st_size < 64 << 10
    (source,) = sources_of([str(path)], "train", TextOf())
    counts = []
    with within(seconds=120, memory=4 << 30):
        tracemalloc.start()
        try:
            for _, records, spanned in parts.parts_of([(0, source)], 5000):
                assert spanned == [source] and all(
                    (r.text if isinstance(r, Record) else json.loads(r)["text"]) == "a" * (1 << 20) for r in records)
                counts.append(len(records))
                del records
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert source.error is None and sum(counts) == 600
    # A part, and what the reader holds ahead of it: a .parquet batch's rows made Python strings PYTHON_BYTES at a time.
    assert peak < parts.PART_BYTES + PYTHON_BYTES + (4 << 20), f"{peak:,} bytes at the peak"
    per_part = parts.PART_BYTES // (1 << 20)
    assert counts[:-1] == [counts[0]] * (len(counts) - 1) and per_part - 2 <= counts[0] <= per_part, counts


# ---- memory: compressed .arrow files ----

def compressed_arrow(path: Path, columns: dict, kind: str, compression: str = "zstd") -> Path:
    """An .arrow file of one record batch of ``columns`` (pyarrow arrays), its buffers compressed, written in the IPC
    file format (``kind`` "file") or the stream format ``datasets`` writes ("stream")."""
    import pyarrow as pa

    batch = pa.record_batch(columns)
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with (pa.ipc.new_file if kind == "file" else pa.ipc.new_stream)(path, batch.schema, options=options) as writer:
        writer.write_batch(batch)
    return path


def zeros_column(value_bytes: int, rows: int):
    """A large_string column of ``rows`` values of ``value_bytes`` NUL characters each, on pages of zeros that take no
    memory (an anonymous private mapping read, never written: the kernel's zero page)."""
    import mmap

    import pyarrow as pa

    zeros = pa.py_buffer(mmap.mmap(-1, value_bytes * rows, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS))
    offsets = pa.array([i * value_bytes for i in range(rows + 1)], pa.int64()).buffers()[1]
    return pa.Array.from_buffers(pa.large_string(), rows, [None, offsets, zeros])


@pytest.mark.parametrize("kind, dictionary", [("file", False), ("stream", False), ("file", True)])
def test_a_compressed_arrow_batch_that_decodes_to_gigabytes_is_refused_in_one_line_before_it_is(tmp_path, kind,
                                                                                              dictionary):
    """A 49 KiB zstd-compressed .arrow file whose one record batch (or the dictionary its rows point at) decompresses
    to 1.5 GiB (2 values of 768 MiB): pyarrow decompressed it whole (1,536 MiB of its pool) before a row was measured
    against the cap. Each compressed buffer starts with what it decompresses to: the batches and dictionaries are
    sized from those before pyarrow reads one, and the file is refused in one line, named as a file that can't be
    read."""
    import pyarrow as pa

    column = zeros_column(768 << 20, 2)
    if dictionary:
        column = pa.DictionaryArray.from_arrays(pa.array([0, 1, 0], pa.int32()), column)
    bomb = compressed_arrow(tmp_path / "bomb.arrow", {"text": column}, kind)
    assert bomb.stat().st_size < 64 << 10
    assert refused_unread(bomb) == (
        f"UntrustedFile: {bomb}: refused: its dictionaries decompress to {(1536 << 20) + 24:,} bytes or more, more "
        f"than the {1 << 30:,} they may (pyarrow holds them whole: write the file uncompressed, or without "
        "dictionary-encoding)" if dictionary else
        f"UntrustedFile: {bomb}: refused: its record batch 1 decompresses to {(1536 << 20) + 24:,} bytes, more than "
        f"the {1 << 30:,} a batch may (pyarrow decompresses a batch whole: write the file uncompressed, or in smaller "
        "record batches)")


@pytest.mark.parametrize("kind, compression", [("file", "lz4"), ("stream", "zstd")])
def test_a_compressed_arrow_file_of_a_dictionary_and_rows_under_the_bound_reads_as_its_rows(tmp_path, kind,
                                                                                          compression):
    """An honest compressed .arrow file, its text beside a dictionary-encoded column, in each format: sized, then read
    as the same rows uncompressed, a row over the document cap skipped by row."""
    import pyarrow as pa

    texts = [json.loads(line)["text"] for line in small_corpus(tmp_path / "docs.jsonl").read_text().splitlines()]
    texts[3] = "b" * (70 << 20)  # over the 64 MiB cap: skipped once decompressed
    source_column = pa.array(["gsm8k", "other"] * 20).dictionary_encode()
    path = compressed_arrow(tmp_path / "docs.arrow", {"text": texts, "source": source_column}, kind, compression)
    (source,) = sources_of([str(path)], "train", TextOf())
    records = list(source.records())
    assert source.error is None and [r.where for r in records if r.text is None] == ["row 4"]
    assert [r.text for r in records if r.text is not None] == texts[:3] + texts[4:]
