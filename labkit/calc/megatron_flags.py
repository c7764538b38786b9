"""Megatron-LM's command-line arguments, as data: every flag ``pretrain_gpt.py`` accepts.

Generated (do not edit by hand) from NVIDIA/Megatron-LM commit
d98e8a64ddf34856e74b24714e3bedb2f5a39553 (2026-08-22): ``megatron/training/arguments.py``'s
``add_megatron_arguments`` was called on an ``argparse.ArgumentParser(allow_abbrev=False)``, as
``parse_args`` does, and every action of the parser was listed. That includes the flags
``ArgumentGroupFactory`` (``megatron/training/argument_utils.py``) builds from the config dataclasses,
which a text search of arguments.py would miss (839 actions; 876 flag spellings with the aliases).
Recipe: ``git archive`` the commit, ``import torch``, and with ``triton`` stubbed (imported by
``megatron/core/transformer/moe/ops/paged_stash.py``; nothing else was stubbed) run
``[(a.option_strings, a.dest, type(a).__name__, a.nargs, a.default) for a in parser._actions]``.

Each entry is a flag without its ``--``; ``flag=dest`` where the attribute differs from the flag's
name, ``flag=!dest`` for a switch that stores False (``--disable-bias-linear`` sets
``add_bias_linear`` to False). ``ESTIMATE_DEFAULTS`` are the parser's defaults of the arguments
``megatron_estimate`` reads (before ``validate_args`` derives the rest), ``CHOICES`` their choices.
Pure data: no torch, no Megatron needed to read it (tests and the browser use it).
"""
COMMIT = "d98e8a64ddf34856e74b24714e3bedb2f5a39553"

# flags that take no value (store_true, store_false, BooleanOptionalAction)
SWITCHES = """
account-for-embedding-in-pipeline-split account-for-loss-in-pipeline-split accumulate-allreduce-grads-in-fp32
add-qkv-bias adlr-autoresume allow-ambiguous-pad-tokens apply-layernorm-1p=layernorm_zero_centered_gamma
apply-query-key-layer-scaling apply-residual-connection-post-layernorm apply-wd-to-qk-layernorm
async-ckpt-use-cpu-shm async-save attention-output-gate attention-softmax-in-fp32 auto-detect-ckpt-format
batch-invariant-mode bert-no-binary-head=!bert_binary_head bf16 biencoder-shared-query-context-model
cache-mla-latents calc-ft-timeouts calculate-per-token-loss check-for-large-grads check-for-spiky-loss
checkpoint-activations ckpt-assume-constant-structure ckpt-convert-update-legacy-dist-opt-format
ckpt-drop-redundant-extra-state ckpt-fully-parallel-load ckpt-fully-parallel-load-per-rank-objects
ckpt-fully-parallel-save=ckpt_fully_parallel_save_deprecated ckpt-pg-tensors-cache-create
cpu-offloading-retain-pinned-cpu-buffers create-all-gather-group cross-entropy-loss-fusion data-parallel-random-init
dataloader-defer-npy-index-mmap dataloader-fast-cache-load dataloader-inter-document-masking
ddp-average-in-collective ddp-pad-buckets-for-high-nccl-busbw ddp-reduce-scatter-with-fp32-accumulation
decode-only-cuda-graphs decrease-batch-size-if-needed defer-embedding-wgrad-compute delay-offload-until-cuda-graph
delay-wgrad-compute deterministic-mode dino-norm-last-layer disable-align-grad-reduce=!align_grad_reduce
disable-bf16-reduced-precision-matmul disable-bias-linear=!add_bias_linear
disable-ckpt-load-validate-sharding-integrity=!ckpt_load_validate_sharding_integrity
disable-clone-scatter-output-in-embedding=!clone_scatter_output_in_embedding
disable-dsa-indexer-rotate-activation=!dsa_indexer_rotate_activation
disable-dsa-indexer-scoring-relu=!dsa_indexer_scoring_relu
disable-flight-recorder-dump-on-timeout=!flight_recorder_dump_on_timeout
disable-flight-recorder-extra-dump-on-exec=!flight_recorder_extra_dump_on_exec
disable-flight-recorder-include-only-active=!flight_recorder_include_only_active disable-fp8-wgrad=!fp8_wgrad
disable-gloo-process-groups=!use_gloo_process_groups disable-jit-fuser
disable-log-loss-scale-to-tensorboard=!log_loss_scale_to_tensorboard
disable-mamba-mem-eff-path=!use_mamba_mem_eff_path disable-manual-gc-eval=!manual_gc_eval
disable-msc=disable_msc_deprecated disable-pad-vocab-size=!pad_vocab_size
disable-save-tokenizer-assets=!save_tokenizer_assets disable-straggler-on-startup
disable-strict-fsdp-dtensor-load=!strict_fsdp_dtensor_load disable-symmetric-registration
disable-tokenizer-sentencepiece-ignore-extra-whitespaces=!tokenizer_sentencepiece_ignore_extra_whitespaces
disable-tp-comm-bulk-dgrad=!tp_comm_bulk_dgrad disable-tp-comm-bulk-wgrad=!tp_comm_bulk_wgrad
disable-tp-comm-overlap-ag=!tp_comm_overlap_ag disable-tp-comm-overlap-rs=!tp_comm_overlap_rs
disable-tp-comm-split-ag=!tp_comm_split_ag disable-tp-comm-split-rs=!tp_comm_split_rs
disable-use-tokenizer-model-from-checkpoint-args=!use_tokenizer_model_from_checkpoint_args
dist-ckpt-optim-fully-reshardable dist-ckpt-save-pre-mcore-014 distrib-optim-fully-reshardable-mem-efficient
distribute-saved-activations dsa-indexer-k-norm-fp32 dsa-indexer-rope-interleaved dsa-indexer-use-sparse-loss
enable-chunked-prefill enable-cuda-graph enable-experimental enable-ft-package enable-full-sharding-in-hsdp
enable-mhc-connections enable-msc eod-mask-loss ep-overlap-early-attn-memory-release exit-on-missing-checkpoint
exit-signal-handler exit-signal-handler-for-dataloader exit-signal-handler-for-training external-cuda-graph
fake-process-group fim-data fine-grained-activation-offloading finetune first-last-layers-bf16 flash-decode
flight-recorder-include-stack-trace fp16 fp16-lm-cross-entropy fp32-residual-connection fp4-param-gather
fp8-output-proj fp8-param-gather freeze-all-layers fsdp-db-use-persist-buf-on-alloc-fail fsdp-double-buffer
fsdp-manual-registration full-validation fused-residual-rmsnorm gdp-cutedsl-kernel grad-reduce-in-bf16
group-query-attention grpo-filter-groups-with-same-reward gtp-expert-remat-nccl-ub gtp-remat-nccl-ub
gtp-remat-reduce-scatter-with-fp32-accumulation high-priority-a2a-comm-stream hybrid-context-parallel
inference-cuda-graph-all-prefills inference-disable-ep-consensus inference-disable-triton-nvls-kernels
inference-dynamic-batching
inference-dynamic-batching-prefix-caching=inference_dynamic_batching_enable_prefix_caching
inference-dynamic-batching-track-generated-token-events inference-dynamic-batching-track-paused-request-events
inference-fuse-tp-communication inference-moe-disable-fused-quant-kernels inference-rng-tracker
inference-text-gen-server-logging inference-use-synchronous-zmq-collectives inference-wandb-logging
init-method-xavier-uniform init-model-with-meta-device inprocess-empty-cuda-cache inprocess-restart is-hybrid-model
keep-fp8-transpose-cache lazy-mpu-init load-main-params-from-ckpt log-device-memory-used log-energy
log-max-attention-logit log-memory-to-tensorboard log-num-zeros-in-grad log-params-norm log-progress log-straggler
log-throughput log-timers-to-tensorboard log-validation-ppl-to-tensorboard log-world-size-to-tensorboard
logits-load-ignore-errors manual-gc megatron-fsdp-enable-fine-grained-param-gather
megatron-fsdp-max-pool-double-buffer mla-down-proj-fusion mock-data moe-apply-probs-on-input moe-enable-deepep
moe-enable-routing-replay moe-grouped-gemm moe-hybridep-pad-uneven-dispatch-inputs moe-layer-recompute
moe-ncclep-zero-copy moe-pad-expert-input-to-capacity moe-pad-experts-for-cuda-graph-inference moe-paged-stash
moe-per-layer-logging moe-permute-fusion moe-permute-fusion-into-hybridep moe-router-enable-expert-bias
moe-router-force-load-balancing moe-router-fusion moe-router-padding-for-fp8 moe-router-padding-for-quantization
moe-router-pre-softmax moe-routing-trace-capture-hidden-states moe-routing-trace-capture-logits
moe-routing-trace-dump-weights moe-shared-expert-gate moe-shared-expert-overlap moe-single-grouped-bias
moe-single-grouped-weight moe-use-grouped-tensor moe-use-upcycling mtp-detach-heads mtp-hsm mtp-standalone
mtp-use-repeated-layer multi-latent-attention multiple-validation-sets muon-nesterov
muon-no-split-qkv=!muon_split_qkv muon-use-syrk nccl-all-reduce-for-prefill no-align-grad-reduce=!align_grad_reduce
no-align-param-gather=!align_param_gather no-barrier-with-level-1-timing=!barrier_with_L1_time
no-bias-dropout-fusion=!bias_dropout_fusion no-bias-gelu-fusion=!bias_gelu_fusion
no-bias-swiglu-fusion=!bias_swiglu_fusion no-check-for-nan-in-loss-and-grad=!check_for_nan_in_loss_and_grad
no-ckpt-fully-parallel-save=!ckpt_fully_parallel_save
no-ckpt-load-validate-sharding-integrity=!ckpt_load_validate_sharding_integrity
no-clone-scatter-output-in-embedding=!clone_scatter_output_in_embedding
no-create-attention-mask-in-dataloader=!create_attention_mask_in_dataloader no-data-sharding=!data_sharding
no-dsa-indexer-rotate-activation=!dsa_indexer_rotate_activation
no-dsa-indexer-scoring-relu=!dsa_indexer_scoring_relu
no-flight-recorder-dump-on-timeout=!flight_recorder_dump_on_timeout
no-flight-recorder-extra-dump-on-exec=!flight_recorder_extra_dump_on_exec
no-flight-recorder-include-only-active=!flight_recorder_include_only_active no-fp8-wgrad=!fp8_wgrad
no-gradient-accumulation-fusion=!gradient_accumulation_fusion
no-gradient-reduce-div-fusion=!gradient_reduce_div_fusion
no-inference-disable-ep-consensus=!inference_disable_ep_consensus
no-inference-dynamic-batching-prefix-caching=!inference_dynamic_batching_enable_prefix_caching
no-inference-text-gen-server-logging=!inference_text_gen_server_logging
no-inference-use-synchronous-zmq-collectives=!inference_use_synchronous_zmq_collectives
no-inference-wandb-logging=!inference_wandb_logging no-initialization=!perform_initialization no-load-optim
no-load-rng no-log-loss-scale-to-tensorboard=!log_loss_scale_to_tensorboard no-manual-gc-eval=!manual_gc_eval
no-masked-softmax-fusion=!masked_softmax_fusion no-mmap-bin-files=!mmap_bin_files no-one-logger=!enable_one_logger
no-overlap-p2p-communication=!overlap_p2p_comm no-pad-vocab-size=!pad_vocab_size no-persist-layer-norm
no-pin-cpu-grads=!pin_cpu_grads no-pin-cpu-params=!pin_cpu_params no-position-embedding=!add_position_embedding
no-rl-inference-logprobs-is-correction=!rl_inference_logprobs_is_correction
no-rl-offload-inference-model-weights-when-idle=!rl_offload_inference_model_weights_when_idle
no-rl-partial-rollouts=!rl_partial_rollouts no-rl-persist-cuda-graphs=!rl_persist_cuda_graphs
no-rl-skip-bos-token=!rl_skip_bos_token no-rl-training-cuda-graphs=!rl_training_cuda_graphs
no-rl-use-sequence-packing=!rl_use_sequence_packing no-rl-verify-model-weights-swap=!rl_verify_model_weights_swap
no-rope-fusion=!apply_rope_fusion no-save-optim no-save-rng no-save-tokenizer-assets=!save_tokenizer_assets
no-strict-fsdp-dtensor-load=!strict_fsdp_dtensor_load
no-tokenizer-sentencepiece-ignore-extra-whitespaces=!tokenizer_sentencepiece_ignore_extra_whitespaces
no-tp-comm-bulk-dgrad=!tp_comm_bulk_dgrad no-tp-comm-bulk-wgrad=!tp_comm_bulk_wgrad
no-tp-comm-overlap-ag=!tp_comm_overlap_ag no-tp-comm-overlap-rs=!tp_comm_overlap_rs
no-tp-comm-split-ag=!tp_comm_split_ag no-tp-comm-split-rs=!tp_comm_split_rs
no-use-layer-wise-param-layout=!use_layer_wise_param_layout
no-use-tokenizer-model-from-checkpoint-args=!use_tokenizer_model_from_checkpoint_args
no-yarn-correction-range-round-to-int=!yarn_correction_range_round_to_int nvtx-ranges one-logger-async openai-gelu
optimizer-cpu-offload optimizer-cuda-graph otel-enabled output-bert-embeddings overlap-cpu-optimizer-d2h-h2d
overlap-dispatch-backward-with-experts-wgrad overlap-grad-reduce overlap-moe-expert-parallel-comm
overlap-p2p-communication-warmup-flush=overlap_p2p_comm_warmup_flush overlap-param-gather
overlap-param-gather-with-optimizer-step override-opt-param-scheduler override-opt_param-scheduler perform-rl-step
profile pytorch-profiler-collect-callstack pytorch-profiler-collect-chakra pytorch-profiler-collect-shapes qk-clip
qk-l2-norm qk-layernorm quick-geglu recompute-activations record-memory-history record-shapes replication
reset-attention-mask reset-position-ids retriever-score-scaling reuse-grad-buf-for-mxfp8-param-ag
rl-durable-rollout-bank rl-inference-logprobs-is-correction rl-offload-inference-model-weights-when-idle
rl-offload-optimizer-during-inference rl-partial-rollouts rl-persist-cuda-graphs rl-profile rl-skip-bos-token
rl-training-cuda-graphs rl-use-sequence-packing rl-verify-model-weights-swap rotary-interleaved
run-workload-inspector-server sequence-parallel sft skip-train squared-relu swiglu te-rng-tracker test-mode
tokenizer-hf-no-include-special-tokens tokenizer-hf-no-use-fast tokenizer-sentencepiece-legacy
torch-fsdp2-no-reshard-after-forward=!torch_fsdp2_reshard_after_forward tp-comm-overlap tp-comm-overlap-rs-dgrad
trust-remote-code untie-embeddings-and-output-weights use-checkpoint-args use-checkpoint-opt-param-scheduler
use-checkpoint-opt_param-scheduler use-cpu-initialization use-dist-ckpt=use_dist_ckpt_deprecated
use-distributed-optimizer use-flash-attn use-fused-weighted-squared-relu use-gigatoken
use-grouped-gemm-for-dense-mlp use-grouped-gemm-for-shared-expert use-kitchen-attention use-legacy-static-engine
use-mcore-models=deprecated_use_mcore_models use-megatron-fsdp use-mp-args-from-checkpoint-args use-mup
use-nccl-ub=nccl_ub use-one-sent-docs use-persistent-ckpt-worker use-precision-aware-optimizer use-pytorch-profiler
use-ring-exchange-p2p use-rope-scaling use-rotary-position-embeddings
use-same-sampling-seed-across-dp-ranks=!offset_sampling_seed_by_dp_rank use-sharp use-te-activation-func
use-torch-fsdp2 use-torch-optimizer-for-cpu-offload use-tp-pp-dp-mapping use-transformer-engine-op-fuser
verify-integrity vision-pretraining yarn-correction-range-round-to-int
"""

# flags that take exactly one value
VALUES = """
activation-func-clamp-value activation-offload-fraction adam-beta1 adam-beta2 adam-eps adlr-autoresume-interval
app-tag-run-name app-tag-run-version async-ckpt-cpu-priority async-ckpt-io-priority async-strategy attention-backend
attention-dropout batch-invariant-backend batch-size bert-embedder-type bert-load biencoder-projection-dim
block-data-path chat-template check-weight-hash-across-dp-replicas-interval ckpt-convert-format ckpt-convert-save
ckpt-format ckpt-fully-parallel-load-exchange-algo ckpt-fully-parallel-load-process-group
ckpt-fully-parallel-save-process-group ckpt-pg-tensors-cache-path ckpt-step classes-fraction clip-grad
config-logger-dir context-parallel-size cpu-offloading-num-layers cross-entropy-fusion-impl cuda-graph-impl
cuda-graph-warmup-steps data-args-path data-cache-path data-parallel-sharding-strategy data-per-class-fraction
dataloader-type ddp-bucket-size ddp-num-buckets decoder-first-pipeline-num-layers decoder-last-pipeline-num-layers
decoder-num-layers decoder-seq-length decoupled-lr decoupled-min-lr delta-offload-bytes-across-pp-ranks
dino-bottleneck-size dino-freeze-last-layer dino-head-hidden-size dino-local-crops-number dino-local-img-size
dino-teacher-temp dino-warmup-teacher-temp dino-warmup-teacher-temp-epochs
dist-ckpt-format=dist_ckpt_format_deprecated dist-ckpt-strictness dist-ckpt-workers distributed-backend
distributed-timeout-minutes distributed-timeout-seconds-after-init dsa-indexer-head-dim dsa-indexer-k-norm-epsilon
dsa-indexer-loss-coeff dsa-indexer-n-heads dsa-indexer-skip-topk-offset dsa-indexer-topk dsa-indexer-topk-freq
dsa-kernel-backend dump-param-to-param-group-map embedding-init-method-std embedding-path empty-unused-memory-level
encoder-num-layers encoder-seq-length end-weight-decay error-injection-rate error-injection-type
eval-global-batch-size eval-interval eval-iters eval-micro-batch-size evidence-data-path exit-duration-in-mins
exit-interval exit-signal exp-avg-dtype exp-avg-sq-dtype experimental-attention-variant expert-model-parallel-size
expert-tensor-parallel-num-weight-shards expert-tensor-parallel-size fault-injector-delay-start-iteration
fault-injector-fault-delay fault-injector-fault-probabilities fault-injector-fault-types fault-injector-mtti-seconds
fault-injector-num-ranks fault-injector-offset-seconds fault-injector-ranks fault-injector-seed ffn-hidden-size
fim-eod-token fim-fragment-rate fim-middle-token fim-no-prefix fim-pad-token fim-prefix-token fim-rate
fim-split-sample fim-spm-rate fim-suffix-token fine-grained-offloading-max-inflight-offloads flash-attention-version
flight-recorder-dump-path flight-recorder-trace-buffer-size fp4-format=fp4 fp4-quantizer-factory fp4-recipe
fp8-amax-compute-algo fp8-amax-history-len fp8-format=fp8 fp8-interval fp8-margin fp8-quantizer-factory fp8-recipe
ft-num-warmup-iters gdp-num-chunk-states-to-recompute gdp-num-householder global-batch-size glu-linear-offset
gpu-sniff-test-interval grpo-clamp-eps-lower grpo-clamp-eps-upper grpo-entropy-term-weight grpo-group-size
grpo-iterations grpo-kl-beta grpo-prompts-per-step head-lr-mult heterogeneous-layers-config-encoded-json
heterogeneous-layers-config-path hidden-dropout hidden-size hybrid-layer-pattern hybrid-override-pattern hysteresis
ict-head-size ict-load img-h img-w indexer-batch-size indexer-log-interval inference-batch-times-seqlen-threshold
inference-coordinator-port inference-cuda-graph-max-tokens inference-cuda-graph-scope
inference-dynamic-batching-async-sched-mode inference-dynamic-batching-block-size
inference-dynamic-batching-buffer-size-gb inference-dynamic-batching-cuda-graph-mixed-prefill-count
inference-dynamic-batching-cuda-graph-sizing-distribution inference-dynamic-batching-logprobs-mode
inference-dynamic-batching-mamba-memory-ratio inference-dynamic-batching-max-requests
inference-dynamic-batching-max-tokens inference-dynamic-batching-num-cuda-graphs
inference-dynamic-batching-paused-buffer-size-gb inference-dynamic-batching-prefix-caching-coordinator-policy
inference-dynamic-batching-prefix-caching-eviction-policy inference-dynamic-batching-prefix-caching-mamba-gb
inference-dynamic-batching-prefix-caching-routing-alpha inference-dynamic-batching-sampling-backend
inference-dynamic-batching-unified-memory-level inference-grouped-gemm-backend inference-logging-step-interval
inference-max-requests inference-max-seq-length inference-moe-token-dispatcher-type inference-shards init-method-std
initial-loss-scale inprocess-active-world-size inprocess-barrier-timeout inprocess-completion-timeout
inprocess-granularity inprocess-hard-timeout inprocess-heartbeat-interval inprocess-heartbeat-timeout
inprocess-last-call-wait inprocess-max-iterations inprocess-monitor-process-interval
inprocess-monitor-thread-interval inprocess-progress-watchdog-interval inprocess-soft-timeout
inprocess-termination-grace-time iter-per-epoch kitchen-attention-backend kv-channels kv-lora-rank langrl-env-config
linear-attention-freq linear-conv-kernel-dim linear-key-head-dim linear-num-key-heads linear-num-value-heads
linear-value-head-dim lion-beta1 lion-beta2 load local-rank log-interval log-memory-interval logging-level
logits-load-decode-threads logits-load-dir logits-load-kd-loss-alpha logits-load-msc-prefetch-depth
logits-load-prefetch-factor logits-save-dir logits-save-dtype logits-save-top-k logits-save-top-p
logits-save-top-p-min-k loss-scale loss-scale-window lr lr-decay-iters lr-decay-samples lr-decay-style
lr-warmup-fraction lr-warmup-init lr-warmup-iters lr-warmup-samples lr-wsd-decay-iters lr-wsd-decay-samples
lr-wsd-decay-style main-grads-dtype main-params-dtype make-vocab-size-divisible-by mamba-head-dim
mamba-inference-conv-states-dtype mamba-inference-ssm-states-dtype mamba-num-groups mamba-num-heads mamba-state-dim
mamba-training-ssm-states-dtype manual-gc-interval mask-factor mask-prob mask-type max-position-embeddings
max-seqlen-per-dp-cp-rank max-tokens-to-oom megatron-fsdp-grad-comm-dtype megatron-fsdp-main-grads-dtype
megatron-fsdp-main-params-dtype megatron-fsdp-version memory-snapshot-path merge-file mhc-init-gating-factor
mhc-num-residual-streams mhc-recompute-layer-num mhc-sinkhorn-iterations micro-batch-size
microbatch-group-size-per-virtual-pipeline-stage=microbatch_group_size_per_vp_stage mid-level-dataset-surplus
min-loss-scale min-lr min-offloaded-tensor-size mlp-chunks-for-prefill mlp-chunks-for-training model-parallel-size
moe-combine-bwd-dtype moe-deepep-num-sms moe-dispatch-fwd-dtype moe-expert-capacity-factor
moe-expert-rank-capacity-factor moe-ffn-hidden-size moe-flex-dispatcher-backend moe-flex-dispatcher-num-sms
moe-hybridep-num-blocks-permute moe-hybridep-num-blocks-unpermute moe-hybridep-num-sms
moe-hybridep-num-sms-preprocessing moe-input-jitter-eps moe-latent-size moe-layer-freq moe-mlp-glu-interleave-size
moe-paged-stash-buffer-size-factor-cpu moe-paged-stash-buffer-size-factor-cuda moe-paged-stash-page-size
moe-router-bias-update-rate moe-router-dtype moe-router-force-biased moe-router-group-topk moe-router-num-groups
moe-router-quantile-balancing-ema moe-router-score-function moe-router-topk moe-router-topk-scaling-factor
moe-routing-trace-max-training-iters moe-routing-trace-path moe-shared-expert-glu-interleave-size
moe-shared-expert-intermediate-size moe-token-dispatcher-type moe-token-drop-policy moe-upcycling-granularity
moe-z-loss-coeff mscale mscale-all-dim mtp-hybrid-override-pattern mtp-loss-scaling-factor mtp-num-layers
muon-coefficient-type muon-extra-scale-factor muon-fp32-matmul-prec muon-momentum muon-num-ns-steps
muon-scalar-optimizer muon-scale-mode muon-tp-mode mup-attn-scale-power mup-base-head-dim mup-base-hidden-size
mup-embedding-mult mup-output-mult mup-width-mult nccl-communicator-config-path no-rope-freq
no-weight-decay-cond-type non-persistent-ckpt-type non-persistent-global-ckpt-dir non-persistent-local-ckpt-algo
non-persistent-local-ckpt-dir non-persistent-save-interval norm-epsilon=layernorm_epsilon normalization
null-tokenizer-eod-id null-tokenizer-pad-id num-attention-heads num-channels num-classes num-dataset-builder-threads
num-distributed-optimizer-instances num-experts num-layers num-layers-at-end-in-bf16 num-layers-at-start-in-bf16
num-layers-per-virtual-pipeline-stage num-query-groups num-speculative-tokens num-virtual-stages-per-pipeline-rank
num-workers object-storage-cache-path one-logger-project one-logger-run-name onnx-safe optimizer
optimizer-offload-fraction otel-service-name otel-span-groups outer-dp-sharding-strategy
output-logit-dtype=logit_dtype override-ckpt-iteration padded-vocab-size patch-dim per-dataset-sequences-path
per-split-data-args-path persistent-save-interval=save_interval phase-transition-iterations
pipeline-model-parallel-comm-backend pipeline-model-parallel-layout pipeline-model-parallel-size
position-embedding-type pretrained-checkpoint profile-step-end profile-step-start q-lora-rank qk-clip-alpha
qk-clip-threshold qk-head-dim qk-pos-emb-head-dim query-in-block-prob recompute-granularity recompute-method
recompute-num-layers refit-method relative-attention-max-distance relative-attention-num-buckets replication-factor
replication-jump rerun-mode result-rejected-tracker-filename rl-consumption-granularity rl-default-temperature
rl-default-top-k rl-default-top-p rl-generation-lag rl-importance-sampling-truncation-coef
rl-inference-expert-model-parallel-size rl-inference-expert-tensor-model-parallel-size
rl-inference-model-unified-memory-level rl-inference-pipeline-model-parallel-size
rl-inference-tensor-model-parallel-size rl-kv-cache-management-mode rl-max-inflight-requests rl-profile-dir
rl-prompts-per-eval rl-rollout-bank-dir rl-rollout-bank-max-bytes rl-sequence-packing-algo
rl-sequence-packing-max-sequences-per-bin rl-submission-granularity rope-scaling-factor rope-type rotary-base
rotary-percent rotary-scaling-factor rotary-seq-len-interpolation-factor sample-rate save save-activations-interval
save-dgrads-interval save-interval save-params-interval save-retain-interval save-tokens-per-expert-interval
save-wgrads-interval seed seq-length sft-tokenizer-prompt-format sgd-momentum sharp-enabled-group short-seq-prob
softmax-type split start-eval-at-iter start-weight-decay step-batch-size-schedule straggler-ctrlr-port
straggler-minmax-count suggested-communication-unit-size swin-backbone-type symmetric-ar-type
te-precision-config-file tensor-model-parallel-size tensor-parallel-num-weight-shards tensorboard-dir
tensorboard-log-interval tensorboard-queue-size tiktoken-num-special-tokens tiktoken-pattern timing-log-level
timing-log-option titles-data-path tokenizer-metadata=metadata_path tokenizer-model tokenizer-type
tp-comm-bootstrap-backend tp-comm-overlap-cfg train-iters train-samples train-sync-interval transformer-impl
v-head-dim vision-backbone-type vision-pretraining-type vocab-extra-ids vocab-file vocab-size wandb-entity
wandb-exp-name wandb-project wandb-save-dir warmup weight-decay weight-decay-incr-style wgrad-deferral-limit
window-attn-skip-freq window-size yaml-cfg yarn-beta-fast yarn-beta-slow yarn-original-max-position-embeddings
"""

# flags that take a list of values (nargs "+", "*" or 3)
LISTS = """
cp-comm-type cuda-graph-modules cuda-graph-scope=cuda_graph_scope_deprecated data-path
ddp-param-name-patterns-for-fp32-local-accumulation gtp-remat-opt-in-modules hierarchical-context-parallel-sizes
high-priority-stream-groups iterations-to-skip moe-aux-loss-coeff moe-router-load-balancing-type mrope-section
offload-modules profile-ranks rampup-batch-size recompute-modules retriever-report-topk-accuracies
rl-inference-parsers spec test-data-path tokenizer-special-tokens=special_tokens train-data-path valid-data-path
validation-set-names
"""

ESTIMATE_DEFAULTS = dict(
    num_layers=None, encoder_num_layers=None, hidden_size=None, num_attention_heads=None, kv_channels=None,
    group_query_attention=False, num_query_groups=1, num_experts=None, swiglu=False,
    moe_shared_expert_intermediate_size=None, moe_layer_freq=1, moe_ffn_hidden_size=None, mtp_num_layers=None,
    normalization='LayerNorm', multi_latent_attention=False, q_lora_rank=None, kv_lora_rank=32, qk_head_dim=128,
    qk_pos_emb_head_dim=64, v_head_dim=128, padded_vocab_size=None, vocab_size=None,
    make_vocab_size_divisible_by=128, pad_vocab_size=True, untie_embeddings_and_output_weights=False,
    ffn_hidden_size=None, moe_latent_size=None, moe_router_topk=2, add_bias_linear=True,
    moe_shared_expert_gate=False, expert_tensor_parallel_size=None, expert_model_parallel_size=1,
    pipeline_model_parallel_size=1, tensor_model_parallel_size=1, context_parallel_size=1,
    use_distributed_optimizer=False, seq_length=None, encoder_seq_length=None, micro_batch_size=None,
    global_batch_size=None, num_layers_per_virtual_pipeline_stage=None, num_virtual_stages_per_pipeline_rank=None,
    sequence_parallel=False, recompute_granularity=None, recompute_activations=False, attention_output_gate=False,
    position_embedding_type='learned_absolute', max_position_embeddings=None, use_megatron_fsdp=False,
    megatron_fsdp_version=1, decoder_first_pipeline_num_layers=None, decoder_last_pipeline_num_layers=None,
    account_for_embedding_in_pipeline_split=False, account_for_loss_in_pipeline_split=False,
    overlap_p2p_comm=True)

CHOICES = dict(
    normalization=['LayerNorm', 'RMSNorm'], recompute_granularity=['full', 'selective'],
    position_embedding_type=['learned_absolute', 'rope', 'yarn', 'mrope', 'relative', 'none'],
    megatron_fsdp_version=[1, 2])
