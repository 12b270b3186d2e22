"""How every command line of vocagno ends: its exit code, or one line ``error: ...`` and exit code 2 for a mistake in
what it was given (a ValueError or OSError: the library's ``Refused``, ``UntrustedFile`` and ``BadCheckpoint`` among
them; what it quotes of a file shown as ``vocagno.shown.terminal`` shows it), or ``interrupted`` and exit code 130 for Ctrl-C. Anything else is a bug and ends in its traceback.
``VOCAGNO_TRACEBACK=1`` shows the traceback of a mistake too.

    if __name__ == "__main__":
        run(main)
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, NoReturn

__all__ = ["MISTAKES", "TRACEBACK", "Parser", "run", "one_line"]

TRACEBACK = "VOCAGNO_TRACEBACK"  # set to 1: a mistake's traceback, not its line
MISTAKES: tuple[type[BaseException], ...] = (ValueError, OSError)
MISTAKE_EXIT, INTERRUPTED_EXIT = 2, 130


def one_line(error: BaseException) -> str:
    """An error's message as one line, without a leading ``error: `` of its own."""
    text = " ".join(str(error).split()) or type(error).__name__
    return text.removeprefix("error: ")


class Parser(argparse.ArgumentParser):
    """The command lines' argument parser: a mistake in the arguments ends as every other refusal does, in one line
    ``error: ...``, exit code 2. argparse's own (a flag missing or unknown) adds where the usage is; a command's own
    check of its arguments names the fix itself."""

    _parsing = False

    def parse_known_args(self, *args, **kwargs):
        return self._parse(super().parse_known_args, *args, **kwargs)

    def parse_args(self, *args, **kwargs):  # argparse's "unrecognized arguments" is said here
        return self._parse(super().parse_args, *args, **kwargs)

    def _parse(self, parse, *args, **kwargs):
        before, self._parsing = self._parsing, True
        try:
            return parse(*args, **kwargs)
        finally:
            self._parsing = before

    def error(self, message: str) -> NoReturn:
        from vocagno.shown import terminal

        usage = f" ({self._meant(message)}{self.prog} --help shows the usage)" if self._parsing else ""
        print(f"error: {terminal(one_line(message))}{usage}", file=sys.stderr, flush=True)
        sys.exit(MISTAKE_EXIT)

    def _meant(self, message: str) -> str:
        """For flags argparse does not know, the flags they were likely meant to be (``--text-feild``)."""
        import difflib

        if not message.startswith("unrecognized arguments: "):
            return ""
        flags = [f for f in self._option_string_actions if f.startswith("--")]
        meant = []
        for word in message.removeprefix("unrecognized arguments: ").split():
            if word.startswith("--"):
                close = difflib.get_close_matches(word.split("=", 1)[0], flags, n=1, cutoff=0.75)
                meant += [f"{close[0]} for {word.split('=', 1)[0]}"] if close else []
        from vocagno.shown import terminal

        return f"did you mean {terminal(', '.join(meant))}? " if meant else ""


def run(main: Callable[[], int | None], mistakes: tuple[type[BaseException], ...] = ()) -> NoReturn:
    """``main()``'s exit code as the process's; a mistake (``MISTAKES`` and ``mistakes``) as one line on stderr."""
    try:
        code = main()
    except KeyboardInterrupt:
        if os.environ.get(TRACEBACK) == "1":
            raise
        print("\ninterrupted", file=sys.stderr, flush=True)
        sys.exit(INTERRUPTED_EXIT)
    except (*MISTAKES, *mistakes) as error:
        if os.environ.get(TRACEBACK) == "1":
            raise
        from vocagno.shown import terminal

        print(f"error: {terminal(one_line(error))}", file=sys.stderr, flush=True)
        sys.exit(MISTAKE_EXIT)
    sys.exit(code or 0)
