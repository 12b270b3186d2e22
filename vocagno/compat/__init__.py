"""One door per training framework: every use of a framework's private names, each work-around of its behaviour, in
one package of this one, above ``doors`` and below everything that trains or reads shards.

- ``composer``: Composer's (mosaicml), checked against the version ``COMPOSER`` names.
- ``streaming``, ``streaming_shm``: Streaming's (mosaicml-streaming): the checked stream and its shard reader; its
  shared memory. Checked against the version ``streaming.STREAMING`` names.
- ``torch``: PyTorch's distributed checkpoint loader and process-group store, checked against ``torch.TORCH``.

Each module names the exact version it was checked against (pyproject.toml pins that version), and for each
work-around the upstream issue or the reason; ``tests/unit/test_compat*.py`` fail when the installed framework is
another version or no longer has what a work-around relies on.
"""
