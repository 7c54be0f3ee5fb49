"""The model shapes the benches train, without torch: the wide GPT-2 of bench/scale.py and
Llama, by name (the shapes the issues measure) or from flags. bench/compare_torch.py,
bench/scale.py, bench/deepspeed_ref.py and bench/fsdp_ref.py take their flags from here."""

# (hidden, inner, layers, heads, kv heads, vocabulary, tied)
LLAMA_SHAPES = {
    "llama-3.2-1b": (2048, 8192, 16, 32, 8, 128256, True),
    "llama-3.2-3b": (3072, 8192, 28, 24, 8, 128256, True),
    "llama-3.1-8b": (4096, 14336, 32, 32, 8, 128256, False),
    "llama-2-13b": (5120, 13824, 40, 40, 40, 32000, False),
    "codellama-34b": (8192, 22016, 48, 64, 8, 32016, False),
    "tinyllama-1.1b": (2048, 5632, 22, 32, 4, 32000, False),
    "smollm2-135m": (576, 1536, 30, 9, 3, 49152, True),
}
MODELS = ["gpt2", "llama"] + sorted(LLAMA_SHAPES)
# what bench/torch_reference.llama gives transformers' config, so that ours is the same model
LLAMA_ROPE_THETA = 500000.0


def default_heads(n_embd):
    """The wide GPT-2's (and a flag-built Llama's) heads: of 128 each."""
    return max(1, n_embd // 128)


def add_shape_args(p, batch_help=None, steps_help=None, heads_help="default n_embd / 128"):
    """The wide GPT-2 the benches compare on: --n-embd, --n-layer, --n-head, --seq, --vocab,
    --batch and --steps, with the same defaults in every bench."""
    p.add_argument("--n-embd", type=int, default=1024)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, help=heads_help)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--batch", type=int, default=4, help=batch_help)
    p.add_argument("--steps", type=int, default=3, help=steps_help)


def add_model_args(p, **shape_help):
    """--model, the Llama flags and the shape flags (add_shape_args, with its help)."""
    add_shape_args(p, **shape_help)
    p.add_argument("--model", default="gpt2", choices=MODELS,
                   help="gpt2 (default): a GPT-2 of --n-embd, --n-layer, --n-head, untied; "
                        "llama: a Llama of --n-embd, --n-inner, --n-layer, --n-head, "
                        "--n-kv-head (--tied); or a named Llama shape")
    p.add_argument("--n-inner", type=int, help="llama: the MLP's width (default 4 n_embd)")
    p.add_argument("--n-kv-head", type=int, help="llama: key/value heads (default n_head / 4)")
    p.add_argument("--tied", action="store_true", help="llama: the head tied to the embedding")


def resolve_model(args, heads=default_heads):
    """Fill a named Llama shape's fields into args (n_embd, n_inner, n_layer, n_head,
    n_kv_head, vocab, tied), and the defaults where a flag left them out (n_head from
    ``heads(n_embd)``)."""
    if args.model in LLAMA_SHAPES:
        (args.n_embd, args.n_inner, args.n_layer, args.n_head, args.n_kv_head, args.vocab,
         args.tied) = LLAMA_SHAPES[args.model]
        return args
    args.n_head = args.n_head or heads(args.n_embd)
    if args.model == "llama":
        args.n_inner = args.n_inner or 4 * args.n_embd
        args.n_kv_head = args.n_kv_head or max(1, args.n_head // 4)
    return args


def llama_config(args, attention="fused"):
    """Our LlamaConfig of a resolved Llama shape (bench/torch_reference.llama's model)."""
    from nntile.models import LlamaConfig
    return LlamaConfig(vocab_size=args.vocab, hidden_size=args.n_embd,
                       intermediate_size=args.n_inner, num_hidden_layers=args.n_layer,
                       num_attention_heads=args.n_head, num_key_value_heads=args.n_kv_head,
                       max_position_embeddings=args.seq, rope_theta=LLAMA_ROPE_THETA,
                       tie_word_embeddings=args.tied, attention=attention)
