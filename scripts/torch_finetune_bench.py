#!/usr/bin/env python3
"""Fine-tuning speed and memory of transformers' `Trainer` on the CPU, full or with PEFT's
LoRA, beside the crate's bench on the same model and step:

    cargo run --release --example bench -- --preset 130m --mode train --seq-len 512 --iters 5 \\
        [--lora-rank 8]
    python3 scripts/torch_finetune_bench.py --preset 130m --seq-len 512 --iters 5 [--lora-rank 8]

The model is `Mamba2ForCausalLM` at a published shape (random weights: the step's cost does not
depend on them), in float32; each step is `Trainer`'s (forward, backward, AdamW, its data
loader and callbacks) on random ids of the model's vocabulary, with the crate bench's loss, the
mean square of the logits, so that both compute the same thing. LoRA: PEFT's adapters on the
targets the crate adapts by default (`in_proj` for Mamba-2), rank `--lora-rank`, alpha 16.
The first step is a warm-up; the line gives the median of the next `--iters` steps, tokens/s,
and the process's peak resident memory (weights, gradients, AdamW's state, activations).
Needs `pip install torch transformers peft accelerate`.
"""
import argparse
import json
import resource
import statistics
import tempfile
import time

import torch
from transformers import (Mamba2Config, Mamba2ForCausalLM, Trainer, TrainerCallback,
                          TrainingArguments)

# d_model, n_layer, d_state, vocabulary padded to a multiple of 16 (the crate's presets)
PRESETS = {"130m": (768, 24, 128, 50288), "370m": (1024, 48, 128, 50288)}

p = argparse.ArgumentParser()
p.add_argument("--preset", default="130m", choices=sorted(PRESETS))
p.add_argument("--seq-len", type=int, default=512)
p.add_argument("--batch", type=int, default=1)
p.add_argument("--iters", type=int, default=5)
p.add_argument("--threads", type=int, default=2)
p.add_argument("--lora-rank", type=int, default=0, help="0: every weight trains")
a = p.parse_args()
torch.set_num_threads(a.threads)
torch.manual_seed(0)

d_model, n_layer, d_state, vocab = PRESETS[a.preset]
cfg = Mamba2Config(vocab_size=vocab, hidden_size=d_model, num_hidden_layers=n_layer,
                   num_heads=2 * d_model // 64, head_dim=64, state_size=d_state, n_groups=1,
                   chunk_size=256, expand=2, tie_word_embeddings=True, pad_token_id=None,
                   bos_token_id=None, eos_token_id=None)
model = Mamba2ForCausalLM(cfg).float()
if a.lora_rank:
    from peft import LoraConfig, get_peft_model
    model = get_peft_model(model, LoraConfig(r=a.lora_rank, lora_alpha=16, lora_dropout=0.0,
                                             target_modules=["in_proj"]))
trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)

steps = a.iters + 1
ids = torch.randint(0, vocab, (steps * a.batch, a.seq_len))
data = [{"input_ids": row} for row in ids]


class MeanSquareTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        logits = model(input_ids=inputs["input_ids"], use_cache=False).logits
        return logits.pow(2).mean()


class StepTimes(TrainerCallback):
    def __init__(self):
        self.times, self.start = [], None

    def on_step_begin(self, args, state, control, **kw):
        self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kw):
        self.times.append(time.perf_counter() - self.start)


timer = StepTimes()
with tempfile.TemporaryDirectory() as out:
    args = TrainingArguments(output_dir=out, per_device_train_batch_size=a.batch,
                             max_steps=steps, learning_rate=1e-4, optim="adamw_torch",
                             lr_scheduler_type="constant", logging_strategy="no",
                             save_strategy="no", report_to=[], use_cpu=True,
                             dataloader_num_workers=0, disable_tqdm=True,
                             remove_unused_columns=False)
    trainer = MeanSquareTrainer(model=model, args=args, train_dataset=data,
                                data_collator=lambda rows: {
                                    "input_ids": torch.stack([r["input_ids"] for r in rows])},
                                callbacks=[timer])
    trainer.train()

med = statistics.median(timer.times[1:])
peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(dict(mode="train", impl="transformers-trainer", preset=a.preset,
                      lora_rank=a.lora_rank or None, trainable_params=trainable,
                      seq_len=a.seq_len, batch=a.batch, threads=a.threads, iters=a.iters,
                      median_s=med, tokens_per_s=a.batch * a.seq_len / med,
                      peak_rss_mb=peak_mb, torch=torch.__version__)))
