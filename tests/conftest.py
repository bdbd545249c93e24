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
# runs the whole backend suite. A key is a test's name, or "file::name" where several files
# hold a test of that name and the entry is for one of them.
DEFAULT_CASES = {
    "test_et_llama_folds_both_residual_adds_of_every_layer": {"webgpu"},
    # each device, form and quantisation once, on the two lowerings test_llm_et's default
    # cases lower too (test_llm_et.llama_program shares them)
    "test_tiny_llama_writes_each_layers_caches_in_one_dispatch_bit_for_bit_unfused":
        {"webgpu-int4-g32-custom", "cpu-fp32-plain"},
    "test_pass_fuses_tiny_llama_rotations_within_1e6_of_unfused_and_eager": {"half-webgpu"},
    "test_pair_rotates_q_and_k_of_a_layer_in_one_dispatch_bit_for_bit_two_ropes":
        {"half-partial-webgpu"},
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
    # the cpu side of these fusions keeps its bit-for-bit checks on the hand-written graphs of
    # the same files (test_fused_output_is_bit_identical..., the norm's GEMV and GEMM cases)
    "test_et_llama_logits_are_bit_identical_with_the_pass_toggled": {"all passes-webgpu"},
    "test_tiny_llama_decode_runs_two_dispatches_fewer_per_layer_with_the_unfused_bits":
        {"webgpu"},
    "test_tiny_llama_without_a_cache_reads_k_and_v_through_their_permutes_bit_for_bit":
        {"webgpu"},
    # encoding ahead with the dispatch list whole and in pieces; not encoding ahead is every
    # other test's path
    "test_encoding_ahead_submits_the_next_execute_of_a_binding_bit_for_bit":
        {"True-False", "True-True"},
    # export-llm + generate: int4 on webgpu (generate on cpu runs in test_llm_cli's Qwen3.5
    # hybrid test; the --no-fuse export and its test run in the full suite)
    "test_generate_is_the_eager_models_greedy_decoding": {"int4-g32-webgpu"},
    "test_no_fuse_lowers_with_the_passes_off_and_decodes_the_same": set(),
    # real models (an export and a lowering each): every model once, each device twice
    "test_hf_model_is_one_delegate_call_and_matches_eager":
        {"llama-webgpu", "qwen2-cpu", "qwen3-cpu", "gpt2-webgpu"},
    "test_transformer_encoder_layer_is_one_delegate_call_and_matches_eager":
        {"False-webgpu", "True-cpu"},
    "test_cnn_is_delegated_in_one_call_and_matches_eager":
        {"resnet18-webgpu", "mobilenet_v3_small-cpu"},
    # ---- the passes' graph x device products (tests/test_pass_*.py): each a lowering or two
    # of 0.3-0.7 s and a run. A pass rewrites the IR before any device is asked (preprocess
    # never reads the device), so each graph runs once, the devices alternating: every graph,
    # form and order of the test still runs, and on each device.
    "test_pass_rms_norm.py::test_graph_with_no_match_lowers_byte_identically_and_runs":
        {"mean-dim0-cpu", "mean-dim-2-webgpu", "mean-two-dims-cpu", "no-keepdim-webgpu",
         "eps-zero-cpu", "no-eps-webgpu", "sqrt-cpu", "fourth-power-webgpu", "other-x-cpu",
         "square-of-two-webgpu", "eps-times-2-cpu"},
    "test_pass_rope.py::test_graph_with_no_match_lowers_byte_identically_and_runs":
        {"hf-half-is-an-output-cpu", "hf-rotate-half-reversed-webgpu",
         "imag-not-a-rotation-cpu", "pair-has-a-second-consumer-webgpu",
         "pair-is-an-output-cpu", "product-is-an-output-webgpu", "real-part-reversed-cpu",
         "tables-widen-x-webgpu"},
    "test_pass_sdpa_layout.py::test_graph_with_no_match_lowers_byte_identically_and_runs":
        {"head-dim-moves-cpu", "output-read-twice-webgpu", "q-permute-is-k-too-cpu",
         "q-permute-read-twice-webgpu"},
    "test_pass_swiglu.py::test_graph_with_no_match_lowers_byte_identically_and_runs":
        {"broadcast-gate-cpu", "broadcast-up-webgpu", "glu-cpu", "sigmoid*other*up-webgpu",
         "silu+up-cpu"},
    # the refusals only lower (byte-identity, no run): each intermediate once, and the two
    # tests of a file alternate the other way round
    "test_pass_rms_norm.py::test_pass_refuses_an_intermediate_with_a_second_consumer":
        {"square-cpu", "mean-webgpu", "add-cpu", "rsqrt-webgpu"},
    "test_pass_rms_norm.py::test_pass_refuses_an_intermediate_that_is_an_output":
        {"square-webgpu", "mean-cpu", "add-webgpu", "rsqrt-cpu"},
    "test_pass_swiglu.py::test_pass_refuses_an_intermediate_with_a_second_consumer":
        {"sigmoid-cpu", "sigmoid*g-webgpu", "silu-cpu"},
    "test_pass_swiglu.py::test_pass_refuses_an_intermediate_that_is_an_output":
        {"sigmoid-webgpu", "sigmoid*g-cpu", "silu-webgpu"},
    "test_graph_with_no_match_lowers_byte_identically":   # test_pass_linear_swiglu.py
        {"no swiglu-cpu", "gate read twice-webgpu", "up read twice-cpu",
         "a triple's pair-webgpu"},
    "test_unmatched_graph_lowers_byte_identically_with_the_pass_on_and_off":   # residual_add
        {"linear-read-twice-cpu", "linear-scaled-too-webgpu", "alpha-2-cpu",
         "broadcast-r-webgpu", "linear-plus-itself-cpu", "sub-webgpu"},
    "test_unmatched_linears_lower_byte_identically_with_the_pass_on_and_off":   # fuse_linear
        {"bias-cpu", "group-sizes-webgpu", "inputs-cpu"},
    "test_a_k_permute_read_elsewhere_or_as_v_too_stays_and_the_result_is_unfused":
        {"k-permute-is-v-too-cpu", "k-permute-read-twice-webgpu", "k-repeat-read-twice-cpu"},
    "test_ropes_that_may_not_pair_lower_as_with_pairing_off_and_run":
        {"k-by-other-tables-cpu", "q-read-before-k-rotates-webgpu", "q-rotated-twice-cpu"},
    # where it fires: each form (and order) once per device at least
    "test_pass_fuses_the_chain_into_one_rms_norm_with_the_weight":
        {"et-cpu", "hf-webgpu", "pow-cpu", "x*x-reversed-webgpu"},
    "test_pass_fuses_the_pattern_into_one_silu_mul_within_1e6_of_unfused":
        {"sigmoid*g*up-cpu", "silu*up-webgpu", "up*(g*sigmoid)-cpu", "up*silu-webgpu"},
    "test_pass_fuses_q_and_k_rotations_into_one_rope_pair":
        {"et-apply_rotary_emb-webgpu", "hf-apply_rotary_emb-cpu", "hf-partial-webgpu"},
    # every form on both devices, each order on both (the webgpu cases check the kernels)
    "test_gate_up_and_swiglu_become_one_op_with_the_unfused_bits":
        {"gate-first-silu-webgpu", "up-first-silu-cpu", "gate-first-up*silu-cpu",
         "up-first-up*silu-webgpu", "gate-first-sigmoid-webgpu", "up-first-sigmoid-cpu"},
    # bias and no bias, each order, on each device; the two tests keep the same four, which
    # share their lowerings (r+linear-bias-webgpu's with the GEMM-tile tests too)
    "test_fused_ir_holds_one_linear_with_the_residual_input":
        {"linear+r-bias-cpu", "linear+r-no-bias-webgpu", "r+linear-bias-webgpu",
         "r+linear-no-bias-cpu"},
    "test_fused_output_is_bit_identical_to_linear_then_add_in_one_dispatch":
        {"linear+r-bias-cpu", "linear+r-no-bias-webgpu", "r+linear-bias-webgpu",
         "r+linear-no-bias-cpu"},
    # each case names the WGSL entry it runs: all of them on webgpu; cpu once per mask kind
    "test_k_and_v_read_through_their_permutes_match_unfused_bit_for_bit":
        {"decode-d12-float-webgpu", "decode-d5-causal-webgpu", "flash-d256-bool-webgpu",
         "prefill-d12-float-webgpu", "prefill-d5-causal-webgpu", "split-d12-bool-webgpu",
         "decode-d5-causal-cpu", "prefill-d12-float-cpu", "split-d12-bool-cpu"},
}


def _full_suite() -> bool:
    return os.environ.get("ETWGPU_FULL_SUITE", "") not in ("", "0")


def pytest_collection_modifyitems(config, items):
    if _full_suite():
        return
    keep, drop = [], []
    for item in items:
        name = getattr(item, "originalname", None)
        cases = DEFAULT_CASES.get(f"{item.path.name}::{name}", DEFAULT_CASES.get(name))
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
