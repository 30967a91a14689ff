"""The names, symlinks and `.gitmodules` an agent's change may not bring into a tree."""

from hypothesis import given
from hypothesis import strategies as st

from forge.git.pathcheck import escapes, gitmodules_problem, guarded_as, link_problem, name_problem

_IGNORED = "\u200c\u200d\u200e\u200f\u202a\u202e\u206a\u206f\ufeff"


@st.composite
def dotgit_spellings(draw: st.DrawFn) -> str:
    letters = [draw(st.sampled_from([c, c.upper()])) for c in "git"]
    out = "."
    for letter in letters:
        out += draw(st.text(alphabet=_IGNORED, max_size=2)) + letter
    return out + draw(st.sampled_from(["", " ", ".", " . ", "::$INDEX_ALLOCATION", ":stream"]))


@given(dotgit_spellings())
def test_every_spelling_of_dotgit_is_refused(name: str) -> None:
    assert guarded_as(name) == ".git"
    assert name_problem(name) is not None


@given(st.sampled_from(["git~1", "GIT~1", "git~12"]))
def test_ntfs_short_names_of_dotgit_are_refused(name: str) -> None:
    assert name_problem(name) is not None


@given(st.text(alphabet="abcxyz._- 019", min_size=1, max_size=12))
def test_ordinary_names_pass(name: str) -> None:
    if guarded_as(name) is None and name not in (".", ".."):
        assert name_problem(name) is None


def test_guarded_dot_files_may_not_be_symlinks() -> None:
    for name in (".gitmodules", ".GITMODULES", "gitmod~1", ".gitattributes", ".mailmap", ".gitignore "):
        assert link_problem(name, "README") is not None
    assert link_problem("docs", "README") is None
    assert link_problem("x", "/etc/passwd") is not None


def test_symlink_chains() -> None:
    assert escapes("a", {"a": "../x"})[0]
    assert not escapes("a", {"a": "b/../c"})[0]
    assert escapes("a", {"a": "b/x", "b": ".."}) == (True, {"a", "b"})
    assert escapes("d/x", {"d/x": "../../y"})[0] and not escapes("d/x", {"d/x": "../y"})[0]
    assert not escapes("a", {"a": "b", "b": "a"})[0]  # a loop resolves nowhere


def test_gitmodules() -> None:
    assert gitmodules_problem(b'[submodule "m"]\n\tpath = m\n\turl = https://example.com/r.git\n') is None
    assert gitmodules_problem(b'[submodule "m"]\n\turl = --upload-pack=touch /tmp/x\n') is not None
    assert gitmodules_problem(b'[submodule "../../x"]\n\tpath = m\n') is not None
