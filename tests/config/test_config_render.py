"""config.render: the start-up line's config document reads back as the same Config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from nvidia_device_plugin.config.loader import load_config_file, parse_config
from nvidia_device_plugin.config.render import config_document, config_json

from support.configs import CONFIGS

EXAMPLES = sorted(CONFIGS.glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_example_config_reads_back_the_same(path: Path) -> None:
    config = load_config_file(path)
    again = parse_config(json.loads(config_json(config)), "rendered")
    assert again == config
    assert again.warnings == ()  # every setting under its v1 name, nothing left for NVIDIA to ignore


def test_a_config_with_every_section_reads_back_the_same() -> None:
    text = """
flags:
  migStrategy: mixed
  resourceNaming: true
  plugin: {deviceListStrategy: [envvar, cdi-cri], deviceIDStrategy: index, passDeviceSpecs: true}
resources: {gpus: [{pattern: "*A100*", name: a100}], mig: [{pattern: 1g.10gb, name: small}]}
sharing:
  timeSlicing:
    renameByDefault: true
    resources:
    - {name: nvidia.com/a100, replicas: 3, devices: [0, "1:2"]}
    - {name: small, replicas: 2, devices: 2, rename: tiny}
health: {ignoredXIDs: [13, 79], criticalXIDs: [48], recovery: {enabled: true, gracePeriod: 2m}}
imex: {channelIDs: [0], required: true}
"""
    config = parse_config(yaml.safe_load(text), "t.yaml")
    document = config_document(config)
    assert parse_config(document, "rendered") == config
    assert '"deviceListStrategy":["envvar","cdi-cri"]' in config_json(config)
    assert json.loads(config_json(config)) == document
