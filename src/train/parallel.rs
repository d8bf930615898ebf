//! Data parallelism inside one training step, for backends whose kernels use few threads
//! (burn-ndarray runs most element-wise work on one thread).
//!
//! The batch is cut into `parts` slices along the batch dimension; each slice runs forward and
//! backward on its own thread with its own autodiff graph, and the gradients are summed in
//! slice order. Each slice's loss is weighted by its share of the batch's scored elements, so
//! the summed gradient is the gradient of the whole batch's loss (up to float rounding) and the
//! step is deterministic for a given number of parts.

use burn::module::AutodiffModule;
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::Tensor;

/// One slice of a batch and its weight: the share of the batch's loss elements it holds.
pub struct BatchPart<I> {
    /// The slice.
    pub input: I,
    /// Weight of the slice's mean loss in the batch's mean loss (the weights sum to 1).
    pub weight: f64,
}

/// Row ranges `(start, len)` that cut `batch` rows into at most `parts` nearly equal slices
/// (the first `batch % parts` slices one row longer); never an empty slice.
pub fn split_rows(batch: usize, parts: usize) -> Vec<(usize, usize)> {
    let parts = parts.clamp(1, batch.max(1));
    let (base, extra) = (batch / parts, batch % parts);
    let mut start = 0;
    (0..parts)
        .map(|i| {
            let len = base + usize::from(i < extra);
            let range = (start, len);
            start += len;
            range
        })
        .filter(|&(_, len)| len > 0)
        .collect()
}

/// Forward and backward of every part on its own thread (see [`parallel_map`]); returns the
/// summed gradients, the batch's loss (the weighted sum of the parts' losses, detached) and
/// each part's output.
///
/// `loss_of(model, input)` returns the part's mean loss `[1]` and its output for the metrics.
pub fn parallel_backward<B, M, I, O, F>(
    model: &M,
    parts: Vec<BatchPart<I>>,
    loss_of: F,
) -> (GradientsParams, Tensor<B, 1>, Vec<O>)
where
    B: AutodiffBackend,
    M: AutodiffModule<B> + Send,
    I: Send,
    O: Send,
    F: Fn(&M, I) -> (Tensor<B, 1>, O) + Sync,
{
    let run = |part_model: &M, part: BatchPart<I>| {
        let (loss, output) = loss_of(part_model, part.input);
        let loss = loss.mul_scalar(part.weight);
        let grads = GradientsParams::from_grads(loss.backward(), part_model);
        (grads, loss.detach(), output)
    };
    let results = match (parts.len(), model.devices().first()) {
        (2.., Some(device)) => {
            // a graph of its own per thread: fresh leaves for the same parameters
            let jobs = parts
                .into_iter()
                .map(|part| (model.clone().fork(device), part))
                .collect();
            parallel_map(jobs, |(part_model, part)| run(&part_model, part))
        }
        _ => parts.into_iter().map(|part| run(model, part)).collect(),
    };
    let mut accumulator = GradientsAccumulator::new();
    let mut losses = Vec::with_capacity(results.len());
    let mut outputs = Vec::with_capacity(results.len());
    for (grads, loss, output) in results {
        accumulator.accumulate(model, grads);
        losses.push(loss);
        outputs.push(output);
    }
    (accumulator.grads(), sum(losses), outputs)
}

/// The sum of the parts' weighted losses, in part order.
fn sum<B: Backend>(losses: Vec<Tensor<B, 1>>) -> Tensor<B, 1> {
    losses
        .into_iter()
        .reduce(|total, loss| total + loss)
        .expect("split_rows never returns zero parts")
}

/// Forward of every part on its own thread (see [`parallel_map`]), for evaluation: returns
/// the batch's loss (the weighted sum of the parts' losses) and each part's output.
///
/// `loss_of(model, input)` returns the part's mean loss `[1]` and its output for the metrics.
pub fn parallel_forward<B, M, I, O, F>(
    model: &M,
    parts: Vec<BatchPart<I>>,
    loss_of: F,
) -> (Tensor<B, 1>, Vec<O>)
where
    B: Backend,
    M: Clone + Send,
    I: Send,
    O: Send,
    F: Fn(&M, I) -> (Tensor<B, 1>, O) + Sync,
{
    let jobs = parts
        .into_iter()
        .map(|part| (model.clone(), part))
        .collect();
    let results = parallel_map(jobs, |(part_model, part): (M, BatchPart<I>)| {
        let (loss, output) = loss_of(&part_model, part.input);
        (loss.mul_scalar(part.weight), output)
    });
    let (losses, outputs) = results.into_iter().unzip();
    (sum(losses), outputs)
}

/// `f` applied to every input, each on its own thread (on the calling thread when there is
/// only one), outputs in input order. A panic in `f` is raised again here.
pub fn parallel_map<I: Send, O: Send>(inputs: Vec<I>, f: impl Fn(I) -> O + Sync) -> Vec<O> {
    if inputs.len() <= 1 {
        return inputs.into_iter().map(f).collect();
    }
    let f = &f;
    std::thread::scope(|scope| {
        let handles: Vec<_> = inputs
            .into_iter()
            .map(|input| scope.spawn(move || f(input)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    })
}
