"""Property tests (hypothesis) over random layouts: only ValueError with a message, finite
non-negative outputs, and memory per GPU that never grows when TP, CP, EP, or DP with a sharded
optimizer grows (labkit's own model, chapter "Why parallelism")."""
import math

from hypothesis import HealthCheck, given, settings, strategies as st

import labkit.calc as c

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
pow2 = st.sampled_from([1, 2, 4, 8])


@st.composite
def model_configs(draw):
    heads = draw(st.sampled_from([4, 8, 16]))
    groups = draw(st.sampled_from([None, 1, 2, 4]))
    experts = draw(st.sampled_from([None, 4, 8]))
    return c.ModelConfig(
        num_layers=draw(st.sampled_from([2, 4, 6, 8, 12])), hidden_size=heads * draw(st.sampled_from([8, 16])),
        num_attention_heads=heads, num_query_groups=groups, seq_length=draw(st.sampled_from([16, 32, 48, 64])),
        vocab_size=draw(st.integers(50, 600)), swiglu=draw(st.booleans()),
        ffn_hidden_size=draw(st.sampled_from([None, 96, 128])), num_experts=experts,
        moe_router_topk=1 if experts is None else draw(st.sampled_from([1, 2])),
        untie_embeddings_and_output_weights=draw(st.booleans()),
        normalization=draw(st.sampled_from(["LayerNorm", "RMSNorm"])))


@st.composite
def layouts(draw):
    tp, pp, cp, dp, ep = draw(pow2), draw(st.sampled_from([1, 2, 3, 4])), draw(pow2), draw(pow2), draw(pow2)
    mb, m = draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 2, 4, 6, 8]))
    return dict(world_size=tp * pp * cp * dp, tensor_model_parallel_size=tp,
                pipeline_model_parallel_size=pp, context_parallel_size=cp,
                expert_model_parallel_size=ep, micro_batch_size=mb, global_batch_size=mb * dp * m,
                sequence_parallel=draw(st.booleans()), zero_stage=draw(st.sampled_from([0, 1, 2, 3])),
                num_layers_per_virtual_pipeline_stage=draw(st.sampled_from([None, 1, 2])),
                recompute_granularity=draw(st.sampled_from([None, "selective", "full"])))


def _finite_nonneg(x):
    return isinstance(x, (int, float)) and math.isfinite(x) and x >= 0


@SETTINGS
@given(model_configs(), layouts())
def test_only_value_errors_and_finite_nonnegative_outputs(model, par_kw):
    try:
        par = c.ParallelConfig(**par_kw)
        rows = c.memory_per_stage(model, par)
        batch = c.batch_math(model, par)
        est = c.megatron_estimate(par.world_size, **c.flops.megatron_kwargs(model, par))
    except ValueError as err:
        assert str(err)  # a message naming the rule
        return
    for row in rows:
        assert all(_finite_nonneg(v) for v in row.values())
    assert all(_finite_nonneg(batch[k]) for k in ("num_microbatches", "tokens_per_step"))
    assert all(_finite_nonneg(est[k]) for k in ("weight_and_optimizer_bytes", "activation_bytes",
                                                "flops_per_iteration"))


def _peak(model, **kw):
    try:
        return c.peak_memory(model, c.ParallelConfig(**kw))
    except ValueError:
        return None


@SETTINGS
@given(model_configs(), layouts(), st.sampled_from(["tp", "cp", "ep", "dp"]))
def test_memory_per_gpu_never_grows_with_more_sharding(model, kw, axis):
    if axis == "dp":
        kw["zero_stage"] = max(kw["zero_stage"], 1)   # DP lowers memory only with a sharded optimizer
    if model.num_experts is None:                     # make most drawn layouts valid
        kw["expert_model_parallel_size"] = 1
        axis = "dp" if axis == "ep" else axis
    kw["num_layers_per_virtual_pipeline_stage"] = None
    before = _peak(model, **kw)
    if before is None:
        return
    key = {"tp": "tensor_model_parallel_size", "cp": "context_parallel_size",
           "ep": "expert_model_parallel_size"}.get(axis)
    grown = dict(kw)
    if axis == "dp":  # twice the replicas, same microbatches per replica
        grown["world_size"] *= 2
        grown["global_batch_size"] *= 2
    elif axis == "ep":
        grown[key] *= 2
    else:
        grown[key] *= 2
        grown["world_size"] *= 2
    after = _peak(model, **grown)
    if after is None:
        return
    assert after <= before * (1 + 1e-12), (axis, before, after)


@SETTINGS
@given(st.integers(1, 16), st.integers(1, 64), st.integers(1, 4))
def test_bubble_matches_definition(p, m, v):
    assert math.isclose(c.bubble_fraction(p, m, v) * v * m, p - 1, abs_tol=1e-12)


@SETTINGS
@given(st.integers(0, 10**12), st.integers(1, 1024))
def test_all_reduce_is_reduce_scatter_plus_all_gather(n_bytes, n):
    assert math.isclose(c.ring_all_reduce_bytes(n_bytes, n),
                        c.reduce_scatter_bytes(n_bytes, n) + c.all_gather_bytes(n_bytes, n))
