"""vocagno: teacher guided language modeling across vocabularies (VocAgnoLM, Shin et al., ICML 2025).

- ``vocagno.core.alignment``: token-level lexical alignment of two tokenizations (numpy and batched torch).
- ``vocagno.core.loss``: the teacher guided loss (plain torch).
- ``vocagno.core.tokenization``: loading tokenizers, the shipped offline copies included.
- ``vocagno.data.shards`` / ``vocagno.data.dataset``: the MDS shard format, the streaming dataset and the collator.
- ``vocagno.algorithms.vocagno_lm``: ``VocAgnoLM``, the Composer algorithm.
- ``vocagno.training.metrics`` / ``vocagno.eval``: bits per byte and the math benchmarks.
"""

__version__ = "0.1.0"
