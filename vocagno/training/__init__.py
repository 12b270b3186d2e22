"""What ``train.py`` builds on: the yaml (``config``), checkpoints, metrics, loggers, llm-foundry's loader.
"""
