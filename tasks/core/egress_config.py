"""A repository's egress setting (`"egress"` in its task settings) and the operator's egress
settings, as the settings API validates them and a run reads them (docs/egress.md).

Off (the default) keeps the sandbox without any network. `allow-list` gives the run the egress
proxy (egress/): the repository's rules, its presets and the operator's presets
(`FORGEHAND_EGRESS_PRESETS`) say what it may reach; `FORGEHAND_EGRESS_ALLOWED_HOSTS` says which
non-public addresses it may reach at all."""

from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec

from egress import PRESETS, AllowedHosts, RuleError, RuleSet, parse_presets, parse_rule
from egress.rules import MAX_RULE_LENGTH, MAX_RULES
from forge.core.errors import InvalidInput
from forge.core.settings import Settings, SettingsError

EgressMode = Literal["off", "allow-list"]
RuleText = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_RULE_LENGTH)]


class EgressSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """`mode` off or allow-list; `rules`: host[:port], *.domain[:port] or METHOD http://host/path;
    `presets`: names from `egress.PRESETS` (pypi, npm, debian)."""

    mode: EgressMode = "off"
    rules: Annotated[list[RuleText], msgspec.Meta(max_length=MAX_RULES)] = msgspec.field(default_factory=list)
    presets: Annotated[list[str], msgspec.Meta(max_length=len(PRESETS))] = msgspec.field(default_factory=list)


OFF = EgressSettings()


def checked(change: EgressSettings) -> EgressSettings:
    """The setting as stored: every rule parsed (422 `invalid_egress_rule` naming the first that
    is not), presets known and deduplicated (422 `invalid_egress_preset`)."""
    rules: list[str] = []
    for text in change.rules:
        try:
            parse_rule(text)
        except RuleError as exc:
            raise InvalidInput(str(exc), code="invalid_egress_rule") from None
        if text.strip() not in rules:
            rules.append(text.strip())
    try:
        presets = list(parse_presets(change.presets))
    except RuleError as exc:
        raise InvalidInput(str(exc), code="invalid_egress_preset") from None
    return EgressSettings(mode=change.mode, rules=rules, presets=presets)


def from_stored(value: dict[str, Any] | None) -> EgressSettings:
    """The stored JSON (None: off). Stored values were checked when they were written; one that no
    longer parses (an older rule grammar) reads as off, never as something wider."""
    if not value:
        return OFF
    try:
        return checked(msgspec.convert(value, EgressSettings))
    except (msgspec.ValidationError, InvalidInput):
        return OFF


def operator_presets(settings: Settings) -> tuple[str, ...]:
    return parse_presets(settings.egress_presets.split(","), "FORGEHAND_EGRESS_PRESETS:")


def check_operator(settings: Settings) -> None:
    """Refuse bad operator settings at start, naming the variable."""
    try:
        AllowedHosts.parse(settings.egress_allowed_hosts)
        operator_presets(settings)
    except RuleError as exc:
        raise SettingsError(str(exc)) from None


@dataclass(frozen=True)
class EgressPlan:
    """What a run's proxy enforces. `rule_count` counts the rules after the presets expanded."""

    rules: RuleSet
    allowed_hosts: AllowedHosts
    presets: tuple[str, ...]
    repo_rules: tuple[str, ...]

    @property
    def rule_count(self) -> int:
        return len(self.rules.rules)


def plan(setting: EgressSettings, settings: Settings) -> EgressPlan | None:
    """The run's proxy, or None when the repository keeps egress off."""
    if setting.mode != "allow-list":
        return None
    presets = tuple(dict.fromkeys((*operator_presets(settings), *setting.presets)))
    return EgressPlan(
        rules=RuleSet.build(setting.rules, presets),
        allowed_hosts=AllowedHosts.parse(settings.egress_allowed_hosts),
        presets=presets,
        repo_rules=tuple(setting.rules),
    )
