"""The field report's surge replayed live against a running gateway, with time compressed.

Used by ``python manage.py surge`` and ``python -m bench.surge_compare`` (``make surge``).
Plain Python on asyncio streams: nothing here imports Django.
"""

from bench.surge.plan import SurgePlan
from bench.surge.replay import replay
from bench.surge.report import SurgeResult, headline_table, markdown_table

__all__ = ["SurgePlan", "SurgeResult", "headline_table", "markdown_table", "replay"]
