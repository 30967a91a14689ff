"""Policy hooks: synchronous calls to policy endpoints before a guarded action."""
