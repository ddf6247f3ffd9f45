"""Hides the test-only `kubernetes_validate` from the programs the tests start (tests/conftest.py puts this
directory first on their PYTHONPATH).

`import kubernetes` loads `kubernetes.dynamic`, which imports `kubernetes_validate` when it is installed; that
loads jsonschema, whose format checks build an RFC 3987 grammar at import: 1.6-1.9 s of CPU in every
config-manager, DRA or GFD process a test starts (`import kubernetes` 2.3 s, 0.4 s without it). The image has
no `kubernetes_validate` (it is a test dependency), so hiding it also runs those programs as they run there.
The tests that validate manifests import the real one in the pytest process, whose path does not have this.
"""

raise ImportError("kubernetes_validate is a test-only package, hidden from the programs tests start")
