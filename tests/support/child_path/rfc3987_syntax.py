"""Hides rfc3987_syntax from the programs the tests start (tests/conftest.py: it is left out of the pytest
workers the same way, for the same reason).

jsonschema imports it where it is installed (cyclonedx-bom's extras bring it) and it builds an RFC 3987
grammar at import: 1.9 s of CPU in each program a test starts that loads jsonschema (the DRA kubelet
plugin processes of tests/dra, which import the tests' fake objects; cyclonedx-py in tests/deploy/
test_release.py). jsonschema only uses it to check the "iri" formats, which then go unchecked in those
programs; `make release` runs cyclonedx-py outside the tests, with it.
"""

raise ImportError("rfc3987_syntax is hidden from the programs tests start (its import costs 1.9 s)")
