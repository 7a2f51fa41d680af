"""The pinned Gitea binary, started through the image's entrypoint (images/gitea/gitea-start.sh).

What the operator relies on: the server comes up healthy with its admin, the admin bootstrap is idempotent
across restarts of one data directory, organizations and repositories can be created through the API,
`git push` over HTTP works with a token and anonymous `git clone` of a public repository works.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.gitea import GiteaServer, missing_tools, pinned_version

pytestmark = pytest.mark.integration


def _require_tools() -> None:
    reason = missing_tools()
    if reason is None:
        return
    if os.environ.get("SHADOW_REQUIRE_INTEGRATION") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def gitea(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GiteaServer]:
    """A Gitea server for this module, with a random admin password and its own data directory."""
    _require_tools()
    with GiteaServer(tmp_path_factory.mktemp("gitea")) as server:
        yield server


def git(*args: str, cwd: Path | None = None) -> str:
    env = {
        **os.environ,
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "test",
        "GIT_AUTHOR_EMAIL": "test@shadow.local",
        "GIT_COMMITTER_NAME": "test",
        "GIT_COMMITTER_EMAIL": "test@shadow.local",
    }
    result = subprocess.run(
        ["git", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, f"git {' '.join(args)} failed:\n{result.stdout}{result.stderr}"
    return result.stdout


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_server_is_healthy_and_runs_the_pinned_version(gitea: GiteaServer) -> None:
    status, body = gitea.request("GET", "api/healthz", auth=None)
    assert status == 200, body
    assert gitea.api("GET", "version", auth=None)["version"] == pinned_version().removeprefix("v")


def test_admin_authenticates_and_others_do_not(gitea: GiteaServer) -> None:
    user = gitea.api("GET", "user")
    assert user["login"] == gitea.admin_username
    assert user["is_admin"] is True
    assert user["email"] == f"{gitea.admin_username}@shadow.local"
    status, _ = gitea.request("GET", "api/v1/user", auth=(gitea.admin_username, "wrong-password"))
    assert status == 401
    status, _ = gitea.request("GET", "api/v1/user", auth=None)
    assert status == 401
    # Registration is closed: the admin is the only account.
    assert [u["login"] for u in gitea.api("GET", "admin/users")] == [gitea.admin_username]


def test_push_with_a_token_then_anonymous_clone(gitea: GiteaServer, tmp_path: Path) -> None:
    org, name = unique("org"), "app"
    gitea.api("POST", "orgs", {"username": org, "visibility": "public"})
    repo = gitea.api("POST", f"orgs/{org}/repos", {"name": name, "private": False})
    assert repo["default_branch"] == "main"
    assert repo["clone_url"] == gitea.clone_url(f"{org}/{name}")
    gitea.api("POST", f"orgs/{org}/repos", {"name": "secret", "private": True})
    token = gitea.create_token(unique("push"), ["write:repository"])

    src = tmp_path / "src"
    src.mkdir()
    git("init", "-q", "-b", "main", cwd=src)
    (src / "README.md").write_text("hello from a test\n")
    git("add", "README.md", cwd=src)
    git("commit", "-q", "-m", "first", cwd=src)
    git("push", "-q", gitea.clone_url(f"{org}/{name}", token=token), "main", cwd=src)

    git("clone", "-q", gitea.clone_url(f"{org}/{name}"), str(tmp_path / "clone"))
    assert (tmp_path / "clone" / "README.md").read_text() == "hello from a test\n"
    gitea.wait_pushed(f"{org}/{name}")
    branch = gitea.api("GET", f"repos/{org}/{name}/branches/main", auth=None)
    assert branch["commit"]["message"].strip() == "first"

    # Anonymous readers see public repositories only.
    private = subprocess.run(
        ["git", "ls-remote", gitea.clone_url(f"{org}/secret")],
        env={**os.environ, "GIT_TERMINAL_PROMPT": "0"},
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert private.returncode != 0


def test_restart_on_the_same_data_dir_keeps_admin_secrets_and_repositories(tmp_path: Path) -> None:
    _require_tools()
    server = GiteaServer(tmp_path / "gitea")
    with server:
        gitea_repo = server.api("POST", "user/repos", {"name": "kept", "auto_init": True})
        assert gitea_repo["empty"] is False
        config = server.config_path.read_text()
    assert "SECRET_KEY = " in config and "INTERNAL_TOKEN = " in config
    assert server.admin_password not in server.log_path.read_text()

    # Same data directory and admin, a new server on another free port: the bootstrap sees the admin and keeps the configuration.
    with GiteaServer(server.data_dir, admin_password=server.admin_password) as again:
        assert again.api("GET", "user")["login"] == again.admin_username
        assert again.api("GET", f"repos/{again.admin_username}/kept")["empty"] is False
        assert [u["login"] for u in again.api("GET", "admin/users")] == [again.admin_username]
        restarted = again.config_path.read_text()
        assert f"HTTP_PORT = {again.port}" in restarted
    for key in ("SECRET_KEY", "INTERNAL_TOKEN", "JWT_SECRET"):
        assert _ini_value(config, key) == _ini_value(restarted, key)
    log = again.log_path.read_text()
    assert log.count(f"creating admin user '{again.admin_username}'") == 1
    assert f"admin user '{again.admin_username}' exists" in log
    assert again.admin_password not in log


def _ini_value(text: str, key: str) -> str:
    values = [
        line.split("=", 1)[1].strip() for line in text.splitlines() if line.split("=")[0].strip() == key
    ]
    assert len(values) == 1, (key, values)
    return values[0]


def test_migrations_are_refused_even_for_the_admin(gitea: GiteaServer, tmp_path: Path) -> None:
    """Gitea never fetches: a migration (which would clone any URL, the cluster's own addresses included)
    is refused, so a Gitea cannot be turned into a way into the cluster's network."""
    source = tmp_path / "src.git"
    git("init", "-q", "--bare", str(source))
    for clone_addr in (f"{gitea.url}shadow-admin/none.git", "http://169.254.169.254/latest", source.as_uri()):
        status, body = gitea.request(
            "POST",
            "api/v1/repos/migrate",
            body={
                "clone_addr": clone_addr,
                "repo_name": unique("migrated"),
                "repo_owner": gitea.admin_username,
            },
        )
        assert status in (403, 422), (clone_addr, status, body)
    repos = gitea.api("GET", f"users/{gitea.admin_username}/repos")
    assert not [r["name"] for r in repos if r["name"].startswith("migrated-")]
