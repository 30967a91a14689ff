"""The REST API under `/api/v1`: one module per resource family (`user`, `admin`, `repos`), the
host's request and response shapes (`schemas`), what the OpenAPI document promises (`contract`)
and the reference page that shows it (`reference`)."""
