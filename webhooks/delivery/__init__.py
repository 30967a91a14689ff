"""Notifications: the durable outbox and its deliverer."""
