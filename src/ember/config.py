"""Validated configuration records for the model, the KV cache and the scheduler."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16, "half": torch.float16}
# the KV pool's element type besides the model's own ("auto"): fp8 (OCP e4m3, as vLLM's --kv-cache-dtype fp8) stores
# keys and values unscaled, saturated at +-448, and attention computes in the model dtype; half the bytes per token
KV_CACHE_DTYPES = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn}


def parse_dtype(dtype: str | torch.dtype | None, device: torch.device, hf_cfg: dict) -> torch.dtype:
    """'auto' -> the checkpoint dtype on GPU, float32 on CPU unless the checkpoint is bf16 (CPU bf16 is fast)."""
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise ValueError(f"unsupported dtype {dtype}; supported: float32, bfloat16, float16")
        return dtype
    if dtype in (None, "auto"):
        name = hf_cfg.get("dtype") or hf_cfg.get("torch_dtype") or "float32"
        resolved = DTYPES.get(str(name), torch.float32)
        return resolved if device.type == "cuda" or resolved == torch.bfloat16 else torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"unsupported dtype {dtype!r}; supported: auto, {', '.join(sorted(DTYPES))}")
    return DTYPES[dtype]


def resolve_device(device: str | torch.device | None) -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {str(device)!r} requested but CUDA is not available; use device='cpu'")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"unsupported device {str(device)!r}; supported: cpu, cuda, auto")
    return dev


def default_max_num_batched_tokens(device: torch.device, online: bool = False) -> int:
    """The scheduler's token budget per step when none is given: on CPU 2048; on a GPU with at least 70 GiB
    (H100/H200 class) 32768 for offline batches (`LLM.generate`) and 8192 for a server, on smaller GPUs 8192 /
    2048 (vLLM's, except the offline 32768 where vLLM takes 16384). A bigger budget prefills more prompts per step:
    fewer steps that mix prefill with running decodes, and larger GEMMs. On an H200, 256 prompts of 128 tokens
    prefilled in one step instead of three took 730 ms instead of 778, +1.0% end to end (benchmarks/NOTES-gpu.md,
    v12). The runner keeps memory for the step's activations out of the cache budget (activation_reserve). A server
    keeps it lower so that one step's prefill delays running streams less."""
    if device.type != "cuda":
        return 2048
    big = torch.cuda.get_device_properties(device).total_memory >= 70 * 2**30
    return (8192 if big else 2048) if online else (32768 if big else 8192)


def default_max_num_seqs(device: torch.device) -> int:
    """The most sequences in one step when none is given: 256 on a GPU (vLLM's default below 70 GiB; ember's CUDA
    graphs cover up to 256 rows), 64 on CPU. A default also gives way to memory: the runner halves it while the
    per-sequence caches (hybrid models' recurrent state, sliding windows) would take over a quarter of the cache
    budget (`CacheConfig.fit_max_num_seqs`)."""
    return 256 if device.type == "cuda" else 64


def read_hf_config(model_dir: Path) -> dict:
    if not model_dir.is_dir():
        raise FileNotFoundError(f"model directory {str(model_dir)!r} does not exist")
    path = model_dir / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{str(model_dir)!r} is not a Hugging Face model directory: config.json is missing")
    try:
        cfg = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(cfg, dict) or "model_type" not in cfg:
        raise ValueError(f"{path} has no 'model_type' field")
    # multimodal wrappers keep the language model config nested
    return {**cfg["text_config"], "model_type": cfg["text_config"].get("model_type", cfg["model_type"]),
            "_outer_model_type": cfg["model_type"]} if "text_config" in cfg else cfg


@dataclass(slots=True)
class ModelConfig:
    model: str
    hf_config: dict
    dtype: torch.dtype
    device: torch.device
    max_model_len: int
    load_format: str = "safetensors"  # or "dummy": random weights in the real shapes
    seed: int = 0

    @classmethod
    def from_dir(cls, model: str | Path, dtype=None, device=None, max_model_len: int | None = None,
                 load_format: str = "safetensors", seed: int = 0) -> "ModelConfig":
        if load_format not in ("safetensors", "dummy"):
            raise ValueError(f"unsupported load_format {load_format!r}; supported: safetensors, dummy")
        path = Path(model).expanduser()
        hf = read_hf_config(path)
        dev = resolve_device(device)
        limit = hf.get("max_position_embeddings") or 4096
        if max_model_len is not None and not 0 < max_model_len <= limit:
            raise ValueError(f"max_model_len={max_model_len} must be in [1, {limit}] (max_position_embeddings)")
        return cls(str(path), hf, parse_dtype(dtype, dev, hf), dev, max_model_len or limit, load_format, seed)

    @property
    def model_type(self) -> str:
        return self.hf_config["model_type"]


@dataclass(slots=True)
class CacheConfig:
    block_size: int = 16
    kv_cache_gb: float | None = None  # None: from free memory (GPU) or a default (CPU)
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = True
    num_blocks: int | None = None  # set by the runner once sized
    # hybrid models' recurrent-state slots: one per running request plus prefix-cache snapshots (engine-set)
    num_state_slots: int | None = None
    # the scheduler's limits (engine-set), which bound what sliding-window layers can hold at once
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    # engine-set when max_num_seqs is a default: the runner may lower it (and the state slots with it) to fit
    fit_max_num_seqs: bool = False
    # set when max_num_batched_tokens is a default: the runner may lower it while a step's activations would crowd
    # out the cache (ModelRunner._fit_max_num_batched_tokens)
    fit_max_num_batched_tokens: bool = False
    # hybrid models' recurrent state matrix (Gated DeltaNet): float32 (as transformers keeps it), or bfloat16 /
    # float16 / auto (the model dtype) for half the state memory and traffic; updates are computed in float32 either
    # way, the state is rounded where it is stored (vLLM's --mamba-ssm-cache-dtype)
    ssm_state_dtype: str = "float32"
    # the KV pool's dtype: auto (the model dtype) or fp8 (KV_CACHE_DTYPES)
    kv_cache_dtype: str = "auto"

    def __post_init__(self) -> None:
        if self.block_size not in (8, 16, 32, 64, 128):
            raise ValueError(f"block_size={self.block_size}; allowed: 8, 16, 32, 64, 128")
        if self.kv_cache_gb is not None and self.kv_cache_gb <= 0:
            raise ValueError(f"kv_cache_gb={self.kv_cache_gb} must be > 0")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization={self.gpu_memory_utilization} must be in (0, 1]")
        if self.ssm_state_dtype != "auto" and self.ssm_state_dtype not in DTYPES:
            raise ValueError(f"unsupported ssm_state_dtype {self.ssm_state_dtype!r}; "
                             f"supported: auto, {', '.join(sorted(DTYPES))}")
        if self.kv_cache_dtype != "auto" and self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"unsupported kv_cache_dtype {self.kv_cache_dtype!r}; "
                             f"supported: auto, {', '.join(KV_CACHE_DTYPES)}")

    def kv_dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        """The KV pool's dtype for a model in model_dtype."""
        return model_dtype if self.kv_cache_dtype == "auto" else KV_CACHE_DTYPES[self.kv_cache_dtype]

    def state_dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        """The recurrent state matrix's dtype for a model in model_dtype."""
        return model_dtype if self.ssm_state_dtype == "auto" else DTYPES[self.ssm_state_dtype]


@dataclass(slots=True)
class SchedulerConfig:
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int = 4096
    long_prefill_token_threshold: int = 0  # >0 caps one request's share of a step's budget
    # schedule step n+1 while the device runs step n (its samples are placeholders until then); False: serial
    async_scheduling: bool = True

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs={self.max_num_seqs} must be >= 1")
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens={self.max_num_batched_tokens} must be >= 1")


@dataclass(slots=True)
class EngineConfig:
    model: ModelConfig
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
