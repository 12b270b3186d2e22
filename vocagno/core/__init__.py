"""The method without a framework (torch, numpy, tokenizers; no Composer, no Streaming): token alignment, the
teacher guided loss, the baselines' losses, tokenization, FSDP units per decoder layer.
"""
