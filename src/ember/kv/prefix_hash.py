"""Chained block hashes for prefix caching. Block i's hash covers its tokens and, through its parent, every
token before it; the root is a namespace, so KV from another model, dtype, KV codec, tokenizer or adapter
never matches. Built in this one place for the GPU pool, the host/SSD tiers and checkpoints alike."""
from __future__ import annotations

import hashlib
import json
from array import array
from pathlib import Path
from typing import Sequence

import xxhash

FORMAT_VERSION = 1


def cache_namespace(model_fingerprint: str, dtype: str, kv_codec: str = "none", tokenizer_fingerprint: str = "",
                    adapter: str = "") -> bytes:
    key = json.dumps([FORMAT_VERSION, model_fingerprint, dtype, kv_codec, tokenizer_fingerprint, adapter])
    return hashlib.sha256(key.encode()).digest()[:16]


def hash_block(parent: bytes, token_ids: Sequence[int]) -> bytes:
    """xxh3-128 of the parent hash, then the token ids as native int64 (array 'q' is numpy's int64 bytes,
    ~0.3 us faster than a numpy round trip for a 16-token list)."""
    h = xxhash.xxh3_128(parent)
    h.update(array("q", token_ids).tobytes())
    return h.digest()


def hash_blocks(root: bytes, token_ids: Sequence[int], block_size: int, start_parent: bytes | None = None,
                start_block: int = 0) -> list[bytes]:
    """Hashes of the full blocks of token_ids from block index start_block on."""
    parent = root if start_parent is None else start_parent
    hashes = []
    for b in range(start_block, len(token_ids) // block_size):
        parent = hash_block(parent, token_ids[b * block_size:(b + 1) * block_size])
        hashes.append(parent)
    return hashes


def file_fingerprint(model_dir: str | Path, extra: str = "") -> str:
    """Identity of a checkpoint: config plus each weight file's name, size and safetensors header."""
    d = Path(model_dir)
    h = hashlib.sha256(extra.encode())
    for name in ["config.json", *sorted(p.name for p in d.glob("*.safetensors"))]:
        path = d / name
        if not path.is_file():
            continue
        h.update(name.encode() + str(path.stat().st_size).encode())
        with path.open("rb") as f:
            h.update(f.read(1 << 16))  # config, or the safetensors header (tensor names, shapes, offsets)
    return h.hexdigest()[:32]
