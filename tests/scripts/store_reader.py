"""A --gloo rank that reads one key of the job's store through its host's forwarder, after
the test says so: OUT/port.RANK holds the forwarder's port (for the test's attacker), OUT/go
starts the read, OUT/answer.RANK gets `STATUS BODY`."""

import http.client
import os
import sys
import time

out, key = sys.argv[1], sys.argv[2]
rank = os.environ["HOROVOD_RANK"]
port = int(os.environ["HOROVOD_GLOO_RENDEZVOUS_PORT"])
with open(os.path.join(out, f"port.{rank}.tmp"), "w") as handle:
    handle.write(str(port))
os.rename(os.path.join(out, f"port.{rank}.tmp"), os.path.join(out, f"port.{rank}"))
while not os.path.exists(os.path.join(out, "go")):
    time.sleep(0.05)
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
conn.request("GET", key)
answer = conn.getresponse()
with open(os.path.join(out, f"answer.{rank}"), "w") as handle:
    handle.write(f"{answer.status} {answer.read().decode('latin-1')}")
