"""Peak anonymous memory of a real child process.

``RssAnon`` (``/proc/<pid>/status``) counts what the process allocated, not memory-mapped files or the
page cache, so streaming code is judged on what it holds, not on what it touched. Sampled every 2 ms
until the child exits.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path


def peak_rss_anon(cmd: list[str], *, cwd: Path | str | None = None) -> tuple[int, subprocess.CompletedProcess]:
    """Run ``cmd``; its peak ``RssAnon`` in bytes and its completed process (text stdout/stderr)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd,
                            env={**os.environ, "CKPTFLOW_PROGRESS": "0"})
    peak = 0
    status = f"/proc/{proc.pid}/status"
    while proc.poll() is None:
        try:
            with open(status) as fh:
                for line in fh:
                    if line.startswith("RssAnon:"):
                        peak = max(peak, int(line.split()[1]) * 1024)
        except (FileNotFoundError, ProcessLookupError):
            break
        time.sleep(0.002)
    stdout, stderr = proc.communicate()
    return peak, subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
