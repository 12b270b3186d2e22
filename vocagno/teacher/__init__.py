"""The frozen teacher: ``teacher`` (``Teacher``: one teacher, its model, tokenizer and options, and what it makes),
``model`` (``TeacherScorer``, the module that scores its tokens; loading, sharding, fingerprints), ``side``
(``TeacherSide``: its tokens and alignment made from a student's), ``several`` (``Teachers``: a set guiding one
student), ``scoring`` (the scoring pass over shards), ``config`` (``TeacherConfig``: a yaml's teacher section typed, each
key with its one default; ``ModelConfig``, the student's, and the causal LM a section builds)."""
