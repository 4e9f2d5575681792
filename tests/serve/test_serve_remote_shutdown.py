"""A front's connection to the engine process ends quietly when the engine shuts down: its handler
task, cancelled by the loop's shutdown, finishes as a normal task, so CPython 3.11's stream callback
(which asks the handler task for its exception) logs no ``CancelledError`` traceback after
"trawmem serve: stopped" (seen once under load in ``test_serve_listen``)."""
from __future__ import annotations

import asyncio

from trawmem_gpu.serve.remote import EngineEndpoint


def test_a_connection_cancelled_at_shutdown_ends_as_a_finished_task(tmp_path):
    async def main():
        ep = EngineEndpoint(None, str(tmp_path / "engine.sock"))
        reader = asyncio.StreamReader()  # a front that sends nothing: the handler waits on its frame

        class Writer:
            closed = False

            def close(self):
                self.closed = True

        w = Writer()
        task = asyncio.ensure_future(ep._connection(reader, w))
        await asyncio.sleep(0)
        assert ep.connected.is_set() and not task.done()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return task, w

    task, w = asyncio.run(main())
    assert not task.cancelled() and task.exception() is None and w.closed
