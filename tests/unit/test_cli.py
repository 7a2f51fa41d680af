"""shadowctl as a new user meets it: every mistake is one line and a hint, never a traceback."""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import shadow_operator
import yaml

pytestmark = pytest.mark.unit

SHADOWCTL = str(Path(sys.executable).parent / "shadowctl")


def run(*args: str, kubeconfig: str = "/nonexistent/kubeconfig") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": kubeconfig, "COLUMNS": "200"}
    return subprocess.run([SHADOWCTL, *args], env=env, capture_output=True, text=True, timeout=60)


def assert_one_error(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith("error: ") and lines[-1].startswith("hint: "), result.stderr
    for needle in needles:
        assert needle in result.stderr


def test_no_cluster_configured() -> None:
    assert_one_error(run("list"), "kubeconfig", "KUBECONFIG")


def test_create_needs_something_to_copy_in() -> None:
    assert_one_error(run("create", "x"), "nothing to copy in", "--local")


def test_bad_local_path_and_bad_rewrite(tmp_path: Path) -> None:
    assert_one_error(run("create", "x", "--local", str(tmp_path / "missing")), "not a directory")
    assert_one_error(
        run("create", "x", "--local", str(tmp_path), "--rewrite", "https://github.com/x"), "FROM=ORG"
    )


def test_bad_flag_is_refused_by_the_parser() -> None:
    result = run("list", "--no-such-flag")
    assert result.returncode == 2 and "No such option" in result.stderr and "Traceback" not in result.stderr


def test_help_reads_well() -> None:
    result = run("--help")
    assert result.returncode == 0
    for verb in ("create", "list", "status", "exec", "diff", "destroy"):
        assert verb in result.stdout


def test_version() -> None:
    result = run("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"shadowctl {shadow_operator.__version__}"


def closed_port_kubeconfig(tmp_path: Path, server: str = "") -> str:
    if not server:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            server = f"https://127.0.0.1:{sock.getsockname()[1]}"  # closed once the socket is
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u", "namespace": "team-a"}}],
                "current-context": "x",
            }
        )
    )
    return str(path)


@pytest.mark.parametrize(
    "args",
    [
        ("list", "-o", "xml"),
        ("-o", "xml", "list"),
        ("status", "x", "--output=xml"),
        ("sandbox", "list", "-oxml"),
        ("doctor", "-o", "xml"),
    ],
)
def test_a_bad_output_format_is_refused_before_any_api_call(tmp_path: Path, args: tuple[str, ...]) -> None:
    """The kubeconfig points at a closed port: the -o error, not a connection error, proves no call was made."""
    result = run(*args, kubeconfig=closed_port_kubeconfig(tmp_path))
    assert_one_error(result, "--output xml: unknown format", "text, json or yaml")
    assert "cannot reach" not in result.stderr


class HtmlProxy(http.server.BaseHTTPRequestHandler):
    """What stands in for the API server behind a corporate proxy or a login page: HTML, 200 or 502."""

    def do_GET(self) -> None:
        status = 502 if "sandboxclaims" in self.path else 200
        page = b"<!DOCTYPE html>\n<html>\n<head><title>Sign in</title></head>\n<body>\n<p>Please sign in</p>\n</body>\n</html>\n"
        self.send_response(status)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(page)))
        self.end_headers()
        self.wfile.write(page)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def html_proxy() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), HtmlProxy)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("args", [("list",), ("sandbox", "list"), ("status", "x")])
def test_an_html_answer_is_one_line(tmp_path: Path, html_proxy: str, args: tuple[str, ...]) -> None:
    result = run(*args, kubeconfig=closed_port_kubeconfig(tmp_path, html_proxy))
    assert_one_error(result, "HTML page, not the Kubernetes API", "kubectl config view --minify")
    assert len(result.stderr.strip().splitlines()) == 2, result.stderr
    assert "<html>" not in result.stderr


def test_doctor_names_the_install_the_readme_shows() -> None:
    """The hint named `helm install shadow-operator charts/shadow-operator`, which the README says does not
    work (the chart's images point at no registry until a release sets them)."""
    from shadow_operator.cli import maintenance

    readme = (Path(shadow_operator.__file__).parents[2] / "README.md").read_text()
    commands = readme.replace("\\\n", " ")
    hint = maintenance.install_hint("team-a")
    assert maintenance.INSTALL.format(namespace="team-a") in " ".join(commands.split())
    assert "helm install sandboxes oci://" in hint and "charts/shadow-operator (" not in hint
