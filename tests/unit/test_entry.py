"""vocagno.entry.run, how every command ends: a refusal is one line and exit 2, Ctrl-C is 'interrupted' and 130, a
bug keeps its traceback, and VOCAGNO_TRACEBACK=1 shows a refusal's too."""

import pytest

from vocagno.entry import run
from vocagno.errors import Refused


def ended(main) -> int:
    with pytest.raises(SystemExit) as exit:
        run(main)
    return exit.value.code


def refuse():
    raise Refused("error: --shards x holds no index.json\n  convert a corpus into it first")


def test_a_refusal_is_one_line_and_exit_2(capsys, monkeypatch):
    monkeypatch.delenv("VOCAGNO_TRACEBACK", raising=False)
    assert ended(refuse) == 2
    assert capsys.readouterr().err == "error: --shards x holds no index.json convert a corpus into it first\n"
    assert ended(lambda: 0) == 0 and ended(lambda: None) == 0 and ended(lambda: 3) == 3


def test_ctrl_c_is_one_line_and_exit_130(capsys, monkeypatch):
    monkeypatch.delenv("VOCAGNO_TRACEBACK", raising=False)

    def interrupted():
        raise KeyboardInterrupt

    assert ended(interrupted) == 130 and capsys.readouterr().err == "\ninterrupted\n"
    monkeypatch.setenv("VOCAGNO_TRACEBACK", "1")
    with pytest.raises(KeyboardInterrupt):
        run(interrupted)


def test_a_bug_keeps_its_traceback_and_vocagno_traceback_shows_a_refusals(monkeypatch):
    monkeypatch.delenv("VOCAGNO_TRACEBACK", raising=False)

    def bug():
        raise KeyError("not a mistake of the user's")

    with pytest.raises(KeyError):
        run(bug)
    monkeypatch.setenv("VOCAGNO_TRACEBACK", "1")
    with pytest.raises(Refused):
        run(refuse)


def test_a_refusal_naming_a_files_text_shows_it_as_characters(capsys, monkeypatch):
    """A refusal quotes what it refuses (a file's name, a key of it): its escape sequences reach the terminal as
    escapes, never as commands to it."""
    monkeypatch.delenv("VOCAGNO_TRACEBACK", raising=False)

    def refuse_a_name():
        raise Refused("shards/\x1b]0;owned\x07\x1b[2J\u202ex: refused: its key 'x\x9b' is none")

    assert ended(refuse_a_name) == 2
    assert capsys.readouterr().err == "error: shards/\\x1b]0;owned\\x07\\x1b[2J\\u202ex: refused: its key 'x\\x9b' is none\n"


def test_an_argument_mistake_is_one_error_line_and_argparses_own_says_where_the_usage_is(capsys):
    """Every command's parser (vocagno.entry.Parser): argparse's own mistakes (a flag missing, one unknown) and a
    command's own check of its arguments end in one line ``error: ...``, exit code 2, with no usage block; argparse's
    add where the usage is, a command's names its fix itself. What was typed is shown as ``terminal`` shows it."""
    from vocagno.eval.__main__ import main as eval_main
    from vocagno.score import main as score_main

    def error_lines(main, argv):
        with pytest.raises(SystemExit) as exit:
            main(argv)
        assert exit.value.code == 2
        out, err = capsys.readouterr()
        return out, err.splitlines()

    assert error_lines(score_main, ["--shards", "x"]) == ("", [
        "error: the following arguments are required: --out (python -m vocagno.score --help shows the usage)"])
    assert error_lines(eval_main, ["--gold", "--no-such\x1b[31m"]) == ("", [
        "error: unrecognized arguments: --no-such\\x1b[31m (python -m vocagno.eval --help shows the usage)"])
    assert error_lines(eval_main, ["--gold", "--bpb-feild=body", "--limt", "3"]) == ("", [
        "error: unrecognized arguments: --bpb-feild=body --limt 3 (did you mean --bpb-field for --bpb-feild, --limit for "
        "--limt? python -m vocagno.eval --help shows the usage)"])
    assert error_lines(eval_main, ["--gold", "--limit", "-5"]) == ("", [
        "error: --limit must be 0 (all) or a positive number of questions, got -5"])
