"""A refused form shown again: which field each refusal concerns, so the page puts the message next
to that field (`_forms.html`'s `field` macro) and keeps everything else as typed.

A refusal names its field in one of three ways, tried in order: `field` in the error's extras (a
service says which input it refused: `forge.core.errors.about_field`), the wire path of
a schema refusal (`invalid_input` turns `$.egress.rules[0]` into `egress.rules`), or its stable
`code` (`invalid_egress_rule`). Each form says which of these names are its inputs."""

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import msgspec

from forge.core.errors import ForgeError, InvalidInput

_PATH = re.compile(r" - at `\$\.?([^`]*)`$")


@dataclass(frozen=True)
class FormErrors:
    """What a page shows about a refused form: messages by input name, and one not about any field."""

    fields: dict[str, str] = field(default_factory=dict)
    general: str = ""

    def get(self, name: str) -> str:
        return self.fields.get(name, "")

    @property
    def first(self) -> str:
        """The first input with an error (the page focuses it), or ""."""
        return next(iter(self.fields), "")

    def __bool__(self) -> bool:
        return bool(self.fields or self.general)


NO_ERRORS = FormErrors()


def invalid_input(exc: msgspec.ValidationError) -> InvalidInput:
    """A schema refusal as the API words it (`... - at egress.rules[0]`), naming its field
    (`egress.rules`: list positions dropped)."""
    message = str(exc)
    found = _PATH.search(message)
    path = re.sub(r"\[\d+\]", "", found.group(1)) if found else ""
    return InvalidInput(message.replace("$.", ""), **({"field": path} if path else {}))


def form_errors(exc: ForgeError, inputs: Iterable[str], aliases: Mapping[str, str] | None = None) -> FormErrors:
    """The refusal placed at the input it concerns: its `field` or its `code`, through `aliases`
    (wire name or code -> input name) or as an input's own name; otherwise a general error."""
    names = set(inputs)
    for key in (exc.extra.get("field"), exc.code):
        if not isinstance(key, str) or not key:
            continue
        name = (aliases or {}).get(key, key)
        if name in names:
            return FormErrors(fields={name: exc.detail})
    return FormErrors(general=exc.detail)
