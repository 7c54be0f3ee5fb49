"""Mistral on StarPU against transformers' MistralForCausalLM (Llama with a sliding window):
logits, loss and every gradient with a window shorter than the sequence, not a multiple of the
sequence tile, fused and unfused; and its config. The programs on a Mistral directory run in
tests/test_llama_programs.py; tests/test_llama.py says how the float64 reference is made."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

from nntile.models import FAMILIES, config_from_dict
from nntile.models.mistral import MistralLM
from nntile.models.mistral_config import MistralConfig
from tests.test_gpt2 import check_against
from tests.test_llama import B, PARTIAL, T, V, hf_loss_and_grads, reference_model, tokens

BASE = dict(vocab_size=V, num_hidden_layers=2, max_position_embeddings=32, rms_norm_eps=1e-5)
# Each case: transformers' config fields and our tiles; the sequence is T = 19 tokens
CASES = {
    # window 5 < 19, not a multiple of the sequence tile 7; GQA 4:1 with kv head tiles of 1
    "window 5, gqa, tied, partial": (
        dict(hidden_size=64, intermediate_size=96, num_attention_heads=8,
             num_key_value_heads=2, tie_word_embeddings=True, sliding_window=5),
        dict(PARTIAL, head=4)),
    # window 8, whole tiles (one sequence tile), untied
    "window 8, mha, untied, whole": (
        dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=4,
             sliding_window=8),
        {}),
}


def hf_model(case, dtype):
    torch.manual_seed(0)
    fields = dict(dict(BASE, tie_word_embeddings=False), **CASES[case][0])
    return reference_model(transformers.MistralForCausalLM(transformers.MistralConfig(**fields)),
                           dtype)


@pytest.mark.parametrize("case, attention", [(case, "fused") for case in CASES]
                         + [("window 5, gqa, tied, partial", "unfused")])
@pytest.mark.parametrize("dtype, tol", [("fp32", 1e-5), ("fp64", 1e-10)])
def test_parity_with_transformers(ctx, case, dtype, tol, attention):
    hf = hf_model(case, torch.float64 if dtype == "fp64" else torch.float32)
    ids, targets = tokens(1)
    ref = hf_loss_and_grads(hf, ids, targets)
    config = MistralConfig.from_transformers(hf.config).replace(attention=attention)
    assert 0 < config.sliding_window < T
    model = MistralLM(config, CASES[case][1], dtype)
    model.load_state_dict({k: v.numpy() for k, v in hf.state_dict().items()})
    check_against(model, ref, ids, targets, tol)
    # the window matters here: without it the logits differ
    no_window = transformers.MistralForCausalLM(transformers.MistralConfig(
        **dict(hf.config.to_dict(), sliding_window=None))).to(hf.dtype).eval()
    no_window.load_state_dict(hf.state_dict())
    with torch.no_grad():
        full = no_window(torch.from_numpy(ids)).logits.double().numpy()
    assert np.abs(full - ref[0]).max() > 1e-3
    model.unregister()
    assert ids.shape == (B, T)


def test_config():
    """config.json's null window is none; a bad window or a bias is refused in one line; what
    we write transformers reads back as the same Mistral."""
    assert FAMILIES["mistral"] is MistralLM
    data = dict(model_type="mistral", vocab_size=50, hidden_size=32, intermediate_size=40,
                num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                sliding_window=None)
    config = config_from_dict(data)
    assert type(config) is MistralConfig and config.sliding_window is None
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="sliding_window"):
            config_from_dict(dict(data, sliding_window=bad))
    with pytest.raises(ValueError, match="no biases"):
        config_from_dict(dict(data, attention_bias=True))
    windowed = config.replace(sliding_window=7)
    hf_config = transformers.MistralConfig.from_dict(windowed.to_transformers_dict())
    assert hf_config.sliding_window == 7 and hf_config.architectures == ["MistralForCausalLM"]
    assert MistralConfig.from_transformers(hf_config) == windowed
    assert "window 7" in windowed.describe()
