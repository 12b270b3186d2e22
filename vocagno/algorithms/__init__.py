"""Composer algorithms: ``VocAgnoLM`` (the teacher guided loss) and the ULD and KLD baselines."""

from vocagno.algorithms.baselines import KLD, ULD
from vocagno.algorithms.vocagno_lm import VocAgnoLM

__all__ = ["KLD", "ULD", "VocAgnoLM"]
