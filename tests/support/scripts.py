"""Stand-in executables for tests of the wrapper scripts (images/kind-base): a program that prints the
arguments it was called with, one a line, so a test reads exactly what a wrapper passed on."""

from __future__ import annotations

import stat
from pathlib import Path


def argument_recorder(directory: Path) -> Path:
    """An executable `record-args` in `directory` that prints each of its arguments on a line."""
    script = directory / "record-args"
    script.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script
