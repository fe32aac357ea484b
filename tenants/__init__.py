"""Identity, at the bottom of the house: tenants (business units), their users and their API keys.

Every other app may import this one; it imports none of them (the import-linter layers contract
in pyproject.toml). What a tenant means to scheduling (its weight, the classes it may declare)
and to billing (its annual budget) are fields of the row read by those apps; creating and changing
tenants and keys, which checks class names and writes the audit log, is ``gateway.services``.
"""
