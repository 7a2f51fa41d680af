"""sdk/confine.py: what is `.git` on some filesystem, which paths are refused, what modes files get, and
the dir_fd walk that refuses symbolic links (the hostile-server tests drive these through promote and cp)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from shadow_operator.sdk import confine
from shadow_operator.sdk.errors import TooLarge, UnsafePath

pytestmark = pytest.mark.unit

DOTGIT = [
    ".git",
    ".GIT",
    ".Git",
    ".g\u200cit",  # ZERO WIDTH NON-JOINER: ignored by HFS+ (git's is_hfs_dotgit)
    ".git\u200d",
    "\ufeff.git",
    ".gi\u00adt",  # SOFT HYPHEN, a default-ignorable code point
    "\uff0e\uff47\uff49\uff54",  # fullwidth, NFKC
    ".git.",  # Windows drops trailing dots and spaces (git's is_ntfs_dotgit)
    ".git ",
    ".git . .",
    ".git::$INDEX_ALLOCATION",  # an NTFS stream of .git
    "GIT~1",  # its 8.3 short name
    "git~1",
    "x\\.git",  # a backslash separates names on Windows
]
NOT_DOTGIT = [".github", ".gitignore", "git", ".gitx", "x.git", ".g-it", "dotfiles.git", ".gît"]


@pytest.mark.parametrize("name", DOTGIT)
def test_every_spelling_of_dotgit_is_refused(name: str) -> None:
    assert confine.is_dotgit(name)
    with pytest.raises(UnsafePath, match=r"\.git"):
        confine.check(f"src/{name}/config")


@pytest.mark.parametrize("name", NOT_DOTGIT)
def test_names_that_only_look_alike_pass(name: str) -> None:
    assert not confine.is_dotgit(name)
    assert confine.check(f"src/{name}") == ("src", name)


@pytest.mark.parametrize(
    "rel", ["/etc/passwd", "../x", "a/../../x", "./a", "a/./b", "a//b", "a/", "", "a\0b", ". ."]
)
def test_paths_that_leave_or_hide_are_refused(rel: str) -> None:
    with pytest.raises(UnsafePath):
        confine.check(rel)


def test_modes_keep_execute_and_lose_the_rest() -> None:
    assert confine.safe_mode(0o4755) == 0o755
    assert confine.safe_mode(0o6777) == 0o755
    assert confine.safe_mode(0o1666) == 0o644
    assert confine.safe_mode(0o400) == 0o600


def test_the_walk_refuses_links_and_creates_parents_itself(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "root"
    root.mkdir()
    (root / "link").symlink_to(outside)
    budget = confine.Budget()
    with confine.Confined(root) as dest:
        with (
            pytest.raises(UnsafePath, match="symbolic link"),
            dest.writer("link/new/x", 0o644, budget) as out,
        ):
            out.write(b"no")
        with dest.writer("a/b/c.txt", 0o755, budget) as out:
            out.write(b"yes")
        assert dest.delete("link")  # the link itself, not what it points to
    assert list(outside.iterdir()) == []
    assert (root / "a/b/c.txt").read_bytes() == b"yes" and os.access(root / "a/b/c.txt", os.X_OK)
    assert not (root / "link").exists() and outside.is_dir()
    with pytest.raises(UnsafePath, match=r"inside a \.git"):
        confine.Confined(tmp_path / "repo" / ".GIT" / "hooks", create=True)


def test_the_budget_counts_declared_sizes_and_arriving_bytes() -> None:
    budget = confine.Budget(max_bytes=100, max_members=2)
    budget.member("a", 60)
    with pytest.raises(TooLarge, match="declares 50 bytes"):
        budget.member("b", 50)
    with pytest.raises(TooLarge, match="more than 2 entries"):
        budget.member("c", 0)
    late = confine.Budget(max_bytes=10)
    with pytest.raises(TooLarge, match="more than 10 bytes arrived"):
        late.take("liar", 11)
