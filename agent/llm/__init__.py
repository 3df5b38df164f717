"""LLM: the model as a proposer.

Entry points:
- proposer: LLMProposer (one conversation an iteration, its repairs in it).
- client: the openai client with retries and deadlines; errors: one table of what an endpoint's failure means;
  costs: tokens, prices and budgets; structured: the proposal schema and reading replies.
- context: the iteration prompt (standing, knobs, profile, history, sources) within a token budget; machine: what
  the model is told of the machine, the toolchain and the harness; prompts: prompts/*.md and AGENT.md rendered.
- settings: LLMSettings (command line over environment over pyproject.toml [tool.agent]).

May import: agent.proposers, agent.records, agent.proposal and tools.
"""
