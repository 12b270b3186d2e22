"""vocagno: teacher guided language modeling across vocabularies (VocAgnoLM, Shin et al., ICML 2025).

- ``vocagno.core``: the method without a framework: token alignment (``alignment``), the teacher guided loss
  (``loss``), tokenization.
- ``vocagno.data``: the MDS shards, the streaming dataset and its collator, the batch's keys.
- ``vocagno.conversion``: a corpus read as documents and converted into shards (``conversion/convert_dataset.py``
  is the converter's face).
- ``vocagno.teacher``: the frozen teacher, its side of a batch, several teachers, the scoring pass.
- ``vocagno.algorithms``: ``VocAgnoLM`` and the ULD and KLD baselines (Composer algorithms).
- ``vocagno.train``: a training run, ``train(cfg) -> Trainer`` (``train.py`` is its face); ``vocagno.training``: what
  it builds on; ``vocagno.eval``: the math benchmarks; ``vocagno.diagnostics``: what a teacher keeps.
- ``vocagno.doors``: the one way in for files from elsewhere, the one way out; ``vocagno.compat``: one door per
  training framework for every use of its private names.
"""

__version__ = "0.1.0"
