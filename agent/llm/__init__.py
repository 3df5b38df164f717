"""The LLM side of the agent: client (retries), errors (one table), costs, structured output."""
