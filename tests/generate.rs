//! Generation (`Mamba2Lm::generate`): greedy decoding against the full forward's argmax,
//! prompts of different lengths in one batch, stop tokens, streaming and cancelling, seeded
//! sampling, the CPU step against the tensor step, bad input; and, with the `tokenizer`
//! feature, the `tiny` reference case's tokenizer (made, with the ids it gives in Python, by
//! `tests/fixtures/tokenizer/make_tokenizer.py`) and text in, text out with that model. The ids of
//! transformers' `generate` are checked with the reference cases (`reference.rs`).

use std::ops::ControlFlow;

use burn::backend::NdArray;
use burn::tensor::{Int, Tensor, TensorData};
use mamba2_burn::generate::{DecodeStep, Finish};
use mamba2_burn::{load_lm, GenerateConfig, Mamba2Error, Mamba2Lm};

use crate::reference::fixture_root;

type B = NdArray<f32>;

fn tiny() -> Mamba2Lm<B> {
    load_lm::<B>(fixture_root().join("tiny"), &Default::default()).unwrap()
}

/// Greedy decoding by its definition: the argmax of the full forward over the prompt and
/// what was generated so far, one token at a time.
fn argmax_continuation(model: &Mamba2Lm<B>, prompt: &[i64], n: usize) -> Vec<i64> {
    let mut seq = prompt.to_vec();
    for _ in 0..n {
        let ids = Tensor::<B, 2, Int>::from_data(
            TensorData::new(seq.clone(), [1, seq.len()]),
            &Default::default(),
        );
        let (logits, _) = model.forward(ids, None).unwrap();
        let last: Vec<f32> = logits
            .narrow(1, seq.len() - 1, 1)
            .into_data()
            .to_vec()
            .unwrap();
        let best = (0..last.len())
            .max_by(|&a, &b| last[a].total_cmp(&last[b]).then(b.cmp(&a)))
            .unwrap();
        seq.push(best as i64);
    }
    seq[prompt.len()..].to_vec()
}

fn prompts() -> Vec<Vec<i64>> {
    vec![
        vec![3, 14, 15, 9, 26, 53, 58, 9, 7, 9, 32],
        vec![5],
        vec![
            38, 46, 26, 43, 38, 32, 7, 9, 50, 2, 2, 8, 1, 60, 61, 17, 30, 4, 4,
        ],
        vec![12, 40, 41],
        // the length of the first: prefilled in one batch with it
        vec![63, 0, 21, 21, 13, 5, 8, 44, 19, 2, 9],
    ]
}

#[test]
fn greedy_is_the_argmax_of_the_full_forward_for_a_batch_of_lengths() {
    let model = tiny();
    let prompts = prompts();
    let n = 12;
    let want: Vec<Vec<i64>> = prompts
        .iter()
        .map(|p| argmax_continuation(&model, p, n))
        .collect();
    for step in [DecodeStep::Auto, DecodeStep::Tensor, DecodeStep::Cpu] {
        let config = GenerateConfig::new().with_max_new_tokens(n).with_step(step);
        let got = model.generate(&prompts, &config).unwrap();
        assert_eq!(got.tokens, want, "{step:?}");
        assert_eq!(got.finish, vec![Finish::Length; prompts.len()]);
        assert_eq!(
            got.prompt_tokens,
            prompts.iter().map(Vec::len).sum::<usize>()
        );
        assert_eq!(got.new_tokens(), n * prompts.len());
        // burn-ndarray in f32 decodes with the CPU step unless told otherwise
        let expected_step = if step == DecodeStep::Tensor {
            DecodeStep::Tensor
        } else {
            DecodeStep::Cpu
        };
        assert_eq!(got.step, expected_step);
    }
    // each prompt alone gives what it gives in the batch
    let config = GenerateConfig::new().with_max_new_tokens(n);
    for (prompt, want) in prompts.iter().zip(&want) {
        let alone = model
            .generate(std::slice::from_ref(prompt), &config)
            .unwrap();
        assert_eq!(&alone.tokens[0], want);
    }
}

#[test]
fn stop_tokens_end_each_prompt_on_its_own() {
    let model = tiny();
    let prompts = prompts();
    let free = model
        .generate(&prompts, &GenerateConfig::new().with_max_new_tokens(10))
        .unwrap();
    // stop on the third token of prompt 0 (not at its first occurrence elsewhere in that row)
    let stop = free.tokens[0][2];
    let first_stop = free.tokens[0].iter().position(|&t| t == stop).unwrap();
    for step in [DecodeStep::Tensor, DecodeStep::Cpu] {
        let config = GenerateConfig::new()
            .with_max_new_tokens(10)
            .with_stop_tokens(vec![stop])
            .with_step(step);
        let got = model.generate(&prompts, &config).unwrap();
        for (row, (tokens, free)) in got.tokens.iter().zip(&free.tokens).enumerate() {
            match free.iter().position(|&t| t == stop) {
                Some(at) => {
                    assert_eq!(tokens, &free[..=at], "row {row}, {step:?}");
                    assert_eq!(got.finish[row], Finish::Stop);
                }
                None => {
                    assert_eq!(tokens, free, "row {row}, {step:?}");
                    assert_eq!(got.finish[row], Finish::Length);
                }
            }
        }
        assert_eq!(got.tokens[0].len(), first_stop + 1);
    }
}

#[test]
fn tokens_stream_as_they_are_chosen_and_the_callback_can_stop() {
    let model = tiny();
    let prompts = prompts();
    let config = GenerateConfig::new().with_max_new_tokens(6);
    let mut seen: Vec<(usize, i64)> = Vec::new();
    let got = model
        .generate_streaming(&prompts, &config, |row, token| {
            seen.push((row, token));
            ControlFlow::Continue(())
        })
        .unwrap();
    // step by step, the prompts in order
    let expected: Vec<(usize, i64)> = (0..6)
        .flat_map(|t| (0..prompts.len()).map(move |row| (row, t)))
        .map(|(row, t)| (row, got.tokens[row][t]))
        .collect();
    assert_eq!(seen, expected);

    // breaking off after the 7th token: every prompt ends there, cancelled
    let mut count = 0;
    let cut = model
        .generate_streaming(&prompts, &config, |_, _| {
            count += 1;
            if count == 7 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })
        .unwrap();
    assert_eq!(cut.new_tokens(), 7);
    assert_eq!(cut.finish, vec![Finish::Cancelled; prompts.len()]);
    for (cut, full) in cut.tokens.iter().zip(&got.tokens) {
        assert_eq!(cut[..], full[..cut.len()]);
    }
}

#[test]
fn sampling_follows_its_seed() {
    let model = tiny();
    let prompts = prompts();
    let sampled = |seed: u64, step: DecodeStep| {
        let config = GenerateConfig::new()
            .with_max_new_tokens(16)
            .with_temperature(1.5)
            .with_top_k(Some(20))
            .with_top_p(Some(0.95))
            .with_seed(seed)
            .with_step(step);
        model.generate(&prompts, &config).unwrap().tokens
    };
    for step in [DecodeStep::Tensor, DecodeStep::Cpu] {
        assert_eq!(sampled(1, step), sampled(1, step), "{step:?}");
        assert_ne!(sampled(1, step), sampled(2, step), "{step:?}");
    }
    let greedy = model
        .generate(&prompts, &GenerateConfig::new().with_max_new_tokens(16))
        .unwrap()
        .tokens;
    assert_ne!(sampled(1, DecodeStep::Cpu), greedy);
}

#[test]
fn zero_new_tokens_is_the_prefill_alone() {
    let model = tiny();
    let got = model
        .generate(&prompts(), &GenerateConfig::new().with_max_new_tokens(0))
        .unwrap();
    assert!(got.tokens.iter().all(Vec::is_empty));
    assert_eq!(got.finish, vec![Finish::Length; 5]);
}

#[test]
fn bad_generation_input_is_a_typed_error() {
    let model = tiny();
    let config = GenerateConfig::new();
    let invalid = |result: Result<_, Mamba2Error>, name: &str| match result {
        Err(Mamba2Error::InvalidInput { name: n, .. }) => assert_eq!(n, name),
        Err(other) => panic!("expected InvalidInput {name}, got {other}"),
        Ok(_) => panic!("expected InvalidInput {name}, got a generation"),
    };
    invalid(model.generate(&[], &config), "prompts");
    invalid(model.generate(&[vec![1], vec![]], &config), "prompts");
    invalid(model.generate(&[vec![1, 64]], &config), "input_ids");
    invalid(model.generate(&[vec![-1]], &config), "input_ids");
    invalid(
        model.generate(&[vec![1]], &config.clone().with_stop_tokens(vec![99])),
        "stop_tokens",
    );
    match model.generate(&[vec![1]], &config.clone().with_temperature(-1.0)) {
        Err(Mamba2Error::InvalidConfig { field, .. }) => assert_eq!(field, "temperature"),
        other => panic!("expected a config error, got {other:?}"),
    }
}

#[cfg(feature = "tokenizer")]
mod text {
    use super::*;
    use mamba2_burn::tokenizer::Tokenizer;
    use std::path::{Path, PathBuf};

    fn tokenizer_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer")
    }

    fn tokenizer() -> Tokenizer {
        Tokenizer::from_file(fixture_root().join("tiny/tokenizer.json")).unwrap()
    }

    #[test]
    fn the_tokenizer_gives_the_python_ids() {
        let tokenizer = tokenizer();
        let expected: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(tokenizer_dir().join("expected.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(
            tokenizer.vocab_size() as u64,
            expected["vocab_size"].as_u64().unwrap()
        );
        for case in expected["cases"].as_array().unwrap() {
            let text = case["text"].as_str().unwrap();
            let ids: Vec<i64> = case["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_i64().unwrap())
                .collect();
            assert_eq!(tokenizer.encode(text).unwrap(), ids, "{text:?}");
            let decoded = tokenizer.decode(&ids).unwrap();
            assert_eq!(decoded, case["decoded"].as_str().unwrap());
            // streamed piece by piece, the same text
            let mut stream = tokenizer.stream();
            let mut pieces = String::new();
            for &id in &ids {
                if let Some(piece) = stream.push(id).unwrap() {
                    pieces.push_str(&piece);
                }
            }
            assert_eq!(pieces, decoded, "{text:?}");
        }
    }

    #[test]
    fn text_in_text_out_with_the_tiny_model() {
        let tokenizer = tokenizer();
        let model = tiny();
        assert_eq!(tokenizer.vocab_size(), model.vocab_size());
        let prompt = tokenizer.encode("the state space model").unwrap();
        let config = GenerateConfig::new().with_max_new_tokens(10);
        let got = model
            .generate(std::slice::from_ref(&prompt), &config)
            .unwrap();
        assert_eq!(got.tokens[0], argmax_continuation(&model, &prompt, 10));
        let text = tokenizer.decode(&got.tokens[0]).unwrap();
        assert!(!text.is_empty());
    }

    #[test]
    fn tokenizer_errors_name_the_file_or_the_id() {
        let missing = tokenizer_dir().join("no-such-tokenizer.json");
        match Tokenizer::from_file(&missing) {
            Err(Mamba2Error::File { file, .. }) => assert_eq!(file, missing),
            other => panic!("expected a file error, got {other:?}"),
        }
        let not_json = tokenizer_dir().join("make_tokenizer.py");
        assert!(matches!(
            Tokenizer::from_file(&not_json),
            Err(Mamba2Error::File { .. })
        ));
        for bad in [-1, 64, i64::MAX] {
            match tokenizer().decode(&[2, bad]) {
                Err(Mamba2Error::InvalidInput { name, reason }) => {
                    assert_eq!(name, "ids");
                    assert!(reason.contains(&bad.to_string()), "{reason}");
                }
                other => panic!("expected InvalidInput for {bad}, got {other:?}"),
            }
            let tokenizer = tokenizer();
            let mut stream = tokenizer.stream();
            match stream.push(bad) {
                Err(Mamba2Error::InvalidInput { name, reason }) => {
                    assert_eq!(name, "id");
                    assert!(reason.contains(&bad.to_string()), "{reason}");
                }
                other => panic!("expected InvalidInput for {bad}, got {other:?}"),
            }
        }
    }

    /// Files the `tokenizers` crate reads but fails on, or panics on: each an error naming the
    /// file; and a vocabulary with gaps in its ids, which works (each found by fuzzing
    /// `tokenizer.json`; their inputs are in `fuzz/regressions/tokenizer_json`).
    #[test]
    fn tokenizer_files_it_cannot_use_are_errors_naming_them() {
        let dir = tempfile::tempdir().unwrap();
        let good = std::fs::read_to_string(fixture_root().join("tiny/tokenizer.json")).unwrap();
        let file = dir.path().join("tokenizer.json");
        fn named<T>(result: Result<T, Mamba2Error>, file: &Path, what: &str) {
            match result {
                Err(Mamba2Error::File { file: at, reason }) => {
                    assert_eq!(at, file, "{what}: {reason}")
                }
                Err(other) => panic!("{what}: expected an error naming the file, got {other}"),
                Ok(_) => panic!("{what}: expected an error naming the file"),
            }
        }

        // the model's unknown token missing from its vocabulary: it reads, and a text with a
        // character outside the vocabulary cannot be encoded, the file's fault
        let unk = good.replacen("\"<unk>\": 0", "\"?unk>\": 0", 1);
        assert_ne!(unk, good, "the fixture's vocabulary has <unk>");
        std::fs::write(&file, unk).unwrap();
        let unk = Tokenizer::from_file(&file).unwrap();
        named(
            unk.encode("Mamba-2 reads a tick."),
            &file,
            "unk not in vocab",
        );

        // a vocabulary whose ids leave a gap: an id above the vocabulary's size is one of its
        // own, decoded as any other
        let gap = good.replacen("\"▁a\": 29,", "\"▁a\": 89,", 1);
        assert_ne!(gap, good, "the fixture's vocabulary has ▁a");
        std::fs::write(&file, gap).unwrap();
        let (gap, good) = (Tokenizer::from_file(&file).unwrap(), tokenizer());
        let text = "the state of a sequence";
        let (ids, expected) = (gap.encode(text).unwrap(), good.encode(text).unwrap());
        assert_eq!(gap.vocab_size(), 64);
        assert!(ids.contains(&89), "{ids:?}");
        assert_eq!(
            ids,
            expected
                .iter()
                .map(|&id| if id == 29 { 89 } else { id })
                .collect::<Vec<_>>()
        );
        assert_eq!(gap.decode(&ids).unwrap(), good.decode(&expected).unwrap());
        let mut stream = gap.stream();
        let streamed: String = ids
            .iter()
            .filter_map(|&id| stream.push(id).unwrap())
            .collect();
        assert_eq!(streamed, good.decode(&expected).unwrap());
        assert!(gap.decode(&[29]).is_err(), "29 is the gap");

        // a decoder the tokenizers crate's deserializer panics on (`expect("Helper")`)
        let panics = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fuzz/regressions/tokenizer_json/decoder_expect_helper.json");
        std::fs::copy(panics, &file).unwrap();
        named(
            Tokenizer::from_file(&file),
            &file,
            "decoder the deserializer panics on",
        );
    }
}
