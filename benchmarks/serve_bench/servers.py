"""The load test's data, and one ``trawmem serve`` subprocess per configuration."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from .. import harness


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load_data(spec: str):
    """(collection dir to copy, banks, [(bank_id, question)])."""
    from trawmem_gpu.ingest.config import BuildConfig

    if spec == "sample":
        from trawmem_gpu.ingest import build_banks
        from trawmem_gpu.data import load_conversations, sample_path
        from trawmem_gpu.store import Collection

        base = load_conversations(sample_path())[0]
        convs = [replace(base, bank_id=f"sample-{i}") for i in range(8)]
        banks, _ = build_banks(convs, BuildConfig(), progress=False)
        d = Path(tempfile.mkdtemp(prefix="trawmem-bench-src-"))
        coll = Collection(d, create=True)
        for b in banks:
            coll.put(b)
        qs = json.loads((sample_path().parent / "sample_questions.json").read_text())
        items = [(b.bank_id, q["question"]) for b in banks for q in qs]
        return d, banks, items
    from trawmem_gpu.eval.retrieval import banks_for

    convs, banks, cdir = banks_for(spec, BuildConfig(), progress=False)
    items = [(c.bank_id, q.question) for c in convs for q in c.questions if q.category in (1, 2, 3, 4)]
    return Path(cdir), banks, items


class Server:
    def __init__(self, name: str, src: Path, work: Path, args, max_batch: int, max_wait_ms: float,
                 root: Path = harness.ROOT, http_workers: int = 0, flags: list[str] | None = None):
        """``root``: the source tree the server runs from (this one, or ``--baseline-src``);
        ``http_workers``: its ``--http-workers`` (front processes); ``flags``: the server's options
        instead of the load test's tuning (``--hostile`` runs the default server, with keys)."""
        self.name, self.max_batch, self.max_wait_ms = name, max_batch, max_wait_ms
        self.http_workers = http_workers
        self._children: list[int] | None = None
        self.coll = work / f"coll-{name}"
        shutil.copytree(src, self.coll)
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(work / f"server-{name}.log", "w")
        env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
               "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
               "TRAWMEM_ENCODER_RUNTIME": args.encoder_runtime,
               **({} if flags is not None else {k: str(args.threads) for k in harness.THREAD_VARS})}
        cmd = [sys.executable, "-m", "trawmem_gpu.cli", "serve", "--collection", str(self.coll), "--port",
               str(self.port)]
        cmd += flags if flags is not None else [
            "--max-batch", str(max_batch), "--max-wait-ms", str(max_wait_ms),
            "--max-queue", "4096", "--timeout", "120", "--threads", str(args.threads),
            "--switch-interval-ms", str(args.switch_interval_ms), "--encode-chunk", str(args.encode_chunk)]
        if http_workers:
            cmd += ["--http-workers", str(http_workers)]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=str(root))

    def wait_ready(self, timeout: float = 600.0) -> None:
        import httpx

        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server {self.name} exited ({self.proc.returncode}); see {self.log.name}")
            try:
                if httpx.get(self.url + "/readyz", timeout=2).status_code == 200:
                    self.children()
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"server {self.name} not ready after {timeout} s")

    def children(self) -> list[int]:
        """Pids of the server's child processes (its HTTP fronts, with ``--http-workers``), read
        from ``/proc`` once, when the server is ready (they do not change while it runs)."""
        if self._children is not None:
            return self._children
        out = []
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == self.proc.pid:
                        out.append(int(d.name))
                except (OSError, IndexError, ValueError):
                    continue
        self._children = out
        return out

    @staticmethod
    def _proc_cpu(pid: int) -> float:
        try:
            with open(f"/proc/{pid}/stat") as f:
                parts = f.read().rsplit(")", 1)[1].split()
            return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            return float("nan")

    def cpu_seconds(self) -> float:
        """CPU seconds so far of the server, its front processes included."""
        return self._proc_cpu(self.proc.pid) + sum(self._proc_cpu(c) for c in self.children())

    def thread_cpu(self) -> dict[str, float]:
        """CPU seconds so far of the server's threads by role: the event loop (main thread: HTTP,
        validation, batching; with front processes, the engine side of the socket and batching),
        the batch worker (encoder + engine), workspace assembly, appends, the rest (torch / numba
        pools, Python helpers) and the HTTP front processes (``fronts``)."""
        roles = {"tm-batch": "worker", "tm-assemble": "assembly", "tm-append": "append"}
        out = dict.fromkeys(("event_loop", "worker", "assembly", "append", "other", "fronts"), 0.0)
        out["fronts"] = sum(self._proc_cpu(c) for c in self.children())
        tick = os.sysconf("SC_CLK_TCK")
        for t in Path(f"/proc/{self.proc.pid}/task").iterdir():
            try:
                comm = (t / "comm").read_text().strip()
                parts = (t / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            role = "event_loop" if t.name == str(self.proc.pid) else roles.get(comm, "other")
            out[role] += (int(parts[11]) + int(parts[12])) / tick
        return out

    def busy_seconds(self) -> tuple[float, float]:
        """(batch worker seconds, workspace assembly seconds) so far, from /metrics."""
        import httpx

        w = a = 0.0
        for line in httpx.get(self.url + "/metrics", timeout=10).text.splitlines():
            if line.startswith('trawmem_batch_seconds_sum{stage="total"}'):
                w = float(line.split()[-1])
            elif line.startswith("trawmem_assemble_seconds_sum"):
                a = float(line.split()[-1])
        return w, a

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # graceful: drains
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
