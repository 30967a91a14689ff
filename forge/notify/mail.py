"""E-mail of a notification: the outbox row written with it (`outbox_row`: same transaction, so a
crash loses none) and the message the mailer sends from that row (`message`): threaded per issue,
pull request or task (`Message-ID`, `In-Reply-To` and `References` from the thread's stable id
`<owner/name/issues/N@host>`), with RFC 8058 one-click unsubscribe headers and a plain text body
that carries the links."""

import uuid
from email.message import EmailMessage
from email.utils import formatdate
from urllib.parse import urlsplit

from forge.core.settings import Settings
from forge.db.notify_models import MailOutbox
from forge.notify.activity import Activity
from forge.notify.reasons import REASON_LABELS, SUBJECT_PATHS
from forge.notify.recipients import Recipient
from forge.notify.unsubscribe import Unsubscribe, sign

QUOTE_CHARS = 4000  # of the comment or body quoted in the message
_NOUNS = {"issue": "Issue", "pull_request": "Pull request", "task": "Task"}


def _one_line(text: str, limit: int) -> str:
    return " ".join(text.split())[:limit]


def host_of(settings: Settings) -> str:
    return urlsplit(settings.effective_base_url).hostname or "forgehand"


def thread_id(settings: Settings, full_name: str, subject_type: str, number: int) -> str:
    """The thread's stable id: every message of the thread answers it."""
    return f"<{full_name}/{SUBJECT_PATHS[subject_type]}/{number}@{host_of(settings)}>"


def _body(settings: Settings, act: Activity, reason: str, links: dict[str, str]) -> str:
    quoted = act.text.strip()
    if len(quoted) > QUOTE_CHARS:
        quoted = quoted[:QUOTE_CHARS] + "\n[...]"
    parts = [act.summary + ".", ""]
    if quoted:
        parts += [quoted, ""]
    parts += [
        "--",
        f"View it on forgehand: {act.link or act.subject.url}",
        f"You are receiving this because: {REASON_LABELS.get(reason, reason).lower()}.",
        f"Unsubscribe from this thread: {links['thread']}",
        f"Stop e-mails like this ({reason.replace('_', ' ')}): {links['reason']}",
        f"Your notification settings: {settings.effective_base_url}/settings/notifications",
    ]
    return "\n".join(parts) + "\n"


def outbox_row(settings: Settings, full_name: str, repo_id: int, act: Activity, to: Recipient) -> MailOutbox:
    """The e-mail telling `to` of `act`, to be sent by the mailer."""
    s = act.subject
    base = settings.effective_base_url + "/notifications/unsubscribe/"
    thread = Unsubscribe(account_id=to.account_id, kind="thread", repo_id=repo_id, subject_type=s.type, number=s.number)
    links = {
        "thread": base + sign(settings.secret_key, thread),
        "reason": base
        + sign(settings.secret_key, Unsubscribe(account_id=to.account_id, kind="reason", reason=to.reason)),
    }
    tid = thread_id(settings, full_name, s.type, s.number)
    return MailOutbox(
        account_id=to.account_id,
        to_addr=to.email,
        subject=f"[{full_name}] {_one_line(s.title, 200)} ({_NOUNS[s.type]} #{s.number})",
        body=_body(settings, act, to.reason, links),
        message_id=tid[:-1].replace("@", f"/{uuid.uuid4().hex}@", 1) + ">",
        thread_id=tid,
        unsubscribe_url=links["thread"],
    )


def message(settings: Settings, row: MailOutbox) -> EmailMessage:
    """The message of an outbox row, as sent."""
    msg = EmailMessage()
    msg["From"] = settings.smtp_from
    msg["To"] = row.to_addr
    msg["Subject"] = _one_line(row.subject, 300)
    msg["Date"] = formatdate(row.created_at.timestamp(), usegmt=True)
    msg["Message-ID"] = row.message_id
    msg["In-Reply-To"] = row.thread_id
    msg["References"] = row.thread_id
    msg["List-Unsubscribe"] = f"<{row.unsubscribe_url}>"
    msg["List-Unsubscribe-Post"] = "List-Unsubscribe=One-Click"
    msg["Auto-Submitted"] = "auto-generated"  # RFC 3834: no vacation replies
    msg.set_content(row.body)
    return msg
