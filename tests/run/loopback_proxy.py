"""A tiny loopback TCP forwarder, as an operator may put in front of a server
(a sidecar, socat, an auth shim): ``python loopback_proxy.py UPSTREAM_PORT PORT_FILE``.

It listens on 127.0.0.1 port 0 (the bound port goes to PORT_FILE) and copies
bytes both ways to 127.0.0.1:UPSTREAM_PORT, one upstream connection per client.
It is not a vLLM tree: one process, no children, its own title. ``--keepalive``
holds one idle upstream connection open from the start (a pooled proxy), so its
outbound loopback connection is visible even between requests.
"""

from __future__ import annotations

import asyncio
import os
import sys


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        try:
            writer.close()
        except (ConnectionError, OSError):
            pass


async def main(upstream: int, port_file: str, keepalive: bool) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream)
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    held = None
    if keepalive:
        held = await asyncio.open_connection("127.0.0.1", upstream)
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    tmp = port_file + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(str(port))
    os.replace(tmp, port_file)
    async with server:
        await server.serve_forever()
    del held


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    asyncio.run(main(int(args[0]), args[1], "--keepalive" in sys.argv))
