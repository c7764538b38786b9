// The memory explorer's closed form, in the page: labkit.calc's memory_per_stage (labkit/calc/
// memory.py, params.py) and the rule book it applies (labkit/calc/rules.py validate, in Megatron's
// order, with its messages), transcribed line for line, so that any layout (24 GPUs, TP 3, PP 5) is
// answered at once, without waiting for Python to start. Megatron-LM's own estimate is not
// transcribed: Python (labkit.calc in Pyodide) adds it, and its full answer replaces this one.
// tests/test_browser_book.py checks memoryClosedForm against labkit_answers.memory() on random
// non-power-of-two layouts; the data (presets, precisions, GPUs) come from labkit_answers.memory_page_data.
(function () {
  "use strict";
  const X = window.labkitExplorers;
  const div = (a, b) => Math.floor(a / b);                   // Python's // on positive integers
  const rule = (text) => { throw new Error("rule: " + text); };

  function unevenHint(L, pp) {                               // labkit.calc.pipeline.uneven_split_hint
    if (pp === 1) return "";
    const hints = [];
    for (const [extra, args] of [[1, "account_for_loss_in_pipeline_split"],
      [2, "account_for_embedding_in_pipeline_split and account_for_loss_in_pipeline_split"]]) {
      if ((L + extra) % pp === 0) hints.push(`${args} ((${L}+${extra}) / ${pp} = ${div(L + extra, pp)} slots per stage)`);
    }
    const per = Math.ceil(L / pp), first = L - per * (pp - 1);
    if (first > 0) hints.push(`decoder_first_pipeline_num_layers=${first} (${pp - 1} more stages of ${per})`);
    return hints.length ? " (Megatron allows it with " + hints.join(", or ") + ")" : "";
  }

  // labkit_answers.memory_configs + rules.validate: the first broken rule, or the warnings.
  function check(M, s, v) {
    const tp = v.tensor_model_parallel_size, pp = v.pipeline_model_parallel_size, cp = v.context_parallel_size;
    const ep = v.expert_model_parallel_size, dp = v.data_parallel_size, mb = v.micro_batch_size;
    const vpp = v.virtual_stages, L = M.num_layers, world = tp * pp * cp * dp, etp = tp;
    const perStage = L % pp === 0 ? div(L, pp) : null;
    if (vpp > 1 && (perStage === null || perStage % vpp))
      throw new Error(`rule: layers per pipeline stage divisible by the model chunks per rank; ${L} layers / PP ${pp} / v ${vpp} is not a whole number`);
    if (L % pp) rule(`num_layers divisible by PP; ${L} % ${pp} != 0` + unevenHint(L, pp));                        // 2
    const vl = vpp > 1 ? div(perStage, vpp) : null;
    if (vpp > 1 && pp <= 1)
      rule(`the interleaved schedule needs PP > 1; num_layers_per_virtual_pipeline_stage=${vl} gives v=${vpp} with PP=${pp}`);   // 3
    if (cp > 1 && s % (2 * cp)) rule(`seq_length divisible by 2*CP; ${s} % ${2 * cp} != 0`);                        // 4
    if (M.max_position_embeddings !== null && M.max_position_embeddings < s)
      rule(`max_position_embeddings (${M.max_position_embeddings}) must be greater than or equal to seq_length (${s})`);  // 5
    if (ep > 1 && M.num_experts === null) rule(`expert_model_parallel_size > 1 needs num_experts; EP=${ep}`);       // 6
    if (M.num_experts !== null && M.num_experts % ep) rule(`num_experts divisible by EP; ${M.num_experts} % ${ep} != 0`);
    if (world % (etp * ep * pp))                                                                                   // 7
      rule(`world_size divisible by ETP*EP*PP (the expert grid); ${world} % (${etp}*${ep}*${pp}) != 0: with ETP = TP, EP must divide DP*CP = ${dp}*${cp}`);
    if (M.num_attention_heads % tp) rule(`num_attention_heads divisible by TP; ${M.num_attention_heads} % ${tp} != 0`);  // 8
    const g = M.query_groups;
    if (g % tp && tp % g) rule(`num_query_groups a multiple or a divisor of TP; ${g} and ${tp}`);
    for (const [name, t, axis] of [["ffn_hidden_size", tp, "TP"], ["moe_shared_expert_intermediate_size", tp, "TP"],
                                   ["moe_ffn_hidden_size", etp, "ETP"]]) {                                         // 9
      const size = M[name];
      if (size !== null && size % t) rule(`${name} divisible by ${axis} (column-parallel fc1); ${size} % ${t} != 0`);
    }
    if (v.sequence_parallel && tp > 1 && div(s, cp) % tp)                                                          // 10
      rule(`with sequence_parallel, seq_length / CP divisible by TP (each TP rank holds s/(CP*TP) positions); ${s} / ${cp} % ${tp} != 0`);
    if (vpp > 1 && v.num_microbatches % pp) rule(`with interleaving, num_microbatches divisible by PP; ${v.num_microbatches} % ${pp} != 0`);  // 11
    const warnings = [];
    if (v.sequence_parallel && tp === 1) warnings.push("sequence_parallel with TP=1 is a no-op (Megatron turns it off)");
    return { tp, pp, cp, ep, dp, mb, vpp, etp, world, edp: div(world, etp * ep * pp), warnings };
  }

  // labkit.calc.params: parameters on one rank
  const norm = (M) => (M.normalization === "LayerNorm" ? 2 : 1) * M.hidden_size;
  function mlp(M, ffn, tp) {
    const h = M.hidden_size, k = M.swiglu ? 2 : 1, bias = M.add_bias_linear;
    return div(h * ffn * k + (bias ? ffn * k : 0), tp) + div(ffn * h, tp) + (bias ? h : 0);
  }
  function layerParams(M, tp, ep, moe, etp) {
    const h = M.hidden_size, bias = M.add_bias_linear;
    const q = M.kv_channels * M.num_attention_heads, kv = M.kv_channels * M.query_groups;
    const qkv = div(h * (q + 2 * kv) + (bias ? q + 2 * kv : 0), tp);
    const proj = div(q * h, tp) + (bias ? h : 0);
    const qkNorm = M.qk_layernorm ? div(2 * norm(M) * M.kv_channels, h) : 0;
    let dense = 2 * norm(M) + qkNorm + qkv + proj, expert = 0;
    if (!moe) dense += mlp(M, M.ffn_hidden_size, tp);
    else {
      dense += h * M.num_experts;
      if (M.moe_shared_expert_intermediate_size) dense += mlp(M, M.moe_shared_expert_intermediate_size, tp);
      expert = div(M.num_experts, ep) * mlp(M, M.moe_ffn_hidden_size, etp);
    }
    return { dense, expert };
  }
  const paddedVocab = (M, tp) => { const k = M.make_vocab_size_divisible_by * tp; return Math.ceil(M.vocab_size / k) * k; };
  function stageParams(M, s, c, stage) {
    let dense = 0, expert = 0;
    const S = c.pp * c.vpp, n = div(M.num_layers, S);
    for (let chunk = 0; chunk < c.vpp; chunk++) {                   // Megatron's "loop" placement
      const vs = chunk * c.pp + stage;
      for (let i = vs * n; i < (vs + 1) * n; i++) {
        const l = layerParams(M, c.tp, c.ep, !!M.moe_layers[i], c.etp);
        dense += l.dense; expert += l.expert;
      }
    }
    const word = div(paddedVocab(M, c.tp) * M.hidden_size, c.tp);
    if (stage === 0) dense += word + (M.position_embedding_type === "learned_absolute" ? s * M.hidden_size : 0);
    if (stage === c.pp - 1) {
      dense += norm(M);
      if (M.untie_embeddings_and_output_weights || c.pp > 1) dense += word;
    }
    return { dense, expert };
  }
  function zero(n, dp, stage, bp, bg, bo) {                        // zero_memory_per_rank
    const shard = Math.ceil(n / dp);
    return { params: (stage >= 3 ? shard : n) * bp, grads: (stage >= 2 ? shard : n) * bg, optimizer: (stage >= 1 ? shard : n) * bo };
  }
  function layerActivation(M, s, c, rec, bytesAct, attention) {   // layer_activation_bytes, dropout on
    const sl = s / c.cp, b = c.mb, h = M.hidden_size, a = M.num_attention_heads, f = M.ffn_hidden_size, t = c.tp;
    const q = M.kv_channels * a, kv = M.kv_channels * M.query_groups;
    const sp = c.sp && t > 1;
    if (rec === "full") return sl * b * h * bytesAct / (sp ? t : 1);
    const mask = 1;
    const replicated = 4 * h * bytesAct + 2 * h * mask;
    const sharded = (2 * q + 2 * kv + (M.swiglu ? 2 * f : f) + f) * bytesAct;
    let attn;
    if (rec === "selective") attn = 0.0;
    else if (attention === "flash") attn = q * bytesAct + a * 4;
    else attn = a * s * (bytesAct * 2 + mask);
    const perToken = (sp ? replicated / t : replicated) + (sharded + attn) / t;
    return sl * b * perToken;
  }
  function inFlight(c, m, stage) {                                // in_flight_microbatches
    if (c.vpp === 1) return Math.min(c.pp - stage, m);
    return Math.min((c.pp - stage - 1) * 2 + (c.vpp - 1) * c.pp + 1, m * c.vpp) / c.vpp;
  }

  // The explorer's inputs -> the fields of labkit_answers.memory() except "megatron" (null here).
  function memoryClosedForm(data, v) {
    const M = data.models[v.model], P = data.precisions[v.precision], G = data.gpus[v.gpu];
    try {
      if (!M) throw new Error(`unknown model ${v.model}`);
      if (![0, 1, 2, 3].includes(v.zero_stage)) throw new Error(`zero_stage must be 0, 1, 2 or 3, got ${v.zero_stage}`);
      const s = v.seq_length, c = check(M, s, v);
      c.sp = !!v.sequence_parallel;
      const rec = v.recompute_granularity === "none" ? null : v.recompute_granularity;
      const m = v.num_microbatches, zs = Math.max(v.zero_stage, v.zero_stage >= 1 ? 1 : 0);
      const layers = div(M.num_layers, c.pp), sb = s / c.cp * c.mb;
      const stages = [];
      for (let stage = 0; stage < c.pp; stage++) {
        const p = stageParams(M, s, c, stage);
        const d = zero(p.dense, c.dp * c.cp, zs, P.param, P.grad, P.sharded);
        const e = zero(p.expert, c.edp, zs, P.param, P.grad, P.sharded);
        let act = layers * layerActivation(M, s, c, rec, P.activation, v.attention) * inFlight(c, m, stage);
        if (stage === 0) act += sb * M.hidden_size * inFlight(c, m, 0);
        if (stage === c.pp - 1) act += sb * (2 * M.hidden_size * P.activation + 4 * (paddedVocab(M, c.tp) / c.tp));
        if (rec === "full") act += layerActivation(M, s, c, null, P.activation, v.attention);
        const row = { params: d.params + e.params, grads: d.grads + e.grads, optimizer: d.optimizer + e.optimizer, activations: act };
        row.total = row.params + row.grads + row.optimizer + row.activations;
        stages.push(row);
      }
      let peak = 0;
      stages.forEach((r, i) => { if (r.total > stages[peak].total) peak = i; });
      return { world_size: c.world, global_batch_size: m * c.mb * c.dp, num_microbatches: m, virtual_stages: c.vpp,
               layers_per_stage: layers, stages, peak_bytes: stages[peak].total, peak_stage: peak,
               capacity_bytes: G.memory_bytes, gpu: G.name, attention: data.attention[v.attention],
               warnings: c.warnings, megatron: null };
    } catch (err) {
      return { error: err.message };
    }
  }
  X.memoryClosedForm = memoryClosedForm;
})();
