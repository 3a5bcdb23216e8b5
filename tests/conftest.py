"""The quick lane: ``make quick`` runs the suite without the tests marked ``slow``.

A test is slow when it starts processes (gloo groups, DataLoader workers, servers, a fresh
interpreter running a docs page or a CLI command) or builds a corpus large enough to take
seconds; such modules are listed here and every test in them is marked, so that a new test
lands in the right lane by where it lives. ``make test`` runs everything.
"""

from __future__ import annotations

import pytest

#: Test modules whose tests start processes or servers, or take seconds each.
SLOW_MODULES = {
    "test_cli", "test_demo", "test_distributed", "test_docs", "test_readme", "test_remote",
    "test_remote_paths", "test_resume", "test_transfer", "test_example_asr", "test_device_features",
    "test_hf_datasets", "test_lhotse", "test_compressed_shards", "test_buffers",
}


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: left out of the quick lane (make quick)")


def pytest_collection_modifyitems(config, items):
    for item in items:
        module = getattr(item, "module", None)
        name = module.__name__.rsplit(".", 1)[-1] if module is not None else ""
        if name in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
