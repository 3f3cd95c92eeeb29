"""ember: a fast, correct LLM inference engine whose KV state is durable."""
from ember.sampling_params import SamplingParams

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "__version__"]


def __getattr__(name: str):
    # keep `import ember` light: torch and the engine load on first use of LLM
    if name == "LLM":
        from ember.llm import LLM
        return LLM
    raise AttributeError(f"module 'ember' has no attribute {name!r}")
