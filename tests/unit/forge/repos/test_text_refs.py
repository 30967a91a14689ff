"""What a text refers to: `#N`, `Fixes #N` and its kin, task branch names; code refers to nothing."""

from forge.repos.text_refs import closing_references, defuse_closing, references, task_number_of


def test_references_are_read_outside_code_each_once_in_order() -> None:
    text = "See #12 and #3, again #12.\n\n`#4` and\n\n```\n#5\n```\n\n    #6 indented\n\n[link](http://x/#7) a&#8; x#9"
    assert references(text) == [12, 3]
    assert references("#0 #0012 #1234567890") == []


def test_closing_keywords_in_any_tense_and_case() -> None:
    text = "Fixes #1, closed #2; RESOLVES: #3 resolve #4 close #5 fixed #6 fix #7 closes #8 resolved #9"
    assert closing_references(text) == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert closing_references("prefixes #1, unfixed #2, `fixes #3`, fixes#4, see #5") == []


def test_task_branches_name_their_task() -> None:
    assert task_number_of("agent/12-fix-the-cart") == 12
    assert task_number_of("AGENT/3-x") == 3
    assert task_number_of("feature/agent/12-x") is None and task_number_of("agent/x") is None


def test_an_agents_words_are_made_unable_to_close_issues() -> None:
    summary = "Done. Fixes #7, closes: #9 and resolved #11; see #3."
    defused = defuse_closing(summary)
    assert closing_references(defused) == [] and references(defused) == [3]
    assert defused.replace("\\#", "#") == summary  # read as markdown, the text is unchanged
