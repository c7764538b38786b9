"""The one rule book: Megatron-LM's start-up rules for a layout, in the order Megatron applies them.

Every entry point calls :func:`validate` (re-exported by ``labkit.calc.config``): ``labkit.train``
(``labkit.config.check``), ``megatron_estimate`` (``megatron_args``), the calculators and their
forms (``report.py``), the planner, ``python -m labkit estimate|train``; tests/test_rule_book.py
draws random layouts and checks that they all accept and refuse the same ones with the same message.
Each message starts "rule:" and names the numbers. Sizes are checked earlier, when a ModelConfig or
ParallelConfig is built (positive integers, hidden divisible by heads, world divisible by
TP*PP*CP: build the ParallelConfig first, as Megatron checks the world size first).

Order and conditions follow NVIDIA/Megatron-LM d98e8a64:

 1. global batch divisible by micro batch x DP        training/arguments.py validate_args (eval
                                                      batch, = global batch) and num_microbatches_calculator.py
 2. layers over PP (and virtual) stages, even/uneven  validate_args: "Number of layers should be
                                                      divisible by the pipeline-model-parallel size"
 3. interleaving (v > 1) needs PP > 1, or PP > 2      validate_args, after the virtual size is derived
    when p2p overlap is off                           (v = 1 is no interleaving: no condition)
 4. seq_length divisible by 2 x CP                    validate_args
 5. max_position_embeddings >= seq_length             validate_args
 6. EP needs experts; experts divisible by EP         validate_args, "Expert parallelism check"
 7. world divisible by ETP x EP x PP (expert grid)    core/parallel_state.py initialize_model_parallel
 8. heads divisible by TP; query groups a multiple    core/transformer/transformer_config.py __post_init__
    or a divisor of TP (KV heads replicated)          (attention.py replicates a group on TP/g ranks)
 9. column-parallel widths divisible by TP (ETP for   core/tensor_parallel/layers.py (divide() asserts)
    the experts)
10. with SP, the sequence s/CP divisible by TP        core/tensor_parallel/mappings.py
                                                      _split_along_first_dim, at the first forward
11. interleaving: microbatches divisible by PP        core/pipeline_parallel/schedules.py (group size
                                                      PP <= M, remainder 0), at the first step
"""
from __future__ import annotations

# ModelConfig and ParallelConfig (labkit.calc.config, which re-exports this module) are only named in
# annotations here: importing them would make a cycle


def virtual_pipeline_size(model: ModelConfig, par: ParallelConfig) -> int:
    """v = (layer slots per stage) / (layers per virtual stage); 1 without interleaving.

    Slots: the layers plus one for the embedding / the loss when ``account_for_*`` is set
    (Megatron arguments.py adds them before dividing by PP)."""
    if par.num_layers_per_virtual_pipeline_stage is None:
        return 1
    return _slots(model, par) // par.pp // par.num_layers_per_virtual_pipeline_stage


def _slots(model, par) -> int:
    return (model.num_layers + int(par.account_for_embedding_in_pipeline_split)
            + int(par.account_for_loss_in_pipeline_split))


def _check_pipeline_split(model: ModelConfig, par: ParallelConfig):
    """Megatron's rules for splitting the layers over PP (and v) stages, even or uneven."""
    from .pipeline import pipeline_layer_ranges, uneven_split_hint
    pp, vl = par.pp, par.num_layers_per_virtual_pipeline_stage
    if not par.uneven_pipeline:
        if model.num_layers % pp:
            raise ValueError(f"rule: num_layers divisible by PP; {model.num_layers} % {pp} != 0"
                             + uneven_split_hint(model.num_layers, pp))
    elif (par.decoder_first_pipeline_num_layers or par.decoder_last_pipeline_num_layers) and vl is not None:
        raise ValueError("rule: with decoder_first/last_pipeline_num_layers give the virtual size with "
                         "num_virtual_stages_per_pipeline_rank, not num_layers_per_virtual_pipeline_stage "
                         "(Megatron arguments.py); labkit does not model that combination")
    else:
        pipeline_layer_ranges(model.num_layers, pp, virtual_pipeline_size(model, par) if vl else 1,
                              par.decoder_first_pipeline_num_layers, par.decoder_last_pipeline_num_layers,
                              par.account_for_embedding_in_pipeline_split,
                              par.account_for_loss_in_pipeline_split)
    if vl is not None and (_slots(model, par) // pp) % vl:
        raise ValueError(f"rule: layers per pipeline stage divisible by layers per virtual "
                         f"stage; {_slots(model, par) // pp} % {vl} != 0")
    if virtual_pipeline_size(model, par) > 1:
        need = 1 if par.overlap_p2p_comm else 2
        if pp <= need:
            why = "" if par.overlap_p2p_comm else (" with overlap_p2p_comm off (two sends and two "
                                                   "receives between the same two ranks per batch)")
            raise ValueError(f"rule: the interleaved schedule needs PP > {need}{why}; "
                             f"num_layers_per_virtual_pipeline_stage={vl} gives v="
                             f"{virtual_pipeline_size(model, par)} with PP={pp}")


def check_query_groups(model: ModelConfig, tp: int) -> None:
    """Megatron's TransformerConfig: query groups a multiple or a divisor of TP."""
    g = model.query_groups
    if g % tp and tp % g:
        raise ValueError(f"rule: num_query_groups a multiple or a divisor of TP; {g} and {tp}")


def validate(model: ModelConfig, par: ParallelConfig) -> list:
    """Raise ValueError for the first broken Megatron rule (in Megatron's order); return warnings."""
    tp, pp, cp, ep, dp = par.tp, par.pp, par.cp, par.ep, par.dp
    mb = par.micro_batch_size
    if par.gbs % (mb * dp):                                                         # 1
        raise ValueError(f"rule: global_batch_size divisible by micro_batch_size * DP; "
                         f"{par.gbs} % ({mb} * {dp}) != 0")
    _check_pipeline_split(model, par)                                               # 2, 3
    if cp > 1 and model.seq_length % (2 * cp):                                      # 4
        raise ValueError(f"rule: seq_length divisible by 2*CP; {model.seq_length} % {2 * cp} != 0")
    if model.max_position_embeddings is not None and model.max_position_embeddings < model.seq_length:
        raise ValueError(f"rule: max_position_embeddings ({model.max_position_embeddings}) must be "
                         f"greater than or equal to seq_length ({model.seq_length})")   # 5
    if ep > 1 and model.num_experts is None:                                        # 6
        raise ValueError(f"rule: expert_model_parallel_size > 1 needs num_experts; EP={ep}")
    if model.num_experts is not None and model.num_experts % ep:
        raise ValueError(f"rule: num_experts divisible by EP; {model.num_experts} % {ep} != 0")
    if par.world_size % (par.etp * ep * pp):                                        # 7
        raise ValueError(f"rule: world_size divisible by ETP*EP*PP (the expert grid); "
                         f"{par.world_size} % ({par.etp}*{ep}*{pp}) != 0"
                         + (f": with ETP = TP, EP must divide DP*CP = {dp}*{cp}" if par.etp == tp else ""))
    if model.num_attention_heads % tp:                                              # 8
        raise ValueError(f"rule: num_attention_heads divisible by TP; "
                         f"{model.num_attention_heads} % {tp} != 0")
    check_query_groups(model, tp)
    for name, t, axis in (("ffn_hidden_size", tp, "TP"), ("moe_shared_expert_intermediate_size", tp, "TP"),
                          ("moe_ffn_hidden_size", par.etp, "ETP")):                 # 9: experts cut by ETP
        size = getattr(model, name)
        if size is not None and size % t:
            raise ValueError(f"rule: {name} divisible by {axis} (column-parallel fc1); {size} % {t} != 0")
    if par.sequence_parallel and tp > 1 and (model.seq_length // cp) % tp:          # 10
        raise ValueError(f"rule: with sequence_parallel, seq_length / CP divisible by TP (each TP rank "
                         f"holds s/(CP*TP) positions); {model.seq_length} / {cp} % {tp} != 0")
    m = par.gbs // (mb * dp)
    if virtual_pipeline_size(model, par) > 1 and m % pp:                            # 11
        raise ValueError(f"rule: with interleaving, num_microbatches divisible by PP; {m} % {pp} != 0")
    warnings = []
    if par.sequence_parallel and tp == 1:
        warnings.append("sequence_parallel with TP=1 is a no-op (Megatron turns it off)")
    if par.num_layers_per_virtual_pipeline_stage is not None and virtual_pipeline_size(model, par) == 1:
        warnings.append("num_layers_per_virtual_pipeline_stage equals the layers per stage: "
                        "v=1, no interleaving")
    return warnings
