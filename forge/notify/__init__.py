"""Notifications: the inbox, watching, per-person settings and e-mail (docs/notifications.md).

A layer of forge between `http` and `repos`: it reads repositories and accounts, and the pages and
the API read it. Its public names: `mentioned_logins` (the mention parser, pure), `Notifier`
(the event bus subscriber; `Notifier.notify` tells people of an `Activity` directly),
`Notifications` (the notifier and the mailer, for the composition root) and `TaskLookup` (what the
composition root hands in about tasks)."""
