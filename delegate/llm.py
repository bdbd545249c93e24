"""LLMs from ExecuTorch's own definitions (`examples/models/llama`, as the wheel ships it):
built-in configs, fixed-seed random weights or a local Hugging Face checkpoint, torchao int4
weight-only quantisation, export with a dynamic prompt length, and the greedy generate loop that
the CLI and the benchmarks share.

The exported `forward(tokens [1, T], {"input_pos": [1]})` returns the last token's logits
[1, vocab] (`generate_full_logits=False`); T runs from 1 to max_seq_len. The KV caches (and
Qwen3.5's DeltaNet state) are the module's buffers: a call at input_pos 0 starts a new sequence.
"""
from __future__ import annotations

import contextlib
import importlib
import io
import os
import time
from dataclasses import dataclass

import torch

from delegate.errors import DelegateError, InputError

# ModelArgs fields per model; max_seq_len / max_context_len come from the caller.
_LLAMA3_2_1B = dict(
    # Meta's Llama-3.2-1B params.json: ffn_dim_multiplier 1.5 and multiple_of 256 give 8192;
    # HF rope_scaling {rope_type: llama3, factor: 32, high_freq_factor: 4, low_freq_factor: 1,
    # original_max_position_embeddings: 8192}; ExecuTorch's llama/model.py sets factor 32 for
    # llama3_2 and rope.apply_scaling hard-codes the low factor and 8192.
    dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, vocab_size=128256, hidden_dim=8192,
    norm_eps=1e-5, rope_theta=500000.0, use_scaled_rope=True, rope_scale_factor=32,
    high_freq_factor=4,
)
_QWEN3_5_0_8B = dict(
    # ExecuTorch's examples/models/qwen3_5/config/0_8b_config.json (pytorch/executorch main; the
    # 1.5.1 wheel ships only the yaml), which matches the model card of Qwen/Qwen3.5-0.8B:
    # hidden 1024, 24 layers = 6 x (3 x Gated DeltaNet + 1 x gated attention), DeltaNet 16 QK and
    # 16 V heads of dim 128, attention 8 Q / 2 KV heads of dim 256, rotary dim 64, vocab 248320.
    dim=1024, hidden_dim=3584, n_heads=8, head_dim=256, n_kv_heads=2, n_layers=24,
    norm_eps=1e-6, rope_theta=10000000.0, vocab_size=248320, use_hf_rope=True,
    partial_rotary_factor=0.25, use_qk_norm=True, qk_norm_before_rope=True, use_q_gate=True,
    rms_norm_add_unit_offset=True, linear_conv_kernel_dim=4, linear_key_head_dim=128,
    linear_value_head_dim=128, linear_num_key_heads=16, linear_num_value_heads=16,
    layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 6,
)


@dataclass(frozen=True)
class LlmConfig:
    family: str          # "llama" or "qwen3_5": which Hugging Face checkpoint layout it reads
    args: dict           # ModelArgs fields
    tied: bool           # the LM head shares the token embedding (ModelArgs cannot say so)


MODELS = {
    "llama3_2_1b": LlmConfig("llama", _LLAMA3_2_1B, tied=True),
    "qwen3_5_0_8b": LlmConfig("qwen3_5", _QWEN3_5_0_8B, tied=True),
    # The same forms at test size: every K a multiple of 64, so int4-g32 and -g64 both apply.
    "tiny-llama": LlmConfig("llama", dict(
        _LLAMA3_2_1B, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=128,
        hidden_dim=128), tied=True),
    "tiny-qwen3_5": LlmConfig("qwen3_5", dict(
        _QWEN3_5_0_8B, dim=64, hidden_dim=128, n_heads=2, head_dim=32, n_kv_heads=1, n_layers=2,
        vocab_size=128, linear_key_head_dim=32, linear_value_head_dim=32,
        linear_num_key_heads=2, linear_num_value_heads=2,
        layer_types=["linear_attention", "full_attention"]), tied=True),
}
QUANTIZE = {"none": None, "int4-g32": 32, "int4-g64": 64}   # scheme -> group size
STAGES = ("weights", "quantise", "export", "lower", "serialise")
# Constant methods, under the names ExecuTorch's LLM runners read.
META_METHODS = ("get_vocab_size", "get_max_seq_len", "get_max_context_len")


def model_args(name: str, max_seq_len: int):
    from executorch.examples.models.llama.model_args import ModelArgs

    if name not in MODELS:
        raise DelegateError(f"model: expected one of {sorted(MODELS)}, got {name!r}")
    return ModelArgs(**MODELS[name].args, max_seq_len=max_seq_len, max_context_len=max_seq_len,
                     use_kv_cache=True, enable_dynamic_shape=True, generate_full_logits=False)


def build_model(name: str, max_seq_len: int, checkpoint: str | None = None, seed: int = 0):
    """ExecuTorch's Transformer for `name`, in eval mode: fixed-seed random weights, or those of
    the Hugging Face checkpoint directory `checkpoint`."""
    from executorch.examples.models.llama.llama_transformer import construct_transformer

    args = model_args(name, max_seq_len)
    torch.manual_seed(seed)
    model = construct_transformer(args).eval().requires_grad_(False)
    if checkpoint is not None:
        _load_into(model, load_checkpoint(name, checkpoint), checkpoint)
        return model
    # Hugging Face's initializer_range: with N(0, 1) embeddings and a tied head, the token's own
    # embedding outweighs the blocks and greedy decoding only repeats the last token.
    torch.nn.init.normal_(model.tok_embeddings.weight, std=0.02)
    if MODELS[name].tied:
        model.output.weight = model.tok_embeddings.weight
    return model


def group_size(scheme: str):
    if scheme not in QUANTIZE:
        raise DelegateError(f"quantize: expected one of {list(QUANTIZE)}, got {scheme!r}")
    return QUANTIZE[scheme]


def quantize(model, scheme: str):
    """Every linear and the token embedding to torchao int4 weight-only, symmetric, per group:
    the forms our partitioner lowers to linear_q4gsw and embedding_q4gsw. A tied LM head and
    embedding quantise to the same bytes, which the .pte then stores once."""
    if group_size(scheme) is None:
        return model
    from torchao.quantization import IntxWeightOnlyConfig, quantize_
    from torchao.quantization.granularity import PerGroup

    config = IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(group_size(scheme)))
    quantize_(model, config)
    quantize_(model, config, filter_fn=lambda m, fqn: isinstance(m, torch.nn.Embedding))
    return model


def example_inputs(max_seq_len: int):
    """(example args, dynamic shapes): tokens [1, T] with T in 1..max_seq_len, input_pos [1]."""
    if max_seq_len < 2:   # torch.export has no dynamic dim with min == max
        raise DelegateError(f"max_seq_len: expected an integer >= 2, got {max_seq_len}")
    seq = torch.export.Dim("T", min=1, max=max_seq_len)
    tokens = torch.zeros(1, 2, dtype=torch.long)
    return (tokens, {"input_pos": torch.tensor([0])}), ({1: seq}, {"input_pos": None})


def export_llm(name: str, scheme: str = "none", max_seq_len: int = 128, device: str = "webgpu",
               fuse: bool = True, checkpoint: str | None = None, progress: bool = False):
    """The .pte bytes of `name`, lowered with WgpuPartitioner; `fuse=False` lowers with the
    graph passes off. A tqdm bar on stderr walks STAGES when `progress`."""
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower
    from tqdm import tqdm

    from delegate.partitioner import WgpuPartitioner

    model_args(name, max_seq_len)   # bad arguments fail here, before the bar starts
    group_size(scheme)
    args, dynamic = example_inputs(max_seq_len)
    partitioner = WgpuPartitioner(device=device, passes=None if fuse else "none")
    vocab = MODELS[name].args["vocab_size"]
    meta = dict(zip(META_METHODS, (vocab, max_seq_len, max_seq_len)))
    pipeline = (
        lambda _: build_model(name, max_seq_len, checkpoint),
        lambda model: quantize(model, scheme),
        lambda model: torch.export.export(model, args, dynamic_shapes=dynamic),
        lambda ep: to_edge_transform_and_lower(
            ep, partitioner=[partitioner], constant_methods=meta,
            compile_config=EdgeCompileConfig(_check_ir_validity=False)),
        lambda edge: edge.to_executorch().buffer,
    )
    value = None
    with tqdm(total=len(STAGES), disable=not progress, unit="stage", leave=False,
              bar_format="{desc:<26} {bar} {n}/{total} [{elapsed}]") as bar:
        for stage, fn in zip(STAGES, pipeline):
            bar.set_description_str(f"{name}: {stage}")
            value = fn(value)
            bar.update()
    return value


# ---- checkpoints -------------------------------------------------------------------------------
# Hugging Face Llama names -> the names of ExecuTorch's Transformer ("{}" is the layer).
_LLAMA_HF_TO_META = {
    "model.embed_tokens.weight": "tok_embeddings.weight",
    "model.norm.weight": "norm.weight",
    "lm_head.weight": "output.weight",
    "model.layers.{}.self_attn.q_proj.weight": "layers.{}.attention.wq.weight",
    "model.layers.{}.self_attn.k_proj.weight": "layers.{}.attention.wk.weight",
    "model.layers.{}.self_attn.v_proj.weight": "layers.{}.attention.wv.weight",
    "model.layers.{}.self_attn.o_proj.weight": "layers.{}.attention.wo.weight",
    "model.layers.{}.input_layernorm.weight": "layers.{}.attention_norm.weight",
    "model.layers.{}.post_attention_layernorm.weight": "layers.{}.ffn_norm.weight",
    "model.layers.{}.mlp.gate_proj.weight": "layers.{}.feed_forward.w1.weight",
    "model.layers.{}.mlp.down_proj.weight": "layers.{}.feed_forward.w2.weight",
    "model.layers.{}.mlp.up_proj.weight": "layers.{}.feed_forward.w3.weight",
}


def load_checkpoint(name: str, directory: str) -> dict:
    """The Hugging Face checkpoint in `directory` (model.safetensors or pytorch_model.bin, sharded
    or not), as a state dict of ExecuTorch's Transformer for `name`. Read and, for Qwen3.5,
    renamed by ExecuTorch's examples/models/qwen3_5/convert_weights."""
    # the package's __init__ re-exports a function under the module's name
    qwen3_5 = importlib.import_module("executorch.examples.models.qwen3_5.convert_weights")
    what = f"--checkpoint {directory}"
    if not os.path.isdir(directory):
        raise InputError(f"{what}: expected a directory, got {_what_is(directory)}")
    try:
        with contextlib.redirect_stdout(io.StringIO()):   # it prints each step
            hf = qwen3_5.load_checkpoint(directory)
    except FileNotFoundError:
        raise InputError(f"{what}: expected model.safetensors or pytorch_model.bin (or their "
                         f".index.json shards), got none") from None
    except ModuleNotFoundError as e:
        raise InputError(f"{what}: reading safetensors needs the {e.name} package, which is "
                         f"not installed (pip install {e.name})") from None
    try:
        if MODELS[name].family == "qwen3_5":
            return qwen3_5.qwen_3_5_to_meta(hf)
        return _llama_hf_to_meta(hf, MODELS[name].args)
    except ValueError as e:
        raise InputError(f"{what}: not a {name} checkpoint ({e})") from None


def _llama_hf_to_meta(hf: dict, args: dict) -> dict:
    from executorch.examples.models.checkpoint import get_mapped_key

    sd = {}
    for key, value in hf.items():
        if key.endswith("rotary_emb.inv_freq"):
            continue
        try:
            sd[get_mapped_key(key, _LLAMA_HF_TO_META)] = value
        except Exception:  # noqa: BLE001 - get_mapped_key raises KeyError or a bare Exception
            raise ValueError(f"unexpected key {key!r}") from None
    for key in [k for k in sd if k.endswith(("attention.wq.weight", "attention.wk.weight"))]:
        heads = args["n_heads"] if key.endswith("wq.weight") else args["n_kv_heads"]
        sd[key] = _unpermute_rope(sd[key], heads)
    if "output.weight" not in sd and "tok_embeddings.weight" in sd:   # tied: no lm_head
        sd["output.weight"] = sd["tok_embeddings.weight"]
    return sd


def _unpermute_rope(w: torch.Tensor, heads: int) -> torch.Tensor:
    """HF stores q/k rows per head as [all reals, all imaginaries] (rotate_half); ExecuTorch's
    non-HF RoPE, which carries the Llama-3 scaling, wants them interleaved (the inverse of
    transformers' convert_llama_weights_to_hf permute)."""
    rows, cols = w.shape
    return w.view(heads, 2, rows // heads // 2, cols).transpose(1, 2).reshape(rows, cols)


def _load_into(model, sd: dict, directory: str) -> None:
    params = dict(model.named_parameters())
    missing = sorted(set(params) - set(sd))
    unexpected = sorted(set(sd) - set(model.state_dict()))
    if missing or unexpected:
        raise InputError(f"--checkpoint {directory}: expected the weights of this model, got "
                         f"{len(missing)} missing (first {missing[:3]}) and {len(unexpected)} "
                         f"unexpected (first {unexpected[:3]})")
    for key, value in sd.items():
        if tuple(value.shape) != tuple(params[key].shape):
            raise InputError(f"--checkpoint {directory}: {key}: expected shape "
                             f"{tuple(params[key].shape)}, got {tuple(value.shape)}")
    model.load_state_dict({k: v.to(torch.float32) for k, v in sd.items()}, strict=False)


def _what_is(path: str) -> str:
    return "a file" if os.path.exists(path) else "nothing there"


# ---- generation --------------------------------------------------------------------------------
@dataclass(frozen=True)
class LlmMeta:
    vocab_size: int
    max_seq_len: int        # the longest prefill
    max_context_len: int    # positions the cache holds


def read_meta(program) -> LlmMeta:
    """The constant methods export_llm writes (ExecuTorch's export_llama writes them too)."""
    missing = [m for m in META_METHODS if m not in program.method_names]
    if missing:
        raise InputError(f"expected an LLM .pte with methods {list(META_METHODS)} (as "
                         f"export-llm writes), got one without {missing}")
    return LlmMeta(*(int(program.load_method(m).execute([])[0]) for m in META_METHODS))


def check_request(meta: LlmMeta, prompt: list, new_tokens: int) -> None:
    if not 1 <= len(prompt) <= meta.max_seq_len:
        raise InputError(f"prompt: expected 1 to {meta.max_seq_len} tokens, got {len(prompt)}")
    bad = [t for t in prompt if not 0 <= t < meta.vocab_size]
    if bad:
        raise InputError(f"prompt: expected token ids in [0, {meta.vocab_size}), got {bad[:5]}")
    room = meta.max_context_len - len(prompt) + 1   # the last new token is never fed back
    if not 1 <= new_tokens <= room:
        raise InputError(f"new tokens: expected 1 to {room} after a {len(prompt)}-token prompt "
                         f"(the cache holds {meta.max_context_len} positions), got {new_tokens}")


@dataclass(frozen=True)
class Timings:
    prompt_tokens: int
    prefill_s: float        # prefill plus picking the first token: the time to first token
    decode_tokens: int
    decode_s: float

    def line(self) -> str:
        """llama.cpp-style: prompt and decode throughput, time to first token."""
        def rate(n, s):
            return f"{n / s:.1f} tok/s" if n and s > 0 else "n/a"

        return (f"prompt: {self.prompt_tokens} tok in {self.prefill_s * 1e3:.2f} ms "
                f"({rate(self.prompt_tokens, self.prefill_s)}) | decode: {self.decode_tokens} tok "
                f"in {self.decode_s * 1e3:.2f} ms ({rate(self.decode_tokens, self.decode_s)}) | "
                f"time to first token: {self.prefill_s * 1e3:.2f} ms")


def generate(method, prompt: list, new_tokens: int, progress: bool = False):
    """Greedy decoding on a loaded forward method: one prefill of the prompt at input_pos 0,
    then one token per step. Returns (the new_tokens generated ids, Timings)."""
    from tqdm import tqdm

    def step(tokens, pos):
        logits = method.execute([torch.tensor([tokens], dtype=torch.long), torch.tensor([pos])])
        return int(logits[0].reshape(-1).argmax())

    out = []
    with tqdm(total=new_tokens, disable=not progress, unit="tok", leave=False,
              desc="generate") as bar:
        t0 = time.perf_counter()
        out.append(step(prompt, 0))
        t1 = time.perf_counter()
        bar.update()
        for i in range(new_tokens - 1):
            out.append(step([out[-1]], len(prompt) + i))
            bar.update()
        t2 = time.perf_counter()
    return out, Timings(len(prompt), t1 - t0, new_tokens - 1, t2 - t1)


def load_tokenizer(path: str):
    """A tokenizer from the executorch wheel's pytorch_tokenizers (tokenizer.json, SentencePiece
    or tiktoken model) for a local file; encode(text, bos=, eos=) and decode(ids)."""
    if not os.path.isfile(path):
        raise InputError(f"--tokenizer {path}: expected a tokenizer file, got {_what_is(path)}")
    try:
        from pytorch_tokenizers import get_tokenizer

        with contextlib.redirect_stdout(io.StringIO()):   # it prints which reader it chose
            return get_tokenizer(path)
    except Exception as e:  # noqa: BLE001 - each reader fails its own way on a foreign file
        first = (str(e).splitlines() or [""])[0][:120]
        raise InputError(f"--tokenizer {path}: expected a tokenizer.json, SentencePiece or "
                         f"tiktoken model, got a file none of them reads ({type(e).__name__}: "
                         f"{first})") from None
