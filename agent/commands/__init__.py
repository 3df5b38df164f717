"""Commands: one module per family of subcommands, each with register(subparsers); agent.cli imports them by name
(COMMAND_MODULES). The top floor: may import every room.

- check: `agent check` (build, launch check, parity, bench; --knobs); doctor: `agent doctor` (what this machine has).
- profile: `agent profile` (Nsight Compute as JSON, or a converted report).
- optimize: `agent optimize`, `agent resume`, `agent sweep`.
- review: `agent runs`, `show`, `report`, `cherry-pick`, `gate`; clean: `agent clean`.
- init: `agent init` (a task from a user's function); kernelbench: `agent import` and `agent export` (KernelBench's
  problems in and out).
"""
