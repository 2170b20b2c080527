"""Single-process properties of the model family: counts, FLOPs, init, shapes, errors."""

import pytest
import torch
import torch.nn.functional as F

from boost_titan.models import FLAVORS, Transformer, TransformerArgs, count_params, flops_per_token

SMALL = TransformerArgs(dim=64, n_layers=2, n_heads=4, ffn_dim=96, vocab_size=128, attn_rank=16, mlp_rank=24)


@pytest.mark.parametrize("flavor", sorted(FLAVORS))
def test_parameter_count_matches_closed_form(flavor):
    args = FLAVORS[flavor]
    with torch.device("meta"):
        model = Transformer(args)
    assert sum(p.numel() for p in model.parameters()) == count_params(args)


def test_paper_sizes_by_hand():
    """docs/design.md, "The model": CoLA = 8·d·r + 3·r·(d+f) per layer; full rank 4d² + 3df; + 2d norms."""
    d, f, r, L, V = 2048, 5472, 512, 24, 32000
    cola = L * (8 * d * r + 3 * r * (d + f) + 2 * d) + V * d + d
    full = L * (4 * d * d + 3 * d * f + 2 * d) + V * d + d
    assert count_params(FLAVORS["1B"]) == cola == 544_180_224
    assert count_params(FLAVORS["1B_fullrank"]) == full == 1_275_168_768
    d, f, r, L = 4096, 11008, 1024, 32  # 7B: the same formulas (BOOST: 2.69B / 6.61B)
    assert count_params(FLAVORS["7B"]) == L * (8 * d * r + 3 * r * (d + f) + 2 * d) + V * d + d == 2_689_863_680
    assert count_params(FLAVORS["7B_fullrank"]) == L * (4 * d * d + 3 * d * f + 2 * d) + V * d + d == 6_607_343_616


@pytest.mark.parametrize("flavor", ["1B", "7B", "1B_fullrank", "7B_fullrank"])
def test_flops_per_token_by_hand(flavor):
    """6 × (every GEMM weight, lm_head included even when tied) + 12·L·d·s attention."""
    a, s = FLAVORS[flavor], 4096
    d, f, r, L, V = a.dim, a.ffn_dim, a.attn_rank, a.n_layers, a.vocab_size
    per_layer = (8 * d * r + 3 * r * (d + f)) if r else (4 * d * d + 3 * d * f)
    expected = 6 * (L * per_layer + V * d) + 12 * L * d * s
    assert flops_per_token(a, s) == expected
    if flavor == "1B":  # FR/CoLA FLOP ratio at the benchmark shape (issue: ≈1.77)
        ratio = flops_per_token(FLAVORS["1B_fullrank"], s) / expected
        assert ratio == pytest.approx(1.772, abs=1e-3)


def test_cola_init_statistics():
    args = FLAVORS["60M"]
    model = Transformer(args)
    model.init_weights(torch.device("cpu"))
    d, f, r = args.dim, args.ffn_dim, args.attn_rank
    blk = model.layers["0"]
    for proj, (d_in, d_out) in [(blk.attention.qkv, (d, d)), (blk.feed_forward.gate_up, (d, f)),
                                (blk.feed_forward.down, (f, d))]:
        want = (r * (d_in + d_out)) ** -0.25  # CoLA init: r·σ⁴ = 1/(d_in + d_out)
        assert proj.a.weight.std().item() == pytest.approx(want, rel=0.03)
        assert proj.b[0].weight.std().item() == pytest.approx(want, rel=0.03)
        # the product B·A has Xavier-like variance 1/(d_in + d_out)
        prod = proj.b[0].weight[0] @ proj.a.weight[0]
        assert prod.var().item() == pytest.approx(1 / (d_in + d_out), rel=0.1)
    assert model.tok_embeddings.weight.std().item() == pytest.approx(0.025, rel=0.02)
    assert torch.all(blk.attention.qkv.norm.weight == 1)


def test_init_depends_only_on_seed_and_name():
    a, b = Transformer(SMALL), Transformer(SMALL)
    torch.manual_seed(123)  # the global RNG must not matter
    a.init_weights(torch.device("cpu"))
    torch.manual_seed(456)
    b.init_weights(torch.device("cpu"))
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), name
    # the name is in the seed: identically shaped parameters of different layers differ
    assert not torch.equal(a.layers["0"].attention.qkv.a.weight, a.layers["1"].attention.qkv.a.weight)
    c = Transformer(SMALL.replace(init_seed=1))
    c.init_weights(torch.device("cpu"))
    assert not torch.equal(c.output.weight, a.output.weight)


def test_forward_backward_shapes_and_tied_head():
    args = SMALL.replace(tie_embeddings=True, n_kv_heads=2)
    model = Transformer(args)
    model.init_weights(torch.device("cpu"))
    assert model.output.weight is model.tok_embeddings.weight
    tokens = torch.randint(0, args.vocab_size, (3, 10))
    logits = model(tokens)
    assert logits.shape == (3, 10, args.vocab_size)
    F.cross_entropy(logits.flatten(0, 1), tokens.flatten()).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize("args", [SMALL, SMALL.replace(n_kv_heads=2), SMALL.replace(attn_rank=0, mlp_rank=0)],
                         ids=["mha", "gqa", "dense"])
def test_grouped_and_ungrouped_compute_the_same_function(args):
    tokens = torch.randint(0, args.vocab_size, (2, 12))
    grads = []
    for grouped in (True, False):
        model = Transformer(args.replace(grouped=grouped)).double()
        model.init_weights(torch.device("cpu"))
        loss = F.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten())
        loss.backward()
        grads.append((loss.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (l1, g1), (l2, g2) = grads
    torch.testing.assert_close(l1, l2, rtol=1e-12, atol=0)
    for name in g1:
        torch.testing.assert_close(g1[name], g2[name], rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("args", [SMALL, SMALL.replace(n_kv_heads=2), SMALL.replace(attn_rank=0, mlp_rank=0)],
                         ids=["mha", "gqa", "dense"])
def test_gradients_arrive_in_their_parameters_layout(args):
    """Autograd hands every weight a gradient with the weight's own strides, so AccumulateGrad stores it
    without a copy (a transposed gradient costs one copy kernel per weight per step; see ops/gemm.py)."""
    model = Transformer(args)
    model.init_weights(torch.device("cpu"))
    incoming = {}
    for name, p in model.named_parameters():
        p.register_hook(lambda g, name=name: incoming.update({name: g.stride()}))
    tokens = torch.randint(0, args.vocab_size, (2, 12))
    F.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten()).backward()
    bad = {n: (stride, p.stride()) for n, p in model.named_parameters()
           if (stride := incoming[n]) != p.stride()}
    assert len(incoming) == len(list(model.parameters())) and not bad, bad


def test_matmul_nt_under_autocast_matches_torch_bmm():
    """torchtitan's single-device bf16 path runs the model under autocast: ``matmul_nt`` computes in bf16
    there and hands fp32 inputs fp32 gradients, the same values as ``torch.bmm`` under autocast."""
    from boost_titan.ops.gemm import matmul_nt

    z0 = torch.randn(3, 10, 16, generator=torch.Generator().manual_seed(0))
    w0 = torch.randn(3, 8, 16, generator=torch.Generator().manual_seed(1))
    g = torch.randn(3, 10, 8, generator=torch.Generator().manual_seed(2)).bfloat16()
    results = []
    for fn in (matmul_nt, lambda z, w: torch.bmm(z, w.transpose(1, 2))):
        z, w = z0.clone().requires_grad_(), w0.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = fn(z, w)
        y.backward(g)
        results.append((y, z.grad, w.grad))
    (y, dz, dw), (y_ref, dz_ref, dw_ref) = results
    assert y.dtype == torch.bfloat16 and dz.dtype == dw.dtype == torch.float32
    torch.testing.assert_close(y, y_ref, rtol=0, atol=0)
    torch.testing.assert_close(dz, dz_ref, rtol=1e-2, atol=1e-2)  # bf16 GEMMs, summation order may differ
    torch.testing.assert_close(dw, dw_ref, rtol=1e-2, atol=1e-2)


def test_lowrank_projection_is_b_silu_a():
    """The CoLA projection against an independent fp64 formula: y_j = B_j · SiLU(A_j · RMSNorm(x))."""
    model = Transformer(SMALL).double()
    model.init_weights(torch.device("cpu"))
    qkv = model.layers["0"].attention.qkv
    with torch.no_grad():
        qkv.norm.weight.uniform_(0.5, 1.5)  # init is all ones: make γ matter
    x = torch.randn(2, 5, SMALL.dim, dtype=torch.float64)
    xn = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + SMALL.norm_eps) * qkv.norm.weight
    for j, y in enumerate(qkv(x)):
        ref = F.silu(xn @ qkv.a.weight[j].T) @ qkv.b[0].weight[j].T
        torch.testing.assert_close(y, ref)


@pytest.mark.parametrize("change, message", [
    (dict(attn_rank=64), "attn_rank=64"),
    (dict(mlp_rank=-1), "mlp_rank=-1"),
    (dict(n_heads=5), "n_heads=5"),
    (dict(n_kv_heads=3), "n_kv_heads=3"),
])
def test_bad_args_fail_early(change, message):
    with pytest.raises(ValueError, match=message):
        Transformer(SMALL.replace(**change))


def test_unknown_flavor_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown cola_llama flavor 'huge'.*debugmodel"):
        FLAVORS["huge"]


def test_rope_is_a_rotation():
    from boost_titan.models.model import apply_rope, rope_cos_sin

    x = torch.randn(2, 7, 3, 16, dtype=torch.float64)
    y = apply_rope(x, rope_cos_sin(16, 32, 10000.0).double())
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(y[:, 0], x[:, 0])  # position 0 is not rotated
    assert not torch.allclose(y[:, 1:], x[:, 1:])  # later positions are
    # the defining property: <rope(q, m), rope(k, n)> depends on m - n only
    q, k = torch.randn(2, 16, dtype=torch.float64)
    table = rope_cos_sin(16, 32, 10000.0).double()

    def at(v, pos):  # v placed at sequence position `pos`, rotated
        seq = torch.zeros(1, pos + 1, 1, 16, dtype=torch.float64)
        seq[0, pos, 0] = v
        return apply_rope(seq, table)[0, pos, 0]

    torch.testing.assert_close(at(q, 5) @ at(k, 2), at(q, 9) @ at(k, 6))
    assert not torch.allclose(at(q, 5) @ at(k, 2), at(q, 5) @ at(k, 3))


def _job(tokenizer, dataset="embedded", vocab_from_tokenizer=False):
    from types import SimpleNamespace

    from torchtitan_ext.cola_llama.job_config import Boost

    boost = Boost(tokenizer=tokenizer, vocab_from_tokenizer=vocab_from_tokenizer)
    return SimpleNamespace(training=SimpleNamespace(seq_len=128, dataset=dataset), boost=boost)


def test_tokenizer_must_fit_the_vocabulary():
    from torchtitan_ext.cola_llama.job_config import size_vocabulary

    args = FLAVORS["60M"].replace()  # vocab 32000 < cl100k's ~100K
    with pytest.raises(ValueError, match="cl100k_base.*vocab_size is 32000.*vocab_from_tokenizer"):
        size_vocabulary(args, _job("cl100k_base"))
    size_vocabulary(args, _job("cl100k_base", vocab_from_tokenizer=True))
    assert args.vocab_size % 128 == 0 and 100_000 < args.vocab_size < 100_500
    from torchtitan_ext.cola_llama.spec import JOB_FLAVORS

    gpt2 = JOB_FLAVORS["60M"].replace()
    gpt2.update_from_config(_job("gpt2", vocab_from_tokenizer=True))
    assert gpt2.vocab_size == 50304 and gpt2.max_seq_len == 128  # 50304 = ceil(50257 / 128) · 128
    synthetic = FLAVORS["60M"].replace()
    size_vocabulary(synthetic, _job("cl100k_base", dataset="synthetic"))  # no tokenizer involved
    assert synthetic.vocab_size == 32000


def test_torchtitan_flavors_size_the_vocabulary():
    """torchtitan's trainer calls ``update_from_config`` on the TrainSpec's flavors: they check the tokenizer."""
    from torchtitan_ext.cola_llama.spec import JOB_FLAVORS

    with pytest.raises(ValueError, match="cl100k_base.*vocab_size is 32000"):
        JOB_FLAVORS["60M"].replace().update_from_config(_job("cl100k_base"))


def test_to_empty_unties_and_init_weights_reties():
    """torchtitan's flow: build on meta, ``to_empty`` (which replaces each module's parameters one
    by one, so the lm_head stops sharing the embedding's), then ``init_weights``."""
    with torch.device("meta"):
        model = Transformer(SMALL.replace(tie_embeddings=True))
    model.to_empty(device="cpu")
    assert model.output.weight is not model.tok_embeddings.weight  # the hazard is real
    model.init_weights(torch.device("cpu"))
    assert model.output.weight is model.tok_embeddings.weight
    assert len(list(model.parameters())) == len({id(p) for p in model.parameters()})
    tokens = torch.randint(0, SMALL.vocab_size, (2, 16))
    model(tokens).sum().backward()
    reference = Transformer(SMALL.replace(tie_embeddings=True))
    reference.init_weights(torch.device("cpu"))
    reference(tokens).sum().backward()
    torch.testing.assert_close(model.tok_embeddings.weight.grad, reference.tok_embeddings.weight.grad)


def test_tied_weights_with_different_layouts_fail_clearly():
    model = Transformer(SMALL.replace(tie_embeddings=True))
    model.output.weight = torch.nn.Parameter(model.output.weight.detach()[:, :-1].clone())
    with pytest.raises(ValueError, match="tie_embeddings=True.*differ in shape or distribution"):
        model.init_weights(torch.device("cpu"))
