"""What the HTML pages (``python -m vocagno.inspect --html``, the selection report's ``--html``) share."""

from __future__ import annotations

import json

__all__ = ["script_json"]


def script_json(value) -> str:
    """``value`` as JSON to put inside a page's script element. No "<", ">" or "&" there: "</script>" or "<!--<script>"
    in a document would end the element or switch the HTML parser's state; JSON's \\u escapes give JavaScript the
    same characters."""
    payload = json.dumps(value, ensure_ascii=False)
    return payload.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
