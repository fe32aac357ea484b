"""The audit log, at the very bottom of the house: who changed what configuration, when, old → new.

Every app may import this one; it imports none of them (the import-linter layers contract in
pyproject.toml). Its table is still ``scheduling_auditlog``, where the model was first written.
"""
