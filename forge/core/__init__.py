"""The kernel of the forge: errors and their codes, settings, security, the access rule, logging,
the version, text hygiene, and the address rules with the URL guard that webhooks, egress and the
model gateway share. It imports no other room of `forge`, no Litestar and no database."""
