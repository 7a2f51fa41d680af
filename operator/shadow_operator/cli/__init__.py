"""shadowctl (also the kubectl plugin `kubectl-shadow`): shadow environments and sandboxes from the command line.

    shadowctl create my-change --local ~/src/core --rewrite https://github.com/microsoft/=shadow
    shadowctl exec my-change "cd app && make test"   # one argument: a line for sh -c
    shadowctl exec my-change -- python3 -m pytest -q
    shadowctl sync my-change --watch     # local edits into the running workspace
    shadowctl diff my-change
    shadowctl fork my-change --count 3   # three independent copies (copy-on-write where storage allows)
    shadowctl race my-change --count 3 -- 'agent fix-tests'   # forks, verified and ranked; --promote the best
    shadowctl manifest my-change -o yaml # seed 001's handoff manifest for a smoke-test agent
    shadowctl promote my-change
    shadowctl preview my-change          # a signed link to its private preview
    shadowctl stop my-change             # keep it, stop its Pod; `start` brings it back as it was
    shadowctl destroy my-change

Every verb talks to the API server of the kubeconfig's context (`--context` picks another); workspace runtimes
are reached through the API server's pod proxy, so no Ingress or port-forward is needed. Errors print one line
and a hint, never a traceback.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    """The entry point. `--version` answers before anything else is imported (the CLI's modules load only
    for a command that needs them)."""
    args = sys.argv[1:] if argv is None else list(argv)
    if args == ["--version"]:
        from shadow_operator import __version__

        sys.stdout.write(f"shadowctl {__version__}\n")
        return
    from shadow_operator.cli.app import main as run

    run(args)
