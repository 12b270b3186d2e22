"""The way out for text: every string read from a file, or a name from a folder or an object store, goes through one
function for the medium it is shown in before a person sees it.

- ``terminal``: control characters (C0, DEL, C1), line and paragraph separators and the bidirectional controls are
  shown as escapes (``\\x1b``, ``\\u202e``), so a file name can't move the cursor, set a window title, clear the
  screen or reorder what follows it; a backslash is doubled, so an escape shown is never mistaken for one written.
- ``md_text``: a one-line field of a markdown page (prose, a heading, a table cell): the terminal's escapes, then
  every ASCII punctuation character that markdown gives a meaning backslash-escaped, so it can start no line
  construct (heading, list, quote), add no table cell (``|``), open no link, code span, emphasis, math or HTML tag,
  and end no fence.
- ``md_code``: a one-line code span (a model's name, a path): shown in a code font as its characters (the
  terminal's escapes, nothing else: a code span knows no backslash escapes), between backtick runs longer than any
  inside it; in a table cell (``cell=True``) a ``|`` is written ``\\|``, which the table reads as the character.
- ``md_fence``: a block shown as it is (a recipe, a yaml): fenced by a run of backticks longer than any inside it,
  so nothing inside ends it; control characters but the new line and the tab escaped.
- ``html_text``: text in an HTML page: the terminal's escapes, then ``&<>"'`` as entities.
"""

from __future__ import annotations

import html
import re

__all__ = ["terminal", "md_text", "md_code", "md_fence", "html_text"]

# Unicode's format characters (category Cf: zero-width spaces and joiners, the bidirectional marks, embeddings,
# overrides and isolates, the soft hyphen, tags, ...), which show nothing or reorder what follows them; lone
# surrogates (a file name's bytes that are no UTF-8, as Python decodes them); U+2028/2029, which end a line.
_INVISIBLE = ("\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f\u202a-\u202e"
              "\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd\U00013430-\U0001343f"
              "\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f\ud800-\udfff\u2028\u2029")
# And the C0 and C1 controls and DEL; a block keeps its new lines and tabs.
_CONTROL = re.compile(f"[\x00-\x1f\x7f-\x9f{_INVISIBLE}]")
_CONTROL_IN_BLOCK = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{_INVISIBLE}]")
# What can start or end a markdown construct inside a line or a cell: emphasis, code, links and images, HTML and
# entities, a cell's edge, a heading, list or quote mark, math ($ on GitHub), strikethrough, and the : of a scheme
# GitHub links by itself (https:). The rest of ASCII's punctuation (, ; ' " / = ? % ^) means nothing there and is
# left as it is, so a figure reads 24,576.
_PUNCTUATION = re.compile(r"""([\\`*_{}\[\]()<>#+\-.!|~&$:])""")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # a byte that is no UTF-8, as surrogateescape keeps it: shown as that byte
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def terminal(text: object) -> str:
    """``text`` (any object, as ``str`` shows it) safe to print on a terminal, on one line."""
    return _CONTROL.sub(_escape, str(text).replace("\\", "\\\\"))


def md_text(text: object) -> str:
    """``text`` as one line of markdown that renders as exactly these characters, and nothing else: no new line, no
    table cell, no link, no HTML. Text holding an ``@`` is a code span (``md_code``, as in a table cell): GitHub
    links a mail address whatever is escaped in it, and never inside code."""
    if "@" in str(text):
        return md_code(text, cell=True)
    return _PUNCTUATION.sub(r"\\\1", terminal(text))


def md_code(text: object, cell: bool = False) -> str:
    """``text`` as a markdown code span that renders as exactly ``terminal(text)``, in prose or (``cell``) in a table
    cell: nothing inside it ends it, adds a cell or starts a new line."""
    shown = terminal(text)
    if cell:
        shown = shown.replace("|", "\\|")
    ticks = "`" * (max((len(run) for run in re.findall(r"`+", shown)), default=0) + 1)
    # A span that begins or ends with a backtick or a space is padded with a space each side, which the renderer
    # strips again (an all-space one is not stripped, and needs none).
    pad = " " if shown[:1] in ("`", " ") or shown[-1:] in ("`", " ") else ""
    if not shown.strip(" "):
        pad = "" if shown else " "
    return f"{ticks}{pad}{shown}{pad}{ticks}"


def md_fence(body: str, info: str = "") -> str:
    """``body`` as a fenced code block that nothing inside it can end; ``info`` (a language) made of word characters
    only."""
    body = _CONTROL_IN_BLOCK.sub(_escape, body)
    longest = max((len(run) for run in re.findall(r"`+", body)), default=0)
    fence = "`" * max(3, longest + 1)
    info = re.sub(r"[^\w+-]", "", info)
    return f"{fence}{info}\n{body.rstrip(chr(10))}\n{fence}"


def html_text(text: object) -> str:
    """``text`` safe as the content or the quoted attribute value of an HTML element."""
    return html.escape(terminal(text), quote=True)
