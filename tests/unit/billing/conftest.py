"""The billing tests' autouse fixture (each test starts with empty in-process billing caches),
shared with tests/integration/billing/ where it is defined."""

from tests.integration.billing.conftest import fresh_billing_caches  # noqa: F401
