"""Files someone else wrote (a checkpoint in a shared bucket, a corpus folder, shards on an out-root): the one door
every file from elsewhere comes in through, the one place that decides what of them is trusted. One job a module:

- ``files``: names (``inside``, ``plain_name``: never a path outside its folder), caps (``CAPS``, ``cap``, raised per
  job with ``VOCAGNO_MAX_<NAME>``) and files (``open_regular``, ``read_bytes``, ``read_json``, ``check_folder``: a
  regular file, never through a link, never more bytes than its size said, within its cap).
- ``mds``: Streaming's ``index.json`` (``check_index``) before Streaming sees it, an MDS shard's header
  (``check_mds``), a compressed shard (``decompress``, its output capped at what the index says), a sample's
  teacher distribution (``check_distribution``).
- ``pretrained``: a Hugging Face model or tokenizer (``from_pretrained``): ``trust_remote_code`` explicit, a local
  folder's files regular and inside it, its config without ``CODE_FIELDS`` and no larger than its weights.
- ``dcp``: a sharded checkpoint's ``.metadata`` (``read_dcp_metadata``): only the exact ``(module, name)`` pairs
  ``torch.distributed.checkpoint`` writes there are resolved, never a dotted name.
- ``torch_files``: what ``torch.save`` wrote (``load_torch``): ``torch.load`` with ``weights_only=True`` and the few
  types a Composer checkpoint holds (``CHECKPOINT_GLOBALS``).

docs/files-from-elsewhere.md says what each refuses and how a cap is raised.
"""

from vocagno.doors.untrusted.dcp import DCP_METADATA_GLOBALS, read_dcp_metadata
from vocagno.doors.untrusted.files import (
    CAPS, BadCap, UntrustedFile, cap, check_folder, inside, open_regular, plain_name, read_bytes, read_json, reason,
)
from vocagno.doors.untrusted.mds import (
    COMPRESSIONS, check_distribution, check_index, check_mds, decompress, mds_header_bytes,
)
from vocagno.doors.untrusted.pretrained import (
    ATTENTION_IMPLEMENTATIONS, CODE_FIELDS, LOOP_FIELDS, LOOP_LIKE, WEIGHT_FILES, build_on_meta, check_config,
    check_loops, check_model_fits, from_pretrained, saved_shapes,
)
from vocagno.doors.untrusted.torch_files import CHECKPOINT_GLOBALS, check_torch_zip, load_torch

__all__ = ["ATTENTION_IMPLEMENTATIONS", "CAPS", "CHECKPOINT_GLOBALS", "CODE_FIELDS", "COMPRESSIONS",
           "DCP_METADATA_GLOBALS", "LOOP_FIELDS", "LOOP_LIKE", "WEIGHT_FILES", "BadCap", "UntrustedFile",
           "build_on_meta", "cap", "check_config", "check_distribution", "check_folder", "check_index", "check_loops", "check_mds",
           "check_model_fits", "check_torch_zip", "decompress", "from_pretrained", "inside", "load_torch",
           "mds_header_bytes", "open_regular", "plain_name", "read_bytes", "read_dcp_metadata", "read_json", "reason",
           "saved_shapes"]
