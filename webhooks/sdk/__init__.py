"""The consumer SDK: what the author of a webhook consumer imports. Standard library and PyJWT only."""
