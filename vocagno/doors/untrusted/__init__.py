"""Files someone else wrote: the one door every file from elsewhere comes in through (``pretrained`` holds it all
until the door is split into one module per job)."""

from vocagno.doors.untrusted.pretrained import *  # noqa: F401,F403
from vocagno.doors.untrusted.pretrained import (  # noqa: F401
    _NOT_PLAIN, COMPRESSIONS, DCP_METADATA_GLOBALS, LOOP_FIELDS, LOOP_LIKE, WEIGHT_FILES, ATTENTION_IMPLEMENTATIONS,
    BadCap, __all__, _plain_data, check_torch_zip,
)
