"""The Batch API: files uploaded once (and, next, batches of their lines scheduled like any request)."""
