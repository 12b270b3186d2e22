"""The converter (a corpus -> MDS shards, ``conversion/convert_dataset.py``) and a corpus read as documents.

- ``convert``: the command (``main``, ``parse_args``) and a job's run; ``parts``: a part converted on its own (in a
  worker); ``packer``: documents tokenized by both tokenizers and packed into samples; ``merge``: the jobs' parts
  joined into one dataset, and the summary.
- ``sources`` (files, folders, object stores, Hugging Face datasets), ``columnar`` (.parquet and .arrow) and
  ``records``: a corpus read as documents, for the converter and every other reader of a user's text files
  (``vocagno.eval --bpb``).
"""
