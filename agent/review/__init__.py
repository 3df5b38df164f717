"""Reviewing runs after the fact: the runs table, one run or iteration in detail, the markdown report
with its plot, cherry-picking kept commits onto the user's branch, and the CI gate.

Everything here reads the logs the loop wrote (agent/runlog.py) and never writes into them, except
`report`, which adds report.md and speedup.png beside them.
"""
