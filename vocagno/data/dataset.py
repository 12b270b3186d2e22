"""Streaming vocagno shards into batches for a student and its teacher.

``TeacherGuidedDataset`` reads shards written by ``conversion/convert_dataset.py`` (refusing shards made by other
tokenizers) and ``TeacherGuidedCollator`` turns samples into a batch:

    input_ids, attention_mask          [B, N]  student tokens
    labels                             [B, N]  input_ids, -100 at padding (Hugging Face's convention: the model shifts)
    align_start, align_end             [B, N]  teacher positions aligned to student token i (start == end: unmapped)
    token_bytes                        [B, N]  UTF-8 bytes of the text each student token is the first to cover
    special_tokens                     [B, N]  True at specials (BOS, separators: empty spans), which hold no text
    teacher_input_ids, teacher_attention_mask  [B, M]  teacher tokens, padded to the batch's longest (or a fixed M)
    teacher_loss                       [B, M]  scored shards only: the teacher's loss of each of its tokens (NaN: none)
    starts_together                    [B, N]  True where token i starts where its first aligned teacher token starts
    teacher_topk_ids, _probs           [B, M, K]  shards scored with --top-k K: the teacher's distributions, truncated
    teacher_topk_rest                  [B, M]  (vocagno.data.batch)
    stream                             [B]     a mixture's (``streams``) only: the stream each row was drawn from

Every student tensor is per input position, as Hugging Face models and Composer's ``HuggingFaceModel`` expect; the
``VocAgnoLM`` algorithm shifts logits, labels and alignment together before ``vocagno.core.loss.guided_loss``.
Resumption is Streaming's: the dataset's ``state_dict`` / ``load_state_dict`` (carried by Composer checkpoints) make
a resumed run see the batches an uninterrupted one would.
"""

from __future__ import annotations

import os
import warnings
import weakref
from typing import Any, Iterator

import numpy as np
import torch
from streaming import StreamingDataset
from torch.utils.data import DataLoader

from vocagno.compat.streaming import CheckedStream, local_path
from vocagno.compat.streaming_shm import (
    attaching_when_sized, collecting_shared_memory, registering_shared_memory, release_shared_memory,
)
from vocagno.core.alignment import align, check_offsets
from vocagno.data.shards import (
    METADATA_FILE, SHARD_HASH, ShardMetadata, align_column, check_columns, describe_tokenizer, distribution_of,
    loss_column,
)
from vocagno.doors.untrusted import UntrustedFile, check_distribution, read_bytes, reason
from vocagno.doors.writing import own_temporary, write_atomically
from vocagno.data.batch import (ALIGN_END, ALIGN_START, SPECIAL_TOKENS, STARTS_TOGETHER, TEACHER_ATTENTION_MASK,
    TEACHER_INPUT_IDS, TEACHER_LOSS, TOKEN_BYTES, TOPK_IDS, TOPK_PROBS, TOPK_REST, teacher_key)

__all__ = ["TeacherGuidedDataset", "TeacherGuidedCollator", "teacher_guided_loader", "read_metadata", "token_bytes"]

ARRAY_COLUMNS = ("student_ids", "student_offsets", "teacher_ids", "teacher_offsets")


def read_metadata(local: str, remote: str | None = None, split: str | None = None, timeout: float = 60) -> ShardMetadata:
    """The shards' ``vocagno.json``, fetched from ``remote`` into ``local`` when it is not there yet, read through
    ``untrusted.read_json`` (``ShardMetadata.read``)."""
    local_dir = os.path.join(local, split) if split else local
    if remote is not None and not os.path.lexists(os.path.join(local_dir, METADATA_FILE)):
        from streaming.base.storage import CloudDownloader

        os.makedirs(local_dir, exist_ok=True)
        remote_path = os.path.join(remote, split or "", METADATA_FILE)
        on_machine = local_path(remote)
        if on_machine is not None:  # a regular file within its cap (Streaming's copy would follow a link anywhere)
            data = read_bytes(METADATA_FILE, folder=os.path.join(on_machine, split or ""), cap_name="json_bytes")
            write_atomically(os.path.join(local_dir, METADATA_FILE), data)
            return ShardMetadata.read(local_dir)
        # Every rank of a node fetches it: each into a name of its own (Streaming's downloaders write through
        # NAME.tmp, which the ranks would take from each other), then renamed into place.
        own = str(own_temporary(os.path.join(local_dir, METADATA_FILE)))
        try:
            CloudDownloader.direct_download(remote_path, own, timeout)
            os.replace(own, os.path.join(local_dir, METADATA_FILE))
        finally:
            if os.path.exists(own):
                os.remove(own)
    return ShardMetadata.read(local_dir)


class TeacherGuidedDataset(StreamingDataset):
    """A ``StreamingDataset`` of vocagno shards whose samples are int64 tensors (and the sample's ``text``).

    One dataset (``local``, ``remote``, ``split``), or a mixture: ``streams``, as llm-foundry writes it,
    ``{NAME: {local, remote, split, proportion | repeat | choose}, ...}`` (Streaming's ``Stream`` keywords). Every
    stream's ``vocagno.json`` is checked: the same tokenizers and ``seq_len`` as the first stream's, naming the stream
    that differs; samples carry their stream's index (``stream_names``). ``student_tokenizer`` / ``teacher_tokenizer``
    (a tokenizer, a name or path, or a ``TokenizerInfo``): when given, shards made by other tokenizers are refused
    with both names in the message. Other keyword arguments go to ``StreamingDataset`` (``shuffle``, ``batch_size``,
    ``num_canonical_nodes``, ...). Every stream is a ``CheckedStream``: its ``index.json`` is checked before
    Streaming sees it, its shard files must be regular files of the sizes it says, and a shard downloaded or
    decompressed is checked against the hash its index records (``validate_hash``): a corrupt or crafted shard is an
    error naming it (``UntrustedFile``, or Streaming's checksum failure).
    """

    def __init__(
        self,
        *,
        local: str | None = None,
        remote: str | None = None,
        split: str | None = None,
        streams: dict[str, dict[str, Any]] | None = None,
        student_tokenizer: Any = None,
        teacher_tokenizer: Any = None,
        **streaming_kwargs: Any,
    ):
        if (streams is None) == (local is None):
            raise ValueError("TeacherGuidedDataset: give local (one dataset) or streams (a mixture), not both")
        # Check the tokenizers before Streaming sets up its shared memory and downloads.
        timeout = streaming_kwargs.get("download_timeout", 60)
        named = streams or {"": {"local": local, "remote": remote, "split": split}}
        self.stream_names = list(named)
        self.stream_metadata = {}
        for name, stream in named.items():
            where = f"stream {name!r}: " if streams else ""
            if not isinstance(stream, dict) or not stream.get("local"):
                raise ValueError(f"{where}each stream needs its own local folder (and remote, split, proportion, ...)")
            try:
                metadata = read_metadata(stream["local"], stream.get("remote"), stream.get("split"), timeout)
                metadata.check_tokenizers(describe_tokenizer(student_tokenizer, "student"),
                                          describe_tokenizer(teacher_tokenizer, "teacher"))
                if self.stream_metadata:
                    _check_same_shards(next(iter(self.stream_metadata.values())), metadata, self.stream_names[0])
            except (ValueError, FileNotFoundError) as error:
                if not streams:
                    raise
                raise type(error)(f"{where}{error}") from None
            self.stream_metadata[name] = metadata
        self.metadata = next(iter(self.stream_metadata.values()))
        # Where each stream's shards come from (its remote, else its local folder): what a refusal of them names.
        self.stream_folders = {name: str(stream.get("remote") or stream["local"]) for name, stream in named.items()}
        kwargs = {"validate_hash": SHARD_HASH, **streaming_kwargs}
        opened: list = []
        try:
            # Streaming reads every index and shard through CheckedStream: a single dataset is one stream of it.
            if streams:
                try:  # Streaming's checks of the weights (proportion, repeat, choose), its streams counted from 0
                    made = [CheckedStream(shard_hash=SHARD_HASH, **stream) for stream in streams.values()]
                    with (registering_shared_memory(), collecting_shared_memory(opened),
                          attaching_when_sized()):
                        super().__init__(streams=made, **kwargs)
                except UntrustedFile:  # it names the file
                    raise
                except (ValueError, TypeError) as error:
                    order = ", ".join(f"{i}: {name!r}" for i, name in enumerate(streams))
                    raise ValueError(f"streams ({order}): {error}") from None
            else:
                with (registering_shared_memory(), collecting_shared_memory(opened),
                      attaching_when_sized()):
                    stream = CheckedStream(local=local, remote=remote, split=split, shard_hash=SHARD_HASH)
                    super().__init__(streams=[stream], **kwargs)
        except BaseException:
            release_shared_memory(opened, os.getpid())
            raise
        # Other prefixes the lookup walked past are let go now; this dataset's own memory goes with the dataset.
        own = f"{self._shm_prefix_int:06}_"
        release_shared_memory([memory for memory in opened if not memory.shm.name.startswith(own)], os.getpid())
        weakref.finalize(self, release_shared_memory, [memory for memory in opened if memory.shm.name.startswith(own)],
                         os.getpid())
        for shard in self.shards:  # before any sample is decoded: a pkl column would be unpickled
            check_columns(dict(zip(shard.column_names, shard.column_encodings)), shard.dirname)

    def load_state_dict(self, obj: dict[str, Any]) -> None:
        with attaching_when_sized():  # every rank opens the resumption state's memory
            super().load_state_dict(obj)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """Streaming's epoch, whose two threads (reading ahead, waiting for shards) also stop when the iteration is
        dropped before its end: a run stopping at ``max_duration``, a report reading a few batches. Streaming's own
        poll every 7 ms until the next epoch begins or the process exits."""
        epoch = None
        try:
            for sample in super().__iter__():
                if epoch is None:  # this iteration's, set before its first sample (a later iteration replaces it)
                    epoch = self._iterator
                yield sample
        finally:
            if epoch is not None:
                epoch.non_blocking_exit()

    def get_item(self, idx: int, retry: int = 7) -> dict[str, Any]:
        sample = super().get_item(idx, retry)  # a sample that doesn't decode is refused there (_CheckedMDSReader)
        try:
            # Decoded arrays view the shard's memory: copy before handing them to torch.
            out = {name: torch.from_numpy(np.array(sample[name], dtype=np.int64)) for name in ARRAY_COLUMNS}
            out["text"] = sample["text"]
            if TEACHER_LOSS in sample:  # scored shards (python -m vocagno.score)
                out[TEACHER_LOSS] = torch.from_numpy(np.array(sample[TEACHER_LOSS], dtype=np.float32))
            for name in self.metadata.also_scored_by or ():  # other teachers' (vocagno.teacher.several)
                for column in (loss_column(name), align_column(name)):
                    out[column] = np.array(sample[column])
            for side in ("student", "teacher"):  # what the collator and the alignment index by
                ids, offsets = out[f"{side}_ids"], out[f"{side}_offsets"].numpy()
                check_offsets(offsets, f"its {side} offsets")  # the order align needs, too
                if not (ids.ndim == 1 and offsets.shape == (len(ids), 2) and (offsets <= len(out["text"])).all()):
                    raise ValueError(f"its {side} offsets are not one [start, end) of its text per {side} token")
        except (KeyError, TypeError, ValueError) as error:  # crafted bytes decoded to arrays of another kind
            shard_id, index_in_shard = self.spanner[idx]
            shard = self.shards[shard_id]
            where = os.path.join(shard.dirname, shard.split or "", shard.raw_data.basename)
            raise UntrustedFile(f"{where}: refused: its sample {index_in_shard} does not hold vocagno's columns "
                                f"({reason(error)})") from None
        distribution = distribution_of(self.metadata)
        if distribution is not None:  # shards scored with --top-k: checked before training indexes with the ids
            columns = [sample.get(column) for column in (TOPK_IDS, TOPK_PROBS, TOPK_REST)]
            check_distribution(*columns, len(out["teacher_ids"]), distribution.top_k, distribution.logits,
                               distribution.dtype, self._where(idx))
            out[TOPK_IDS] = torch.from_numpy(columns[0].astype(np.int64))
            out[TOPK_PROBS], out[TOPK_REST] = (torch.from_numpy(np.array(c, dtype=np.float32)) for c in columns[1:])
        if len(self.stream_names) > 1:
            out["stream"] = torch.tensor(int(self.stream_per_shard[self.spanner[idx][0]]))
        return out

    def _where(self, idx: int) -> str:
        """Sample ``idx`` as a refusal names it: its shard file and its place in it."""
        shard_id, index_in_shard = self.spanner[idx]
        shard = self.shards[shard_id]
        return f"{os.path.join(shard.dirname, shard.split or '', shard.raw_data.basename)}: its sample {index_in_shard}"


def _check_same_shards(first: ShardMetadata, other: ShardMetadata, first_name: str) -> None:
    """A mixture's streams must be made alike: the same tokenizers (vocabularies) and sample length."""
    for side in ("student", "teacher"):
        one, two = getattr(first, side), getattr(other, side)
        if one.fingerprint != two.fingerprint:
            raise ValueError(f"made with the {side} tokenizer {two.name!r}, stream {first_name!r} with {one.name!r}: "
                             "a mixture's streams must share their tokenizers")
    if first.seq_len != other.seq_len:
        raise ValueError(f"samples of {other.seq_len} student tokens, stream {first_name!r}'s of {first.seq_len}: "
                         "convert every stream with the same --seq-len")
    others = [sorted(metadata.also_scored_by or {}) for metadata in (other, first)]
    if others[0] != others[1]:  # every sample of a batch carries the same columns
        raise ValueError(f"other teachers' losses {others[0]}, stream {first_name!r}'s {others[1]}: score every "
                         "stream with the same teachers")
    distributions = [distribution_of(metadata) for metadata in (other, first)]
    if distributions[0] != distributions[1]:
        shown = ["no distributions" if d is None else f"distributions of {d}" for d in distributions]
        raise ValueError(f"{shown[0]}, stream {first_name!r} {shown[1]}: score every stream with the same --top-k and "
                         "--top-k-dtype")


def _byte_offsets(text: str) -> np.ndarray:
    """The UTF-8 byte offset of every character position 0 .. len(text)."""
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    sizes = 1 + (codes >= 0x80).astype(np.int64) + (codes >= 0x800) + (codes >= 0x10000)
    return np.concatenate([[0], np.cumsum(sizes)])


def token_bytes(text: str, offsets: np.ndarray) -> np.ndarray:
    """UTF-8 bytes of ``text`` that each token is the first to cover, so every byte under the tokens counts once.

    Byte-fallback pieces each span their whole character (the four ``<0xNN>`` pieces of an emoji): the first gets the
    character's bytes, the others none. Specials (empty spans) get none.
    """
    byte_at = _byte_offsets(text)
    covered = np.maximum.accumulate(np.concatenate([[offsets[0, 0] if len(offsets) else 0], offsets[:, 1]]))
    begin = np.maximum(offsets[:, 0], covered[:-1])  # what earlier tokens covered is not counted again
    return np.maximum(byte_at[np.maximum(offsets[:, 1], begin)] - byte_at[begin], 0)


class TeacherGuidedCollator:
    """Batch ``TeacherGuidedDataset`` samples for ``guided_loss`` (the module docstring lists the keys).

    Teacher rows are padded to the batch's longest, rounded up to a multiple of ``teacher_pad_multiple`` (64: few
    distinct shapes for the kernels, little padding: a fixed 2,560 for 2,048 student tokens was ~25% padding).
    ``teacher_seq_len`` pads every teacher row to a fixed length instead (static shapes); a longer row is cut, its
    student tokens aligned past the cut become unmapped, and the cut tokens are counted in
    ``truncated_teacher_tokens``.
    """

    def __init__(
        self,
        student_pad_id: int,
        teacher_pad_id: int,
        teacher_seq_len: int | None = None,
        ignore_index: int = -100,
        teacher_pad_multiple: int = 64,
    ):
        self.student_pad_id = student_pad_id
        self.teacher_pad_id = teacher_pad_id
        self.teacher_seq_len = teacher_seq_len
        self.teacher_pad_multiple = teacher_pad_multiple
        self.ignore_index = ignore_index
        self.truncated_teacher_tokens = 0

    def __call__(self, samples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        batch = len(samples)
        n = max(len(s["student_ids"]) for s in samples)
        longest, multiple = max(len(s["teacher_ids"]) for s in samples), self.teacher_pad_multiple
        m = self.teacher_seq_len or -(-longest // multiple) * multiple
        out = {
            "input_ids": torch.full((batch, n), self.student_pad_id, dtype=torch.long),
            "attention_mask": torch.zeros(batch, n, dtype=torch.long),
            "labels": torch.full((batch, n), self.ignore_index, dtype=torch.long),
            ALIGN_START: torch.zeros(batch, n, dtype=torch.long),
            ALIGN_END: torch.zeros(batch, n, dtype=torch.long),
            TOKEN_BYTES: torch.zeros(batch, n, dtype=torch.long),
            SPECIAL_TOKENS: torch.zeros(batch, n, dtype=torch.bool),
            STARTS_TOGETHER: torch.zeros(batch, n, dtype=torch.bool),
            TEACHER_INPUT_IDS: torch.full((batch, m), self.teacher_pad_id, dtype=torch.long),
            TEACHER_ATTENTION_MASK: torch.zeros(batch, m, dtype=torch.long),
        }
        for b, sample in enumerate(samples):
            ids, teacher_ids = sample["student_ids"], sample["teacher_ids"]
            length = len(ids)
            out["input_ids"][b, :length] = ids
            out["attention_mask"][b, :length] = 1
            out["labels"][b, :length] = ids
            offsets, teacher_offsets = sample["student_offsets"].numpy(), sample["teacher_offsets"].numpy()
            if torch.equal(ids, teacher_ids) and np.array_equal(offsets, teacher_offsets):
                # One tokenizer on both sides (Rho-1's reference model): token i is token i, specials included.
                start = np.arange(length)
                end = start + 1
            else:
                start, end = align(offsets, teacher_offsets)
            if len(teacher_ids) > m:
                self._warn_truncation(len(teacher_ids) - m)
                cut = end > m
                start[cut], end[cut] = 0, 0
                teacher_ids = teacher_ids[:m]
            out[ALIGN_START][b, :length] = torch.from_numpy(start)
            out[ALIGN_END][b, :length] = torch.from_numpy(end)
            out[TOKEN_BYTES][b, :length] = torch.from_numpy(token_bytes(sample["text"], offsets))
            out[SPECIAL_TOKENS][b, :length] = torch.from_numpy(offsets[:, 0] == offsets[:, 1])
            out[TEACHER_INPUT_IDS][b, : len(teacher_ids)] = teacher_ids
            out[TEACHER_ATTENTION_MASK][b, : len(teacher_ids)] = 1
            if TEACHER_LOSS in sample:
                cached = out.setdefault(TEACHER_LOSS, torch.full((batch, m), float("nan")))
                cached[b, : len(teacher_ids)] = sample[TEACHER_LOSS][: len(teacher_ids)]
            mapped = end > start  # where the two tokenizers cut the text alike: cross_kd's positions
            out[STARTS_TOGETHER][b, np.flatnonzero(mapped)] = torch.from_numpy(
                teacher_offsets[start[mapped], 0] == offsets[mapped, 0])
            if TOPK_IDS in sample:  # shards scored with --top-k
                _collate_distribution(out, b, sample, len(teacher_ids), m)
        others = [column[len(loss_column("")):] for column in samples[0] if column.startswith(loss_column(""))]
        if others:  # shards scored by other teachers of a set
            out.update(_collate_other_teachers(samples, others, n))
        if "stream" in samples[0]:
            out["stream"] = torch.stack([sample["stream"] for sample in samples])
        return out

    def _warn_truncation(self, n_tokens: int) -> None:
        if self.truncated_teacher_tokens == 0:
            warnings.warn(
                f"a sample has {n_tokens} teacher tokens more than teacher_seq_len={self.teacher_seq_len}: they are cut "
                "and the student tokens aligned to them become unmapped; raise teacher_seq_len to avoid this",
                stacklevel=3,
            )
        self.truncated_teacher_tokens += n_tokens


def teacher_guided_loader(
    dataset: dict[str, Any],
    student_tokenizer,
    teacher_tokenizer,
    batch_size: int,
    teacher_seq_len: int | None = None,
    **loader_kwargs: Any,
) -> DataLoader:
    """A ``DataLoader`` of ``TeacherGuidedCollator`` batches over the shards ``dataset`` names (``local``, ``remote``,
    ``split``, ``shuffle``, ... as ``TeacherGuidedDataset`` takes them). The tokenizers (objects, names or folders)
    are checked against the ones the shards were made with; ``teacher_tokenizer`` None: the shards' teacher tokens
    are taken as they are (padded with the separator ``vocagno.json`` names). Other keyword arguments go to the
    ``DataLoader``."""
    from vocagno.core.tokenization import as_tokenizer

    student_tokenizer, teacher_tokenizer = as_tokenizer(student_tokenizer), as_tokenizer(teacher_tokenizer)
    shards = TeacherGuidedDataset(
        student_tokenizer=student_tokenizer, teacher_tokenizer=teacher_tokenizer, batch_size=batch_size, **dataset)
    student_pad = student_tokenizer.pad_token_id
    teacher_pad = teacher_tokenizer.pad_token_id if teacher_tokenizer is not None else None
    collate = TeacherGuidedCollator(
        student_pad_id=student_pad if student_pad is not None else student_tokenizer.eos_token_id,
        teacher_pad_id=teacher_pad if teacher_pad is not None else shards.metadata.teacher.separator_id,
        teacher_seq_len=teacher_seq_len,
    )
    return DataLoader(shards, batch_size=batch_size, collate_fn=collate, **loader_kwargs)



def _collate_distribution(out: dict[str, torch.Tensor], b: int, sample: dict[str, Any], kept: int, width: int) -> None:
    """Row ``b`` of the teacher's cached distributions: its first ``kept`` positions, padded with zeros to ``width``."""
    if TOPK_IDS not in out:
        k = sample[TOPK_IDS].shape[1]
        out[TOPK_IDS] = torch.zeros(len(out["input_ids"]), width, k, dtype=torch.long)
        out[TOPK_PROBS] = torch.zeros(len(out["input_ids"]), width, k)
        out[TOPK_REST] = torch.zeros(len(out["input_ids"]), width)
    for key in (TOPK_IDS, TOPK_PROBS, TOPK_REST):
        out[key][b, :kept] = sample[key][:kept]


def _collate_other_teachers(samples: list[dict[str, Any]], names: list[str], width: int) -> dict[str, torch.Tensor]:
    """Other teachers' cached losses and alignment (columns ``teacher_loss.NAME``, ``align.NAME``), padded: losses
    with NaN to their longest row, alignment with empty ranges to ``width``."""
    out = {}
    for name in names:
        rows = [np.asarray(sample[loss_column(name)], dtype=np.float32) for sample in samples]
        loss = torch.full((len(samples), max(len(row) for row in rows)), float("nan"))
        start = torch.zeros(len(samples), width, dtype=torch.long)
        end = torch.zeros_like(start)
        for b, (row, sample) in enumerate(zip(rows, samples)):
            loss[b, : len(row)] = torch.from_numpy(row)
            align = np.asarray(sample[align_column(name)], dtype=np.int64).reshape(-1, 2)
            if len(align) != len(sample["student_ids"]) or not (
                    (0 <= align[:, 0]) & (align[:, 0] <= align[:, 1]) & (align[:, 1] <= len(row))).all():
                raise ValueError(f"{align_column(name)}: a sample's alignment is not one [start, end) within its "
                                 f"{len(row)} teacher tokens for each of its {len(sample['student_ids'])} student "
                                 "tokens: the shards are damaged or not vocagno's")
            start[b, : len(align)] = torch.from_numpy(align[:, 0].copy())
            end[b, : len(align)] = torch.from_numpy(align[:, 1].copy())
        out.update({teacher_key(name, TEACHER_LOSS): loss, teacher_key(name, ALIGN_START): start,
                    teacher_key(name, ALIGN_END): end})
    return out
