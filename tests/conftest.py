"""Quiet third-party import-time noise that pytest cannot filter as a warning."""
import logging

# torchao registers an Enum as a pytree constant when imported (the backend suite's conftest
# imports it at collection, outside pytest's capture); torch *logs* its deprecation notice.
logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)

import os

# Model-level cross products (ExecuTorch's tiny Llama / Qwen3.5 lowered per device, form and
# quantisation; HF's models, torchvision's CNNs: each case an export and a lowering of 5-30 s
# on a 2-core CI machine). The default run keeps the cases named here, which together still
# cover every model, device, form and quantisation; ETWGPU_FULL_SUITE=1 runs every case, as it
# runs the whole backend suite.
DEFAULT_CASES = {
    "test_et_llama_folds_both_residual_adds_of_every_layer": {"webgpu"},
    "test_tiny_llama_writes_each_layers_caches_in_one_dispatch_bit_for_bit_unfused":
        {"webgpu-int4-g32-plain", "cpu-fp32-custom"},
    "test_pass_fuses_tiny_llama_rotations_within_1e6_of_unfused_and_eager": {"half-webgpu"},
    "test_pair_rotates_q_and_k_of_a_layer_in_one_dispatch_bit_for_bit_two_ropes":
        {"half-partial-webgpu", "interleaved-cpu"},
    "test_pass_cuts_webgpu_dispatches_per_layer": {"half-partial"},
    "test_tiny_et_llama_runs_in_one_delegate_and_matches_eager":
        {"webgpu-custom-int4-g32", "cpu-plain-fp32"},
    "test_tiny_qwen3_5_matches_eager_at_each_prefill_length_in_both_forms":
        {"webgpu-custom-int4-g32", "cpu-plain-none"},
    "test_tiny_llama_ffn_is_one_dispatch_fewer_per_layer_with_the_unfused_bits": {"webgpu"},
    "test_tiny_llama_attention_runs_no_permute_and_matches_unfused_bit_for_bit": {"webgpu"},
    "test_et_llama_fuses_qkv_and_gate_up_and_matches": {"webgpu"},
    "test_et_llama_norms_become_rms_norm_five_dispatches_fewer_each": {"webgpu"},
    "test_et_llama_prefill_and_decode_match_unfused_and_eager": {"webgpu"},
    "test_et_llama_logits_are_bit_identical_with_the_pass_toggled":
        {"all passes-webgpu", "none-cpu"},
    # export-llm + generate: each quantisation once, each device once (the --no-fuse export
    # and its test run in the full suite)
    "test_generate_is_the_eager_models_greedy_decoding": {"none-cpu", "int4-g32-webgpu"},
    "test_no_fuse_lowers_with_the_passes_off_and_decodes_the_same": set(),
    # real models (an export and a lowering each): every model once, each device twice
    "test_hf_model_is_one_delegate_call_and_matches_eager":
        {"llama-webgpu", "qwen2-cpu", "qwen3-cpu", "gpt2-webgpu"},
    "test_transformer_encoder_layer_is_one_delegate_call_and_matches_eager":
        {"False-webgpu", "True-cpu"},
    "test_cnn_is_delegated_in_one_call_and_matches_eager":
        {"resnet18-webgpu", "mobilenet_v3_small-cpu"},
}


def _full_suite() -> bool:
    return os.environ.get("ETWGPU_FULL_SUITE", "") not in ("", "0")


def pytest_collection_modifyitems(config, items):
    if _full_suite():
        return
    keep, drop = [], []
    for item in items:
        cases = DEFAULT_CASES.get(getattr(item, "originalname", None))
        case = getattr(getattr(item, "callspec", None), "id", None)
        (drop if cases is not None and case not in cases else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


# Quiet by default: under -q a passing test prints no dot (the default run's ~2,700 dots were
# ~40 lines); a line at each tenth of the run says the run is alive. Failures, errors, skips
# and xfails keep their letters; -v and plain runs are untouched.
def pytest_report_teststatus(report, config):
    if (config.get_verbosity() < 0 and report.when == "call" and report.passed
            and not hasattr(report, "wasxfail")):
        return "passed", "", "PASSED"
    return None


_progress = {"config": None, "total": 0, "done": 0, "tenth": 0, "start": None}


def pytest_configure(config):
    _progress["config"] = config


def pytest_collection_finish(session):
    _progress["total"] = len(session.items)


def pytest_runtest_logfinish(nodeid, location):
    import time

    config = _progress["config"]
    if config is None or config.get_verbosity() >= 0:
        return
    reporter, total = config.pluginmanager.get_plugin("terminalreporter"), _progress["total"]
    if _progress["start"] is None:
        _progress["start"] = time.perf_counter()
    _progress["done"] += 1
    tenth = 10 * _progress["done"] // max(total, 1)
    if _progress["tenth"] < tenth < 10:
        _progress["tenth"] = tenth
        reporter.write_line(f"{_progress['done']} of {total} tests "
                            f"({time.perf_counter() - _progress['start']:.0f} s)")
