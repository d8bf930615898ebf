//! Generation with a [`Mamba2Lm`]: each prompt prefilled with the chunked forward, then one new
//! token at a time through the recurrent step, greedy or sampled, until a stop token or the
//! length limit, for a batch of prompts of any lengths, every token handed to a callback as
//! it is chosen. The same loop drives the hybrid models (`hybrid`).

mod hybrid;

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use burn::config::Config;
use burn::tensor::{backend::Backend, Int, Tensor, TensorData};

use crate::error::Mamba2Error;
use crate::layers::state::BackboneState;
use crate::models::lm::{check_in_vocab, Mamba2Lm};
use crate::recurrent::{CpuLm, CpuLmState};
use crate::sampling::Sampler;
use crate::ssd::SsdBackend;

/// Settings of [`Mamba2Lm::generate`].
#[derive(Config, Debug)]
pub struct GenerateConfig {
    /// New tokens per prompt at most. Default: 32.
    #[config(default = 32)]
    pub max_new_tokens: usize,
    /// Sampling temperature; 0 takes the most likely token (greedy). Default: 0.
    #[config(default = 0.0)]
    pub temperature: f64,
    /// Sample only among the k most likely tokens (`None`: all). Default: None.
    pub top_k: Option<usize>,
    /// Sample only among the most likely tokens whose probabilities reach p, in (0, 1]
    /// (`None`: all). Default: None.
    pub top_p: Option<f64>,
    /// Seed of the sampler. Default: 0.
    #[config(default = 0)]
    pub seed: u64,
    /// A prompt's generation ends with the first of these tokens it produces (the end of
    /// sequence token, for example), which is kept as its last new token. Default: none.
    #[config(default = "Vec::new()")]
    pub stop_tokens: Vec<i64>,
    /// Which recurrent step decodes. Default: [`DecodeStep::Auto`].
    #[config(default = "DecodeStep::Auto")]
    pub step: DecodeStep,
}

/// The recurrent step that decodes.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum DecodeStep {
    /// [`CpuLm`] for a model on burn-ndarray in `f32`, the tensor step otherwise.
    Auto,
    /// The model's own [`Mamba2Lm::step`], on its backend and device.
    Tensor,
    /// [`CpuLm`]: the weights copied once to host `f32` vectors, then plain loops per token
    /// (for a model of any backend).
    Cpu,
}

/// Why a prompt's generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// It produced one of the stop tokens.
    Stop,
    /// It reached `max_new_tokens`.
    Length,
    /// The callback broke off the generation.
    Cancelled,
}

/// The result of [`Mamba2Lm::generate`].
#[derive(Clone, Debug)]
pub struct Generation {
    /// The new tokens of each prompt, in the prompts' order.
    pub tokens: Vec<Vec<i64>>,
    /// Why each prompt's generation ended.
    pub finish: Vec<Finish>,
    /// The step that decoded ([`DecodeStep::Tensor`] or [`DecodeStep::Cpu`]).
    pub step: DecodeStep,
    /// Prompt tokens, all prompts together.
    pub prompt_tokens: usize,
    /// Time of the prefill (every prompt, up to the logits of the first new token).
    pub prefill_time: Duration,
    /// Time of the decode (with the copy of the weights for [`DecodeStep::Cpu`]).
    pub decode_time: Duration,
}

impl Generation {
    /// New tokens, all prompts together.
    pub fn new_tokens(&self) -> usize {
        self.tokens.iter().map(Vec::len).sum()
    }
}

impl<B: SsdBackend> Mamba2Lm<B> {
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
    /// for every new token as soon as it is chosen (tokens of one step in the prompts' order);
    /// `ControlFlow::Break` ends the whole generation.
    ///
    /// The prompts are prefilled with the chunked forward (those of one length together),
    /// then decoded one token per step with the step of `config.step`. Greedy or sampled
    /// (`temperature`, `top_k`, `top_p`, from `seed`), each prompt until it produces one of the
    /// `stop_tokens` or reaches `max_new_tokens`.
    pub fn generate_streaming(
        &self,
        prompts: &[Vec<i64>],
        config: &GenerateConfig,
        mut on_token: impl FnMut(usize, i64) -> ControlFlow<()>,
    ) -> crate::error::Result<Generation> {
        let vocab = self.vocab_size();
        check_prompts(prompts, vocab, config)?;
        let mut sampler =
            Sampler::new(config.temperature, config.top_k, config.top_p, config.seed)?;
        let step = match config.step {
            DecodeStep::Auto if is_ndarray_f32::<B>() => DecodeStep::Cpu,
            DecodeStep::Auto => DecodeStep::Tensor,
            other => other,
        };

        let start = Instant::now();
        let Prefill {
            position,
            logits: last,
            state,
        } = self.prefill(prompts)?;
        let prefill_time = start.elapsed();
        let start = Instant::now();
        let n = prompts.len();
        let mut decoder = match step {
            DecodeStep::Cpu => {
                let cpu = CpuLm::from_lm(self);
                let states = (0..n)
                    .map(|i| cpu.state_from(self, &state, i))
                    .collect::<crate::error::Result<Vec<_>>>()?;
                Decoder::Cpu { lm: cpu, states }
            }
            _ => Decoder::Tensor { state },
        };
        let (tokens, finish) = decode_loop(
            &position,
            last,
            vocab,
            config,
            &mut sampler,
            &mut on_token,
            |next, active, logits| decoder.step(self, next, active, logits),
        )?;
        Ok(Generation {
            tokens,
            finish,
            step,
            prompt_tokens: prompts.iter().map(Vec::len).sum(),
            prefill_time,
            decode_time: start.elapsed(),
        })
    }

    /// The chunked forward over every prompt, those of one length in one batch.
    fn prefill(&self, prompts: &[Vec<i64>]) -> crate::error::Result<Prefill<B>> {
        let device = self.embedding.weight.lazy_device();
        let vocab = self.vocab_size();
        let mut by_length: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (i, prompt) in prompts.iter().enumerate() {
            by_length.entry(prompt.len()).or_default().push(i);
        }
        let mut position = vec![0; prompts.len()];
        let mut logits = Vec::with_capacity(prompts.len() * vocab);
        let mut states = Vec::new();
        for (len, rows) in by_length {
            let group: Vec<Vec<i64>> = rows.iter().map(|&r| prompts[r].clone()).collect();
            let (all, state) = self.forward(self.input_ids(&group, &device)?, None)?;
            let first = logits.len() / vocab;
            for (k, &row) in rows.iter().enumerate() {
                position[row] = first + k;
            }
            logits.extend(host_f32(
                all.narrow(1, len - 1, 1).reshape([rows.len(), vocab]),
            ));
            states.push(state);
        }
        let state = if states.len() == 1 {
            states.pop().expect("one state")
        } else {
            BackboneState::cat(states)
        };
        Ok(Prefill {
            position,
            logits,
            state,
        })
    }
}

/// Checks what every model's `generate` is given: at least one prompt, none empty, every token
/// and stop token in the vocabulary.
pub(crate) fn check_prompts(
    prompts: &[Vec<i64>],
    vocab: usize,
    config: &GenerateConfig,
) -> crate::error::Result<()> {
    if prompts.is_empty() {
        return Err(Mamba2Error::InvalidInput {
            name: "prompts",
            reason: "no prompt".into(),
        });
    }
    if let Some(i) = prompts.iter().position(Vec::is_empty) {
        return Err(Mamba2Error::InvalidInput {
            name: "prompts",
            reason: format!("prompt {i} is empty"),
        });
    }
    for prompt in prompts {
        check_in_vocab(prompt, vocab, None, "input_ids")?;
    }
    check_in_vocab(&config.stop_tokens, vocab, None, "stop_tokens")
}

/// The decode loop of every model's `generate`: picks each prompt's next token from its row of
/// `last` (`[b, vocab]` on the host; prompt `i` is batch row `position[i]`), hands it to
/// `on_token`, ends the prompt at a stop token or the length limit, and asks `step` for the
/// next logits of the batch (`step(tokens by row, whether each row goes on, logits)`), until
/// every prompt has ended. Returns each prompt's new tokens and why it ended.
pub(crate) fn decode_loop(
    position: &[usize],
    mut last: Vec<f32>,
    vocab: usize,
    config: &GenerateConfig,
    sampler: &mut Sampler,
    on_token: &mut impl FnMut(usize, i64) -> ControlFlow<()>,
    mut step: impl FnMut(&[i64], &[bool], &mut [f32]) -> crate::error::Result<()>,
) -> crate::error::Result<(Vec<Vec<i64>>, Vec<Finish>)> {
    let n = position.len();
    // the prompt in each batch row
    let mut row_at = vec![0; n];
    for (row, &pos) in position.iter().enumerate() {
        row_at[pos] = row;
    }
    let mut tokens = vec![Vec::new(); n];
    let mut finish: Vec<Option<Finish>> = vec![None; n];
    if config.max_new_tokens == 0 {
        finish.fill(Some(Finish::Length));
    }
    // the last token of each batch row (a finished row keeps stepping on its last token)
    let mut next = vec![0i64; n];
    'decode: while finish.iter().any(Option::is_none) {
        for row in 0..n {
            if finish[row].is_some() {
                continue;
            }
            let pos = position[row];
            let token = sampler.pick(&last[pos * vocab..(pos + 1) * vocab]) as i64;
            next[pos] = token;
            tokens[row].push(token);
            if on_token(row, token).is_break() {
                for f in finish.iter_mut().filter(|f| f.is_none()) {
                    *f = Some(Finish::Cancelled);
                }
                break 'decode;
            }
            if config.stop_tokens.contains(&token) {
                finish[row] = Some(Finish::Stop);
            } else if tokens[row].len() >= config.max_new_tokens {
                finish[row] = Some(Finish::Length);
            }
        }
        if finish.iter().any(Option::is_none) {
            let active: Vec<bool> = row_at.iter().map(|&row| finish[row].is_none()).collect();
            step(&next, &active, &mut last)?;
        }
    }
    let finish = finish
        .into_iter()
        .map(|f| f.unwrap_or(Finish::Length))
        .collect();
    Ok((tokens, finish))
}

/// What the prefill leaves: where each prompt is in the batch, the batch's last logits
/// `[b, vocab]` on the host, its state.
struct Prefill<B: Backend> {
    position: Vec<usize>,
    logits: Vec<f32>,
    state: BackboneState<B>,
}

/// The decoding step and its state.
enum Decoder<B: Backend> {
    Tensor { state: BackboneState<B> },
    Cpu { lm: CpuLm, states: Vec<CpuLmState> },
}

impl<B: Backend> Decoder<B> {
    /// Steps every batch row on its token (the tensor step) or the `active` ones (the CPU
    /// step), writing the next logits into `logits` `[b, vocab]`.
    fn step(
        &mut self,
        model: &Mamba2Lm<B>,
        tokens: &[i64],
        active: &[bool],
        logits: &mut [f32],
    ) -> crate::error::Result<()>
    where
        B: SsdBackend,
    {
        match self {
            Decoder::Tensor { state } => {
                let device = model.embedding.weight.lazy_device();
                let ids = Tensor::<B, 1, Int>::from_data(
                    TensorData::new(tokens.to_vec(), [tokens.len()]),
                    &device,
                );
                let (next, new_state) = model.step(ids, state.clone())?;
                *state = new_state;
                logits.copy_from_slice(&host_f32(next));
            }
            Decoder::Cpu { lm, states } => {
                let vocab = lm.vocab_size();
                for (pos, state) in states.iter_mut().enumerate() {
                    if active[pos] {
                        lm.step(
                            tokens[pos],
                            state,
                            &mut logits[pos * vocab..(pos + 1) * vocab],
                        )?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// A tensor's values on the host in `f32`.
pub(crate) fn host_f32<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data()
        .convert::<f32>()
        .to_vec()
        .expect("f32 data after convert")
}

/// Whether `B` is burn-ndarray in `f32`, whose model [`CpuLm`] steps faster than its tensors.
#[cfg_attr(not(feature = "ndarray"), allow(clippy::extra_unused_type_parameters))]
fn is_ndarray_f32<B: Backend>() -> bool {
    #[cfg(feature = "ndarray")]
    {
        std::any::TypeId::of::<B>() == std::any::TypeId::of::<burn::backend::NdArray<f32>>()
    }
    #[cfg(not(feature = "ndarray"))]
    {
        false
    }
}
