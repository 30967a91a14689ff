"""Signed lifecycle webhooks: endpoints, signing, policy dispatch, outbox (see hooks-protocol)."""
