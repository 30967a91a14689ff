"""The registry of API error codes: every `code` a problem response (or an error page) carries,
with its HTTP status and what it means. `docs/api.md` lists the same table.

`ForgeError` and `forge.http.problems.Problem` refuse a code that is not here when they are built,
so a test run finds any unregistered code. A code may stand with more than one status only where
the same condition is refused at two steps (see `also`). `python -m forge.core.error_codes` prints the
table for the docs."""

from enum import StrEnum
from typing import Self


class UnknownErrorCode(ValueError):
    """A code that is not in the registry, or a status the registry does not give it."""


class Code(StrEnum):
    status: int
    meaning: str
    also: tuple[int, ...]

    def __new__(cls, value: str, status: int, meaning: str, also: tuple[int, ...] = ()) -> Self:
        member = str.__new__(cls, value)
        member._value_ = value
        member.status = status
        member.meaning = meaning
        member.also = also
        return member

    @property
    def statuses(self) -> tuple[int, ...]:
        return (self.status, *self.also)

    # Generic: the defaults of the domain errors and what the framework refuses on its own.
    BAD_REQUEST = "bad_request", 400, "the request cannot be served (a 4xx status without a code of its own)"
    MALFORMED_BODY = "malformed_body", 400, "the body could not be decoded at all (not JSON)"
    VALIDATION_FAILED = "validation_failed", 422, "a body field or parameter does not fit its schema; see `errors`"
    INVALID_ENCODING = "invalid_encoding", 422, "the request body is not valid UTF-8"
    INVALID_CHARACTERS = "invalid_characters", 422, "a value or the URL contains a NUL character"
    UNAUTHENTICATED = "unauthenticated", 401, "sign in or send a token"
    FORBIDDEN = "forbidden", 403, "the caller may not do this"
    NOT_FOUND = "not_found", 404, "no such route or resource"
    METHOD_NOT_ALLOWED = "method_not_allowed", 405, "the route does not take this method"
    CONFLICT = "conflict", 409, "the request conflicts with the current state"
    INVALID_STATE = "invalid_state", 409, "the resource is not in a state that allows this"
    PAYLOAD_TOO_LARGE = "payload_too_large", 413, "the request body is larger than the limit"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type", 415, "the body's content type is not accepted here"
    RATE_LIMITED = "rate_limited", 429, "too many attempts; `Retry-After` says when to try again"
    SERVER_ERROR = "server_error", 500, "an unexpected error (a 5xx status without a code of its own); see request_id"
    BAD_GATEWAY = "bad_gateway", 502, "a service forgehand depends on failed"
    UNAVAILABLE = "unavailable", 503, "the service is not available"
    JSON_TOO_DEEP = (
        "json_too_deep",
        400,
        "the JSON body nests arrays/objects deeper than 128 levels (refused before decoding)",
    )
    OUT_OF_RANGE = "out_of_range", 422, "an integer query parameter outside signed 32 bits (an id in a path: 404)"
    DATABASE_BUSY = (
        "database_busy",
        503,
        "every connection of the write pool stayed taken (5 s), SQLite's write lock (15 s), or every read"
        " connection (30 s); retry after `Retry-After`",
    )

    # Accounts, sign-in, sessions and tokens.
    INVALID_LOGIN = "invalid_login", 422, "a login that is malformed or reserved"
    WEAK_PASSWORD = "weak_password", 422, "the password is too short"
    INVALID_PASSWORD = "invalid_password", 422, "the password is too long"
    ACCOUNT_NOT_FOUND = "account_not_found", 404, "no account with this login"
    WRONG_PASSWORD = "wrong_password", 403, "the current password given to change it is wrong"
    PASSWORD_MISMATCH = "password_mismatch", 422, "the new password and its repetition differ"
    PASSWORD_UNCHANGED = "password_unchanged", 422, "the new password is the current one"
    PASSWORD_CHANGE_REQUIRED = (
        "password_change_required",
        403,
        "the session's password was generated: change it at /settings/password first (tokens are not affected)",
    )
    NO_PASSWORD = "no_password", 422, "bots have no password (they act through tokens)"
    LOGIN_TAKEN = "login_taken", 409, "another account has this login"
    CANNOT_DISABLE_SELF = "cannot_disable_self", 422, "an admin cannot disable their own account"
    ACCOUNT_DISABLED = "account_disabled", 401, "the account is disabled (422: a token for a disabled account)", (422,)
    BAD_CREDENTIALS = "bad_credentials", 401, "wrong login or password"
    INVALID_CREDENTIALS = "invalid_credentials", 401, "malformed Basic credentials or an unsupported scheme"
    CSRF_FAILED = "csrf_failed", 403, "the form's CSRF token is missing or wrong"
    INVALID_TOKEN_NAME = "invalid_token_name", 422, "a token name is 1-100 characters"
    INVALID_SCOPE = "invalid_scope", 422, "an unknown scope, no scope, or one the account cannot hold"
    INVALID_EXPIRY = "invalid_expiry", 422, "a token expiry outside the allowed days"
    TOKEN_NOT_FOUND = "token_not_found", 404, "no such token of this account"
    INVALID_TOKEN = "invalid_token", 401, "a malformed or unknown token"
    TOKEN_REVOKED = "token_revoked", 401, "the token was revoked"
    TOKEN_EXPIRED = "token_expired", 401, "the token has expired"
    INSUFFICIENT_SCOPE = "insufficient_scope", 403, "the token lacks the scope this needs"

    # Repositories, collaborators, branch rules and browsing.
    REPO_NOT_FOUND = "repo_not_found", 404, "no repository the caller can read by this name"
    REPO_EXISTS = "repo_exists", 409, "the owner has a repository of this name"
    REPO_ARCHIVED = "repo_archived", 403, "the repository is archived (read-only)"
    INVALID_NAME = "invalid_name", 422, "an owner, repository or branch name that is not acceptable"
    INVALID_VISIBILITY = "invalid_visibility", 422, "visibility is private, internal or public"
    BRANCH_NOT_FOUND = "branch_not_found", 422, "the new default branch does not exist"
    CONFIRMATION_REQUIRED = "confirmation_required", 422, "type the repository's full name to confirm"
    INVALID_TRANSFER = "invalid_transfer", 422, "the new owner already owns it, or is disabled"
    OWNER_ROLE = "owner_role", 422, "the owner's role cannot change (always admin)"
    INVALID_ROLE = "invalid_role", 422, "a role is read, write or admin"
    COLLABORATOR_NOT_FOUND = "collaborator_not_found", 404, "the account is not a collaborator"
    INVALID_PATTERN = "invalid_pattern", 422, "a branch rule pattern is 1-255 characters without spaces"
    BRANCH_RULE_NOT_FOUND = "branch_rule_not_found", 404, "no such branch rule on this repository"
    INVALID_REQUIRED_CHECKS = (
        "invalid_required_checks",
        422,
        "a branch rule requires at most 20 status contexts of 1-255 printable characters",
    )
    INVALID_COMPARE = "invalid_compare", 422, "a comparison is written base...head"
    UNKNOWN_COMMIT = "unknown_commit", 422, "a commit status names a commit this repository does not have"
    INVALID_TARGET_URL = "invalid_target_url", 422, "a status's target_url is not an http(s) URL"
    TOO_MANY_STATUSES = "too_many_statuses", 422, "a commit holds at most 1000 statuses of one context"

    # Repository secrets (forge/repos/repo_secrets.py).
    SECRET_NOT_FOUND = "secret_not_found", 404, "the repository has no secret by this name"
    INVALID_SECRET_NAME = (
        "invalid_secret_name",
        422,
        "a secret name is a letter or `_` then up to 127 letters, digits or `_`, "
        "and does not start with `FORGEHAND_` or `GITHUB_`; the message names the rule",
    )
    INVALID_SECRET_VALUE = "invalid_secret_value", 422, "a secret's value is empty or contains a NUL character"
    SECRET_TOO_LARGE = "secret_too_large", 422, "a secret's value is larger than 48 KiB (UTF-8)"
    TOO_MANY_SECRETS = "too_many_secrets", 422, "a repository holds at most 100 secrets"

    # Pull requests (forge/repos/pulls.py).
    PULL_NOT_FOUND = "pull_not_found", 404, "no pull request by this number in the repository"
    PULL_REQUEST_EXISTS = "pull_request_exists", 409, "an open pull request for the same head and base exists"
    INVALID_PULL_BRANCHES = "invalid_pull_branches", 422, "head and base are the same branch, or a branch is missing"
    NO_COMMITS_BETWEEN = "no_commits_between", 422, "the head branch has no commit the base lacks"
    PULL_NOT_OPEN = "pull_not_open", 409, "the pull request is closed or merged"
    PULL_HEAD_GONE = "pull_head_gone", 409, "the pull request's head branch was deleted"
    HEAD_MOVED = "head_moved", 409, "the head moved since the caller read it; see `head_sha`"
    BRANCH_RULE_UNMET = (
        "branch_rule_unmet",
        409,
        "branch rules (on a task's pull request, the task's merge rules too) do not hold; see `unmet_rules`",
    )
    CANNOT_REVIEW_OWN = "cannot_review_own", 422, "the author of a pull request cannot approve or reject it"
    INVALID_REVIEW_LINE = "invalid_review_line", 422, "a line comment names a file or line outside the diff"
    INVALID_REVIEWER = "invalid_reviewer", 422, "a requested reviewer has no write access or does not exist"
    PULL_REQUIRED = "pull_request_required", 422, "the branch takes changes only through pull requests"
    INVALID_REQUIRED_APPROVALS = "invalid_required_approvals", 422, "a branch rule requires 0 to 10 approvals"
    INVALID_MERGERS = "invalid_mergers", 422, "a merge allow-list names at most 50 existing accounts"
    TASK_PULL_REQUEST = (
        "task_pull_request",
        409,
        "a task's pull request is reviewed and merged on the task's review page",
    )
    NOT_ALLOWED_TO_MERGE = "not_allowed_to_merge", 403, "a branch rule lets only the accounts it names merge here"

    # Issues, labels, milestones and comments (forge/repos/issues.py and beside it).
    ISSUE_NOT_FOUND = "issue_not_found", 404, "no issue by this number in the repository"
    COMMENT_NOT_FOUND = "comment_not_found", 404, "no such comment on this repository's issues"
    LABEL_NOT_FOUND = (
        "label_not_found",
        404,
        "no label of this name in the repository (422 when a request body names it: create it first)",
        (422,),
    )
    LABEL_EXISTS = "label_exists", 409, "a label of this name (in any case) exists in the repository"
    INVALID_LABEL = "invalid_label", 422, "a label is 1-50 printable characters with a colour of six hex digits"
    MILESTONE_NOT_FOUND = "milestone_not_found", 404, "no milestone by this number in the repository"
    MILESTONE_EXISTS = "milestone_exists", 409, "a milestone of this title (in any case) exists in the repository"
    INVALID_ASSIGNEE = "invalid_assignee", 422, "an assignee must exist and be able to read the repository"
    TOO_MANY_ASSIGNEES = "too_many_assignees", 422, "an issue has at most 10 assignees"
    TOO_MANY_LABELS = "too_many_labels", 422, "an issue has at most 30 labels; a repository at most 500"
    NOT_YOUR_COMMENT = "not_your_comment", 403, "only a comment's author (or a repository admin) may change it"

    # The git layer (`forge.git.errors.RepoError` codes).
    INVALID_REF_NAME = "invalid_ref_name", 422, "a ref or branch name git would refuse"
    INVALID_PATH = "invalid_path", 422, "a tree path with `..`, a leading slash, NUL or a `.git` component"
    REF_NOT_FOUND = "ref_not_found", 404, "a ref, branch, tag or commit that does not resolve"
    PATH_NOT_FOUND = "path_not_found", 404, "no such path at this commit"
    NOT_A_BLOB = "not_a_blob", 422, "the path is a directory where a file was expected"
    NOT_A_TREE = "not_a_tree", 422, "the path is a file where a directory was expected"
    IMPORT_FAILED = "import_failed", 422, "the repository to import could not be cloned or checked"
    GIT_PROTOCOL_ERROR = "git_protocol_error", 400, "a smart HTTP body that does not follow the git protocol"
    UNSUPPORTED_SERVICE = "unsupported_service", 403, "a git service other than upload-pack and receive-pack"
    UNSUPPORTED_ENCODING = "unsupported_encoding", 415, "a Content-Encoding other than identity and gzip"
    PUSH_TOO_LARGE = "push_too_large", 413, "the (decoded) push is larger than the limit"
    REF_CONFLICT = "ref_conflict", 409, "a ref moved while it was updated"
    BASE_MOVED = "base_moved", 409, "the base branch moved since the merge was planned"
    RUN_FENCED = "run_fenced", 409, "another worker took the run over: its git writes are refused"
    MERGE_CONFLICT = "merge_conflict", 409, "the merge has conflicting files; see `conflicts`"
    NOT_FAST_FORWARD = "not_fast_forward", 409, "a fast-forward was asked for but is not possible"
    NOTHING_TO_MERGE = "nothing_to_merge", 409, "the branch adds nothing to the base"
    UNRELATED_HISTORIES = "unrelated_histories", 409, "the branch and the base share no history"
    GIT_FAILED = "git_failed", 500, "a git process failed"
    REPO_ERROR = "repo_error", 500, "the git layer failed"

    # Tasks, approvals, reviews and merges.
    TASK_NOT_FOUND = "task_not_found", 404, "no task the caller can see by this number"
    INVALID_TASK_STATE = "invalid_task_state", 409, "the task's state does not allow this; see `state`"
    INVALID_STATE_FILTER = "invalid_state_filter", 422, "an unknown state in the list filter"
    GOAL_REQUIRED = "goal_required", 422, "a task needs a goal"
    COMMAND_REQUIRED = "command_required", 422, "the command runtime needs a command"
    INVALID_COMMAND = "invalid_command", 422, "a command with NUL, or a command for another runtime"
    AGENT_COMMAND_REQUIRED = "agent_command_required", 422, "the acp runtime needs `agent_command` (a configured agent)"
    UNKNOWN_ACP_AGENT = "unknown_acp_agent", 422, "`agent_command` names no configured ACP agent (GET /api/v1/agents)"
    ACP_AGENT_UNAVAILABLE = "acp_agent_unavailable", 422, "the ACP agent is configured but cannot run yet (its reason)"
    INVALID_AGENT_COMMAND = "invalid_agent_command", 422, "`agent_command` is for the acp runtime"
    MODEL_NOT_CONFIGURED = (
        "model_not_configured",
        422,
        "the runtime needs a model endpoint (builtin and codex: FORGEHAND_MODEL_*, claude-code: FORGEHAND_ANTHROPIC_*)",
    )
    MODEL_NOT_CHOSEN = (
        "model_not_chosen",
        422,
        "the runtime's provider has an endpoint but no model can be chosen for the run; the message names where "
        "to set one (your model access, the repository's task settings, the instance's setting)",
    )
    INVALID_MODEL_URL = (
        "invalid_model_url",
        422,
        "the model endpoint is not an http(s) URL without credentials, query or fragment",
    )
    HOST_NOT_ALLOWED = (
        "host_not_allowed",
        422,
        "a model or webhook endpoint's host is a loopback name or a non-public address (or, for a webhook, "
        "http) that the instance's allow-list does not name; the message says where an instance admin allows it",
    )
    UNKNOWN_MODEL_PROVIDER = "unknown_model_provider", 404, "model keys are for `anthropic` or `openai`"
    INVALID_MODEL_KEY = "invalid_model_key", 422, "a model key is 8-4096 printable characters"
    INVALID_MODEL_NAME = "invalid_model_name", 422, "a model name is printable characters without spaces"
    INVALID_EGRESS_RULE = (
        "invalid_egress_rule",
        422,
        "an egress rule is not host[:port], *.domain[:port] or METHOD http://host/path-prefix; the message names it",
    )
    INVALID_EGRESS_PRESET = "invalid_egress_preset", 422, "an egress preset is not one of pypi, npm, debian"
    INVALID_ENVIRONMENT = (
        "invalid_environment",
        422,
        "an environment declaration is refused; the message names every problem (docs/environments.md)",
    )
    INVALID_TOOL_NAME = (
        "invalid_tool_name",
        422,
        "a custom tool's name is not snake_case, is a builtin tool's name, or its scope has too many tools",
    )
    INVALID_TOOL_SCHEMA = (
        "invalid_tool_schema",
        422,
        "a custom tool's parameter schema breaks a rule (or the body repeats a key); the message names it",
    )
    INVALID_TOOL_MODE = (
        "invalid_tool_mode",
        422,
        "a custom tool's mode is not approval or auto, or auto is asked for a tool not marked read_only",
    )
    INVALID_TOOL_DEFINITION = (
        "invalid_tool_definition",
        422,
        "a custom tool's script, interpreter, description or timeout is out of bounds; the message names it",
    )
    INVALID_TOOL_INPUTS = (
        "invalid_tool_inputs",
        422,
        "a custom tool's inputs do not match its parameter schema; the message names the parameter",
    )
    INVALID_ENVIRONMENT_IMAGE = (
        "invalid_environment_image",
        422,
        "an environment image to register is not a local image reference (repository[:tag]), or there are too many",
    )
    INVALID_WORKER_LABELS = (
        "invalid_worker_labels",
        422,
        "a worker label is not 1-32 of a-z, 0-9, `_`, `.`, `-` starting with a letter or digit, or there are more"
        " than 8 (the repository's and the task's together)",
    )
    ENVIRONMENT_OVERRIDE_NEEDS_ADMIN = (
        "environment_override_needs_admin",
        403,
        "only a repository admin may override the environment of one task",
    )
    MODEL_KEY_NOT_FOUND = "model_key_not_found", 404, "the caller has no personal key for this provider"
    INVALID_AGENT = "invalid_agent", 422, "the agent is not an active bot with write access"
    BASE_NOT_FOUND = "base_not_found", 422, "the base branch does not exist (409: it is gone from a task)", (409,)
    BODY_REQUIRED = "body_required", 422, "a message or answer is empty"
    APPROVAL_PENDING = "approval_pending", 409, "a tool call waits for approval first"
    NO_PENDING_QUESTION = "no_pending_question", 409, "the task asked nothing to answer"
    POLICY_DENIED = "policy_denied", 403, "a policy hook refused the action"
    HOOK_DISPATCH_FAILED = "hook_dispatch_failed", 502, "a policy hook could not be reached (fail closed)"
    INVALID_DECISION = "invalid_decision", 422, "an approval decision is approve or deny"
    APPROVAL_NOT_FOUND = "approval_not_found", 404, "no such approval on this task"
    APPROVAL_NOT_PENDING = "approval_not_pending", 409, "the approval is decided already; see `state`"
    APPROVAL_EXPIRED = "approval_expired", 409, "the approval expired"
    APPROVAL_INPUT_MISMATCH = "approval_input_mismatch", 409, "the parked input is not the one reviewed"
    AGENT_CANNOT_DECIDE = "agent_cannot_decide", 403, "the task's agent cannot decide its own tool calls"
    AGENT_CANNOT_REVIEW = "agent_cannot_review", 403, "the task's agent cannot review its own work"
    AGENT_CANNOT_MERGE = "agent_cannot_merge", 403, "the task's agent cannot merge its own work"
    TASK_NOT_IN_REVIEW = "task_not_in_review", 409, "the task is not awaiting review"
    NO_HEAD = "no_head", 409, "the task has no commit yet"
    STALE_HEAD = "stale_head", 409, "the task's head moved; see `head_sha`"
    STALE_COMMIT = "stale_commit", 409, "the review was written against an older commit; see `head_sha`"
    MERGE_BLOCKED = (
        "merge_blocked",
        409,
        "a task's merge rules do not hold (`POST .../tasks/<n>/merge`); see `blockers`",
    )
    TASK_NO_CHANGES = "task_no_changes", 409, "the task's runs changed nothing: there is nothing to merge"
    REVIEW_EMPTY = "review_empty", 422, "a review needs a body or inline comments"
    COMMENT_EMPTY = "comment_empty", 422, "an inline comment is empty"
    COMMENT_OUTSIDE_DIFF = "comment_outside_diff", 422, "an inline comment points outside the diff"
    REVIEW_DRAFT_FULL = "review_draft_full", 409, "the review draft holds the most comments one review carries"
    REVIEW_COMMENT_NOT_FOUND = "review_comment_not_found", 404, "no such comment in the caller's review draft"

    # Schedules: recurring tasks of a repository (tasks/services/schedules.py).
    SCHEDULE_NOT_FOUND = "schedule_not_found", 404, "no schedule by this id in the repository"
    SCHEDULE_EXISTS = "schedule_exists", 409, "the repository has a schedule of this name"
    INVALID_CRON = "invalid_cron", 422, "a cron expression of 5 fields that can fire; the message says why not"
    UNKNOWN_TIMEZONE = "unknown_timezone", 422, "a time zone is an IANA name (UTC, Europe/Berlin)"

    # Notifications: the inbox, watching, settings, e-mail (forge/notify/).
    NOTIFICATION_NOT_FOUND = "notification_not_found", 404, "no notification thread by this id in the caller's inbox"
    INVALID_SUBSCRIPTION = "invalid_subscription", 422, "a subscription is all, participating or ignore (one of them)"
    INVALID_NOTIFICATION_SETTINGS = (
        "invalid_notification_settings",
        422,
        "an unknown reason or channel (off, web, email), a malformed e-mail address, or e-mail without one",
    )
    INVALID_UNSUBSCRIBE_LINK = "invalid_unsubscribe_link", 404, "the unsubscribe link is not one this instance signed"

    # The model gateway's own refusals, answered to the agent in the provider's error shape
    # (`error.code`); nothing was sent to the provider.
    GATEWAY_BAD_REQUEST = (
        "gateway_bad_request",
        400,
        "a model request that is not a JSON object, or whose `tools` or `input` has the wrong shape",
    )
    GATEWAY_NETWORK_TOOL = (
        "gateway_network_tool",
        400,
        "a model request asks the provider to reach the network (server-side tools, MCP connector, container)",
    )
    GATEWAY_REFUSED = (
        "gateway_refused",
        403,
        "a Responses request names provider-side state the run did not create, a background run or a hosted tool",
    )
    GATEWAY_MODEL_REFUSED = (
        "gateway_model_refused",
        403,
        "no model is configured for the run and the price table does not list the requested one",
    )
    GATEWAY_ENDPOINT_REFUSED = (
        "gateway_endpoint_refused",
        403,
        "the run's model endpoint is (or resolves to) an address the model allow-list does not name: nothing was "
        "sent, the agent is told not to retry, and the run fails `model_endpoint_refused`",
    )
    GATEWAY_BUDGET_RESERVED = (
        "gateway_budget_reserved",
        429,
        "a model call's input and declared maximum output do not fit in the run's token budget beside the calls "
        "in flight; `Retry-After` says when to try again",
    )
    RUN_CHANNEL_LIMITED = (
        "run_channel_limited",
        429,
        "a run's hook and back-channel calls passed the rate or the count its channel allows (`Retry-After` "
        "when the rate recovers)",
    )

    # The allow-lists an instance admin keeps (Admin > Network).
    UNKNOWN_ALLOW_LIST = "unknown_allow_list", 404, "allow-lists are `model` and `webhooks`"
    INVALID_ALLOWED_HOST = (
        "invalid_allowed_host",
        422,
        "an allow-list entry is a host name, an address or a CIDR, without a port",
    )
    ALLOWED_HOST_EXISTS = "allowed_host_exists", 409, "the host is on that allow-list already"
    ALLOWED_HOST_NOT_FOUND = "allowed_host_not_found", 404, "no such entry on that allow-list"

    # Webhooks.
    WEBHOOKS_UNAVAILABLE = "webhooks_unavailable", 503, "webhooks are not set up on this server"
    HOOK_NOT_FOUND = "hook_not_found", 404, "no such webhook endpoint"
    DELIVERY_NOT_FOUND = "delivery_not_found", 404, "no such delivery"
    INVALID_HOOK_URL = "invalid_hook_url", 422, "the endpoint URL is refused (scheme, host or address)"
    INVALID_HOOK_EVENTS = "invalid_hook_events", 422, "unknown events, or events of the wrong kind"
    INVALID_FAILURE_POLICY = "invalid_failure_policy", 422, "failure_policy applies to policy endpoints only"
    ROTATION_IN_PROGRESS = "rotation_in_progress", 409, "a next secret is staged: promote or retire it first"
    NO_NEXT_SECRET = "no_next_secret", 409, "no staged secret to promote"
    NOTHING_TO_RETIRE = "nothing_to_retire", 409, "there is only one secret"
    NOT_REDELIVERABLE = "not_redeliverable", 409, "the logged body cannot be sent again"


BY_VALUE: dict[str, Code] = {c.value: c for c in Code}


def lookup(code: str, status: int | None = None) -> Code:
    """The registry entry of `code`; with `status`, also check that the code stands with it."""
    entry = BY_VALUE.get(code)
    if entry is None:
        raise UnknownErrorCode(f"error code {code!r} is not registered in forge.core.error_codes")
    if status is not None and status not in entry.statuses:
        raise UnknownErrorCode(f"error code {code!r} is registered with status {entry.statuses}, not {status}")
    return entry


def markdown_rows() -> list[str]:
    """The rows of the code table in docs/api.md."""
    return [f"| `{c.value}` | {', '.join(map(str, c.statuses))} | {c.meaning} |" for c in Code]


if __name__ == "__main__":
    print("| code | status | meaning |\n|---|---|---|")
    print("\n".join(markdown_rows()))
