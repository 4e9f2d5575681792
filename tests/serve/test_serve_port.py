"""``trawmem serve`` on a port another process listens on: one line naming the port, exit 2 (as
docs/cli.md says of every error), before it loads anything or prints a URL."""
from __future__ import annotations

import socket

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")


def test_a_busy_port_is_one_line_and_exit_2(tmp_path, capsys):
    from trawmem_gpu.cli import main

    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    port = busy.getsockname()[1]
    try:
        rc = main(["serve", "--collection", str(tmp_path / "coll"), "--port", str(port)])
    finally:
        busy.close()
    out, err = capsys.readouterr()
    assert rc == 2
    assert err.strip().splitlines() == [f"trawmem serve: error: --port {port}: 127.0.0.1:{port} is already in use "
                                        "(pick another --port, or 0 for a free one)"]
    assert "http://" not in out and not (tmp_path / "coll").exists()  # nothing loaded, no URL announced


def test_bound_socket_names_a_busy_port():
    from trawmem_gpu.errors import ConfigError
    from trawmem_gpu.serve.config import bound_socket

    sock = bound_socket("127.0.0.1", 0)
    try:
        port = sock.getsockname()[1]
        assert port != 0
        with pytest.raises(ConfigError, match=f"^`port` {port}: 127.0.0.1:{port} is already in use"):
            sock.listen(1)
            bound_socket("127.0.0.1", port).close()
    finally:
        sock.close()


def test_mcp_over_http_on_a_busy_port_is_one_line_and_exit_2(tmp_path, capsys):
    pytest.importorskip("mcp")
    from trawmem_gpu.cli import main

    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    port = busy.getsockname()[1]
    try:
        rc = main(["mcp", "--collection", str(tmp_path / "coll"), "--http", "--port", str(port)])
    finally:
        busy.close()
    err = capsys.readouterr().err
    assert rc == 2
    assert err.strip().splitlines() == [f"trawmem mcp: error: --port {port}: 127.0.0.1:{port} is already in use "
                                        "(pick another --port, or 0 for a free one)"]
    assert not (tmp_path / "coll").exists()
