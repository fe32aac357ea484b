"""Creating a batch from an uploaded file (the API's ``POST /v1/batches``): whole or not at all.

The file's lines were checked when it was uploaded (batches.file_check); the create reads what
that stored — the first bad line, each line's model and hold terms — checks the models against the
backends configured now, says the batch's forecast (batches.forecast, 402 when no line could be
held), and copies the lines into the batch in SQL. It parses and tokenizes nothing, so a batch of
a 100 MB file is created in a few hundred ms of database work, in the batches' own database
thread (batches.db), not the gateway's.
"""

from __future__ import annotations

from collections.abc import Mapping

from django.db import connection, transaction
from django.db.models import Min
from django.utils import timezone

from batches.file_check import file_lines_check, wal_checkpoint
from batches.files import FileRefused, file_get
from batches.forecast import forecast
from batches.lines import ENDPOINTS, Terms, model_error
from batches.models import Batch, BatchFile, BatchLine, FileLine, LineBody
from batches.service import WINDOWS, Asked, State, batch_id_new


def batch_create(asked: Asked, *, served: Mapping[str, bool]) -> Batch:
    """The batch and all its lines, or FileRefused (400 naming the first bad line, 404 for a file
    that is not the tenant's, 402 for a budget that cannot hold any line). ``served``: each
    configured model, and whether it embeds. The file's lines were checked at upload
    (batches.file_check; a file that was not is checked now): this reads what that stored and
    copies the lines in SQL, so it parses and tokenizes nothing."""
    if asked.endpoint not in ENDPOINTS:
        raise FileRefused(400, f"'endpoint' must be one of {', '.join(ENDPOINTS)}; got '{asked.endpoint[:64]}'.")
    window = WINDOWS.get(asked.completion_window)
    if window is None:
        raise FileRefused(400, f"'completion_window' must be one of {', '.join(WINDOWS)}.")
    found = file_get(tenant_id=asked.tenant_id, file_id=asked.input_file_id)
    if found.purpose != BatchFile.Purpose.BATCH:
        raise FileRefused(400, f"File '{found.id}' is not a batch input file (purpose {found.purpose}).")
    if found.checked_at is None:
        found = file_lines_check(file_id=found.id)
    terms = _terms_checked(found, asked.endpoint, served)
    now = timezone.now()
    said = forecast(
        tenant_slug=asked.tenant_slug,
        class_name=asked.priority_class,
        lines=terms,
        pool=asked.pool,
        created_at=now,
        expires_at=now + window,
    )
    with transaction.atomic():
        batch = Batch.objects.create(
            id=batch_id_new(),
            tenant_id=asked.tenant_id,
            key_prefix=asked.key_prefix,
            endpoint=asked.endpoint,
            input_file=found,
            completion_window=asked.completion_window,
            priority_class=asked.priority_class,
            metadata=asked.metadata,
            forecast=said,
            created_at=now,
            expires_at=now + window,
        )
        lines_copy(batch_id=batch.id, file_id=found.id)
    wal_checkpoint()
    return batch


def _terms_checked(found: BatchFile, endpoint: str, served: Mapping[str, bool]) -> list[Terms]:
    """The checked file's lines' terms; FileRefused(400) naming its first bad line: the one its
    check found, or an earlier one whose model is not served (as the batch's endpoint wants it)."""
    rows = FileLine.objects.filter(file=found).order_by("number")
    first_of_model = dict(rows.order_by().values_list("model").annotate(first=Min("number")))
    bad: list[tuple[int, str]] = []
    if found.check_error:
        bad.append((found.check_error_line or 1, found.check_error))
    if found.endpoint and found.endpoint != endpoint:  # every checked line names the first line's url
        first = min(first_of_model.values())
        bad.append((first, f"Line {first}: 'url' must be the batch's endpoint {endpoint}, not {found.endpoint!r}."))
    for model, number in first_of_model.items():
        problem = model_error(model, ENDPOINTS[endpoint], served)
        if problem is not None:
            bad.append((number, f"Line {number}: {problem}."))
    if bad:
        raise FileRefused(400, f"File '{found.id}': {min(bad)[1]}")
    return [Terms(*values) for values in rows.values_list("number", "model", "bound_tokens", "output_tokens")]


def lines_copy(*, batch_id: str, file_id: str) -> None:
    """The batch's lines (pending) and their bodies, copied from the file's checked lines by two
    INSERT … SELECT statements: no row passes through Python."""
    line, body, checked = (m._meta.db_table for m in (BatchLine, LineBody, FileLine))
    zeros = ("runs", "sends", "started_send", "feeds", "prompt_tokens", "completion_tokens")
    blanks = ("owner", "backend", "ledger_key")
    copied = ("number", "custom_id", "estimated_tokens", "bound_tokens", "output_limit")
    constants = ["0"] * len(zeros) + ["''"] * len(blanks)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {line} (batch_id, state, {', '.join(copied + zeros + blanks)}) "
            f"SELECT %s, %s, {', '.join(copied)}, {', '.join(constants)} "
            f"FROM {checked} WHERE file_id = %s ORDER BY number",
            [batch_id, State.PENDING, file_id],
        )
        cursor.execute(
            f"INSERT INTO {body} (line_id, body) SELECT l.id, f.body FROM {line} l "
            f"JOIN {checked} f ON f.file_id = %s AND f.number = l.number WHERE l.batch_id = %s",
            [file_id, batch_id],
        )
