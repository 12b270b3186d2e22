"""vocagno in llm-foundry: the ``vocagno`` train loader (registered under ``llmfoundry_dataloaders``).

The algorithm is registered too (``llmfoundry_algorithms``), so an llm-foundry yaml can say either

    algorithms: {vocagno: {teacher: Qwen/Qwen2.5-Math-7B-Instruct}}     # any loader: the teacher side is made per batch
    train_loader: {name: text, dataset: {local: ..., ...}, ...}

or, on shards made by ``conversion/convert_dataset.py`` (tokenized once, the faster path),

    algorithms: {vocagno: {teacher: Qwen/Qwen2.5-Math-7B-Instruct}}
    train_loader: {name: vocagno, dataset: {local: ..., remote: ..., split: ..., shuffle: true}, drop_last: true,
                   num_workers: 8}

and on a mixture, ``dataset: {streams: {NAME: {local: ..., remote: ..., proportion: ...}, ...}, shuffle: true}``
(Streaming's streams, as llm-foundry's own loaders take them; each stream's share and kept fraction are logged).
"""

from __future__ import annotations

from typing import Any

from composer.core import DataSpec

from vocagno.data.dataset import teacher_guided_loader

__all__ = ["build_vocagno_dataloader"]


def build_vocagno_dataloader(
    tokenizer,
    device_batch_size: int,
    dataset: dict[str, Any],
    drop_last: bool = True,
    num_workers: int = 0,
    teacher_tokenizer: Any = None,
    teacher_seq_len: int | None = None,
    pin_memory: bool = True,
    prefetch_factor: int = 2,
    persistent_workers: bool = True,
    timeout: int = 0,
) -> DataSpec:
    """llm-foundry's dataloader builder signature: ``tokenizer`` is the student's (the yaml's ``tokenizer:``),
    ``dataset`` the ``TeacherGuidedDataset`` keywords, ``teacher_tokenizer`` unset the one named in the shards'
    ``vocagno.json`` (their teacher tokens are used as they are)."""
    if int(device_batch_size) != device_batch_size:
        raise ValueError(f"the vocagno loader needs a whole number of samples per device, got {device_batch_size}")
    workers = {"prefetch_factor": prefetch_factor, "persistent_workers": persistent_workers} if num_workers else {}
    loader = teacher_guided_loader(
        dict(dataset), tokenizer, teacher_tokenizer, int(device_batch_size), teacher_seq_len=teacher_seq_len,
        drop_last=drop_last, num_workers=num_workers, pin_memory=pin_memory, timeout=timeout, **workers,
    )
    return DataSpec(loader, get_num_tokens_in_batch=lambda batch: int(batch["attention_mask"].sum()))
