"""Reading a rendered form as a person sees it, with the standard library's HTML parser: each
element that has an id (its tag, attributes and text), the selected option of each select and the
checked boxes, so tests assert what came back after a refused submit."""

from dataclasses import dataclass, field
from html.parser import HTMLParser

VOID = {"input", "br", "img", "meta", "link", "hr", "source", "col", "wbr", "area", "base", "embed", "track"}


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    text: str = ""
    options: list[dict[str, str]] = field(default_factory=list)  # a select's options (value, text, selected)

    @property
    def described_by(self) -> list[str]:
        return self.attrs.get("aria-describedby", "").split()

    @property
    def selected(self) -> str:
        chosen = [o for o in self.options if "selected" in o]
        return (chosen or self.options or [{"value": ""}])[0]["value"]


class _Parser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.by_id: dict[str, Element] = {}
        self.checked: set[tuple[str, str]] = set()  # (name, value) of checked boxes and radios
        self.open: list[tuple[str, Element | None]] = []
        self.select: Element | None = None
        self.option: dict[str, str] | None = None

    def handle_starttag(self, tag: str, raw: list[tuple[str, str | None]]) -> None:
        attrs = {k: v or "" for k, v in raw}
        element = Element(tag, attrs) if "id" in attrs else None
        if element is not None:
            self.by_id[attrs["id"]] = element
        if tag == "input" and attrs.get("type") in ("checkbox", "radio") and "checked" in attrs:
            self.checked.add((attrs.get("name", ""), attrs.get("value", "on")))
        if tag == "select":
            self.select = element
        if tag == "option" and self.select is not None:
            self.option = {
                "value": attrs.get("value", ""),
                "text": "",
                **({"selected": "1"} if "selected" in attrs else {}),
            }
            self.select.options.append(self.option)
        if tag not in VOID:
            self.open.append((tag, element))

    def handle_endtag(self, tag: str) -> None:
        if tag == "select":
            self.select = None
        if tag == "option":
            self.option = None
        while self.open:
            name, _ = self.open.pop()
            if name == tag:
                break

    def handle_data(self, data: str) -> None:
        for _, element in self.open:
            if element is not None:
                element.text += data
        if self.option is not None:
            self.option["text"] += data


@dataclass
class Form:
    by_id: dict[str, Element]
    checked: set[tuple[str, str]]

    def __getitem__(self, element_id: str) -> Element:
        return self.by_id[element_id]

    def __contains__(self, element_id: str) -> bool:
        return element_id in self.by_id

    def value(self, element_id: str) -> str:
        """What the control shows: an input's value, a textarea's text, a select's chosen option."""
        element = self.by_id[element_id]
        if element.tag == "textarea":
            return element.text.removeprefix("\n")
        if element.tag == "select":
            return element.selected
        return element.attrs.get("value", "")

    def error_of(self, element_id: str) -> str:
        """The error the control is described by (its `aria-describedby` ids ending in -error)."""
        ids = [i for i in self.by_id[element_id].described_by if i.endswith("-error")]
        return " ".join(" ".join(self.by_id[i].text.split()) for i in ids if i in self.by_id)


def read_form(html: str) -> Form:
    parser = _Parser()
    parser.feed(html.replace("\r\n", "\n"))  # as a browser reads it (HTML normalizes line breaks)
    parser.close()
    return Form(parser.by_id, parser.checked)
