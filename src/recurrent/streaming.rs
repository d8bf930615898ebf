//! Streaming forecasts: one new observation at a time, in constant time and memory.
//!
//! [`StreamingForecaster`] carries the recurrent state of a trained
//! [`Mamba2Forecaster`] from tick to tick on the dedicated CPU path ([`crate::cpu`]): each
//! [`push`](StreamingForecaster::push) runs the input projection, one step of every block and
//! the head, whatever the length of the history. Its forecast after `t` observations equals the
//! forecaster's batch forward over those `t` observations (tested).
//!
//! RevIN normalises each window by statistics of the whole window, which change with every new
//! observation, so a model trained with RevIN cannot be continued step by step: stream a model
//! trained with `revin = false` on data standardised with fixed statistics (as
//! [`ForecastData`](crate::data::timeseries::ForecastData) does).

use burn::tensor::backend::Backend;

use super::backbone::{CpuBackbone, CpuLinear, CpuState};
use crate::error::Mamba2Error;
use crate::models::forecaster::Mamba2Forecaster;

/// A forecaster that updates its state with each new observation (see the module
/// documentation).
///
/// ```
/// use burn::backend::NdArray;
/// use mamba2_burn::{Mamba2BackboneConfig, Mamba2Config, Mamba2ForecasterConfig, StreamingForecaster};
///
/// fn main() -> Result<(), mamba2_burn::Mamba2Error> {
///     let device = Default::default();
///     let mixer = Mamba2Config::new(32).with_d_state(16).with_headdim(16).with_chunk_size(32);
///     // 3 variables in, the next 12 steps of each out; trained elsewhere, e.g. with train_forecaster
///     let model = Mamba2ForecasterConfig::new(3, 3, 12, Mamba2BackboneConfig::new(2, mixer))
///         .with_revin(false)
///         .init::<NdArray<f32>>(&device)?;
///     let mut stream = StreamingForecaster::new(&model)?;
///     for tick in [[0.1f32, -0.3, 1.2], [0.2, -0.1, 1.0]] {
///         let forecast = stream.push(&tick)?; // [horizon, n_targets], row-major
///         assert_eq!(forecast.len(), 12 * 3);
///     }
///     Ok(())
/// }
/// ```
#[derive(Clone, Debug)]
pub struct StreamingForecaster {
    input: CpuLinear,
    backbone: CpuBackbone,
    head: CpuLinear,
    channel_independent: bool,
    n_inputs: usize,
    n_targets: usize,
    horizon: usize,
    /// One state per variable (channel-independent) or one for all.
    states: Vec<CpuState>,
    embedded: Vec<f32>,
    hidden: Vec<f32>,
    head_out: Vec<f32>,
    forecast: Vec<f32>,
    seen: usize,
}

impl StreamingForecaster {
    /// Copies the weights of `model` (any backend) for streaming from an empty history.
    ///
    /// Fails with [`Mamba2Error::InvalidConfig`] when the model uses RevIN (field `revin`),
    /// patches of more than one step (`patch_len`) or the flatten head (`head`).
    pub fn new<B: Backend>(model: &Mamba2Forecaster<B>) -> crate::error::Result<Self> {
        if model.patch_len() != 1 {
            return Err(Mamba2Error::config(
                "patch_len",
                "a streaming forecaster takes one observation per token: patch_len = 1",
            ));
        }
        if model.flatten_head() {
            return Err(Mamba2Error::config(
                "head",
                "the flatten head reads every token of a fixed window; stream a model \
                         with the last-token head (ForecastHead::Last)",
            ));
        }
        if model.revin.is_some() {
            return Err(Mamba2Error::config(
                "revin",
                "a forecaster with RevIN cannot stream: its window statistics change \
                         with every observation; train with revin = false on standardised data",
            ));
        }
        let backbone = CpuBackbone::from_backbone(&model.backbone);
        let d = backbone.d_model();
        let head = CpuLinear::from_linear(&model.head);
        let streams = if model.channel_independent() {
            model.n_inputs()
        } else {
            1
        };
        Ok(Self {
            input: CpuLinear::from_linear(&model.input),
            channel_independent: model.channel_independent(),
            n_inputs: model.n_inputs(),
            n_targets: model.n_targets(),
            horizon: model.horizon(),
            states: (0..streams).map(|_| backbone.zero_state()).collect(),
            embedded: vec![0.0; d],
            hidden: vec![0.0; d],
            head_out: vec![0.0; head.d_out()],
            forecast: vec![0.0; model.horizon() * model.n_targets()],
            backbone,
            head,
            seen: 0,
        })
    }

    /// Forgets the history (back to the zero state).
    pub fn reset(&mut self) {
        for s in &mut self.states {
            *s = self.backbone.zero_state();
        }
        self.forecast.fill(0.0);
        self.seen = 0;
    }

    /// Observations pushed since the start or the last reset.
    pub fn observations(&self) -> usize {
        self.seen
    }

    /// Steps forecast.
    pub fn horizon(&self) -> usize {
        self.horizon
    }

    /// Variables forecast per step.
    pub fn n_targets(&self) -> usize {
        self.n_targets
    }

    /// Takes the next observation (`n_inputs` values, on the model's scale) and returns the
    /// forecast of the next `horizon` steps, row-major `[horizon, n_targets]`.
    pub fn push(&mut self, observation: &[f32]) -> crate::error::Result<&[f32]> {
        if observation.len() != self.n_inputs {
            return Err(Mamba2Error::Shape {
                name: "observation",
                expected: format!("[n_inputs = {}]", self.n_inputs),
                actual: vec![observation.len()],
            });
        }
        if let Some(i) = observation.iter().position(|v| !v.is_finite()) {
            return Err(Mamba2Error::InvalidInput {
                name: "observation",
                reason: format!("value {i} is {}", observation[i]),
            });
        }
        if self.channel_independent {
            for (c, &value) in observation.iter().enumerate() {
                self.input.forward(&[value], &mut self.embedded);
                self.backbone
                    .step(&self.embedded, &mut self.states[c], &mut self.hidden)?;
                self.head.forward(&self.hidden, &mut self.head_out);
                // head_out is [horizon] for variable c; the forecast is [horizon, c]
                for (t, &v) in self.head_out.iter().enumerate() {
                    self.forecast[t * self.n_targets + c] = v;
                }
            }
        } else {
            self.input.forward(observation, &mut self.embedded);
            self.backbone
                .step(&self.embedded, &mut self.states[0], &mut self.hidden)?;
            self.head.forward(&self.hidden, &mut self.forecast);
        }
        self.seen += 1;
        Ok(&self.forecast)
    }
}
