"""Chapter 07: provoke the CPU-reproducible errors of the catalogue for real, and show what each one says.

A catalogue entry helps only if its patterns match the text this torch and gloo print, so each is provoked here.
"""

from __future__ import annotations

import datetime as _dt
import os
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.distributed as dist

from ecomkit.dist import free_port
from ecomkit.faults.known_errors import KNOWN_ERRORS
from ecomkit.faults.safe_load import load_weights_file
from ecomkit.models.bloom import build_model
from ecomkit.models.tokenizer import add_ecom_special_tokens, get_tokenizer, resize_embeddings_for

@dataclass
class Reproduction:
    """What happened when an error was provoked on purpose."""

    key: str
    reproduced: bool
    error_type: str | None
    message: str
    seconds: float
    fixed: str | None = None       # what the fix did, when the reproduction also applies it

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _capture(key: str, action: Callable[[], Any]) -> Reproduction:
    t0 = time.perf_counter()
    try:
        action()
    except Exception as exc:  # the point: show the error text people see
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return Reproduction(key, True, type(exc).__name__, first, round(time.perf_counter() - t0, 3))
    return Reproduction(key, False, None, "no error was raised", round(time.perf_counter() - t0, 3))


def reproduce_oom(device: str | torch.device = "cpu", nbytes: int = 1 << 50) -> Reproduction:
    """Ask for one block bigger than any machine (1 PiB): the allocator's out-of-memory error, instantly."""
    return _capture("oom", lambda: torch.empty(nbytes, dtype=torch.uint8, device=device))


def reproduce_port_in_use() -> Reproduction:
    """Two rendezvous servers (TCPStore, what torchrun starts on --master_port) on one port."""
    port = free_port()
    first = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    try:
        return _capture("address_in_use", lambda: dist.TCPStore("127.0.0.1", port, is_master=True,
                                                                wait_for_workers=False))
    finally:
        del first


def reproduce_world_size_mismatch(timeout_s: float = 3.0) -> Reproduction:
    """A rendezvous told to expect 3 processes (WORLD_SIZE=3) that only 2 join: it times out, naming 2/3."""
    port = free_port()
    timeout = _dt.timedelta(seconds=timeout_s)
    clients: list[Any] = []

    def join() -> None:
        time.sleep(0.2)
        clients.append(dist.TCPStore("127.0.0.1", port, world_size=3, is_master=False, timeout=timeout))

    t = threading.Thread(target=join, daemon=True)
    t.start()
    rep = _capture("world_size_mismatch", lambda: dist.TCPStore("127.0.0.1", port, world_size=3, is_master=True,
                                                                timeout=timeout, wait_for_workers=True))
    t.join(timeout_s + 5)
    clients.clear()
    return rep


DEMO_NEW_TOKENS = ("<新品>", "<秒杀>")  # "new arrival", "flash sale": tags a shop might add


def reproduce_embedding_mismatch(tokenizer: Any = None, model_preset: str = "tiny") -> Reproduction:
    """Add tokens to the tokenizer, forget to resize the embeddings, run a forward; then apply the fix."""
    tok = tokenizer if tokenizer is not None else get_tokenizer("local")
    model = build_model(model_preset, vocab_size=len(tok))
    rows_before = model.get_input_embeddings().weight.shape[0]
    added = add_ecom_special_tokens(tok) + tok.add_tokens(list(DEMO_NEW_TOKENS))
    batch = tok(f"Apple iPhone 15 SKU-123 ® {DEMO_NEW_TOKENS[0]}", return_tensors="pt")
    rep = _capture("vocab_mismatch", lambda: model(**batch))
    rows_after = resize_embeddings_for(model, tok)
    logits = model(**batch).logits
    rep.fixed = (f"{added} token(s) added, max id {int(batch['input_ids'].max())} vs {rows_before} embedding rows; "
                 f"after resize_embeddings_for: {rows_after} rows, forward OK (logits {tuple(logits.shape)})")
    return rep


class _RunsCode:
    """What an attacker would put into a checkpoint: unpickling it calls ``print`` (could be ``os.system``)."""

    def __reduce__(self):
        return (print, ("!!! code from the checkpoint ran !!!",))


def reproduce_unsafe_checkpoint(directory: str | os.PathLike) -> Reproduction:
    """Write a .pt whose unpickling would call a function, then load it the safe way: refused."""
    path = Path(directory) / "untrusted.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"weight": torch.zeros(2), "payload": _RunsCode()}, path)
    return _capture("unsafe_checkpoint", lambda: load_weights_file(path))


def reproduce_cpu_errors(workdir: str | os.PathLike, tokenizer: Any = None) -> list[Reproduction]:
    """Every CPU-reproducible entry of the catalogue, in catalogue order."""
    return [reproduce_oom(), reproduce_port_in_use(), reproduce_world_size_mismatch(),
            reproduce_embedding_mismatch(tokenizer), reproduce_unsafe_checkpoint(workdir)]



def reproduction_table(reproductions: Sequence[Reproduction],
                       seen_elsewhere: Mapping[str, str] | None = None) -> list[dict[str, str]]:
    """The catalogue as rows, each with the message reproduced here (or seen in another demo, or "—").

    ``seen_elsewhere`` maps a catalogue key to a message observed outside
    :func:`reproduce_cpu_errors` (the collective timeout of the stall demo).
    """
    by_key = {r.key: r for r in reproductions}
    seen = dict(seen_elsewhere or {})
    rows = []
    for e in KNOWN_ERRORS:
        rep = by_key.get(e.key)
        here = f"{rep.error_type}: {rep.message[:160]}" if rep and rep.reproduced else seen.get(e.key, "—")
        if rep is not None and rep.fixed:
            here += f" → fix applied: {rep.fixed}"
        rows.append({"error": e.title, "message seen here": here, "cause": e.cause, "fix": e.fix})
    return rows


__all__ = [
    "DEMO_NEW_TOKENS", "Reproduction", "reproduce_cpu_errors", "reproduce_embedding_mismatch",
    "reproduce_oom", "reproduce_port_in_use", "reproduce_unsafe_checkpoint", "reproduce_world_size_mismatch",
    "reproduction_table",
]
