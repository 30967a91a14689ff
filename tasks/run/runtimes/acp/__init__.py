"""The `acp` runtime: an operator-configured agent speaking the Agent Client Protocol on its stdio,
forgehand as the ACP client."""
