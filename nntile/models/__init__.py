from nntile.models.gpt2 import GPT2Config, GPT2LMHead

__all__ = ["GPT2Config", "GPT2LMHead"]
