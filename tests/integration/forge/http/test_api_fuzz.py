"""schemathesis against the served OpenAPI schema: whatever it sends, never a server error, and every
answer is one the document declares (status and content type), so a client generated from it works."""

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import content_type_conformance, not_a_server_error, status_code_conformance

from tests.support.accounts import LiveServer, make_account_with_token, run_sync

EXAMPLES_PER_OPERATION = 30
# The operations in interleaved shards, one test each, so parallel workers share the work (the whole
# schema in one test took over two minutes on a 2-CPU runner).
SHARDS = 4
CONTRACT_CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance]
# Ten thousand requests a database: with both chosen, PostgreSQL's, the stricter about what it is
# sent (NUL bytes, integer ranges, types); SQLite's run is `make test`'s.
pytestmark = pytest.mark.postgresql_when_both


@pytest.mark.parametrize("shard", range(SHARDS))
def test_no_server_errors_for_any_generated_request(live_server: LiveServer, shard: int) -> None:
    """Up to 30 s a shard: generated requests for a quarter of the API's operations each, against
    a real server; the cost is the number of examples, split into shards that run side by side."""
    token = run_sync(make_account_with_token(live_server.settings, "root", "admin", admin=True))
    schema = schemathesis.openapi.from_url(f"{live_server.url}/api/schema/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 50  # the schema names every operation (a broken schema names few)
    checked = 0
    for operation in operations[shard::SHARDS]:

        @settings(
            max_examples=EXAMPLES_PER_OPERATION,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
        )
        @given(case=operation.as_strategy())
        def call(case: Any) -> None:
            for headers in ({"Authorization": f"Bearer {token}"}, {}):
                response = case.call(base_url=live_server.url, headers=headers, timeout=30)
                assert response.status_code < 500, (case.method, case.formatted_path, response.text)
                case.validate_response(response, checks=CONTRACT_CHECKS)
                if response.status_code >= 400:
                    ctype = response.headers.get("content-type", [""])[0]
                    assert ctype.startswith("application/problem+json"), (case.method, case.formatted_path, ctype)
                    assert "code" in response.json()

        call()
        checked += 1
    assert checked == len(operations[shard::SHARDS])  # every operation of this shard was exercised
