"""The model families, in one place: ``model_type`` (transformers' name, as config.json, our
config files and checkpoints record it) -> the family's config class and model class. Every
program and ``Checkpoint.config`` find a family here; a config or checkpoint that names none
is GPT-2's (what nntile wrote before it had families)."""
from nntile.models.gpt2 import GPT2LMHead
from nntile.models.llama import LlamaLM
from nntile.models.mistral import MistralLM
from nntile.models.qwen2 import Qwen2LM
from nntile.models.qwen3 import Qwen3LM

# each model class names its config class, which names its model_type
FAMILIES = {cls.config_type.model_type: cls
            for cls in (GPT2LMHead, LlamaLM, Qwen2LM, Qwen3LM, MistralLM)}
DEFAULT_MODEL_TYPE = "gpt2"


def _family(model_type):
    if not isinstance(model_type, str) or model_type not in FAMILIES:
        raise ValueError(f"model_type {model_type!r} is not a family nntile has "
                         f"({', '.join(FAMILIES)})")
    return FAMILIES[model_type]


def config_class(model_type):
    """The config class of a family (ValueError for a model_type nntile does not have)."""
    return _family(model_type).config_type


def config_from_dict(data):
    """The config a dict describes: ours (a checkpoint's, nntile-train --config's) or
    transformers' config.json, by its model_type (none: gpt2)."""
    model_type = data.get("model_type") if isinstance(data, dict) else None
    return config_class(model_type or DEFAULT_MODEL_TYPE).from_dict(data)  # checks data


def model_class(model_type):
    """The model class of a family; NotImplementedError (with the reason) for a family whose
    layers are not all written yet, before anything is built."""
    cls = _family(model_type)
    if cls.block_type is None or cls.norm_type is None:
        raise NotImplementedError(f"the {cls.config_type.name} block is not implemented yet: "
                                  f"nntile runs {', '.join(trainable())} for now")
    return cls


def trainable():
    """The model types whose models can be built."""
    return [t for t, cls in FAMILIES.items()
            if cls.block_type is not None and cls.norm_type is not None]
