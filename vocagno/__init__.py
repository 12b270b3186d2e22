"""vocagno: teacher guided language modeling across vocabularies (VocAgnoLM, Shin et al., ICML 2025).

The functional core: ``vocagno.alignment`` (token-level lexical alignment) and ``vocagno.loss`` (the teacher guided
loss); ``vocagno.tokenization`` loads tokenizers, the shipped offline copies included.
"""

__version__ = "0.1.0"
