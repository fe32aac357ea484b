"""Load and dump scheduler YAML files against the live configuration (used by the command and admin)."""

from __future__ import annotations

from pathlib import Path

import yaml

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


def config_parse_file(path: str | Path) -> tuple[SchedulerConfig, set[str]]:
    """Parse and validate a file; return the config and the sections it names.

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
    if not isinstance(raw, dict) or not isinstance(raw.get("scheduler"), dict):
        raise ConfigError([ConfigIssue(source, 1, "scheduler", "the file must have a top-level `scheduler:` mapping")])
    sections = set(raw["scheduler"])
    if "classes" in sections:
        return config_from_yaml(text, source=source), sections & set(SECTIONS)
    merged = {**config_to_dict(config_live()), **raw["scheduler"]}
    return config_from_dict(merged, source=source), sections & set(SECTIONS)


def config_load_file(path: str | Path, *, actor: str, confirm: bool = False) -> ApplyResult:
    """Apply the file; a price refused by scheduling.prices (ValidationError: out of range, or moved
    more than 2x without ``confirm``) changes nothing."""
    config, sections = config_parse_file(path)
    return config_apply(config=config, sections=sections, actor=actor, confirm=confirm)


def config_dump_text() -> str:
    return config_to_yaml(config_live())
