"""The command journal ("black box recorder", seed 003).

Every command that passes through the runtime is appended to a JSON-lines file in the state directory
(fsync'd per entry is too slow for exec-heavy agents; a flushed append survives a runtime restart, which is
the failure we guard against). Each entry is classified for significance; significant ones can also be
mirrored into HANDOFF.md in the workspace, under stable section headings an agent reads on its next start.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shlex
import time
from collections import deque
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from .shellwords import split_words

ERROR_PATTERNS = re.compile(r"error|exception|fail|traceback|fatal", re.IGNORECASE)
_BUILD_WORDS = re.compile(r"\b(build|test|tests|deploy|pytest|make|compile|install)\b")

# Arguments recorded per journal entry (each also cut at the entry length).
MAX_ARGS = 64

SECTION_ERRORS = "## Debugging History (auto-logged errors)"
SECTION_DONE = "## Completed This Session"
SECTION_DECISIONS = "## Decision Log"
SECTION_META = "## Session Metadata"
HANDOFF_SKELETON = f"""# HANDOFF

Maintained by sandbox-runtime from the command journal. Edit freely outside the auto-logged entries.

{SECTION_META}

{SECTION_ERRORS}

{SECTION_DONE}

{SECTION_DECISIONS}
"""


def command_text(argv: list[str]) -> str:
    """The command as the user meant it: `sh -c '<cmd>'` (how Amicable sends everything) shows as <cmd>."""
    if (
        len(argv) >= 3
        and os.path.basename(argv[0]) in ("sh", "bash", "dash", "zsh")
        and argv[1] in ("-c", "-lc")
    ):
        return argv[2]
    return shlex.join(argv)


def classify(text: str, exit_code: int | None, stdout: str, stderr: str, ignore: frozenset[str]) -> list[str]:
    reasons: list[str] = []
    if exit_code not in (0, None):
        reasons.append("nonzero-exit")
    if re.search(r"\bgit\s+commit\b", text):
        reasons.append("git-commit")
    if _BUILD_WORDS.search(text):
        reasons.append("build-test-deploy")
    if first_word(text) in ignore and reasons == []:
        return []
    if ERROR_PATTERNS.search(stderr) or ERROR_PATTERNS.search(stdout):
        reasons.append("error-output")
    return reasons


def first_word(text: str) -> str:
    """The program name of a command line; only its head is split (the rest cannot change the answer)."""
    head = text[:4096]
    try:
        words = split_words(head)
    except ValueError:
        words = head.split()
    return os.path.basename(words[0]) if words else ""


class Journal:
    def __init__(
        self,
        state_dir: str,
        root: str,
        *,
        ignore: frozenset[str],
        entry_length: int,
        handoff: bool,
        keep: int = 2000,
        max_bytes: int = 8 * 1024 * 1024,
    ) -> None:
        self.path = os.path.join(state_dir, "journal.jsonl")
        self.previous = self.path + ".1"
        self.max_bytes = max_bytes
        self.root = root
        self.ignore = ignore
        self.entry_length = entry_length
        self.handoff = handoff
        self.recent: deque[dict[str, Any]] = deque(maxlen=keep)
        self.seq = 0
        self.commands = 0
        self.started = time.time()
        self.last_command: str | None = None
        self._cond: asyncio.Condition | None = None
        os.makedirs(state_dir, exist_ok=True)
        for path in (self.previous, self.path):
            self._load(path)
        self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the process lifetime
        self._size = self._fh.tell()

    def _load(self, path: str) -> None:
        """Entries of one journal file (the previous one first: sequence numbers continue across both)."""
        if not os.path.exists(path):
            return
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue  # a torn last line from a crash; the rest is intact
                self.recent.append(entry)
                self.seq = max(self.seq, int(entry.get("seq", 0)))

    def _rotate(self) -> None:
        """journal.jsonl becomes journal.jsonl.1 (replacing the one before) and a new file starts."""
        self._fh.close()
        os.replace(self.path, self.previous)
        self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the process lifetime
        self._size = 0

    def _trunc(self, data: bytes | str) -> str:
        text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
        if len(text) > self.entry_length:
            return text[: self.entry_length] + f"… [{len(text) - self.entry_length} more chars]"
        return text

    def record_command(
        self,
        *,
        argv: list[str],
        cwd: str,
        exit_code: int | None,
        duration: float,
        stdout: bytes | str,
        stderr: bytes | str,
        api: str,
        timed_out: bool = False,
        started_at: float | None = None,
    ) -> dict[str, Any]:
        # Entries stay small whatever the command was (the journal is kept in memory and read back whole),
        # and classifying them costs the same for a megabyte-long argument as for a short one.
        if len(argv) > MAX_ARGS:
            argv = [*argv[:MAX_ARGS], f"… [{len(argv) - MAX_ARGS} more arguments]"]
        argv = [self._trunc(a) for a in argv]
        text = command_text(argv)
        out, err = self._trunc(stdout), self._trunc(stderr)
        reasons = classify(text, exit_code, out, err, self.ignore)
        if timed_out and "timeout" not in reasons:
            reasons.append("timeout")
        kind = "error" if ("nonzero-exit" in reasons or timed_out) else ("success" if reasons else "command")
        self.commands += 1
        self.last_command = text
        entry = {
            "kind": kind,
            "time": started_at or time.time(),
            "argv": argv,
            "command": text,
            "cwd": os.path.relpath(cwd, self.root) if cwd.startswith(self.root) else cwd,
            "exit_code": exit_code,
            "duration": round(duration, 6),
            "stdout": out,
            "stderr": err,
            "significant": bool(reasons),
            "reasons": reasons,
            "api": api,
            "timed_out": timed_out,
        }
        return self._append(entry)

    def record_decision(self, text: str, author: str | None) -> dict[str, Any]:
        entry = {
            "kind": "decision",
            "time": time.time(),
            "text": self._trunc(text),
            "author": author,
            "significant": True,
            "reasons": ["decision"],
        }
        return self._append(entry)

    def _append(self, entry: dict[str, Any]) -> dict[str, Any]:
        self.seq += 1
        entry = {"seq": self.seq, **entry}
        line = json.dumps(entry, separators=(",", ":")) + "\n"
        if self._size and self._size + len(line) > self.max_bytes:
            self._rotate()
        self._fh.write(line)
        self._fh.flush()
        self._size += len(line)
        self.recent.append(entry)
        if self.handoff and entry["significant"]:
            with contextlib.suppress(OSError):
                self._handoff_entry(entry)
        if self._cond is not None:
            cond = self._cond

            async def wake() -> None:
                async with cond:
                    cond.notify_all()

            with contextlib.suppress(RuntimeError):
                asyncio.get_running_loop().create_task(wake())
        return entry

    def entries(self, since: int = 0, significant_only: bool = False) -> list[dict[str, Any]]:
        return [e for e in self.recent if e["seq"] > since and (e["significant"] or not significant_only)]

    async def follow(self, since: int, significant_only: bool) -> AsyncIterator[dict[str, Any]]:
        if self._cond is None:
            self._cond = asyncio.Condition()
        while True:
            batch = self.entries(since, significant_only)
            for e in batch:
                yield e
                since = e["seq"]
            if not batch:
                since = max(since, self.seq) if significant_only else since
            async with self._cond:
                if self.seq <= since:
                    await self._cond.wait()

    # HANDOFF.md ----------------------------------------------------------------------------------

    @property
    def handoff_path(self) -> str:
        return os.path.join(self.root, "HANDOFF.md")

    def _read_handoff(self) -> str:
        try:
            with open(self.handoff_path, encoding="utf-8") as fh:
                return fh.read()
        except FileNotFoundError:
            return HANDOFF_SKELETON

    def _write_handoff(self, text: str) -> None:
        tmp = self.handoff_path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, self.handoff_path)

    @staticmethod
    def _insert(doc: str, section: str, block: str) -> str:
        if section not in doc:
            doc = doc.rstrip("\n") + f"\n\n{section}\n"
        start = doc.index(section) + len(section)
        nxt = doc.find("\n## ", start)
        end = len(doc) if nxt == -1 else nxt
        body = doc[start:end].rstrip("\n")
        return doc[:start] + body + "\n\n" + block.strip("\n") + "\n" + doc[end:]

    def _handoff_entry(self, e: dict[str, Any]) -> None:
        stamp = datetime.fromtimestamp(e["time"], UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        if e["kind"] == "decision":
            section = SECTION_DECISIONS
            block = f"- **{stamp}**: {e['text']}"
        elif e["kind"] == "error":
            section = SECTION_ERRORS
            symptoms = (e["stderr"] or e["stdout"]).strip() or "(no output)"
            block = (
                f"### Command failed with exit code {e['exit_code']}\n\n**Command:** `{e['command']}` "
                f"(in `{e['cwd']}`, {e['duration']:.2f} s)\n\n**Symptoms:**\n```\n{symptoms}\n```\n\n"
                f"*Auto-logged #{e['seq']}: {stamp}*"
            )
        else:
            section = SECTION_DONE
            out = e["stdout"].strip()
            block = f"### ✓ `{e['command']}`\n\n*{stamp}, {e['duration']:.2f} s, #{e['seq']}*"
            if out:
                block += f"\n\n```\n{out[:200]}\n```"
        self._write_handoff(self._insert(self._read_handoff(), section, block))

    def heartbeat(self) -> None:
        """Refresh the single heartbeat block in Session Metadata (replaced, so the file stays small)."""
        now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        active = int(time.time() - self.started)
        block = (
            f"<!-- heartbeat -->\n**Last heartbeat:** {now}  \n**Active for:** {active // 60} min  \n"
            f"**Commands executed:** {self.commands}  \n**Last command:** `{self.last_command or '-'}`\n"
            "<!-- /heartbeat -->"
        )
        doc = self._read_handoff()
        doc = re.sub(r"<!-- heartbeat -->.*?<!-- /heartbeat -->\n?", "", doc, flags=re.DOTALL)
        self._write_handoff(self._insert(doc, SECTION_META, block))

    def close(self) -> None:
        self._fh.close()
