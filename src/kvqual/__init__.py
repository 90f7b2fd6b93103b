"""kvqual: is the faster serving config (e.g. an fp8 KV cache) as good as the baseline?"""

__version__ = "0.1.0"

__all__ = ["__version__"]
