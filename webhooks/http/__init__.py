"""Requests in: the REST API and the web pages of webhook endpoints."""
