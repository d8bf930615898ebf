//! Generation with a [`HybridLm`]: the prompts of one length prefilled together, then one
//! token at a time through the model's cache, through the same loop, sampler and settings as
//! [`Mamba2Lm::generate`](crate::Mamba2Lm::generate).
//!
//! The prompts of each length stay one batch from prefill to the end: attention's keys and
//! values of prompts of different lengths cannot share a tensor without padding, which the
//! Mamba layers' states do not take.

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::time::Instant;

use burn::tensor::{Int, Tensor, TensorData};

use super::{check_prompts, decode_loop, host_f32, DecodeStep, GenerateConfig, Generation};
use crate::error::Mamba2Error;
use crate::models::hybrid::{HybridCache, HybridLm};
use crate::sampling::Sampler;
use crate::ssd::SsdBackend;

/// The prompts of one length: their indices, their batch rows' first index in the logits,
/// their cache.
struct Group<B: SsdBackend> {
    prompts: Vec<usize>,
    first: usize,
    cache: HybridCache<B>,
}

impl<B: SsdBackend> HybridLm<B> {
    /// Generates a continuation of each of `prompts` (token ids, of any lengths): see
    /// [`generate_streaming`](Self::generate_streaming).
    pub fn generate(
        &self,
        prompts: &[Vec<i64>],
        config: &GenerateConfig,
    ) -> crate::error::Result<Generation> {
        self.generate_streaming(prompts, config, |_, _| ControlFlow::Continue(()))
    }

    /// Generates a continuation of each of `prompts`, calling `on_token(prompt index, token)`
    /// for every new token as soon as it is chosen; `ControlFlow::Break` ends the whole
    /// generation. Greedy or sampled as [`GenerateConfig`] says; the decode is the model's own
    /// [`step`](Self::step) ([`DecodeStep::Auto`] or [`DecodeStep::Tensor`]: a hybrid has no
    /// host step).
    pub fn generate_streaming(
        &self,
        prompts: &[Vec<i64>],
        config: &GenerateConfig,
        mut on_token: impl FnMut(usize, i64) -> ControlFlow<()>,
    ) -> crate::error::Result<Generation> {
        let vocab = self.vocab_size();
        check_prompts(prompts, vocab, config)?;
        if config.step == DecodeStep::Cpu {
            return Err(Mamba2Error::InvalidInput {
                name: "step",
                reason: "a hybrid model decodes with its tensor step (DecodeStep::Tensor or \
                         Auto); DecodeStep::Cpu is the Mamba-2 model's"
                    .into(),
            });
        }
        let mut sampler =
            Sampler::new(config.temperature, config.top_k, config.top_p, config.seed)?;
        let device = self.embedding.weight.lazy_device();

        // prefill: the prompts of one length in one batch, their rows together in the logits
        let start = Instant::now();
        let mut by_length: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (i, prompt) in prompts.iter().enumerate() {
            by_length.entry(prompt.len()).or_default().push(i);
        }
        let mut position = vec![0; prompts.len()];
        let mut last = Vec::with_capacity(prompts.len() * vocab);
        let mut groups = Vec::new();
        for (len, rows) in by_length {
            let first = last.len() / vocab;
            let ids: Vec<i64> = rows.iter().flat_map(|&r| prompts[r].clone()).collect();
            let ids =
                Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [rows.len(), len]), &device);
            let (logits, cache) = self.forward(ids, None)?;
            last.extend(host_f32(
                logits.narrow(1, len - 1, 1).reshape([rows.len(), vocab]),
            ));
            for (k, &r) in rows.iter().enumerate() {
                position[r] = first + k;
            }
            groups.push(Group {
                prompts: rows,
                first,
                cache,
            });
        }
        let prefill_time = start.elapsed();

        // decode: each group steps its rows while any of them goes on
        let start = Instant::now();
        let step = |next: &[i64], active: &[bool], logits: &mut [f32]| {
            for group in groups.iter_mut() {
                let rows = group.first..group.first + group.prompts.len();
                if !active[rows.clone()].iter().any(|&a| a) {
                    continue;
                }
                let ids = Tensor::<B, 1, Int>::from_data(
                    TensorData::new(next[rows.clone()].to_vec(), [rows.len()]),
                    &device,
                );
                let cache = std::mem::replace(&mut group.cache, self.empty_cache());
                let (out, cache) = self.step(ids, cache)?;
                group.cache = cache;
                logits[rows.start * vocab..rows.end * vocab].copy_from_slice(&host_f32(out));
            }
            Ok(())
        };
        let (tokens, finish) = decode_loop(
            &position,
            last,
            vocab,
            config,
            &mut sampler,
            &mut on_token,
            step,
        )?;
        Ok(Generation {
            tokens,
            finish,
            step: DecodeStep::Tensor,
            prompt_tokens: prompts.iter().map(Vec::len).sum(),
            prefill_time,
            decode_time: start.elapsed(),
        })
    }
}
