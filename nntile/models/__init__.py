from nntile.models.config import GPT2Config
from nntile.models.gpt2 import GPT2LMHead

__all__ = ["GPT2Config", "GPT2LMHead"]
