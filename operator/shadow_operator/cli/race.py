"""`shadowctl race`: N forks of an environment, a command each, verified and ranked; the best promoted."""

from __future__ import annotations

import shlex
import threading
from pathlib import Path
from typing import Annotated

import typer
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from shadow_operator.cli.common import NameArg, NamespaceOpt, OutputOpt, connect, emit, err, fail, out
from shadow_operator.sdk.gateway import ShadowGateway
from shadow_operator.sdk.race import RaceCandidate, RaceResult, parse_commands, plan_commands

STATE_STYLE = {"forking": "dim", "running": "cyan", "verifying": "yellow", "done": "", "failed": "red"}


def table(candidates: list[RaceCandidate]) -> Table:
    t = Table("#", "NAME", "STATE", "VERDICT", "SCORE", "EXIT", "TIME", "FILES", "LINES", "COMMAND", box=None)
    for c in candidates:
        verdict = c.verdict or ""
        colour = "green" if verdict == "PASS" else "red" if verdict else ""
        t.add_row(
            str(c.rank or ""),
            c.name,
            f"[{STATE_STYLE[c.state]}]{c.state}[/]" if STATE_STYLE[c.state] else c.state,
            f"[{colour}]{verdict}[/]" if colour else verdict,
            f"{c.score}/{c.max_score}" if c.score is not None else "",
            "" if c.exit_code is None else ("timeout" if c.timed_out else str(c.exit_code)),
            f"{c.duration_seconds:.1f}s" if c.duration_seconds is not None else "",
            str(c.changed_files) if c.state in ("verifying", "done") else "",
            str(c.changed_lines) if c.state in ("verifying", "done") else "",
            escape((c.error or c.command)[:60]),
        )
    return t


def race(
    name: NameArg,
    command: Annotated[
        list[str] | None,
        typer.Argument(
            help="The command each candidate runs (after --; a single argument runs under sh -c).",
            show_default=False,
        ),
    ] = None,
    count: Annotated[
        int | None, typer.Option("--count", min=2, max=20, help="Run COMMAND in N forks.")
    ] = None,
    commands_file: Annotated[
        Path | None,
        typer.Option(
            "--commands",
            help="A file with one command per candidate: one per line (# comments), or a YAML list.",
            exists=True,
            dir_okay=False,
        ),
    ] = None,
    promote: Annotated[
        bool,
        typer.Option(
            "--promote",
            help="Promote the winner (a PASS ranked first) once its change PASSes again in a fresh fork of the "
            "same snapshot; no confirmation.",
        ),
    ] = False,
    to: Annotated[
        Path | None, typer.Option(help="Promote into this directory (default: where it was uploaded from).")
    ] = None,
    to_branch: Annotated[
        str | None, typer.Option("--to-branch", help="Promote as a commit pushed to this Gitea branch.")
    ] = None,
    keep: Annotated[bool, typer.Option("--keep", help="Keep the losing forks (default: destroyed).")] = False,
    prefix: Annotated[
        str | None, typer.Option(help="Names of the forks: PREFIX-1..N (default: ENV-race).")
    ] = None,
    method: Annotated[str, typer.Option(help="Fork method: Auto, Snapshot or Copy.")] = "Auto",
    namespace: NamespaceOpt = "",
    timeout: Annotated[float, typer.Option(help="Seconds for the forks to be Ready.")] = 600.0,
    command_timeout: Annotated[
        float, typer.Option("--command-timeout", help="Seconds each candidate's command may run.")
    ] = 600.0,
    verify_timeout: Annotated[
        float, typer.Option("--verify-timeout", help="Seconds each verification may take.")
    ] = 600.0,
    output: OutputOpt = "text",
) -> None:
    """Race candidates: fork ENV once per candidate (one shared snapshot), run each candidate's command in its
    fork concurrently, verify each, and rank them: PASS first, then score, exit code 0, the smaller change,
    the shorter run. The winner is kept (and promoted with --promote, after its change PASSes again in a fresh
    fork, where no candidate ran); the others are destroyed unless --keep. Exit 0 when a candidate passed.

        shadowctl race my-change --count 3 -- 'agent --task fix-tests'
        shadowctl race my-change --commands approaches.txt --promote
    """
    if method not in ("Auto", "Snapshot", "Copy"):
        fail(f"--method {method}: unknown", "use Auto, Snapshot or Copy")
    if (to or to_branch) and not promote:
        fail("--to and --to-branch say where --promote goes", "add --promote")
    if command and commands_file:
        fail("give COMMAND or --commands FILE, not both", "one command for all (--count N), or a file")
    if commands_file is not None:
        commands = parse_commands(commands_file.read_text())
        if count is not None:
            fail("--count repeats COMMAND; --commands gives one command per candidate", "drop --count")
    else:
        words = list(command or ())
        commands = [words[0] if len(words) == 1 else shlex.join(words)] if words else []
    plan_commands(commands, count)  # bad input is refused before the cluster is contacted
    lock = threading.Lock()
    rows: dict[str, RaceCandidate] = {}
    with connect() as http, Live(table([]), console=err, transient=True, refresh_per_second=4) as live:

        def update(candidate: RaceCandidate) -> None:
            with lock:
                rows[candidate.name] = candidate
                live.update(table(list(rows.values())))

        gw = ShadowGateway(name, namespace=namespace, client=http)
        result = gw.race(
            commands,
            count=count,
            prefix=prefix,
            method=method,
            promote=promote,
            to=to,
            to_branch=to_branch,
            keep=keep,
            timeout=timeout,
            command_timeout=command_timeout,
            verify_timeout=verify_timeout,
            on_update=update,
        )
    if not emit(result, output):
        report(result, promote)
    raise typer.Exit(0 if result.winner else 1)


def report(result: RaceResult, promote: bool) -> None:
    out.print(table(result.candidates))
    overhead = result.ranked_seconds - max(
        ((c.duration_seconds or 0) + (c.verify_seconds or 0) for c in result.candidates),
        default=0.0,
    )
    err.print(
        f"ranked after {result.ranked_seconds:.1f}s (forks requested in {result.fork_seconds:.1f}s, "
        f"{overhead:.1f}s beyond the slowest candidate's own command and verification)"
    )
    if result.refused:
        err.print(f"[red]{escape(result.refused)}[/red]")
    elif result.winner is None:
        err.print("[red]no candidate passed[/red]" + ("; nothing promoted" if promote else ""))
    else:
        again = f", PASSed again in a fresh fork ({result.judge})" if result.judge else ""
        err.print(f"winner: {result.winner}{again} (kept: shadowctl destroy {result.winner} when done)")
    if isinstance(result.promoted, dict):
        err.print(f"pushed {result.promoted['source']} to branch {result.promoted['branch']}")
    elif result.promoted is not None:
        for plan in result.promoted:
            err.print(
                f"promoted {len(plan['write'])} written, {len(plan['delete'])} deleted into {plan['localDir']}"  # type: ignore[arg-type]
            )
    if result.destroyed:
        err.print(f"destroyed: {', '.join(result.destroyed)}")
    losers = [k for k in result.kept if k != result.winner]
    if losers:
        err.print(f"kept: {', '.join(losers)}")


def register(app: typer.Typer) -> None:
    app.command("race")(race)
