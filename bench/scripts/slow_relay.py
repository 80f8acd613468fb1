"""A ProxyCommand for a slow link: wait DELAY seconds, then relay stdin/stdout to HOST:PORT.

Used only when netcat is not installed. Usage: slow_relay.py DELAY HOST PORT
"""

import os
import selectors
import socket
import sys
import time

delay, host, port = float(sys.argv[1]), sys.argv[2], int(sys.argv[3])
time.sleep(delay)
sock = socket.create_connection((host, port))
sel = selectors.DefaultSelector()
sel.register(0, selectors.EVENT_READ)
sel.register(sock, selectors.EVENT_READ)
while True:
    for key, _ in sel.select():
        if key.fileobj == 0:
            data = os.read(0, 65536)
            if not data:
                sock.shutdown(socket.SHUT_WR)
                sel.unregister(0)
                continue
            sock.sendall(data)
        else:
            data = sock.recv(65536)
            if not data:
                sys.exit(0)
            os.write(1, data)
