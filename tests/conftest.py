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
    "test_buffers", "test_calibration", "test_cli", "test_collate", "test_compact",
    "test_compressed_shards", "test_ddp_docs", "test_demo", "test_device_features",
    "test_distributed", "test_docs", "test_docs_preparation", "test_epochs",
    "test_example_asr", "test_fingerprint", "test_hf_datasets", "test_kaldi_fbank",
    "test_lhotse", "test_loader", "test_noise", "test_pack_jobs", "test_recipe_wenetspeech",
    "test_registry", "test_remote", "test_remote_paths", "test_resume", "test_telemetry",
    "test_threads", "test_transfer", "test_trust", "test_virtual_streams_ddp",
    "test_virtual_streams_steps_ddp", "test_view_streams_ddp", "test_view_sampler_ddp",
    "test_prepare_jobs", "test_cmvn_jobs", "test_executors", "test_planned_road_ddp",
    "test_remote_copies",
}

#: Single tests elsewhere that start processes or take seconds.
SLOW_TESTS = {
    "test_ctrl_c_in_pack_says_a_rerun_continues_without_a_worker_traceback",
    "test_errors_raised_in_worker_processes_keep_file_line_and_key",
    "test_perturb_speed_kernels_are_per_rate_and_factor",
    "test_pipes_pickle_and_run_in_spawned_dataloader_workers",
    "test_two_workers_write_the_same_bytes_as_one",
    "test_workers_do_not_change_the_batches_with_speed_noise_and_reverb",
    "test_a_state_resumes_with_other_workers_in_one_process",
    "test_the_default_plans_over_the_streams_the_corpus_gives",
    "test_dither_is_drawn_per_utterance_and_epoch_whatever_the_workers",
    "test_drops_before_the_plan_are_counted_once_whatever_the_workers",
    "test_the_stages_count_the_whole_pass_and_warn_once",
}


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: left out of the quick lane (make quick)")


def pytest_collection_modifyitems(config, items):
    for item in items:
        module = getattr(item, "module", None)
        name = module.__name__.rsplit(".", 1)[-1] if module is not None else ""
        if name in SLOW_MODULES or item.name.split("[")[0] in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)
