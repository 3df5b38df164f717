"""Nsight Compute profile -> ProfileReport JSON (tools/profile/model.py).

    profile_task(task, lib_path, *, tier=1, shape=None, timeout_s=300, out_dir=None) -> ProfileReport
    read_report(path) -> ProfileReport        # a .ncu-rep captured anywhere (any kernels in it)
    compact(report) -> str                    # the proposer's view, small enough for a prompt
"""

from tools.profile.compact import compact
from tools.profile.model import ProfileReport, ProfileStatus
from tools.profile.ncu import profile_task
from tools.profile.reader import read_report_isolated as read_report

__all__ = ["ProfileReport", "ProfileStatus", "compact", "profile_task", "read_report"]
