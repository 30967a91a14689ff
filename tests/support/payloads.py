"""The notification payloads (`forge.db.events`) as rows of the docs table: field, JSON type.

docs/webhooks.md (section 4, "Payloads") holds one row per field; the tests check the table's
first three columns against these rows, so the documentation cannot drift from the structs.
`python -m tests.support.payloads` prints the rows (the meaning column is written by hand)."""

from typing import Any

import msgspec
from msgspec import inspect

from forge.db.events import PAYLOADS, EventType

_SCALARS: dict[type[inspect.Type], str] = {
    inspect.StrType: "string",
    inspect.IntType: "integer",
    inspect.BoolType: "boolean",
    inspect.NoneType: "null",
    inspect.AnyType: "any JSON",
}


def _struct_of(t: inspect.Type) -> inspect.StructType | None:
    """The object type of a field that holds one (or null), else None."""
    if isinstance(t, inspect.StructType):
        return t
    if isinstance(t, inspect.UnionType):
        found = [x for x in t.types if isinstance(x, inspect.StructType)]
        return found[0] if len(found) == 1 else None
    return None


def json_type(t: inspect.Type) -> str:
    if isinstance(t, inspect.StructType):
        return "object"
    if type(t) in _SCALARS:
        return _SCALARS[type(t)]
    if isinstance(t, inspect.LiteralType):
        names = [f"`{v}`" for v in t.values]
        return names[0] if len(names) == 1 else "one of " + ", ".join(names)
    if isinstance(t, inspect.UnionType):
        return " or ".join(json_type(x) for x in t.types)
    if isinstance(t, inspect.DictType):
        return "object"
    if isinstance(t, inspect.ListType):
        item = t.item_type
        return "array of objects" if isinstance(item, inspect.StructType) else f"array of {json_type(item)}s"
    raise TypeError(f"no JSON type for {t!r}")


def _rows(prefix: str, struct: type[msgspec.Struct]) -> list[tuple[str, str]]:
    info = inspect.type_info(struct)
    assert isinstance(info, inspect.StructType)
    defaults = {f.encode_name: f.default for f in msgspec.structs.fields(struct)}
    rows: list[tuple[str, str]] = []
    for f in info.fields:
        if f.encode_name == info.tag_field:
            continue  # the tag is the envelope's `type`, never part of `data`
        kind = json_type(f.type)
        if defaults[f.encode_name] is msgspec.UNSET:
            kind = f"{kind}, may be absent"
        rows.append((f"{prefix}{f.encode_name}", kind))
        item = f.type.item_type if isinstance(f.type, inspect.ListType) else None
        if isinstance(item, inspect.StructType):
            rows += _rows(f"{prefix}{f.encode_name}[].", item.cls)
        nested = _struct_of(f.type)
        if nested is not None:
            rows += _rows(f"{prefix}{f.encode_name}.", nested.cls)
    return rows


def payload_rows() -> list[tuple[EventType, str, str]]:
    """(event type, field, JSON type) for every field of every payload, in wire order; a payload
    without fields has one row with an empty field."""
    out: list[tuple[EventType, str, str]] = []
    for etype, struct in PAYLOADS.items():
        rows = _rows("", struct) or [("", "")]
        out += [(etype, field, kind) for field, kind in rows]
    return out


def render_rows() -> str:
    lines = ["| type | field | JSON type | meaning |", "|---|---|---|---|"]
    for etype, field, kind in payload_rows():
        cell = f"`{field}`" if field else "(none)"
        lines.append(f"| `{etype}` | {cell} | {kind} | |")
    return "\n".join(lines)


def doc_rows(markdown: str, heading: str) -> list[tuple[str, str, str]]:
    """The first three cells of each row of the first table after `heading`, backticks removed."""
    text = markdown[markdown.index(heading) :]
    rows: list[tuple[str, str, str]] = []
    started = False
    for line in text.splitlines()[1:]:
        if not line.startswith("|"):
            if started:
                break
            continue
        started = True
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] in ("type", "---"):
            continue
        field = "" if cells[1] == "(none)" else cells[1].strip("`")
        rows.append((cells[0].strip("`"), field, cells[2]))
    return rows


def _main(*_: Any) -> None:
    print(render_rows())


if __name__ == "__main__":
    _main()
