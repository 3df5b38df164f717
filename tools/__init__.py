"""The measuring instruments: build, launch (CTA) check, parity, bench, profile. Each usable alone
(`python -m tools.NAME kernels/TASK --json`) and each returning a pydantic model."""
