"""The way out for text (vocagno.shown): what an attacker writes into a file name or a field is shown as its
characters, never acted on by the terminal, the markdown renderer or the browser."""

import html
import re

import pytest
from markdown_it import MarkdownIt

from vocagno.shown import html_text, md_code, md_fence, md_text, terminal

ATTACKS = [
    "\x1b]0;owned\x07title",  # window title
    "\x1b[2J\x1b[Hcleared",  # clear screen
    "name\r\n# Heading\n| a | b |",
    "a|b",
    "```\nrm -rf /\n```",
    "<script>alert(1)</script>",
    "[click](javascript:alert(1))",
    "evil\u202etxt.exe",
    "\u2028line",
    "back\\slash\\x1b",
    "**bold** _it_ `code` ~~s~~",
    "&amp; &#x3C;",
]


@pytest.mark.parametrize("text", ATTACKS)
def test_terminal_shows_no_control_character(text):
    shown = terminal(text)
    assert not re.search("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]", shown)
    assert shown.encode().decode("unicode_escape") if "\\u" not in shown else True


def test_terminal_keeps_plain_text_and_names_each_escape():
    assert terminal("shards/gsm8k_128 (über)") == "shards/gsm8k_128 (über)"
    assert terminal("a\x1bb\nc\u202e") == "a\\x1bb\\nc\\u202e"
    assert terminal("a\\x1b") == "a\\\\x1b"  # a written escape is not confused with a shown one


def _render(markdown: str) -> str:
    return MarkdownIt("commonmark").enable("table").render(markdown)


@pytest.mark.parametrize("text", ATTACKS)
def test_markdown_text_renders_as_its_characters_alone(text):
    page = _render(f"run: {md_text(text)}\n")
    assert page.startswith("<p>") and page.count("<") == 2, page  # one paragraph, no other element
    cell = _render(f"| a | b |\n|---|---|\n| {md_text(text)} | x |\n")
    assert cell.count("<td>") == 2, cell  # no extra cell, no extra row


@pytest.mark.parametrize("text", ATTACKS)
def test_a_fence_holds_whatever_it_holds(text):
    body = f"run_name: {text}\n````\n# not a heading\n"
    page = _render(f"{md_fence(body, 'yaml')}\n\nafter\n")
    assert page.count("<pre>") == 1 and "<h1>" not in page and page.rstrip().endswith("<p>after</p>"), page
    assert "\x1b" not in md_fence(body)


def test_html_text_is_inert():
    assert html_text('<img src=x onerror="a">') == "&lt;img src=x onerror=&quot;a&quot;&gt;"
    assert html_text("\x1b") == "\\x1b"


@pytest.mark.parametrize("text", ATTACKS + ["`", "``x`", " padded ", "a\\|b", "\\", "x |"])
def test_a_code_span_holds_its_characters_alone_in_prose_and_in_a_table_cell(text):
    page = _render(f"run: {md_code(text)}\n")
    assert page.startswith("<p>run: <code>") and page.count("<") == 4, page  # one paragraph, one code span
    assert html.unescape(re.search("<code>(.*)</code>", page, re.S).group(1)) == terminal(text)
    cell = _render(f"| a | b |\n|---|---|\n| {md_code(text, cell=True)} | x |\n")
    assert cell.count("<td>") == 2 and cell.count("<code>") == 1, cell
    assert html.unescape(re.search("<code>(.*)</code>", cell, re.S).group(1)) == terminal(text)


def test_a_code_span_of_an_ordinary_name_is_written_as_before():
    assert md_code("tiny-math-teacher") == "`tiny-math-teacher`"
    assert md_code("s3://runs/gsm", cell=True) == "`s3://runs/gsm`"


def test_every_format_character_and_undecodable_byte_is_shown_escaped_on_a_terminal():
    import sys
    import unicodedata

    invisible = [chr(c) for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c)) == "Cf"]
    assert len(invisible) > 150
    for char in invisible:
        assert char not in terminal(f"a{char}b"), hex(ord(char))
    name = b"run\x9b2J".decode("utf-8", "surrogateescape")  # a file name's byte that is no UTF-8 (8-bit CSI)
    assert terminal(name) == "run\\x9b2J" and terminal(name).encode("utf-8")


def test_no_scheme_or_mail_address_becomes_a_link():
    """GitHub links https://... and name@host by itself, escaped or not: a scheme's : is escaped, and text with an @
    is a code span, which nothing links."""
    assert md_text("https://evil.example/login") == "https\\://evil\\.example/login"
    assert md_text("admin@evil.example") == "`admin@evil.example`"
    cell = _render(f"| a | b |\n|---|---|\n| {md_text('x@y.z | w')} | x |\n")
    assert cell.count("<td>") == 2 and "<code>x@y.z | w</code>" in cell, cell
