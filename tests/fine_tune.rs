//! Training that starts from a checkpoint folder (`init_from`): the run's model is the
//! folder's, weights included, for Mamba-2 and the hybrids; the run's `config.json` records the
//! folder; a folder of another model is an error naming `init_from`.

use std::path::Path;

use burn::backend::{Autodiff, NdArray};
use burn::tensor::{Int, Tensor};
use mamba2_burn::checkpoint::{load_hybrid, read_config, CheckpointFormat, HybridSpec};
use mamba2_burn::hybrid::HybridLm;
use mamba2_burn::train::{
    train_lm, HybridTrainingConfig, LanguageModelTraining, LmConfig, LmTrainingConfig,
    ProgressMode, RunConfig,
};
use mamba2_burn::{load_lm, save_lm, Mamba2Error, Mamba2Lm};

use crate::common;

type B = Autodiff<NdArray<f32>>;
type Inner = NdArray<f32>;

/// A run of `epochs` at learning rate 0 on the copy task: AdamW then leaves every weight as it
/// started, so the model the run returns is the one it started from.
fn still<M: LmConfig>(config: LanguageModelTraining<M>) -> LanguageModelTraining<M> {
    config.with_run(
        RunConfig::new(0.0)
            .with_batch_size(16)
            .with_epochs(1)
            .with_seed(7),
    )
}

pub(crate) fn ids() -> Tensor<Inner, 2, Int> {
    let rows: Vec<i64> = (0..24).map(|t| (t * 7 + 3) % 10).collect();
    Tensor::from_data(
        burn::tensor::TensorData::new(rows, [2, 12]),
        &Default::default(),
    )
}

/// Trains `config` on the copy task into `dir`, continuing from its last checkpoint with
/// `resume`.
pub(crate) fn run<M: LmConfig>(
    config: &LanguageModelTraining<M>,
    dir: &Path,
    resume: bool,
) -> mamba2_burn::Result<M::Model<Inner>>
where
    M::Model<B>: mamba2_burn::train::SupervisedModel<
            B,
            Batch = mamba2_burn::train::LmBatch<B>,
            Output = burn::train::SequenceOutput<B>,
        > + burn::module::AutodiffModule<B, InnerModule = M::Model<Inner>>,
    M::Model<Inner>: mamba2_burn::train::SupervisedModel<
        Inner,
        Batch = mamba2_burn::train::LmBatch<Inner>,
        Output = burn::train::SequenceOutput<Inner>,
    >,
{
    train_lm::<B, _, _, _>(
        config,
        common::copy_data(1, 32),
        common::copy_data(2, 16),
        dir,
        resume,
        ProgressMode::Plain,
        &Default::default(),
    )
}

#[test]
fn a_mamba2_run_starts_from_the_folders_weights() {
    let dev = Default::default();
    let tmp = tempfile::tempdir().unwrap();
    let folder = tmp.path().join("pretrained");
    let base = common::copy_lm_config(1, 1e-2).model;
    let pretrained: Mamba2Lm<Inner> = {
        let _rng = common::seeded(11);
        base.init(&dev).unwrap()
    };
    save_lm(&pretrained, &base, &folder).unwrap();

    let config = still(LmTrainingConfig::from_checkpoint(&folder).unwrap());
    assert_eq!(config.init_from.as_deref(), Some(folder.as_path()));
    let artifacts = tmp.path().join("run");
    let tuned = run(&config, &artifacts, false).unwrap();
    let expected = load_lm::<Inner>(&folder, &dev)
        .unwrap()
        .forward(ids(), None)
        .unwrap()
        .0;
    let actual = tuned.forward(ids(), None).unwrap().0;
    assert_eq!(actual.into_data(), expected.into_data());
    // a fresh model (the same config without `init_from`) is another model: the check can fail
    let fresh = run(
        &config.clone().with_init_from(None),
        &tmp.path().join("fresh"),
        false,
    )
    .unwrap();
    let other = fresh.forward(ids(), None).unwrap().0;
    assert_ne!(
        other.into_data(),
        load_lm::<Inner>(&folder, &dev)
            .unwrap()
            .forward(ids(), None)
            .unwrap()
            .0
            .into_data()
    );
    // the run's config.json says where its weights came from
    let saved =
        <LmTrainingConfig as burn::config::Config>::load(artifacts.join("config.json")).unwrap();
    assert_eq!(saved.init_from, config.init_from);

    // a run of another model than the folder's
    let mut wider = config.clone();
    wider.model.backbone.mixer.d_state = 32;
    let e = run(&wider, &tmp.path().join("wider"), false).unwrap_err();
    assert!(
        matches!(&e, Mamba2Error::InvalidConfig { field: "init_from", reason } if reason.contains("backbone")),
        "{e}"
    );
}

/// A fine-tune of a folder in transformers' layout is saved in that layout, with the folder's
/// tokenizer, and loads back to the model the run returned.
#[test]
fn a_fine_tune_is_saved_in_the_layout_it_came_from() {
    let dev = Default::default();
    let tmp = tempfile::tempdir().unwrap();
    let folder = crate::reference::fixture_root().join("tiny");
    assert_eq!(
        read_config(&folder).unwrap().1,
        CheckpointFormat::HuggingFace
    );
    let config = still(LmTrainingConfig::from_checkpoint(&folder).unwrap());
    let tuned = run(&config, tmp.path(), false).unwrap();
    let saved = tmp.path().join("model");
    assert_eq!(
        read_config(&saved).unwrap().1,
        CheckpointFormat::HuggingFace
    );
    assert!(saved.join("model.safetensors").is_file() && !saved.join("model.mpk").exists());
    assert_eq!(
        std::fs::read(saved.join("tokenizer.json")).unwrap(),
        std::fs::read(folder.join("tokenizer.json")).unwrap()
    );
    let reloaded = load_lm::<Inner>(&saved, &dev).unwrap();
    assert_eq!(
        reloaded.forward(ids(), None).unwrap().0.into_data(),
        tuned.forward(ids(), None).unwrap().0.into_data()
    );
}

/// A fine-tune stopped after its first epoch and resumed ends with the weights of an
/// uninterrupted one: the resumed run starts from its checkpoint, not from the folder again.
#[test]
fn a_resumed_fine_tune_reaches_the_same_weights() {
    let folder = crate::reference::fixture_root().join("tiny");
    let config = LmTrainingConfig::from_checkpoint(&folder)
        .unwrap()
        .with_run(
            RunConfig::new(1e-2)
                .with_batch_size(16)
                .with_epochs(2)
                .with_seed(7),
        );
    let _rng = common::seeded(7);
    let full = tempfile::tempdir().unwrap();
    let uninterrupted = run(&config, full.path(), false).unwrap();
    let cut = common::stopped_after(full.path(), 1);
    let resumed = run(&config, cut.path(), true).unwrap();
    let logits = |m: &Mamba2Lm<Inner>| m.forward(ids(), None).unwrap().0.into_data();
    assert_eq!(logits(&resumed), logits(&uninterrupted));
    // the weights moved: a resume that started from the folder again would differ
    let start = load_lm::<Inner>(&folder, &Default::default()).unwrap();
    assert_ne!(logits(&start), logits(&uninterrupted));
}

#[test]
fn a_hybrid_run_starts_from_the_folders_weights() {
    let dev = Default::default();
    let tmp = tempfile::tempdir().unwrap();
    let folder = crate::hybrid_files::root_fixture("granite_dense");
    let config = still(HybridTrainingConfig::from_checkpoint(&folder).unwrap());
    let tuned: HybridLm<Inner> = run(&config, tmp.path(), false).unwrap();
    let loaded: HybridLm<Inner> = load_hybrid(&folder, &dev).unwrap();
    let expected = loaded.forward(ids(), None).unwrap().0.into_data();
    assert_eq!(
        tuned.forward(ids(), None).unwrap().0.into_data(),
        expected.clone()
    );
    // the run's model/ is the family's folder again, with the same weights
    let saved: HybridLm<Inner> = load_hybrid(tmp.path().join("model"), &dev).unwrap();
    assert_eq!(
        saved.forward(ids(), None).unwrap().0.into_data(),
        expected.clone()
    );

    // a spec of another model (the vocabulary changed) is refused, naming the field
    let other = config
        .clone()
        .model
        .with_vocab_size(
            HybridSpec::from_file(&folder)
                .unwrap()
                .config()
                .unwrap()
                .vocab_size
                + 1,
        )
        .unwrap();
    let e = run(
        &LanguageModelTraining {
            model: other,
            ..config
        },
        &tmp.path().join("other"),
        false,
    )
    .unwrap_err();
    assert!(
        matches!(&e, Mamba2Error::InvalidConfig { field: "init_from", reason } if reason.contains("vocab_size")),
        "{e}"
    );
}

/// A folder of text files tokenized with a checkpoint's tokenizer: every document's tokens and
/// the end-of-text token, in order, cut into windows that record the documents; the errors
/// name the file or the setting at fault.
#[cfg(feature = "tokenizer")]
#[test]
fn a_text_folder_becomes_packed_token_windows() {
    use mamba2_burn::data::text::TextCorpus;
    use mamba2_burn::data::tokens::TokenizedText;
    use mamba2_burn::tokenizer::Tokenizer;

    let tokenizer =
        Tokenizer::from_file(crate::reference::fixture_root().join("tiny/tokenizer.json")).unwrap();
    let eos = tokenizer.token_id("<eos>").unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let docs = [
        "the cat sat on the mat",
        "a dog ran",
        "birds sing at dawn and dusk",
    ];
    std::fs::write(
        tmp.path().join("a.txt"),
        format!("{}\n\n{}", docs[0], docs[1]),
    )
    .unwrap();
    std::fs::write(tmp.path().join("b.txt"), docs[2].repeat(12)).unwrap();
    let text = TokenizedText {
        path: tmp.path(),
        tokenizer: &tokenizer,
        vocab: 64,
        seq_len: 4,
        separator: Some("\n\n"),
        end_of_text: Some(eos),
    };
    let corpus = TextCorpus::tokenized(&text).unwrap();
    let mut expected = Vec::new();
    let mut starts = Vec::new();
    for doc in [docs[0].to_string(), docs[1].to_string(), docs[2].repeat(12)] {
        if !expected.is_empty() {
            starts.push(expected.len());
        }
        expected.extend(tokenizer.encode(&doc).unwrap());
        expected.push(eos);
    }
    // the windows' inputs are the token stream, each window's documents where they start
    let train = &corpus.train;
    let inputs: Vec<i64> = train.iter().flat_map(|w| w.input.clone()).collect();
    assert_eq!(inputs, expected[..inputs.len()]);
    assert_eq!(train[0].target[..3], expected[1..4]);
    for (k, w) in train.iter().enumerate() {
        let begin = k * 4;
        let inside: Vec<usize> = starts
            .iter()
            .filter(|&&s| s > begin && s < begin + 4)
            .map(|s| s - begin)
            .collect();
        let mut at = 0;
        let cuts: Vec<usize> = w
            .documents
            .iter()
            .map(|len| {
                at += len;
                at
            })
            .collect();
        assert_eq!(cuts[..cuts.len() - 1], inside[..], "window {k}");
        assert_eq!(w.documents.iter().sum::<usize>(), 4);
    }
    assert!(!corpus.valid.is_empty() && !corpus.test.is_empty());

    // errors
    let small = TokenizedText {
        vocab: 10,
        ..text.clone()
    };
    let e = TextCorpus::tokenized(&small).unwrap_err();
    assert!(
        matches!(
            &e,
            Mamba2Error::InvalidConfig {
                field: "tokenizer",
                ..
            }
        ),
        "{e}"
    );
    std::fs::write(tmp.path().join("c.txt"), "  \n").unwrap();
    let e = TextCorpus::tokenized(&text).unwrap_err();
    assert!(e.to_string().contains("c.txt"), "{e}");
    std::fs::remove_file(tmp.path().join("c.txt")).unwrap();
    let long = TokenizedText {
        seq_len: 4096,
        ..text.clone()
    };
    let e = TextCorpus::tokenized(&long).unwrap_err();
    assert!(e.to_string().contains("too short"), "{e}");
}
