"""What a training run (``vocagno.train``, whose face is ``train.py``) builds on.

- ``config``: the yaml (keys, ``base:``, checks, the models its sections build); ``registry``: the names of
  algorithms, loggers and callbacks; ``builders``: the algorithms, loggers, optimizer and Composer model a run is made
  of; ``loaders``: the run's loaders, shards converted where missing; ``loading``: the checkpoint a run loads, taken
  into a private folder first; ``plan``: the line a run starts with.
- ``checkpoint``: checkpoints found, checked, read and repaired; ``models``: a trained model to read; ``metrics``:
  bits per byte; ``loggers``: the console line, the picture, the recipe; ``foundry``: llm-foundry's loader.
"""
