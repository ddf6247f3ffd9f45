"""`gpu-feature-discovery` publishing through NFD's NodeFeature API (GFD v0.20's default), against the
stand-in API server, which checks every object it is sent against a JSON schema written from NFD's CRD.

What GFD writes (k8s-device-plugin internal/lm/output.go): a NodeFeature `nvidia-features-for-<node>` in the
namespace of NAMESPACE, labelled `nfd.node.kubernetes.io/node-name=<node>`, its `spec.labels` the node's
labels and `spec.features` empty, owned by the pod's DaemonSet (controller) and the pod; updated in place
(status kept) only when something changed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from nvidia_device_plugin.cli.gfd import main as gfd_main
from nvidia_device_plugin.config.v1 import Config
from nvidia_device_plugin.labels import node_labels
from nvidia_device_plugin.labels.nodefeature import (
    NodeFeatureError,
    NodeFeaturePublisher,
    NodeFeatureTarget,
    api_client,
    new_object,
)
from nvidia_device_plugin.nvml.discovery import discover
from nvidia_device_plugin.nvml.session import open_nvml

from support.fake_apiserver import NODE, FakeApiServer, write_kubeconfig
from support.waiting import CHILD_GUARD_S, scaled, wait_for

SCHEMA = json.loads((Path(__file__).parent / "data" / "nodefeature-v1alpha1.schema.json").read_text())
NAMESPACE = "gpu-operator"
POD = "gpu-feature-discovery-x7k2q"
OBJECT = f"/apis/nfd.k8s-sigs.io/v1alpha1/namespaces/{NAMESPACE}/nodefeatures/nvidia-features-for-{NODE}"
COLLECTION = OBJECT.rsplit("/", 1)[0]
POD_PATH = f"/api/v1/namespaces/{NAMESPACE}/pods/{POD}"
DAEMONSET = {
    "apiVersion": "apps/v1",
    "kind": "DaemonSet",
    "name": "gpu-feature-discovery",
    "uid": "6a0c7f0e-3d55-4b4e-9f5c-1d2e3f4a5b6c",
    "controller": True,
    "blockOwnerDeletion": True,
}
POD_OBJECT = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": POD, "namespace": NAMESPACE, "uid": "0f9e8d7c-1111-2222-3333-444455556666",
                 "ownerReferences": [DAEMONSET]},
}  # fmt: skip


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[FakeApiServer, dict[str, str]]]:
    with FakeApiServer({}) as fake:
        fake.objects.schemas["nodefeatures"] = SCHEMA
        fake.objects.put(POD_PATH, POD_OBJECT)
        env = {
            "NODE_NAME": NODE,
            "NAMESPACE": NAMESPACE,
            "POD_NAME": POD,
            "KUBECONFIG": str(write_kubeconfig(tmp_path / "kubeconfig", fake.url)),
        }
        yield fake, env


def expected_labels(node: str, config: Config | None = None) -> dict[str, str]:
    with open_nvml(node) as session:
        inventory = discover(session.nv, session.host.sysfs_root, session.host.proc_root)
    return node_labels(inventory, config or Config())


def oneshot(env: dict[str, str], *more: str, node: str = "dgx-a100") -> int:
    return gfd_main(["--oneshot", "--no-timestamp", "--simulate", node, *more], env)


def test_the_object_is_created_as_gfd_writes_it(api: tuple[FakeApiServer, dict[str, str]]) -> None:
    fake, env = api
    assert oneshot(env) == 0  # the default output: no --use-node-feature-api needed
    obj = fake.objects.get(OBJECT)
    assert obj is not None, fake.objects.requests
    assert (obj["apiVersion"], obj["kind"]) == ("nfd.k8s-sigs.io/v1alpha1", "NodeFeature")
    metadata = obj["metadata"]
    assert (metadata["name"], metadata["namespace"]) == (f"nvidia-features-for-{NODE}", NAMESPACE)
    assert metadata["labels"] == {"nfd.node.kubernetes.io/node-name": NODE}
    assert metadata["ownerReferences"] == [
        {k: DAEMONSET[k] for k in ("apiVersion", "kind", "name", "uid")} | {"controller": True},
        {"apiVersion": "v1", "kind": "Pod", "name": POD, "uid": POD_OBJECT["metadata"]["uid"]},
    ]
    assert obj["spec"]["features"] == {"flags": {}, "attributes": {}, "instances": {}}
    assert obj["spec"]["labels"] == expected_labels("dgx-a100")
    assert ("POST", COLLECTION) in fake.objects.requests


def test_an_unchanged_node_is_not_written_again_and_a_change_updates_it_in_place(
    api: tuple[FakeApiServer, dict[str, str]], tmp_path: Path
) -> None:
    fake, env = api
    assert oneshot(env) == 0
    created = fake.objects.get(OBJECT)
    assert created is not None
    # NFD's master keeps a status; someone added a label of their own.
    created["status"] = {"numberOfLabels": 31}
    created["metadata"]["labels"]["team"] = "ml"
    fake.objects.put(OBJECT, created)
    fake.objects.requests.clear()
    created_again = fake.objects.get(OBJECT)

    assert oneshot(env) == 0
    updated = fake.objects.get(OBJECT)
    assert updated is not None and created_again is not None
    # The labels map is GFD's again (the node-name label only), nothing else changed: one PUT.
    assert updated["metadata"]["labels"] == {"nfd.node.kubernetes.io/node-name": NODE}
    assert [m for m, _ in fake.objects.requests].count("PUT") == 1

    fake.objects.requests.clear()
    assert oneshot(env) == 0
    assert fake.objects.requests == [("GET", POD_PATH), ("GET", OBJECT)]  # as wanted: not written

    config = tmp_path / "config.yaml"
    config.write_text(
        "version: v1\nsharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 4}]}}\n"
    )
    assert oneshot(env, "--config-file", str(config)) == 0
    shared = fake.objects.get(OBJECT)
    assert shared is not None
    assert shared["spec"]["labels"]["nvidia.com/gpu.replicas"] == "4"
    assert shared["status"] == {"numberOfLabels": 31}  # kept, as GFD keeps it
    assert shared["metadata"]["uid"] == created["metadata"]["uid"]  # the same object, replaced in place


def test_without_a_pod_name_the_object_has_no_owners(api: tuple[FakeApiServer, dict[str, str]]) -> None:
    fake, env = api
    assert oneshot({k: v for k, v in env.items() if k != "POD_NAME"}) == 0
    obj = fake.objects.get(OBJECT)
    assert obj is not None and "ownerReferences" not in obj["metadata"]


def test_a_pod_that_cannot_be_read_gives_no_owners_and_the_labels_still_go_out(
    api: tuple[FakeApiServer, dict[str, str]],
) -> None:
    fake, env = api
    assert oneshot({**env, "POD_NAME": "no-such-pod"}) == 0
    obj = fake.objects.get(OBJECT)
    assert obj is not None and "ownerReferences" not in obj["metadata"]


def test_the_node_name_is_required(
    api: tuple[FakeApiServer, dict[str, str]], capfd: pytest.CaptureFixture[str]
) -> None:
    _, env = api
    assert oneshot({k: v for k, v in env.items() if k != "NODE_NAME"}) == 1
    assert "set --node-name or NODE_NAME" in capfd.readouterr().err


def test_an_api_server_that_is_gone_fails_a_oneshot_run_naming_the_request(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    with FakeApiServer({}) as fake:
        url = fake.url
    env = {
        "NODE_NAME": NODE,
        "NAMESPACE": NAMESPACE,
        "KUBECONFIG": str(write_kubeconfig(tmp_path / "k", url)),
    }
    assert oneshot(env) == 1
    assert f"reading NodeFeature {NAMESPACE}/nvidia-features-for-{NODE} failed" in capfd.readouterr().err


def test_a_refused_object_is_an_error_that_says_why(api: tuple[FakeApiServer, dict[str, str]]) -> None:
    fake, env = api
    fake.objects.schemas["nodefeatures"] = {
        **SCHEMA,
        "properties": {**SCHEMA["properties"], "kind": {"const": "X"}},
    }
    publisher = NodeFeaturePublisher(api_client(env["KUBECONFIG"]), NodeFeatureTarget(NODE, NAMESPACE), [])
    with pytest.raises(NodeFeatureError, match=r"creating NodeFeature .* failed: HTTP 422 .*\$\.kind"):
        publisher.publish({"nvidia.com/gpu.count": "1"})


def test_the_objects_written_pass_nfds_schema_and_the_schema_bites() -> None:
    labels = expected_labels("gb200-nvl")
    owners = [{"apiVersion": "v1", "kind": "Pod", "name": POD, "uid": "u"}]
    obj: dict[str, Any] = new_object(NodeFeatureTarget(NODE, NAMESPACE), labels, owners)
    jsonschema.validate(obj, SCHEMA)
    for broken in (
        {**obj, "spec": {**obj["spec"], "lables": {}}},  # a misspelt field
        {**obj, "spec": {**obj["spec"], "labels": {"nvidia.com/gpu.count": 4}}},  # not a string
        {**obj, "spec": {"features": {"flags": {"x": {}}}}},  # a feature set without elements
        {k: v for k, v in obj.items() if k != "spec"},
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(broken, SCHEMA)


def test_a_daemon_run_logs_a_refusal_once_and_publishes_when_the_api_accepts(
    api: tuple[FakeApiServer, dict[str, str]],
) -> None:
    fake, env = api
    fake.objects.schemas["nodefeatures"] = {
        **SCHEMA,
        "properties": {**SCHEMA["properties"], "kind": {"const": "X"}},
    }
    argv = ["--sleep-interval", "20ms", "--simulate", "t4-single", "--no-timestamp"]
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; from nvidia_device_plugin.cli.gfd import main; sys.exit(main())",
         *argv],
        env={**os.environ, **env},
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        wait_for(
            lambda: [m for m, _ in fake.objects.requests].count("POST") >= 3,
            "three refused passes",
            timeout=CHILD_GUARD_S,
        )
        fake.objects.schemas["nodefeatures"] = SCHEMA  # the CRD fixed
        wait_for(
            lambda: fake.objects.get(OBJECT) is not None,
            "the object after the refusals",
            timeout=CHILD_GUARD_S,
        )
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=scaled(30))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert err.count("HTTP 422") == 1, err  # once per reason, not once per pass
    assert "labelling works again" in err
    assert fake.objects.get(OBJECT) is not None  # the object stays with its owners, not with the process


def test_without_nfds_crd_the_error_says_so(api: tuple[FakeApiServer, dict[str, str]]) -> None:
    fake, env = api
    fake.objects.uninstalled.add("nodefeatures")
    publisher = NodeFeaturePublisher(api_client(env["KUBECONFIG"]), NodeFeatureTarget(NODE, NAMESPACE), [])
    with pytest.raises(NodeFeatureError, match=r"creating .* HTTP 404 .*CRD installed\?"):
        publisher.publish({})
