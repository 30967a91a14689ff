"""Words a person reads: counts agree with their nouns, code stays code (backticks and all), and a
command of several lines keeps its lines wherever a summary shows it."""

from hypothesis import given
from hypothesis import strategies as st

from forge.core.text import code_block, code_span, plural
from forge.http.pages.render import markdown
from tasks.core.schemas import command_text
from tasks.run.runtimes.command.runtime import success_summary


def test_a_count_agrees_with_its_noun() -> None:
    assert plural(1, "commit") == "1 commit"
    assert [plural(n, "file") for n in (0, 2, 1234)] == ["0 files", "2 files", "1,234 files"]
    assert plural(1, "entry", "entries") == "1 entry" and plural(3, "entry", "entries") == "3 entries"


@given(st.text(alphabet="ab` \n", min_size=1, max_size=30))
def test_code_stays_code_whatever_backticks_it_holds(text: str) -> None:
    span = str(markdown(code_span(text.replace("\n", " ").strip() or "x")))
    assert span.startswith("<p><code>") and span.count("<code>") == 1
    block = str(markdown(code_block(text)))
    assert block.startswith("<pre><code>") and block.count("<pre>") == 1


def test_a_command_summary_keeps_its_lines() -> None:
    script = "printf 'hello\\n' > hello.txt\nfor i in 1 2; do echo line-$i; done"
    summary = success_summary(script)
    html = str(markdown(summary))
    assert summary.startswith("The command exited 0:")
    assert "<pre><code>printf 'hello\\n' &gt; hello.txt\nfor i in 1 2; do echo line-$i; done\n</code></pre>" in html
    assert success_summary("make test") == "`make test` exited 0"
    assert success_summary(["echo", "a b"]) == "`echo 'a b'` exited 0"  # an argv, quoted as a shell would
    assert str(markdown(success_summary("echo `date`"))).startswith("<p><code>echo `date`</code> exited 0")
    assert command_text(None) == "" and command_text("a\nb") == "a\nb"
