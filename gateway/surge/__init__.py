"""The field report's surge replayed live against a running gateway, with time compressed.

Used by ``python manage.py surge`` and ``python -m bench.surge_compare`` (``make surge``).
Plain Python on asyncio streams: nothing here imports Django.
"""
from gateway.surge.plan import SurgePlan
from gateway.surge.replay import replay
from gateway.surge.report import SurgeResult, headline_table, markdown_table

__all__ = ["SurgePlan", "SurgeResult", "headline_table", "markdown_table", "replay"]
