"""vocagno: teacher guided language modeling across vocabularies (VocAgnoLM, Shin et al., ICML 2025).

- ``vocagno.alignment``: token-level lexical alignment of two tokenizations (numpy and batched torch).
- ``vocagno.loss``: the teacher guided loss (plain torch).
- ``vocagno.tokenization``: loading tokenizers, the shipped offline copies included.
- ``vocagno.shards`` / ``vocagno.data``: the MDS shard format, the streaming dataset and the collator.
- ``vocagno.algorithm``: ``VocAgnoLM``, the Composer algorithm.
- ``vocagno.metrics`` / ``vocagno.eval``: bits per byte and the math benchmarks.
"""

__version__ = "0.1.0"
