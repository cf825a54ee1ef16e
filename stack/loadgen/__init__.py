"""An AgentX-like load generator: multi-turn agent sessions from many users, sent through the gateway."""
