"""Requests in: authentication (`auth`), CSRF (`csrf`), the checks every request passes before a
handler (`edges`, with the input bounds `int_bounds` and `json_limits`), errors as problem details
or error pages (`problems`), the dependencies handlers name (`deps`), the git smart-HTTP routes
(`git_http`), the REST API (`api/`) and the HTML pages (`pages/`). Handlers parse, authorize, call
a use case of `forge.repos` or `forge.accounts`, and answer."""
