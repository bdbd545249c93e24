"""Corruption is detected at load: each weight's bytes are checked against their named-data
key (load option verify), once per process per Program."""
import pytest
import torch

from delegate import integrity
from delegate.aot import lower
from delegate.errors import BlobError, ProgramError
from delegate.runtime import Runtime
from delegate.runtime.program import read_pte


class _Wide(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(300, 301)   # a 361 KB weight: fast mode samples it

    def forward(self, x):
        return self.fc(x).relu()


@pytest.fixture(scope="module")
def pte() -> bytes:
    return lower(_Wide(), (torch.randn(2, 300),), device="cpu").buffer


def _weight_range(pte: bytes) -> tuple:
    """(offset, length) of the largest named weight's bytes inside the .pte."""
    named = read_pte(pte).named_data
    bufs = [named.buffers[e.buffer_index] for e in named.pte_data.values()]
    data = max((b if isinstance(b, bytes) else b.to_bytes() for b in bufs), key=len)
    off = pte.find(data)
    assert off > 0 and pte.find(data, off + 1) == -1
    return off, len(data)


def _flip(pte: bytes, at: int) -> bytes:
    return pte[:at] + bytes([pte[at] ^ 0x08]) + pte[at + 1:]


def _load(pte: bytes, **options):
    prog = Runtime.get().load_program(pte, device="cpu", options=options)
    return prog, prog.load_method("forward")


@pytest.mark.parametrize("verify", [None, "auto", "full"])
def test_a_flipped_weight_byte_raises_blob_error_naming_the_key(pte, verify):
    off, n = _weight_range(pte)
    options = {} if verify is None else {"verify": verify}
    with pytest.raises(BlobError, match=r"weight etwgpu\.[0-9a-f]{64}\.[0-9a-f]{8}: expected "
                                        r"bytes whose sha256 is"):
        _load(_flip(pte, off + n // 3), **options)


def test_fast_mode_catches_a_change_in_a_sampled_block_and_misses_one_between(pte):
    off, n = _weight_range(pte)
    step = n // integrity.SAMPLE_BLOCKS
    with pytest.raises(BlobError, match="sampled-block CRC32"):
        _load(_flip(pte, off + step + 7), verify="fast")
    _load(_flip(pte, off + step + integrity.BLOCK + 7), verify="fast")  # documented blind spot


def test_off_checks_sizes_only(pte):
    off, n = _weight_range(pte)
    _, method = _load(_flip(pte, off + 5), verify="off")
    assert method.execute([torch.randn(2, 300)])[0].shape == (2, 301)


def test_a_clean_program_runs_in_every_mode(pte):
    x = torch.randn(2, 300)
    want = _Wide()(x)
    for verify in integrity.VERIFY_MODES:
        _, method = _load(pte, verify=verify)
        torch.testing.assert_close(method.execute([x])[0], want)


def test_an_unknown_verify_option_raises_program_error(pte):
    with pytest.raises(ProgramError, match="verify: expected one of .*got 'sometimes'"):
        _load(pte, verify="sometimes")


def test_weights_are_hashed_once_per_program(pte, monkeypatch):
    calls = []
    real = integrity._sha256
    monkeypatch.setattr(integrity, "_sha256", lambda *a: calls.append(1) or real(*a))
    prog, _ = _load(pte)
    first = len(calls)
    assert first >= 1
    prog.load_method("forward")
    assert len(calls) == first, "a second load of the same Program rehashed"
    _load(pte)
    assert len(calls) == 2 * first, "a new Program (new bytes) must be hashed again"


def test_auto_is_full_up_to_the_threshold_then_fast():
    assert integrity.resolve_mode("auto", integrity.FULL_VERIFY_BYTES) == "full"
    assert integrity.resolve_mode("auto", integrity.FULL_VERIFY_BYTES + 1) == "fast"
    assert integrity.resolve_mode("off", 10) == "off"


def test_the_sampled_crc_reads_a_bounded_number_of_bytes():
    big = bytearray(64 * 2 ** 20)
    before = integrity.sampled_crc32(big)
    big[integrity.BLOCK * 2] = 1   # between samples
    assert integrity.sampled_crc32(big) == before
    big[-1] = 1                    # the last block is always read (truncation, tail)
    assert integrity.sampled_crc32(big) != before


def test_the_key_covers_dtype_and_shape():
    data = bytes(24)
    keys = {integrity.weight_key(data, torch.float32, (2, 3)),
            integrity.weight_key(data, torch.float32, (3, 2)),
            integrity.weight_key(data, torch.int32, (2, 3))}
    assert len(keys) == 3
