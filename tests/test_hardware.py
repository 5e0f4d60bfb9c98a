"""The one hardware table: exact-name lookup, the unknown-GPU message, and a complete row for every board."""

from __future__ import annotations

import logging

import pytest
import torch

from ecomkit import hardware
from ecomkit.errors import ConfigError
from ecomkit.hardware import (GPU_ALIASES, GPUS, device_peak, device_peak_flops, find_gpu, gpu_spec, mfu_fields,
                              peak_flops_or_reason, unknown_gpu_message)
from ecomkit.planner.links import GPU_DEFAULT_NODE, LINKS, NODES, link_spec, node_cpu_adam_params_per_s, node_spec
from ecomkit.models.bloom import flops_per_token
from ecomkit.planner.memory import plan_memory

UNKNOWN = "NVIDIA RTX 9999 Ti"


def test_device_names_match_exactly_never_by_substring():
    """"NVIDIA H100 PCIe" contains "H100" but is a different board: it gets the PCIe peak, not the SXM one."""
    pcie, sxm = find_gpu("NVIDIA H100 PCIe"), find_gpu("NVIDIA H100 80GB HBM3")
    assert pcie.key == "h100-pcie" and sxm.key == "h100-80g"
    assert pcie.peak_flops("bf16") == 756e12 and sxm.peak_flops("bf16") == 989e12
    assert find_gpu("NVIDIA H100 NVL").key == "h100-nvl"
    assert find_gpu("NVIDIA H100 PCIe 2") is None      # a longer name is another board, not a match
    assert find_gpu("NVIDIA A10G").key == "a10g" and find_gpu("NVIDIA A10").key == "a10-24g"


def test_lookup_is_case_insensitive_with_explicit_aliases():
    assert find_gpu("nvidia h100 pcie") is find_gpu("NVIDIA H100 PCIE") is GPUS["h100-pcie"]
    assert find_gpu("  A100-40G ") is GPUS["a100-40g"]
    assert gpu_spec("a100") is GPUS["a100-80g"]          # the short flag is an explicit alias
    assert gpu_spec("4090") is gpu_spec("NVIDIA GeForce RTX 4090") is GPUS["rtx4090"]
    assert all(target in GPUS for target in GPU_ALIASES.values())
    assert all(alias == alias.lower() for alias in GPU_ALIASES) and all(k == k.lower() for k in GPUS)


def test_unknown_gpu_is_a_clear_error_for_the_planner():
    with pytest.raises(ConfigError, match="Unknown GPU 'b100'.*hardware.py"):
        gpu_spec("b100")
    with pytest.raises(ConfigError, match="Unknown link"):
        link_spec("nvlink-z")
    assert link_spec("NVLink-A100") is LINKS["nvlink-a100"]


def test_unknown_gpu_gives_no_peak_and_the_message():
    assert unknown_gpu_message(UNKNOWN) == f"MFU not reported: unknown GPU '{UNKNOWN}'; add it to ecomkit/hardware.py"
    assert peak_flops_or_reason(UNKNOWN, "bf16") == (None, unknown_gpu_message(UNKNOWN))
    peak, reason = peak_flops_or_reason("Tesla V100-SXM2-32GB", "bf16")
    assert peak is None and "no bf16" in reason             # never the fp16 peak in place of bf16
    assert peak_flops_or_reason("Tesla V100-SXM2-32GB", "fp16") == (125e12, None)


@pytest.fixture
def fake_gpu(monkeypatch):
    """Pretend a CUDA device with a given name exists (the lookup only needs its name)."""
    def install(name: str) -> torch.device:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
        monkeypatch.setattr(hardware, "_REPORTED", set())
        return torch.device("cuda", 0)
    return install


def test_mfu_of_an_unknown_gpu_is_none_with_the_message_logged_once(fake_gpu, caplog):
    device = fake_gpu(UNKNOWN)
    with caplog.at_level(logging.WARNING, logger="ecomkit"):
        peaks = [device_peak_flops(device, "bf16") for _ in range(3)]
    assert peaks == [None, None, None]
    assert [r.getMessage() for r in caplog.records] == [unknown_gpu_message(UNKNOWN)]
    peak, note = device_peak(device, "bf16")
    assert mfu_fields(1e12, peak, 2, note) == {"mfu": None, "mfu_note": unknown_gpu_message(UNKNOWN)}


def test_mfu_of_a_known_gpu_and_of_a_cpu(fake_gpu):
    assert device_peak_flops(torch.device("cpu"), "bf16") is None
    assert device_peak(torch.device("cpu"), "bf16") == (None, None)
    assert mfu_fields(1e12, None, 1) == {"mfu": None}   # no note: a CPU has no peak
    device = fake_gpu("NVIDIA H100 PCIe")
    peak = device_peak_flops(device, "bf16")
    assert peak == 756e12
    assert mfu_fields(0.5 * 2 * peak, peak, 2) == {"mfu": pytest.approx(0.5)}


@pytest.mark.parametrize("key", list(GPUS))
def test_every_gpu_has_memory_bandwidth_and_peaks_for_its_dtypes(key):
    gpu = GPUS[key]
    assert gpu.key == key and gpu.name
    assert 8 * 2**30 < gpu.memory_bytes < 200 * 2**30 and gpu.hbm_bytes_per_s > 1e11
    for precision in ("fp32", "fp16", "bf16"):
        if gpu.supports(precision):
            assert gpu.peak_flops(precision) > 1e12
    assert gpu.supports("fp32") and gpu.supports("fp16")
    assert gpu.supports("bf16") == (not key.startswith("v100"))        # Volta has no bf16 tensor cores
    if gpu.supports("bf16"):
        assert gpu.peak_flops("bf16") >= gpu.peak_flops("fp32")


def test_the_new_boards_are_in_the_table():
    for key in ("h100-pcie", "h100-nvl", "h800", "l40s", "a10g", "b200"):
        assert key in GPUS
    assert GPUS["h800"].peak_flops("bf16") == GPUS["h100-80g"].peak_flops("bf16")   # only NVLink differs
    assert GPUS["b200"].peak_flops("bf16") == 2250e12                                  # dense, not the sparse 4.5 P


def test_bf16_on_a_gpu_without_bf16_is_a_planner_error():
    with pytest.raises(ConfigError, match="no bf16 tensor cores"):
        plan_memory(model="seqgpt-560m", gpu="v100-32g", precision="bf16")
    assert plan_memory(model="seqgpt-560m", gpu="v100-32g", precision="fp16").total > 0


def test_flops_per_token_is_6_psi_plus_attention():
    assert flops_per_token(1000, 2, 64, 128) == 6 * 1000 + 12 * 2 * 64 * 128


def test_every_node_has_a_layout_its_links_and_a_source():
    for key, node in NODES.items():
        assert node.key == key and node.source and node.host_link in LINKS
        assert node.gpus % node.gpus_per_host_link == 0 and node.host_links >= 1 and node.cpu_cores > 0
        assert node_cpu_adam_params_per_s(node) > 0
    assert all(target in NODES for target in GPU_DEFAULT_NODE.values())
    assert node_spec(None, "a100-40g").key == "dgx-a100" and node_spec(None, "h100-80g").key == "dgx-h100"
    assert node_spec(None, "rtx4090").key == "pcie-server"
    assert NODES["dgx-a100"].host_links == 4                 # four PCIe switches, two A100s behind each uplink
    with pytest.raises(ConfigError, match="Unknown node"):
        node_spec("dgx-z")
