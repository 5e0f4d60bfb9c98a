"""Reading checkpoints without running code from them: DCP metadata, DCP non-tensor entries, single files.

Why: DCP reads ``.metadata`` with ``pickle.load`` and non-tensor entries with ``torch.load(weights_only=False)``, so a
crafted checkpoint runs code on load; here each goes through an allow-list and is refused with a reason.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file as load_safetensors_file
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import StorageMeta

from ecomkit.errors import EcomkitError

METADATA = ".metadata"  # DCP's global metadata file, written last by the coordinator rank


class UnsafeCheckpointError(EcomkitError):
    """A checkpoint file asked to unpickle something other than tensors and plain data."""


_SAFE_GLOBALS = {
    ("torch", "Size"), ("torch.serialization", "_get_layout"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.distributed.checkpoint.filesystem", "_StoragePrefix"),
    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"), ("collections", "OrderedDict"), ("builtins", "set"), ("builtins", "frozenset"),
}
_SAFE_CLASS_MODULES = ("torch.distributed.checkpoint.metadata",)


class _MetadataUnpickler(pickle.Unpickler):
    """Only DCP's metadata dataclasses, torch dtypes/sizes and paths: nothing that can run code."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _SAFE_GLOBALS:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if module in _SAFE_CLASS_MODULES:
            obj = super().find_class(module, name)
            if isinstance(obj, type) and obj.__module__ == module:
                return obj
        raise UnsafeCheckpointError(
            f"refusing to load checkpoint metadata that references {module}.{name}: a DCP .metadata file only "
            "holds DCP's own metadata classes, so this file was crafted or corrupted. Never load checkpoints from "
            "an untrusted source; if you wrote this file yourself, re-save it with this version of ecomkit.")


class SafeFileSystemReader(FileSystemReader):
    """DCP's filesystem reader with an allow-list unpickler for ``.metadata`` (upstream uses ``pickle.load``)."""

    def read_metadata(self, *args: Any, **kwargs: Any):
        rank = kwargs.get("rank")
        name = METADATA if rank is None else f"__{rank}{METADATA}"
        path = Path(str(self.path)) / name
        try:
            with open(path, "rb") as fh:
                metadata = _MetadataUnpickler(fh).load()
        except FileNotFoundError:
            raise EcomkitError(f"{path} does not exist: {path.parent} is not a complete DCP checkpoint "
                               "(it was probably interrupted while being written).") from None
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """Non-tensor entries (optimizer hyper-parameters, ...) are loaded with ``weights_only=True``."""

    def load_bytes(self, read_item, value) -> None:
        try:
            obj = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as exc:
            raise UnsafeCheckpointError(
                f"refusing to unpickle checkpoint entry '{read_item.dest_index.fqn}': it holds more than tensors "
                f"and plain Python values (torch.load(weights_only=True) said: {str(exc).splitlines()[0]}). "
                "Never load checkpoints from an untrusted source.") from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


def load_weights_file(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Load a single weights file safely: safetensors, or ``torch.load(weights_only=True)`` for .pt/.bin."""
    path = Path(path)
    if path.suffix == ".safetensors":
        return load_safetensors_file(str(path))
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise UnsafeCheckpointError(
            f"refusing to load {path}: it contains pickled Python objects that are not tensors or plain data "
            f"(torch.load(weights_only=True) said: {str(exc).splitlines()[0]}). Loading it with "
            "weights_only=False would run whatever code the file names; only do that for a file you made "
            "yourself, and prefer safetensors.") from None


__all__ = ["METADATA", "SafeFileSystemReader", "SafeLoadPlanner", "UnsafeCheckpointError", "load_weights_file"]
