"""Files of the Batch API: one row per stored file, its bytes in the files storage (batches.files)."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class BatchFile(models.Model):
    """A file a tenant uploaded (``purpose`` batch) or a batch wrote (batch_output). ``id`` is the
    public one (``file-…``, in time order); the bytes are ``storage_name`` in the files storage."""

    class Purpose(models.TextChoices):
        BATCH = "batch"
        BATCH_OUTPUT = "batch_output"

    id = models.CharField(primary_key=True, max_length=40)
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.PROTECT, related_name="batch_files")
    purpose = models.CharField(max_length=32, choices=Purpose.choices)
    filename = models.CharField(max_length=255)
    bytes = models.BigIntegerField()
    lines = models.PositiveIntegerField()
    storage_name = models.CharField(max_length=400)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(null=True, blank=True)  # deleted then by beat (batches.sweep); None: kept
    key_prefix = models.CharField(max_length=32, blank=True)  # the API key that uploaded it
    # Its lines as a batch input, checked once at upload (batches.file_check): None, not yet (a
    # batch created from it checks it then); check_error names the first bad line ("" if none).
    checked_at = models.DateTimeField(null=True, blank=True)
    check_error = models.TextField(blank=True)
    check_error_line = models.PositiveIntegerField(null=True, blank=True)
    endpoint = models.CharField(max_length=64, blank=True)  # the url its lines name (checked, else "")

    class Meta:
        indexes = [models.Index(fields=["tenant", "id"])]

    def __str__(self) -> str:
        return f"{self.id} ({self.filename})"


class FileLine(models.Model):
    """A checked line of an uploaded batch file (batches.file_check): what a batch created from the
    file copies into its lines, so the create neither parses nor tokenizes. ``body`` is the last
    column: reading the others does not read it."""

    file = models.ForeignKey(BatchFile, on_delete=models.CASCADE, related_name="checked_lines")
    number = models.PositiveIntegerField()  # its line in the file
    custom_id = models.CharField(max_length=128)
    model = models.CharField(max_length=200)
    estimated_tokens = models.PositiveIntegerField()  # cl100k_base estimate of its prompt (scheduling)
    bound_tokens = models.PositiveIntegerField()  # its prompt's upper bound (the hold: gateway.limits)
    output_limit = models.PositiveIntegerField()  # per choice, sent upstream
    output_tokens = models.PositiveIntegerField(default=0)  # held: per choice times choices (gateway.limits)
    body = models.JSONField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["file", "number"], name="file_line_number_unique")]

    def __str__(self) -> str:
        return f"{self.file_id}:{self.number}"


class Batch(models.Model):
    """A batch of one file's lines, in OpenAI's shape (batches.service): its lines are scheduled
    like any request (batches.feeder) and run by Celery workers (batches.tasks)."""

    class Status(models.TextChoices):
        IN_PROGRESS = "in_progress"
        FINALIZING = "finalizing"
        COMPLETED = "completed"
        EXPIRED = "expired"
        CANCELLING = "cancelling"
        CANCELLED = "cancelled"

    id = models.CharField(primary_key=True, max_length=40)
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.PROTECT, related_name="batches")
    key_prefix = models.CharField(max_length=32)  # its lines run as the key that created it
    endpoint = models.CharField(max_length=64)
    input_file = models.ForeignKey(BatchFile, null=True, on_delete=models.SET_NULL, related_name="+")
    output_file = models.ForeignKey(BatchFile, null=True, on_delete=models.SET_NULL, related_name="+")
    error_file = models.ForeignKey(BatchFile, null=True, on_delete=models.SET_NULL, related_name="+")
    completion_window = models.CharField(max_length=8, default="24h")
    priority_class = models.CharField(max_length=32)  # the class its lines declare
    metadata = models.JSONField(null=True, blank=True)
    forecast = models.JSONField(null=True, blank=True)  # said at create (batches.forecast): cost bound, fit
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.IN_PROGRESS)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    finalizing_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    cancelling_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)
    expired_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["tenant", "id"]), models.Index(fields=["status"])]

    def __str__(self) -> str:
        return f"{self.id} ({self.status})"


class BatchLine(models.Model):
    """One request of a batch. ``state`` moves pending → claimed (a gateway holds it and it waits in
    the engine) → sent (granted a slot: a Celery worker runs it) → completed or failed; pending or
    claimed lines of a cancelled or expired batch end cancelled or expired."""

    class State(models.TextChoices):
        PENDING = "pending"
        CLAIMED = "claimed"
        SENT = "sent"
        COMPLETED = "completed"
        FAILED = "failed"
        CANCELLED = "cancelled"
        EXPIRED = "expired"

    ENDED = (State.COMPLETED, State.FAILED, State.CANCELLED, State.EXPIRED)

    batch = models.ForeignKey(Batch, on_delete=models.CASCADE, related_name="lines")
    number = models.PositiveIntegerField()  # its line in the input file
    custom_id = models.CharField(max_length=128)
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    owner = models.CharField(max_length=64, blank=True)  # the gateway process that claimed it
    backend = models.CharField(max_length=64, blank=True)  # granted
    ledger_key = models.CharField(max_length=200, blank=True)  # its hold's (an attempt's: billing.booking)
    runs = models.PositiveSmallIntegerField(default=0)  # times a worker started it
    sends = models.PositiveSmallIntegerField(default=0)  # times it was handed to the workers (batches.leases)
    started_send = models.PositiveSmallIntegerField(default=0)  # the send a worker started last
    lease_until = models.DateTimeField(null=True, blank=True)  # sent: its worker (or the hand-off) has it till then
    feeds = models.PositiveSmallIntegerField(default=0)  # times a gateway claimed it (again after one died)
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    response = models.JSONField(null=True, blank=True)  # the backend's answer's body
    prompt_tokens = models.PositiveIntegerField(default=0)  # as the backend reported them
    completion_tokens = models.PositiveIntegerField(default=0)
    error = models.JSONField(null=True, blank=True)  # {"code", "message"} (failed, cancelled, expired)
    charge = models.DecimalField(max_digits=18, decimal_places=6, null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    # Said at upload (FileLine); None for a line made without them: the feeder then works them out.
    estimated_tokens = models.PositiveIntegerField(null=True, blank=True)
    bound_tokens = models.PositiveIntegerField(null=True, blank=True)
    output_limit = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["batch", "custom_id"], name="batch_line_custom_id_unique")]
        indexes = [
            models.Index(fields=["state", "batch"]),
            models.Index(fields=["batch", "number"]),
            models.Index(fields=["batch", "state", "number"]),  # counts by state, pending lines in order
        ]

    def __str__(self) -> str:
        return f"{self.batch_id}:{self.custom_id} ({self.state})"


class LineBody(models.Model):
    """A batch line's request body, in a table of its own: a line's row changes state several times
    while it runs, and without its body (tens of KB) each change writes a small row."""

    line = models.OneToOneField(BatchLine, primary_key=True, on_delete=models.CASCADE, related_name="content")
    body = models.JSONField()

    def __str__(self) -> str:
        return f"body of line {self.line_id}"
