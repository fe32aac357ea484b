"""Load and dump scheduler YAML files against the live configuration (used by the command and admin).

A file may also carry ``api_keys:`` beside ``scheduler:``: the keys' expiry and revocation
(tenants.keys_yaml), applied in the same transaction; the dump writes it when keys exist.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from django.db import transaction

from scheduling.engine.model import SchedulerConfig
from scheduling.engine.schema import (
    ConfigError,
    ConfigIssue,
    config_from_dict,
    config_from_yaml,
    config_to_dict,
    config_to_yaml,
)
from scheduling.selectors import config_live
from scheduling.services import SECTIONS, ApplyResult, config_apply
from tenants.keys_yaml import SECTION as KEYS
from tenants.keys_yaml import KeyChange, keys_apply, keys_dump, keys_parse


def config_parse_file(path: str | Path) -> tuple[SchedulerConfig, set[str]]:
    """Parse and validate a file; return the config and the sections it names (``api_keys:`` is
    `keys_of_file`'s).

    A file without `classes` is validated merged over the live configuration (so its rules may
    name live classes); its other sections still replace only what the file names.
    """
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([ConfigIssue(source, None, "file", exc.strerror or str(exc))]) from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark else None
        raise ConfigError([ConfigIssue(source, line, "yaml", str(getattr(exc, "problem", exc)))]) from None
    if isinstance(raw, dict) and KEYS in raw and "scheduler" not in raw:
        return config_live(), set()  # the keys alone
    if not isinstance(raw, dict) or not isinstance(raw.get("scheduler"), dict):
        raise ConfigError([ConfigIssue(source, 1, "scheduler", "the file must have a top-level `scheduler:` mapping")])
    sections = set(raw["scheduler"])
    if "classes" in sections:
        return config_from_yaml(text, source=source, also=(KEYS,)), sections & set(SECTIONS)
    merged = {**config_to_dict(config_live()), **raw["scheduler"]}
    return config_from_dict(merged, source=source), sections & set(SECTIONS)


def keys_of_file(path: str | Path) -> list[KeyChange]:
    """The key changes of a file's ``api_keys:`` (none without it); ValidationError if refused."""
    raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    return keys_parse(raw[KEYS]) if isinstance(raw, dict) and KEYS in raw else []


@transaction.atomic
def config_load_file(path: str | Path, *, actor: str, confirm: bool = False) -> ApplyResult:
    """Apply the file; a price refused by scheduling.prices (ValidationError: out of range, or moved
    more than 2x without ``confirm``), or a key change refused, changes nothing."""
    config, sections = config_parse_file(path)
    keys = keys_of_file(path)
    result = config_apply(config=config, sections=sections, actor=actor, confirm=confirm)
    result.changes += keys_apply(keys, actor=actor)
    return result


def config_dump_text() -> str:
    text = config_to_yaml(config_live())
    keys = keys_dump()
    if keys:
        text += yaml.safe_dump({KEYS: keys}, sort_keys=False, allow_unicode=True, width=200)
    return text
