"""``kill -9`` at a pause point: the forget and write tests start a child with
``TRAWMEM_FORGET_PAUSE=stage:flag`` (``memory.erase.pause_point``), wait for it to reach the stage,
then kill it, so the next open finds exactly the state a crash there leaves."""
from __future__ import annotations

import os
import signal
import time


def kill_when_paused(p, flag, limit_s: float = 600.0) -> None:
    """Wait (at most ``limit_s``) until the child ``p`` writes ``flag`` at its pause point, then
    SIGKILL it; a child that ends first fails the test with its stderr. The child never outlives this."""
    try:
        for _ in range(int(limit_s * 10)):
            if flag.exists() or p.poll() is not None:
                break
            time.sleep(0.1)
        assert flag.exists(), p.communicate()[1][-2000:]
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
