"""Architectures by HF `model_type`. Imports are lazy so one broken model file never blocks the others."""
from __future__ import annotations

import importlib

_MODELS: dict[str, tuple[str, str]] = {
    "gemma4": ("ember.models.gemma4", "Gemma4ForCausalLM"),
    "gemma4_text": ("ember.models.gemma4", "Gemma4ForCausalLM"),
    "llama": ("ember.models.llama", "LlamaForCausalLM"),
    "mistral": ("ember.models.mistral", "MistralForCausalLM"),
    "qwen2": ("ember.models.qwen2", "Qwen2ForCausalLM"),
    "qwen3": ("ember.models.qwen3", "Qwen3ForCausalLM"),
    "qwen3_5": ("ember.models.qwen3_5", "Qwen3_5ForCausalLM"),
    "qwen3_5_text": ("ember.models.qwen3_5", "Qwen3_5ForCausalLM"),
}


def supported_model_types() -> list[str]:
    return sorted(_MODELS)


def register_model(model_type: str, module: str, class_name: str) -> None:
    _MODELS[model_type] = (module, class_name)


def get_model_class(model_type: str):
    if model_type not in _MODELS:
        raise ValueError(f"unsupported model_type {model_type!r}; supported: {', '.join(supported_model_types())}")
    module, name = _MODELS[model_type]
    return getattr(importlib.import_module(module), name)


def model_args(cls, hf_config: dict):
    """The architecture's args from config.json; a missing required key is a clear error, not a KeyError."""
    try:
        return cls.args_from_hf(hf_config)
    except KeyError as e:
        raise ValueError(f"config.json (model_type {hf_config.get('model_type')!r}) lacks the required key "
                         f"{e.args[0]!r}") from None
