"""`make bench`: the daemon measured as a separate process, driven over its unix sockets like kubelet.

Every figure is printed next to a reference measured in the same run on the same machine (a bare grpcio
round trip, `python -c pass`, an idle grpcio server process), so the results read as ratios rather than
machine-dependent absolutes. `python -m bench --help` lists the options; docs/performance.md the results.
"""
