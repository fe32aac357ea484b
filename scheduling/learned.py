"""What the engine learned that outlives its process (`LearnedProfile` rows, one per name): a read
and a write of one record, plain data. Not audited: the engine writes it, no person does."""

from __future__ import annotations

from typing import Any

from scheduling.models import LearnedProfile


def learned_profile_get(*, name: str) -> dict[str, Any] | None:
    return LearnedProfile.objects.filter(name=name).values_list("record", flat=True).first()


def learned_profile_save(*, name: str, record: dict[str, Any]) -> None:
    LearnedProfile.objects.update_or_create(name=name, defaults={"record": record})
