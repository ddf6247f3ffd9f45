"""`python -m bench.load metrics PORT THREADS` / `python -m bench.load preferred SOCKET THREADS IDS_FILE`:
load for the contention scenarios, in its own process (so its threads never share the measuring
process's GIL). It prints `ready` once every thread has had an answer, loads until its stdin closes, then
prints `answers N refused M` and exits.

* metrics: each thread scrapes http://127.0.0.1:PORT/metrics in a loop, cycling through an Accept header
  for each of the fourteen exposition formats prometheus_client serves;
* preferred: each thread calls GetPreferredAllocation on the unix SOCKET in a loop, 3 containers each
  offered the IDs in IDS_FILE (one a line) and asking for all of them.
"""

from __future__ import annotations

import http.client
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import grpc

from nvidia_device_plugin.api.v1beta1 import api_pb2 as pb
from nvidia_device_plugin.api.v1beta1 import api_pb2_grpc as pb_grpc

ESCAPINGS = ("allow-utf-8", "underscores", "dots", "values")
EVERY_FORMAT = (
    "",
    "application/openmetrics-text",
    *(f"text/plain; version=1.0.0; escaping={e}" for e in ESCAPINGS),
    *(
        f"application/openmetrics-text; version={v}; escaping={e}"
        for v in ("1.0.0", "2.0.0")
        for e in ESCAPINGS
    ),
)
CONTAINERS = 3


class Tally:
    def __init__(self, threads: int) -> None:
        self.lock = threading.Lock()
        self.answers = 0
        self.refused = 0
        self.first = threading.Barrier(threads + 1, timeout=120)


def scraper(port: int) -> Callable[[int], bool]:
    def once(n: int) -> bool:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            accept = EVERY_FORMAT[n % len(EVERY_FORMAT)]
            connection.request("GET", "/metrics", headers={"Accept": accept} if accept else {})
            response = connection.getresponse()
            response.read()
            return response.status == 200
        except (OSError, http.client.HTTPException):  # a refused or reset connection: counted, not fatal
            return False
        finally:
            connection.close()

    return once


def flooder(socket_path: str, ids: list[str]) -> Callable[[int], bool]:
    channel = grpc.insecure_channel(f"unix:{socket_path}")
    stub = pb_grpc.DevicePluginStub(channel)
    request = pb.PreferredAllocationRequest(
        container_requests=[
            pb.ContainerPreferredAllocationRequest(available_deviceIDs=ids, allocation_size=len(ids))
            for _ in range(CONTAINERS)
        ]
    )

    def once(n: int) -> bool:
        try:
            stub.GetPreferredAllocation(request, timeout=30)
        except grpc.RpcError:
            return False
        return True

    return once


def run(call: Callable[[int], bool], tally: Tally, stop: threading.Event) -> None:
    n = 0
    while True:
        ok = call(n)
        with tally.lock:
            tally.answers += ok
            tally.refused += not ok
        if n == 0:
            tally.first.wait()
        n += 1
        if stop.is_set():
            return


def main(argv: list[str]) -> int:
    kind, where, threads = argv[0], argv[1], int(argv[2])
    if kind == "metrics":
        calls = [scraper(int(where)) for _ in range(threads)]
    else:
        ids = Path(argv[3]).read_text().split()
        calls = [flooder(where, ids) for _ in range(threads)]
    tally, stop = Tally(threads), threading.Event()
    workers = [
        threading.Thread(target=run, args=(c, tally, stop), name=f"load-{i}") for i, c in enumerate(calls)
    ]
    for worker in workers:
        worker.start()
    tally.first.wait()
    print("ready", flush=True)
    sys.stdin.read()  # until the benchmark closes our stdin
    stop.set()
    for worker in workers:
        worker.join()
    print(f"answers {tally.answers} refused {tally.refused}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
