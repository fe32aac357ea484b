"""Identity, near the bottom of the house: tenants (business units), their users and their API keys.

Every app above may import this one; it imports only the audit log below it (the import-linter
layers contract in pyproject.toml). What a tenant means to scheduling (its weight, the classes it
may declare) and to billing (its annual budget) are fields of the row read by those apps.
Creating and changing tenants and keys is ``tenants.services``: audited, and checked against the
class names the caller passes in.
"""
