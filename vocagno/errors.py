"""The refusal: what a user gave (a flag, a yaml, a corpus, a file from elsewhere) that vocagno will not use.

Library code raises ``Refused`` (or one of its kinds: ``UntrustedFile``, ``BadCheckpoint``) with one line that names
the problem and what to do; only a command's entry point (``vocagno.entry.run``) turns it into ``error: ...`` and an
exit code.
"""

from __future__ import annotations

__all__ = ["Refused"]


class Refused(ValueError):
    """A refusal of something the user gave; the message names it and what to do, in one line."""
