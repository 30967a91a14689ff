"""SQLAlchemy models of the host: accounts, tokens, web sessions, audit, repositories."""

import uuid as uuid_mod
from datetime import datetime
from enum import StrEnum

from sqlalchemy import JSON, Boolean, ForeignKey, Index, Integer, String, Text, UniqueConstraint, false, text, true
from sqlalchemy.orm import Mapped, mapped_column, relationship

from forge.db.engine import Base, utcnow


class AccountType(StrEnum):
    USER = "User"
    BOT = "Bot"


class Account(Base):
    """A person (`User`, signs in with a password) or a `Bot` (acts only through tokens)."""

    __tablename__ = "accounts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    login: Mapped[str] = mapped_column(String(40))
    # Logins are unique case-insensitively; lookups go through this column.
    login_key: Mapped[str] = mapped_column(String(40), unique=True)
    type: Mapped[str] = mapped_column(String(8), default=AccountType.USER)
    display_name: Mapped[str] = mapped_column(String(200), default="")
    password_hash: Mapped[str | None] = mapped_column(String(200), nullable=True)
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False)
    disabled: Mapped[bool] = mapped_column(Boolean, default=False)
    # The password was generated (first start, or an admin's "generate one"): the person must choose
    # their own before any page but the password page opens (tokens are not affected).
    must_change_password: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # For bots: the person responsible for it.
    owner_id: Mapped[int | None] = mapped_column(ForeignKey("accounts.id", ondelete="SET NULL"), nullable=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)

    @property
    def is_bot(self) -> bool:
        return self.type == AccountType.BOT


class AccessToken(Base):
    """A personal access token. Only a SHA-256 of the secret is stored, plus its last eight characters."""

    __tablename__ = "access_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(100))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    last_eight: Mapped[str] = mapped_column(String(8))
    # Space-separated scope names, as granted (implications are applied when checking).
    scopes: Mapped[str] = mapped_column(String(300))
    expires_at: Mapped[datetime | None] = mapped_column(nullable=True)
    last_used_at: Mapped[datetime | None] = mapped_column(nullable=True)
    revoked_at: Mapped[datetime | None] = mapped_column(nullable=True)
    created_by_id: Mapped[int | None] = mapped_column(ForeignKey("accounts.id", ondelete="SET NULL"), nullable=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    account: Mapped[Account] = relationship(foreign_keys=[account_id], lazy="raise")


class WebSession(Base):
    """A signed-in browser. The cookie holds a random id; only its SHA-256 is stored."""

    __tablename__ = "web_sessions"

    id_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id", ondelete="CASCADE"), index=True)
    csrf_token: Mapped[str] = mapped_column(String(64))
    client_addr: Mapped[str] = mapped_column(String(64), default="")
    user_agent: Mapped[str] = mapped_column(String(300), default="")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime] = mapped_column()
    last_seen_at: Mapped[datetime] = mapped_column(default=utcnow)


class AuditEvent(Base):
    """One row per mutating action and per refused attempt."""

    __tablename__ = "audit_events"
    __table_args__ = (
        Index("ix_audit_events_action_at", "action", "at"),
        Index("ix_audit_events_target_at", "target", "at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    actor_id: Mapped[int | None] = mapped_column(
        ForeignKey("accounts.id", ondelete="SET NULL"), nullable=True, index=True
    )
    # Kept as text so the row still reads right after the account is renamed or removed.
    actor_login: Mapped[str] = mapped_column(String(40), default="")
    token_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    client_addr: Mapped[str] = mapped_column(String(64), default="")
    action: Mapped[str] = mapped_column(String(64))
    target: Mapped[str] = mapped_column(String(300), default="")
    result: Mapped[str] = mapped_column(String(16))
    detail: Mapped[dict[str, object]] = mapped_column(JSON, default=dict)
    request_id: Mapped[str] = mapped_column(Text, default="")


class Repository(Base):
    """A bare git repository owned by an account, stored at `<data>/repos/<owner>/<name>.git`."""

    __tablename__ = "repositories"
    __table_args__ = (UniqueConstraint("owner_id", "name_key", name="uq_repositories_owner_name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    # Stable identity for webhooks (`sub` = forgehand:repo:<uuid>); survives renames.
    uuid: Mapped[str] = mapped_column(String(36), unique=True, default=lambda: str(uuid_mod.uuid4()))
    owner_id: Mapped[int] = mapped_column(ForeignKey("accounts.id", ondelete="RESTRICT"), index=True)
    name: Mapped[str] = mapped_column(String(100))
    name_key: Mapped[str] = mapped_column(String(100))
    description: Mapped[str] = mapped_column(String(1000), default="")
    visibility: Mapped[str] = mapped_column(String(10), default="private")
    default_branch: Mapped[str] = mapped_column(String(255), default="main")
    archived: Mapped[bool] = mapped_column(Boolean, default=False)
    protect_default_branch: Mapped[bool] = mapped_column(Boolean, default=True)
    # Whether an issue opened by someone without write access may be assigned to a bot (or hand a
    # bot work by a mention): off by default, as such text is anyone's (docs/issues.md).
    untrusted_issues_to_agents: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)

    owner: Mapped[Account] = relationship(lazy="joined")


class Collaborator(Base):
    """An account's explicit role on a repository (`read`, `write`, `admin`)."""

    __tablename__ = "collaborators"
    __table_args__ = (UniqueConstraint("repo_id", "account_id", name="uq_collaborators_repo_account"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    repo_id: Mapped[int] = mapped_column(ForeignKey("repositories.id", ondelete="CASCADE"), index=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id", ondelete="CASCADE"), index=True)
    role: Mapped[str] = mapped_column(String(8))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class BranchRule(Base):
    """Branch protection: a pattern and what it still allows."""

    __tablename__ = "branch_rules"
    __table_args__ = (UniqueConstraint("repo_id", "pattern", name="uq_branch_rules_repo_pattern"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    repo_id: Mapped[int] = mapped_column(ForeignKey("repositories.id", ondelete="CASCADE"), index=True)
    pattern: Mapped[str] = mapped_column(String(255))
    allow_force_push: Mapped[bool] = mapped_column(Boolean, default=False)
    allow_deletion: Mapped[bool] = mapped_column(Boolean, default=False)
    # Status contexts that must be `success` on a head before it merges into a matching branch.
    required_checks: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
    # Direct pushes to a matching branch are refused: changes arrive through pull requests.
    require_pull_request: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # Approvals a pull request into a matching branch needs from people with write access.
    required_approvals: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # A push to the head dismisses the approvals given to an older head.
    dismiss_stale_approvals: Mapped[bool] = mapped_column(Boolean, default=True, server_default=true())
    # Each changed path with owners in CODEOWNERS needs an approval from one of them.
    require_code_owner_review: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # A standing change request blocks the merge of a pull request into a matching branch.
    block_on_requested_changes: Mapped[bool] = mapped_column(Boolean, default=True, server_default=true())
    # Who may merge pull requests into a matching branch (logins; null or empty: anyone with write).
    merge_allowlist: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class CommitStatus(Base):
    """One status a CI system (or anyone with write access) reported on a commit: GitHub's and
    Gitea's commit status. Every report is kept; the combined status reads the latest per context."""

    __tablename__ = "commit_statuses"
    __table_args__ = (Index("ix_commit_statuses_repo_sha", "repo_id", "sha", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    repo_id: Mapped[int] = mapped_column(ForeignKey("repositories.id", ondelete="CASCADE"))
    sha: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16))  # pending | success | failure | error
    context: Mapped[str] = mapped_column(String(255))
    description: Mapped[str] = mapped_column(String(1024), default="")
    target_url: Mapped[str] = mapped_column(String(2048), default="")
    creator_id: Mapped[int | None] = mapped_column(ForeignKey("accounts.id", ondelete="SET NULL"), nullable=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class PushRecord(Base):
    """An accepted push: each ref's value before and after."""

    __tablename__ = "pushes"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    repo_id: Mapped[int] = mapped_column(ForeignKey("repositories.id", ondelete="CASCADE"), index=True)
    pusher_id: Mapped[int | None] = mapped_column(ForeignKey("accounts.id", ondelete="SET NULL"), nullable=True)
    token_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    refs: Mapped[list[dict[str, str]]] = mapped_column(JSON, default=list)
    at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    # The push journal entry it settles (forge.repos.pushes): recorded exactly once, whoever gets there.
    journal_id: Mapped[str | None] = mapped_column(String(36), unique=True, nullable=True)


class ModelKey(Base):
    """A person's own model provider key ("model access" in their settings), encrypted at rest
    (forge.accounts.model_keys); spent only by tasks of repositories that allow personal keys."""

    __tablename__ = "model_keys"
    __table_args__ = (UniqueConstraint("account_id", "provider", name="uq_model_keys_account_provider"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id", ondelete="CASCADE"))
    provider: Mapped[str] = mapped_column(String(16))  # "anthropic" | "openai"
    api_key_enc: Mapped[str] = mapped_column(Text)
    last4: Mapped[str] = mapped_column(String(4))
    base_url: Mapped[str | None] = mapped_column(String(500), nullable=True)
    # The model the person's runs ask for with this key (null: the repository's or the instance's).
    model: Mapped[str | None] = mapped_column(String(200), nullable=True)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class AllowedHost(Base):
    """A host an instance admin allows for one kind of endpoint although the address rules refuse
    it (forge.db.allowlists): `model` (repository and personal model endpoints) or `webhooks`. The
    operator's environment variables stay allowed beside these rows."""

    __tablename__ = "allowed_hosts"
    __table_args__ = (UniqueConstraint("list_name", "host", name="uq_allowed_hosts_list_host"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    list_name: Mapped[str] = mapped_column(String(16))  # "model" | "webhooks"
    host: Mapped[str] = mapped_column(String(255))  # a name, an address or a CIDR, normalised
    note: Mapped[str] = mapped_column(String(200), default="")
    created_by_id: Mapped[int | None] = mapped_column(ForeignKey("accounts.id", ondelete="SET NULL"), nullable=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class IssueCounter(Base):
    """The last number given to a pull request (or, later, an issue) of a repository: the two share
    one sequence, as on GitHub and Gitea. Tasks keep their own."""

    __tablename__ = "issue_counters"

    repo_id: Mapped[int] = mapped_column(ForeignKey("repositories.id", ondelete="CASCADE"), primary_key=True)
    last_number: Mapped[int] = mapped_column(Integer, default=0)


class PullRequest(Base):
    """A proposal to merge `head_ref` into `base_ref` of the same repository (forge.repos.pulls)."""

    __tablename__ = "pull_requests"
    __table_args__ = (
        UniqueConstraint("repo_id", "number", name="uq_pull_requests_repo_number"),
        Index("ix_pull_requests_repo_state", "repo_id", "state", "number"),
        # One open pull request per head and base (`pull_request_exists`).
        Index(
            "uq_pull_requests_open_head_base",
            "repo_id",
            "head_ref",
            "base_ref",
            unique=True,
            sqlite_where=text("state = 'open'"),
            postgresql_where=text("state = 'open'"),
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    repo_id: Mapped[int] = mapped_column(ForeignKey("repositories.id", ondelete="CASCADE"))
    number: Mapped[int] = mapped_column(Integer)
    title: Mapped[str] = mapped_column(String(256))
    body: Mapped[str] = mapped_column(Text, default="")
    head_ref: Mapped[str] = mapped_column(String(255))
    base_ref: Mapped[str] = mapped_column(String(255))
    # The head branch's tip as last seen (opened, pushed, merged); "" once the branch is gone.
    head_sha: Mapped[str] = mapped_column(String(64))
    # The base branch's tip when opened, then when merged.
    base_sha: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(8), default="open")  # open | closed | merged
    draft: Mapped[bool] = mapped_column(Boolean, default=False)
    author_id: Mapped[int | None] = mapped_column(ForeignKey("accounts.id", ondelete="SET NULL"), nullable=True)
    # Who last moved the head (a push, Update branch, a suggestion, a merge into it): their approval
    # does not count, as nobody approves their own commits.
    head_pushed_by_id: Mapped[int | None] = mapped_column(ForeignKey("accounts.id", ondelete="SET NULL"), nullable=True)
    merged_by_id: Mapped[int | None] = mapped_column(ForeignKey("accounts.id", ondelete="SET NULL"), nullable=True)
    merge_commit_sha: Mapped[str | None] = mapped_column(String(64), nullable=True)
    merged_at: Mapped[datetime | None] = mapped_column(nullable=True)
    closed_at: Mapped[datetime | None] = mapped_column(nullable=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class PullReview(Base):
    """A review of a pull request at one head: a verdict and a body (its line comments are
    `PullComment` rows that name it)."""

    __tablename__ = "pull_reviews"
    __table_args__ = (Index("ix_pull_reviews_pull", "pull_id", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    pull_id: Mapped[int] = mapped_column(ForeignKey("pull_requests.id", ondelete="CASCADE"))
    author_id: Mapped[int | None] = mapped_column(ForeignKey("accounts.id", ondelete="SET NULL"), nullable=True)
    verdict: Mapped[str] = mapped_column(String(16))  # approve | request_changes | comment
    body: Mapped[str] = mapped_column(Text, default="")
    commit_sha: Mapped[str] = mapped_column(String(64))  # the head it reviewed
    # An approval or change request a later push made stale (branch rule) or someone dismissed.
    dismissed: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class PullComment(Base):
    """A comment on a pull request: on the conversation (`path` null) or on a line of its diff."""

    __tablename__ = "pull_comments"
    __table_args__ = (Index("ix_pull_comments_pull", "pull_id", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    pull_id: Mapped[int] = mapped_column(ForeignKey("pull_requests.id", ondelete="CASCADE"))
    review_id: Mapped[int | None] = mapped_column(ForeignKey("pull_reviews.id", ondelete="CASCADE"), nullable=True)
    author_id: Mapped[int | None] = mapped_column(ForeignKey("accounts.id", ondelete="SET NULL"), nullable=True)
    body: Mapped[str] = mapped_column(Text)
    path: Mapped[str | None] = mapped_column(String(4096), nullable=True)
    line: Mapped[int | None] = mapped_column(Integer, nullable=True)
    side: Mapped[str | None] = mapped_column(String(5), nullable=True)  # LEFT (base) | RIGHT (head)
    commit_sha: Mapped[str] = mapped_column(String(64))  # the head it was written on
    # A reply in the thread this line comment starts (its path, line and side are the thread's).
    in_reply_to_id: Mapped[int | None] = mapped_column(
        ForeignKey("pull_comments.id", ondelete="CASCADE"), nullable=True
    )
    # A thread's first comment: when and by whom the thread was marked resolved (null: open).
    resolved_at: Mapped[datetime | None] = mapped_column(nullable=True)
    resolved_by_id: Mapped[int | None] = mapped_column(ForeignKey("accounts.id", ondelete="SET NULL"), nullable=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class PullReviewRequest(Base):
    """A person or bot asked to review a pull request; answered by their next review."""

    __tablename__ = "pull_review_requests"
    __table_args__ = (UniqueConstraint("pull_id", "account_id", name="uq_pull_review_requests_pull_account"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    pull_id: Mapped[int] = mapped_column(ForeignKey("pull_requests.id", ondelete="CASCADE"), index=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id", ondelete="CASCADE"))
    requested_by_id: Mapped[int | None] = mapped_column(ForeignKey("accounts.id", ondelete="SET NULL"), nullable=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
