# The tutorial notes' experiments, one target per experiment ID (`make 302<TAB>` completes it).
# Each target is one call of labkit's CLI; the catalogue is labkit/experiments/catalogue.py and the
# chapter is book/megatron-bridge.ipynb.
#
#   make train-tp2-gpt2-large-2gpu SCALE=cpu      # 2 gloo ranks, a small model, on a laptop
#   make 302-cp2-gpt2xl-gbs4-len4096              # full size: one GPU per rank (2 GPUs)
#   make 302-cp2-gpt2xl-gbs4-len4096 ARGS=--megatron   # print the pretrain_gpt.py command instead
#   make experiments-report                       # every run in $(OUTDIR) vs measured vs labkit.calc
#
# Logs go to $(OUTDIR)/<ID>/logs.txt, in Megatron-LM's format.

PYTHON ?= python
SCALE ?= full
OUTDIR ?= outdir
ARGS ?=
RUN = $(PYTHON) -m labkit experiments run

.PHONY: experiments-list experiments-report train-baseline-gpt2-large-1gpu \
	train-dp2-gpt2-large-2gpu \
	train-tp2-gpt2-large-2gpu \
	train-sp2-gpt2-large-2gpu \
	train-cp2-gpt2-large-2gpu \
	train-pp2-gpt2-large-2gpu \
	301-cp1-gpt2xl-gbs4-len4096-oom \
	302-cp2-gpt2xl-gbs4-len4096 \
	304-cp4-gpt2xl-gbs4-len4096 \
	308-cp8-gpt2xl-gbs4-len4096 \
	311-gpt2xl-gbs4-len8192-cp8 \
	312-gpt2xl-gbs4-len16384-cp8 \
	313-gpt2xl-gbs8-len8192-cp8 \
	314-gpt2xl-gbs8-len8192-cp4-oom

experiments-list:
	$(PYTHON) -m labkit experiments list

experiments-report:
	$(PYTHON) -m labkit experiments report --outdir $(OUTDIR)

# note 003: GPT-2 large on 2x H200, one strategy per run
train-baseline-gpt2-large-1gpu:
	$(RUN) $@ --scale $(SCALE) --outdir $(OUTDIR) $(ARGS)
train-dp2-gpt2-large-2gpu:
	$(RUN) $@ --scale $(SCALE) --outdir $(OUTDIR) $(ARGS)
train-tp2-gpt2-large-2gpu:
	$(RUN) $@ --scale $(SCALE) --outdir $(OUTDIR) $(ARGS)
train-sp2-gpt2-large-2gpu:
	$(RUN) $@ --scale $(SCALE) --outdir $(OUTDIR) $(ARGS)
train-cp2-gpt2-large-2gpu:
	$(RUN) $@ --scale $(SCALE) --outdir $(OUTDIR) $(ARGS)
train-pp2-gpt2-large-2gpu:
	$(RUN) $@ --scale $(SCALE) --outdir $(OUTDIR) $(ARGS)

# note 004: GPT-2 XL with context parallelism on an 8x H100 node (rows r1-r8)
301-cp1-gpt2xl-gbs4-len4096-oom:
	$(RUN) $@ --scale $(SCALE) --outdir $(OUTDIR) $(ARGS)
302-cp2-gpt2xl-gbs4-len4096:
	$(RUN) $@ --scale $(SCALE) --outdir $(OUTDIR) $(ARGS)
304-cp4-gpt2xl-gbs4-len4096:
	$(RUN) $@ --scale $(SCALE) --outdir $(OUTDIR) $(ARGS)
308-cp8-gpt2xl-gbs4-len4096:
	$(RUN) $@ --scale $(SCALE) --outdir $(OUTDIR) $(ARGS)
311-gpt2xl-gbs4-len8192-cp8:
	$(RUN) $@ --scale $(SCALE) --outdir $(OUTDIR) $(ARGS)
312-gpt2xl-gbs4-len16384-cp8:
	$(RUN) $@ --scale $(SCALE) --outdir $(OUTDIR) $(ARGS)
313-gpt2xl-gbs8-len8192-cp8:
	$(RUN) $@ --scale $(SCALE) --outdir $(OUTDIR) $(ARGS)
314-gpt2xl-gbs8-len8192-cp4-oom:
	$(RUN) $@ --scale $(SCALE) --outdir $(OUTDIR) $(ARGS)
