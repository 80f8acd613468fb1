"""Reading an HTTP answer from the Gloo store or a forwarder, as a test's client."""

from __future__ import annotations

import socket

from dtlaunch.agents import gloo_host


def read_answer(conn: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of one answer on `conn`: the agent's own parser, in its answer
    mode. Raises gloo_host.BadRequest when it is not one (or the connection closed first),
    TimeoutError when it does not come within the socket's timeout."""
    try:
        got = gloo_host.read_request(conn, b"", status_line=True)
    except gloo_host.BadRequest as exc:
        if exc.status == 408:
            raise TimeoutError(str(exc)) from None
        raise
    if got is None:
        raise gloo_host.BadRequest(502, "closed before an answer")
    return int(got[1]), got[2], got[3]
