"""What ``train.py`` builds on: the yaml (``config``), checkpoints, a trained model to read (``models``), metrics,
loggers, llm-foundry's loader (``foundry``)."""
