"""Real weights: a ``save_pretrained`` checkpoint read one tensor at a time (no mapped files), or the hub's.

Why not ``safe_open`` or ``from_pretrained``: read pages of a mapped file count as resident until it closes, so a
7B load would hold 14-28 GB. This parses the safetensors header and ``readinto``s each tensor into a fresh one;
single files and sharded indexes are both read. A preset's run loads none of this (``models.bloom.load_model``).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import json
import os
import socket
import struct
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import torch
from transformers import (AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig, PreTrainedModel,
                          PreTrainedTokenizerBase)

from ecomkit.errors import ModelNotFoundError
from ecomkit.models.bloom import PRESETS, ModelSource, build_empty_model

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"

SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor lives: its file, dtype, shape and absolute byte range in that file."""

    file: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int
    end: int


def _read_header(path: Path) -> dict[str, TensorEntry]:
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    entries = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        if meta["dtype"] not in SAFETENSORS_DTYPES:
            raise ModelNotFoundError(f"{path}: tensor '{name}' has dtype {meta['dtype']}, which ecomkit's checkpoint "
                                     f"reader does not handle ({', '.join(SAFETENSORS_DTYPES)}).")
        begin, end = meta["data_offsets"]
        entries[name] = TensorEntry(path, SAFETENSORS_DTYPES[meta["dtype"]], tuple(meta["shape"]),
                                    8 + length + begin, 8 + length + end)
    return entries


# glibc's malloc: above this size an allocation is its own mapping, returned to the OS when freed.
_LOAD_MMAP_THRESHOLD = 128 * 1024
_AFTER_LOAD_MMAP_THRESHOLD = 32 * 1024 * 1024   # the ceiling glibc's own dynamic threshold reaches on 64-bit
_M_MMAP_THRESHOLD = -3


@contextlib.contextmanager
def freed_memory_returned():
    """While loading, make freed host buffers go back to the OS at once (glibc; elsewhere a no-op).
    Why: a sharded load frees whole tensors after keeping slices; once glibc raises its mmap threshold the holes
    stay in the heap. A fixed 128 KiB threshold returns them; afterwards it is set to 32 MiB for training."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):   # not glibc (macOS, musl): nothing to tune
        yield
        return
    mallopt(_M_MMAP_THRESHOLD, _LOAD_MMAP_THRESHOLD)
    try:
        yield
    finally:
        mallopt(_M_MMAP_THRESHOLD, _AFTER_LOAD_MMAP_THRESHOLD)


def has_safetensors(model_dir: str | os.PathLike) -> bool:
    """True when ``model_dir`` holds ``model.safetensors`` or a sharded index (what this reader reads)."""
    d = Path(model_dir)
    return (d / INDEX_FILE).is_file() or (d / SINGLE_FILE).is_file()


class CheckpointReader:
    """Tensor names, shapes and values of a local safetensors checkpoint, read one tensor per call."""

    def __init__(self, model_dir: str | os.PathLike):
        d = Path(model_dir)
        if (d / INDEX_FILE).is_file():
            weight_map = json.loads((d / INDEX_FILE).read_text())["weight_map"]
            files = sorted(set(weight_map.values()))
        elif (d / SINGLE_FILE).is_file():
            files = [SINGLE_FILE]
        else:
            raise ModelNotFoundError(
                f"'{model_dir}' holds no {SINGLE_FILE} and no {INDEX_FILE}. Sharded loading reads safetensors "
                "only: re-save the model with save_pretrained(dir) (safetensors is its default format).")
        self.entries: dict[str, TensorEntry] = {}
        for name in files:
            self.entries.update(_read_header(d / name))

    def names(self) -> list[str]:
        return list(self.entries)

    def resolve(self, name: str, prefix: str = "") -> str | None:
        """The checkpoint key for model parameter ``name``: as is, or without the base-model prefix (bare
        ``BloomModel`` files name tensors ``h.0...``, not ``transformer.h.0...``)."""
        if name in self.entries:
            return name
        if prefix and name.startswith(prefix + "."):
            short = name[len(prefix) + 1:]
            return short if short in self.entries else None
        return None

    def read(self, key: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        """A fresh tensor with the values of ``key`` (converted to ``dtype`` if given); nothing stays mapped."""
        e = self.entries[key]
        out = torch.empty(e.shape, dtype=e.dtype)
        if e.end > e.start:
            with open(e.file, "rb") as f:
                f.seek(e.start)
                view = out.view(-1).view(torch.uint8).numpy()  # the raw bytes of any dtype, bf16 included
                if f.readinto(memoryview(view)) != e.end - e.start:
                    raise ModelNotFoundError(f"{e.file}: tensor '{key}' is truncated (the file is shorter than its "
                                             "header says). Re-copy or re-save the checkpoint.")
        return out if dtype is None or dtype == out.dtype else out.to(dtype)

    def largest_tensor_bytes(self) -> int:
        return max((e.end - e.start for e in self.entries.values()), default=0)


def read_into(model: torch.nn.Module, reader: CheckpointReader) -> None:
    """Copy every parameter and buffer of ``model`` from ``reader``, one tensor at a time, converted on the host.
    A tied parameter is read once; a parameter the checkpoint lacks is an error naming it, not a random init."""
    prefix = getattr(model, "base_model_prefix", "")
    seen: set[int] = set()
    missing = []
    with torch.no_grad():
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            if id(tensor) in seen:
                continue
            seen.add(id(tensor))
            key = reader.resolve(name, prefix)
            if key is None:
                if isinstance(tensor, torch.nn.Parameter):
                    missing.append(name)
                continue          # a buffer need not be saved (non-persistent: made at construction)
            tensor.copy_(reader.read(key, dtype=tensor.dtype))
    if missing:
        raise ModelNotFoundError(f"The checkpoint has no tensor for {missing[:5]}{' ...' if len(missing) > 5 else ''} "
                                 f"({len(missing)} in all); it was saved from a different architecture. "
                                 "Check --model.")


def load_local_checkpoint(path: str | os.PathLike, *, device: str | torch.device = "cpu",
                          dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """A local safetensors checkpoint, whole, in ``dtype`` on ``device``: made empty there, then read one tensor
    at a time (:class:`CheckpointReader`).

    Why not ``from_pretrained``: its mapped pages count as this process's memory, so a bf16 load of an fp32
    checkpoint also holds the fp32 bytes; here a process holds the model plus one stored tensor.
    """
    model = build_empty_model(ModelSource(str(path), dtype=dtype), device=device)
    with freed_memory_returned():
        read_into(model, CheckpointReader(path))
    if (Path(path) / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(path)
    model.config.name_or_path = str(path)
    return model.eval()


def hub_reachable() -> bool:
    """Cheap offline check: ``HF_HUB_OFFLINE`` or a hub host name that does not resolve.
    Why: ``from_pretrained`` retries for ~30 s before failing; this gives the actionable message at once."""
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        return False
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    try:
        socket.getaddrinfo(host, 443)
    except OSError:
        return False
    return True


def load_from_hub(hub_id: str, *, device, dtype, trust_remote_code: bool) -> PreTrainedModel:
    """``from_pretrained`` from the hub, turning 'no network' into one actionable paragraph."""
    offline = not hub_reachable()
    try:
        AutoConfig.from_pretrained(hub_id, trust_remote_code=trust_remote_code, local_files_only=offline)
        model = AutoModelForCausalLM.from_pretrained(
            hub_id, dtype=dtype, trust_remote_code=trust_remote_code, local_files_only=offline)
    except (OSError, ValueError) as exc:
        raise ModelNotFoundError(
            f"Could not load '{hub_id}' from the Hugging Face hub ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:200]}). This machine may be offline. On a machine with "
            f"internet run `huggingface-cli download {hub_id} --local-dir ./models/{hub_id.split('/')[-1]}`, "
            "copy that folder here, and pass its path as --model. To test the code paths without "
            f"weights use a preset: {', '.join(PRESETS)}.") from None
    return model.to(device)


def hub_tokenizer(name: str, cache_dir: str | os.PathLike | None) -> PreTrainedTokenizerBase:
    """A hub tokenizer (pad = eos where it has no pad), its failure turned into the offline advice."""
    try:
        tok = AutoTokenizer.from_pretrained(name, cache_dir=str(cache_dir) if cache_dir else None)
    except (OSError, ValueError) as exc:
        raise ModelNotFoundError(
            f"Could not load the tokenizer '{name}' from the Hugging Face hub or its local cache "
            f"({type(exc).__name__}). Without internet access, set HF_HUB_OFFLINE=1 (so nothing waits on the network), "
            f"download the model on a machine with internet (e.g. `huggingface-cli download {name} "
            f"--local-dir ./{name.split('/')[-1]}`), copy the folder here and pass that local directory; "
            f"or use 'synthetic' for the locally trained tokenizer."
        ) from exc
    if tok.pad_token is None and tok.eos_token is not None:
        tok.pad_token = tok.eos_token
    return tok
