"""NVFP4Linear (three GEMMs), recipes, MXFP8 master write-back, optimizer state and export/load exactness."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn as nn
from hypothesis import given, settings
from hypothesis import strategies as st

import nvfp4_cuda
from ida_trainer.config import OptimConfig, PrecisionConfig
from ida_trainer.precision import (
    PIPELINE_STATES_KEY,
    MasterAdamW,
    MXFP8Lion,
    NVFP4Linear,
    apply_recipe,
    build_optimizer,
    export_state,
    load_state,
    merge_stage_states,
    nvfp4_modules,
    select_state,
)
from mxfp8_codec import MXFP8Tensor

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
ACT_GRID = 1.75  # 448 * 2**-8: an amax of 6 * 1.75 = 2688 * 2**-8 makes the NVFP4 tensor scale 2**-8 exactly


def exact_matrix(rows: int, cols: int, seed: int, grid: float = ACT_GRID) -> torch.Tensor:
    """Values e2m1 * grid with +-6*grid on every (i - j) % 16 == 0 diagonal, so every 1x16 block (along
    either axis) and every 16x16 tile holds its maximum: NVFP4 quantization maps them to exact codes.
    grid=1.75 (activations, gradients): exact in BF16 with a power-of-two tensor scale; grid=1 (weights):
    exact in MXFP8 (a 1.75 * 2**k weight grid is not E4M3-representable)."""
    g = torch.Generator().manual_seed(seed)
    v = E2M1[torch.randint(0, 8, (rows, cols), generator=g)]
    sign = torch.where(torch.rand(rows, cols, generator=g) < 0.5, -1.0, 1.0)
    i = torch.arange(rows)[:, None]
    j = torch.arange(cols)[None, :]
    v = torch.where((i - j) % 16 == 0, torch.full_like(v, 6.0), v)
    return (v * sign * grid).to(torch.float32)


class Toy(nn.Module):
    def __init__(self, d_in: int = 64, d_out: int = 48, bias: bool = False) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, d_in)
        self.q_proj = nn.Linear(d_in, d_out, bias=bias)
        self.norm = nn.LayerNorm(d_out)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.norm(self.q_proj(self.embed(ids)))


def assert_bf16_rounding_of(got: torch.Tensor, exact: torch.Tensor) -> None:
    """``got`` is ``exact`` rounded to BF16 (RNE); at an exact midpoint either neighbour is accepted."""
    assert got.dtype == torch.bfloat16 and got.shape == exact.shape
    half_ulp = torch.exp2(torch.floor(torch.log2(exact.abs().clamp_min(2**-100))) - 8)
    err = (got.float() - exact).abs()
    assert (err <= half_ulp).all()
    tie = (exact.to(torch.bfloat16).float() - exact).abs() == half_ulp
    assert torch.equal(got[~tie], exact.to(torch.bfloat16)[~tie])


def nvfp4_layer(w: torch.Tensor, **kw) -> NVFP4Linear:
    lin = nn.Linear(w.shape[1], w.shape[0], bias=False)
    with torch.no_grad():
        lin.weight.copy_(w)
    return NVFP4Linear.from_linear(lin, global_name="q_proj", precision=PrecisionConfig(**kw))


@pytest.mark.parametrize("stochastic_grad", [False, True])
def test_three_gemms_equal_linear_when_quantization_is_identity(stochastic_grad: bool) -> None:
    # With exactly representable operands (and no Hadamard), NVFP4 must reproduce nn.Linear bit for bit:
    # this pins which operand goes where in forward, dgrad and wgrad (and the [in, out] grad layout).
    # The weight's tensor scale 1/448 is not a power of two: its float32 rounding (~1e-7) only matters
    # when the exact result is a BF16 midpoint. X and dY have power-of-two scales: dW is exact.
    x = exact_matrix(32, 64, 1)
    w = exact_matrix(48, 64, 2, grid=1.0)
    gy = exact_matrix(32, 48, 3)
    layer = nvfp4_layer(w, hadamard_wgrad=False, stochastic_grad=stochastic_grad)
    assert torch.equal(layer.dequantized_weight(), w)
    xin = x.to(torch.bfloat16).requires_grad_(True)
    y = layer(xin)
    y.backward(gy.to(torch.bfloat16))
    assert_bf16_rounding_of(y, x @ w.t())
    assert_bf16_rounding_of(xin.grad, gy @ w)
    assert layer.weight.grad.shape == (64, 48)  # native [in, out]
    assert torch.equal(layer.weight.grad, (x.t() @ gy).to(torch.bfloat16))


def test_forward_and_backward_match_dequantize_then_matmul_oracle() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 64, generator=g).to(torch.bfloat16)  # 40 tokens: wgrad pads to 48
    w = torch.randn(32, 64, generator=g) * 0.05
    gy = torch.randn(40, 32, generator=g).to(torch.bfloat16)
    layer = nvfp4_layer(w, hadamard_wgrad=True, stochastic_grad=False)
    xin = x.clone().requires_grad_(True)
    y = layer(xin)
    y.backward(gy)

    deq = nvfp4_cuda.dequantize_nvfp4
    wq = nvfp4_cuda.quantize_nvfp4(layer.dequantized_weight(), block_2d=True)  # [out, in] tiles
    y_ref = deq(nvfp4_cuda.quantize_nvfp4(x)).double() @ deq(wq).double().t()
    dx_ref = deq(nvfp4_cuda.quantize_nvfp4(gy)).double() @ deq(wq).double()
    xt = torch.nn.functional.pad(x.t(), (0, 8)).contiguous()
    gt = torch.nn.functional.pad(gy.t(), (0, 8)).contiguous()
    dw_ref = (
        deq(nvfp4_cuda.quantize_nvfp4(xt, hadamard=True)).double()
        @ deq(nvfp4_cuda.quantize_nvfp4(gt, hadamard=True)).double().t()
    )
    for got, ref in ((y, y_ref), (xin.grad, dx_ref), (layer.weight.grad, dw_ref)):
        # the only differences: float32 accumulation order, one BF16 rounding of the result
        tol = ref.abs() * 2**-8 + 1e-5 * ref.abs().max()
        assert got.shape == ref.shape
        assert ((got.double() - ref).abs() <= tol).all()


def test_forward_and_dgrad_see_the_same_quantized_weight() -> None:
    w = torch.randn(48, 64, generator=torch.Generator().manual_seed(4)) * 0.02
    layer = nvfp4_layer(w)
    wq_n = nvfp4_cuda.quantize_nvfp4_from_mxfp8(layer.weight_payload, layer.weight_scales, block_2d=True)
    wq = nvfp4_cuda.quantize_nvfp4_from_mxfp8(layer.weight_payload, layer.weight_scales, block_2d=True, transpose=True)
    a = nvfp4_cuda.dequantize_nvfp4(wq_n.t())
    assert torch.equal(a, nvfp4_cuda.dequantize_nvfp4(wq))
    assert torch.equal(nvfp4_cuda.dequantize_nvfp4(wq_n).t(), a)


def test_hadamard_changes_wgrad_only_by_quantization_noise() -> None:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(64, 32, generator=g).to(torch.bfloat16)
    gy = torch.randn(64, 32, generator=g).to(torch.bfloat16)
    w = torch.randn(32, 32, generator=g) * 0.1
    exact = x.double().t() @ gy.double()
    errs = {}
    for had in (False, True):
        layer = nvfp4_layer(w, hadamard_wgrad=had, stochastic_grad=False)
        layer(x.clone().requires_grad_(True)).backward(gy)
        errs[had] = float((layer.weight.grad.double() - exact).norm() / exact.norm())
    assert errs[True] < 0.25 and errs[False] < 0.25  # NVFP4 quantization noise, not a wrong GEMM


@settings(max_examples=12, deadline=None)
@given(m=st.integers(1, 40), seed=st.integers(0, 2**16))
def test_wgrad_token_padding_is_exact(m: int, seed: int) -> None:
    # Zero tokens contribute nothing: M tokens give the same dW as M tokens + explicit zero rows.
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, 32, generator=g).to(torch.bfloat16)
    gy = torch.randn(m, 16, generator=g).to(torch.bfloat16)
    w = torch.randn(16, 32, generator=g) * 0.1
    pad = (-m) % 16
    grads = []
    for xx, gg in ((x, gy), (torch.cat([x, x.new_zeros(pad, 32)]), torch.cat([gy, gy.new_zeros(pad, 16)]))):
        layer = nvfp4_layer(w, stochastic_grad=False)
        layer(xx.clone().requires_grad_(True)).backward(gg)
        grads.append(layer.weight.grad)
    assert torch.equal(grads[0], grads[1])


def test_stochastic_grad_rounding_depends_on_step_and_is_reproducible() -> None:
    g = torch.Generator().manual_seed(6)
    x = torch.randn(32, 32, generator=g).to(torch.bfloat16)
    gy = torch.randn(32, 32, generator=g).to(torch.bfloat16)
    w = torch.randn(32, 32, generator=g) * 0.1

    def run(step: int) -> torch.Tensor:
        layer = nvfp4_layer(w)
        layer.set_sr_step(step)
        xin = x.clone().requires_grad_(True)
        layer(xin).backward(gy)
        return torch.cat([xin.grad.flatten(), layer.weight.grad.flatten()])

    assert torch.equal(run(3), run(3))
    assert not torch.equal(run(3), run(4))


def test_apply_recipe_nvfp4_keeps_patterns_and_odd_shapes_bf16() -> None:
    m = nn.Module()
    m.a = nn.Module()
    m.a.q_proj = nn.Linear(32, 32)
    m.a.k_proj = nn.Linear(32, 32)
    m.a.v_proj = nn.Linear(32, 24)  # 24 is not a multiple of 16
    m.head = nn.Linear(32, 32)
    with pytest.warns(UserWarning, match="a.v_proj"):
        apply_recipe(m, PrecisionConfig(recipe="nvfp4", keep_bf16=("a.k_*",)))
    assert isinstance(m.a.q_proj, NVFP4Linear)
    assert isinstance(m.a.k_proj, nn.Linear) and m.a.k_proj.weight.dtype == torch.bfloat16
    assert isinstance(m.a.v_proj, nn.Linear)
    assert isinstance(m.head, nn.Linear) and m.head.weight.dtype == torch.bfloat16
    assert m.a.q_proj.bias.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="already applied"):
        apply_recipe(m, PrecisionConfig(recipe="nvfp4"))


def test_a_keep_bf16_pattern_that_matches_no_projection_is_warned_about() -> None:
    """The minitron-4b preset keeps layer 31 BF16; on a base with fewer layers nothing would say it runs NVFP4."""
    m = nn.Module()
    m.layers = nn.ModuleList([nn.Module()])
    m.layers[0].q_proj = nn.Linear(32, 32)
    with pytest.warns(UserWarning, match=r"\['layers.31.\*'\] match no projection of this Module; .*'layers.0.q_proj'"):
        apply_recipe(m, PrecisionConfig(recipe="nvfp4", keep_bf16=("layers.0.*", "layers.31.*")))
    assert isinstance(m.layers[0].q_proj, nn.Linear)  # the pattern that matched still keeps its layer
    fine = nn.Module()
    fine.q_proj = nn.Linear(32, 32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        apply_recipe(fine, PrecisionConfig(recipe="nvfp4", keep_bf16=("q_*",)))


def test_apply_recipe_on_meta_device_and_device_moves_keep_the_anchor_tiny() -> None:
    with torch.device("meta"):
        m = Toy()
    apply_recipe(m, PrecisionConfig(recipe="nvfp4"))
    assert m.q_proj.weight_payload.device.type == "meta" and m.q_proj.weight_payload.dtype == torch.uint8
    m2 = Toy()
    apply_recipe(m2, PrecisionConfig(recipe="nvfp4"))
    m2.to("cpu", torch.bfloat16)
    assert m2.q_proj.weight.stride() == (0, 0) and m2.q_proj.weight.dtype == torch.bfloat16


def test_bf16_recipe_fp32_master_bf16_compute() -> None:
    m = Toy()
    apply_recipe(m, PrecisionConfig(recipe="bf16"))
    assert all(p.dtype == torch.float32 for p in m.parameters())
    seen = []
    m.q_proj.register_forward_hook(lambda mod, inp, out: seen.append(out.dtype))
    m(torch.tensor([[1, 2, 3]])).sum().backward()
    assert seen == [torch.bfloat16] and m.q_proj.weight.grad.dtype == torch.float32
    clone = copy.deepcopy(m)  # the autocast forward is rebound to the copy, not the original
    with torch.no_grad():
        clone.norm.bias.add_(1.0)
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        assert float((clone(ids).float() - m(ids).float() - 1.0).abs().max()) < 0.02  # BF16 output rounding
    opt = build_optimizer(m, OptimConfig(name="adamw", lr=1e-3, betas=(0.9, 0.95)), PrecisionConfig(recipe="bf16"))
    assert isinstance(opt, MasterAdamW) and opt.param_groups[0]["betas"] == (0.9, 0.95)
    with pytest.raises(ValueError, match="model has recipe 'bf16'"):
        build_optimizer(m, OptimConfig(name="adamw", lr=1e-3), PrecisionConfig(recipe="nvfp4"))
    with pytest.raises(ValueError, match="AdamW"):
        build_optimizer(m, OptimConfig(name="lion", lr=1e-3), PrecisionConfig(recipe="bf16"))


def _one_lion_step(writeback: str, lr: float) -> tuple[float, float, float]:
    """(fraction of MXFP8 master elements that moved, mean realized update / lr, same for a BF16 param)."""
    torch.manual_seed(0)
    m = Toy(d_in=64, d_out=64)
    with torch.no_grad():
        m.q_proj.weight.copy_(0.02 + 0.002 * torch.rand(64, 64))
        m.embed.weight.copy_(0.02 + 0.002 * torch.rand(16, 64))
    prec = PrecisionConfig(recipe="nvfp4", writeback=writeback)
    apply_recipe(m, prec)
    opt = build_optimizer(m, OptimConfig(name="lion", lr=lr), prec)
    before = m.q_proj.dequantized_weight().clone()
    emb_before = m.embed.weight.detach().float().clone()
    m.q_proj.weight.grad = torch.ones(64, 64, dtype=torch.bfloat16)
    m.embed.weight.grad = torch.ones(16, 64, dtype=torch.bfloat16)
    opt.step()
    delta = m.q_proj.dequantized_weight() - before
    emb_delta = m.embed.weight.detach().float() - emb_before
    return float((delta != 0).float().mean()), float(delta.mean() / -lr), float(emb_delta.mean() / -lr)


def test_rne_writeback_freezes_the_master_at_lr_1e5_and_stochastic_moves_it() -> None:
    moved, realized, emb_realized = _one_lion_step("rne", 1e-5)
    assert moved == 0.0 and realized == 0.0 and emb_realized == 0.0  # the original failure
    moved, realized, emb_realized = _one_lion_step("stochastic", 1e-5)
    assert moved > 0.0
    # unbiased: E[realized / intended] = 1; 4096 Bernoulli(~0.5 %) moves of one ulp (~195 lr) each
    assert 0.4 < realized < 1.6
    assert 0.5 < emb_realized < 1.5


def test_compensated_writeback_keeps_the_residual() -> None:
    moved, realized, _ = _one_lion_step("compensated", 1e-5)
    assert moved == 0.0  # RNE on the master ...
    torch.manual_seed(0)
    m = Toy(d_in=64, d_out=64)
    prec = PrecisionConfig(recipe="nvfp4", writeback="compensated")
    apply_recipe(m, prec)
    opt = build_optimizer(m, OptimConfig(name="lion", lr=1e-5), prec)
    m.q_proj.weight.grad = torch.ones(64, 64, dtype=torch.bfloat16)
    opt.step()
    comp = opt.state[m.q_proj.weight]["compensation"]
    assert comp.dtype == torch.float32 and float(comp.mean()) == pytest.approx(-1e-5, rel=0.05)  # ... the rest kept


def _train(m: nn.Module, opt: torch.optim.Optimizer, steps: range) -> list[float]:
    losses = []
    for s in steps:
        ids = torch.randint(0, 16, (4, 8), generator=torch.Generator().manual_seed(s))
        loss = m(ids).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    return losses


def _snapshot(m: nn.Module) -> dict[str, torch.Tensor]:
    out = {}
    for k, v in export_state(m).items():
        if isinstance(v, MXFP8Tensor):
            out[k + "#p"], out[k + "#s"] = v.payload.clone(), v.scales.clone()
        else:
            out[k] = v.clone()
    return out


@pytest.mark.parametrize("recipe,writeback", [("nvfp4", "stochastic"), ("nvfp4", "compensated"), ("bf16", "")])
def test_resume_from_export_state_and_optimizer_state_is_bit_exact(recipe: str, writeback: str) -> None:
    prec = PrecisionConfig(recipe=recipe, writeback=writeback or "stochastic")
    optim = (
        OptimConfig(name="lion", lr=1e-3, weight_decay=0.1)
        if recipe == "nvfp4"
        else OptimConfig(name="adamw", lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    )

    def fresh(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(seed)
        m = Toy(bias=True)
        apply_recipe(m, prec)
        return m, build_optimizer(m, optim, prec)

    m1, o1 = fresh(0)
    _train(m1, o1, range(3))
    saved_model = {
        k: (MXFP8Tensor(v.payload.clone(), v.scales.clone()) if isinstance(v, MXFP8Tensor) else v.clone())
        for k, v in export_state(m1).items()
    }
    saved_opt = copy.deepcopy(o1.state_dict())  # state_dict() aliases live tensors (torch.save would copy)
    tail1 = _train(m1, o1, range(3, 6))

    m2, o2 = fresh(1)  # different init: everything must come from the saved state
    load_state(m2, saved_model)
    o2.load_state_dict(saved_opt)
    tail2 = _train(m2, o2, range(3, 6))
    assert tail1 == tail2
    s1, s2 = _snapshot(m1), _snapshot(m2)
    assert s1.keys() == s2.keys() and all(torch.equal(s1[k], s2[k]) for k in s1)
    if recipe == "nvfp4":
        assert isinstance(o1, MXFP8Lion) and o1.sr_step == 6 and m1.q_proj.sr_step == 6


def test_export_state_layout_and_load_state_errors() -> None:
    m = Toy()
    apply_recipe(m, PrecisionConfig(recipe="nvfp4"))
    st_ = export_state(m)
    assert set(st_) == {"embed.weight", "q_proj.weight", "norm.weight", "norm.bias"}
    q = st_["q_proj.weight"]
    assert isinstance(q, MXFP8Tensor) and q.payload.shape == (64, 48) and q.scales.shape == (64, 2)
    with pytest.raises(ValueError, match="missing.*norm.bias"):
        load_state(m, {k: v for k, v in st_.items() if k != "norm.bias"})
    with pytest.raises(ValueError, match="unexpected.*extra"):
        load_state(m, {**st_, "extra": torch.zeros(1)})
    bad = dict(st_)
    bad["q_proj.weight"] = MXFP8Tensor(q.payload.t().contiguous(), q.scales)
    with pytest.raises(ValueError, match=r"q_proj.weight.*\[in, out\]"):
        load_state(m, bad)
    # a BF16-recipe model reads the nvfp4 checkpoint (MXFP8 decoded, transposed back to [out, in])
    m_b = Toy()
    apply_recipe(m_b, PrecisionConfig(recipe="bf16"))
    load_state(m_b, st_)
    assert torch.equal(m_b.q_proj.weight.data, m.q_proj.dequantized_weight())
    # and the float export of the bf16 recipe loads into NVFP4 masters (RNE encode)
    exp_b = export_state(m_b)
    assert exp_b["q_proj.weight"].shape == (64, 48) and exp_b["q_proj.weight"].dtype == torch.float32
    load_state(m, exp_b)
    assert torch.equal(m.q_proj.weight_payload, q.payload)


def test_lion_state_dict_keeps_float32_compensation_and_rejects_foreign_state() -> None:
    prec = PrecisionConfig(recipe="nvfp4", writeback="compensated")
    m = Toy()
    apply_recipe(m, prec)
    opt = build_optimizer(m, OptimConfig(name="lion", lr=1e-4), prec)
    _train(m, opt, range(1))
    sd = opt.state_dict()
    opt2 = build_optimizer(m, OptimConfig(name="lion", lr=1e-4), prec)
    opt2.load_state_dict(sd)
    assert opt2.state[m.q_proj.weight]["compensation"].dtype == torch.float32
    assert opt2.state[m.q_proj.weight]["momentum"].dtype == torch.bfloat16
    mb = Toy()
    apply_recipe(mb, PrecisionConfig(recipe="bf16"))
    adam = build_optimizer(mb, OptimConfig(name="adamw", lr=1e-3), PrecisionConfig(recipe="bf16"))
    with pytest.raises(ValueError, match="MXFP8Lion"):
        opt2.load_state_dict(adam.state_dict())


def test_optimizer_state_splits_by_name_and_merges_back_and_older_pipeline_files_still_load() -> None:
    """What lets a checkpoint resume with another number of pipeline stages: select_state cuts an optimizer
    state into stages' parts by parameter name, merge_stage_states puts the parts back together, bit for bit."""
    prec = PrecisionConfig(recipe="nvfp4", writeback="compensated")  # momentum + float32 compensation
    m = Toy(bias=True)
    apply_recipe(m, prec)
    opt = build_optimizer(m, OptimConfig(name="lion", lr=1e-4, weight_decay=0.1), prec)
    _train(m, opt, range(2))
    sd = copy.deepcopy(opt.state_dict())
    groups = [[opt._names[id(p)] for p in g["params"]] for g in opt.param_groups]
    assert len(groups) == 2 and all(len(g) >= 2 for g in groups)
    parts = [select_state(sd, [g[: len(g) // 2] for g in groups]), select_state(sd, [g[len(g) // 2 :] for g in groups])]
    exact_parts = [set(part["ida"]["exact_params"]) for part in parts]  # each part keeps its own exact copies
    assert not exact_parts[0] & exact_parts[1] and exact_parts[0] | exact_parts[1] == set(sd["ida"]["exact_params"])
    merged = merge_stage_states(parts)
    assert merged["param_groups"] == sd["param_groups"] and merged["state"].keys() == sd["state"].keys()
    for i, entry in sd["state"].items():
        assert entry.keys() == merged["state"][i].keys() and all(
            torch.equal(merged["state"][i][k], v) for k, v in entry.items()
        )
    exact = merged["ida"].pop("exact_params")
    want = dict(sd["ida"])
    assert exact.keys() == want.pop("exact_params").keys() and merged["ida"] == want
    opt2 = build_optimizer(m, OptimConfig(name="lion", lr=1e-4, weight_decay=0.1), prec)
    opt2.load_state_dict({**merged, "ida": {**merged["ida"], "exact_params": exact}})
    assert all(torch.equal(opt2.state[p]["momentum"], opt.state[p]["momentum"]) for p in opt.state)
    with pytest.raises(ValueError, match="disagree on \\['sr_step'\\]"):
        merge_stage_states([parts[0], parts[1] | {"ida": {**parts[1]["ida"], "sr_step": 7}}])
    with pytest.raises(ValueError, match="no state for \\['other.weight'\\]"):
        select_state(sd, [["other.weight"], []])
    # older ida: the stages' states side by side, each picked by its exact set of names
    old = copy.deepcopy(sd)
    del old["ida"]["param_order"]
    opt3 = build_optimizer(m, OptimConfig(name="lion", lr=1e-4, weight_decay=0.1), prec)
    opt3.load_state_dict({PIPELINE_STATES_KEY: [parts[0], old]})
    assert torch.equal(opt3.state[m.q_proj.weight]["compensation"], opt.state[m.q_proj.weight]["compensation"])
    with pytest.raises(ValueError, match="an older ida wrote this checkpoint"):
        opt3.load_state_dict({PIPELINE_STATES_KEY: [parts[0], parts[1]]})


def test_nvfp4_modules_lists_replaced_layers() -> None:
    m = Toy()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        apply_recipe(m, PrecisionConfig(recipe="nvfp4"))
    assert [n for n, _ in nvfp4_modules(m)] == ["q_proj"]


@pytest.mark.parametrize(
    "module",
    [
        "ida_trainer.precision",
        "ida_trainer.nvfp4_linear",
        "ida_trainer.memory",
        "ida_trainer.distributed",
        "ida_trainer.sharded",
        "ida_trainer.checkpoint",
        "ida_trainer.engine",
        "ida_trainer.cli",
    ],
)
def test_docstring_examples_run(module: str) -> None:
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0


def test_a_bf16_forward_holds_no_bf16_copy_of_the_whole_model(tok):
    """With activation checkpointing nothing is saved for backward, yet autocast's weight-cast cache kept the
    BF16 copy of every weight until the forward ended (2 B per parameter; under FSDP2, unsharded). The bf16
    recipe turns the cache off: when the last layer runs, only its own casts are alive, and the loss and the
    gradients are the cached forward's, bit for bit."""
    import weakref

    from torch.utils._python_dispatch import TorchDispatchMode

    from ida_trainer.config import ModelConfig
    from ida_trainer.demo import build_demo_model, corpus_texts
    from ida_trainer.engine import enable_activation_checkpointing
    from ida_trainer.precision import _autocast_forward

    model = build_demo_model(ModelConfig(hidden_size=32, intermediate_size=64, num_layers=4, num_heads=2), tok, seed=0)
    apply_recipe(model, PrecisionConfig(recipe="bf16"))
    enable_activation_checkpointing(model)
    model.train()
    weights = {id(p) for n, p in model.named_parameters() if p.dim() == 2 and "layers." in n}
    casts: list = []

    class Track(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is torch.ops.aten._to_copy.default and out.dtype == torch.bfloat16 and args[0].dim() == 2:
                casts.append(weakref.ref(out))
            return out

    alive_at_last_layer = []
    last = model.model.layers[-1]
    last.register_forward_pre_hook(lambda *_: alive_at_last_layer.append(sum(r() is not None for r in casts)))
    ids = torch.tensor([tok(corpus_texts()[0])["input_ids"][:32]])

    def loss_and_grads(cached: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        casts.clear()
        with Track():
            if cached:  # what the recipe did before: autocast's default, the cache on
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = type(model).forward(model, input_ids=ids, labels=ids).loss
            else:
                loss = _autocast_forward(model, input_ids=ids, labels=ids).loss
            loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    per_layer = len(weights) // 4
    want_loss, want_grads = loss_and_grads(cached=True)
    assert alive_at_last_layer[-1] >= 3 * per_layer  # the first three layers' copies, all still held
    got_loss, got_grads = loss_and_grads(cached=False)
    assert alive_at_last_layer[-1] == 0
    assert torch.equal(got_loss, want_loss) and all(
        torch.equal(a, b) for a, b in zip(got_grads, want_grads, strict=True)
    )


@pytest.mark.parametrize("recipe", ["nvfp4", "bf16"])
def test_a_tied_lm_head_is_saved_once_and_loads_tied(recipe: str) -> None:
    """Qwen3 ties lm_head to its input embedding: export_state holds the matrix once, under the embedding's name,
    as transformers' save_pretrained does (until 2026-12-07 it held it twice: 0.78 GB more per Qwen3-4B
    checkpoint). load_state fills a tied model from it, and still from an older ida's dict holding the copy; an
    untied model's lm_head is its own and is saved."""
    from tests.ida_eval.support import tiny_model

    def built(seed: int, tie: bool = True) -> nn.Module:
        model = tiny_model("qwen3", 64, seed=seed, tie=tie)
        apply_recipe(model, PrecisionConfig(recipe=recipe))
        return model

    state = export_state(built(0))
    assert "model.embed_tokens.weight" in state and "lm_head.weight" not in state
    older = {**state, "lm_head.weight": state["model.embed_tokens.weight"]}
    for tensors in (state, older):
        fresh = built(1)
        load_state(fresh, tensors)
        assert fresh.lm_head.weight is fresh.model.embed_tokens.weight
        assert torch.equal(fresh.lm_head.weight, state["model.embed_tokens.weight"])
    assert "lm_head.weight" in export_state(built(0, tie=False))
    with pytest.raises(ValueError, match=r"missing \['lm_head.weight'\]"):
        load_state(built(1, tie=False), state)
