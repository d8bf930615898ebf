//! Writes the fuzz targets' seed corpora, `fuzz/seeds/<target>/`, from the test fixtures:
//! the reference cases' configs (transformers', state-spaces' and transformers 5.25's format),
//! weights and tokenizer as they are; `pytorch_model.bin` and the shard index made from the
//! `tiny` case's weights; a CSV file like the ETT data; DBN files of trades (plain and zstd)
//! and of one-second bars.
//!
//! `cargo run --manifest-path fuzz/Cargo.toml --bin make_seeds`

#[path = "../../../tests/common/torch.rs"]
mod torch;

use std::path::{Path, PathBuf};

use dbn::encode::{DbnEncodable, DynWriter, EncodeRecord};
use dbn::{rtype, Compression, MetadataBuilder, OhlcvMsg, RecordHeader, SType, Schema, TradeMsg};
use torch::{write_torch, TorchTensor};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

fn fixture(path: &str) -> PathBuf {
    root().join("../tests/fixtures").join(path)
}

fn seed(target: &str, name: &str, bytes: &[u8]) {
    let dir = root().join("seeds").join(target);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(name), bytes).unwrap();
}

fn copy(target: &str, name: &str, from: &str) {
    seed(target, name, &std::fs::read(fixture(from)).unwrap());
}

/// The tensors of a safetensors file: name, dtype, shape, bytes (in the header's order).
fn safetensors(file: &Path) -> Vec<(String, String, Vec<usize>, Vec<u8>)> {
    let bytes = std::fs::read(file).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let data = &bytes[8 + n..];
    header
        .into_iter()
        .filter(|(name, _)| name != "__metadata__")
        .map(|(name, v)| {
            let offsets: Vec<usize> = v["data_offsets"]
                .as_array()
                .unwrap()
                .iter()
                .map(|o| o.as_u64().unwrap() as usize)
                .collect();
            let shape = v["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap() as usize)
                .collect();
            let dtype = v["dtype"].as_str().unwrap().to_string();
            (name, dtype, shape, data[offsets[0]..offsets[1]].to_vec())
        })
        .collect()
}

fn write_dbn<R: DbnEncodable>(schema: Schema, records: &[R], compression: Compression) -> Vec<u8> {
    let metadata = MetadataBuilder::new()
        .dataset("GLBX.MDP3".to_string())
        .schema(Some(schema))
        .start(0)
        .stype_in(Some(SType::InstrumentId))
        .stype_out(SType::InstrumentId)
        .build();
    let mut out = Vec::new();
    {
        let mut writer = DynWriter::new(&mut out, compression).unwrap();
        {
            let mut encoder = dbn::encode::dbn::Encoder::new(&mut writer, &metadata).unwrap();
            for r in records {
                encoder.encode_record(r).unwrap();
            }
        }
        writer.finish().unwrap();
    }
    out
}

fn main() {
    copy(
        "config_json",
        "transformers.json",
        "reference/tiny/config.json",
    );
    copy(
        "config_json",
        "state_spaces.json",
        "reference/tied_ss_format/config.json",
    );
    copy(
        "config_json",
        "transformers_5_25.json",
        "configs/transformers-5.25/config.json",
    );
    copy(
        "safetensors",
        "tiny.safetensors",
        "reference/tiny/model.safetensors",
    );
    copy(
        "tokenizer_json",
        "tiny.json",
        "reference/tiny/tokenizer.json",
    );

    let tensors = safetensors(&fixture("reference/tiny/model.safetensors"));
    let torch: Vec<TorchTensor> = tensors
        .iter()
        .map(|(name, dtype, shape, bytes)| {
            assert_eq!(dtype, "F32", "{name}");
            TorchTensor {
                name: name.clone(),
                storage: "FloatStorage",
                shape: shape.clone(),
                bytes: bytes.clone(),
            }
        })
        .collect();
    let file = std::env::temp_dir().join("mamba2-burn-seed-pytorch_model.bin");
    write_torch(&file, &torch);
    seed("pytorch_bin", "tiny.bin", &std::fs::read(&file).unwrap());
    std::fs::remove_file(&file).unwrap();

    let total: usize = tensors.iter().map(|t| t.3.len()).sum();
    let map: serde_json::Map<String, serde_json::Value> = tensors
        .iter()
        .map(|t| (t.0.clone(), "model-00001-of-00001.safetensors".into()))
        .collect();
    let index = serde_json::json!({ "metadata": { "total_size": total }, "weight_map": map });
    seed(
        "shard_index",
        "tiny.json",
        serde_json::to_string_pretty(&index).unwrap().as_bytes(),
    );

    let mut csv = String::from("date,HUFL,HULL,MUFL,OT\n");
    for t in 0..60 {
        let x = t as f64 * 0.3;
        csv.push_str(&format!(
            "2016-07-01 {:02}:00:00,{:.3},{:.3},{:.3},{:.3}\n",
            t % 24,
            5.0 + x.sin(),
            2.0 + x.cos(),
            -1.5 + 0.1 * x,
            30.0 - x
        ));
    }
    seed("csv", "ett_like.csv", csv.as_bytes());

    const SEC: u64 = 1_000_000_000;
    const PX: f64 = 1e9;
    let trades: Vec<TradeMsg> = (0..6)
        .map(|k| TradeMsg {
            hd: RecordHeader::new::<TradeMsg>(rtype::MBP_0, 1, 3, k * SEC),
            price: ((100.0 + k as f64) * PX) as i64,
            size: 2,
            action: b'T' as _,
            side: b'A' as _,
            ..Default::default()
        })
        .collect();
    let bars: Vec<OhlcvMsg> = (0..6)
        .map(|k| {
            let close = 100.0 + k as f64;
            OhlcvMsg {
                hd: RecordHeader::new::<OhlcvMsg>(rtype::OHLCV_1S, 1, 3, k * SEC),
                open: (close * PX) as i64,
                high: ((close + 2.0) * PX) as i64,
                low: (99.0 * PX) as i64,
                close: (close * PX) as i64,
                volume: 10,
            }
        })
        .collect();
    seed(
        "dbn",
        "trades.dbn",
        &write_dbn(Schema::Trades, &trades, Compression::None),
    );
    seed(
        "dbn",
        "trades.dbn.zst",
        &write_dbn(Schema::Trades, &trades, Compression::Zstd),
    );
    seed(
        "dbn",
        "bars.dbn",
        &write_dbn(Schema::Ohlcv1S, &bars, Compression::None),
    );
}
