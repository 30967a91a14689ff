"""Hardened Docker sandboxes. Imports nothing from forge, tasks or webhooks."""
