"""What follows a comment on a pull request's conversation: `comment.created` (GitHub sends its
`issue_comment` for pull requests too: consumers and notifications see people's comments on issues
and pull requests alike), and a bot it mentions asked to work (forge.repos.issue_agents), whose
refusal is answered in the conversation by that bot."""

from forge.core.access import Principal, Role
from forge.db.audit import Actor
from forge.db.events import AccountRef, CommentCreated, Event
from forge.db.issue_payloads import CommentTarget
from forge.db.models import PullComment, PullRequest
from forge.repos import issue_agents
from forge.repos.issue_agents import PullThread
from forge.repos.pull_events import PullBase
from forge.repos.repositories import RepoResource, resource_roles


async def after_comment(pulls: PullBase, actor: Actor, res: RepoResource, pull: PullRequest, row: PullComment) -> None:
    await publish_comment(pulls, actor, res, pull, row)
    roles = await resource_roles(pulls.session, res, [pull.author_id] if pull.author_id else [])
    thread = PullThread(
        number=pull.number, title=pull.title, body=pull.body, head_ref=pull.head_ref, base_ref=pull.base_ref,
        author_untrusted=(roles.get(pull.author_id or 0) or Role.READ) < Role.WRITE,
    )  # fmt: skip
    answer = await issue_agents.commented_on_pull(pulls.session, pulls.agents, actor, res, thread, row.id, row.body)
    if answer is not None and answer.refused:
        bots = await issue_agents.mentioned_bots(pulls.session, row.body)
        await _reply(pulls, actor, res, pull, bots[0].id, bots[0].login, answer.refused)


async def publish_comment(
    pulls: PullBase, actor: Actor | None, res: RepoResource, pull: PullRequest, row: PullComment
) -> None:
    author = (await pulls.accounts({row.author_id})).get(row.author_id) if row.author_id else None
    url = pulls.html_url(res, pull.number)
    payload = CommentCreated(
        id=row.id,
        body=row.body,
        html_url=f"{url}#comment-{row.id}",
        author=author,
        issue=CommentTarget(number=pull.number, title=pull.title, html_url=url, is_pull_request=True),
    )
    await pulls.bus.publish(
        pulls.session,
        Event(
            repo_id=res.repo.id,
            repo_uuid=res.repo.uuid,
            repository=res.full_name,
            actor=AccountRef.of(actor.principal) if actor is not None else None,
            data=payload,
        ),
    )


async def _reply(
    pulls: PullBase, asker: Actor, res: RepoResource, pull: PullRequest, bot_id: int, bot: str, reason: str
) -> None:
    """The bot says, in the conversation, why it did not start (its words start nothing)."""
    agent = Actor(principal=Principal(account_id=bot_id, login=bot, type="Bot", via="internal"))
    body = f"@{asker.principal.login} I did not start on this: {reason}"
    row = PullComment(pull_id=pull.id, author_id=bot_id, body=body, commit_sha=pull.head_sha)
    pulls.session.add(row)
    await pulls.session.flush()
    await publish_comment(pulls, agent, res, pull, row)
