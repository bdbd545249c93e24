"""`export-llm` and `generate`, as a user runs them, on ExecuTorch's own tiny Llama and Qwen3.5:
the generated ids are the eager module's greedy decoding (prefill at input_pos 0, then one token
per step), on cpu and on lavapipe, unquantised and int4-g32; a local Hugging Face checkpoint is
the model that wrote it; every bad argument is one typed line and exit code 2."""
import re

import pytest
import torch

from delegate import llm
from delegate.runtime.program import Runtime
from tests.test_cli import assert_one_line_error, cli
from tests.tolerances import tol

MAX = 24
PROMPT = [3, 17, 42, 99, 5]


def eager_greedy(model, prompt, new_tokens):
    """The reference: the eager module, fed as generate feeds the .pte."""
    out = []
    with torch.no_grad():
        logits = model(torch.tensor([prompt]), {"input_pos": torch.tensor([0])})
        out.append(int(logits.argmax()))
        for i in range(new_tokens - 1):
            pos = torch.tensor([len(prompt) + i])
            logits = model(torch.tensor([[out[-1]]]), {"input_pos": pos})
            out.append(int(logits.argmax()))
    return out


def eager(name, scheme="none", checkpoint=None):
    return llm.quantize(llm.build_model(name, MAX, checkpoint), scheme)


def ids(stdout, label):
    line = next(s for s in stdout.splitlines() if s.startswith(f"{label}: "))
    return [int(t) for t in line.split("token(s):")[1].split(",")]


def export(capsys, path, *flags):
    code, out, err = cli(capsys, "export-llm", "--max-seq-len", MAX, "-o", path, *flags)
    assert code == 0, err
    return out


class _Exported(dict):
    """(scheme, "--fuse" | "--no-fuse") -> path of tiny-llama exported so, on first use: a
    run that deselects every test of one form pays no export for it."""

    def __init__(self, directory):
        super().__init__()
        self.directory = directory

    def __missing__(self, key):
        scheme, fuse = key
        path = self.directory / f"tiny-llama-{scheme}{fuse}.pte"
        code = llm_main("export-llm", "--model", "tiny-llama", "--quantize", scheme, fuse,
                        "--max-seq-len", MAX, "-o", path)
        assert code == 0
        self[key] = str(path)
        return self[key]


@pytest.fixture(scope="module")
def ptes(tmp_path_factory):
    return _Exported(tmp_path_factory.mktemp("llm"))


def llm_main(*argv):
    from delegate.cli import main

    return main([str(a) for a in argv])


# ---- export-llm + generate vs eager greedy ---------------------------------------------------
@pytest.mark.parametrize("device", ["cpu", "webgpu"])
@pytest.mark.parametrize("scheme", ["none", "int4-g32"])
def test_generate_is_the_eager_models_greedy_decoding(ptes, capsys, scheme, device):
    code, out, err = cli(capsys, "generate", ptes[(scheme, "--fuse")], "--tokens",
                         ",".join(map(str, PROMPT)), "--new-tokens", 8, "--device", device)
    assert code == 0, err
    assert ids(out, "prompt") == PROMPT
    want = eager_greedy(eager("tiny-llama", scheme), PROMPT, 8)
    assert ids(out, "generated") == want
    assert len(set(want)) > 1   # the random weights do not just repeat a token


def test_no_fuse_lowers_with_the_passes_off_and_decodes_the_same(ptes, capsys):
    from executorch.exir._serialize._program import deserialize_pte_binary

    def passes_spec(path):
        program = deserialize_pte_binary(open(path, "rb").read()).program
        specs = {s.key: s.value for d in program.execution_plan[0].delegates
                 for s in d.compile_specs}
        return specs.get("passes")

    assert passes_spec(ptes[("int4-g32", "--no-fuse")]) == b"none"
    assert passes_spec(ptes[("int4-g32", "--fuse")]) is None
    code, out, _ = cli(capsys, "generate", ptes[("int4-g32", "--no-fuse")], "--tokens",
                       ",".join(map(str, PROMPT)), "--new-tokens", 6, "--device", "cpu")
    assert code == 0
    assert ids(out, "generated") == eager_greedy(eager("tiny-llama", "int4-g32"), PROMPT, 6)


def test_the_pte_carries_vocab_and_lengths_as_constant_methods(ptes):
    prog = Runtime.get().load_program(ptes[("none", "--fuse")], device="cpu")
    try:
        assert llm.read_meta(prog) == llm.LlmMeta(vocab_size=128, max_seq_len=MAX,
                                                  max_context_len=MAX)
    finally:
        prog.destroy()


def test_generate_prints_a_llama_cpp_style_timing_line_and_a_seeded_prompt(ptes, capsys):
    runs = [cli(capsys, "generate", ptes[("none", "--fuse")], "--prompt-len", 6,
                "--new-tokens", 4, "--device", "cpu") for _ in range(2)]
    assert all(code == 0 for code, _, _ in runs)
    (_, first, _), (_, second, _) = runs
    assert ids(first, "prompt") == ids(second, "prompt") and len(ids(first, "prompt")) == 6
    last = first.strip().splitlines()[-1]
    assert re.fullmatch(r"prompt: 6 tok in [\d.]+ ms \([\d.]+ tok/s\) \| decode: 3 tok in "
                        r"[\d.]+ ms \([\d.]+ tok/s\) \| time to first token: [\d.]+ ms", last)


def test_generate_shows_a_progress_bar_over_the_new_tokens(ptes, capsys):
    prog = Runtime.get().load_program(ptes[("none", "--fuse")], device="cpu")
    try:
        tokens, timings = llm.generate(prog.load_method("forward"), PROMPT, 5, progress=True)
    finally:
        prog.destroy()
    assert len(tokens) == 5 and timings.decode_tokens == 4 and timings.prompt_tokens == 5
    assert "generate:   0%|          | 0/5" in capsys.readouterr().err   # total = new tokens


def test_tiny_qwen3_5_hybrid_generates_the_eager_greedy_ids(tmp_path, capsys):
    path = tmp_path / "qwen.pte"
    export(capsys, path, "--model", "tiny-qwen3_5", "--quantize", "none")
    want = eager_greedy(eager("tiny-qwen3_5"), PROMPT, 6)
    for device in ("cpu", "webgpu"):
        code, out, err = cli(capsys, "generate", path, "--tokens", ",".join(map(str, PROMPT)),
                             "--new-tokens", 6, "--device", device)
        assert code == 0, err
        assert ids(out, "generated") == want, device


# ---- --checkpoint: a synthetic Hugging Face checkpoint ----------------------------------------
def hf_llama_checkpoint(directory, source):
    """`source`'s weights as transformers' Llama converter writes them: HF names, q/k rows
    permuted for rotate_half, bf16, no lm_head (tied)."""
    n_heads, n_kv = 4, 2   # tiny-llama

    def permute(w, heads):   # transformers' convert_llama_weights_to_hf
        rows, cols = w.shape
        return w.view(heads, rows // heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)

    names = {"attention.wq": "self_attn.q_proj", "attention.wk": "self_attn.k_proj",
             "attention.wv": "self_attn.v_proj", "attention.wo": "self_attn.o_proj",
             "attention_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
             "feed_forward.w1": "mlp.gate_proj", "feed_forward.w2": "mlp.down_proj",
             "feed_forward.w3": "mlp.up_proj"}
    hf = {"model.embed_tokens.weight": source.tok_embeddings.weight,
          "model.norm.weight": source.norm.weight}
    for i, layer in enumerate(source.layers):
        for meta, name in names.items():
            w = layer.get_submodule(meta).weight
            if meta == "attention.wq":
                w = permute(w, n_heads)
            elif meta == "attention.wk":
                w = permute(w, n_kv)
            hf[f"model.layers.{i}.{name}.weight"] = w
    directory.mkdir()
    torch.save({k: v.to(torch.bfloat16).contiguous() for k, v in hf.items()},
               directory / "pytorch_model.bin")


def bf16_source(name, seed):
    """A model with weights unlike build_model's, rounded to bf16 as a checkpoint holds them."""
    source = llm.build_model(name, MAX, seed=seed)
    with torch.no_grad():
        for p in source.parameters():
            p.normal_(0, 0.05).copy_(p.to(torch.bfloat16))
        for n, p in source.named_parameters():
            if n.endswith("A_log"):
                p.copy_(torch.linspace(-1, 1, p.numel()).to(torch.bfloat16))
    return source


def prefill_logits(model):
    with torch.no_grad():
        return model(torch.tensor([PROMPT]), {"input_pos": torch.tensor([0])})


def test_llama_checkpoint_loads_the_weights_that_wrote_it(tmp_path, capsys):
    source = bf16_source("tiny-llama", seed=7)
    hf_llama_checkpoint(tmp_path / "hf", source)
    loaded = llm.build_model("tiny-llama", MAX, checkpoint=str(tmp_path / "hf"))
    for key, want in source.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], want), key
    want = prefill_logits(source)
    assert not torch.allclose(prefill_logits(llm.build_model("tiny-llama", MAX)), want)

    path = tmp_path / "ckpt.pte"
    export(capsys, path, "--model", "tiny-llama", "--quantize", "none", "--device", "cpu",
           "--checkpoint", tmp_path / "hf")
    prog = Runtime.get().load_program(str(path), device="cpu")
    try:
        got = prog.load_method("forward").execute([torch.tensor([PROMPT]), torch.tensor([0])])[0]
    finally:
        prog.destroy()
    torch.testing.assert_close(got, want, **tol("model", "cpu"))


def test_qwen3_5_checkpoint_in_the_multimodal_layout_loads_through_executorchs_converter(
        tmp_path):
    from executorch.examples.models.checkpoint import get_mapped_key
    from executorch.examples.models.qwen3_5.convert_weights import _QWEN_3_5_TO_META

    source = bf16_source("tiny-qwen3_5", seed=8)
    to_hf = {v: k for k, v in _QWEN_3_5_TO_META.items()}
    hf = {get_mapped_key(k, to_hf).replace("model.", "model.language_model.", 1): v
          for k, v in source.state_dict().items()
          if not k.endswith(("cache", "state", "freqs_cos", "freqs_sin", "mask"))
          and k != "output.weight"}
    (tmp_path / "hf").mkdir()
    torch.save({k: v.to(torch.bfloat16) for k, v in hf.items()},
               tmp_path / "hf" / "pytorch_model.bin")
    loaded = llm.build_model("tiny-qwen3_5", MAX, checkpoint=str(tmp_path / "hf"))
    for key, want in source.named_parameters():
        assert torch.equal(dict(loaded.named_parameters())[key], want), key
    torch.testing.assert_close(prefill_logits(loaded), prefill_logits(source), rtol=0, atol=0)


def write_safetensors(path, tensors):
    """The safetensors format by hand: u64 header size, JSON header, raw little-endian data."""
    import json
    import struct

    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        raw = t.contiguous().view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": "BF16", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    head = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"".join(blobs))


def safetensors_dir(tmp_path):
    src = tmp_path / "bin"
    hf_llama_checkpoint(src, bf16_source("tiny-llama", seed=7))
    (tmp_path / "st").mkdir()
    write_safetensors(tmp_path / "st" / "model.safetensors",
                      torch.load(src / "pytorch_model.bin", weights_only=True))
    return tmp_path / "st", src


def test_safetensors_checkpoint_loads_like_the_same_weights_as_pytorch_model_bin(tmp_path):
    st, src = safetensors_dir(tmp_path)
    a = llm.build_model("tiny-llama", MAX, checkpoint=str(st)).state_dict()
    b = llm.build_model("tiny-llama", MAX, checkpoint=str(src)).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in b)


# ---- tokenizer ---------------------------------------------------------------------------------
def test_a_tokenizer_json_encodes_the_prompt_and_decodes_the_generated_ids(ptes, tmp_path,
                                                                           capsys):
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = {f"w{i}": i for i in range(128)}
    tok = Tokenizer(models.WordLevel(words, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    code, out, err = cli(capsys, "generate", ptes[("none", "--fuse")], "--prompt",
                         "w3 w17 w42 w99 w5", "--tokenizer", tmp_path / "tokenizer.json",
                         "--new-tokens", 5, "--device", "cpu")
    assert code == 0, err
    assert ids(out, "prompt") == PROMPT
    assert f"text: {tok.decode(ids(out, 'generated'))!r}" in out.splitlines()


# ---- bad arguments: one typed line, exit code 2 ----------------------------------------------
def test_export_llm_bad_arguments_are_one_usage_error_line(tmp_path, capsys):
    base = ["export-llm", "--max-seq-len", MAX, "-o", tmp_path / "x.pte"]
    for extra, fragment in ((["--model", "llama9", "--quantize", "none"], "invalid choice"),
                            (["--model", "tiny-llama", "--quantize", "int3"], "invalid choice"),
                            (["--model", "tiny-llama"], "--quantize"),
                            (["--model", "tiny-llama", "--quantize", "none", "--max-seq-len", "1"],
                             "expected an integer >= 2, got '1'")):
        code, out, err = cli(capsys, *base, *extra)
        assert_one_line_error(code, err, "UsageError", fragment)
        assert out == ""
    code, _, err = cli(capsys, *base, "--model", "tiny-llama", "--quantize", "none",
                       "--checkpoint", tmp_path / "nowhere")
    assert_one_line_error(code, err, "InputError", "expected a directory")
    assert not (tmp_path / "x.pte").exists()


@pytest.mark.parametrize("argv,kind,fragment", [
    (["--tokens", "1,2", "--new-tokens", "0"], "UsageError", "expected an integer >= 1, got '0'"),
    (["--tokens", "1,x", "--new-tokens", "2"], "UsageError", "comma-separated token ids"),
    (["--tokens", "1,-2", "--new-tokens", "2"], "UsageError", "comma-separated token ids"),
    (["--new-tokens", "2"], "UsageError", "one of the arguments"),
    (["--prompt", "hi", "--new-tokens", "2"], "UsageError", "expected --tokenizer"),
    (["--tokens", "1,128", "--new-tokens", "2"], "InputError", "token ids in [0, 128)"),
    (["--prompt-len", str(MAX + 1), "--new-tokens", "1"], "InputError", f"1 to {MAX} tokens"),
    (["--prompt-len", "4", "--new-tokens", str(MAX)], "InputError",
     f"expected 1 to {MAX - 3} after a 4-token prompt"),
])
def test_generate_bad_arguments_are_one_error_line(ptes, capsys, argv, kind, fragment):
    code, out, err = cli(capsys, "generate", ptes[("none", "--fuse")], "--device", "cpu", *argv)
    assert_one_line_error(code, err, kind, fragment)
    assert out == ""


def test_generate_on_a_missing_pte_is_a_clean_error(tmp_path, capsys):
    code, _, err = cli(capsys, "generate", tmp_path / "nope.pte", "--tokens", "1",
                       "--new-tokens", "2")
    assert_one_line_error(code, err, "ProgramError", "nope.pte")


def test_generate_on_a_pte_that_is_not_an_llm_says_what_it_lacks(tmp_path, capsys):
    from delegate.aot import lower

    path = tmp_path / "linear.pte"
    path.write_bytes(lower(torch.nn.Linear(4, 2), (torch.randn(1, 4),), device="cpu").buffer)
    code, _, err = cli(capsys, "generate", path, "--tokens", "1", "--new-tokens", "2",
                       "--device", "cpu")
    assert_one_line_error(code, err, "InputError", "get_vocab_size")


def test_a_file_no_tokenizer_reads_is_an_input_error(ptes, tmp_path, capsys):
    (tmp_path / "tok.model").write_bytes(b"\x00not a tokenizer\xff")
    code, _, err = cli(capsys, "generate", ptes[("none", "--fuse")], "--prompt", "hi",
                       "--tokenizer", tmp_path / "tok.model", "--new-tokens", "2")
    assert_one_line_error(code, err, "InputError", "tok.model")
