"""sdk/confine.py: what is `.git` on some filesystem, which paths are refused, what modes files get, and
the dir_fd walk that refuses symbolic links (the hostile-server tests drive these through promote and cp)."""

from __future__ import annotations

import functools
import os
import re
import sys
import unicodedata
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
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
    ".g\u0131t",  # DOTLESS I: NTFS upper-cases it to I (a simple case mapping casefold() leaves alone)
    ".g\u0130t",  # CAPITAL I WITH DOT ABOVE: its simple lower case is i
    ".G\u0130T",
    ".g\U0001d6a4t",  # MATHEMATICAL ITALIC SMALL DOTLESS I: NFKC makes it a dotless i
    "G\u0130T~1",
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


@functools.cache
def ascii_case_partners() -> dict[str, str]:
    """Every non-ASCII code point whose simple upper or lower case is an ASCII letter (what `re` matches for
    [a-z] under IGNORECASE), with that letter in lower case: computed, not listed."""
    found = {}
    for point in range(0x80, sys.maxunicode + 1):
        char = chr(point)
        if re.fullmatch("[a-z]", char, re.IGNORECASE):
            found[char] = next(
                a for a in "abcdefghijklmnopqrstuvwxyz" if re.fullmatch(a, char, re.IGNORECASE)
            )
    return found


@functools.cache
def spellings() -> dict[str, list[str]]:
    """Per letter of `git`, the code points some filesystem reads as it: its two cases, the case partners
    above, and whatever NFKC turns into one of those (fullwidth, mathematical, circled, dotless-i forms)."""
    partners = ascii_case_partners()
    direct = {a: {a, a.upper(), *(c for c, p in partners.items() if p == a)} for a in "git"}
    found: dict[str, set[str]] = {a: set(chars) for a, chars in direct.items()}
    for point in range(0x80, sys.maxunicode + 1):
        composed = unicodedata.normalize("NFKC", chr(point))
        for a, chars in direct.items():
            if composed in chars:
                found[a].add(chr(point))
    return {a: sorted(chars) for a, chars in found.items()}


def test_the_simple_case_table_is_every_ascii_case_partner() -> None:
    assert ascii_case_partners() == confine.SIMPLE_CASE_TO_ASCII
    assert {"\u0130", "\u0131"} <= set(confine.SIMPLE_CASE_TO_ASCII)  # the two casefold() misses


@settings(deadline=None)  # the first example computes the spellings
@given(
    st.data(),
    st.lists(st.sampled_from(["src", "a b", "x.y", ".github", "g\u0131t"]), max_size=3),
    st.sampled_from(["config", "hooks/post-checkout", "HEAD"]),
)
def test_any_spelling_of_each_letter_is_dotgit_at_any_depth(
    data: st.DataObject, parents: list[str], below: str
) -> None:
    name = "." + "".join(data.draw(st.sampled_from(spellings()[letter])) for letter in "git")
    assert confine.is_dotgit(name), [hex(ord(c)) for c in name]
    with pytest.raises(UnsafePath, match=r"\.git"):
        confine.check("/".join([*parents, name, below]))


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
