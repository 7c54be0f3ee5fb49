"""PyTorch eager + transformers (GPT-2, Llama): the reference our training step is measured
against."""
import torch
import transformers

from shapes import LLAMA_ROPE_THETA

# the dtype of the weights; bf16-mixed keeps them fp32 and computes under torch.autocast
TORCH_DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16,
                "bf16-mixed": torch.float32}


def gpt2(vocab_size, n_positions, n_embd, n_layer, n_head, seed=0):
    """Random weights, untied head and no dropout: the model our GPT2LMHead computes."""
    torch.manual_seed(seed)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=vocab_size, n_positions=n_positions, n_embd=n_embd, n_layer=n_layer,
        n_head=n_head, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        tie_word_embeddings=False,
        # GPT-2's end-of-text token is the last id; the default, 50256, is outside a small
        # vocabulary and transformers warns about it.
        bos_token_id=vocab_size - 1, eos_token_id=vocab_size - 1))


def llama(vocab_size, hidden, inner, n_layer, n_head, n_kv_head, seq, tied, seed=0,
          head_dim=None, rope_theta=LLAMA_ROPE_THETA):
    """transformers' LlamaForCausalLM with random weights (sdpa attention), the model our
    Llama computes."""
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=inner,
        num_hidden_layers=n_layer, num_attention_heads=n_head, num_key_value_heads=n_kv_head,
        head_dim=head_dim or hidden // n_head, max_position_embeddings=seq,
        rope_theta=rope_theta, tie_word_embeddings=tied, attention_dropout=0.0,
        bos_token_id=0, eos_token_id=0, pad_token_id=None)
    config._attn_implementation = "sdpa"
    return transformers.LlamaForCausalLM(config)


def of_args(args):
    """The reference model of a bench's resolved shape flags (bench/shapes.py): the wide
    GPT-2 or a Llama."""
    if args.model == "gpt2":
        return gpt2(args.vocab, max(1024, args.seq), args.n_embd, args.n_layer, args.n_head)
    return llama(args.vocab, args.n_embd, args.n_inner, args.n_layer, args.n_head,
                 args.n_kv_head, args.seq, args.tied)


def gpt2_params(vocab_size, n_positions, n_embd, n_layer):
    """Parameters of gpt2()'s model (untied head, inner 4 n_embd) without building it."""
    E = n_embd
    return 2 * vocab_size * E + n_positions * E + n_layer * (12 * E * E + 13 * E) + 2 * E


def is_oom(exc):
    """PyTorch reports a failed allocation as OutOfMemoryError on CUDA and as a plain
    RuntimeError on the CPU."""
    if isinstance(exc, (torch.cuda.OutOfMemoryError, MemoryError)):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in text
                                              or "can't allocate memory" in text)


class Trainer:
    """AdamW steps of a transformers model on ``device``. tf32: fp32 weights with TF32 matrix
    products; bf16: the whole model cast, so weights, gradients and Adam states are bf16;
    bf16-mixed: PyTorch AMP, fp32 weights, gradients and Adam states, the forward under
    torch.autocast(bfloat16) (bf16 matrix products, fp32 where autocast keeps it)."""

    def __init__(self, model, device, dtype, lr=1e-4):
        self.device = torch.device(device)
        if self.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
            torch.backends.cudnn.allow_tf32 = dtype == "tf32"
        self.model = model.to(self.device, TORCH_DTYPES[dtype])
        self.autocast = dtype == "bf16-mixed"
        # fused: PyTorch's fastest AdamW on a GPU, and it needs no parameter-sized
        # temporaries (the default foreach one does, which ran out of memory at n_embd 8192)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr,
                                     fused=self.device.type == "cuda")

    def tensors(self, *arrays):
        return [torch.from_numpy(a).to(self.device) for a in arrays]

    def step(self, ids, targets):
        """One step on torch tensors; returns the loss (reading it waits for the GPU)."""
        self.opt.zero_grad()
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            logits = self.model(ids).logits
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                     targets.reshape(-1))
        loss.backward()
        self.opt.step()
        self.loss = float(loss.detach())
        return self.loss

    def close(self):
        """Give the device memory back (to our runtime, which runs next)."""
        del self.model, self.opt
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
