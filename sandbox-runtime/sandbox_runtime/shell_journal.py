"""Commands typed in a terminal session, journaled one by one like the commands of `/v1/exec`.

bash, started by the PTY with `--rcfile` pointing at `RCFILE` (which first reads the files bash would have
read), runs a hook before each prompt: when history has a new entry, it writes `status TAB cwd TAB command NUL`
to a pipe whose write end only that shell holds (`SHADOW_JOURNAL_FD`). The runtime reads the pipe and records
each command with `Journal.record_command` (api "pty"): the same classification, the same HANDOFF.md entries.
What the shell writes there is the tenant's own word, like any command it runs: it is bounded (an entry past
`MAX_RECORD` bytes is dropped), parsed strictly, and truncated by the journal like any other. Other shells
run without the hook (their commands are not journaled).
"""

from __future__ import annotations

import os
import tempfile

from .journal import Journal

FD_VARIABLE = "SHADOW_JOURNAL_FD"
MAX_RECORD = 64 * 1024
# Runs before each prompt; the first run only notes where history stands (a previous session's last command
# is not this one's). The exit status is passed on to whatever PROMPT_COMMAND the user had.
RCFILE = r"""[ -f /etc/bash.bashrc ] && . /etc/bash.bashrc
[ -f ~/.bashrc ] && . ~/.bashrc
__shadow_journal() {
  local s=$? n c
  read -r n c <<<"$(HISTTIMEFORMAT= builtin history 1)"
  if [ -n "${__shadow_seen+x}" ] && [ -n "$n" ] && [ "$n" != "$__shadow_seen" ]; then
    printf '%s\t%s\t%s\0' "$s" "$PWD" "$c" >&"$SHADOW_JOURNAL_FD" 2>/dev/null
  fi
  __shadow_seen=$n
  return $s
}
PROMPT_COMMAND="__shadow_journal${PROMPT_COMMAND:+; $PROMPT_COMMAND}"
"""


def rcfile(state_dir: str) -> str:
    """The rc file, written afresh in the runtime's state directory for each terminal."""
    path = os.path.join(state_dir, "shell-journal.bashrc")
    # A fresh, exclusively created file renamed over the path: nothing planted there is written through.
    fd, tmp = tempfile.mkstemp(dir=state_dir, prefix=".shell-journal.")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(RCFILE)
    os.replace(tmp, path)
    return path


class ShellJournal:
    """Reads one shell's records from its pipe and journals them."""

    def __init__(self, journal: Journal, shell: str) -> None:
        self.journal = journal
        self.shell = shell
        self.pending = b""

    def feed(self, data: bytes) -> int:
        """Journal the complete records in `data` (the rest waits for more); the number journaled."""
        self.pending += data
        *records, self.pending = self.pending.split(b"\0")
        if len(self.pending) > MAX_RECORD:
            self.pending = b""  # a record that never ends: dropped
        count = 0
        for record in records:
            if len(record) <= MAX_RECORD and self._record(record.decode("utf-8", "replace")):
                count += 1
        return count

    def _record(self, record: str) -> bool:
        status, sep, rest = record.partition("\t")
        cwd, sep2, command = rest.partition("\t")
        if not (sep and sep2 and status.isdigit() and command.strip()):
            return False
        self.journal.record_command(
            argv=[self.shell, "-c", command],
            cwd=cwd,
            exit_code=int(status[:3]),
            duration=0.0,
            stdout="",
            stderr="",
            api="pty",
        )
        return True
